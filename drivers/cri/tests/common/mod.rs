//! Helpers shared by the real-runtime tests of this crate (`containerd.rs`, `pod_runtime.rs`).

#![allow(dead_code)] // each test binary uses its own subset

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use nodelet_cri::{CriClient, EventSource, EventsConfig, RuntimeEvent, RuntimeEventStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

/// An environment variable, unless unset or blank.
pub(crate) fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// An environment variable the runtime set-up always exports (panics naming it when missing).
pub(crate) fn required(name: &str) -> String {
    var(name).unwrap_or_else(|| {
        panic!("NODELET_TEST_CRI_ENDPOINT is set but {name} is not: source the runtime env file (env.sh)")
    })
}

/// Serializes the tests (in any process) that pull and remove `NODELET_TEST_REGISTRY_BUSYBOX2`: a lock on
/// `$NODELET_TEST_BASE/busybox2-image.lock`, held until the returned file is dropped.
pub(crate) fn lock_busybox2() -> std::fs::File {
    let base = PathBuf::from(var("NODELET_TEST_BASE").unwrap_or_else(|| "/tmp/nodelet-test".to_string()));
    let path = base.join("busybox2-image.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    if let Err(e) = file.lock() {
        panic!("cannot lock {}: {e}", path.display());
    }
    file
}

/// `n` random hex digits.
pub(crate) fn random_hex(n: usize) -> String {
    (0..n).map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0')).collect()
}

/// A random UID in the API server's format.
pub(crate) fn random_uid() -> String {
    format!("{}-{}-{}-{}-{}", random_hex(8), random_hex(4), random_hex(4), random_hex(4), random_hex(12))
}

/// The first 12 characters of a runtime ID, for messages.
pub(crate) fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Whether `ip` is in the pod network (198.18.0.0/16).
pub(crate) fn in_pod_network(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 198 && v4.octets()[1] == 18,
        IpAddr::V6(_) => false,
    }
}

/// The only destinations tests may send traffic to: loopback and the pod network.
pub(crate) fn allowed_destination(ip: IpAddr) -> bool {
    ip.is_loopback() || in_pod_network(ip)
}

/// One HTTP/1.0 GET over a raw TCP connection; returns (status code, body, local address of the connection).
/// Only to loopback and the pod network; retries the connection for 10 s while the server starts.
pub(crate) async fn http_get(addr: SocketAddr) -> (u16, String, SocketAddr) {
    assert!(
        allowed_destination(addr.ip()),
        "refusing to send traffic to {addr}: not loopback or the pod network"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match timeout(Duration::from_secs(2), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => break s,
            other if Instant::now() >= deadline => panic!("cannot connect to {addr}: {other:?}"),
            _ => sleep(Duration::from_millis(100)).await,
        }
    };
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("local_addr: {e}"),
    };
    let request = format!("GET / HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: nodelet-cri-test\r\n\r\n");
    let mut response = Vec::new();
    let io = async {
        stream.write_all(request.as_bytes()).await?;
        stream.read_to_end(&mut response).await
    };
    match timeout(Duration::from_secs(10), io).await {
        Ok(Ok(_)) => {}
        other => panic!("HTTP GET {addr} failed: {other:?}"),
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_owned(), local)
}

/// Waits for an event matching `pred`, failing with the events seen so far.
pub(crate) async fn wait_event(
    events: &mut RuntimeEventStream,
    within: Duration,
    what: &str,
    pred: impl Fn(&RuntimeEvent) -> bool,
) -> RuntimeEvent {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(ev)) if pred(&ev) => return ev,
            Ok(Some(ev)) => seen.push(ev),
            Ok(None) => panic!("event stream ended while waiting for {what}; seen {seen:?}"),
            Err(_) => panic!("no {what} within {within:?}; seen {seen:?}"),
        }
    }
}

/// The event source the test runtime must give: CRI `GetContainerEvents` on containerd 2.x and later, containerd's
/// own events before (`NODELET_TEST_CONTAINERD_VERSION`, which the runtime set-up exports).
pub(crate) fn expected_event_source() -> EventSource {
    let version = required("NODELET_TEST_CONTAINERD_VERSION");
    let major = version.trim_start_matches('v').split('.').next().and_then(|m| m.parse::<u32>().ok());
    match major {
        Some(major) if major >= 2 => EventSource::Cri,
        Some(_) => EventSource::Containerd,
        None => panic!("NODELET_TEST_CONTAINERD_VERSION={version:?} is not a version"),
    }
}

/// The runtime's event stream, once its subscription is active; fails unless it is the source this runtime
/// must give ([`expected_event_source`]).
pub(crate) async fn subscribed_events(cri: &CriClient) -> RuntimeEventStream {
    let started = Instant::now();
    let (mut events, feed) = cri.events(EventsConfig::default());
    tokio::spawn(feed);
    let active = wait_event(&mut events, Duration::from_secs(10), "Reconnected", |e| {
        matches!(e, RuntimeEvent::Reconnected { .. })
    })
    .await;
    let expected = expected_event_source();
    assert_eq!(active, RuntimeEvent::Reconnected { source: expected }, "the event source of this runtime");
    eprintln!("event subscription ({expected}) active after {:?}", started.elapsed());
    events
}
