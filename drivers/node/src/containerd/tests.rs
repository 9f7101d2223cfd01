use std::net::Ipv4Addr;

use super::*;

fn cfg_in(root: &Path) -> EmbeddedContainerdConfig {
    let mut c = EmbeddedContainerdConfig::new(root, "localhost/nodelet/pause:3.9");
    if let Some(net) = c.cni_network.as_mut() {
        // a subnet and bridge of its own, inside 198.18.0.0/16, so it never clashes with the test runtime
        net.bridge = "nltest200".into();
        net.subnet = "198.18.210.0/24".parse().expect("cidr");
        net.name = "nodelet-embedded-test".into();
    }
    c
}

#[test]
fn config_has_the_settings_the_target_machines_need() {
    let c = cfg_in(Path::new("/var/lib/nodelet"));
    let toml = render_config(&c, ConfigVersion::V2);
    for line in [
        "version = 2",
        "root = \"/var/lib/nodelet/containerd/root\"",
        "state = \"/var/lib/nodelet/containerd/state\"",
        "address = \"/var/lib/nodelet/containerd/containerd.sock\"",
        "address = \"/var/lib/nodelet/containerd/containerd.sock.ttrpc\"",
        "restrict_oom_score_adj = true",
        "netns_mounts_under_state_dir = true",
        "disable_apparmor = true",
        "SystemdCgroup = false",
        "sandbox_image = \"localhost/nodelet/pause:3.9\"",
        "bin_dir = \"/usr/lib/cni\"",
        "conf_dir = \"/var/lib/nodelet/cni/net.d\"",
        "Root = \"/var/lib/nodelet/containerd/runc\"",
        "config_path = \"/var/lib/nodelet/containerd/certs.d\"",
    ] {
        assert!(toml.lines().any(|l| l.trim() == line), "missing {line:?} in:\n{toml}");
    }
    assert!(!toml.contains("imports"), "no imports without an extra file");
    assert_eq!(c.endpoint(), "unix:///var/lib/nodelet/containerd/containerd.sock");
}

