//! What nodelet serves and prints: container logs (files, `nodelet logs`, `/containerLogs`),
//! authentication on its ports, `/runningpods/` and `/configz`, and its JSON log lines.

use std::time::Duration;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::support::{Nodelet, StartOptions, TOKEN, env_or_skip, nodelet_cli, sleep_until_term, uid};

#[tokio::test]
async fn container_logs_are_on_disk_in_cri_format_and_served_by_the_cli_and_the_main_port() {
    let env =
        env_or_skip!("container_logs_are_on_disk_in_cri_format_and_served_by_the_cli_and_the_main_port");
    let n = Nodelet::start(&env, "logs").await;
    n.write_manifest(
        "talker.yaml",
        &n.pod_manifest(
            "talker",
            json!({
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "app",
                    "command": sleep_until_term("for i in 1 2 3; do echo line-$i; done; echo to-stderr >&2; "),
                }],
            }),
        ),
    );
    let pod = n.wait_running("talker").await;
    let name = n.pod_name("talker");

    // <pod-logs-dir>/<namespace>_<pod>_<uid>/<container>/0.log, CRI format
    let path = n.logs_dir().join(format!("default_{name}_{}", uid(&pod))).join("app").join("0.log");
    let text = n
        .wait_for(&format!("4 lines in {}", path.display()), Duration::from_secs(10), async || {
            std::fs::read_to_string(&path).ok().filter(|t| t.lines().count() >= 4)
        })
        .await;
    let mut lines = Vec::new(); // (stream, content) in file order
    for line in text.lines() {
        let parts: Vec<&str> = line.splitn(4, ' ').collect();
        assert_eq!(parts.len(), 4, "CRI log line: {line:?}");
        assert!(parts[0].parse::<Timestamp>().is_ok(), "RFC 3339 timestamp: {line:?}");
        assert!(parts[0].contains('.') && parts[0].ends_with('Z'), "nanosecond UTC timestamp: {line:?}");
        assert_eq!(parts[2], "F", "a full line: {line:?}");
        lines.push((parts[1].to_owned(), parts[3].to_owned()));
    }
    let stdout: Vec<&str> = lines.iter().filter(|(s, _)| s == "stdout").map(|(_, l)| l.as_str()).collect();
    let stderr: Vec<&str> = lines.iter().filter(|(s, _)| s == "stderr").map(|(_, l)| l.as_str()).collect();
    assert_eq!(stdout, ["line-1", "line-2", "line-3"]);
    assert_eq!(stderr, ["to-stderr"]);
    let in_file_order: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();

    // nodelet logs POD --pod-logs-dir …
    let logs_dir = n.logs_dir().display().to_string();
    let out = nodelet_cli(&["logs", &name, "--pod-logs-dir", &logs_dir]).await;
    assert_eq!(out.lines().collect::<Vec<_>>(), in_file_order, "nodelet logs prints every line");
    let out = nodelet_cli(&["logs", &name, "-c", "app", "--tail", "1", "--pod-logs-dir", &logs_dir]).await;
    assert_eq!(out.lines().collect::<Vec<_>>(), in_file_order[3..], "--tail 1");

    // /containerLogs on the main port, with the token
    let https = n.main_client();
    let url = n.main_url(&format!("/containerLogs/default/{name}/app"));
    let response =
        https.get(&url).bearer_auth(TOKEN).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap_or_default();
    assert_eq!(body.lines().collect::<Vec<_>>(), in_file_order, "GET {url}");
    let response = https.get(format!("{url}?tailLines=2")).bearer_auth(TOKEN).send().await;
    let body =
        response.map(|r| (r.status().as_u16(), r)).unwrap_or_else(|e| panic!("GET {url}?tailLines=2: {e}"));
    assert_eq!(body.0, 200);
    assert_eq!(body.1.text().await.unwrap_or_default().lines().collect::<Vec<_>>(), in_file_order[2..]);
    // not without it, and not on the read-only port
    let anonymous = https.get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(anonymous.status(), 401, "logs need authentication");
    let read_only = format!("http://127.0.0.1:{}/containerLogs/default/{name}/app", n.ports().read_only);
    let response = n.http().get(&read_only).send().await.unwrap_or_else(|e| panic!("GET {read_only}: {e}"));
    assert_eq!(response.status(), 404, "the read-only port serves no logs");
    let missing =
        https.get(n.main_url(&format!("/containerLogs/default/{name}/nope"))).bearer_auth(TOKEN).send().await;
    assert_eq!(missing.map(|r| r.status().as_u16()).ok(), Some(404), "an unknown container");

    n.shutdown().await;
}

