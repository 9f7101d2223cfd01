//! Crash-safe state on the real runtime: state files nodelet reads back at start (the HTTP source's checkpoint
//! of submitted pods, the claim pair's binding and volume records) found truncated or corrupt, as after a
//! crash in the middle of a write that was not crash-safe or a damaged disk. Each is reported by its path
//! with what is wrong and moved aside (`<name>.corrupt-<seconds>`), never silently dropped; nodelet starts,
//! its peak RSS stays under [`PEAK_RSS_MIB`], and a healthy pod running across the restart is untouched.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::hostile_clients::free_port;
use crate::support::{Nodelet, StartOptions, env_or_skip, sleep_until_term};

/// nodelet's peak RSS (VmHWM) bound through the case. A debug build, measured on the test machine, peaked at
/// 61 MiB here (one pod adopted, three bad files, one submission; start-up is nearly all of it); 80 MiB
/// leaves room for noise while a leak or an unbounded buffer of 20 MiB fails.
const PEAK_RSS_MIB: u64 = 80;

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The files beside `path` that are `path` moved aside: `<name>.corrupt-<seconds>`.
fn moved_aside(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = path.parent().unwrap_or_else(|| panic!("{} has no parent", path.display()));
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}.corrupt-")))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn truncated_and_corrupt_state_files_at_start_are_reported_moved_aside_and_leave_pods_alone() {
    let env = env_or_skip!(
        "truncated_and_corrupt_state_files_at_start_are_reported_moved_aside_and_leave_pods_alone"
    );
    let port = free_port();
    let options = StartOptions {
        extra_args: vec!["--manifest-http-addr".to_owned(), format!("127.0.0.1:{port}")],
        ..StartOptions::default()
    };
    let mut n = Nodelet::start_with(&env, "crash-safe", options).await;
    let steady = n.pod_manifest(
        "steady",
        json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
    );
    n.write_manifest("steady.yaml", &steady);
    let before = n.wait_running("steady").await;
    n.stop().await;

    // What a crash in the middle of a plain write leaves: the first part of each file, or garbage.
    let root = n.root_dir();
    let checkpoint = root.join("http-source/pods.json");
    let record = root.join("storage/claims/records/default_data.json");
    let volume = root.join("storage/claims/volumes/pvc-data.json");
    let truncated_checkpoint = r#"{"default/submitted": {"apiVersion": "v1", "kind": "Pod", "metad"#;
    write(&checkpoint, truncated_checkpoint);
    write(&record, r#"{"claim": {"namespace": "default", "na"#);
    write(&volume, "\u{0}\u{0}\u{0}garbage\u{0}");
    n.start_again().await;

    for (path, what) in
        [(&checkpoint, "checkpoint"), (&record, "binding record"), (&volume, "provisioned volume record")]
    {
        let shown = path.display().to_string();
        let line = n
            .wait_for(&format!("the {what} reported"), Duration::from_secs(20), async || {
                n.log()
                    .lines()
                    .find(|l| l.contains(&shown) && l.contains("does not parse"))
                    .map(str::to_owned)
            })
            .await;
        assert!(line.contains("ERROR"), "reported as an error: {line}");
        assert!(line.contains(what) && line.contains("moved aside"), "says what and where it went: {line}");
        assert!(!path.exists(), "{shown} is no longer read");
        let aside = moved_aside(path);
        assert_eq!(aside.len(), 1, "{shown} moved aside once: {aside:?}");
        assert!(line.contains(&aside[0].display().to_string()), "names where it went: {line}");
    }
    let kept = std::fs::read_to_string(&moved_aside(&checkpoint)[0]).unwrap_or_default();
    assert_eq!(kept, truncated_checkpoint, "the checkpoint's content is kept for an operator to look at");

    // The node works on: a new submission is checkpointed, the healthy pod ran through it all.
    let submitted = n.pod_manifest(
        "submitted",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
    );
    let response = n
        .http()
        .post(format!("http://127.0.0.1:{port}/pods"))
        .bearer_auth(n.manifest_token())
        .header("content-type", "application/json")
        .body(submitted.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /pods: {e}"));
    assert!(response.status().is_success(), "{}", response.status());
    n.wait_running("submitted").await;
    let written = std::fs::read_to_string(&checkpoint).unwrap_or_default();
    assert!(
        serde_json::from_str::<serde_json::Value>(&written).is_ok(),
        "a whole checkpoint again: {written}"
    );
    n.assert_untouched("steady", &before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "corrupt state files");
    let url = format!("http://127.0.0.1:{port}/pods/default/submitted");
    let removed = n
        .http()
        .delete(&url)
        .bearer_auth(n.manifest_token())
        .send()
        .await
        .unwrap_or_else(|e| panic!("DELETE {url}: {e}"));
    assert!(removed.status().is_success(), "{}", removed.status());
    n.shutdown().await;
}