#[test]
fn extra_config_is_imported_and_strings_are_escaped() {
    let mut c = cfg_in(Path::new("/var/lib/nodelet"));
    c.config_extra = Some(PathBuf::from("/etc/nodelet/extra.toml"));
    c.sandbox_image = "reg.example/pause\"x\\y".into();
    let toml = render_config(&c, ConfigVersion::V2);
    assert!(toml.contains("imports = [\"/etc/nodelet/extra.toml\"]"), "{toml}");
    assert!(toml.contains(r#"sandbox_image = "reg.example/pause\"x\\y""#), "{toml}");
    assert_eq!(toml_str("a\nb\u{1}"), "\"a\\nb\\u0001\"");
}

#[test]
fn containerd_2_gets_the_split_cri_plugins_and_version_4_the_server_plugins() {
    let mut c = cfg_in(Path::new("/var/lib/nodelet"));
    c.runc_path = Some(PathBuf::from("/opt/runc/runc"));
    for version in [ConfigVersion::V3, ConfigVersion::V4] {
        let toml = render_config(&c, version);
        let has = |line: &str| toml.lines().any(|l| l.trim() == line);
        for line in [
            format!("version = {}", version.number()).as_str(),
            "[plugins.\"io.containerd.cri.v1.images\"]",
            "sandbox = \"localhost/nodelet/pause:3.9\"",
            "[plugins.\"io.containerd.cri.v1.runtime\"]",
            "bin_dirs = [\"/usr/lib/cni\"]",
            "restrict_oom_score_adj = true",
            "netns_mounts_under_state_dir = true",
            "SystemdCgroup = false",
            "Root = \"/var/lib/nodelet/containerd/runc\"",
            "BinaryName = \"/opt/runc/runc\"",
            "config_path = \"/var/lib/nodelet/containerd/certs.d\"",
            "address = \"/var/lib/nodelet/containerd/containerd.sock\"",
        ] {
            assert!(has(line), "version {version:?}: missing {line:?} in:\n{toml}");
        }
        assert!(!toml.contains("sandbox_image"), "1.6's key is gone in 2.x:\n{toml}");
        let server_plugins = has("[plugins.\"io.containerd.server.v1.grpc\"]");
        assert_eq!(server_plugins, version == ConfigVersion::V4, "{toml}");
        assert_eq!(has("[grpc]"), version == ConfigVersion::V3, "{toml}");
    }
    assert!(
        !render_config(&cfg_in(Path::new("/r")), ConfigVersion::V4).contains("BinaryName"),
        "runc on PATH"
    );
}

#[test]
fn the_config_version_is_the_top_level_version_key() {
    // containerd 1.6 prints other top-level keys first
    let v16 = "disabled_plugins = []\nimports = []\noom_score = 0\nroot = \"/var/lib/containerd\"\nversion = 2\n\n[cgroup]\n";
    assert_eq!(parse_config_version(v16), Some(2));
    assert_eq!(parse_config_version("version = 4\nroot = \"/x\"\n"), Some(4));
    assert_eq!(parse_config_version("  version=3 # comment\n"), Some(3));
    // a `version` inside a table is not the file's version
    assert_eq!(parse_config_version("root = \"/x\"\n[plugins.x]\n  version = 9\n"), None);
    assert_eq!(parse_config_version(""), None);
    assert_eq!(ConfigVersion::from_number(2), Some(ConfigVersion::V2));
    assert_eq!(ConfigVersion::from_number(1), None);
    assert_eq!(ConfigVersion::from_number(5), None);
}

/// A script standing in for containerd: `config default` prints `answer` and exits with `code`.
fn fake_containerd(dir: &Path, answer: &str, code: i32) -> PathBuf {
    std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
    let fake = dir.join("bin/containerd");
    let script = format!(
        "#!/bin/sh\nif [ \"$1 $2\" = \"config default\" ]; then printf '%s\\n' '{answer}'; exit {code}; fi\n\
         echo \"fake containerd: bad config $2\" >&2\nexit 3\n"
    );
    std::fs::write(&fake, script).expect("write");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    fake
}

#[tokio::test]
async fn the_config_version_is_asked_from_the_binary_and_an_unknown_one_is_a_clear_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let v4 = fake_containerd(&tmp.path().join("a"), "version = 4", 0);
    assert_eq!(detect_config_version(&v4).await.expect("v4"), ConfigVersion::V4);
    let v2 = fake_containerd(&tmp.path().join("b"), "root = \"/x\"\nversion = 2", 0);
    assert_eq!(detect_config_version(&v2).await.expect("v2"), ConfigVersion::V2);
    for (name, answer, code, want) in [
        ("c", "version = 9", 0, "reads config version 9"),
        ("d", "root = \"/x\"", 0, "no top-level `version`"),
        ("e", "boom", 1, "`config default` failed"),
    ] {
        let fake = fake_containerd(&tmp.path().join(name), answer, code);
        let err = detect_config_version(&fake).await.expect_err(name).to_string();
        assert!(err.contains(want) && err.contains(&fake.display().to_string()), "{name}: {err}");
    }
    // the embedded containerd refuses to start on such a binary, before writing a config
    let mut cfg = cfg_in(tmp.path());
    cfg.containerd_path = fake_containerd(&tmp.path().join("f"), "version = 1", 0);
    let err = EmbeddedContainerd::start(cfg.clone()).await.expect_err("version 1").to_string();
    assert!(err.contains("reads config version 1"), "{err}");
    assert!(!cfg.config_path().exists());
}

/// The embedded config has exactly the settings `scripts/containerd-config.sh` writes for the test runtime,
/// for every config version (lines compared without comments, blank lines and indentation).
#[test]
fn the_embedded_config_matches_the_test_runtime_script_for_every_version() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd-config.sh");
    let mut c = cfg_in(Path::new("/var/lib/nodelet"));
    c.runc_path = Some(PathBuf::from("/opt/runc/runc"));
    let significant = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    for version in [ConfigVersion::V2, ConfigVersion::V3, ConfigVersion::V4] {
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(&c.dir)
            .arg(c.socket_path())
            .arg("--runc-root")
            .arg(c.dir.join("runc"))
            .arg("--cni-conf-dir")
            .arg(&c.cni_conf_dir)
            .args(["--config-version", &version.number().to_string(), "--runc-binary", "/opt/runc/runc"])
            .output()
            .expect("run containerd-config.sh");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let theirs = significant(&String::from_utf8_lossy(&out.stdout));
        let ours = significant(&render_config(&c, version));
        assert_eq!(ours, theirs, "version {version:?}: the embedded config and the script differ");
        // and without a runc path neither names one
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(&c.dir)
            .arg(c.socket_path())
            .args(["--config-version", &version.number().to_string()])
            .output()
            .expect("run containerd-config.sh");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("BinaryName"), "version {version:?}");
    }
}

