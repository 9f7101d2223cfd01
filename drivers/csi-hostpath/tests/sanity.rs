//! The CSI conformance suite (`csi-sanity` from kubernetes-csi/csi-test, built from public source in
//! `../shared/csi`; scripts/test.sh unpacks it into `NODELET_TEST_UPSTREAM_CSI`) against this driver.
//! Without the program the test says so and does not run; with `NODELET_REQUIRE_UPSTREAM_CSI=1` (the
//! test command) its absence is a failure.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// Kills the driver when the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn csi_sanity_passes_with_no_failure() {
    let sanity = std::env::var_os("NODELET_TEST_UPSTREAM_CSI").map(|d| PathBuf::from(d).join("csi-sanity"));
    let Some(sanity) = sanity.filter(|p| p.is_file()) else {
        assert!(
            std::env::var("NODELET_REQUIRE_UPSTREAM_CSI").as_deref() != Ok("1"),
            "no csi-sanity in NODELET_TEST_UPSTREAM_CSI"
        );
        eprintln!("SKIP csi_sanity_passes_with_no_failure: no csi-sanity (NODELET_TEST_UPSTREAM_CSI)");
        return;
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let socket = dir.path().join("csi.sock");
    let data = dir.path().join("data");
    let _driver = Killed(
        Command::new(env!("CARGO_BIN_EXE_nodelet-csi-hostpath"))
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-dir")
            .arg(&data)
            .args(["--node-id", "sanity"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the driver: {e}")),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the driver never listened on {}", socket.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = tokio::process::Command::new(&sanity)
        .arg(format!("--csi.endpoint=unix://{}", socket.display()))
        .arg(format!("--csi.mountdir={}", dir.path().join("mnt").display()))
        .arg(format!("--csi.stagingdir={}", dir.path().join("stage").display()))
        .arg("--ginkgo.no-color")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", sanity.display()));
    let text = String::from_utf8_lossy(&output.stdout);
    let summary = text.lines().rfind(|l| l.contains("Passed") && l.contains("Failed")).unwrap_or("");
    assert!(
        output.status.success(),
        "csi-sanity failed: {summary}\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(summary.contains("0 Failed"), "{summary}");
    eprintln!("csi-sanity: {summary}");
}
