//! `fsGroup` ownership and the modes of atomic-writer volume directories: the kubelet's
//! `SetVolumeOwnership` masks, symlinks never followed, and what [`HostVolumes`] sets up for a
//! configMap, a secret and an emptyDir with and without an `fsGroup`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use nodelet_host::driver::HostVolumes;
use nodelet_host::files::{FileEntry, FileSet};
use nodelet_host::ownership::{requires_change, set_volume_ownership};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::desired::{DesiredVolume, FsGroup, VolumeSource, volume_path};
use nodelet_resources::volume::driver::VolumeHost;

const GID: u32 = 4321;

fn gid_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).map(|m| m.gid()).unwrap_or(u32::MAX)
}

fn uid_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).map(|m| m.uid()).unwrap_or(u32::MAX)
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn the_walk_sets_group_and_masks_and_never_follows_a_symlink() {
    if !common::have_root("the_walk_sets_group_and_masks_and_never_follows_a_symlink") {
        return;
    }
    let t = common::TestDir::new();
    let vol = t.path().join("vol");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(vol.join("sub/deeper")).expect("mkdir");
    std::fs::write(vol.join("a"), "a").expect("write");
    std::fs::write(vol.join("sub/deeper/b"), "b").expect("write");
    std::fs::write(&outside, "secret of the host").expect("write");
    chmod(&vol, 0o755);
    chmod(&vol.join("sub"), 0o700);
    chmod(&vol.join("sub/deeper"), 0o755);
    chmod(&vol.join("a"), 0o400);
    chmod(&vol.join("sub/deeper/b"), 0o644);
    chmod(&outside, 0o600);
    std::os::unix::fs::symlink(&outside, vol.join("link")).expect("symlink");
    std::os::unix::fs::symlink(t.path(), vol.join("dirlink")).expect("symlink");

    let top_before = (common::mode_of(t.path()), gid_of(t.path()));
    assert!(requires_change(&vol, GID, true));
    set_volume_ownership(&vol, GID, true).expect("ownership");

    assert_eq!((common::mode_of(&vol), gid_of(&vol)), (0o2755, GID));
    assert_eq!((common::mode_of(&vol.join("sub")), gid_of(&vol.join("sub"))), (0o2750, GID));
    assert_eq!(common::mode_of(&vol.join("sub/deeper")), 0o2755);
    assert_eq!((common::mode_of(&vol.join("a")), gid_of(&vol.join("a"))), (0o440, GID));
    assert_eq!((common::mode_of(&vol.join("sub/deeper/b")), gid_of(&vol.join("sub/deeper/b"))), (0o644, GID));
    // The links themselves get the group; their targets are untouched.
    assert_eq!(gid_of(&vol.join("link")), GID);
    assert_eq!((common::mode_of(&outside), gid_of(&outside)), (0o600, 0));
    assert_eq!((common::mode_of(t.path()), gid_of(t.path())), top_before);
    // Owners stay.
    assert_eq!(uid_of(&vol.join("a")), 0);
    assert!(!requires_change(&vol, GID, true));
    assert!(requires_change(&vol, GID + 1, true));

    // A writable volume gets group write.
    set_volume_ownership(&vol, GID, false).expect("ownership");
    assert_eq!(common::mode_of(&vol.join("a")), 0o660);
    assert_eq!(common::mode_of(&vol), 0o2775);
    assert_eq!(common::mode_of(&outside), 0o600);

    // A symlink as the root is refused.
    let err = set_volume_ownership(&vol.join("dirlink"), GID, true).err().map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("not a directory")), "a symlinked root is refused");
}

fn files(entries: &[(&str, &str, u32)]) -> Arc<FileSet> {
    Arc::new(
        entries
            .iter()
            .map(|(p, d, m)| (p.to_string(), FileEntry { data: d.as_bytes().to_vec().into(), mode: *m }))
            .collect(),
    )
}