#[test]
fn containerd_runs_with_its_own_directory_first_on_path_and_ctr_from_there() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fake = fake_containerd(tmp.path(), "version = 4", 0);
    let bin = tmp.path().join("bin");
    let path = child_path(&fake).expect("a new PATH");
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    assert_eq!(dirs.first(), Some(&bin), "{dirs:?}");
    assert!(dirs.len() > 1, "nodelet's PATH follows: {dirs:?}");
    // ctr: the one beside containerd when it exists, else PATH's
    assert_eq!(find_ctr(Path::new("ctr"), &fake), find_executable(Path::new("ctr")));
    let ctr = bin.join("ctr");
    std::fs::write(&ctr, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&ctr, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(find_ctr(Path::new("ctr"), &fake), Some(ctr));
    assert_eq!(
        find_ctr(Path::new("/bin/sh"), &fake),
        Some(PathBuf::from("/bin/sh")),
        "an explicit path wins"
    );
}

#[test]
fn cni_network_is_a_bridge_without_default_route_with_portmap() {
    let c = cfg_in(Path::new("/r"));
    let net = c.cni_network.as_ref().expect("network");
    let v: serde_json::Value = serde_json::from_str(&render_cni_conflist(net)).expect("valid JSON");
    assert_eq!(v["name"], "nodelet-embedded-test");
    let bridge = &v["plugins"][0];
    assert_eq!(bridge["type"], "bridge");
    assert_eq!(bridge["bridge"], "nltest200");
    assert_eq!(bridge["isGateway"], true);
    assert_eq!(bridge["ipMasq"], false);
    assert!(bridge.get("isDefaultGateway").is_none(), "no default route in pods");
    assert!(bridge["ipam"].get("routes").is_none(), "no routes in pods beyond the subnet");
    assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "198.18.210.0/24");
    assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], "198.18.210.1");
    assert_eq!(bridge["ipam"]["dataDir"], "/r/cni/ipam");
    assert_eq!(v["plugins"][1]["type"], "portmap");
    assert_eq!(v["plugins"][1]["snat"], false);
}

#[test]
fn registry_hosts_use_plain_http() {
    let t = render_registry_hosts("127.0.0.1:5000");
    assert!(t.contains("server = \"http://127.0.0.1:5000\""), "{t}");
    assert!(t.contains("[host.\"http://127.0.0.1:5000\"]"), "{t}");
}

#[test]
fn prepare_writes_the_files_and_respects_an_operators_cni_network() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = cfg_in(tmp.path());
    prepare(&c, ConfigVersion::V2).expect("prepare");
    assert!(c.config_path().is_file());
    assert!(c.dir.join("certs.d/127.0.0.1:5000/hosts.toml").is_file());
    let ours = c.cni_conf_dir.join(CNI_CONFLIST_NAME);
    assert!(ours.is_file(), "an empty net.d gets nodelet's network");
    // idempotent: nothing rewritten
    assert!(
        !write_if_changed(&c.config_path(), &render_config(&c, ConfigVersion::V2)).expect("rewrite check")
    );

    std::fs::write(c.cni_conf_dir.join("05-mine.conflist"), "{}").expect("write");
    prepare(&c, ConfigVersion::V2).expect("prepare again");
    assert!(!ours.exists(), "the operator's network wins: ours is removed");
    assert!(c.cni_conf_dir.join("05-mine.conflist").exists(), "the operator's file is untouched");
}

