//! Hostile manifests against the running daemon on the real containerd, through the manifest directory and
//! the HTTP source: an alias bomb, thousands of empty documents, nesting thousands deep, a file past the size
//! limit, binary junk, and hundreds of broken pods in one file. For each, the daemon stays up, its peak RSS
//! stays under [`PEAK_RSS_MIB`], the healthy pod is not touched, and the refusal names the problem (in the
//! HTTP answer, and as an `InvalidManifest` event naming the file and the limit); the events served stay
//! capped however many problems there are.

use std::time::Duration;

use serde_json::{Value, json};

use crate::hostile_clients::free_port;
use crate::support::{Nodelet, StartOptions, TOKEN, peak_rss_kib, runtime_env, sleep_until_term, uid};

/// nodelet's peak RSS (VmHWM) bound through the whole attack (a debug build idles at about 30 MiB).
const PEAK_RSS_MIB: u64 = 96;

/// A "billion laughs": ten levels of ten aliases each, 10^10 strings if expanded, in under 1 KiB.
fn alias_bomb(name: &str) -> String {
    let mut text = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n");
    text.push_str("  annotations:\n    a0: &a0 \"lol\"\n");
    for level in 1..10 {
        let prev = level - 1;
        let refs = vec![format!("*a{prev}"); 10].join(", ");
        text.push_str(&format!("    a{level}: &a{level} [{refs}]\n"));
    }
    text.push_str("spec:\n  containers: *a9\n");
    text
}