fn desired(name: &str, source: VolumeSource, fs_group: Option<u32>) -> DesiredVolume {
    let fs_group = fs_group.and_then(|gid| {
        let sc = k8s_openapi::api::core::v1::PodSecurityContext {
            fs_group: Some(i64::from(gid)),
            ..Default::default()
        };
        FsGroup::for_volume(Some(&sc), &source, false)
    });
    DesiredVolume {
        pod_uid: "uid-ownership".into(),
        namespace: "default".into(),
        pod_name: "p".into(),
        name: name.into(),
        plugin: source.plugin(),
        source: Ok(source),
        memory_limit: Some(16 << 20),
        fs_group,
    }
}

/// The files of an atomic-writer volume: `(ts dir, file)` modes and groups.
fn data_modes(dir: &Path, file: &str) -> ((u32, u32), (u32, u32)) {
    let ts = std::fs::read_link(dir.join("..data")).expect("..data");
    let ts = dir.join(ts);
    let f = ts.join(file);
    ((common::mode_of(&ts), gid_of(&ts)), (common::mode_of(&f), gid_of(&f)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_writer_volumes_are_world_traversable_and_get_the_fs_group() {
    if !common::have_root("atomic_writer_volumes_are_world_traversable_and_get_the_fs_group") {
        return;
    }
    let t = common::TestDir::new();
    let host = HostVolumes::new(t.path());

    // A configMap without fsGroup: a 0777 directory on disk, 0755 timestamped dir, the files' modes.
    let cm = desired(
        "cm",
        VolumeSource::files(Plugin::ConfigMap, (*files(&[("data-1", "value-1", 0o644)])).clone()),
        None,
    );
    host.set_up(&cm).await.expect("configMap set up");
    let dir = volume_path(t.path(), &cm);
    assert_eq!((common::mode_of(&dir), gid_of(&dir)), (0o777, 0));
    assert_eq!(data_modes(&dir, "data-1"), ((0o755, 0), (0o644, 0)));

    // A secret with defaultMode 0440 and an fsGroup: a tmpfs root 1777 plus setgid, the group on
    // everything, the files group-readable.
    let secret = desired(
        "secret",
        VolumeSource::files(
            Plugin::Secret,
            (*files(&[("data-1", "value-1", 0o440), ("d/x", "y", 0o400)])).clone(),
        ),
        Some(GID),
    );
    host.set_up(&secret).await.expect("secret set up");
    let dir = volume_path(t.path(), &secret);
    let _guard = common::MountGuard(dir.clone());
    assert_eq!((common::mode_of(&dir), gid_of(&dir)), (0o3777, GID));
    assert_eq!(data_modes(&dir, "data-1"), ((0o2755, GID), (0o440, GID)));
    assert_eq!(data_modes(&dir, "d/x").1, (0o440, GID));
    assert_eq!(gid_of(&dir.join("..data")), GID);
    assert_eq!(gid_of(&dir.join("data-1")), GID);

    // New content: written again with the group.
    let updated = desired(
        "secret",
        VolumeSource::files(Plugin::Secret, (*files(&[("data-1", "value-2", 0o440)])).clone()),
        Some(GID),
    );
    host.set_up(&updated).await.expect("secret update");
    assert_eq!(data_modes(&dir, "data-1"), ((0o2755, GID), (0o440, GID)));
    assert_eq!(std::fs::read_to_string(dir.join("data-1")).ok().as_deref(), Some("value-2"));

    // An emptyDir with fsGroup: 0777 plus setgid, the group.
    let empty = desired("scratch", VolumeSource::EmptyDir { memory: false, size_limit: None }, Some(GID));
    host.set_up(&empty).await.expect("emptyDir set up");
    let dir = volume_path(t.path(), &empty);
    assert_eq!((common::mode_of(&dir), gid_of(&dir)), (0o2777, GID));

    for v in [&cm, &secret, &empty] {
        let actual = host.set_up(v).await.expect("idempotent set up");
        let op = nodelet_resources::volume::ops::VolumeOp::TearDown { plugin: v.plugin, path: actual.path };
        host.tear_down(&v.key(), &op).await.expect("tear down");
    }
}