#[test]
fn socket_paths_too_long_for_unix_sockets_are_refused() {
    let long = PathBuf::from(format!("/tmp/{}", "x".repeat(100)));
    let err = prepare(&cfg_in(&long), ConfigVersion::V4).expect_err("too long");
    assert!(matches!(err, ContainerdError::SocketPathTooLong { .. }), "{err}");
    assert!(err.to_string().contains("--root-dir"), "{err}");
}

#[test]
fn executables_are_found_on_path_or_by_absolute_path() {
    assert_eq!(find_executable(Path::new("sh")).map(|p| p.is_absolute()), Some(true));
    assert_eq!(find_executable(Path::new("/bin/sh")), Some(PathBuf::from("/bin/sh")));
    assert_eq!(find_executable(Path::new("no-such-binary-nodelet")), None);
    let tmp = tempfile::tempdir().expect("tempdir");
    let plain = tmp.path().join("plain");
    std::fs::write(&plain, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(find_executable(&plain), None, "not executable");
}

// ------------------------------------------------------------------------------ against a real containerd

/// The containerd (and runc) of the test runtime, which the embedded containerd tests start their own
/// instance of: so they run on Debian's 1.6 in the whole suite and on containerd 2.x in the second runtime's
/// subset (scripts/test.sh).
struct RealRuntime {
    /// The containerd binary: the one beside `NODELET_TEST_CTR`, else containerd on PATH.
    containerd: PathBuf,
    /// `NODELET_TEST_RUNC_BIN` (the test runtime's runc) when set; else runc on containerd's PATH.
    runc: Option<PathBuf>,
    /// The major version (`NODELET_TEST_CONTAINERD_VERSION`, checked against `containerd --version`).
    major: u32,
}

impl RealRuntime {
    /// `cfg_in(root)` running this containerd and runc.
    fn cfg_in(&self, root: &Path) -> EmbeddedContainerdConfig {
        let mut c = cfg_in(root);
        c.containerd_path = self.containerd.clone();
        c.runc_path = self.runc.clone();
        c
    }
}

/// The test runtime's binaries, or `None` (skip) when no runtime test environment is configured.
fn real_runtime(test: &str) -> Option<RealRuntime> {
    let configured = std::env::var("NODELET_TEST_CRI_ENDPOINT").is_ok_and(|v| !v.trim().is_empty());
    let required = std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1");
    if !configured && !required {
        eprintln!("SKIP {test}: NODELET_TEST_CRI_ENDPOINT is unset (no container runtime to test against)");
        return None;
    }
    let beside_ctr = std::env::var_os("NODELET_TEST_CTR")
        .map(PathBuf::from)
        .and_then(|ctr| ctr.parent().map(|d| d.join("containerd")))
        .and_then(|p| find_executable(&p));
    let Some(containerd) = beside_ctr.or_else(|| find_executable(Path::new("containerd"))) else {
        panic!("{test}: the runtime environment is configured but containerd is not on PATH")
    };
    let want = std::env::var("NODELET_TEST_CONTAINERD_VERSION").unwrap_or_default();
    let out =
        std::process::Command::new(&containerd).arg("--version").output().expect("containerd --version");
    let have = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !want.is_empty() && have.contains(&want),
        "{test}: {} is `{}`, the test runtime is containerd {want:?} (source its env.sh)",
        containerd.display(),
        have.trim()
    );
    let major = want.split('.').next().and_then(|m| m.parse().ok()).expect("NODELET_TEST_CONTAINERD_VERSION");
    let runc = std::env::var_os("NODELET_TEST_RUNC_BIN").filter(|v| !v.is_empty()).map(PathBuf::from);
    Some(RealRuntime { containerd, runc, major })
}

