//! hostPath type checks on real files: every type, including a live UNIX socket and /dev/null.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nodelet_host::hostpath::{HostPathError, HostPathType, check_host_path};

fn kind(s: &str) -> HostPathType {
    HostPathType::parse(Some(s)).expect("known type")
}

fn wrong(path: &Path, k: &str) -> String {
    match check_host_path(path, kind(k)) {
        Ok(()) => panic!("{} accepted as {k}", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_type_accepts_its_kind_and_rejects_others() {
    let t = common::TestDir::new();
    let dir = t.path().join("dir");
    let file = t.path().join("file");
    let sock = t.path().join("app.sock");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(&file, "x").expect("write");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind socket");
    let dev_null = Path::new("/dev/null");

    check_host_path(&dir, kind("Directory")).expect("dir");
    check_host_path(&dir, kind("DirectoryOrCreate")).expect("existing dir");
    check_host_path(&file, kind("File")).expect("file");
    check_host_path(&file, kind("FileOrCreate")).expect("existing file");
    check_host_path(&sock, kind("Socket")).expect("socket");
    check_host_path(dev_null, kind("CharDevice")).expect("/dev/null");
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "x", "FileOrCreate keeps an existing file");

    assert_eq!(
        wrong(&file, "Directory"),
        format!("hostPath type check failed: {file:?} is not a directory (it is a file)")
    );
    assert_eq!(
        wrong(&dir, "File"),
        format!("hostPath type check failed: {dir:?} is not a file (it is a directory)")
    );
    assert_eq!(
        wrong(&file, "DirectoryOrCreate"),
        format!("hostPath type check failed: {file:?} is not a directory (it is a file)")
    );
    assert_eq!(
        wrong(&dir, "FileOrCreate"),
        format!("hostPath type check failed: {dir:?} is not a file (it is a directory)")
    );
    assert_eq!(
        wrong(&file, "Socket"),
        format!("hostPath type check failed: {file:?} is not a socket file (it is a file)")
    );
    assert_eq!(
        wrong(&sock, "CharDevice"),
        format!("hostPath type check failed: {sock:?} is not a character device (it is a socket file)")
    );
    assert_eq!(
        wrong(dev_null, "BlockDevice"),
        "hostPath type check failed: \"/dev/null\" is not a block device (it is a character device)"
    );
    assert_eq!(
        wrong(dev_null, "File"),
        "hostPath type check failed: \"/dev/null\" is not a file (it is a character device)"
    );
    let missing = t.path().join("missing");
    for k in ["Directory", "File", "Socket", "CharDevice", "BlockDevice"] {
        assert_eq!(
            wrong(&missing, k),
            format!("hostPath type check failed: {missing:?} does not exist (type \"{k}\")")
        );
    }
    assert!(!missing.exists(), "the checking types never create");

    // Unset checks nothing at all, like the kubelet.
    check_host_path(&missing, HostPathType::Unset).expect("unset");
    check_host_path(&file, HostPathType::parse(Some("")).expect("empty")).expect("unset");

    // Block devices: any the machine has.
    let block = std::fs::read_dir("/dev").expect("/dev").filter_map(Result::ok).map(|e| e.path()).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
    });
    match block {
        Some(b) => check_host_path(&b, kind("BlockDevice")).expect("block device"),
        None => eprintln!("no block device in /dev: BlockDevice acceptance not exercised"),
    }
}

#[test]
fn or_create_types_create_with_the_kubelet_modes() {
    let t = common::TestDir::new();
    let old_umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let deep = t.path().join("a/b/c");
    let made = check_host_path(&deep, kind("DirectoryOrCreate"));
    let file = t.path().join("a/new.log");
    let made_file = check_host_path(&file, kind("FileOrCreate"));
    rustix::process::umask(old_umask);
    made.expect("DirectoryOrCreate");
    made_file.expect("FileOrCreate");
    for d in ["a", "a/b", "a/b/c"] {
        let mode = std::fs::metadata(t.path().join(d)).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "{d} (whatever the umask)");
    }
    let m = std::fs::metadata(&file).expect("stat");
    assert!(m.is_file() && m.len() == 0);
    assert_eq!(m.permissions().mode() & 0o7777, 0o644);

    // FileOrCreate needs the parent, like the kubelet.
    let orphan = t.path().join("no/such/dir/f");
    assert!(matches!(
        check_host_path(&orphan, kind("FileOrCreate")),
        Err(HostPathError::ParentMissing { .. })
    ));
    assert!(!t.path().join("no").exists());
}

#[test]
fn symlinks_are_followed_for_checks_but_never_created_through() {
    let t = common::TestDir::new();
    let real = t.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    std::os::unix::fs::symlink(&real, t.path().join("link")).expect("symlink");
    // stat follows, as the kubelet's check does.
    check_host_path(&t.path().join("link"), kind("Directory")).expect("symlink to a dir is a dir");
    // A dangling symlink is not a file, and FileOrCreate does not create its target.
    let target = t.path().join("elsewhere");
    std::os::unix::fs::symlink(&target, t.path().join("dangling")).expect("symlink");
    let e = check_host_path(&t.path().join("dangling"), kind("FileOrCreate"));
    assert!(e.is_err(), "{e:?}");
    assert!(!target.exists(), "nothing created through the symlink");

    for (bad, reason) in
        [("relative/p", "must be an absolute path"), ("/tmp/../etc", "must not contain \"..\"")]
    {
        match check_host_path(Path::new(bad), kind("DirectoryOrCreate")) {
            Err(HostPathError::InvalidPath { reason: r, .. }) => assert_eq!(r, reason),
            other => panic!("{bad}: {other:?}"),
        }
    }
    let e = HostPathType::parse(Some("Dir")).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("hostPath type \"Dir\" is not supported"), "{e}");
}
