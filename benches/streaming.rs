//! Streaming benchmark: `nodelet exec` round trips and port-forward throughput, each beside the runtime's
//! own figure measured in the same run on the same pod.
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! (`scripts/runtime-up.sh`; `. /tmp/nodelet-test/env.sh` exports what is read here) and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench streaming
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` it prints a note and exits 0 (`NODELET_REQUIRE_RUNTIME=1` makes that an
//! error). It starts nodelet (the binary cargo builds for this bench) on the external runtime with a bearer
//! token for the main port and one busybox pod whose container serves `nc -ll -p 9000` (each connection gets
//! `dd if=/dev/zero`, N MiB) and `nc -ll -p 9001` (each connection reads N MiB with `dd`, then answers `done`). Then:
//!
//! 1. **exec**, in rounds, each path once per round (so all see the same machine load); median and p90:
//!    - *CRI ExecSync*: one gRPC call of `true` (no streaming at all);
//!    - *CRI Exec + WebSocket*: CRI `Exec`, then the runtime's streaming URL with `v4.channel.k8s.io`
//!      directly (what nodelet proxies; plain HTTP on loopback) until the status frame and the close: the
//!      floor;
//!    - *nodelet /exec WebSocket*: the same over TLS on nodelet's main port, from this process;
//!    - *`nodelet exec POD -c app -- true`*: the CLI binary, wall time from spawn to exit (process start,
//!      TLS, the pod list is not needed with `-c`, WebSocket, exec, exit code);
//!    - *`nodelet --version`*: the CLI's process start alone, for the breakdown.
//! 2. **port-forward**, N MiB each way, in rounds (each path once per round), MB/s (10^6 bytes/s):
//!    - *direct TCP* to the pod IP (the pod network bridge): the floor;
//!    - *runtime WebSocket*: CRI `PortForward` and the runtime's URL directly (`v4.channel.k8s.io`);
//!    - *nodelet /portForward WebSocket* over TLS from this process;
//!    - *`nodelet port-forward POD :9000 :9001`*: the CLI, through its local port.
//!
//!    "download" is pod → client, "upload" client → pod (timed until the pod's `done`). nodelet's CPU time
//!    during its transfers is printed per GiB.
//!
//! Environment: `NODELET_BENCH_EXEC_RUNS` (exec rounds, default 30), `NODELET_BENCH_FORWARD_MIB` (default
//! 256), `NODELET_BENCH_FORWARD_ROUNDS` (default 3), `NODELET_BENCH_KEEP_LOG=1` (keep nodelet's log
//! directory), `NODELET_BENCH_LOG` (nodelet's `RUST_LOG`), `NODELET_BENCH_BINARY` (another nodelet binary to
//! measure, e.g. a copy of an earlier build). The pod is removed at the end, also after an
//! error (by nodelet, then by its node label).

#[path = "common/mod.rs"]
mod common;
use common::{USER_HZ, cpu_ticks, cpus, env_number, free_port, loadavg, median, ms, sweep};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{SinkExt as _, StreamExt as _};
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter, labels, proto};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// How often `/pods` is polled.
const POLL: Duration = Duration::from_millis(50);
/// How long one exec or one transfer may take.
const STEP_LIMIT: Duration = Duration::from_secs(30);
/// The bearer token configured for the main port.
const TOKEN: &str = "bench-streaming-token-0123456789";
/// The pod's download and upload ports.
const DOWNLOAD_PORT: u16 = 9000;
const UPLOAD_PORT: u16 = 9001;
/// Bytes per write (and per WebSocket frame) of an upload.
const CHUNK: usize = 64 * 1024;
/// The pod (static, so named `stream-<node>`) and its container.
const POD: &str = "stream";
const CONTAINER: &str = "app";

/// Settings from the environment.
#[derive(Debug, Clone)]
struct Settings {
    exec_runs: usize,
    forward_bytes: u64,
    forward_rounds: usize,
    keep_log: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let number = env_number;
        let settings = Settings {
            exec_runs: number("NODELET_BENCH_EXEC_RUNS", 30)?,
            forward_bytes: number("NODELET_BENCH_FORWARD_MIB", 256)? as u64 * 1024 * 1024,
            forward_rounds: number("NODELET_BENCH_FORWARD_ROUNDS", 3)?,
            keep_log: std::env::var("NODELET_BENCH_KEEP_LOG").as_deref() == Ok("1"),
        };
        if settings.exec_runs == 0 || settings.forward_bytes == 0 || settings.forward_rounds == 0 {
            bail!("runs, MiB and rounds must be at least 1");
        }
        Ok(settings)
    }
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let Ok(endpoint) = std::env::var("NODELET_TEST_CRI_ENDPOINT") else {
        if std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1") {
            bail!("NODELET_TEST_CRI_ENDPOINT is unset (run `. /tmp/nodelet-test/env.sh` first)");
        }
        println!(
            "streaming bench: skipped (NODELET_TEST_CRI_ENDPOINT unset; run `. /tmp/nodelet-test/env.sh`)"
        );
        return Ok(());
    };
    let settings = Settings::from_env()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(endpoint, settings))
}

async fn run(endpoint: String, settings: Settings) -> anyhow::Result<()> {
    let started = Instant::now();
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let dir = tempfile::Builder::new().prefix("nodelet-streaming-bench-").tempdir()?;
    let node = format!("bench-streaming-{}", std::process::id());
    let cri = CriClient::connect(CriConfig::new(endpoint.clone()))
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    println!(
        "streaming bench: {} exec rounds, port-forward {} MiB × {} rounds",
        settings.exec_runs,
        settings.forward_bytes >> 20,
        settings.forward_rounds
    );
    println!("machine: {} CPUs, load average {}", cpus(), loadavg());
    let mut nodelet = Nodelet::start(&endpoint, &var, dir.path(), &node).await?;
    let result = async {
        let image = var("NODELET_TEST_BUSYBOX_IMAGE", "localhost/nodelet/busybox:latest");
        let pod = nodelet.start_pod(&image, settings.forward_bytes).await?;
        println!("pod {} running at {} after {}", pod.name, pod.ip, ms(started.elapsed()));
        let exec = measure_exec(&nodelet, &cri, &pod, settings.exec_runs).await?;
        let forward = measure_forward(&nodelet, &cri, &pod, &settings).await?;
        report_exec(&exec);
        report_forward(&forward, settings.forward_bytes);
        report_tls(&nodelet.dir.join("root").join("pki"), settings.forward_bytes)?;
        nodelet.remove_pod().await
    }
    .await;
    let stopped = nodelet.stop().await;
    let swept = sweep(&cri, SandboxFilter::managed().label(labels::NODE, node.clone())).await;
    if swept > 0 {
        println!("removed {swept} leftover sandbox(es)");
    }
    if settings.keep_log {
        let kept = dir.keep();
        println!("nodelet's log: {}", kept.join("nodelet.log").display());
    }
    println!("streaming bench: done in {:.1} s", started.elapsed().as_secs_f64());
    result.and(stopped)
}

// ------------------------------------------------------------------------------------------------ exec

/// Wall times of each exec path.
#[derive(Debug, Default)]
struct ExecFigures {
    exec_sync: Vec<Duration>,
    runtime_ws: Vec<Duration>,
    nodelet_ws: Vec<Duration>,
    cli: Vec<Duration>,
    process_start: Vec<Duration>,
}

async fn measure_exec(
    nodelet: &Nodelet,
    cri: &CriClient,
    pod: &PodInfo,
    runs: usize,
) -> anyhow::Result<ExecFigures> {
    let mut f = ExecFigures::default();
    // Warm up each path once (connection pools, page cache of the binary).
    for warm in [true, false] {
        let rounds = if warm { 2 } else { runs };
        for _ in 0..rounds {
            let t = Instant::now();
            let out = cri.exec_sync(&pod.container_id, vec!["true".to_owned()], STEP_LIMIT).await?;
            let exec_sync = t.elapsed();
            if out.exit_code != 0 {
                bail!("ExecSync true exited with {}", out.exit_code);
            }

            let t = Instant::now();
            let url = cri.exec(exec_request(&pod.container_id)).await?;
            let ws = runtime_ws(&url).await?;
            expect_success(ws).await.context("exec through the runtime's URL")?;
            let runtime_ws = t.elapsed();

            let t = Instant::now();
            let path = format!("/exec/default/{}/{CONTAINER}?command=true&stdout=1&stderr=1", pod.name);
            let ws = nodelet.ws(&path).await?;
            expect_success(ws).await.context("exec through nodelet's /exec")?;
            let nodelet_ws = t.elapsed();

            let t = Instant::now();
            nodelet.cli_exec(&pod.name).await?;
            let cli = t.elapsed();

            let t = Instant::now();
            nodelet.version().await?;
            let process_start = t.elapsed();

            if !warm {
                f.exec_sync.push(exec_sync);
                f.runtime_ws.push(runtime_ws);
                f.nodelet_ws.push(nodelet_ws);
                f.cli.push(cli);
                f.process_start.push(process_start);
            }
        }
    }
    Ok(f)
}

fn exec_request(container_id: &str) -> proto::ExecRequest {
    proto::ExecRequest {
        container_id: container_id.to_owned(),
        cmd: vec!["true".to_owned()],
        tty: false,
        stdin: false,
        stdout: true,
        stderr: true,
    }
}

/// Reads an exec's frames until the server closes; fails unless the status frame says Success.
async fn expect_success<S: AsyncRead + AsyncWrite + Unpin>(mut ws: WebSocketStream<S>) -> anyhow::Result<()> {
    let read = async {
        let mut status = None;
        while let Some(message) = ws.next().await {
            match message {
                Ok(Message::Binary(d)) if d.first() == Some(&3) && d.len() > 1 => {
                    status = Some(serde_json::from_slice::<serde_json::Value>(&d[1..])?);
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        anyhow::Ok(status)
    };
    match timeout(STEP_LIMIT, read).await.context("the exec did not end in time")?? {
        Some(s) if s["status"] == "Success" => Ok(()),
        other => bail!("exec status {other:?}"),
    }
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).saturating_sub(1);
    v.get(i).copied().unwrap_or_default()
}

fn report_exec(f: &ExecFigures) {
    let floor = median(&f.runtime_ws);
    println!();
    println!("| exec of `true` ({} rounds) | median | p90 | median / floor | goal |", f.cli.len());
    println!("|---|--:|--:|--:|---|");
    let row = |name: &str, v: &[Duration], goal: &str| {
        println!(
            "| {name} | {} | {} | {:.2}× | {goal} |",
            ms1(median(v)),
            ms1(percentile(v, 0.9)),
            median(v).as_secs_f64() / floor.as_secs_f64()
        );
    };
    row("CRI ExecSync (gRPC only)", &f.exec_sync, "");
    row("CRI Exec + runtime's WebSocket (floor)", &f.runtime_ws, "");
    row("nodelet /exec WebSocket over TLS, in process", &f.nodelet_ws, "");
    row("`nodelet exec POD -c app -- true` (CLI, spawn → exit)", &f.cli, "< 150 ms");
    row("`nodelet --version` (process start alone)", &f.process_start, "");
}

fn ms1(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ------------------------------------------------------------------------------------------------ port-forward

/// The port-forward paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    Direct,
    RuntimeWs,
    NodeletWs,
    Cli,
}

impl Route {
    const ALL: [Route; 4] = [Route::Direct, Route::RuntimeWs, Route::NodeletWs, Route::Cli];

    fn name(self) -> &'static str {
        match self {
            Route::Direct => "direct TCP to the pod IP (floor)",
            Route::RuntimeWs => "runtime's port-forward WebSocket (CRI PortForward URL)",
            Route::NodeletWs => "nodelet /portForward WebSocket over TLS, in process (netns dial)",
            Route::Cli => "`nodelet port-forward` (CLI, local TCP port)",
        }
    }
}

/// One transfer: how long, and nodelet's CPU ticks meanwhile.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    took: Duration,
    nodelet_ticks: u64,
    /// Busy CPU ticks of the whole machine (every process, the kernel's network work included).
    machine_ticks: u64,
}

/// Busy ticks of all CPUs since boot (`/proc/stat`: user, nice, system, irq, softirq, steal).
fn machine_busy_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).map(|f| f.parse().unwrap_or(0)).collect();
    Ok([0, 1, 2, 5, 6, 7].iter().filter_map(|&i| fields.get(i)).sum())
}

#[derive(Debug, Default)]
struct ForwardFigures {
    download: HashMap<Route, Vec<Transfer>>,
    upload: HashMap<Route, Vec<Transfer>>,
}

async fn measure_forward(
    nodelet: &Nodelet,
    cri: &CriClient,
    pod: &PodInfo,
    settings: &Settings,
) -> anyhow::Result<ForwardFigures> {
    let bytes = settings.forward_bytes;
    let mut cli = nodelet.cli_port_forward(&pod.name).await?;
    let result = async {
        let mut f = ForwardFigures::default();
        for round in 0..settings.forward_rounds {
            for route in Route::ALL {
                for upload in [false, true] {
                    let port = if upload { UPLOAD_PORT } else { DOWNLOAD_PORT };
                    let ticks0 = cpu_ticks(nodelet.pid()?)?;
                    let busy0 = machine_busy_ticks()?;
                    let t = Instant::now();
                    let transfer = async {
                        match route {
                            Route::Direct => tcp_transfer(&format!("{}:{port}", pod.ip), bytes, upload).await,
                            Route::Cli => {
                                let local = if upload { &cli.upload } else { &cli.download };
                                tcp_transfer(local, bytes, upload).await
                            }
                            Route::RuntimeWs => {
                                let url = cri.port_forward(&pod.sandbox_id, vec![i32::from(port)]).await?;
                                ws_transfer(runtime_ws(&url).await?, bytes, upload).await
                            }
                            Route::NodeletWs => {
                                let ws = nodelet
                                    .ws(&format!("/portForward/default/{}?port={port}", pod.name))
                                    .await?;
                                ws_transfer(ws, bytes, upload).await
                            }
                        }
                    };
                    timeout(STEP_LIMIT, transfer)
                        .await
                        .with_context(|| format!("{} did not finish in {STEP_LIMIT:?}", route.name()))?
                        .with_context(|| route.name())?;
                    let took = t.elapsed();
                    let nodelet_ticks = cpu_ticks(nodelet.pid()?)?.saturating_sub(ticks0);
                    let machine_ticks = machine_busy_ticks()?.saturating_sub(busy0);
                    println!(
                        "round {}: {} {}: {:.0} MB/s (nodelet CPU {} ms)",
                        round + 1,
                        if upload { "upload  " } else { "download" },
                        route.name(),
                        bytes as f64 / took.as_secs_f64() / 1e6,
                        nodelet_ticks * 10
                    );
                    let v = if upload { &mut f.upload } else { &mut f.download };
                    v.entry(route).or_default().push(Transfer { took, nodelet_ticks, machine_ticks });
                }
            }
        }
        anyhow::Ok(f)
    }
    .await;
    let _ = cli.child.kill().await;
    result
}

/// Download: reads `bytes` from `addr`; upload: writes `bytes`, then waits for the pod's `done`.
async fn tcp_transfer(addr: &str, bytes: u64, upload: bool) -> anyhow::Result<()> {
    let mut tcp = TcpStream::connect(addr).await.with_context(|| format!("connect to {addr}"))?;
    tcp.set_nodelay(true)?;
    if upload {
        let chunk = vec![0x5a_u8; CHUNK];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            tcp.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
        let mut answer = Vec::new();
        while !answer.ends_with(b"done\n") {
            let mut buf = [0_u8; 64];
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                bail!("closed before `done` ({:?})", String::from_utf8_lossy(&answer));
            }
            answer.extend_from_slice(&buf[..n]);
        }
    } else {
        let mut buf = vec![0_u8; 256 * 1024];
        let mut got = 0_u64;
        while got < bytes {
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                bail!("closed after {got} of {bytes} bytes");
            }
            got += n as u64;
        }
    }
    Ok(())
}

/// The same over a port-forward WebSocket (`v4.channel.k8s.io`: channel 0 data, 1 errors, each starting
/// with the 2-byte port).
async fn ws_transfer<S: AsyncRead + AsyncWrite + Unpin>(
    ws: WebSocketStream<S>,
    bytes: u64,
    upload: bool,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let mut prefix = [2_usize, 2];
    let mut got = 0_u64;
    let mut answer = Vec::new();
    let mut errors = Vec::new();
    let writer = async {
        if upload {
            let mut frame = vec![0x5a_u8; CHUNK + 1];
            frame[0] = 0;
            let mut left = bytes;
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                sink.send(Message::binary(frame[..=n].to_vec())).await?;
                left -= n as u64;
            }
        }
        anyhow::Ok(sink)
    };
    let reader = async {
        while let Some(message) = stream.next().await {
            let data = match message? {
                Message::Binary(d) => d,
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&channel, mut payload)) = data.split_first() else { continue };
            let Some(skip) = prefix.get_mut(usize::from(channel)) else { continue };
            let n = (*skip).min(payload.len());
            payload = &payload[n..];
            *skip -= n;
            if channel == 1 {
                errors.extend_from_slice(payload);
                if !errors.is_empty() {
                    bail!("error stream: {}", String::from_utf8_lossy(&errors));
                }
            } else if upload {
                answer.extend_from_slice(payload);
                if answer.ends_with(b"done\n") {
                    return Ok(());
                }
            } else {
                got += payload.len() as u64;
                if got >= bytes {
                    return Ok(());
                }
            }
        }
        bail!("closed after {got} of {bytes} bytes ({:?})", String::from_utf8_lossy(&answer))
    };
    let (sink, read) = tokio::join!(writer, reader);
    read?;
    let _ = sink?.close().await;
    Ok(())
}

fn report_forward(f: &ForwardFigures, bytes: u64) {
    let rate = |v: &[Transfer]| {
        let took = median(&v.iter().map(|t| t.took).collect::<Vec<_>>());
        bytes as f64 / took.as_secs_f64() / 1e6
    };
    let cpu_per_gib = |v: &[Transfer]| {
        let ticks: u64 = v.iter().map(|t| t.nodelet_ticks).sum();
        ticks as f64 / USER_HZ / (bytes as f64 * v.len() as f64 / f64::from(1 << 30))
    };
    let machine_per_gib = |v: &[Transfer]| {
        let ticks: u64 = v.iter().map(|t| t.machine_ticks).sum();
        ticks as f64 / USER_HZ / (bytes as f64 * v.len() as f64 / f64::from(1 << 30))
    };
    for (what, map) in [("download (pod → client)", &f.download), ("upload (client → pod)", &f.upload)] {
        let (Some(floor), Some(runtime)) = (map.get(&Route::Direct), map.get(&Route::RuntimeWs)) else {
            continue;
        };
        let (floor, runtime) = (rate(floor), rate(runtime));
        println!();
        println!(
            "| port-forward {what}, {} MiB, median of {} | MB/s | / direct TCP | / runtime's WebSocket | \
             nodelet CPU s/GiB | machine CPU s/GiB | goal |",
            bytes >> 20,
            map.get(&Route::Direct).map_or(0, Vec::len)
        );
        println!("|---|--:|--:|--:|--:|--:|---|");
        for route in Route::ALL {
            let Some(v) = map.get(&route) else { continue };
            let goal = if route == Route::Cli { "≥ 0.80× direct TCP" } else { "" };
            println!(
                "| {} | {:.0} | {:.2}× | {:.2}× | {:.2} | {:.2} | {goal} |",
                route.name(),
                rate(v),
                rate(v) / floor,
                rate(v) / runtime,
                cpu_per_gib(v),
                machine_per_gib(v)
            );
        }
    }
}

/// What TLS costs one core: rustls (ring, as nodelet and its CLI use it) in memory, a client connection
/// sending `bytes` to a server connection with nodelet's certificate, per TLS 1.3 cipher suite; the time
/// spent encrypting and decrypting is taken apart (in the port-forward paths one process does each).
fn report_tls(pki: &Path, bytes: u64) -> anyhow::Result<()> {
    use rustls::crypto::ring::cipher_suite;
    use std::io::{Read as _, Write as _};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki.join("nodelet.crt"))?.collect::<Result<_, _>>()?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(pki.join("nodelet.key"))?;
    println!();
    println!(
        "| TLS 1.3 in memory, one thread, {} MiB | encrypt MB/s | decrypt MB/s | both MB/s |",
        bytes >> 20
    );
    println!("|---|--:|--:|--:|");
    for suite in [
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ] {
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: vec![suite],
            ..rustls::crypto::ring::default_provider()
        });
        let server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key.clone_key())?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in &chain {
            roots.add(cert.clone())?;
        }
        let client_config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut client = rustls::ClientConnection::new(
            Arc::new(client_config),
            ServerName::try_from("127.0.0.1")?.to_owned(),
        )?;
        let mut server = rustls::ServerConnection::new(Arc::new(server_config))?;
        let mut wire = Vec::new();
        while client.is_handshaking() || server.is_handshaking() {
            wire.clear();
            while client.wants_write() {
                client.write_tls(&mut wire)?;
            }
            server.read_tls(&mut wire.as_slice())?;
            server.process_new_packets()?;
            wire.clear();
            while server.wants_write() {
                server.write_tls(&mut wire)?;
            }
            client.read_tls(&mut wire.as_slice())?;
            client.process_new_packets()?;
        }
        let chunk = vec![0x5a_u8; CHUNK];
        let mut plain = vec![0_u8; CHUNK];
        let (mut encrypt, mut decrypt) = (Duration::ZERO, Duration::ZERO);
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            let t = Instant::now();
            client.writer().write_all(&chunk[..n])?;
            wire.clear();
            while client.wants_write() {
                client.write_tls(&mut wire)?;
            }
            encrypt += t.elapsed();
            let t = Instant::now();
            let mut input = wire.as_slice();
            while !input.is_empty() {
                server.read_tls(&mut input)?;
                server.process_new_packets()?;
                while server.reader().read(&mut plain).is_ok_and(|r| r > 0) {}
            }
            decrypt += t.elapsed();
            left -= n as u64;
        }
        let rate = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
        println!(
            "| {:?} | {:.0} | {:.0} | {:.0} |",
            suite.suite(),
            rate(encrypt),
            rate(decrypt),
            rate(encrypt + decrypt)
        );
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------ clients

/// A WebSocket to the runtime's streaming URL (`http://127.0.0.1:…`), `v4.channel.k8s.io`.
async fn runtime_ws(url: &str) -> anyhow::Result<WebSocketStream<TcpStream>> {
    let rest = url.strip_prefix("http://").with_context(|| format!("runtime URL {url}"))?;
    let host = rest.split('/').next().unwrap_or_default();
    let mut request = format!("ws://{rest}").into_client_request()?;
    request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static("v4.channel.k8s.io"));
    let tcp = TcpStream::connect(host).await.with_context(|| format!("connect to {host}"))?;
    tcp.set_nodelay(true)?;
    let (ws, _) = tokio_tungstenite::client_async(request, tcp).await.with_context(|| url.to_owned())?;
    Ok(ws)
}

