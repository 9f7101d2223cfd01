use std::sync::Arc;

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

fn host() -> HostFacts {
    HostFacts { hostname: Ok("Node-1".into()), cwd: PathBuf::from("/work") }
}

fn args(flags: &[&str]) -> RunArgs {
    let mut v = vec!["nodelet"];
    v.extend_from_slice(flags);
    match Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{flags:?}: {e}")).into_command() {
        Command::Run(r) => *r,
        other => panic!("not run: {other:?}"),
    }
}

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn load(flags: &[&str], body: Option<&str>) -> Result<Loaded, ConfigError> {
    let file = match body {
        Some(b) => Some(ConfigFile::parse(Path::new("/etc/nodelet/config.yaml"), &format!("{HEADER}{b}"))?),
        None => None,
    };
    Config::resolve(&args(flags), file, &host())
}

fn ok(flags: &[&str], body: Option<&str>) -> Loaded {
    load(flags, body).unwrap_or_else(|e| panic!("{e}"))
}

fn err(flags: &[&str], body: Option<&str>) -> String {
    match load(flags, body) {
        Ok(l) => panic!("expected an error, got {:?}", l.config),
        Err(e) => e.to_string(),
    }
}

fn warned(l: &Loaded, field: &str) -> Option<String> {
    l.warnings.iter().find(|w| w.field == field).map(|w| w.message.clone())
}