/// The events nodelet serves on its main port.
async fn events(n: &Nodelet) -> Vec<Value> {
    let response = n
        .main_client()
        .get(n.main_url("/api/v1/events"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET /api/v1/events: {e}"));
    assert!(response.status().is_success(), "GET /api/v1/events answered {}", response.status());
    let body = response.text().await.unwrap_or_else(|e| panic!("events: {e}"));
    let list: Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("events are not JSON ({e}): {body}"));
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Waits for an `InvalidManifest` event whose message contains every one of `words`.
async fn wait_problem(n: &Nodelet, what: &str, words: &[&str]) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let messages: Vec<String> = events(n)
            .await
            .into_iter()
            .filter(|e| e["reason"] == "InvalidManifest")
            .filter_map(|e| e["message"].as_str().map(str::to_owned))
            .collect();
        if let Some(m) = messages.iter().find(|m| words.iter().all(|w| m.contains(w))) {
            return m.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no InvalidManifest event for {what} with {words:?}; the events say: {messages:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_manifests_are_refused_by_name_within_bounded_memory_and_leave_healthy_pods_alone() {
    let Some(env) = runtime_env("hostile_manifests::hostile_manifests_are_refused") else { return };
    let http_port = free_port();
    let options = StartOptions {
        extra_args: vec!["--manifest-http-addr".to_owned(), format!("127.0.0.1:{http_port}")],
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "hostile-manifests", options).await;
    let steady = n.pod_manifest(
        "steady",
        json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
    );
    n.write_manifest("steady.yaml", &steady);
    let before = n.wait_running("steady").await;
    let pid = n.pid().unwrap_or_else(|| panic!("nodelet has no pid"));
    let dir = n.manifest_dir();

    // Through the manifest directory.
    n.write_manifest_text("bomb.yaml", &alias_bomb("bomb"));
    n.write_manifest_text("empty-documents.yaml", &"---\n".repeat(5000));
    // As JSON (it starts with `[`) and as YAML.
    n.write_manifest_text("deep.json", &format!("{}{}", "[".repeat(20_000), "]".repeat(20_000)));
    n.write_manifest_text("deep.yaml", &format!("a: {}{}", "[".repeat(20_000), "]".repeat(20_000)));
    n.write_manifest_text("huge.yaml", &format!("# {}\n", "x".repeat(9 * 1024 * 1024)));
    let junk: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    if let Err(e) = std::fs::write(dir.join("junk.yaml"), junk) {
        panic!("write junk.yaml: {e}");
    }
    // Hundreds of broken pods in one file: every one is a problem, the events stay capped.
    let broken: String = (0..600)
        .map(|i| format!("---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: broken-{i}\nspec:\n  containers:\n  - name: c\n"))
        .collect();
    n.write_manifest_text("many-broken.yaml", &broken);

    let path = |f: &str| dir.join(f).display().to_string();
    wait_problem(&n, "the alias bomb's refusal", &[&path("bomb.yaml"), "alias"]).await;
    wait_problem(&n, "the empty documents' refusal", &[&path("empty-documents.yaml"), "documents"]).await;
    wait_problem(&n, "the deep JSON's refusal", &[&path("deep.json"), "recursion limit"]).await;
    wait_problem(&n, "the deep YAML's refusal", &[&path("deep.yaml"), "nested more than"]).await;
    wait_problem(&n, "the huge file's refusal", &[&path("huge.yaml"), "larger than"]).await;
    wait_problem(&n, "the junk's refusal", &[&path("junk.yaml")]).await;
    wait_problem(&n, "a broken pod's refusal", &[&path("many-broken.yaml"), "spec.containers[0].image"])
        .await;
    wait_problem(
        &n,
        "the summary of the problems left out",
        &[&path("many-broken.yaml"), "and 580 more problems"],
    )
    .await;

    // Through the HTTP source: refused with a 4xx naming the limit, nothing applied.
    let http = reqwest::Client::builder().no_proxy().build().unwrap_or_else(|e| panic!("HTTP client: {e}"));
    let token = n.manifest_token();
    let post = |body: String| {
        http.post(format!("http://127.0.0.1:{http_port}/pods"))
            .bearer_auth(&token)
            .header("Content-Type", "application/yaml")
            .body(body)
            .send()
    };
    for (what, body, words) in [
        ("an alias bomb", alias_bomb("posted-bomb"), vec!["alias"]),
        ("5000 empty documents", "---\n".repeat(5000), vec!["documents"]),
        (
            "nesting 20000 deep",
            format!("a: {}{}", "[".repeat(20_000), "]".repeat(20_000)),
            vec!["nested more than"],
        ),
        ("a 9 MiB body", format!("# {}\n", "x".repeat(9 * 1024 * 1024)), vec![]),
    ] {
        let response = post(body).await.unwrap_or_else(|e| panic!("POST {what}: {e}"));
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        assert!(status.is_client_error(), "POST {what} answered {status}: {text}");
        for w in words {
            assert!(text.contains(w), "POST {what}: the answer does not say {w:?}: {text}");
        }
    }

    // Capped: 600 problems in one file do not become 600 events.
    let served = events(&n).await.into_iter().filter(|e| e["reason"] == "InvalidManifest").count();
    assert!(served <= 220, "{served} InvalidManifest events served: the problems are not capped");

    // Alive, within bounds, and the healthy pod untouched.
    let peak = peak_rss_kib(pid);
    eprintln!("peak RSS through the hostile manifests: {:.1} MiB", peak as f64 / 1024.0);
    assert!(
        peak < PEAK_RSS_MIB * 1024,
        "nodelet's peak RSS reached {} MiB (bound {PEAK_RSS_MIB})",
        peak / 1024
    );
    let after = n.wait_running("steady").await;
    assert_eq!(uid(&after), uid(&before));
    let restarts: i32 = after
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0);
    assert_eq!(restarts, 0, "the steady pod restarted during the attack");
    let names: Vec<String> = n.pods().await.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, vec![n.pod_name("steady")], "only the healthy pod runs");
    n.shutdown().await;
}

/// Issue 37, point 0: a quantity whose exponent sits at the limit of an `i64` once panicked the file source's
/// task (`attempt to negate with overflow`), and the supervisor stopped the node, again at every start while
/// the file was there. Planted next to a healthy pod on the real runtime: the node keeps running, the healthy
/// pod is untouched, and the bad document is a problem naming the file, the pod and the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quantity_at_the_i64_limit_is_refused_by_name_and_the_node_keeps_running() {
    let Some(env) = runtime_env("hostile_manifests::a_quantity_at_the_i64_limit") else { return };
    let mut n = Nodelet::start(&env, "quantity-limit").await;
    let steady = n.pod_manifest(
        "steady",
        json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
    );
    n.write_manifest("steady.yaml", &steady);
    let before = n.wait_running("steady").await;
    for (file, cpu) in
        [("negative-exponent.yaml", "1e-9223372036854775808"), ("exponent.yaml", "1e9223372036854775807")]
    {
        let name = file.trim_end_matches(".yaml");
        // A string, as JSON or quoted YAML writes it: the quantity parser reads it. (Unquoted YAML reads
        // `1e-9223372036854775808` as the float 0 and `1e9223372036854775807` as infinity, as go-yaml does.)
        let bad = n.pod_manifest(
            name,
            json!({"containers": [{"name": "app", "command": sleep_until_term(""), "resources": {"limits": {"cpu": cpu}}}]}),
        );
        n.write_manifest(file, &bad);
        let path = n.manifest_dir().join(file).display().to_string();
        let message = wait_problem(
            &n,
            file,
            &[&path, &format!("default/{name}"), "spec.containers[0].resources.limits[cpu]"],
        )
        .await;
        assert!(message.contains("too large"), "{file}: {message}");
    }
    // Read again after a restart too (the file is still there): the node starts and keeps running.
    n.stop().await;
    n.start_again().await;
    let path = n.manifest_dir().join("negative-exponent.yaml").display().to_string();
    wait_problem(&n, "the problem after a restart", &[&path, "too large"]).await;
    let after = n.wait_running("steady").await;
    assert_eq!(uid(&after), uid(&before), "the healthy pod is the same pod");
    assert!(n.exit_status().is_none(), "nodelet stopped: {}", n.log_tail(40));
    let names: Vec<String> = n.pods().await.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, vec![n.pod_name("steady")], "only the healthy pod runs");
    n.shutdown().await;
}
