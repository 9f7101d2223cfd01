//! `HostVolumes::without_mounts` (hollow nodes): memory-backed volumes are plain directories with their
//! files, nothing is mounted, and teardown removes them. Needs no root.

mod common;

use nodelet_host::driver::HostVolumes;
use nodelet_host::files::{FileEntry, FileSet};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeSource, volume_path};
use nodelet_resources::volume::driver::VolumeHost;
use nodelet_resources::volume::ops::VolumeOp;

fn desired(name: &str, source: VolumeSource) -> DesiredVolume {
    DesiredVolume {
        pod_uid: "uid-hollow".into(),
        namespace: "default".into(),
        pod_name: "p".into(),
        name: name.into(),
        plugin: source.plugin(),
        source: Ok(source),
        memory_limit: Some(16 << 20),
        fs_group: None,
    }
}

fn token_files() -> FileSet {
    [("token".to_owned(), FileEntry { data: b"made-up".to_vec().into(), mode: 0o644 })].into_iter().collect()
}

#[tokio::test]
async fn without_mounts_memory_backed_volumes_are_directories_and_nothing_is_mounted() {
    let t = common::TestDir::new();
    let host = HostVolumes::new(t.path()).without_mounts(true);
    let projected = desired("kube-api-access", VolumeSource::files(Plugin::Projected, token_files()));
    let memory = desired("cache", VolumeSource::EmptyDir { memory: true, size_limit: None });
    for v in [&projected, &memory] {
        let actual = host.set_up(v).await.expect("set up");
        assert!(!actual.tmpfs, "{}: reported as a tmpfs", v.name);
        assert_eq!(actual.path, volume_path(t.path(), v));
        assert!(actual.path.is_dir());
    }
    let dir = volume_path(t.path(), &projected);
    assert_eq!(std::fs::read_to_string(dir.join("token")).ok().as_deref(), Some("made-up"));
    let mounts = nodelet_host::mounts::mounts_under(t.path()).expect("mount table");
    assert!(mounts.is_empty(), "mounted: {mounts:?}");
    for v in [&projected, &memory] {
        let op = VolumeOp::TearDown { plugin: v.plugin, path: volume_path(t.path(), v) };
        host.tear_down(&v.key(), &op).await.expect("tear down");
        assert!(!volume_path(t.path(), v).exists(), "{} left behind", v.name);
    }
}