#[test]
fn defaults_match_the_kubelets_config_file_defaults_except_where_documented() {
    let c = ok(&[], None).config;
    assert_eq!(c.node_name, "node-1", "hostname lower-cased like the kubelet");
    assert_eq!(c.root_dir, PathBuf::from("/var/lib/nodelet"));
    assert_eq!(c.server.port, 10250);
    assert_eq!(c.server.read_only_port, None);
    assert_eq!(c.server.healthz, Some("127.0.0.1:10248".parse().expect("addr")));
    assert_eq!(c.server.address, "0.0.0.0".parse::<IpAddr>().expect("ip"));
    assert!(!c.server.auth.anonymous, "anonymous is off by default");
    assert_eq!(c.server.cert_dir, PathBuf::from("/var/lib/nodelet/pki"));
    assert_eq!(c.runtime.endpoint, None, "no endpoint: embedded containerd");
    assert_eq!(c.runtime.request_timeout, Duration::from_secs(120));
    assert_eq!(c.sync_frequency, Duration::from_secs(60));
    assert_eq!(c.sources.file_check_frequency, Duration::from_secs(20));
    assert_eq!(c.sources.http_check_frequency, Duration::from_secs(20));
    assert_eq!(c.pods.pod_logs_dir, PathBuf::from("/var/log/pods"));
    assert_eq!(c.pods.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
    assert_eq!(c.pods.max_pods, 110);
    assert_eq!(c.pods.pod_pids_limit, None);
    assert_eq!(c.backoff.container_restart, DEFAULT_CONTAINER_RESTART_BACKOFF);
    assert_eq!(c.runtime.embedded.pod_cidr.to_string(), "198.18.0.0/16");
    assert_eq!(c.eviction.hard.len(), 4, "the kubelet's evictionHard defaults");
    assert_eq!(c.image_gc.high_threshold_percent, 85);
}

#[test]
fn a_full_file_is_read_with_the_kubelets_field_names() {
    let l = ok(
        &[],
        Some(
            r#"
staticPodPath: /etc/kubernetes/manifests
staticPodURL: http://127.0.0.1:8080/pods.yaml
staticPodURLHeader:
  X-Token: ["a", "b"]
fileCheckFrequency: 5s
httpCheckFrequency: 1m30s
syncFrequency: 30s
address: 127.0.0.1
port: 11250
readOnlyPort: 10255
healthzPort: 0
tlsCertFile: certs/tls.crt
tlsPrivateKeyFile: /etc/nodelet/tls.key
authentication:
  x509:
    clientCAFile: /etc/nodelet/ca.crt
  anonymous:
    enabled: true
resolvConf: ""
runtimeRequestTimeout: 30s
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
podLogsDir: /var/log/nodelet-pods
cgroupRoot: /nodelet
maxPods: 20
podPidsLimit: 1024
podCIDR: 198.18.64.0/18
crashLoopBackOff:
  maxContainerRestartPeriod: 20s
nodelet:
  containerRestartBackOff: {initial: 1s, resetAfter: 1m}
  imagePullBackOff: {initial: 2s, max: 4s}
  podInfraContainerImage: registry.k8s.io/pause:3.9
  preloadImages: images
  allowPrivileged: true
"#,
        ),
    );
    let c = l.config.clone();
    assert_eq!(c.sources.static_pod_path, Some(PathBuf::from("/etc/kubernetes/manifests")));
    assert_eq!(c.sources.static_pod_url.as_deref(), Some("http://127.0.0.1:8080/pods.yaml"));
    assert_eq!(
        c.sources.static_pod_url_headers,
        vec![("X-Token".to_owned(), "a".to_owned()), ("X-Token".to_owned(), "b".to_owned())]
    );
    assert_eq!(c.sources.file_check_frequency, Duration::from_secs(5));
    assert_eq!(c.sources.http_check_frequency, Duration::from_secs(90));
    assert_eq!(c.sync_frequency, Duration::from_secs(30));
    assert_eq!(c.server.port, 11250);
    assert_eq!(c.server.read_only_port, Some(10255));
    assert_eq!(c.server.healthz, None, "healthzPort 0 disables it");
    assert_eq!(
        c.server.tls,
        Some(TlsFiles {
            cert_file: PathBuf::from("/etc/nodelet/certs/tls.crt"),
            key_file: PathBuf::from("/etc/nodelet/tls.key")
        }),
        "relative paths in the file are relative to the file"
    );
    assert_eq!(c.server.auth.client_ca_file, Some(PathBuf::from("/etc/nodelet/ca.crt")));
    assert!(c.server.auth.anonymous);
    assert_eq!(c.pods.resolv_conf, None, "resolvConf \"\" disables host DNS");
    assert_eq!(c.runtime.request_timeout, Duration::from_secs(30));
    assert_eq!(c.runtime.endpoint.as_deref(), Some("unix:///run/containerd/containerd.sock"));
    assert_eq!(c.runtime.pod_infra_container_image, "registry.k8s.io/pause:3.9");
    assert_eq!(c.runtime.preload_images, Some(PathBuf::from("/etc/nodelet/images")));
    assert_eq!(c.pods.pod_logs_dir, PathBuf::from("/var/log/nodelet-pods"));
    assert_eq!(c.pods.cgroup_root.as_deref(), Some("/nodelet"));
    assert_eq!(c.pods.max_pods, 20);
    assert_eq!(c.pods.pod_pids_limit, Some(1024));
    assert!(c.pods.allow_privileged);
    assert_eq!(c.runtime.embedded.pod_cidr.to_string(), "198.18.64.0/18");
    assert_eq!(
        c.backoff.container_restart,
        BackOff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(20),
            reset_after: Duration::from_secs(60)
        }
    );
    assert_eq!(c.backoff.image_pull.max, Duration::from_secs(4));
    assert!(l.warnings.iter().all(|w| !w.message.contains("unknown")), "{:?}", l.warnings);
    assert!(warned(&l, "readOnlyPort").is_none(), "read-only port on loopback is not worth a warning");
}

#[test]
fn explicit_flags_override_the_file_and_unset_flags_do_not() {
    let body = "port: 11250\nreadOnlyPort: 10255\nsyncFrequency: 30s\nstaticPodPath: /from/file\n";
    let c =
        ok(&["--port", "12250", "--pod-manifest-path", "manifests", "--sync-frequency", "2m"], Some(body))
            .config;
    assert_eq!(c.server.port, 12250, "flag wins");
    assert_eq!(c.sync_frequency, Duration::from_secs(120), "flag wins");
    assert_eq!(c.server.read_only_port, Some(10255), "file wins over default");
    assert_eq!(
        c.sources.static_pod_path,
        Some(PathBuf::from("/work/manifests")),
        "relative flag paths are relative to the current directory"
    );
    let c = ok(&["--anonymous-auth=false"], Some("authentication: {anonymous: {enabled: true}}\n")).config;
    assert!(!c.server.auth.anonymous, "an explicit false flag overrides a true field");
    let c = ok(&["--read-only-port", "0"], Some("readOnlyPort: 10255\n")).config;
    assert_eq!(c.server.read_only_port, None, "an explicit 0 overrides the file");
}

