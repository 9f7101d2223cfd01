//! subPath attacks that must fail (CVE-2017-1002101 / CVE-2021-25741 classes), including a racing
//! symlink swap, and the good cases (root: these bind-mount).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nodelet_host::atomic::write_atomic;
use nodelet_host::files::{FileEntry, FileSet};
use nodelet_host::mounts;
use nodelet_host::subpath::{SubPathError, bind_sub_path, unbind_sub_paths};

struct Setup {
    t: common::TestDir,
    vol: PathBuf,
    subpaths: PathBuf,
}

fn setup() -> Setup {
    let t = common::TestDir::new();
    let vol = t.path().join("pods/uid-1/volumes/kubernetes.io~empty-dir/data");
    let subpaths = t.path().join("pods/uid-1/volume-subpaths/data/app");
    std::fs::create_dir_all(&vol).expect("mkdir");
    std::fs::create_dir_all(&subpaths).expect("mkdir");
    Setup { t, vol, subpaths }
}

fn target(s: &Setup, i: usize) -> PathBuf {
    s.subpaths.join(i.to_string())
}

fn assert_not_host_etc(target: &Path) {
    use std::os::unix::fs::MetadataExt;
    let etc = std::fs::metadata("/etc").expect("/etc");
    if let Ok(m) = std::fs::metadata(target) {
        assert!(!(m.dev() == etc.dev() && m.ino() == etc.ino()), "{} shows host /etc", target.display());
    }
    assert!(
        !target.join("passwd").exists() && !target.join("hostname").exists(),
        "{} shows /etc content",
        target.display()
    );
}

fn unsafe_component(e: Result<(), SubPathError>) -> (String, String) {
    match e {
        Err(SubPathError::Unsafe { component, reason, .. }) => (component, reason),
        other => panic!("expected an unsafe-component error, got {other:?}"),
    }
}

#[test]
fn good_file_and_dir_sub_paths_are_bound_and_unbound() {
    if !common::have_root("good_file_and_dir_sub_paths_are_bound_and_unbound") {
        return;
    }
    let s = setup();
    std::fs::create_dir_all(s.vol.join("conf")).expect("mkdir");
    std::fs::write(s.vol.join("conf/app.yaml"), "port: 1").expect("write");
    std::fs::create_dir_all(s.vol.join("data/www")).expect("mkdir");
    std::fs::write(s.vol.join("data/www/index.html"), "hi").expect("write");

    bind_sub_path(&s.vol, "conf/app.yaml", &target(&s, 0)).expect("file subPath");
    bind_sub_path(&s.vol, "data/www", &target(&s, 1)).expect("dir subPath");
    bind_sub_path(&s.vol, "new/nested", &target(&s, 2)).expect("missing dirs are created");
    assert_eq!(std::fs::read_to_string(target(&s, 0)).expect("read"), "port: 1");
    assert_eq!(std::fs::read_to_string(target(&s, 1).join("index.html")).expect("read"), "hi");
    std::fs::write(target(&s, 2).join("out"), "written by the container").expect("write");
    assert_eq!(
        std::fs::read_to_string(s.vol.join("new/nested/out")).expect("read"),
        "written by the container"
    );
    assert_eq!(common::mode_of(&s.vol.join("new")), 0o750);
    for i in 0..3 {
        assert!(mounts::is_mount_point(&target(&s, i)).expect("is_mount_point"));
    }
    // Idempotent (reconstruction after a restart); a different source on the same target is refused.
    bind_sub_path(&s.vol, "data/www", &target(&s, 1)).expect("same bind again");
    assert!(matches!(bind_sub_path(&s.vol, "conf", &target(&s, 1)), Err(SubPathError::Target { .. })));
    assert_eq!(mounts::mounts_under(&s.subpaths).expect("mounts").len(), 3, "no double mounts");

    unbind_sub_paths(&s.subpaths).expect("unbind");
    assert!(!s.subpaths.exists());
    assert!(mounts::mounts_under(s.t.path()).expect("mounts").is_empty());
    assert_eq!(std::fs::read_to_string(s.vol.join("conf/app.yaml")).expect("volume content kept"), "port: 1");
    assert_eq!(
        std::fs::read_to_string(s.vol.join("new/nested/out")).expect("volume content kept"),
        "written by the container"
    );
    unbind_sub_paths(&s.subpaths).expect("missing dir is fine");
}