fn proc_with_arg(arg: &Path) -> Vec<u32> {
    find_stale(arg)
}

async fn wait_status(
    rx: &mut watch::Receiver<ContainerdStatus>,
    what: &str,
    f: impl Fn(&ContainerdStatus) -> bool,
) -> ContainerdStatus {
    let r = timeout(Duration::from_secs(60), async { rx.wait_for(|s| f(s)).await.map(|s| s.clone()) }).await;
    match r {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => panic!("status channel closed while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}; status {:?}", rx.borrow()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_containerd_starts_is_restarted_after_sigkill_and_shuts_down_cleanly() {
    let Some(rt) =
        real_runtime("embedded_containerd_starts_is_restarted_after_sigkill_and_shuts_down_cleanly")
    else {
        return;
    };
    let tmp = tempfile::Builder::new().prefix("nl-ctd").tempdir_in("/tmp").expect("tempdir");
    let mut cfg = rt.cfg_in(tmp.path());
    cfg.restart_backoff_initial = Duration::from_millis(200);
    cfg.stop_timeout = Duration::from_secs(10);
    let config_path = cfg.config_path();

    let ctd = start_supervised(cfg.clone()).await;
    assert_eq!(ctd.endpoint(), format!("unix://{}/containerd/containerd.sock", tmp.path().display()));
    let cri = CriClient::connect(CriConfig::new(ctd.endpoint())).await.expect("connect");
    let v = cri.version().await.expect("CRI Version");
    assert_eq!(v.runtime_name, "containerd");
    let status = cri.status().await.expect("CRI Status");
    assert!(status.is_ready() || status.not_ready_reason().is_some(), "status answered");

    let first = ctd.status();
    let pid = first.pid.expect("a pid");
    assert!(first.ready);
    assert_eq!(std::fs::read_to_string(cfg.pid_path()).expect("pid file").trim(), pid.to_string());
    assert_eq!(proc_with_arg(&config_path), vec![pid], "exactly one containerd with our config");

    // containerd dies: the supervisor starts a new one, which answers again
    signal(pid, rustix::process::Signal::KILL).expect("SIGKILL");
    let mut rx = ctd.watch_status();
    let after = wait_status(&mut rx, "a restarted, ready containerd", |s| s.restarts >= 1 && s.ready).await;
    let new_pid = after.pid.expect("new pid");
    assert_ne!(new_pid, pid);
    assert!(after.last_exit.as_deref().is_some_and(|e| e.contains("signal")), "{after:?}");
    let cri = CriClient::connect(CriConfig::new(ctd.endpoint())).await.expect("reconnect");
    cri.version().await.expect("CRI Version after restart");
    let log = std::fs::read_to_string(cfg.log_path()).expect("log");
    assert!(log.contains("(start #2)"), "the log records the restart:\n{log}");

    // clean shutdown: nothing left running, sockets gone
    ctd.shutdown().await.expect("shutdown");
    assert!(!alive(new_pid), "containerd {new_pid} still alive after shutdown");
    assert!(proc_with_arg(&config_path).is_empty(), "no containerd with our config remains");
    assert!(!cfg.socket_path().exists(), "socket removed");
    assert!(!cfg.pid_path().exists(), "pid file removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containerd_left_by_a_dead_nodelet_is_replaced_and_preload_images_are_imported() {
    let Some(rt) =
        real_runtime("a_containerd_left_by_a_dead_nodelet_is_replaced_and_preload_images_are_imported")
    else {
        return;
    };
    let image_dir = std::env::var("NODELET_TEST_IMAGE_DIR").map(PathBuf::from).ok();
    let pause_tar = image_dir.map(|d| d.join("pause.tar")).filter(|p| p.is_file());
    let Some(pause_tar) = pause_tar else {
        panic!(
            "NODELET_TEST_IMAGE_DIR/pause.tar is missing: run scripts/runtime-up.sh and source its env.sh"
        );
    };
    let tmp = tempfile::Builder::new().prefix("nl-ctd").tempdir_in("/tmp").expect("tempdir");
    let mut cfg = rt.cfg_in(tmp.path());
    let preload = tmp.path().join("preload");
    std::fs::create_dir_all(&preload).expect("mkdir");
    std::fs::copy(&pause_tar, preload.join("pause.tar")).expect("copy archive");
    std::fs::write(preload.join("README"), "not an archive").expect("write");
    cfg.preload_images = Some(preload);

    // a previous nodelet started containerd and was killed: its containerd still runs with our config
    let version = detect_config_version(&rt.containerd).await.expect("config version");
    prepare(&cfg, version).expect("prepare");
    let mut orphan = spawn(&cfg, &rt.containerd, 1).expect("spawn orphan");
    wait_ready(&cfg, &mut orphan).await.expect("orphan ready");
    let orphan_pid = orphan.id().expect("pid");

    let ctd = start_supervised(cfg.clone()).await;
    let _ = timeout(Duration::from_secs(5), orphan.wait()).await; // reap it (it is our child in this test)
    assert!(!alive(orphan_pid), "the leftover containerd was stopped");
    let pid = ctd.status().pid.expect("pid");
    assert_ne!(pid, orphan_pid);
    assert_eq!(find_stale(&cfg.config_path()), vec![pid]);

    let cri = CriClient::connect(CriConfig::new(ctd.endpoint())).await.expect("connect");
    let image = cri.image_status("localhost/nodelet/pause:3.9").await.expect("ImageStatus");
    assert!(image.is_some(), "the preloaded pause image is known to CRI");
    ctd.shutdown().await.expect("shutdown");
    assert!(find_stale(&cfg.config_path()).is_empty());
}

#[tokio::test]
async fn a_missing_containerd_binary_is_a_clear_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = cfg_in(tmp.path());
    cfg.containerd_path = PathBuf::from("/nonexistent/containerd");
    let err = EmbeddedContainerd::start(cfg).await.expect_err("no binary");
    assert!(err.to_string().contains("--container-runtime-endpoint"), "{err}");
}

#[tokio::test]
async fn a_containerd_that_exits_at_once_reports_its_log() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fake = fake_containerd(tmp.path(), "version = 2", 0);
    let mut cfg = cfg_in(tmp.path());
    cfg.containerd_path = fake;
    let err = EmbeddedContainerd::start(cfg).await.expect_err("exits");
    let msg = err.to_string();
    assert!(matches!(err, ContainerdError::ExitedDuringStartup { .. }), "{msg}");
    assert!(msg.contains("fake containerd: bad config") && msg.contains("exit status: 3"), "{msg}");
}

/// The generated configuration runs a real pod: sandbox from the preloaded pause image, the generated CNI
/// bridge network (pod IP in the configured subnet), a container from the preloaded busybox image, and its
/// hostPort answering on the bridge's address — what the quick start relies on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_the_embedded_containerd_gets_an_ip_and_its_host_port_answers_on_the_bridge_address() {
    use nodelet_cri::proto;
    const TEST: &str =
        "a_pod_on_the_embedded_containerd_gets_an_ip_and_its_host_port_answers_on_the_bridge_address";
    let Some(rt) = real_runtime(TEST) else { return };
    // a bridge and subnet per containerd major (both test runtimes may run it at once), outside the test
    // runtimes' (198.18.0.0/17, 198.18.192.0/20), the quick start's and the conformance node's networks
    let (bridge, subnet) = match rt.major {
        1 => ("nltest201", "198.18.208.0/24"),
        _ => ("nltest202", "198.18.209.0/24"),
    };
    let subnet_cidr: crate::cidr::Ipv4Cidr = subnet.parse().expect("cidr");
    let Some(images) = std::env::var("NODELET_TEST_IMAGE_DIR").ok().map(PathBuf::from) else {
        panic!("NODELET_TEST_IMAGE_DIR is unset: source the runtime env file (env.sh)");
    };
    let cgroup_parent =
        std::env::var("NODELET_TEST_CGROUP_PARENT").unwrap_or_else(|_| "/nodelet-test".into());

    let tmp = tempfile::Builder::new().prefix("nl-ctd").tempdir_in("/tmp").expect("tempdir");
    let mut cfg = rt.cfg_in(tmp.path());
    if let Some(net) = cfg.cni_network.as_mut() {
        net.bridge = bridge.into();
        net.subnet = subnet_cidr;
    }
    let preload = tmp.path().join("preload");
    std::fs::create_dir_all(&preload).expect("mkdir");
    for a in ["pause.tar", "busybox.tar"] {
        std::fs::copy(images.join(a), preload.join(a)).unwrap_or_else(|e| panic!("copy {a}: {e}"));
    }
    cfg.preload_images = Some(preload);
    let log_dir = tmp.path().join("pods");
    let uid = format!("{:032x}", unique_u128());
    let cgroup = format!("{}/pod{uid}", cgroup_parent.trim_end_matches('/'));

    let ctd = start_supervised(cfg.clone()).await;
    let endpoint = ctd.endpoint().to_owned();
    let sandbox_id = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));

    // the body runs in a task so that cleanup runs even when it panics
    let body = {
        let sandbox_id = sandbox_id.clone();
        let (log_dir, uid, cgroup) = (log_dir.clone(), uid.clone(), cgroup.clone());
        tokio::spawn(async move {
            let cri = CriClient::connect(CriConfig::new(&endpoint)).await.expect("connect");
            let host_port: i32 = 30_880; // outside the CRI driver tests' random 20000-30000
            let pod_log_dir = log_dir.join(format!("default_embedded-test_{uid}"));
            std::fs::create_dir_all(pod_log_dir.join("web")).expect("log dir");
            let sandbox = proto::PodSandboxConfig {
                metadata: Some(proto::PodSandboxMetadata {
                    name: "embedded-test".into(),
                    uid: uid.clone(),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                hostname: "embedded-test".into(),
                log_directory: pod_log_dir.to_string_lossy().into_owned(),
                dns_config: Some(proto::DnsConfig {
                    servers: vec!["127.0.0.1".into()],
                    ..Default::default()
                }),
                port_mappings: vec![proto::PortMapping {
                    protocol: proto::Protocol::Tcp as i32,
                    container_port: 8080,
                    host_port,
                    host_ip: String::new(),
                }],
                linux: Some(proto::LinuxPodSandboxConfig { cgroup_parent: cgroup, ..Default::default() }),
                ..Default::default()
            };
            let id = cri.run_pod_sandbox(sandbox.clone(), "").await.expect("RunPodSandbox");
            if let Ok(mut s) = sandbox_id.lock() {
                *s = Some(id.clone());
            }
            let status = cri.pod_sandbox_status(&id).await.expect("PodSandboxStatus");
            let ip: Ipv4Addr = status.network.map(|n| n.ip).unwrap_or_default().parse().expect("pod IP");
            let subnet = subnet_cidr;
            assert!(subnet.contains(ip), "pod IP {ip} is not in the generated network {subnet}");
            let container = proto::ContainerConfig {
                metadata: Some(proto::ContainerMetadata { name: "web".into(), attempt: 0 }),
                image: Some(proto::ImageSpec {
                    image: "localhost/nodelet/busybox:latest".into(),
                    ..Default::default()
                }),
                command: ["httpd", "-f", "-p", "8080", "-h", "/var/www"].map(String::from).to_vec(),
                log_path: "web/0.log".into(),
                ..Default::default()
            };
            let cid = cri.create_container(&id, container, sandbox).await.expect("CreateContainer");
            cri.start_container(&cid).await.expect("StartContainer");
            // through the hostPort on the bridge address (loopback is deliberately not NATed)
            let gateway = subnet.first_host();
            let addr = std::net::SocketAddr::new(std::net::IpAddr::V4(gateway), host_port as u16);
            let body = http_get_pod_network(addr).await;
            assert!(body.contains("hello from nodelet busybox"), "{body}");
            cri.stop_container(&cid, Duration::ZERO).await.expect("StopContainer");
        })
    };
    let outcome = body.await;

    // cleanup, whatever happened
    if let Ok(cri) = CriClient::connect(CriConfig::new(ctd.endpoint())).await {
        let id = sandbox_id.lock().ok().and_then(|s| s.clone());
        if let Some(id) = id {
            let _ = cri.stop_pod_sandbox(&id).await;
            let _ = cri.remove_pod_sandbox(&id).await;
        }
    }
    ctd.shutdown().await.expect("shutdown");
    let _ = std::process::Command::new("ip").args(["link", "del", bridge]).output();
    if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
        for c in controllers.flatten() {
            let _ = std::fs::remove_dir(c.path().join(cgroup.trim_start_matches('/')));
        }
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

fn unique_u128() -> u128 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() ^ (u128::from(std::process::id()) << 64)
}

/// One HTTP/1.0 GET to an address of the pod network (refuses anything else); retries while the server starts.
async fn http_get_pod_network(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let std::net::IpAddr::V4(v4) = addr.ip() else { panic!("IPv4 only") };
    assert!(v4.octets()[..2] == [198, 18], "refusing to send traffic outside 198.18.0.0/16: {addr}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let attempt = async {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
        };
        match timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(text)) if text.starts_with("HTTP/1.") => return text,
            other if Instant::now() >= deadline => panic!("GET {addr} failed: {other:?}"),
            _ => sleep(Duration::from_millis(200)).await,
        }
    }
}