/// The pod the bench streams to.
#[derive(Debug, Clone)]
struct PodInfo {
    name: String,
    ip: String,
    sandbox_id: String,
    container_id: String,
}

/// `nodelet port-forward` and its local addresses.
#[derive(Debug)]
struct CliForward {
    child: Child,
    download: String,
    upload: String,
}

/// The nodelet binary under test, on the external runtime.
#[derive(Debug)]
struct Nodelet {
    child: Child,
    cri: CriClient,
    node: String,
    dir: PathBuf,
    http: reqwest::Client,
    read_only: u16,
    main: u16,
    tls: Arc<rustls::ClientConfig>,
}

impl Nodelet {
    async fn start(
        endpoint: &str,
        var: &impl Fn(&str, &str) -> String,
        dir: &Path,
        node: &str,
    ) -> anyhow::Result<Nodelet> {
        for sub in ["root", "manifests", "logs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        std::fs::write(dir.join("tokens.csv"), format!("{TOKEN},bench,1001,\"system:masters\"\n"))?;
        std::fs::write(
            dir.join("config.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodelet:\n  \
             tokenAuthFile: tokens.csv\n\
             evictionHard: {memory.available: 100Mi}\nimageGCHighThresholdPercent: 100\n",
        )?;
        let (read_only, main, healthz) = (free_port()?, free_port()?, free_port()?);
        let log = std::fs::File::create(dir.join("nodelet.log"))?;
        let path = |p: &str| dir.join(p).display().to_string();
        let args = [
            ("--config", path("config.yaml")),
            ("--root-dir", path("root")),
            ("--pod-manifest-path", path("manifests")),
            ("--pod-logs-dir", path("logs")),
            ("--container-runtime-endpoint", endpoint.to_owned()),
            ("--hostname-override", node.to_owned()),
            ("--address", "127.0.0.1".to_owned()),
            ("--read-only-port", read_only.to_string()),
            ("--port", main.to_string()),
            ("--healthz-port", healthz.to_string()),
            ("--cgroup-root", var("NODELET_TEST_CGROUP_PARENT", "/nodelet-test")),
            ("--resolv-conf", var("NODELET_TEST_RESOLV_CONF", "")),
        ];
        let child = Command::new(binary())
            .args(args.iter().flat_map(|(flag, value)| [*flag, value.as_str()]))
            .env_remove("RUST_LOG")
            .envs(std::env::var("NODELET_BENCH_LOG").ok().map(|filter| ("RUST_LOG", filter)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start nodelet")?;
        let mut child = child;
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build()?;
        let url = format!("http://127.0.0.1:{healthz}/healthz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("nodelet exited during start-up ({status}); see {}", dir.join("nodelet.log").display());
            }
            if http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() >= deadline {
                bail!("nodelet not healthy within 30 s");
            }
            sleep(POLL).await;
        }
        let cri = CriClient::connect(CriConfig::new(endpoint.to_owned())).await?;
        // The main port's self-signed certificate exists once nodelet is healthy.
        let tls = Arc::new(tls_config(&dir.join("root").join("pki").join("nodelet.crt"))?);
        Ok(Nodelet { child, cri, node: node.to_owned(), dir: dir.to_owned(), http, read_only, main, tls })
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("nodelet has exited")
    }

    /// nodelet's self-signed serving certificate.
    fn ca(&self) -> PathBuf {
        self.dir.join("root").join("pki").join("nodelet.crt")
    }

    fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.main)
    }

    /// Writes the manifest and waits until the pod runs; its IP and runtime IDs.
    async fn start_pod(&mut self, image: &str, bytes: u64) -> anyhow::Result<PodInfo> {
        let manifests = self.dir.join("manifests");
        let tmp = manifests.join(".stream.yaml.tmp");
        std::fs::write(&tmp, manifest(image, bytes))?;
        std::fs::rename(&tmp, manifests.join("stream.yaml"))?;
        let name = format!("{POD}-{}", self.node);
        let deadline = Instant::now() + Duration::from_secs(60);
        let ip = loop {
            let url = format!("http://127.0.0.1:{}/pods", self.read_only);
            let list: serde_json::Value = serde_json::from_slice(
                &self.http.get(&url).send().await?.error_for_status()?.bytes().await?,
            )?;
            let pod = list["items"].as_array().into_iter().flatten().find(|p| p["metadata"]["name"] == name);
            if let Some(pod) = pod
                && pod["status"]["phase"] == "Running"
                && let Some(ip) = pod["status"]["podIP"].as_str()
            {
                break ip.to_owned();
            }
            if Instant::now() >= deadline {
                bail!("pod {name} not Running within 60 s");
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("nodelet exited ({status})");
            }
            sleep(POLL).await;
        };
        let sandbox_id = self
            .cri
            .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node.clone()))
            .await?
            .into_iter()
            .find(|s| s.state == proto::PodSandboxState::SandboxReady as i32)
            .map(|s| s.id)
            .context("no ready sandbox")?;
        let container_id = self
            .cri
            .list_containers(&ContainerFilter::managed().label(labels::NODE, self.node.clone()))
            .await?
            .into_iter()
            .find(|c| {
                c.state == proto::ContainerState::ContainerRunning as i32
                    && c.metadata.as_ref().is_some_and(|m| m.name == CONTAINER)
            })
            .map(|c| c.id)
            .context("no running container")?;
        // Until nc listens: a download of one byte through the pod network.
        let addr = format!("{ip}:{DOWNLOAD_PORT}");
        loop {
            if tcp_transfer(&addr, 1, false).await.is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                bail!("nothing listens on {addr}");
            }
            sleep(POLL).await;
        }
        Ok(PodInfo { name, ip, sandbox_id, container_id })
    }

    async fn remove_pod(&mut self) -> anyhow::Result<()> {
        std::fs::remove_file(self.dir.join("manifests").join("stream.yaml"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let sandboxes = self
                .cri
                .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node.clone()))
                .await?;
            if sandboxes.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("pod not removed within 60 s");
            }
            sleep(POLL).await;
        }
    }

    /// A WebSocket (`v4.channel.k8s.io`) to `path` on the main port, with the token.
    async fn ws(
        &self,
        path: &str,
    ) -> anyhow::Result<WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>> {
        let mut request = format!("wss://127.0.0.1:{}{path}", self.main).into_client_request()?;
        let headers = request.headers_mut();
        headers.insert("Authorization", HeaderValue::from_str(&format!("Bearer {TOKEN}"))?);
        headers.insert("Sec-WebSocket-Protocol", HeaderValue::from_static("v4.channel.k8s.io"));
        let tcp = TcpStream::connect(("127.0.0.1", self.main)).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("127.0.0.1")?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, tcp).await?;
        static SHOWN: std::sync::Once = std::sync::Once::new();
        SHOWN.call_once(|| println!("main port TLS: {:?}", tls.get_ref().1.negotiated_cipher_suite()));
        let (ws, _) = tokio_tungstenite::client_async(request, tls).await.with_context(|| path.to_owned())?;
        Ok(ws)
    }

    /// The CLI with the main port's flags and the token in the environment.
    fn cli(&self, command: &str) -> Command {
        let mut cli = Command::new(binary());
        cli.arg(command)
            .arg("--server")
            .arg(self.server())
            .arg("--certificate-authority")
            .arg(self.ca())
            .env("NODELET_TOKEN", TOKEN)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cli
    }

    /// `nodelet exec POD -c app -- true`.
    async fn cli_exec(&self, pod: &str) -> anyhow::Result<()> {
        let out = timeout(
            STEP_LIMIT,
            self.cli("exec").args([pod, "-c", CONTAINER, "--", "true"]).stdout(Stdio::null()).output(),
        )
        .await
        .context("nodelet exec did not end in time")??;
        if !out.status.success() {
            bail!("nodelet exec: {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `nodelet --version`.
    async fn version(&self) -> anyhow::Result<()> {
        let out = Command::new(binary()).arg("--version").output().await?;
        if !out.status.success() {
            bail!("nodelet --version: {}", out.status);
        }
        Ok(())
    }

    /// `nodelet port-forward POD :9000 :9001`, once it says where it listens.
    async fn cli_port_forward(&self, pod: &str) -> anyhow::Result<CliForward> {
        let mut child = self
            .cli("port-forward")
            .args([pod, &format!(":{DOWNLOAD_PORT}"), &format!(":{UPLOAD_PORT}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("nodelet port-forward")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout);
        let mut local = HashMap::new();
        while local.len() < 2 {
            let mut line = String::new();
            timeout(STEP_LIMIT, lines.read_line(&mut line)).await.context("port-forward's first lines")??;
            // Forwarding from 127.0.0.1:PORT -> 9000
            let Some((addr, remote)) =
                line.trim().strip_prefix("Forwarding from ").and_then(|r| r.split_once(" -> "))
            else {
                bail!("unexpected port-forward output {line:?}");
            };
            local.insert(remote.to_owned(), addr.to_owned());
        }
        // Keep reading its stdout ("Handling connection for …") so that it never blocks on a full pipe.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut lines, &mut tokio::io::sink()).await;
        });
        let get = |port: u16| local.get(&port.to_string()).cloned().context("a forwarded port is missing");
        Ok(CliForward { download: get(DOWNLOAD_PORT)?, upload: get(UPLOAD_PORT)?, child })
    }

    /// SIGTERM, then wait (SIGKILL after 20 s).
    async fn stop(&mut self) -> anyhow::Result<()> {
        let pid = self.pid()?;
        let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw).context("bad pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        if timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            self.child.start_kill()?;
            self.child.wait().await?;
            bail!("nodelet did not stop within 20 s of SIGTERM");
        }
        Ok(())
    }
}

/// The nodelet binary: `NODELET_BENCH_BINARY` (e.g. a copy of an earlier build, to compare two versions in
/// one run each), else the one cargo built for this bench.
fn binary() -> PathBuf {
    std::env::var_os("NODELET_BENCH_BINARY")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nodelet")), PathBuf::from)
}

/// rustls trusting only nodelet's self-signed certificate.
fn tls_config(ca: &Path) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| ca.display().to_string())? {
        roots.add(cert?)?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The static pod: `nc -ll` on 9000 (each connection gets `bytes` of zeros, rounded up to 64 KiB) and on
/// 9001 (each connection reads as much, then answers `done`); `dd` with 64 KiB blocks, so that the pod side
/// is not what limits the rate.
fn manifest(image: &str, bytes: u64) -> String {
    let blocks = bytes.div_ceil(65536);
    let script = format!(
        "nc -ll -p {DOWNLOAD_PORT} -e sh -c 'dd if=/dev/zero bs=65536 count={blocks} 2>/dev/null' & \
         nc -ll -p {UPLOAD_PORT} -e sh -c 'dd of=/dev/null bs=65536 count={blocks} iflag=fullblock 2>/dev/null; \
         echo done' & \
         trap 'exit 0' TERM; wait"
    );
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "containers": [{
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }],
        },
    })
    .to_string()
}
