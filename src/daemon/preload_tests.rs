//! `--preload-images` with an external runtime that is not containerd: refused before anything is imported,
//! with an error naming the flag and the runtime (the images are imported with containerd's `ctr`).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::topology::{Core, Host, start_runtime};
use crate::hollow::fake_cri::FakeCri;

#[tokio::test]
async fn preloading_images_should_be_refused_on_a_runtime_that_is_not_containerd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri.sock");
    // A CRI runtime that answers `Version` with runtime_name "nodelet-hollow".
    let fake = FakeCri::new(0, dir.path().join("image-fs"));
    let stop = CancellationToken::new();
    let (serve_stop, path) = (stop.clone(), socket.clone());
    let served = tokio::spawn(async move { fake.serve(&path, serve_stop).await });
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images).expect("images dir");
    let endpoint = format!("unix://{}", socket.display());
    let root = dir.path().join("root");
    let argv = [
        "nodelet",
        "--container-runtime-endpoint",
        &endpoint,
        "--preload-images",
        images.to_str().expect("utf8"),
        "--root-dir",
        root.to_str().expect("utf8"),
        "--hostname-override",
        "n",
    ];
    let crate::cli::Command::Run(args) = crate::cli::try_parse_from(argv).expect("flags") else {
        panic!("not `nodelet run`");
    };
    let config = crate::config::Config::load(&args).expect("config").config;
    let core = Core::new(Arc::new(config), Host::Real).expect("core");

    let outcome = tokio::time::timeout(std::time::Duration::from_secs(30), start_runtime(&core, &endpoint))
        .await
        .expect("start_runtime answered within 30 s");
    let Err(error) = outcome else {
        panic!("a runtime that is not containerd was accepted for --preload-images")
    };
    let message = format!("{error:#}");
    assert!(message.contains("--preload-images"), "{message}");
    assert!(message.contains("is nodelet-hollow"), "the runtime is named: {message}");
    stop.cancel();
    served.await.expect("join").expect("fake CRI served");
}
