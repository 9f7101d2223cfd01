//! `POST /checkpoint/{namespace}/{pod}/{container}` (the kubelet's checkpoint API, KEP-2008) against the
//! real containerd.
//!
//! What the runtime can do decides what is expected, never a silent skip: containerd 1.x does not implement
//! CRI `CheckpointContainer` (`UNIMPLEMENTED`, a 500 naming it); containerd 2.x does, with CRIU. Where CRIU
//! works on this machine (`criu check` passes) the checkpoint of a running busybox container must produce the
//! archive, a tar with what CRI checkpointing writes (`config.dump`, `spec.dump`, the CRIU images under
//! `checkpoint/`); where it does not (not installed, or a kernel too new for the installed CRIU) the answer
//! must be the 500 with the runtime's reason and no archive.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Nodelet, TOKEN, containerd_major, env_or_skip, sleep_until_term};

/// Whether CRIU runs on this machine: `criu check` succeeds. `Err` with its output when it does not.
fn criu_works() -> Result<(), String> {
    match std::process::Command::new("criu").arg("check").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "criu check failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => Err(format!("criu is not installed: {e}")),
    }
}

async fn post(n: &Nodelet, path: &str) -> (u16, Value) {
    let response = n
        .main_client()
        .post(n.main_url(path))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("POST {path}: not JSON ({e}): {body}"));
    (status, value)
}

/// The archives in `<root>/checkpoints`.
fn archives(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("checkpoints"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_container_is_checkpointed_where_the_runtime_can() {
    let env = env_or_skip!("a_running_container_is_checkpointed_where_the_runtime_can");
    let major = containerd_major();
    let n = Nodelet::start(&env, "checkpoint").await;
    n.write_manifest(
        "cp.json",
        &n.pod_manifest(
            "cp",
            json!({"terminationGracePeriodSeconds": 2,
                   "containers": [{"name": "app", "command": sleep_until_term("echo hello > /tmp/marker; ")}]}),
        ),
    );
    n.wait_running("cp").await;
    let pod = n.pod_name("cp");

    // The kubelet's 404s, before anything reaches the runtime.
    let (code, body) = post(&n, &format!("/checkpoint/default/{pod}/nope")).await;
    assert_eq!((code, body["message"].as_str()), (404, Some("container nope does not exist")), "{body}");
    let (code, body) = post(&n, "/checkpoint/default/absent/app").await;
    assert_eq!((code, body["message"].as_str()), (404, Some("pod does not exist")), "{body}");

    let (code, body) = post(&n, &format!("/checkpoint/default/{pod}/app?timeout=60")).await;
    let root = n.root_dir();
    let failed_prefix = format!("checkpointing of default/{pod}/app failed (CRI CheckpointContainer");
    if major < 2 {
        // containerd 1.x has no CheckpointContainer: the runtime's UNIMPLEMENTED in the kubelet's 500.
        assert_eq!(code, 500, "{body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&failed_prefix), "{message}");
        assert!(message.contains("not implemented"), "{message}");
        assert!(archives(&root).is_empty(), "no archive: {:?}", archives(&root));
    } else {
        match criu_works() {
            Ok(()) => {
                assert_eq!(code, 200, "{body}");
                let items = body["items"].as_array().cloned().unwrap_or_default();
                assert_eq!(items.len(), 1, "{body}");
                let path = PathBuf::from(items[0].as_str().unwrap_or_default());
                let name = path.file_name().and_then(|f| f.to_str()).unwrap_or_default().to_owned();
                assert_eq!(path.parent(), Some(root.join("checkpoints").as_path()), "{body}");
                assert!(
                    name.starts_with(&format!("checkpoint-{pod}_default-app-")) && name.ends_with("Z.tar"),
                    "{name}"
                );
                let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let mut archive = tar::Archive::new(file);
                let entries: Vec<String> = archive
                    .entries()
                    .expect("a tar archive")
                    .flatten()
                    .filter_map(|e| e.path().ok().map(|p| p.display().to_string()))
                    .collect();
                for wanted in ["config.dump", "spec.dump"] {
                    assert!(
                        entries.iter().any(|e| e.trim_start_matches("./") == wanted),
                        "{wanted} in {entries:?}"
                    );
                }
                assert!(
                    entries.iter().any(|e| e.trim_start_matches("./").starts_with("checkpoint/")),
                    "{entries:?}"
                );
            }
            Err(why) => {
                // CRIU cannot run here: the runtime's failure, in the kubelet's 500, and no archive.
                eprintln!(
                    "NOTE: CRIU does not work on this machine ({why}); checking the failure path on containerd {major}"
                );
                assert_eq!(code, 500, "{body}");
                let message = body["message"].as_str().unwrap_or_default();
                assert!(message.starts_with(&failed_prefix), "{message}");
                assert!(!message.contains("not implemented"), "containerd 2 implements it: {message}");
                assert!(message.to_lowercase().contains("criu"), "the runtime names CRIU: {message}");
                let left: Vec<PathBuf> = archives(&root)
                    .into_iter()
                    .filter(|p| std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false))
                    .collect();
                assert!(left.is_empty(), "no archive: {left:?}");
            }
        }
    }
    // The archive directory is the kubelet's, private to root.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(root.join("checkpoints")).expect("the checkpoints directory").permissions(),
    );
    assert_eq!(mode & 0o7777, 0o700);
    // The container was not disturbed by the attempt.
    n.wait_running("cp").await;
    n.shutdown().await;
}