#[test]
fn config_map_key_sub_path_follows_in_volume_symlinks() {
    if !common::have_root("config_map_key_sub_path_follows_in_volume_symlinks") {
        return;
    }
    let s = setup();
    let files: FileSet = [
        ("app.yaml".to_string(), FileEntry { data: b"from configmap".to_vec().into(), mode: 0o644 }),
        ("nested/x".to_string(), FileEntry { data: b"nested".to_vec().into(), mode: 0o644 }),
    ]
    .into();
    write_atomic(&s.vol, &files).expect("write");
    // `app.yaml -> ..data/app.yaml -> ..<ts>/app.yaml`: symlinks that stay inside the volume.
    bind_sub_path(&s.vol, "app.yaml", &target(&s, 0)).expect("configMap key as subPath");
    bind_sub_path(&s.vol, "nested/x", &target(&s, 1)).expect("through the nested symlink");
    assert_eq!(std::fs::read_to_string(target(&s, 0)).expect("read"), "from configmap");
    assert_eq!(std::fs::read_to_string(target(&s, 1)).expect("read"), "nested");
    unbind_sub_paths(&s.subpaths).expect("unbind");
}

#[test]
fn escapes_fail_and_name_the_component() {
    if !common::have_root("escapes_fail_and_name_the_component") {
        return;
    }
    let s = setup();
    std::os::unix::fs::symlink("/etc", s.vol.join("etc-link")).expect("symlink");
    std::os::unix::fs::symlink("/", s.vol.join("root-link")).expect("symlink");
    std::os::unix::fs::symlink("../../../../../../../../etc", s.vol.join("up-link")).expect("symlink");
    std::fs::create_dir(s.vol.join("d")).expect("mkdir");
    std::os::unix::fs::symlink("/etc/passwd", s.vol.join("d/passwd-link")).expect("symlink");
    std::os::unix::fs::symlink("loop-b", s.vol.join("loop-a")).expect("symlink");
    std::os::unix::fs::symlink("loop-a", s.vol.join("loop-b")).expect("symlink");
    std::os::unix::fs::symlink("/nonexistent-host-dir", s.vol.join("dangling-abs")).expect("symlink");

    assert!(matches!(bind_sub_path(&s.vol, "../../etc", &target(&s, 0)), Err(SubPathError::Invalid { .. })));
    assert!(matches!(bind_sub_path(&s.vol, "/etc", &target(&s, 0)), Err(SubPathError::Invalid { .. })));

    let (c, r) = unsafe_component(bind_sub_path(&s.vol, "etc-link", &target(&s, 1)));
    assert_eq!(c, "etc-link");
    assert!(r.contains("absolute path \"/etc\""), "{r}");
    let (c, _) = unsafe_component(bind_sub_path(&s.vol, "root-link", &target(&s, 2)));
    assert_eq!(c, "root-link");
    let (c, _) = unsafe_component(bind_sub_path(&s.vol, "root-link/etc/passwd", &target(&s, 3)));
    assert_eq!(c, "root-link", "intermediate component");
    let (c, _) = unsafe_component(bind_sub_path(&s.vol, "etc-link/passwd", &target(&s, 4)));
    assert_eq!(c, "etc-link", "intermediate component");
    let (c, r) = unsafe_component(bind_sub_path(&s.vol, "up-link", &target(&s, 5)));
    assert_eq!(c, "up-link");
    assert!(r.contains("leads outside the volume"), "{r}");
    let (c, _) = unsafe_component(bind_sub_path(&s.vol, "d/passwd-link", &target(&s, 6)));
    assert_eq!(c, "d/passwd-link");
    let (c, r) = unsafe_component(bind_sub_path(&s.vol, "loop-a", &target(&s, 7)));
    assert_eq!(c, "loop-a");
    assert!(r.contains("loop"), "{r}");
    let (c, _) = unsafe_component(bind_sub_path(&s.vol, "dangling-abs/x", &target(&s, 8)));
    assert_eq!(c, "dangling-abs", "no directory is created through an absolute symlink");
    assert!(!Path::new("/nonexistent-host-dir").exists());
    let e =
        bind_sub_path(&s.vol, "etc-link", &target(&s, 1)).err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(
        e,
        "subPath \"etc-link\": component \"etc-link\" is a symlink to the absolute path \"/etc\"; symlinks must stay inside the volume"
    );

    for i in 0..9 {
        assert!(!mounts::is_mount_point(&target(&s, i)).expect("is_mount_point"), "target {i} mounted");
        assert_not_host_etc(&target(&s, i));
    }
    assert!(mounts::mounts_under(s.t.path()).expect("mounts").is_empty());
}

