//! The operator files in `deploy/`: the systemd unit and `install.sh`, the Prometheus scrape config and
//! alert rules, the Grafana dashboard, each checked with the tool that consumes it (`systemd-analyze verify`,
//! `shellcheck`, `promtool`, a JSON schema of the dashboard model), and every metric the dashboard and the
//! alerts query checked against what a real nodelet (cluster mode, a pod with a volume) exports.
//!
//! The tools come from `scripts/install-deps.sh`; a missing one skips its test with a note, unless
//! `NODELET_REQUIRE_RUNTIME=1`, then the test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use promql_parser::parser::Expr;
use serde_json::{Value, json};

use crate::cluster_support::{ClusterNode, cluster_or_skip};
use crate::deploy::render::Scrape;
use crate::support::{StartOptions, env_or_skip, node_name};

/// The dashboard renderer of `examples/dashboard_render` (docs/images/dashboard.svg), tested here on real data.
#[path = "../../examples/dashboard_render/render.rs"]
mod render;

// ------------------------------------------------------------------------------------------------ helpers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy(path: &str) -> PathBuf {
    repo().join("deploy").join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nodelet-deploy-")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"))
}

/// `tool` on `$PATH`.
fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|p| p.is_file())
}

/// `tool` for `test`; `None` (after a skip note) when it is missing, unless `NODELET_REQUIRE_RUNTIME=1`.
fn tool(tool: &str, test: &str) -> Option<PathBuf> {
    if let Some(path) = which(tool) {
        return Some(path);
    }
    if std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1") {
        panic!("NODELET_REQUIRE_RUNTIME=1 but {tool} is not installed: run scripts/install-deps.sh");
    }
    eprintln!("SKIP {test}: {tool} is not installed (scripts/install-deps.sh installs it)");
    None
}

