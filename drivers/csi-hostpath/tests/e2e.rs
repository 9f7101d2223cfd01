//! End to end: the real `nodelet-csi-hostpath` binary on a real unix socket, discovered and driven by the
//! `nodelet-csi` client, with real bind mounts under a temporary directory. Needs root (mounts); without
//! it the tests print a skip note, or fail when `NODELET_REQUIRE_RUNTIME=1`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nodelet_csi::{
    CsiClientConfig, CsiVolume, Operation, Registry, VolumeLayout, VolumeOps, default_registration_dir, proto,
};
use tokio::process::{Child, Command};

const DRIVER: &str = "hostpath.csi.nodelet.dev";
const NODE_ID: &str = "node-e2e";
const POD_UID: &str = "5f0c2e8a-6d3b-4a51-9c1e-2b7f0e4d9a10";

fn can_mount() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() != Ok("1"),
        "NODELET_REQUIRE_RUNTIME=1 but these tests need root (bind mounts)"
    );
    eprintln!("skipping: the CSI end-to-end tests need root (bind mounts)");
    false
}

/// A temporary root dir, data dir and driver process. Dropping it kills the driver and lazily unmounts
/// anything still mounted below the temporary directory, so a failing test leaves no mounts behind.
struct Env {
    tmp: tempfile::TempDir,
    base: PathBuf,
    driver: Option<Child>,
}

impl Env {
    fn new() -> Self {
        let tmp = tempfile::Builder::new().prefix("nodelet-csi-e2e-").tempdir_in("/tmp").expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical tempdir");
        std::fs::create_dir_all(base.join("root/plugins_registry")).expect("registry dir");
        Env { tmp, base, driver: None }
    }

    fn root(&self) -> PathBuf {
        self.base.join("root")
    }
    fn data(&self) -> PathBuf {
        self.base.join("data")
    }
    fn call_log(&self) -> PathBuf {
        self.base.join("calls.jsonl")
    }
    fn socket(&self) -> PathBuf {
        default_registration_dir(&self.root()).join("hostpath.sock")
    }

    /// Starts the driver and waits for its socket.
    async fn start_driver(&mut self) {
        self.start_driver_with(&[]).await;
    }

    /// Starts the driver with extra arguments and waits for its socket.
    async fn start_driver_with(&mut self, extra_args: &[&str]) {
        let socket = self.socket();
        let child = Command::new(env!("CARGO_BIN_EXE_nodelet-csi-hostpath"))
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-dir")
            .arg(self.data())
            .arg("--node-id")
            .arg(NODE_ID)
            .arg("--call-log")
            .arg(self.call_log())
            .args(extra_args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn nodelet-csi-hostpath");
        self.driver = Some(child);
        for _ in 0..200 {
            if socket.exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("driver socket {} did not appear", socket.display());
    }

    /// SIGKILLs the driver (its socket file stays behind, like after a crash).
    async fn kill_driver(&mut self) {
        if let Some(mut child) = self.driver.take() {
            child.kill().await.expect("kill driver");
        }
    }

    /// Mount points below the temporary directory, innermost last.
    fn mounts(&self) -> Vec<PathBuf> {
        mounts_below(&self.base)
    }

    /// The recorded `(method, volume_id, code)` calls.
    fn calls(&self) -> Vec<(String, String, String)> {
        let text = std::fs::read_to_string(self.call_log()).unwrap_or_default();
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("call log line is JSON");
                let s = |k: &str| v[k].as_str().expect("string field").to_owned();
                (s("method"), s("volume_id"), s("code"))
            })
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut child) = self.driver.take() {
            let _ = child.start_kill();
        }
        for mount in mounts_below(&self.base).iter().rev() {
            let _ = rustix::mount::unmount(mount, rustix::mount::UnmountFlags::DETACH);
        }
        let _ = &self.tmp;
    }
}

fn unescape_mountinfo(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn count_mounts_at(path: &Path) -> usize {
    mounts_below(path).iter().filter(|p| p.as_path() == path).count()
}

fn create_request(name: &str, required: i64) -> proto::CreateVolumeRequest {
    proto::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(proto::CapacityRange { required_bytes: required, limit_bytes: 0 }),
        volume_capabilities: vec![nodelet_csi::mount_capability(
            proto::volume_capability::access_mode::Mode::SingleNodeWriter,
        )],
        ..Default::default()
    }
}