#[test]
fn unknown_and_unsupported_fields_are_named_in_warnings() {
    let l = ok(
        &[],
        Some(
            "staticPodPth: /typo\nclusterDNS: [10.0.0.10]\nfeatureGates: {Foo: true}\nauthentication:\n  \
             x509: {clientCAFile: /ca, bogus: 1}\n  webhook: {enabled: true}\nauthorization: {mode: Webhook}\n\
             nodelet: {podInfraImage: x}\n",
        ),
    );
    assert_eq!(warned(&l, "staticPodPth").as_deref(), Some("unknown field (typo?); ignored"));
    assert_eq!(warned(&l, "clusterDNS").as_deref(), Some("kubelet field not supported by nodelet; ignored"));
    assert_eq!(
        warned(&l, "featureGates").as_deref(),
        Some("kubelet field not supported by nodelet; ignored")
    );
    assert_eq!(warned(&l, "authentication.x509.bogus").as_deref(), Some("unknown field (typo?); ignored"));
    assert_eq!(
        warned(&l, "nodelet.podInfraImage").as_deref(),
        Some("unknown nodelet field (typo?); ignored")
    );
    assert!(warned(&l, "authentication.webhook.enabled").is_some_and(|m| m.contains("not supported")));
    assert!(warned(&l, "authorization.mode").is_some_and(|m| m.contains("not supported")));
}

#[test]
fn eviction_and_image_gc_fields_are_enforced_without_warnings() {
    let l = ok(&[], Some("evictionHard: {memory.available: 200Mi}\nimageGCHighThresholdPercent: 90\n"));
    assert_eq!(warned(&l, "evictionHard"), None);
    assert_eq!(warned(&l, "imageGCHighThresholdPercent"), None);
    assert_eq!(l.config.image_gc.high_threshold_percent, 90);
    assert_eq!(
        l.config.eviction.hard,
        vec![EvictionThreshold {
            signal: "memory.available".into(),
            value: ThresholdValue::Quantity(200 << 20)
        }],
        "setting evictionHard drops the other defaults, like the kubelet"
    );
    let l = ok(&[], Some("evictionHard: {memory.available: 200Mi}\nmergeDefaultEvictionSettings: true\n"));
    assert_eq!(l.config.eviction.hard.len(), 4, "merged over the defaults");
    assert!(l.config.eviction.hard.contains(&EvictionThreshold {
        signal: "memory.available".into(),
        value: ThresholdValue::Quantity(200 << 20)
    }));
}

#[test]
fn wrong_types_name_the_field_and_the_file() {
    let e = err(&[], Some("port: \"abc\"\n"));
    assert!(e.starts_with("config file /etc/nodelet/config.yaml: port: invalid type: string"), "{e}");
    let e = err(&[], Some("syncFrequency: 10\n"));
    assert!(e.contains("syncFrequency") && e.contains("unit"), "{e}");
    let e = err(&[], Some("authentication:\n  anonymous:\n    enabled: maybe\n"));
    assert!(e.contains("authentication.anonymous.enabled"), "{e}");
    let e = err(&[], Some("staticPodURLHeader: {X-A: notalist}\n"));
    assert!(e.contains("staticPodURLHeader"), "{e}");
}

