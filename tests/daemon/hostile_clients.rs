//! Hostile clients against every listener: thousands of idle connections, slowloris senders that never finish
//! their headers, and request bodies that trickle. The daemon must stay up, keep serving real clients within a
//! second, leave the pods alone and stay within a memory bound.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

use crate::support::{Nodelet, StartOptions, TOKEN, peak_rss_kib, runtime_env, sleep_until_term, uid};

/// Idle connections opened to each plain-HTTP port: more than the per-client limit (256) and, on the
/// read-only port, more than a listener's total (1024).
const IDLE_READ_ONLY: usize = 1500;
const IDLE_OTHERS: usize = 400;
/// Slowloris connections (headers started, never finished) on the read-only port.
const SLOWLORIS: usize = 200;
/// Trickling request bodies on the manifest endpoint.
const TRICKLING: usize = 50;
/// What a real request may take while all that is open (the bound).
const SERVED_WITHIN: Duration = Duration::from_secs(1);
/// nodelet's peak RSS (VmHWM) bound through the whole attack.
const PEAK_RSS_MIB: u64 = 96;

/// A TCP port free on 127.0.0.1 now.
pub(crate) fn free_port() -> u16 {
    match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => panic!("no free port: {e}"),
    }
}

/// Raises this process's open-file limit to its hard limit: the test holds thousands of sockets.
fn raise_fd_limit(need: u64) {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let hard = limit.maximum;
    let target = hard.unwrap_or(need.max(65536));
    if limit.current.is_some_and(|c| c < target) {
        let raised = rustix::process::Rlimit { current: Some(target), maximum: hard };
        if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Nofile, raised) {
            panic!("cannot raise the open-file limit to {target}: {e}");
        }
    }
    assert!(target >= need, "the hard open-file limit {target} is below the {need} sockets this test needs");
}

async fn open_idle(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        match TcpStream::connect(addr).await {
            Ok(c) => conns.push(c),
            Err(e) => panic!("idle connection {i} to {addr}: {e}"),
        }
    }
    conns
}

/// How many of `conns` the server has closed (a read sees EOF or a reset).
async fn closed_by_server(conns: &mut [TcpStream]) -> usize {
    let mut closed = 0;
    for c in conns.iter_mut() {
        let mut buf = [0u8; 256];
        if let Ok(Ok(0) | Err(_)) = timeout(Duration::from_millis(2), c.read(&mut buf)).await {
            closed += 1;
        }
    }
    closed
}