#[test]
fn sub_paths_do_not_cross_mounts_in_the_volume() {
    if !common::have_root("sub_paths_do_not_cross_mounts_in_the_volume") {
        return;
    }
    let s = setup();
    // What a container with Bidirectional propagation could do: mount host /etc inside the volume.
    std::fs::create_dir(s.vol.join("m")).expect("mkdir");
    rustix::mount::mount_bind("/etc", s.vol.join("m")).expect("bind /etc into the volume");
    let _guard = common::MountGuard(s.vol.join("m"));
    let (c, r) = unsafe_component(bind_sub_path(&s.vol, "m", &target(&s, 0)));
    assert_eq!(c, "m");
    assert!(r.contains("mount point"), "{r}");
    let (c, _) = unsafe_component(bind_sub_path(&s.vol, "m/passwd", &target(&s, 1)));
    assert_eq!(c, "m");
    std::os::unix::fs::symlink("m", s.vol.join("to-m")).expect("symlink");
    let _ = unsafe_component(bind_sub_path(&s.vol, "to-m", &target(&s, 2)));
    for i in 0..3 {
        assert_not_host_etc(&target(&s, i));
    }
    mounts::unmount(&s.vol.join("m")).expect("unmount");
}

struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A racing thread keeps exchanging a real directory and a symlink to /etc (RENAME_EXCHANGE, atomic)
/// while binds are attempted: a bind may succeed or fail, but a successful one always shows the real
/// directory, never host /etc.
#[test]
fn racing_symlink_swap_never_exposes_host_etc() {
    if !common::have_root("racing_symlink_swap_never_exposes_host_etc") {
        return;
    }
    let s = setup();
    std::fs::create_dir_all(s.vol.join("swap/sub")).expect("mkdir");
    std::fs::write(s.vol.join("swap/marker"), "volume").expect("write");
    std::fs::write(s.vol.join("swap/sub/marker"), "volume").expect("write");
    std::os::unix::fs::symlink("/etc", s.vol.join("alt")).expect("symlink");

    let stop = Arc::new(AtomicBool::new(false));
    // Stops the swapper even when an assertion fails, before the test directory is removed.
    let _stop_on_drop = StopOnDrop(Arc::clone(&stop));
    let swapper = {
        let stop = Arc::clone(&stop);
        let vol = s.vol.clone();
        std::thread::spawn(move || {
            let dir = rustix::fs::open(
                &vol,
                rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .expect("open vol");
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(&dir, "swap", &dir, "alt", rustix::fs::RenameFlags::EXCHANGE)
                    .expect("exchange");
                swaps += 1;
            }
            swaps
        })
    };
    let (mut ok, mut refused) = (0, 0);
    for i in 0..400 {
        let sub = if i % 2 == 0 { "swap" } else { "swap/sub" };
        let t = target(&s, i);
        match bind_sub_path(&s.vol, sub, &t) {
            Ok(()) => {
                ok += 1;
                assert_eq!(
                    std::fs::read_to_string(t.join("marker")).expect("marker"),
                    "volume",
                    "iteration {i}"
                );
                assert_not_host_etc(&t);
                mounts::unmount(&t).expect("unmount");
            }
            Err(SubPathError::Unsafe { .. }) => refused += 1,
            Err(e) => panic!("iteration {i}: unexpected error {e}"),
        }
        assert_not_host_etc(&t);
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().expect("swapper");
    eprintln!("racing swap: {ok} binds of the real dir, {refused} refused, {swaps} swaps");
    assert!(swaps > 0 && ok + refused == 400);
    unbind_sub_paths(&s.subpaths).expect("unbind");
    assert!(mounts::mounts_under(s.t.path()).expect("mounts").is_empty());
}
