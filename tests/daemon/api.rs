//! What nodelet serves and prints: container logs (files, `nodelet logs`, `/containerLogs`) and
//! authentication on its ports.

use std::time::Duration;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::support::{Nodelet, TOKEN, env_or_skip, nodelet_cli, sleep_until_term, uid};

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
