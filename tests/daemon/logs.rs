//! Container logs on disk: rotation by size (`containerLogMaxSize`, `containerLogMaxFiles`, checked every
//! `containerLogMonitorInterval`) under a chatty container, against the real containerd (`ReopenContainerLog`).

use std::io::Read as _;
use std::time::Duration;

use serde_json::json;

use crate::support::{Nodelet, StartOptions, TOKEN, env_or_skip, uid};

/// The numbers (`line N`) in the CRI log text `text`, in order.
fn numbers(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .filter_map(|m| m.strip_prefix("line "))
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

#[tokio::test]
async fn a_chatty_containers_log_is_rotated_compressed_and_bounded_without_losing_lines() {
    let env = env_or_skip!("a_chatty_containers_log_is_rotated_compressed_and_bounded_without_losing_lines");
    let options = StartOptions {
        config_extra: "containerLogMaxSize: 64Ki\ncontainerLogMaxFiles: 4\ncontainerLogMonitorInterval: 3s\n"
            .to_owned(),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "logrotate", options).await;
    // About 50 KiB a second of numbered lines (with the CRI prefix).
    let script = "i=0; while true; do i=$((i+1)); echo \"line $i\"; \
                  if [ $((i % 100)) -eq 0 ]; then sleep 0.1; fi; done";
    n.write_manifest(
        "chatty.yaml",
        &n.pod_manifest(
            "chatty",
            json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "command": ["sh", "-c", script]}]}),
        ),
    );
    let pod = n.wait_running("chatty").await;
    let dir = n.logs_dir().join(format!("default_{}_{}", n.pod_name("chatty"), uid(&pod))).join("main");
    let files = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    // Wait until there was a rotation with compression: a .gz file beside a plain rotated one (with 4
    // files: the current one, the newest rotated one as it is, the older ones compressed).
    n.wait_for("a compressed rotated log", Duration::from_secs(60), async || {
        let f = files();
        (f.iter().any(|f| f.ends_with(".gz")) && f.iter().filter(|f| f.starts_with("0.log.")).count() >= 2)
            .then_some(())
    })
    .await;
    // Let it go on for a few more rotations: the number of files stays bounded.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let listed = files();
    assert!(listed.len() <= 4, "containerLogMaxFiles 4: {listed:?}");
    assert!(listed.contains(&"0.log".to_owned()), "{listed:?}");
    // The files, oldest first, hold one unbroken run of numbers: no line lost or repeated across them.
    let mut all = Vec::new();
    for name in &listed {
        let path = dir.join(name);
        let mut text = String::new();
        if name.ends_with(".gz") {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            flate2::read::GzDecoder::new(file)
                .read_to_string(&mut text)
                .unwrap_or_else(|e| panic!("gunzip {}: {e}", path.display()));
        } else if name != "0.log" {
            text = std::fs::read_to_string(&path).unwrap_or_default();
        }
        all.extend(numbers(&text));
    }
    all.extend(numbers(&std::fs::read_to_string(dir.join("0.log")).unwrap_or_default()));
    assert!(all.len() > 1000, "{} lines", all.len());
    for pair in all.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "a gap or a repeat between lines {} and {}", pair[0], pair[1]);
    }
    let current = std::fs::metadata(dir.join("0.log")).map(|m| m.len()).unwrap_or_default();
    assert!(current < 1 << 20, "the current file keeps growing: {current} bytes");
    n.remove_manifest("chatty.yaml");
    n.shutdown().await;
}