#[test]
fn out_of_range_values_are_errors_naming_the_field_or_flag() {
    assert!(err(&[], Some("port: 70000\n")).contains("port in /etc/nodelet/config.yaml"));
    assert!(err(&[], Some("port: 0\n")).contains("port in /etc/nodelet/config.yaml"));
    assert!(err(&["--port", "0"], None).contains("--port"));
    assert!(err(&["--sync-frequency", "0s"], None).contains("--sync-frequency"));
    assert!(err(&[], Some("maxPods: 0\n")).contains("maxPods"));
    assert!(err(&[], Some("address: nowhere\n")).contains("address in"));
    assert!(err(&[], Some("podCIDR: 198.18.0.1/16\n")).contains("host bits"));
    assert!(err(&["--pod-cidr", "198.18.0.0/33"], None).contains("--pod-cidr"));
    assert!(err(&[], Some("cgroupRoot: relative\n")).contains("cgroupRoot"));
    assert!(err(&["--cgroup-root", "/a/../b"], None).contains("--cgroup-root"));
    assert!(err(&["--hostname-override", "Bad_Name"], None).contains("--hostname-override"));
    assert!(err(&["--manifest-url", "ftp://x"], None).contains("--manifest-url"));
    assert!(err(&["--manifest-url-header", "novalue"], None).contains("--manifest-url-header"));
    assert!(err(&["--manifest-url-header", "bad name:1"], None).contains("header name"));
    assert!(
        err(&["--container-runtime-endpoint", "tcp://1.2.3.4:1"], None)
            .contains("--container-runtime-endpoint")
    );
    assert!(err(&["--tls-cert-file", "/c"], None).contains("private key"));
    assert!(err(&[], Some("evictionHard: {memory.free: 1Gi}\n")).contains("unknown eviction signal"));
    assert!(
        err(&[], Some("evictionHard: {memory.available: 120%}\n")).contains("evictionHard.memory.available")
    );
    assert!(err(&[], Some("evictionSoft: {memory.available: 1Gi}\n")).contains("grace period"));
    assert!(err(&[], Some("imageGCLowThresholdPercent: 90\n")).contains("less than"));
    assert!(err(&[], Some("maxParallelImagePulls: 3\n")).contains("serializeImagePulls"));
    assert!(err(&[], Some("authorization: {mode: RBAC}\n")).contains("authorization.mode"));
    assert!(
        err(&[], Some("crashLoopBackOff: {maxContainerRestartPeriod: 10m}\n"))
            .contains("crashLoopBackOff.maxContainerRestartPeriod")
    );
    assert!(
        err(&[], Some("nodelet: {containerRestartBackOff: {initial: 10s, max: 1s}}\n"))
            .contains("below initial")
    );
    assert!(err(&[], Some("nodelet: {cniBridge: this-name-is-too-long}\n")).contains("nodelet.cniBridge"));
}

#[test]
fn wrong_api_version_kind_or_shape_is_refused() {
    let p = Path::new("/c.yaml");
    let e = ConfigFile::parse(p, "kind: KubeletConfiguration\nport: 1\n").expect_err("no apiVersion");
    assert!(e.to_string().contains("apiVersion is missing"), "{e}");
    let e = ConfigFile::parse(p, "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n")
        .expect_err("old version");
    assert!(e.to_string().contains("v1alpha1"), "{e}");
    let e = ConfigFile::parse(p, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n").expect_err("kind");
    assert!(e.to_string().contains("kind \"Pod\""), "{e}");
    let e = ConfigFile::parse(p, "").expect_err("empty");
    assert!(e.to_string().contains("empty"), "{e}");
    let e = ConfigFile::parse(p, &format!("{HEADER}---\n{HEADER}")).expect_err("two docs");
    assert!(e.to_string().contains("more than one"), "{e}");
    let e = ConfigFile::parse(p, "[1, 2]").expect_err("not a mapping");
    assert!(e.to_string().contains("/c.yaml"), "{e}");
    let e = ConfigFile::parse(p, "port: [").expect_err("bad yaml");
    assert!(e.to_string().contains("/c.yaml"), "{e}");
}

#[test]
fn json_files_are_accepted_too() {
    let f = ConfigFile::parse(
        Path::new("/c.json"),
        r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "port": 11250}"#,
    )
    .expect("json is yaml");
    let c = Config::resolve(&args(&[]), Some(f), &host()).expect("valid").config;
    assert_eq!(c.server.port, 11250);
}

#[test]
fn risky_settings_are_warned_about() {
    let l = ok(&[], None);
    assert!(
        warned(&l, "authentication").is_some_and(|m| m.contains("refuse every request")),
        "no authenticator: say that port 10250 serves nobody"
    );
    let l = ok(&["--anonymous-auth", "--read-only-port", "10255"], None);
    assert!(warned(&l, "authentication.anonymous.enabled").is_some());
    assert!(warned(&l, "readOnlyPort").is_some());
    let l = ok(&["--anonymous-auth", "--address", "127.0.0.1"], None);
    assert!(warned(&l, "authentication.anonymous.enabled").is_none(), "loopback only: fine");
    assert!(warned(&l, "authentication").is_none());
}

