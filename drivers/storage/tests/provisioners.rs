//! The provisioners against the real host (root): local directories, LVM on a loop device the
//! test sets up, and the binding records on disk.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use k8s_openapi::api::storage::v1::StorageClass;
use nodelet_resources::claim::actual::{ClaimActual, ClaimPhase, PvcActual};
use nodelet_resources::claim::binding::NodeInfo;
use nodelet_resources::claim::desired::{ClaimKey, ClaimRef};
use nodelet_resources::claim::driver::{ClaimRecords, ProvisionRequest, Provisioner};
use nodelet_storage::local::LocalDirProvisioner;
use nodelet_storage::lvm::{Activation, LvmProvisioner};
use nodelet_storage::records::FileRecords;

fn request(volume: &str, provisioner: &str, capacity: u64) -> ProvisionRequest {
    let class: StorageClass =
        serde_saphyr::from_str(&format!("metadata: {{name: c}}\nprovisioner: {provisioner}\n")).unwrap();
    ProvisionRequest {
        volume_name: volume.into(),
        claim: ClaimRef { namespace: "default".into(), name: "data".into(), uid: "u-1".into() },
        class: Arc::new(class),
        capacity,
        access_modes: vec!["ReadWriteOnce".into()],
        volume_mode: "Filesystem".into(),
        node: NodeInfo::new("node-a"),
    }
}

#[tokio::test]
async fn local_directories_are_created_and_deleted_safely() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let p = LocalDirProvisioner::new(&base, "node-a");
    let pv = p.provision(&request("pvc-1", nodelet_storage::local::NAME, 1 << 30)).await.unwrap();
    let path = base.join("pvc-1");
    assert!(path.is_dir());
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o777);
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.local.unwrap().path, path.to_string_lossy());
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(spec.claim_ref.unwrap().name.as_deref(), Some("data"));
    assert!(NodeInfo::new("node-a").admits(&pv));
    assert!(!NodeInfo::new("node-b").admits(&pv));
    // Idempotent.
    std::fs::write(path.join("keep"), b"x").unwrap();
    p.provision(&request("pvc-1", nodelet_storage::local::NAME, 1 << 30)).await.unwrap();
    assert!(path.join("keep").exists());
    // A symlink inside is unlinked, never followed.
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"y").unwrap();
    std::os::unix::fs::symlink(&outside, path.join("link")).unwrap();
    p.delete(&pv).await.unwrap();
    assert!(!path.exists());
    assert!(outside.join("precious").exists());
    // Deleting again is fine.
    p.delete(&pv).await.unwrap();
    // A volume pretending to live elsewhere is refused.
    let mut foreign = pv.clone();
    foreign.spec.as_mut().unwrap().local.as_mut().unwrap().path = outside.to_string_lossy().into_owned();
    assert!(p.delete(&foreign).await.unwrap_err().message.contains("refusing"));
    assert!(outside.join("precious").exists());
    // A symlink planted at the volume path is not used.
    std::os::unix::fs::symlink(&outside, base.join("pvc-2")).unwrap();
    let err = p.provision(&request("pvc-2", nodelet_storage::local::NAME, 1)).await.unwrap_err();
    assert!(err.message.contains("not a directory"), "{}", err.message);
    // Bad names never reach the file system.
    assert!(p.provision(&request("../x", nodelet_storage::local::NAME, 1)).await.is_err());
}