#[tokio::test]
async fn the_main_port_needs_the_token_and_the_read_only_and_healthz_ports_do_not() {
    let env = env_or_skip!("the_main_port_needs_the_token_and_the_read_only_and_healthz_ports_do_not");
    let n = Nodelet::start(&env, "auth").await;
    n.write_manifest(
        "auth.yaml",
        &n.pod_manifest(
            "auth",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    n.wait_running("auth").await;
    let name = n.pod_name("auth");
    let names =
        |list: &List<Pod>| list.items.iter().filter_map(|p| p.metadata.name.clone()).collect::<Vec<_>>();

    let https = n.main_client();
    let url = n.main_url("/pods");
    for (what, token) in [("no token", None), ("a wrong token", Some("not-the-token"))] {
        let mut request = https.get(&url);
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("GET {url} with {what}: {e}"));
        assert_eq!(response.status(), 401, "GET {url} with {what}");
        let body: serde_json::Value = response.json_body().await;
        assert_eq!((body["kind"].as_str(), body["code"].as_i64()), (Some("Status"), Some(401)), "{body}");
    }
    let response =
        https.get(&url).bearer_auth(TOKEN).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(response.status(), 200);
    let list: List<Pod> = response.json_body().await;
    assert_eq!(names(&list), vec![name.clone()], "the PodList on the main port");
    let metrics = https.get(n.main_url("/metrics")).bearer_auth(TOKEN).send().await;
    let metrics = match metrics {
        Ok(r) if r.status() == 200 => r.text().await.unwrap_or_default(),
        other => panic!("GET /metrics with the token: {other:?}"),
    };
    assert!(metrics.contains("kubelet_running_pods"), "metrics: {metrics}");

    // The read-only port: /pods without authentication.
    assert_eq!(names(&n.pods().await), vec![name], "the PodList on the read-only port");
    // /healthz on 127.0.0.1.
    let healthz = format!("http://127.0.0.1:{}/healthz", n.ports().healthz);
    let response = n.http().get(&healthz).send().await.unwrap_or_else(|e| panic!("GET {healthz}: {e}"));
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap_or_default(), "ok");
    // Plain HTTP on the main port does not get through.
    let plain = format!("http://127.0.0.1:{}/pods", n.ports().main);
    let response = n.http().get(&plain).send().await;
    assert!(
        response.as_ref().map_or(true, |r| r.status() != 200),
        "plain HTTP on the TLS port: {response:?}"
    );

    n.shutdown().await;
}