/// `let path = tool_or_skip!("promtool", "test name");`
macro_rules! tool_or_skip {
    ($tool:expr, $test:expr) => {
        match tool($tool, $test) {
            Some(path) => path,
            None => return,
        }
    };
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn mode(path: &Path) -> u32 {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    meta.permissions().mode() & 0o7777
}

/// Whether two files have the same content (read in chunks: the debug binary is large).
fn same_content(a: &Path, b: &Path) -> bool {
    let open = |p: &Path| std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let (mut fa, mut fb) = (open(a), open(b));
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
        let mut nb = 0;
        while nb < na {
            match fb.read(&mut bb[nb..na]) {
                Ok(0) => return false,
                Ok(n) => nb += n,
                Err(e) => panic!("{}: {e}", b.display()),
            }
        }
        if ba[..na] != bb[..na] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

/// Where `install.sh` puts things under a temporary root `root` with `--prefix`, `--sysconfdir`, `--unitdir`.
struct Layout {
    root: tempfile::TempDir,
}

impl Layout {
    fn new() -> Layout {
        Layout { root: tempdir() }
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }
    fn binary(&self) -> PathBuf {
        self.path("usr/local/bin/nodelet")
    }
    fn unit(&self) -> PathBuf {
        self.path("etc/systemd/system/nodelet.service")
    }
    fn config(&self) -> PathBuf {
        self.path("etc/nodelet/kubelet-config.yaml")
    }
    fn env_file(&self) -> PathBuf {
        self.path("etc/default/nodelet")
    }
    /// Runs `install.sh --no-start` into this layout (plus `extra` arguments).
    fn install(&self, extra: &[&str]) -> Output {
        let [prefix, sysconf, unitdir] =
            ["usr/local", "etc", "etc/systemd/system"].map(|p| self.path(p).display().to_string());
        let mut args = vec!["--binary", env!("CARGO_BIN_EXE_nodelet"), "--prefix", &prefix];
        args.extend(["--sysconfdir", &sysconf, "--unitdir", &unitdir]);
        args.extend(extra);
        run(&deploy("install.sh"), &args)
    }
    fn install_ok(&self) -> String {
        let out = self.install(&["--no-start"]);
        assert!(out.status.success(), "install.sh failed: {}", text(&out));
        text(&out)
    }
}

// ------------------------------------------------------------------------------------------------ (a) unit

#[test]
fn the_installed_unit_passes_systemd_analyze_verify() {
    let analyze = tool_or_skip!("systemd-analyze", "the_installed_unit_passes_systemd_analyze_verify");
    // Installed with --prefix/--sysconfdir/--unitdir under a temporary root (not --destdir): verify
    // checks that ExecStart's binary exists and is executable at the path the unit names, so the unit
    // must name the temporary binary (a --destdir unit names /usr/local/bin/nodelet; the install test
    // checks that one).
    let layout = Layout::new();
    layout.install_ok();
    let unit = layout.unit();
    let out = run(&analyze, &["verify", &unit.display().to_string()]);
    assert!(out.status.success(), "systemd-analyze verify {}: {}", unit.display(), text(&out));
    assert_eq!(text(&out), "", "systemd-analyze verify warns about the unit");

    // The kubelet's conventions (kubeadm's kubelet.service and 10-kubeadm.conf) and containerd's.
    let text_of_unit = read(&unit);
    for line in [
        "Restart=always",
        "RestartSec=10",
        "StartLimitIntervalSec=0",
        "Delegate=yes",
        "KillMode=process",
        "WantedBy=multi-user.target",
        "After=network-online.target",
    ] {
        assert!(text_of_unit.lines().any(|l| l == line), "the unit lacks {line}:\n{text_of_unit}");
    }

    // verify really checks: the same unit with a binary that does not exist, or a misspelt directive, fails.
    let broken = layout.path("broken.service");
    let missing = layout.path("no/such/nodelet");
    write(
        &broken,
        &text_of_unit.replace(&layout.binary().display().to_string(), &missing.display().to_string()),
    );
    let out = run(&analyze, &["verify", &broken.display().to_string()]);
    assert!(!out.status.success(), "verify accepted a missing ExecStart binary: {}", text(&out));
    write(&broken, &text_of_unit.replace("Restart=always", "Restart=alwayz"));
    let out = run(&analyze, &["verify", &broken.display().to_string()]);
    assert!(text(&out).contains("alwayz"), "verify did not flag Restart=alwayz: {}", text(&out));
}

// ------------------------------------------------------------------------------------------------ (b) install.sh

#[test]
fn install_script_puts_binary_unit_and_config_in_place_and_keeps_an_edited_config() {
    let layout = Layout::new();
    let first = layout.install_ok();
    let (bin, unit, config, env_file) = (layout.binary(), layout.unit(), layout.config(), layout.env_file());
    for path in [&bin, &unit, &config, &env_file] {
        assert!(first.contains(&format!("installed: {}", path.display())), "{first}");
    }
    assert!(first.contains("not started"), "{first}");
    assert!(same_content(&bin, Path::new(env!("CARGO_BIN_EXE_nodelet"))), "the installed binary differs");
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(mode(&unit), 0o644);
    assert_eq!(mode(&config), 0o644);
    assert!(layout.path("etc/nodelet/manifests").is_dir(), "no static pod directory");

    // The unit and the config name the installed paths.
    let unit_text = read(&unit);
    let exec = format!("ExecStart={} --config {} $NODELET_EXTRA_ARGS", bin.display(), config.display());
    assert!(unit_text.lines().any(|l| l == exec), "no {exec:?} in the unit:\n{unit_text}");
    let env_line = format!("EnvironmentFile=-{}", env_file.display());
    assert!(unit_text.lines().any(|l| l == env_line), "no {env_line:?} in the unit:\n{unit_text}");
    let config_text = read(&config);
    let parsed: Value = serde_saphyr::from_str(&config_text).unwrap_or_else(|e| panic!("config: {e}"));
    assert_eq!(parsed["kind"], "KubeletConfiguration");
    assert_eq!(parsed["apiVersion"], "kubelet.config.k8s.io/v1beta1");
    let manifests = layout.path("etc/nodelet/manifests").display().to_string();
    assert_eq!(parsed["staticPodPath"], manifests.as_str(), "{config_text}");
    assert!(read(&env_file).contains("NODELET_EXTRA_ARGS="), "{}", read(&env_file));

    // Idempotent: nothing changes on a second run.
    let second = layout.install_ok();
    for path in [&bin, &unit, &config, &env_file] {
        assert!(second.contains(&format!("unchanged: {}", path.display())), "{second}");
    }

    // An edited config (and environment file) is never overwritten; the new default goes next to it.
    let edited = format!("{config_text}maxPods: 42\n");
    write(&config, &edited);
    write(&env_file, "NODELET_EXTRA_ARGS=\"--v=4\"\n");
    let third = layout.install_ok();
    assert!(third.contains(&format!("kept: {}", config.display())), "{third}");
    assert_eq!(read(&config), edited, "install.sh overwrote an edited config");
    assert_eq!(read(&env_file), "NODELET_EXTRA_ARGS=\"--v=4\"\n");
    let default = PathBuf::from(format!("{}.default", config.display()));
    assert_eq!(read(&default), config_text, "the new default next to the edited config");

    // The unit is the script's: an outdated one is replaced.
    write(&unit, "[Unit]\nDescription=old\n");
    let fourth = layout.install_ok();
    assert!(fourth.contains(&format!("installed: {}", unit.display())), "{fourth}");
    assert_eq!(read(&unit), unit_text);

    // --destdir stages under a root with the final paths inside the files, and starts nothing.
    let stage = tempdir();
    let out = run(
        &deploy("install.sh"),
        &["--binary", env!("CARGO_BIN_EXE_nodelet"), "--destdir", &stage.path().display().to_string()],
    );
    assert!(out.status.success(), "install.sh --destdir: {}", text(&out));
    assert!(text(&out).contains("not started"), "{}", text(&out));
    assert!(stage.path().join("usr/local/bin/nodelet").is_file());
    let staged_unit = read(&stage.path().join("etc/systemd/system/nodelet.service"));
    let final_unit = read(&deploy("nodelet.service"))
        .replace("ExecStart=/usr/bin/nodelet", "ExecStart=/usr/local/bin/nodelet");
    assert_eq!(staged_unit, final_unit, "the staged unit names the final paths");
    let staged_config = read(&stage.path().join("etc/nodelet/kubelet-config.yaml"));
    assert_eq!(staged_config, read(&deploy("config/kubelet-config.yaml")));

    // Refusals: no binary, a relative path; and no start without systemd (never tried on a systemd host).
    let out = run(&deploy("install.sh"), &["--binary", "/no/such/nodelet", "--destdir", "/tmp/unused"]);
    assert!(!out.status.success() && text(&out).contains("not an executable file"), "{}", text(&out));
    // A package installs its own paths: --deb with a binary or a staging root is refused, and a missing package
    // is named (before anything is installed).
    let out = run(&deploy("install.sh"), &["--deb", "/no/such/nodelet.deb", "--destdir", "/tmp/unused"]);
    assert!(!out.status.success() && text(&out).contains("cannot be combined"), "{}", text(&out));
    let out = run(&deploy("install.sh"), &["--deb", "/no/such/nodelet.deb"]);
    assert!(!out.status.success() && text(&out).contains("no such package"), "{}", text(&out));
    let out = layout.install(&["--no-start", "--prefix", "usr"]);
    assert!(!out.status.success() && text(&out).contains("not an absolute path"), "{}", text(&out));
    if !Path::new("/run/systemd/system").exists() {
        let fresh = Layout::new();
        let out = fresh.install(&[]);
        assert!(!out.status.success() && text(&out).contains("systemd is not running"), "{}", text(&out));
        assert!(!fresh.binary().exists(), "install.sh wrote files before refusing");
    }
}

#[test]
fn install_script_is_shellcheck_clean() {
    let shellcheck = tool_or_skip!("shellcheck", "install_script_is_shellcheck_clean");
    let out = run(&shellcheck, &[&deploy("install.sh").display().to_string()]);
    assert!(out.status.success(), "shellcheck deploy/install.sh:\n{}", text(&out));
}

/// The config `install.sh` installs starts nodelet as it is (only the host's paths and ports are overridden
/// by flags): no file it names is missing, and the main port refuses anonymous requests.
#[tokio::test]
async fn the_installed_config_starts_nodelet() {
    let env = env_or_skip!("the_installed_config_starts_nodelet");
    let layout = Layout::new();
    layout.install_ok();
    for dir in ["run/root", "run/logs"] {
        std::fs::create_dir_all(layout.path(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
    }
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap_or_else(|e| panic!("no free port: {e}"))
        })
        .collect();
    let log = layout.path("nodelet.log");
    let log_file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}"));
    let log_err = log_file.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let (root, logs) = (layout.path("run/root"), layout.path("run/logs"));
    let mut child = Command::new(layout.binary())
        .args(["--config", &layout.config().display().to_string()])
        .args(["--root-dir", &root.display().to_string(), "--pod-logs-dir", &logs.display().to_string()])
        .args(["--container-runtime-endpoint", &env.endpoint, "--address", "127.0.0.1"])
        .args(["--port", &ports[0].to_string(), "--healthz-port", &ports[1].to_string()])
        .args(["--read-only-port", &ports[2].to_string(), "--hostname-override", &node_name("installed")])
        .args(["--cgroup-root", &env.cgroup_parent, "--resolv-conf", &env.resolv_conf])
        // the shared test runtime: no disk-pressure eviction or image garbage collection
        .args(["--eviction-hard", "memory.available<100Mi", "--image-gc-high-threshold", "100"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the installed nodelet: {e}"));
    let http = reqwest::Client::builder()
        .no_proxy()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut healthy = false;
    for _ in 0..100 {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the installed nodelet exited ({status}):\n{}", read(&log));
        }
        let url = format!("http://127.0.0.1:{}/healthz", ports[1]);
        if http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused =
        http.get(format!("https://127.0.0.1:{}/pods", ports[0])).send().await.map(|r| r.status().as_u16());
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    assert!(healthy, "the installed nodelet never answered /healthz:\n{}", read(&log));
    assert_eq!(refused.ok(), Some(401), "the main port must refuse anonymous requests:\n{}", read(&log));
}

// ------------------------------------------------------------------------------------------------ (c) Prometheus

#[test]
fn prometheus_config_and_alert_rules_pass_promtool() {
    let promtool = tool_or_skip!("promtool", "prometheus_config_and_alert_rules_pass_promtool");
    // promtool checks that the credential files the config names exist: stand-ins next to a copy.
    let dir = tempdir();
    for file in ["prometheus.yml", "nodelet-alerts.yml", "nodelet-alerts.test.yml"] {
        let to = dir.path().join(file);
        std::fs::copy(deploy("prometheus").join(file), &to).unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
    std::fs::create_dir_all(dir.path().join("nodelet")).unwrap_or_else(|e| panic!("{e}"));
    write(&dir.path().join("nodelet/token"), "token\n");
    write(&dir.path().join("nodelet/ca.crt"), "");
    let at = |f: &str| dir.path().join(f).display().to_string();

    let out = run(&promtool, &["check", "config", &at("prometheus.yml")]);
    assert!(out.status.success(), "promtool check config: {}", text(&out));
    assert!(text(&out).contains("1 rule files found"), "the config loads the alert rules: {}", text(&out));
    let out = run(&promtool, &["check", "rules", &at("nodelet-alerts.yml")]);
    assert!(out.status.success(), "promtool check rules: {}", text(&out));
    let out = run(&promtool, &["test", "rules", &at("nodelet-alerts.test.yml")]);
    assert!(out.status.success(), "promtool test rules: {}", text(&out));
    assert!(text(&out).contains("SUCCESS"), "{}", text(&out));

    // Every alert has a unit test in which it fires, and the tests name only alerts that exist.
    let rules = alert_rules();
    let tests: Value = serde_saphyr::from_str(&read(&deploy("prometheus/nodelet-alerts.test.yml")))
        .unwrap_or_else(|e| panic!("nodelet-alerts.test.yml: {e}"));
    let mut fired = BTreeSet::new();
    for test in tests["tests"].as_array().into_iter().flatten() {
        for check in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = check["alertname"].as_str().unwrap_or_default().to_owned();
            assert!(rules.contains_key(&name), "the tests check {name:?}, which is not an alert");
            if check["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fired.insert(name);
            }
        }
    }
    let untested: Vec<_> = rules.keys().filter(|a| !fired.contains(*a)).collect();
    assert!(untested.is_empty(), "alerts never seen firing in nodelet-alerts.test.yml: {untested:?}");
}

/// Alert name → its expressions (one name can have several rules: warning and critical).
fn alert_rules() -> BTreeMap<String, Vec<String>> {
    let rules: Value = serde_saphyr::from_str(&read(&deploy("prometheus/nodelet-alerts.yml")))
        .unwrap_or_else(|e| panic!("nodelet-alerts.yml: {e}"));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for group in rules["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let (Some(name), Some(expr)) = (rule["alert"].as_str(), rule["expr"].as_str()) else {
                panic!("a rule without alert or expr: {rule}");
            };
            out.entry(name.to_owned()).or_default().push(expr.to_owned());
        }
    }
    assert!(!out.is_empty(), "no alert rules");
    out
}

// ------------------------------------------------------------------------------------------------ (d) Grafana

fn dashboard() -> Value {
    serde_json::from_str(&read(&deploy("grafana/nodelet-dashboard.json")))
        .unwrap_or_else(|e| panic!("nodelet-dashboard.json: {e}"))
}

fn schema_errors(schema: &Value, instance: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("bad schema: {e}"));
    validator.iter_errors(instance).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// Every PromQL expression of the dashboard: panel targets and the query of each query variable (the
/// selector of `label_values(<selector>, <label>)`), with the template variables replaced as Grafana
/// does with "All" selected.
fn dashboard_queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in d["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            out.push((format!("panel {title:?} {}", target["refId"]), substitute(expr)));
        }
    }
    for var in d["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] == "query" {
            let q = var["query"]["query"].as_str().or(var["query"].as_str()).unwrap_or_default();
            let inner = q.strip_prefix("label_values(").and_then(|r| r.rsplit_once(',')).map(|(sel, _)| sel);
            let Some(selector) = inner else { panic!("variable {}: not label_values(): {q}", var["name"]) };
            out.push((format!("variable {}", var["name"]), substitute(selector)));
        }
    }
    out
}

