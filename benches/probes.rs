//! Prober idle-cost benchmark: nodelet's idle CPU with N pods (default 100) without probes, then with three
//! probes each (startup `exec`, liveness `httpGet`, readiness `tcpSocket`, kubelet default periods of 10 s),
//! in the same run on the same machine; prints both and their ratio.
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench probes
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` it prints a note and exits 0 (`NODELET_REQUIRE_RUNTIME=1` makes that an
//! error). Environment: `NODELET_BENCH_PROBE_PODS` (N, default 100), `NODELET_BENCH_IDLE_SECS` (the window
//! CPU is measured over, default 30), `NODELET_BENCH_SETTLE_SECS` (wait after the pods are up, default 15).
//! Every pod is busybox `httpd` (so that the probes have something to answer them) and is removed at the end.

use std::time::Duration;

use anyhow::bail;
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter, labels};
use tokio::time::sleep;

mod fixture;
use fixture::{Nodelet, number};

fn main() -> anyhow::Result<()> {
    fixture::with_runtime("probes", run)
}

async fn run(endpoint: String) -> anyhow::Result<()> {
    let pods = usize::try_from(number("NODELET_BENCH_PROBE_PODS", 100)?)?;
    let idle = Duration::from_secs(number("NODELET_BENCH_IDLE_SECS", 30)?);
    let settle = Duration::from_secs(number("NODELET_BENCH_SETTLE_SECS", 15)?);
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let image = var("NODELET_TEST_BUSYBOX_IMAGE", "localhost/nodelet/busybox:latest");
    let dir = tempfile::Builder::new().prefix("nodelet-probe-bench-").tempdir()?;
    let node = format!("bench-probes-{}", std::process::id());
    let cri = CriClient::connect(CriConfig::new(endpoint.clone())).await?;
    println!("probes bench: {pods} pods, idle window {idle:?}, settle {settle:?}");
    println!(
        "machine: {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let mut nodelet = Nodelet::start(&endpoint, &var, dir.path(), &node, &[]).await?;
    let result = async {
        let mut figures = Vec::new();
        for probes in [false, true] {
            let names: Vec<String> = (0..pods).map(|i| format!("p{i:03}")).collect();
            let took = nodelet.start_pods(&names, |name| manifest(name, &image, probes)).await?;
            println!("{pods} pods up (probes: {probes}); settling for {settle:?}, then measuring");
            sleep(settle).await;
            let before = nodelet.probe_runs().await?;
            let cpu = nodelet.cpu_over(idle).await?;
            let runs = nodelet.probe_runs().await? - before;
            let failed = nodelet.probe_runs_with("result=\"failed\"").await?
                + nodelet.probe_runs_with("result=\"unknown\"").await?;
            if failed > 0.0 {
                bail!("{failed} probe runs failed: the figures would include container restarts");
            }
            let (rss, _) = nodelet.memory()?;
            let label = if probes { "with 3 probes each" } else { "without probes" };
            println!(
                "{pods} pods {label}: started in {:.1} s; idle CPU {:.2}% of a core over {:.0} s; {:.1} probe runs/s; VmRSS {:.1} MiB",
                took.as_secs_f64(),
                cpu * 100.0,
                idle.as_secs_f64(),
                runs / idle.as_secs_f64(),
                rss as f64 / 1024.0
            );
            figures.push(cpu);
            nodelet.remove_pods(&names).await?;
        }
        let ratio = figures[1] / figures[0].max(1e-9);
        println!(
            "idle CPU with probes / without: {:.2}% / {:.2}% = {ratio:.2}x ({:+.2} percentage points of a core)",
            figures[1] * 100.0,
            figures[0] * 100.0,
            (figures[1] - figures[0]) * 100.0
        );
        anyhow::Ok(())
    }
    .await;
    let stopped = nodelet.stop().await;
    // Whatever happened: nothing of this run stays on the runtime.
    let leftovers = cri
        .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, node.clone()))
        .await
        .unwrap_or_default();
    for c in cri
        .list_containers(&ContainerFilter::managed().label(labels::NODE, node.clone()))
        .await
        .unwrap_or_default()
    {
        let _ = cri.stop_container(&c.id, Duration::ZERO).await;
        let _ = cri.remove_container(&c.id).await;
    }
    for s in &leftovers {
        let _ = cri.stop_pod_sandbox(&s.id).await;
        let _ = cri.remove_pod_sandbox(&s.id).await;
    }
    result.and(stopped)
}

/// A busybox `httpd` pod; with `probes`: startup `exec`, liveness `httpGet`, readiness `tcpSocket`, each with
/// the kubelet's default period (10 s) and timeout (1 s).
fn manifest(name: &str, image: &str, probes: bool) -> String {
    let probes = if probes {
        "    startupProbe: {exec: {command: [\"true\"]}}\n    \
         livenessProbe: {httpGet: {port: 8080, path: /}}\n    \
         readinessProbe: {tcpSocket: {port: 8080}}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  dnsPolicy: None\n  dnsConfig:\n    nameservers: [\"127.0.0.1\"]\n  \
         containers:\n  - name: web\n    image: {image}\n    imagePullPolicy: IfNotPresent\n    \
         command: [\"sh\", \"-c\", \"mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n{probes}"
    )
}