#[tokio::test]
async fn termination_messages_come_from_the_file_or_with_fallback_from_the_log() {
    let env = env_or_skip!("termination_messages_come_from_the_file_or_with_fallback_from_the_log");
    let n = Nodelet::start(&env, "termmsg").await;
    n.write_manifest(
        "done.yaml",
        &n.pod_manifest(
            "done",
            json!({
                "restartPolicy": "Never",
                "containers": [
                    {"name": "file", "command": ["sh", "-c", "echo -n 'all good' > /dev/termination-log; exit 0"]},
                    {"name": "custom", "terminationMessagePath": "/tmp/why",
                     "command": ["sh", "-c", "echo -n 'custom path' > /tmp/why; exit 1"]},
                    {"name": "fallback", "terminationMessagePolicy": "FallbackToLogsOnError",
                     "command": ["sh", "-c", "echo first; echo 'it broke'; exit 3"]},
                    {"name": "nofallback", "command": ["sh", "-c", "echo not a message; exit 4"]},
                ],
            }),
        ),
    );
    let pod = n
        .wait_for_pod("done", "every container terminated", Duration::from_secs(60), |p| {
            p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|cs| {
                cs.len() == 4 && cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
            })
        })
        .await;
    let message = |name: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == name))
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.message.clone())
    };
    assert_eq!(message("file").as_deref(), Some("all good"));
    assert_eq!(message("custom").as_deref(), Some("custom path"));
    assert_eq!(message("fallback").as_deref(), Some("first\nit broke\n"));
    assert_eq!(message("nofallback"), None, "policy File: the log is not the message");
    let pod_dir = n.root_dir().join("pods").join(uid(&pod));
    assert!(pod_dir.join("containers/file/0").is_file(), "the message file is the kubelet's layout");
    n.remove_manifest("done.yaml");
    n.wait_for("the pod directory removed with the pod", Duration::from_secs(30), async || {
        (!pod_dir.exists()).then_some(())
    })
    .await;
    n.shutdown().await;
}

#[tokio::test]
async fn previous_returns_the_log_of_the_instance_before_the_last_restart() {
    let env = env_or_skip!("previous_returns_the_log_of_the_instance_before_the_last_restart");
    let n = Nodelet::start(&env, "logprev").await;
    // Each instance prints its number (counted on an emptyDir); the first exits, the second stays.
    let script = "n=$(($(cat /data/n 2>/dev/null || echo 0) + 1)); echo $n > /data/n; echo \"instance $n\"; \
                  if [ $n -ge 2 ]; then trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done; fi; exit 1";
    n.write_manifest(
        "prev.yaml",
        &n.pod_manifest(
            "prev",
            json!({
                "terminationGracePeriodSeconds": 1,
                "restartPolicy": "Always",
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [
                    {"name": "flaky", "command": ["sh", "-c", script],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                    {"name": "steady", "command": ["sh", "-c", "echo steady; trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]},
                ],
            }),
        ),
    );
    n.wait_for_pod("prev", "flaky restarted once and running", Duration::from_secs(60), |p| {
        p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.name == "flaky"
                    && c.restart_count == 1
                    && c.state.as_ref().is_some_and(|s| s.running.is_some())
                    && c.last_state.as_ref().is_some_and(|s| s.terminated.is_some())
            })
        })
    })
    .await;
    let pod = n.pod_name("prev");
    let https = n.main_client();
    let get = async |path: &str| {
        let url = n.main_url(&format!("/containerLogs/default/{pod}/{path}"));
        let response =
            https.get(&url).bearer_auth(TOKEN).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        (response.status().as_u16(), response.text().await.unwrap_or_default())
    };
    // the current instance's output may take a moment to reach its log file
    n.wait_for("the second instance's output in its log", Duration::from_secs(10), async || {
        (get("flaky").await == (200, "instance 2\n".to_owned())).then_some(())
    })
    .await;
    assert_eq!(get("flaky?previous=true").await, (200, "instance 1\n".to_owned()));
    assert_eq!(
        get("flaky?previous=1&timestamps=true").await.1.split_once(' ').map(|(_, l)| l),
        Some("instance 1\n")
    );
    // a container that never restarted: the kubelet's 400 and message
    let (status, body) = get("steady?previous=true").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body, format!("previous terminated container \"steady\" in pod \"{pod}\" not found"));
    n.wait_for("steady's output in its log", Duration::from_secs(10), async || {
        (get("steady").await == (200, "steady\n".to_owned())).then_some(())
    })
    .await;
    n.remove_manifest("prev.yaml");
    n.shutdown().await;
}
