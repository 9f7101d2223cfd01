//! Real mounts (root): tmpfs with a size limit, unmount idempotence, mountinfo listing, and a tree
//! removal that refuses to delete through a leftover bind mount.

mod common;

use std::io::Write;
use std::path::PathBuf;

use nodelet_host::atomic::write_atomic;
use nodelet_host::files::{FileEntry, FileSet};
use nodelet_host::mounts::{self, MountError};

#[test]
fn tmpfs_size_limit_and_mode_hold() {
    if !common::have_root("tmpfs_size_limit_and_mode_hold") {
        return;
    }
    let t = common::TestDir::new();
    let target = t.path().join("mem");
    std::fs::create_dir(&target).expect("mkdir");
    mounts::mount_tmpfs(&target, Some(1 << 20), 0o777).expect("mount tmpfs");
    assert!(mounts::is_mount_point(&target).expect("is_mount_point"));
    assert_eq!(common::mode_of(&target), 0o777);
    assert!(matches!(mounts::mount_tmpfs(&target, None, 0o777), Err(MountError::AlreadyMounted { .. })));
    let mut f = std::fs::File::create(target.join("big")).expect("create");
    let chunk = vec![7u8; 64 << 10];
    let mut written = 0usize;
    let err = loop {
        match f.write_all(&chunk).and_then(|()| f.flush()) {
            Ok(()) => written += chunk.len(),
            Err(e) => break e,
        }
        assert!(written <= 4 << 20, "wrote {written} bytes into a 1 MiB tmpfs");
    };
    assert_eq!(err.raw_os_error(), Some(rustix::io::Errno::NOSPC.raw_os_error()), "{err}");
    assert!(((512 << 10)..=(1 << 20)).contains(&written), "written {written}");
    drop(f);
    mounts::unmount(&target).expect("unmount");
    assert!(!mounts::is_mount_point(&target).expect("is_mount_point"));
    assert!(!target.join("big").exists(), "the content lived in the tmpfs");
    mounts::unmount(&target).expect("unmounting a non-mount is fine");
    mounts::unmount(&t.path().join("missing")).expect("unmounting a missing path is fine");

    // The target must be a real directory: a symlink is not followed.
    std::os::unix::fs::symlink(&target, t.path().join("link")).expect("symlink");
    let e = mounts::mount_tmpfs(&t.path().join("link"), None, 0o755);
    assert!(matches!(e, Err(MountError::NotADirectory { .. })), "{e:?}");
    assert!(!mounts::is_mount_point(&target).expect("is_mount_point"));
}

#[test]
fn mounts_under_decodes_escapes_and_orders_deepest_first() {
    if !common::have_root("mounts_under_decodes_escapes_and_orders_deepest_first") {
        return;
    }
    let t = common::TestDir::new();
    let spaced = t.path().join("a b\tc");
    let inner = spaced.join("inner");
    let stacked = t.path().join("x");
    std::fs::create_dir_all(&spaced).expect("mkdir");
    std::fs::create_dir_all(&stacked).expect("mkdir");
    mounts::mount_tmpfs(&spaced, None, 0o755).expect("mount");
    std::fs::create_dir(&inner).expect("mkdir inner");
    mounts::mount_tmpfs(&inner, None, 0o755).expect("mount inner");
    mounts::mount_tmpfs(&stacked, None, 0o755).expect("mount x");
    // A second mount stacked on x (mount_tmpfs refuses that; the raw call does not).
    rustix::mount::mount("tmpfs", &stacked, "tmpfs", rustix::mount::MountFlags::empty(), None)
        .expect("stack");

    let found = mounts::mounts_under(t.path()).expect("mounts_under");
    assert_eq!(found, vec![inner.clone(), stacked.clone(), stacked.clone(), spaced.clone()]);
    // A non-canonical spelling finds the same.
    let sloppy = PathBuf::from(format!("{}/./", t.path().display()));
    assert_eq!(mounts::mounts_under(&sloppy).expect("mounts_under"), found);
    assert!(mounts::is_mount_point(&spaced).expect("is_mount_point"));
    for m in &found {
        mounts::unmount(m).expect("unmount in the given order");
    }
    assert!(mounts::mounts_under(t.path()).expect("mounts_under").is_empty());
}