fn substitute(expr: &str) -> String {
    expr.replace("$instance", ".*").replace("$__rate_interval", "5m")
}

/// The metric names an expression selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    fn walk(e: &Expr, out: &mut BTreeSet<String>) {
        match e {
            Expr::Aggregate(a) => {
                walk(&a.expr, out);
                if let Some(p) = &a.param {
                    walk(p, out);
                }
            }
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Subquery(s) => walk(&s.expr, out),
            Expr::VectorSelector(v) => selector(v, out),
            Expr::MatrixSelector(m) => selector(&m.vs, out),
            Expr::Call(c) => c.args.args.iter().for_each(|a| walk(a, out)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }
    fn selector(v: &promql_parser::parser::VectorSelector, out: &mut BTreeSet<String>) {
        match &v.name {
            Some(name) => {
                out.insert(name.clone());
            }
            None => panic!("a selector without a metric name: {v}"),
        }
    }
    let parsed = promql_parser::parser::parse(expr).unwrap_or_else(|e| panic!("not PromQL: {expr}: {e}"));
    let mut out = BTreeSet::new();
    walk(&parsed, &mut out);
    out
}

#[test]
fn grafana_dashboard_matches_the_schema_and_lays_out_its_panels() {
    let schema: Value = serde_json::from_str(&read(&deploy("grafana/dashboard.schema.json")))
        .unwrap_or_else(|e| panic!("dashboard.schema.json: {e}"));
    let d = dashboard();
    let errors = schema_errors(&schema, &d);
    assert!(errors.is_empty(), "the dashboard does not match the schema:\n{}", errors.join("\n"));

    // The schema is not vacuous: typical mistakes are refused.
    let mut bad = d.clone();
    if let Some(p) = bad["panels"][1].as_object_mut() {
        let pos = p.remove("gridPos").unwrap_or_default();
        p.insert("gridpos".into(), pos);
    }
    assert!(!schema_errors(&schema, &bad).is_empty(), "a misspelt gridPos passed the schema");
    let mut bad = d.clone();
    bad["panels"][1]["gridPos"]["w"] = json!(25);
    assert!(!schema_errors(&schema, &bad).is_empty(), "a panel wider than the grid passed the schema");
    let mut bad = d.clone();
    bad["panels"][1]["targets"] = json!([]);
    assert!(!schema_errors(&schema, &bad).is_empty(), "a panel without a query passed the schema");

    // What the schema cannot say: unique ids, refIds unique per panel, no two panels on the same cells.
    let panels = d["panels"].as_array().cloned().unwrap_or_default();
    let ids: BTreeSet<_> = panels.iter().map(|p| p["id"].as_i64().unwrap_or(-1)).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids repeat");
    let mut cells = BTreeMap::new();
    for p in &panels {
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap_or(0));
        assert!(x + w <= 24, "panel {} sticks out of the 24 columns", p["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), p["title"].clone()) {
                    panic!("panels {other} and {} overlap at ({cx}, {cy})", p["title"]);
                }
            }
        }
        let refs: Vec<String> =
            p["targets"].as_array().into_iter().flatten().map(|t| t["refId"].to_string()).collect();
        assert_eq!(refs.iter().collect::<BTreeSet<_>>().len(), refs.len(), "refIds repeat in {}", p["title"]);
    }
    // Every query parses as PromQL and selects nodelet's job.
    for (place, expr) in dashboard_queries(&d) {
        assert!(!metric_names(&expr).is_empty(), "{place}: selects no metric: {expr}");
        assert!(expr.contains("job=\"nodelet\""), "{place}: not restricted to job=\"nodelet\": {expr}");
    }
}