/// containerd itself parses the generated file in the version it reads, and merges the extra file over it.
#[tokio::test]
async fn containerd_accepts_the_generated_config_and_merges_the_extra_file() {
    let Some(rt) = real_runtime("containerd_accepts_the_generated_config_and_merges_the_extra_file") else {
        return;
    };
    let version = detect_config_version(&rt.containerd).await.expect("config version");
    assert_eq!(version == ConfigVersion::V2, rt.major < 2, "containerd {} reads {version:?}", rt.major);
    let tmp = tempfile::tempdir().expect("tempdir");
    let extra = tmp.path().join("extra.toml");
    let n = version.number();
    std::fs::write(&extra, format!("version = {n}\n[debug]\n  level = \"debug\"\n")).expect("write");
    let mut c = rt.cfg_in(tmp.path());
    c.config_extra = Some(extra);
    prepare(&c, version).expect("prepare");
    let out = std::process::Command::new(&rt.containerd)
        .arg("--config")
        .arg(c.config_path())
        .args(["config", "dump"])
        .output()
        .expect("run containerd config dump");
    // 2.x dumps TOML literal strings ('...'), 1.6 basic strings ("...")
    let dump = String::from_utf8_lossy(&out.stdout).replace('\'', "\"");
    assert!(out.status.success(), "{}\n{}", dump, String::from_utf8_lossy(&out.stderr));
    let sandbox = if rt.major < 2 { "sandbox_image = " } else { "sandbox = " };
    assert!(dump.contains(&format!("{sandbox}\"localhost/nodelet/pause:3.9\"")), "{dump}");
    assert!(dump.contains("restrict_oom_score_adj = true"), "{dump}");
    assert!(dump.contains("netns_mounts_under_state_dir = true"), "{dump}");
    assert!(dump.contains(&format!("Root = \"{}\"", c.dir.join("runc").display())), "{dump}");
    assert!(dump.contains(&format!("address = \"{}\"", c.socket_path().display())), "{dump}");
    assert!(dump.contains("level = \"debug\""), "the extra file wins: {dump}");
}

/// Starts the embedded containerd and runs its supervision on a task of the test.
async fn start_supervised(cfg: EmbeddedContainerdConfig) -> EmbeddedContainerd {
    let (ctd, supervision) = EmbeddedContainerd::start(cfg).await.unwrap_or_else(|e| panic!("start: {e}"));
    tokio::spawn(supervision);
    ctd
}
