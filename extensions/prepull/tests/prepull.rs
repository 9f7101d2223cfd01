//! The pre-pull extension against the real runtime: `nodelet-prepull` (the standard node plus the
//! extension) on its own containerd (so the image is surely absent at start and removing nothing shared),
//! pulling `busybox:v2` from the local registry as a manifest of its directory says.

#[allow(dead_code, unused_imports, unreachable_pub, clippy::all)]
#[path = "../../../tests/daemon/support.rs"]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use support::{Nodelet, StartOptions, TOKEN, env_or_skip};

fn var(name: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{name} is unset: source /tmp/nodelet-test/env.sh"))
}

/// `nodelet-prepull get prepull` against the main port (extension tables are not on the read-only port).
async fn get_prepull(n: &Nodelet) -> (bool, String, String) {
    let ca = n.root_dir().join("pki").join("nodelet.crt");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet-prepull"))
        .args(["get", "prepull", "--server", &n.main_url(""), "--token", TOKEN])
        .arg("--certificate-authority")
        .arg(&ca)
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run nodelet-prepull get: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extension_pulls_the_images_of_its_manifests_and_shows_metrics_and_status() {
    let env = env_or_skip!("the_extension_pulls_the_images_of_its_manifests_and_shows_metrics_and_status");
    let image = var("NODELET_TEST_REGISTRY_BUSYBOX2");
    let images = PathBuf::from(var("NODELET_TEST_IMAGE_DIR"));
    let dir =
        tempfile::Builder::new().prefix("nodelet-e2e-prepull-").tempdir().unwrap_or_else(|e| panic!("{e}"));
    // Only the sandbox and busybox images are preloaded: busybox:v2 is not in this runtime.
    let preload = dir.path().join("images");
    let manifests = dir.path().join("prepull.d");
    for d in [&preload, &manifests] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
    }
    for tar in ["pause.tar", "busybox.tar"] {
        std::fs::copy(images.join(tar), preload.join(tar))
            .unwrap_or_else(|e| panic!("cannot copy {tar}: {e}"));
    }
    std::fs::write(
        manifests.join("base.yaml"),
        format!(
            "apiVersion: prepull.nodelet.io/v1alpha1\nkind: ImagePrepull\nmetadata:\n  name: base\nspec:\n  images:\n  - {image}\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // A broken manifest: reported, and nothing else is affected.
    std::fs::write(
        manifests.join("broken.yaml"),
        "apiVersion: prepull.nodelet.io/v1alpha1\nkind: ImagePrepull\nspec: {imagez: [x]}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));

    let options = StartOptions {
        binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_nodelet-prepull"))),
        env: vec![("NODELET_PREPULL_DIR".into(), manifests.display().to_string())],
        embedded_runtime: Some(preload),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "prepull", options).await;
    let cri = nodelet_cri::CriClient::connect_lazy(nodelet_cri::CriConfig::new(n.endpoint().to_owned()))
        .unwrap_or_else(|e| panic!("{e}"));

    // The image gets pulled into the runtime.
    n.wait_for("the pre-pulled image in the runtime", Duration::from_secs(60), async || {
        cri.image_status(&image).await.ok().flatten()
    })
    .await;

    // Its engine's series carry its own reconciler label; the broken manifest is counted.
    let metrics_url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let metrics = n
        .wait_for("the prepull series on /metrics", Duration::from_secs(10), async || {
            let text = n.http().get(&metrics_url).send().await.ok()?.text().await.ok()?;
            text.contains(
                "reconcile_engine_operations_total{kind=\"pull\",reconciler=\"prepull\",result=\"done\"} 1",
            )
            .then_some(text)
        })
        .await;
    assert!(metrics.contains("reconcile_engine_desired_keys{reconciler=\"prepull\"} 1"), "{metrics}");
    assert!(metrics.contains("nodelet_prepull_manifest_errors 1"), "{metrics}");
    assert!(metrics.contains("reconcile_engine_desired_keys{reconciler=\"pods\"}"), "the standard pairs too");

    // `get prepull` shows the image present and the broken manifest with why.
    let (ok, out, err) = get_prepull(&n).await;
    assert!(ok, "nodelet-prepull get prepull failed: {err}");
    eprintln!("nodelet-prepull get prepull:\n{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.first().is_some_and(|h| h.starts_with("NAME") && h.contains("STATUS")), "{out}");
    let row =
        lines.iter().find(|l| l.starts_with(&image)).unwrap_or_else(|| panic!("no row for {image}:\n{out}"));
    assert!(row.contains(" image ") && row.contains(" Present ") && row.contains("sha256:"), "{row}");
    let broken =
        lines.iter().find(|l| l.contains("broken.yaml")).unwrap_or_else(|| panic!("no broken row:\n{out}"));
    assert!(broken.contains(" Invalid ") && broken.contains("imagez"), "{broken}");

    // The standard node is unharmed: a static pod runs.
    let manifest = n.pod_manifest(
        "web",
        json!({"hostNetwork": true, "containers": [{"name": "c", "command": support::sleep_until_term("")}]}),
    );
    n.write_manifest("web.json", &manifest);
    n.wait_running("web").await;
    n.shutdown().await;
}