fn publish_request(volume_id: &str, node_id: &str) -> proto::ControllerPublishVolumeRequest {
    proto::ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        volume_capability: Some(nodelet_csi::mount_capability(
            proto::volume_capability::access_mode::Mode::SingleNodeWriter,
        )),
        ..Default::default()
    }
}

/// The code of a failed volume step's CSI call.
fn op_code(err: &nodelet_csi::VolumeOpError) -> Option<tonic::Code> {
    err.csi_error().and_then(|e| e.code())
}

async fn registered(env: &Env) -> (Arc<Registry>, Arc<nodelet_csi::Driver>) {
    let registry = Arc::new(
        Registry::new(default_registration_dir(&env.root()), CsiClientConfig::default())
            .with_discovery_timeout(Duration::from_secs(2)),
    );
    let report = registry.scan().await.expect("scan");
    assert_eq!(report.added, vec![DRIVER.to_owned()], "{report:?}");
    let driver = registry.get(DRIVER).expect("driver registered");
    (registry, driver)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_lifecycle_in_kubelet_order() {
    if !can_mount() {
        return;
    }
    let mut env = Env::new();
    env.start_driver().await;

    // A socket that is not a CSI driver (nothing ever answers on it) is skipped, not fatal.
    let _silent =
        std::os::unix::net::UnixListener::bind(default_registration_dir(&env.root()).join("other.sock"))
            .expect("bind silent socket");

    let (registry, driver) = registered(&env).await;
    assert_eq!(registry.drivers().len(), 1);
    assert_eq!(driver.node.node_id, NODE_ID);
    assert_eq!(driver.node.max_volumes_per_node, Some(100));
    assert!(driver.plugin_capabilities.controller_service);
    assert!(driver.requires_stage());
    assert!(driver.node_capabilities.get_volume_stats);
    assert!(driver.can_create_volumes());
    assert!(!driver.requires_controller_publish());
    let client = driver.client().clone();

    // Provision, idempotently by name; an incompatible size under the same name is ALREADY_EXISTS (final).
    let volume = client.create_volume(create_request("pvc-e2e", 10 << 20)).await.expect("create");
    assert_eq!(volume.capacity_bytes, 10 << 20);
    let again = client.create_volume(create_request("pvc-e2e", 10 << 20)).await.expect("create again");
    assert_eq!(again.volume_id, volume.volume_id);
    let err = client.create_volume(create_request("pvc-e2e", 20 << 20)).await.expect_err("bigger same name");
    assert_eq!(err.code(), Some(tonic::Code::AlreadyExists));
    assert!(err.is_final());
    let id = volume.volume_id.clone();
    let backing = env.data().join("volumes").join(&id);
    assert!(backing.is_dir());

    // Stage + publish through the kubelet layout.
    let layout = VolumeLayout::new(env.root());
    let ops = VolumeOps::new(Arc::clone(&driver), layout.clone());
    let vol = CsiVolume::filesystem(DRIVER, &id, POD_UID, "data");
    let target = ops.set_up(&vol).await.expect("set up");
    assert_eq!(target, layout.target_path(POD_UID, "data").unwrap());
    let staging = layout.staging_path(DRIVER, &id).unwrap();
    assert_eq!(count_mounts_at(&staging), 1, "staged once");
    assert_eq!(count_mounts_at(&target), 1, "published once");
    let vol_data = nodelet_csi::read_vol_data(&target.parent().unwrap().join("vol_data.json")).await.unwrap();
    assert_eq!((vol_data.driver_name.as_str(), vol_data.volume_handle.as_str()), (DRIVER, id.as_str()));

    // What a container writes through the published target lands in the driver's data dir.
    std::fs::write(target.join("hello.txt"), vec![b'x'; 100 * 1024]).expect("write through target");
    assert_eq!(std::fs::read(backing.join("hello.txt")).expect("in data dir").len(), 100 * 1024);

    // Idempotent: stage and publish again change nothing.
    ops.stage(&vol, &HashMap::new()).await.expect("stage twice");
    ops.publish(&vol, &HashMap::new()).await.expect("publish twice");
    assert_eq!(count_mounts_at(&staging), 1, "still staged once");
    assert_eq!(count_mounts_at(&target), 1, "still published once");

    // A second pod, read-only: same data, writes refused.
    let ro_pod = "0b9d7c1e-2f4a-4e6b-8d3c-5a1f9e7b2c40";
    let mut ro = CsiVolume::filesystem(DRIVER, &id, ro_pod, "data");
    ro.readonly = true;
    let ro_target = ops.publish(&ro, &HashMap::new()).await.expect("publish read-only");
    assert_eq!(std::fs::read(ro_target.join("hello.txt")).expect("readable").len(), 100 * 1024);
    let denied = std::fs::write(ro_target.join("nope"), b"x").expect_err("read-only mount refuses writes");
    assert_eq!(denied.raw_os_error(), Some(rustix::io::Errno::ROFS.raw_os_error()));

    // Stats: the file system from statvfs, the volume's own usage from a walk.
    let stats = client.node_get_volume_stats(&id, &target, Some(&staging)).await.expect("stats");
    let bytes = stats.bytes.expect("byte usage");
    assert!(bytes.used >= 100 * 1024, "{bytes:?}");
    assert!(bytes.total >= bytes.available && bytes.total > 0, "{bytes:?}");
    let inodes = stats.inodes.expect("inode usage");
    assert!(inodes.used >= 2, "{inodes:?}");

    // A staged volume cannot be deleted.
    let err = client.delete_volume(&id, HashMap::new()).await.expect_err("delete while staged");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition));

    // Tear down in reverse order; everything the layout created is gone, and no mount is left.
    ops.unpublish(&ro).await.expect("unpublish read-only");
    ops.tear_down(&vol).await.expect("tear down");
    ops.tear_down(&vol).await.expect("tear down twice");
    assert!(!target.exists() && !target.parent().unwrap().exists(), "pod volume dir removed");
    assert!(!staging.exists() && !staging.parent().unwrap().exists(), "global dir removed");
    assert_eq!(env.mounts(), Vec::<PathBuf>::new(), "no mounts left");
    assert!(backing.join("hello.txt").exists(), "data survives unstage");

    client.delete_volume(&id, HashMap::new()).await.expect("delete");
    client.delete_volume(&id, HashMap::new()).await.expect("delete is idempotent");
    assert!(!backing.exists());

    // The driver saw the calls in the kubelet's order.
    let calls = env.calls();
    let discovery: Vec<&str> =
        calls.iter().take_while(|(m, ..)| m != "CreateVolume").map(|(m, ..)| m.as_str()).collect();
    assert_eq!(
        discovery,
        [
            "GetPluginInfo",
            "Probe",
            "GetPluginCapabilities",
            "NodeGetInfo",
            "NodeGetCapabilities",
            "ControllerGetCapabilities"
        ]
    );
    let volume_calls: Vec<(&str, &str)> =
        calls.iter().filter(|(_, v, _)| *v == id).map(|(m, _, c)| (m.as_str(), c.as_str())).collect();
    assert_eq!(
        volume_calls,
        [
            ("CreateVolume", "Ok"),
            ("CreateVolume", "Ok"),
            ("CreateVolume", "AlreadyExists"),
            ("NodeStageVolume", "Ok"),
            ("NodePublishVolume", "Ok"),
            ("NodeStageVolume", "Ok"),
            ("NodePublishVolume", "Ok"),
            ("NodePublishVolume", "Ok"),
            ("NodeGetVolumeStats", "Ok"),
            ("DeleteVolume", "FailedPrecondition"),
            ("NodeUnpublishVolume", "Ok"),
            ("NodeUnpublishVolume", "Ok"),
            ("NodeUnstageVolume", "Ok"),
            ("NodeUnpublishVolume", "Ok"),
            ("NodeUnstageVolume", "Ok"),
            ("DeleteVolume", "Ok"),
            ("DeleteVolume", "Ok"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_final_or_uncertain() {
    if !can_mount() {
        return;
    }
    let mut env = Env::new();
    env.start_driver().await;
    let (registry, driver) = registered(&env).await;
    let client = driver.client().clone();
    let layout = VolumeLayout::new(env.root());
    let ops = VolumeOps::new(Arc::clone(&driver), layout.clone());

    // Unknown volume: NOT_FOUND, a final error; nothing gets mounted.
    let unknown = CsiVolume::filesystem(DRIVER, "hp-00000000000000000000000000000000", POD_UID, "data");
    let err = ops.set_up(&unknown).await.expect_err("unknown volume");
    assert_eq!(err.operation(), Some(Operation::Stage));
    assert!(err.csi_error().is_some_and(|e| e.is_not_found()), "{err}");
    assert!(!err.is_uncertain());
    let err = client
        .node_get_volume_stats("no-such-volume", Path::new("/tmp"), None)
        .await
        .expect_err("stats of unknown volume");
    assert!(err.is_not_found() && err.is_final());

    // Invalid requests: INVALID_ARGUMENT, final.
    let err = client
        .node_stage(proto::NodeStageVolumeRequest {
            volume_id: "x".into(),
            staging_target_path: "relative/path".into(),
            volume_capability: Some(nodelet_csi::mount_capability(
                proto::volume_capability::access_mode::Mode::SingleNodeWriter,
            )),
            ..Default::default()
        })
        .await
        .expect_err("relative staging path");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(err.is_final());
    let err = client.create_volume(create_request("", 0)).await.expect_err("empty name");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    let err = client.create_volume(create_request("huge", 1 << 50)).await.expect_err("too big");
    assert_eq!(err.code(), Some(tonic::Code::OutOfRange));

    // Publishing an unstaged volume is refused (FAILED_PRECONDITION), so the order matters.
    let volume = client.create_volume(create_request("pvc-errors", 1 << 20)).await.expect("create");

    // Without --attach there is no attach/detach.
    let err = client
        .controller_publish(publish_request(&volume.volume_id, NODE_ID))
        .await
        .expect_err("controller publish without --attach");
    assert!(err.is_unimplemented(), "{err:?}");
    let err = client
        .controller_unpublish(&volume.volume_id, Some(NODE_ID), HashMap::new())
        .await
        .expect_err("controller unpublish without --attach");
    assert!(err.is_unimplemented(), "{err:?}");
    let vol = CsiVolume::filesystem(DRIVER, &volume.volume_id, POD_UID, "data");
    let err = ops.publish(&vol, &HashMap::new()).await.expect_err("publish before stage");
    assert!(err.csi_error().is_some_and(|e| e.code() == Some(tonic::Code::FailedPrecondition)), "{err}");
    assert!(!err.is_uncertain());
    assert_eq!(env.mounts(), Vec::<PathBuf>::new());

    // Stage it, then kill the driver: calls now fail with uncertain errors (the volume may be mounted).
    ops.stage(&vol, &HashMap::new()).await.expect("stage");
    env.kill_driver().await;
    let err = client.probe().await.expect_err("probe a dead driver");
    assert!(err.is_uncertain() && err.is_unavailable(), "{err:?}");
    let err = ops.publish(&vol, &HashMap::new()).await.expect_err("publish with a dead driver");
    assert!(err.is_uncertain(), "{err:?}");

    // The socket of a dead driver vanishing drops the driver; a restarted driver is discovered again and
    // the teardown completes.
    std::fs::remove_file(env.socket()).expect("remove stale socket");
    let report = registry.scan().await.expect("rescan");
    assert_eq!(report.removed, vec![DRIVER.to_owned()]);
    assert!(registry.get(DRIVER).is_none());
    env.start_driver().await;
    let report = registry.scan().await.expect("rescan");
    assert_eq!(report.added, vec![DRIVER.to_owned()]);
    let ops = VolumeOps::new(registry.get(DRIVER).expect("registered again"), layout);
    // The uncertain publish is cleaned up like a maybe-mounted volume: unpublish, then unstage.
    ops.tear_down(&vol).await.expect("tear down after restart");
    assert_eq!(env.mounts(), Vec::<PathBuf>::new(), "no mounts left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_follows_the_registration_dir() {
    if !can_mount() {
        return;
    }
    let mut env = Env::new();
    let registry = Arc::new(Registry::new(default_registration_dir(&env.root()), CsiClientConfig::default()));
    let mut changes = registry.subscribe();
    let cancel = tokio_util_cancel();
    let watcher = tokio::spawn(registry.watcher(Duration::from_millis(100), cancel.clone()));

    env.start_driver().await;
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("registered in time")
        .unwrap();
    assert!(registry.get(DRIVER).is_some());

    // SIGTERM: the driver removes its socket on a clean shutdown, and the watcher drops it.
    let child = env.driver.take().expect("driver");
    let pid = rustix::process::Pid::from_raw(child.id().expect("pid") as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let output = child.wait_with_output().await.expect("driver exits");
    assert!(output.status.success(), "clean exit: {output:?}");
    assert!(!env.socket().exists(), "socket removed on shutdown");
    tokio::time::timeout(Duration::from_secs(10), changes.changed()).await.expect("dropped in time").unwrap();
    assert!(registry.get(DRIVER).is_none());

    cancel.cancel();
    watcher.await.expect("watcher stops");
}

fn tokio_util_cancel() -> tokio_util::sync::CancellationToken {
    tokio_util::sync::CancellationToken::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_mode_lifecycle() {
    if !can_mount() {
        return;
    }
    let mut env = Env::new();
    env.start_driver_with(&["--attach"]).await;
    let (_registry, driver) = registered(&env).await;
    assert!(driver.requires_controller_publish(), "--attach offers PUBLISH_UNPUBLISH_VOLUME");
    assert!(driver.can_create_volumes() && driver.requires_stage());
    let client = driver.client().clone();
    let caps = client.controller_capabilities().await.expect("controller capabilities");
    assert!(caps.publish_unpublish_volume && caps.create_delete_volume, "{caps:?}");

    let volume = client.create_volume(create_request("pvc-attach", 1 << 20)).await.expect("create");
    let id = volume.volume_id.clone();
    let backing = env.data().join("volumes").join(&id);
    let marker = env.data().join("volumes").join(format!("{id}.attached"));
    let layout = VolumeLayout::new(env.root());
    let ops = VolumeOps::new(Arc::clone(&driver), layout.clone());
    let vol = CsiVolume::filesystem(DRIVER, &id, POD_UID, "data");
    let staging = layout.staging_path(DRIVER, &id).unwrap();

    // Staging a volume that is not attached is refused, whatever the context says; nothing is mounted.
    let expected: HashMap<String, String> =
        HashMap::from([("hostpath.csi.nodelet.dev/device".into(), id.clone())]);
    let err = ops.stage(&vol, &HashMap::new()).await.expect_err("stage before attach");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    let err = ops.stage(&vol, &expected).await.expect_err("stage before attach, with a forged context");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert_eq!(env.mounts(), Vec::<PathBuf>::new());

    // ControllerPublishVolume validates the volume, the node and the capability.
    let err = client
        .controller_publish(publish_request("hp-00000000000000000000000000000000", NODE_ID))
        .await
        .expect_err("unknown volume");
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    let err = client.controller_publish(publish_request(&id, "other-node")).await.expect_err("other node");
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    let mut no_cap = publish_request(&id, NODE_ID);
    no_cap.volume_capability = None;
    let err = client.controller_publish(no_cap).await.expect_err("no capability");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(!marker.exists(), "failed publishes attach nothing");

    // Attach (through the CO's step), idempotently: the same context, recorded durably with the node ID.
    let context = ops.attach(&vol).await.expect("attach");
    assert_eq!(context, expected);
    assert_eq!(std::fs::read_to_string(&marker).expect("attachment marker"), NODE_ID);
    assert_eq!(ops.attach(&vol).await.expect("attach again"), context);

    // Attached, but the context was not passed along (or is wrong): still refused.
    let err = ops.stage(&vol, &HashMap::new()).await.expect_err("stage without context");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    let wrong = HashMap::from([("hostpath.csi.nodelet.dev/device".to_owned(), "hp-other".to_owned())]);
    let err = ops.stage(&vol, &wrong).await.expect_err("stage with a wrong context");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert_eq!(count_mounts_at(&staging), 0);

    // The attachment survives a driver restart (it is on disk, not in memory).
    env.kill_driver().await;
    std::fs::remove_file(env.socket()).expect("remove the dead driver's socket");
    env.start_driver_with(&["--attach"]).await;
    let (_registry, driver) = registered(&env).await;
    let client = driver.client().clone();
    let ops = VolumeOps::new(Arc::clone(&driver), layout.clone());

    // Stage and publish with the context.
    ops.stage(&vol, &context).await.expect("stage with context");
    assert_eq!(count_mounts_at(&staging), 1);
    let err = ops.publish(&vol, &HashMap::new()).await.expect_err("publish without context");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    let target = ops.publish(&vol, &context).await.expect("publish with context");
    assert_eq!(count_mounts_at(&target), 1);
    std::fs::write(target.join("hello.txt"), b"attached").expect("write through target");
    assert_eq!(std::fs::read(backing.join("hello.txt")).expect("in data dir"), b"attached");

    // No detach while staged, no delete while staged or attached.
    let err = ops.detach(&vol).await.expect_err("detach while staged");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert!(marker.exists(), "still attached");
    let err = client.delete_volume(&id, HashMap::new()).await.expect_err("delete while staged");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition));

    // Unpublish, unstage: still attached, so delete is still refused.
    ops.unpublish(&vol).await.expect("unpublish");
    ops.unstage(&vol).await.expect("unstage");
    assert_eq!(env.mounts(), Vec::<PathBuf>::new(), "no mounts left");
    let err = client.delete_volume(&id, HashMap::new()).await.expect_err("delete while attached");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition));

    // Unpublishing from another node changes nothing; detach is idempotent, and once detached the
    // volume cannot be staged again, even with the old context.
    client.controller_unpublish(&id, Some("other-node"), HashMap::new()).await.expect("other node: OK");
    assert!(marker.exists(), "other node's unpublish left the attachment");
    ops.detach(&vol).await.expect("detach");
    assert!(!marker.exists(), "attachment removed");
    ops.detach(&vol).await.expect("detach again");
    client
        .controller_unpublish("hp-00000000000000000000000000000000", Some(NODE_ID), HashMap::new())
        .await
        .expect("unknown volume: OK");
    let err = ops.stage(&vol, &context).await.expect_err("stage after detach");
    assert_eq!(op_code(&err), Some(tonic::Code::FailedPrecondition), "{err}");

    // The whole CO sequence in one go, as the volume manager runs it; then the volume can be deleted.
    let target = ops.set_up(&vol).await.expect("set up");
    assert_eq!(std::fs::read(target.join("hello.txt")).expect("data kept"), b"attached");
    assert!(marker.exists());
    ops.tear_down(&vol).await.expect("tear down");
    ops.tear_down(&vol).await.expect("tear down twice");
    assert!(!marker.exists());
    assert_eq!(env.mounts(), Vec::<PathBuf>::new(), "no mounts left");
    client.controller_unpublish(&id, None, HashMap::new()).await.expect("unpublish from all nodes: OK");
    client.delete_volume(&id, HashMap::new()).await.expect("delete once detached");
    assert!(!backing.exists());
    let err = client.controller_publish(publish_request(&id, NODE_ID)).await.expect_err("deleted volume");
    assert_eq!(err.code(), Some(tonic::Code::NotFound));

    // Every call is in the call log, by method name.
    let volume_calls: Vec<(String, String)> =
        env.calls().into_iter().filter(|(_, v, _)| *v == id).map(|(m, _, c)| (m, c)).collect();
    let volume_calls: Vec<(&str, &str)> =
        volume_calls.iter().map(|(m, c)| (m.as_str(), c.as_str())).collect();
    assert_eq!(
        volume_calls,
        [
            ("CreateVolume", "Ok"),
            ("NodeStageVolume", "FailedPrecondition"),
            ("NodeStageVolume", "FailedPrecondition"),
            ("ControllerPublishVolume", "NotFound"),
            ("ControllerPublishVolume", "InvalidArgument"),
            ("ControllerPublishVolume", "Ok"),
            ("ControllerPublishVolume", "Ok"),
            ("NodeStageVolume", "FailedPrecondition"),
            ("NodeStageVolume", "FailedPrecondition"),
            ("NodeStageVolume", "Ok"),
            ("NodePublishVolume", "FailedPrecondition"),
            ("NodePublishVolume", "Ok"),
            ("ControllerUnpublishVolume", "FailedPrecondition"),
            ("DeleteVolume", "FailedPrecondition"),
            ("NodeUnpublishVolume", "Ok"),
            ("NodeUnstageVolume", "Ok"),
            ("DeleteVolume", "FailedPrecondition"),
            ("ControllerUnpublishVolume", "Ok"),
            ("ControllerUnpublishVolume", "Ok"),
            ("ControllerUnpublishVolume", "Ok"),
            ("NodeStageVolume", "FailedPrecondition"),
            ("ControllerPublishVolume", "Ok"),
            ("NodeStageVolume", "Ok"),
            ("NodePublishVolume", "Ok"),
            ("NodeUnpublishVolume", "Ok"),
            ("NodeUnstageVolume", "Ok"),
            ("ControllerUnpublishVolume", "Ok"),
            ("NodeUnpublishVolume", "Ok"),
            ("NodeUnstageVolume", "Ok"),
            ("ControllerUnpublishVolume", "Ok"),
            ("ControllerUnpublishVolume", "Ok"),
            ("DeleteVolume", "Ok"),
            ("ControllerPublishVolume", "NotFound"),
        ]
    );
}