#[test]
fn manifest_url_headers_from_flags_split_on_commas_and_repeat() {
    let c = ok(
        &[
            "--manifest-url",
            "http://127.0.0.1:1/p",
            "--manifest-url-header",
            "a:hello,b:again",
            "--manifest-url-header",
            "b:x",
        ],
        Some("staticPodURLHeader: {Z: [ignored]}\n"),
    )
    .config;
    assert_eq!(
        c.sources.static_pod_url_headers,
        vec![("a".into(), "hello".into()), ("b".into(), "again".into()), ("b".into(), "x".into())],
        "flag headers replace the file's"
    );
}

#[test]
fn hostname_problems_are_reported() {
    let h = HostFacts {
        hostname: Err(Arc::new(std::io::Error::new(std::io::ErrorKind::NotFound, "gone"))),
        cwd: PathBuf::from("/"),
    };
    let e = Config::resolve(&args(&[]), None, &h).expect_err("no hostname");
    assert!(e.to_string().contains("--hostname-override"), "{e}");
    let c = Config::resolve(&args(&["--hostname-override", "My-Node"]), None, &h).expect("override").config;
    assert_eq!(c.node_name, "my-node");
}

#[test]
fn resolv_conf_flag_can_disable_dns() {
    assert_eq!(ok(&["--resolv-conf", ""], None).config.pods.resolv_conf, None);
    assert_eq!(
        ok(&["--resolv-conf", "/tmp/r.conf"], None).config.pods.resolv_conf,
        Some(PathBuf::from("/tmp/r.conf"))
    );
}

#[test]
fn config_file_is_read_from_disk_with_its_path_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubelet.yaml");
    std::fs::write(&path, format!("{HEADER}staticPodPath: manifests\nreadOnlyPort: 10255\n")).expect("write");
    let l = Config::load(&args(&["--config", path.to_str().expect("utf8"), "--hostname-override", "n"]))
        .expect("loads");
    assert_eq!(l.config.sources.static_pod_path, Some(dir.path().join("manifests")));
    assert_eq!(l.config.config_file, Some(path.clone()));
    let missing = dir.path().join("missing.yaml");
    let e = Config::load(&args(&["--config", missing.to_str().expect("utf8")])).expect_err("missing");
    assert!(e.to_string().contains("missing.yaml"), "{e}");
}

#[test]
fn the_example_config_in_deploy_is_valid_and_warning_free() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config/kubelet-config.yaml");
    let f = ConfigFile::read(&path).expect("example parses");
    let l = Config::resolve(&args(&[]), Some(f), &host()).expect("example validates");
    let unexpected: Vec<_> =
        l.warnings.iter().filter(|w| !NOT_YET_ENFORCED.contains(&w.field.as_str())).collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
}

#[test]
fn cidr_helpers() {
    let c: Ipv4Cidr = "198.18.200.0/24".parse().expect("cidr");
    assert_eq!(c.first_host(), Ipv4Addr::new(198, 18, 200, 1));
    assert!(c.contains(Ipv4Addr::new(198, 18, 200, 77)));
    assert!(!c.contains(Ipv4Addr::new(198, 18, 201, 1)));
    assert!("198.18.0.0".parse::<Ipv4Cidr>().is_err());
}

#[test]
fn default_pod_cidr_matches_its_documented_string() {
    assert_eq!(default_pod_cidr().to_string(), DEFAULT_POD_CIDR);
    assert_eq!(DEFAULT_POD_CIDR.parse::<Ipv4Cidr>(), Ok(default_pod_cidr()));
}

/// The quick start's manifests (deploy/examples) must be pods nodelet accepts, using only the local images
/// and explicit DNS (the host resolver is in a network pods must not use).
#[test]
fn the_example_manifests_are_valid_static_pods() {
    use nodelet_resources::pod::desired::PodSource;
    use nodelet_resources::pod::validation::prepare_value;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/examples") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml"),
            "only manifests in {}",
            dir.display()
        );
        let value: serde_json::Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let desired = prepare_value(value, PodSource::File(path.clone()), "node1")
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let pod = &desired.pod;
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.dns_policy.as_deref(), Some("None"), "{}", path.display());
        let ns = spec.dns_config.as_ref().and_then(|d| d.nameservers.clone()).unwrap_or_default();
        assert_eq!(ns, vec!["127.0.0.1".to_owned()], "{}", path.display());
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            assert_eq!(c.image.as_deref(), Some("localhost/nodelet/busybox:latest"), "{}", path.display());
            assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"), "{}", path.display());
        }
        names.push(pod.metadata.name.clone().unwrap_or_default());
    }
    names.sort();
    assert_eq!(names, vec!["crashloop-node1", "shared-emptydir-node1", "web-node1"]);
    let web: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("web.yaml")).expect("web")).expect("yaml");
    assert_eq!(web["spec"]["containers"][0]["ports"][0]["hostPort"], 18080);
}