async fn timed<F, T>(what: &str, request: F) -> T
where
    F: std::future::Future<Output = Result<T, reqwest::Error>>,
{
    let started = Instant::now();
    let result = match timeout(Duration::from_secs(10), request).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what}: no answer within 10 s"),
    };
    let took = started.elapsed();
    assert!(
        took < SERVED_WITHIN,
        "{what} took {took:?} with the hostile connections open (bound {SERVED_WITHIN:?})"
    );
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_and_slow_connections_do_not_keep_real_clients_out() {
    let Some(env) = runtime_env("hostile_clients::thousands_of_idle_and_slow_connections") else { return };
    raise_fd_limit(((IDLE_READ_ONLY + SLOWLORIS + TRICKLING + 3 * IDLE_OTHERS) * 2 + 1000) as u64);
    let http_port = free_port();
    let options = StartOptions {
        extra_args: vec!["--manifest-http-addr".to_owned(), format!("127.0.0.1:{http_port}")],
        ..StartOptions::default()
    };
    let nodelet = Nodelet::start_with(&env, "hostile-conns", options).await;
    let manifest = nodelet
        .pod_manifest("steady", json!({"containers": [{"name": "app", "command": sleep_until_term("")}]}));
    nodelet.write_manifest("steady.yaml", &manifest);
    let before = nodelet.wait_running("steady").await;
    let steady_uid = uid(&before);
    let pid = nodelet.pid().unwrap_or_else(|| panic!("nodelet has no pid"));
    let ports = nodelet.ports();
    let read_only: SocketAddr = ([127, 0, 0, 1], ports.read_only).into();
    let main: SocketAddr = ([127, 0, 0, 1], ports.main).into();
    let healthz: SocketAddr = ([127, 0, 0, 1], ports.healthz).into();
    let manifests: SocketAddr = ([127, 0, 0, 1], http_port).into();
    let manifest_token = nodelet.manifest_token();

    // Trickling bodies first (they are busy: the server must not close them for room, only time them out),
    // then slowloris senders and plain idle connections on every port.
    let mut trickling = Vec::with_capacity(TRICKLING);
    for _ in 0..TRICKLING {
        let mut c = match TcpStream::connect(manifests).await {
            Ok(c) => c,
            Err(e) => panic!("connect to the manifest endpoint: {e}"),
        };
        let head = "POST /pods HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/yaml\r\n\
                    Content-Length: 10000\r\n\r\nkind: Pod\n";
        if let Err(e) = c.write_all(head.as_bytes()).await {
            panic!("start a trickling body: {e}");
        }
        trickling.push(c);
    }
    let mut slowloris = open_idle(read_only, SLOWLORIS).await;
    for c in &mut slowloris {
        // A request line and one header, never the blank line that ends the headers.
        let _ = c.write_all(b"GET /pods HTTP/1.1\r\nHost: 127.0.0.1\r\n").await;
    }
    let mut idle_read_only = open_idle(read_only, IDLE_READ_ONLY).await;
    let mut idle_main = open_idle(main, IDLE_OTHERS).await;
    let mut idle_healthz = open_idle(healthz, IDLE_OTHERS).await;
    let mut idle_manifests = open_idle(manifests, IDLE_OTHERS).await;
    sleep(Duration::from_millis(300)).await;

    // Real clients, each on a new connection, on every port.
    let fresh = || match reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build() {
        Ok(c) => c,
        Err(e) => panic!("HTTP client: {e}"),
    };
    for round in 0..3 {
        let pods =
            timed("GET /pods on the read-only port", fresh().get(format!("http://{read_only}/pods")).send())
                .await;
        assert!(pods.status().is_success(), "round {round}: read-only /pods answered {}", pods.status());
        let health = timed("GET /healthz", fresh().get(format!("http://{healthz}/healthz")).send()).await;
        assert!(health.status().is_success(), "round {round}: /healthz answered {}", health.status());
        let main_pods = timed(
            "GET /pods on the main port",
            nodelet.main_client().get(nodelet.main_url("/pods")).bearer_auth(TOKEN).send(),
        )
        .await;
        assert!(main_pods.status().is_success(), "round {round}: main /pods answered {}", main_pods.status());
        let listed = timed(
            "GET /pods on the manifest endpoint",
            fresh().get(format!("http://{manifests}/pods")).bearer_auth(&manifest_token).send(),
        )
        .await;
        assert!(
            listed.status().is_success(),
            "round {round}: manifest endpoint answered {}",
            listed.status()
        );
    }

    // Room was made by closing idle connections (one client address: at most 256 stay open per listener).
    let closed = closed_by_server(&mut idle_read_only).await + closed_by_server(&mut slowloris).await;
    assert!(
        closed >= IDLE_READ_ONLY + SLOWLORIS - 256,
        "the read-only port closed only {closed} of {} idle and slowloris connections",
        IDLE_READ_ONLY + SLOWLORIS
    );
    for (name, conns) in
        [("main", &mut idle_main), ("healthz", &mut idle_healthz), ("manifest", &mut idle_manifests)]
    {
        let closed = closed_by_server(conns).await;
        assert!(
            closed >= IDLE_OTHERS - 256,
            "the {name} port closed only {closed} of {IDLE_OTHERS} idle connections"
        );
    }
    // Trickling bodies are busy requests: not closed to make room for idle ones.
    let cut = closed_by_server(&mut trickling).await;
    assert_eq!(cut, 0, "{cut} requests whose bodies were still arriving were closed to make room");

    // The daemon is up, within its memory bound, and the pod was not touched.
    let peak = peak_rss_kib(pid);
    assert!(
        peak < PEAK_RSS_MIB * 1024,
        "nodelet's peak RSS reached {} MiB (bound {PEAK_RSS_MIB} MiB)",
        peak / 1024
    );
    eprintln!("peak RSS with the hostile connections open: {:.1} MiB", peak as f64 / 1024.0);
    let after = nodelet.wait_running("steady").await;
    assert_eq!(uid(&after), steady_uid);
    let restarts: i32 = after
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0);
    assert_eq!(restarts, 0, "the steady pod's container restarted during the attack");
    drop((idle_read_only, idle_main, idle_healthz, idle_manifests, slowloris, trickling));
    nodelet.shutdown().await;
}
