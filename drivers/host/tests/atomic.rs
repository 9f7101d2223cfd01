//! The atomic writer: what a running container sees across updates, the on-disk layout, no stale
//! directories, no-ops, and refusals to follow or delete what it does not own.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use nodelet_host::atomic::{AtomicError, write_atomic};
use nodelet_host::files::{FileEntry, FileSet};

fn set(entries: &[(&str, &str, u32)]) -> FileSet {
    entries
        .iter()
        .map(|(p, d, m)| (p.to_string(), FileEntry { data: d.as_bytes().to_vec().into(), mode: *m }))
        .collect()
}

fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn ts_dirs(dir: &Path) -> Vec<String> {
    listing(dir)
        .into_iter()
        .filter(|n| n.starts_with("..") && n.as_bytes().get(2).is_some_and(u8::is_ascii_digit))
        .collect()
}

fn read_at(dir: &std::fs::File, rel: &str) -> std::io::Result<String> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(dir, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    let mut s = String::new();
    std::fs::File::from(fd).read_to_string(&mut s)?;
    Ok(s)
}

#[test]
fn update_is_seen_through_paths_opened_before_and_leaves_no_stale_dirs() {
    let t = common::TestDir::new();
    let vol = t.path().join("vol");
    std::fs::create_dir(&vol).expect("mkdir");
    let v1 = set(&[("a", "one", 0o644), ("b", "bee", 0o644), ("sub/c", "see", 0o600)]);
    assert!(write_atomic(&vol, &v1).expect("write v1"));
    let first_ts = ts_dirs(&vol);
    assert_eq!(first_ts.len(), 1);
    assert_eq!(
        listing(&vol),
        BTreeSet::from(["..data".into(), first_ts[0].clone(), "a".into(), "b".into(), "sub".into()])
    );
    assert_eq!(std::fs::read_link(vol.join("..data")).ok(), Some(first_ts[0].clone().into()));
    assert_eq!(std::fs::read_link(vol.join("sub")).ok(), Some("..data/sub".into()));
    assert_eq!(common::mode_of(&vol.join(&first_ts[0])), 0o755);

    // What a container holds: the volume directory (its bind mount, when root) and an open file.
    let dir_handle = std::fs::File::open(&vol).expect("open dir");
    let mut old_file = std::fs::File::open(vol.join("a")).expect("open a");
    let container = t.path().join("container");
    let _guard = common::have_root("atomic bind").then(|| {
        std::fs::create_dir(&container).expect("mkdir");
        rustix::mount::mount_bind(&vol, &container).expect("bind volume like a runtime does");
        common::MountGuard(container.clone())
    });

    let v2 = set(&[("a", "two", 0o644), ("sub/d", "dee", 0o644)]);
    assert!(write_atomic(&vol, &v2).expect("write v2"));
    assert_eq!(read_at(&dir_handle, "a").expect("a"), "two", "new content through the old directory handle");
    assert_eq!(read_at(&dir_handle, "sub/d").expect("sub/d"), "dee");
    assert!(read_at(&dir_handle, "b").is_err(), "removed key is gone");
    assert!(read_at(&dir_handle, "sub/c").is_err(), "removed nested key is gone");
    let mut old = String::new();
    old_file.read_to_string(&mut old).expect("read old");
    assert_eq!(old, "one", "an already open file keeps its consistent old content");
    if _guard.is_some() {
        assert_eq!(
            std::fs::read_to_string(container.join("a")).expect("a"),
            "two",
            "seen inside the 'container'"
        );
        assert!(!container.join("b").exists());
    }
    let second_ts = ts_dirs(&vol);
    assert_eq!(second_ts.len(), 1, "old timestamped dir removed: {:?}", listing(&vol));
    assert_ne!(second_ts, first_ts);
    assert_eq!(
        listing(&vol),
        BTreeSet::from(["..data".into(), second_ts[0].clone(), "a".into(), "sub".into()])
    );

    // Identical content and modes: nothing changes.
    assert!(!write_atomic(&vol, &v2).expect("write v2 again"));
    assert_eq!(ts_dirs(&vol), second_ts);
    // A mode change alone is applied.
    let v3 = set(&[("a", "two", 0o600), ("sub/d", "dee", 0o644)]);
    assert!(write_atomic(&vol, &v3).expect("write v3"));
    assert_eq!(common::mode_of(&vol.join("..data/a")), 0o600);
    assert_eq!(ts_dirs(&vol).len(), 1);
    // Empty content: everything visible goes.
    assert!(write_atomic(&vol, &FileSet::new()).expect("write empty"));
    assert_eq!(listing(&vol).into_iter().filter(|n| !n.starts_with("..")).count(), 0);
}

#[test]
fn crash_leftovers_are_cleaned_and_nothing_outside_is_followed() {
    let t = common::TestDir::new();
    let vol = t.path().join("vol");
    let victim = t.path().join("victim");
    std::fs::create_dir_all(&vol).expect("mkdir");
    std::fs::create_dir_all(&victim).expect("mkdir");
    std::fs::write(victim.join("precious"), "keep me").expect("write");
    // A `..data` pointing outside, a timestamped-looking symlink to the victim, a leftover tmp link, a
    // crash-left timestamped dir and a user-visible name pointing at a host file.
    std::os::unix::fs::symlink(&victim, vol.join("..data")).expect("symlink");
    std::os::unix::fs::symlink(&victim, vol.join("..2020_01_01_00_00_00.1")).expect("symlink");
    std::os::unix::fs::symlink(&victim, vol.join("..data_tmp")).expect("symlink");
    std::fs::create_dir(vol.join("..2020_01_01_00_00_00.2")).expect("mkdir");
    std::fs::write(vol.join("..2020_01_01_00_00_00.2/old"), "x").expect("write");
    std::os::unix::fs::symlink("/etc/hostname", vol.join("a")).expect("symlink");

    assert!(write_atomic(&vol, &set(&[("a", "new", 0o644)])).expect("write"));
    assert_eq!(std::fs::read_to_string(victim.join("precious")).expect("victim"), "keep me");
    assert_eq!(std::fs::read_link(vol.join("a")).ok(), Some("..data/a".into()));
    assert_eq!(std::fs::read_to_string(vol.join("a")).expect("a"), "new");
    let ts = ts_dirs(&vol);
    assert_eq!(ts.len(), 1, "{:?}", listing(&vol));
    assert!(!ts[0].starts_with("..2020"));
    assert_eq!(listing(&vol), BTreeSet::from(["..data".into(), ts[0].clone(), "a".into()]));
}

#[test]
fn foreign_files_are_not_replaced() {
    let t = common::TestDir::new();
    std::fs::write(t.path().join("a"), "not ours").expect("write");
    let e = write_atomic(t.path(), &set(&[("a", "new", 0o644)]));
    assert!(matches!(e, Err(AtomicError::Occupied { ref name, .. }) if name == "a"), "{e:?}");
    assert_eq!(std::fs::read_to_string(t.path().join("a")).expect("a"), "not ours");
    assert!(ts_dirs(t.path()).is_empty(), "refused before writing anything");
    // A regular directory named ..data is not ours either.
    let t2 = common::TestDir::new();
    std::fs::create_dir(t2.path().join("..data")).expect("mkdir");
    assert!(matches!(write_atomic(t2.path(), &set(&[("x", "", 0o644)])), Err(AtomicError::Occupied { .. })));
    // Unclean paths are refused.
    assert!(matches!(
        write_atomic(t.path(), &set(&[("../x", "", 0o644)])),
        Err(AtomicError::InvalidPath { .. })
    ));
}