#[test]
fn remove_dir_beneath_refuses_while_a_bind_is_mounted() {
    if !common::have_root("remove_dir_beneath_refuses_while_a_bind_is_mounted") {
        return;
    }
    let t = common::TestDir::new();
    let host = t.path().join("host-data");
    std::fs::create_dir_all(host.join("deep")).expect("mkdir");
    std::fs::write(host.join("precious"), "keep").expect("write");
    std::fs::write(host.join("deep/also"), "keep").expect("write");
    std::fs::write(t.path().join("host-file"), "keep").expect("write");

    let pod = t.path().join("pods/uid-1");
    let bind_dir = pod.join("volumes/kubernetes.io~host-path/data");
    let bind_file = pod.join("volume-subpaths/data/app/0");
    std::fs::create_dir_all(&bind_dir).expect("mkdir");
    std::fs::create_dir_all(bind_file.parent().expect("parent")).expect("mkdir");
    std::fs::write(&bind_file, "").expect("placeholder");
    std::fs::write(pod.join("other"), "x").expect("write");
    std::os::unix::fs::symlink(&host, pod.join("link-to-host")).expect("symlink");
    rustix::mount::mount_bind(&host, &bind_dir).expect("bind dir");
    rustix::mount::mount_bind(t.path().join("host-file"), &bind_file).expect("bind file");

    match mounts::remove_dir_beneath(&pod) {
        Err(MountError::MountsBeneath { mounts, .. }) => assert_eq!(mounts.len(), 2, "{mounts:?}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(pod.join("other").exists(), "nothing removed on refusal");
    assert_eq!(std::fs::read_to_string(host.join("precious")).expect("host"), "keep");

    mounts::unmount(&bind_dir).expect("unmount");
    assert!(
        matches!(mounts::remove_dir_beneath(&pod), Err(MountError::MountsBeneath { .. })),
        "file bind left"
    );
    mounts::unmount(&bind_file).expect("unmount");
    mounts::remove_dir_beneath(&pod).expect("remove");
    assert!(!pod.exists());
    assert_eq!(std::fs::read_to_string(host.join("precious")).expect("host"), "keep");
    assert_eq!(std::fs::read_to_string(host.join("deep/also")).expect("host"), "keep");
    assert_eq!(std::fs::read_to_string(t.path().join("host-file")).expect("host"), "keep");
    mounts::remove_dir_beneath(&pod).expect("a missing dir is fine");
}

#[test]
fn stale_atomic_dir_with_a_mount_inside_is_not_deleted_through() {
    if !common::have_root("stale_atomic_dir_with_a_mount_inside_is_not_deleted_through") {
        return;
    }
    // The per-directory guard of the removal (not the mountinfo pre-check): an old timestamped dir with
    // a mount inside is left alone and the mount's content survives.
    let t = common::TestDir::new();
    let vol = t.path().join("vol");
    std::fs::create_dir(&vol).expect("mkdir");
    let old = vol.join("..2020_01_01_00_00_00.1");
    std::fs::create_dir_all(old.join("m")).expect("mkdir");
    mounts::mount_tmpfs(&old.join("m"), None, 0o755).expect("mount");
    std::fs::write(old.join("m/precious"), "keep").expect("write");
    let files: FileSet = [("a".to_string(), FileEntry { data: b"x".to_vec().into(), mode: 0o644 })].into();
    let e = write_atomic(&vol, &files);
    assert!(e.is_err(), "removal must stop at the mount: {e:?}");
    assert_eq!(std::fs::read_to_string(old.join("m/precious")).expect("mount content"), "keep");
    mounts::unmount(&old.join("m")).expect("unmount");
    assert!(write_atomic(&vol, &files).expect("retry"), "removing the stale dir is a change");
    assert_eq!(std::fs::read_to_string(vol.join("a")).expect("a"), "x");
    assert!(!old.exists());
}