#[test]
fn container_gc_fields_are_read_and_errors_name_them() {
    let default = ok(&[], None).config.container_gc;
    assert_eq!(default, crate::container_gc::ContainerGcPolicy::default());
    assert_eq!(
        (default.period, default.max_per_pod_container, default.max_containers),
        (Duration::from_secs(60), 1, None)
    );
    let l = ok(
        &[],
        Some("nodelet:\n  containerGC: {period: 5s, minAge: 1m, maxPerPodContainer: 2, maxContainers: 10}\n"),
    );
    let gc = l.config.container_gc;
    assert_eq!((gc.period, gc.min_age), (Duration::from_secs(5), Duration::from_secs(60)));
    assert_eq!((gc.max_per_pod_container, gc.max_containers), (2, Some(10)));
    assert!(!l.warnings.iter().any(|w| w.field.contains("containerGC")), "{:?}", l.warnings);
    assert_eq!(
        ok(&[], Some("nodelet:\n  containerGC: {maxContainers: -1}\n")).config.container_gc.max_containers,
        None
    );
    assert!(err(&[], Some("nodelet:\n  containerGC: {period: 0s}\n")).contains("nodelet.containerGC.period"));
    assert!(
        err(&[], Some("nodelet:\n  containerGC: {maxPerPodContainer: 0}\n"))
            .contains("nodelet.containerGC.maxPerPodContainer")
    );
}

#[test]
fn eviction_and_image_gc_flags_replace_the_file_fields() {
    let l = ok(
        &[
            "--eviction-hard",
            "memory.available<1Gi,nodefs.available<5%",
            "--eviction-soft",
            "memory.available<2Gi",
            "--eviction-soft-grace-period",
            "memory.available=1m30s",
            "--eviction-minimum-reclaim",
            "nodefs.available=500Mi",
            "--eviction-pressure-transition-period",
            "30s",
            "--image-gc-high-threshold",
            "70",
            "--image-gc-low-threshold",
            "60",
            "--minimum-image-ttl-duration",
            "5m",
        ],
        Some(
            "evictionHard: {imagefs.available: 20%}\nnodelet: {imageGCPeriod: 1m, evictionMonitoringPeriod: 2s}\n",
        ),
    );
    let e = &l.config.eviction;
    assert_eq!(
        e.hard,
        vec![
            EvictionThreshold { signal: "memory.available".into(), value: ThresholdValue::Quantity(1 << 30) },
            EvictionThreshold { signal: "nodefs.available".into(), value: ThresholdValue::Percentage(5.0) },
        ],
        "the flag replaces the file's evictionHard"
    );
    assert_eq!(e.soft.len(), 1);
    assert_eq!(e.soft_grace_period.get("memory.available"), Some(&Duration::from_secs(90)));
    assert_eq!(e.minimum_reclaim.get("nodefs.available"), Some(&ThresholdValue::Quantity(500 << 20)));
    assert_eq!(e.pressure_transition_period, Duration::from_secs(30));
    assert_eq!(e.monitoring_period, Duration::from_secs(2));
    let gc = &l.config.image_gc;
    assert_eq!((gc.high_threshold_percent, gc.low_threshold_percent), (70, 60));
    assert_eq!((gc.minimum_age, gc.period), (Duration::from_secs(300), Duration::from_secs(60)));

    let defaults = ok(&[], None);
    assert_eq!(defaults.config.eviction.monitoring_period, Duration::from_secs(10));
    assert_eq!(defaults.config.image_gc.period, Duration::from_secs(300));
    assert!(err(&["--eviction-hard", "memory.free<1Gi"], None).contains("--eviction-hard"));
    assert!(err(&["--eviction-hard", "memory.available=1Gi"], None).contains("not signal<value"));
    assert!(err(&["--image-gc-high-threshold", "101"], None).contains("--image-gc-high-threshold"));
    assert!(err(&["--eviction-soft", "memory.available<1Gi"], None).contains("needs a grace period"));
}