#[tokio::test]
async fn local_delete_refuses_a_mount_beneath() {
    if !nix_root() {
        eprintln!("skipping: needs root for mounts");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let p = LocalDirProvisioner::new(&base, "node-a");
    let pv = p.provision(&request("pvc-m", nodelet_storage::local::NAME, 1)).await.unwrap();
    let inner = base.join("pvc-m").join("mnt");
    std::fs::create_dir(&inner).unwrap();
    nodelet_host::mounts::mount_tmpfs(&inner, Some(1 << 20), 0o755).unwrap();
    std::fs::write(inner.join("file"), b"z").unwrap();
    let err = p.delete(&pv).await.unwrap_err();
    nodelet_host::mounts::unmount(&inner).unwrap();
    assert!(err.message.contains("mount"), "{}", err.message);
    assert!(base.join("pvc-m").exists());
    p.delete(&pv).await.unwrap();
    assert!(!base.join("pvc-m").exists());
}

fn nix_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[tokio::test]
async fn a_corrupt_record_is_moved_aside_and_the_others_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let records = FileRecords::new(tmp.path());
    let key = ClaimKey::claim("default", "data");
    let actual = ClaimActual::Claim(PvcActual {
        uid: "u-1".into(),
        volume: Some("pv-1".into()),
        phase: ClaimPhase::Bound,
        provisioned: None,
    });
    records.save(&key, &actual).await.unwrap();
    // A record cut short (as a crash with a non-durable writer would leave it).
    let broken = tmp.path().join("records").join("pvc_default_other.json");
    std::fs::write(&broken, b"{\"key\": {\"Claim\"").unwrap();
    let no_tmp = std::fs::read_dir(tmp.path().join("records")).unwrap().count();
    assert_eq!(no_tmp, 2, "the durable writer leaves no temporary file");
    let again = FileRecords::new(tmp.path());
    assert_eq!(again.load().await.unwrap(), vec![(key, actual)], "the good record is kept");
    assert!(!broken.exists(), "the broken record is not read again");
    let aside: Vec<String> = std::fs::read_dir(tmp.path().join("records"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("pvc_default_other.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "it was moved aside, content kept");
    let kept = std::fs::read(tmp.path().join("records").join(&aside[0])).unwrap();
    assert_eq!(kept, b"{\"key\": {\"Claim\"");
    assert_eq!(again.load().await.unwrap().len(), 1, "a second start reads only the good record");
}

#[tokio::test]
async fn file_records_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let records = FileRecords::new(tmp.path());
    let key = ClaimKey::claim("default", "data");
    let actual = ClaimActual::Claim(PvcActual {
        uid: "u-1".into(),
        volume: Some("pv-1".into()),
        phase: ClaimPhase::Bound,
        provisioned: None,
    });
    records.save(&key, &actual).await.unwrap();
    let p = LocalDirProvisioner::new(tmp.path().join("base"), "node-a");
    let pv = p.provision(&request("pvc-9", nodelet_storage::local::NAME, 1)).await.unwrap();
    records.save_volume(&pv).await.unwrap();
    let again = FileRecords::new(tmp.path());
    assert_eq!(again.load().await.unwrap(), vec![(key.clone(), actual)]);
    assert_eq!(again.load_volumes().await.unwrap(), vec![pv]);
    again.remove(&key).await.unwrap();
    again.remove_volume("pvc-9").await.unwrap();
    assert!(again.load().await.unwrap().is_empty());
    assert!(again.load_volumes().await.unwrap().is_empty());
    // Keys that could escape the directory are refused.
    assert!(
        again
            .save(
                &ClaimKey::Volume("../x".into()),
                &ClaimActual::Claim(PvcActual {
                    uid: String::new(),
                    volume: None,
                    phase: ClaimPhase::Pending,
                    provisioned: None
                })
            )
            .await
            .is_err()
    );
}

/// Loop devices with one volume group over them, torn down on drop (even when the test fails).
struct LoopVg {
    files: Vec<PathBuf>,
    devices: Vec<String>,
    vg: String,
    mount_root: PathBuf,
    /// LVM's metadata tools need `--driverloaded n` on a kernel without device-mapper.
    lvm_args: Vec<&'static str>,
}

impl Drop for LoopVg {
    fn drop(&mut self) {
        // Unmount anything left under the mount root, then the volumes' loop devices (loop
        // activation), the VG, the PVs, the test's loop devices.
        if let Ok(mounts) = nodelet_host::mounts::mounts_under(&self.mount_root) {
            for m in mounts.iter().rev() {
                let _ = nodelet_host::mounts::unmount(m);
            }
        }
        for dev in &self.devices {
            for over in loops_backed_by(dev) {
                let _ = Command::new("losetup").args(["-d", &over]).output();
            }
        }
        let _ = Command::new("vgremove").args(&self.lvm_args).args(["-f", "-y", &self.vg]).output();
        for dev in &self.devices {
            let _ = Command::new("pvremove").args(&self.lvm_args).args(["-f", "-y", dev]).output();
            let _ = Command::new("losetup").args(["-d", dev]).output();
        }
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The loop devices whose backing file is `device`.
fn loops_backed_by(device: &str) -> Vec<String> {
    run("losetup", &["-n", "-l", "-O", "NAME,BACK-FILE"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, back) = (f.next()?, f.next()?);
            (back == device).then(|| name.to_owned())
        })
        .collect()
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!("{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn require() -> bool {
    std::env::var("NODELET_REQUIRE_RUNTIME").is_ok_and(|v| v == "1")
}

/// The logical volumes of `vg`.
fn lvs(setup: &LoopVg) -> String {
    let mut args = setup.lvm_args.clone();
    args.extend(["--noheadings", "-o", "lv_name", setup.vg.as_str()]);
    run("lvs", &args).unwrap()
}

#[tokio::test]
async fn lvm_volumes_in_a_group_of_two_loop_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let vg = format!("nodelet-test-{}", std::process::id());
    let activation = Activation::detect();
    let mut setup = LoopVg {
        files: Vec::new(),
        devices: Vec::new(),
        vg: vg.clone(),
        mount_root: tmp.path().join("plugins"),
        lvm_args: if activation == Activation::Loop { vec!["--driverloaded", "n"] } else { Vec::new() },
    };
    // Two 160 MiB disks as one group (the "dynamic local volume" pattern).
    for i in 0..2 {
        let file = PathBuf::from(format!("/tmp/nodelet-lvm-{}-{i}.img", std::process::id()));
        run("truncate", &["-s", "160M", &file.to_string_lossy()]).unwrap();
        setup.files.push(file.clone());
        match run("losetup", &["--find", "--show", &file.to_string_lossy()]) {
            Ok(dev) => setup.devices.push(dev),
            Err(e) => {
                assert!(!require(), "no loop device support: {e}");
                eprintln!("skipping: no loop device support: {e}");
                return;
            }
        }
    }
    eprintln!("LVM activation on this kernel: {activation:?}");
    let lvm = setup.lvm_args.clone();
    for dev in &setup.devices {
        run("pvcreate", &[lvm.as_slice(), &["-f", "-y", dev]].concat()).unwrap();
    }
    let devices: Vec<&str> = setup.devices.iter().map(String::as_str).collect();
    run("vgcreate", &[lvm.as_slice(), &[vg.as_str()], devices.as_slice()].concat()).unwrap();

    let p = LvmProvisioner::new(&vg, tmp.path(), "node-a").unwrap();
    assert_eq!(p.activation(), activation);
    let pv = p.provision(&request("pvc-lvm-1", nodelet_storage::lvm::NAME, 64 << 20)).await.unwrap();
    let target = p.mount_path("pvc-lvm-1");
    assert_eq!(pv.spec.as_ref().unwrap().local.as_ref().unwrap().path, target.to_string_lossy());
    assert!(nodelet_host::mounts::is_mount_point(&target).unwrap());
    assert!(lvs(&setup).contains("pvc-lvm-1"));
    // It is an ext4 file system of about the requested size, writable.
    let st = rustix::fs::statvfs(&target).unwrap();
    let size = st.f_blocks * st.f_frsize;
    assert!(size > 40 << 20 && size <= 64 << 20, "size {size}");
    std::fs::write(target.join("data"), b"kept").unwrap();
    let stats = nodelet_storage::stats::fs_stats(&target).unwrap();
    assert!(stats.capacity_bytes > 0 && stats.used_bytes > 0 && stats.inodes_used > 0);
    // Provisioning again neither reformats nor remounts.
    p.provision(&request("pvc-lvm-1", nodelet_storage::lvm::NAME, 64 << 20)).await.unwrap();
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
    assert_eq!(nodelet_host::mounts::mounts_under(&target).unwrap().len(), 1);

    // More than one disk holds: a second volume of 120 MiB fits in no gap of the first disk
    // beside the first volume, so it lands on the second disk.
    let pv2 = p.provision(&request("pvc-lvm-2", nodelet_storage::lvm::NAME, 120 << 20)).await.unwrap();
    let target2 = p.mount_path("pvc-lvm-2");
    std::fs::write(target2.join("other"), b"second").unwrap();
    let mut args = lvm.clone();
    args.extend(["--noheadings", "-o", "lv_name,devices", vg.as_str()]);
    let placed = run("lvs", &args).unwrap();
    let disk_of = |lv: &str| {
        placed
            .lines()
            .find(|l| l.contains(lv))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("")
            .to_owned()
    };
    assert_ne!(disk_of("pvc-lvm-1").split('(').next(), disk_of("pvc-lvm-2").split('(').next(), "{placed}");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept", "the volumes overlap");

    // After a "reboot" (unmounted), restore mounts it again with its data.
    nodelet_host::mounts::unmount(&target).unwrap();
    p.restore(&pv).await.unwrap();
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
    // Delete unmounts and removes the logical volume; its successor on the same extents starts
    // empty (no file system, no data of the one before).
    p.delete(&pv).await.unwrap();
    assert!(!target.exists());
    assert!(!lvs(&setup).contains("pvc-lvm-1"));
    p.delete(&pv).await.unwrap();
    p.provision(&request("pvc-lvm-3", nodelet_storage::lvm::NAME, 64 << 20)).await.unwrap();
    let target3 = p.mount_path("pvc-lvm-3");
    let entries: Vec<_> = std::fs::read_dir(&target3)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lost+found")
        .collect();
    assert!(entries.is_empty(), "a new volume shows an earlier one's files: {entries:?}");
    assert_eq!(std::fs::read(target2.join("other")).unwrap(), b"second");
    p.delete(&pv2).await.unwrap();
    // Names that could be options or paths never reach a command.
    assert!(LvmProvisioner::new("-vg", tmp.path(), "n").is_err());
    assert!(p.provision(&request("--help", nodelet_storage::lvm::NAME, 1)).await.is_err());
    let mut foreign = pv.clone();
    foreign
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(nodelet_storage::lvm::ANN_VOLUME_GROUP.into(), "other".into());
    assert!(p.delete(&foreign).await.is_err());
    drop(setup);
}
