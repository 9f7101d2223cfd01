//! Renders deploy/grafana/nodelet-dashboard.json from a running nodelet into an SVG (docs/images/dashboard.svg):
//! it scrapes `/metrics` and `/metrics/resource` a number of times and draws each panel's queries in the
//! dashboard's grid layout (see `render.rs` for the PromQL it evaluates). Not a Grafana screenshot.
//!
//! ```text
//! cargo run --example dashboard_render -- --url http://127.0.0.1:10255 [--samples 13] [--interval 5]
//!     [--dashboard deploy/grafana/nodelet-dashboard.json] [--out docs/images/dashboard.svg] [--token TOKEN]
//! ```
//!
//! `--url` is the read-only port (http) or the main port (https, with `--token`; the certificate is not
//! checked: loopback only).

mod render;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

struct Args {
    url: String,
    token: Option<String>,
    samples: usize,
    interval: Duration,
    dashboard: PathBuf,
    out: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        url: String::new(),
        token: std::env::var("NODELET_TOKEN").ok(),
        samples: 13,
        interval: Duration::from_secs(5),
        dashboard: PathBuf::from("deploy/grafana/nodelet-dashboard.json"),
        out: PathBuf::from("docs/images/dashboard.svg"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--token" => args.token = Some(value()?),
            "--samples" => args.samples = value()?.parse().context("--samples")?,
            "--interval" => args.interval = Duration::from_secs_f64(value()?.parse().context("--interval")?),
            "--dashboard" => args.dashboard = value()?.into(),
            "--out" => args.out = value()?.into(),
            other => bail!("unknown argument {other} (see the example's source for its usage)"),
        }
    }
    if args.url.is_empty() {
        bail!("--url is required (e.g. http://127.0.0.1:10255, nodelet's read-only port)");
    }
    if args.samples < 2 {
        bail!("--samples must be at least 2 (rates need two scrapes)");
    }
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&args.dashboard).context("reading the dashboard")?)
            .context("parsing the dashboard")?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()?;
    let instance = args.url.split("://").nth(1).unwrap_or(&args.url).trim_end_matches('/').to_owned();
    let start = Instant::now();
    let mut scrapes = Vec::new();
    for n in 0..args.samples {
        if n > 0 {
            tokio::time::sleep(args.interval).await;
        }
        let mut scrape = render::Scrape { t: start.elapsed().as_secs_f64(), samples: Vec::new() };
        for path in ["/metrics", "/metrics/resource"] {
            let mut request = client.get(format!("{}{path}", args.url.trim_end_matches('/')));
            if let Some(token) = &args.token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.with_context(|| format!("GET {path}"))?;
            if !response.status().is_success() {
                bail!("GET {path}: {}", response.status());
            }
            scrape.add_exposition(&response.text().await?, &render::target_labels(&instance, path));
        }
        eprintln!("scrape {}/{}: {} samples", n + 1, args.samples, scrape.samples.len());
        scrapes.push(scrape);
    }
    let panels = render::evaluate(&dashboard, &scrapes);
    let span = scrapes.last().map_or(0.0, |s| s.t);
    let caption = format!(
        "Rendered by examples/dashboard_render from {} scrapes of a running nodelet over {span:.0} s (not a Grafana screenshot)",
        scrapes.len()
    );
    render::render(&dashboard, &panels, &caption, &args.out).map_err(anyhow::Error::msg)?;
    for p in panels.iter().filter(|p| !p.notes.is_empty()) {
        eprintln!("panel {:?}: {}", p.title, p.notes.join("; "));
    }
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