#[tokio::test]
async fn running_pods_and_configz_are_served_on_the_main_port_only() {
    let env = env_or_skip!("running_pods_and_configz_are_served_on_the_main_port_only");
    let n = Nodelet::start_with(
        &env,
        "runpods",
        StartOptions {
            config_extra: "containerLogMaxFiles: 3\n".into(),
            extra_args: vec!["--sync-frequency".into(), "45s".into()],
            ..StartOptions::default()
        },
    )
    .await;
    n.write_manifest(
        "rp.yaml",
        &n.pod_manifest(
            "rp",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    let pod = n.wait_running("rp").await;
    let name = n.pod_name("rp");
    let https = n.main_client();
    let get = async |path: &str, token: Option<&str>| {
        let url = n.main_url(path);
        let mut request = https.get(&url);
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        request.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
    };

    // /runningpods/: the runtime's view, name, namespace, uid and the running containers.
    let listed = n
        .wait_for("the pod on /runningpods/", Duration::from_secs(10), async || {
            let response = get("/runningpods/", Some(TOKEN)).await;
            assert_eq!(response.status(), 200);
            let list: List<Pod> = response.json_body().await;
            list.items.into_iter().find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
        })
        .await;
    assert_eq!(listed.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(listed.metadata.uid, Some(uid(&pod)), "the runtime's pod UID");
    let containers: Vec<(String, Option<String>)> = listed
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c.name.clone(), c.image.clone()))
        .collect();
    assert_eq!(containers, vec![("app".to_owned(), Some(env.busybox.clone()))]);
    assert!(listed.status.is_none(), "no status: only what the runtime knows");
    let same = get("/runningpods", Some(TOKEN)).await;
    assert_eq!(same.status(), 200, "with and without the trailing slash");
    assert_eq!(
        get("/runningpods/", None).await.status(),
        401,
        "authenticated like the other main-port paths"
    );

    // /configz: the effective configuration with a flag and a file field.
    let response = get("/configz", Some(TOKEN)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let configz: serde_json::Value = response.json_body().await;
    let k = &configz["kubeletconfig"];
    assert_eq!(k["syncFrequency"], "45s", "the flag --sync-frequency: {k}");
    assert_eq!(k["containerLogMaxFiles"], 3, "the file's containerLogMaxFiles: {k}");
    assert_eq!(k["port"], n.ports().main, "{k}");
    assert_eq!(k["fileCheckFrequency"], "20s", "a default: {k}");
    assert_eq!(get("/configz", None).await.status(), 401);

    // Neither is on the read-only port.
    for path in ["/runningpods/", "/configz"] {
        let url = format!("http://127.0.0.1:{}{path}", n.ports().read_only);
        let response = n.http().get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(response.status(), 404, "{url}");
    }
    // Issue 37: nor are nodelet's own object lists (the read-only port serves the kubelet's set only); the
    // main port serves them, with authentication.
    let this_node = format!("/api/v1/nodes/{}", n.node());
    for path in [
        "/api/v1/events",
        "/api/v1/nodes",
        this_node.as_str(),
        "/api/v1/persistentvolumes",
        "/api/v1/persistentvolumeclaims",
        "/apis/storage.k8s.io/v1/storageclasses",
        "/apis/storage.k8s.io/v1/csinodes",
    ] {
        let url = format!("http://127.0.0.1:{}{path}", n.ports().read_only);
        let response = n.http().get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(response.status(), 404, "{url} on the read-only port");
        assert_eq!(get(path, None).await.status(), 401, "{path} on the main port without the token");
        assert_eq!(get(path, Some(TOKEN)).await.status(), 200, "{path} on the main port with the token");
    }

    // Once the runtime no longer runs it, it is gone from the list.
    n.remove_manifest("rp.yaml");
    n.wait_for("the pod gone from /runningpods/", Duration::from_secs(30), async || {
        let list: List<Pod> = get("/runningpods/", Some(TOKEN)).await.json_body().await;
        (!list.items.iter().any(|p| p.metadata.name.as_deref() == Some(name.as_str()))).then_some(())
    })
    .await;
    n.shutdown().await;
}

#[tokio::test]
async fn with_logging_format_json_every_log_line_is_a_kubelet_json_line() {
    let env = env_or_skip!("with_logging_format_json_every_log_line_is_a_kubelet_json_line");
    let n = Nodelet::start_with(
        &env,
        "jsonlog",
        StartOptions {
            extra_args: vec!["--logging-format".into(), "json".into()],
            ..StartOptions::default()
        },
    )
    .await;
    n.write_manifest(
        "jl.yaml",
        &n.pod_manifest(
            "jl",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    n.wait_running("jl").await;
    let log = n.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\n{log}")))
        .collect();
    assert!(lines.len() > 3, "{log}");
    for line in &lines {
        assert!(line["ts"].as_f64().is_some_and(|t| t > 1.6e9), "ts in seconds: {line}");
        assert!(line["caller"].as_str().is_some_and(|c| c.contains(".rs:")), "caller: {line}");
        assert!(line["msg"].is_string(), "msg: {line}");
        if let Some(v) = line.get("v") {
            assert!([0, 4, 6].contains(&v.as_i64().unwrap_or(-1)), "v: {line}");
        }
        assert!(line.get("message").is_none() && line.get("fields").is_none(), "flattened: {line}");
    }
    let start = lines.iter().find(|l| l["msg"] == "starting nodelet").unwrap_or_else(|| panic!("{log}"));
    assert_eq!(start["v"], 0, "an info line: {start}");
    assert_eq!(start["node"], n.node(), "fields are top-level keys: {start}");
    assert!(lines.iter().any(|l| l["v"] == 4), "-v 2 shows nodelet's debug lines with v=4: {log}");
    n.shutdown().await;

    // Another format is refused before anything starts.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["--logging-format", "xml", "--hostname-override", "x"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run nodelet: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--logging-format") && stderr.contains("\"json\", \"text\""), "{stderr}");
}

/// `response.json_body::<T>()`: the body decoded as JSON (reqwest's `json` feature is not enabled).
trait JsonBody {
    async fn json_body<T: serde::de::DeserializeOwned>(self) -> T;
}

impl JsonBody for reqwest::Response {
    async fn json_body<T: serde::de::DeserializeOwned>(self) -> T {
        let url = self.url().clone();
        let bytes = self.bytes().await.unwrap_or_else(|e| panic!("reading {url}: {e}"));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{url}: not the expected JSON: {e}: {}", String::from_utf8_lossy(&bytes))
        })
    }
}