// ------------------------------------------------------------------------------------------------ (e) metrics

/// Sample names of a Prometheus text exposition.
fn exposed_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Metrics Prometheus makes itself for each target; nodelet does not export them.
const SYNTHETIC: &[&str] = &["up"];

#[tokio::test]
async fn every_metric_of_the_dashboard_and_the_alerts_is_exported() {
    let (env, cluster) = cluster_or_skip!("every_metric_of_the_dashboard_and_the_alerts_is_exported");
    let mut wanted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (place, expr) in dashboard_queries(&dashboard()) {
        for name in metric_names(&expr) {
            wanted.entry(name).or_default().push(place.clone());
        }
    }
    for (alert, exprs) in alert_rules() {
        for expr in exprs {
            for name in metric_names(&expr) {
                wanted.entry(name).or_default().push(format!("alert {alert}"));
            }
        }
    }
    for name in SYNTHETIC {
        wanted.remove(*name);
    }

    // Cluster mode (the certificate manager's metrics) with a pod that has a volume (storage operations).
    // The PLEG relists every second, as without the runtime's events, so that the three scrapes below,
    // a second apart, see relists to draw its panel from (with events it relists once a minute).
    let options =
        StartOptions { nodelet_extra: "plegEventedRelistPeriod: 1s".to_owned(), ..StartOptions::default() };
    let n = ClusterNode::start_with(&env, &cluster, "deploy", options).await;
    n.write_manifest(
        "metrics.yaml",
        &n.pod_manifest(
            "metrics",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{
                    "name": "main",
                    "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
            }),
        ),
    );
    n.wait_running("metrics").await;
    let base = format!("http://127.0.0.1:{}", n.ports().read_only);
    // Some families appear a little later (volume stats, certificate TTLs): poll for a while.
    let mut missing = Vec::new();
    for _ in 0..60 {
        let mut exposed = BTreeSet::new();
        for path in ["/metrics", "/metrics/resource"] {
            let body = match n.http().get(format!("{base}{path}")).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => panic!("GET {base}{path}: {e}"),
            };
            exposed.extend(exposed_names(&body));
        }
        missing = wanted
            .iter()
            .filter(|(name, _)| !exposed.contains(*name))
            .map(|(name, places)| format!("{name} (used by {})", places.join(", ")))
            .collect();
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(missing.is_empty(), "queried but not exported:\n{}\n{}", missing.join("\n"), n.tail());

    // The renderer of docs/images/dashboard.svg draws every panel from these metrics.
    let mut scrapes = Vec::new();
    let start = std::time::Instant::now();
    let instance = format!("127.0.0.1:{}", n.ports().read_only);
    for _ in 0..3 {
        let mut scrape = Scrape { t: start.elapsed().as_secs_f64(), samples: Vec::new() };
        for path in ["/metrics", "/metrics/resource"] {
            let target = render::target_labels(&instance, path);
            match n.http().get(format!("{base}{path}")).send().await {
                Ok(r) => scrape.add_exposition(&r.text().await.unwrap_or_default(), &target),
                Err(e) => panic!("GET {base}{path}: {e}"),
            }
        }
        scrapes.push(scrape);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let d = dashboard();
    let panels = render::evaluate(&d, &scrapes);
    for p in &panels {
        assert!(p.notes.is_empty(), "the renderer cannot draw panel {:?}: {:?}", p.title, p.notes);
    }
    let drawn =
        |title: &str| panels.iter().find(|p| p.title == title).map(|p| p.series.clone()).unwrap_or_default();
    let running = drawn("Running pods");
    assert!(running.iter().any(|s| s.points.last().is_some_and(|p| p.1 >= 1.0)), "Running pods: {running:?}");
    let ops = drawn("Container runtime operations");
    assert!(ops.iter().any(|s| s.points.iter().any(|p| p.1 > 0.0)), "runtime operation rates: {ops:?}");
    let pleg = drawn("PLEG relist duration");
    assert!(pleg.iter().any(|s| s.points.iter().any(|p| p.1 > 0.0)), "PLEG quantiles: {pleg:?}");
    let out = tempdir();
    let svg = out.path().join("dashboard.svg");
    render::render(&d, &panels, "test", &svg).unwrap_or_else(|e| panic!("render: {e}"));
    let svg_text = read(&svg);
    for p in &panels {
        assert!(svg_text.contains(&p.title), "panel {:?} is not in the SVG", p.title);
    }
    n.remove_manifest("metrics.yaml");
    n.shutdown().await;
}
