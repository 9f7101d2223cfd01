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
    match crate::cli::try_parse_from(v).unwrap_or_else(|e| panic!("{flags:?}: {e}")) {
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
    assert_eq!(c.cluster, None, "standalone without --kubeconfig");
    assert_eq!(c.pods.cluster_dns, Vec::<IpAddr>::new());
    assert_eq!(c.pods.cluster_domain, "", "the kubelet's default: no cluster domain");
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
            "staticPodPth: /typo\nproviderID: aws:///i-1\nfeatureGates: {Foo: true}\nauthentication:\n  \
             x509: {clientCAFile: /ca, bogus: 1}\n  webhook: {cacheTTL: 1m}\n\
             authorization: {webhook: {cacheAuthorizedTTL: 1m, typo: 1}}\nnodelet: {podInfraImage: x}\n",
        ),
    );
    assert_eq!(warned(&l, "staticPodPth").as_deref(), Some("unknown field (typo?); ignored"));
    assert_eq!(warned(&l, "providerID").as_deref(), Some("kubelet field not supported by nodelet; ignored"));
    assert_eq!(
        warned(&l, "featureGates").as_deref(),
        Some("kubelet field not supported by nodelet; ignored")
    );
    assert_eq!(warned(&l, "authentication.x509.bogus").as_deref(), Some("unknown field (typo?); ignored"));
    assert_eq!(
        warned(&l, "nodelet.podInfraImage").as_deref(),
        Some("unknown nodelet field (typo?); ignored")
    );
    // Cache lifetimes of webhooks that are off have no effect: named, never silently taken.
    assert!(warned(&l, "authentication.webhook.cacheTTL").is_some_and(|m| m.contains("ignored")));
    assert!(warned(&l, "authorization.webhook.cacheAuthorizedTTL").is_some_and(|m| m.contains("ignored")));
    assert_eq!(warned(&l, "authorization.webhook.typo").as_deref(), Some("unknown field (typo?); ignored"));
    assert_eq!(l.config.server.auth.token_webhook, None);
    assert_eq!(l.config.server.auth.authorization, AuthorizationMode::AlwaysAllow);
}

#[test]
fn webhook_authentication_and_authorization_need_cluster_mode() {
    // Standalone: enabling either webhook is an error naming the field or the flag.
    let e = err(&[], Some("authentication: {webhook: {enabled: true}}\n"));
    assert!(e.contains("authentication.webhook.enabled") && e.contains("--kubeconfig"), "{e}");
    let e = err(&[], Some("authorization: {mode: Webhook}\n"));
    assert!(e.contains("authorization.mode") && e.contains("--kubeconfig"), "{e}");
    let e = err(&["--authentication-token-webhook"], None);
    assert!(e.contains("--authentication-token-webhook"), "{e}");
    let e = err(&["--authorization-mode", "Webhook"], None);
    assert!(e.contains("--authorization-mode"), "{e}");
    assert!(err(&["--authorization-mode", "RBAC"], None).contains("is not AlwaysAllow or Webhook"));

    // Cluster mode: the kubelet's cache defaults, or the file's, or the flags'.
    let (_dir, kc) = kubeconfig();
    let body = "authentication: {webhook: {enabled: true}}\nauthorization: {mode: Webhook}\n";
    let l = ok(&["--kubeconfig", &kc], Some(body));
    assert_eq!(
        l.config.server.auth.token_webhook,
        Some(TokenWebhookConfig { cache_ttl: Duration::from_secs(120) })
    );
    assert_eq!(
        l.config.server.auth.authorization,
        AuthorizationMode::Webhook {
            cache_authorized_ttl: Duration::from_secs(300),
            cache_unauthorized_ttl: Duration::from_secs(30)
        }
    );
    assert!(warned(&l, "authentication").is_none(), "the webhook is an authenticator: {:?}", l.warnings);
    assert!(warned(&l, "authorization.mode").is_none(), "{:?}", l.warnings);
    let body = "authentication: {webhook: {enabled: true, cacheTTL: 10s}}\n\
                authorization: {mode: Webhook, webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 1s}}\n";
    let c = ok(&["--kubeconfig", &kc], Some(body)).config;
    assert_eq!(c.server.auth.token_webhook, Some(TokenWebhookConfig { cache_ttl: Duration::from_secs(10) }));
    assert_eq!(
        c.server.auth.authorization,
        AuthorizationMode::Webhook {
            cache_authorized_ttl: Duration::from_secs(60),
            cache_unauthorized_ttl: Duration::from_secs(1)
        }
    );
    let c = ok(
        &["--kubeconfig", &kc, "--authentication-token-webhook=false", "--authorization-mode", "AlwaysAllow"],
        Some("authentication: {webhook: {enabled: true}}\nauthorization: {mode: Webhook}\n"),
    )
    .config;
    assert_eq!(c.server.auth.token_webhook, None, "the flag wins over the file");
    assert_eq!(c.server.auth.authorization, AuthorizationMode::AlwaysAllow);
    let c = ok(
        &[
            "--kubeconfig",
            &kc,
            "--authentication-token-webhook",
            "--authentication-token-webhook-cache-ttl",
            "0s",
            "--authorization-mode",
            "Webhook",
            "--authorization-webhook-cache-authorized-ttl",
            "2s",
            "--authorization-webhook-cache-unauthorized-ttl",
            "0s",
        ],
        None,
    )
    .config;
    assert_eq!(c.server.auth.token_webhook, Some(TokenWebhookConfig { cache_ttl: Duration::ZERO }));
    assert_eq!(
        c.server.auth.authorization,
        AuthorizationMode::Webhook {
            cache_authorized_ttl: Duration::from_secs(2),
            cache_unauthorized_ttl: Duration::ZERO
        }
    );
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
    assert!(e.starts_with("config file /etc/nodelet/config.yaml: port: invalid i64 at line "), "{e}");
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
fn the_example_config_in_deploy_is_valid_and_warns_only_that_the_main_port_needs_an_authenticator() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/kubelet-config.yaml");
    let f = ConfigFile::read(&path).expect("example parses");
    let l = Config::resolve(&args(&[]), Some(f), &host()).expect("example validates");
    // As installed, the main port refuses every request until the operator sets a client CA or a token
    // file (deploy/install.sh cannot know them): that one warning says so at start.
    let unexpected: Vec<_> = l
        .warnings
        .iter()
        .filter(|w| !NOT_YET_ENFORCED.contains(&w.field.as_str()) && w.field != "authentication")
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
    assert!(
        l.warnings
            .iter()
            .any(|w| w.field == "authentication" && w.message.contains("will refuse every request")),
        "{:?}",
        l.warnings
    );
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
    use nodelet_resources::model::pod::PodSource;
    use nodelet_resources::pod::validation::prepare_value;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
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
            nodelet_shared::yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
        nodelet_shared::yaml::from_str(&std::fs::read_to_string(dir.join("web.yaml")).expect("web"))
            .expect("yaml");
    assert_eq!(web["spec"]["containers"][0]["ports"][0]["hostPort"], 18080);
}

#[test]
fn container_gc_fields_are_read_and_errors_name_them() {
    let default = ok(&[], None).config.container_gc;
    assert_eq!(default, nodelet_resources::pod::gc::ContainerGcPolicy::default());
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
            "evictionHard: {imagefs.available: 20%}\nnodelet: {imageGCPeriod: 1m, evictionMonitoringPeriod: 2s, localStorageEntryBudget: 50}\n",
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
    assert_eq!(e.local_storage_entry_budget, 50);
    let gc = &l.config.image_gc;
    assert_eq!((gc.high_threshold_percent, gc.low_threshold_percent), (70, 60));
    assert_eq!((gc.minimum_age, gc.period), (Duration::from_secs(300), Duration::from_secs(60)));

    let defaults = ok(&[], None);
    assert_eq!(defaults.config.eviction.monitoring_period, Duration::from_secs(10));
    assert_eq!(defaults.config.eviction.local_storage_entry_budget, 200_000);
    let zero = load(&[], Some("nodelet: {localStorageEntryBudget: 0}\n")).map(drop);
    assert!(
        zero.as_ref().is_err_and(|e| e.to_string().contains("nodelet.localStorageEntryBudget")),
        "{zero:?}"
    );
    assert!(defaults.config.eviction.local_storage_capacity_isolation, "on by default, as the kubelet");
    let off = ok(&[], Some("localStorageCapacityIsolation: false\n"));
    assert!(!off.config.eviction.local_storage_capacity_isolation);
    assert_eq!(warned(&off, "localStorageCapacityIsolation"), None, "read, not ignored");
    assert_eq!(defaults.config.image_gc.period, Duration::from_secs(300));
    assert_eq!(defaults.config.housekeeping_interval, Duration::from_secs(10));
    let l = ok(&[], Some("nodelet: {housekeepingInterval: 2s}\n"));
    assert_eq!(l.config.housekeeping_interval, Duration::from_secs(2));
    assert!(err(&[], Some("nodelet: {housekeepingInterval: 0s}\n")).contains("nodelet.housekeepingInterval"));
    assert_eq!(defaults.config.pleg_relist_period, Duration::from_secs(1));
    assert_eq!(defaults.config.pleg_evented_relist_period, Duration::from_secs(60));
    let p = ok(&[], Some("nodelet: {plegEventedRelistPeriod: 5m}\n"));
    assert_eq!(p.config.pleg_evented_relist_period, Duration::from_secs(300));
    assert!(
        err(&[], Some("nodelet: {plegEventedRelistPeriod: 0s}\n"))
            .contains("nodelet.plegEventedRelistPeriod")
    );
    assert!(err(&["--eviction-hard", "memory.free<1Gi"], None).contains("--eviction-hard"));
    assert!(err(&["--eviction-hard", "memory.available=1Gi"], None).contains("not signal<value"));
    assert!(err(&["--image-gc-high-threshold", "101"], None).contains("--image-gc-high-threshold"));
    assert!(err(&["--eviction-soft", "memory.available<1Gi"], None).contains("needs a grace period"));
}

/// A kubeconfig file that exists (its content is not read by the config module).
fn kubeconfig() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubelet.kubeconfig");
    std::fs::write(&path, "apiVersion: v1\nkind: Config\n").expect("write");
    let s = path.to_str().expect("utf8").to_owned();
    (dir, s)
}

#[test]
fn cluster_mode_defaults_are_the_kubelets() {
    let (_dir, kc) = kubeconfig();
    let l = ok(&["--kubeconfig", &kc], None);
    let c = l.config.cluster.expect("cluster mode");
    assert_eq!(c.kubeconfig, PathBuf::from(&kc));
    assert_eq!(c.node_ips, Vec::<IpAddr>::new(), "detected");
    assert!(c.node_labels.is_empty());
    assert!(c.register_node);
    assert!(c.register_with_taints.is_empty());
    assert_eq!((c.kube_api_qps, c.kube_api_burst), (50.0, 100));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(c.node_lease_duration, Duration::from_secs(40));
    assert!(!l.warnings.iter().any(|w| w.message.contains("--kubeconfig")), "{:?}", l.warnings);
}

#[test]
fn cluster_mode_reads_flags_and_file_fields_and_flags_win() {
    use k8s_openapi::api::core::v1::Taint;
    let (_dir, kc) = kubeconfig();
    let body = "registerNode: true\nregisterWithTaints:\n- {key: dedicated, value: gpu, effect: NoSchedule}\n\
                - {key: example.com/maint, effect: NoExecute}\nkubeAPIQPS: 20\nkubeAPIBurst: 40\n\
                nodeStatusUpdateFrequency: 20s\nnodeStatusReportFrequency: 1m\nnodeLeaseDurationSeconds: 60\n";
    let l = ok(&["--kubeconfig", &kc], Some(body));
    let c = l.config.cluster.expect("cluster mode");
    assert_eq!(
        c.register_with_taints,
        vec![
            Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                time_added: None
            },
            Taint {
                key: "example.com/maint".into(),
                value: None,
                effect: "NoExecute".into(),
                time_added: None
            },
        ]
    );
    assert_eq!((c.kube_api_qps, c.kube_api_burst), (20.0, 40));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(20));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(60), "set explicitly: kept");
    assert_eq!(c.node_lease_duration, Duration::from_secs(60));
    assert!(!l.warnings.iter().any(|w| w.message.contains("--kubeconfig")), "{:?}", l.warnings);

    let c = ok(
        &[
            "--kubeconfig",
            &kc,
            "--register-node=false",
            "--register-with-taints",
            "a=1:PreferNoSchedule, b:NoSchedule",
            "--kube-api-qps",
            "7.5",
            "--kube-api-burst",
            "9",
            "--node-status-update-frequency",
            "4s",
            "--node-ip",
            "10.1.2.3, fd00::3",
            "--node-labels",
            "zone=a,example.com/rack=r1",
            "--node-labels",
            "zone=b, node.kubernetes.io/pool = blue,kubernetes.io/arch=amd64",
        ],
        Some(body),
    )
    .config
    .cluster
    .expect("cluster mode");
    assert!(!c.register_node, "flag wins");
    assert_eq!(
        c.register_with_taints,
        vec![
            Taint {
                key: "a".into(),
                value: Some("1".into()),
                effect: "PreferNoSchedule".into(),
                time_added: None
            },
            Taint { key: "b".into(), value: None, effect: "NoSchedule".into(), time_added: None },
        ],
        "the flag replaces the file's list"
    );
    assert_eq!((c.kube_api_qps, c.kube_api_burst), (7.5, 9));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(4));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(60), "the file's explicit value stays");
    assert_eq!(c.node_ips, vec!["10.1.2.3".parse::<IpAddr>().expect("ip"), "fd00::3".parse().expect("ip")]);
    let labels: Vec<(&str, &str)> = c.node_labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        labels,
        vec![
            ("example.com/rack", "r1"),
            ("kubernetes.io/arch", "amd64"),
            ("node.kubernetes.io/pool", "blue"),
            ("zone", "b")
        ],
        "repeatable, later values win, spaces trimmed"
    );
    let c =
        ok(&["--kubeconfig", &kc, "--register-with-taints", ""], Some(body)).config.cluster.expect("cluster");
    assert!(c.register_with_taints.is_empty(), "an empty flag clears the file's taints");
    let c = ok(&["--kubeconfig", &kc, "--kube-api-qps", "0"], Some(body)).config.cluster.expect("cluster");
    assert_eq!(c.kube_api_qps, 50.0, "0 means the default");
}

#[test]
fn report_frequency_follows_an_explicit_update_frequency() {
    let (_dir, kc) = kubeconfig();
    let c =
        ok(&["--kubeconfig", &kc, "--node-status-update-frequency", "30s"], None).config.cluster.expect("c");
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(30), "flag");
    let c = ok(&["--kubeconfig", &kc], Some("nodeStatusUpdateFrequency: 15s\n")).config.cluster.expect("c");
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(15), "file");
    let c = ok(&["--kubeconfig", &kc], Some("nodeStatusReportFrequency: 2m\n")).config.cluster.expect("c");
    assert_eq!(
        (c.node_status_update_frequency, c.node_status_report_frequency),
        (Duration::from_secs(10), Duration::from_secs(120))
    );
}

#[test]
fn kubeconfig_is_made_absolute_and_must_be_readable() {
    let (dir, _kc) = kubeconfig();
    let h = HostFacts { hostname: Ok("n".into()), cwd: dir.path().to_owned() };
    let c =
        Config::resolve(&args(&["--kubeconfig", "kubelet.kubeconfig"]), None, &h).expect("relative").config;
    assert_eq!(c.cluster.expect("cluster").kubeconfig, dir.path().join("kubelet.kubeconfig"));
    let missing = dir.path().join("missing.kubeconfig");
    let e = err(&["--kubeconfig", missing.to_str().expect("utf8")], None);
    assert!(e.starts_with("invalid --kubeconfig: cannot read") && e.contains("missing.kubeconfig"), "{e}");
    let e = err(&["--kubeconfig", dir.path().to_str().expect("utf8")], None);
    assert!(e.contains("--kubeconfig") && e.contains("directory"), "{e}");
    let e = Cli::try_parse_from(["nodelet", "--kubeconfig", ""]).expect_err("empty path");
    assert!(e.to_string().contains("--kubeconfig"), "{e}");
}

#[test]
fn bootstrap_kubeconfig_lets_the_kubeconfig_be_missing_and_needs_it_named() {
    let (dir, kc) = kubeconfig();
    let boot = kc.clone();
    let missing = dir.path().join("node.kubeconfig");
    let missing = missing.to_str().expect("utf8");
    let c = ok(&["--bootstrap-kubeconfig", &boot, "--kubeconfig", missing], None)
        .config
        .cluster
        .expect("cluster");
    assert_eq!(c.bootstrap_kubeconfig.as_deref(), Some(Path::new(&boot)));
    assert_eq!(c.kubeconfig, PathBuf::from(missing));
    assert_eq!(c.cert_dir, PathBuf::from("/var/lib/nodelet/pki"));
    assert!(!c.rotate_certificates && !c.server_tls_bootstrap, "the kubelet's defaults");
    // without --bootstrap-kubeconfig a missing kubeconfig is still an error
    let e = err(&["--kubeconfig", missing], None);
    assert!(e.starts_with("invalid --kubeconfig: cannot read"), "{e}");
    let e = err(&["--bootstrap-kubeconfig", &boot], None);
    assert!(e.contains("--bootstrap-kubeconfig: needs --kubeconfig"), "{e}");
    let e = err(&["--bootstrap-kubeconfig", "/etc/none.kubeconfig", "--kubeconfig", &kc], None);
    assert!(e.starts_with("invalid --bootstrap-kubeconfig: cannot read /etc/none.kubeconfig"), "{e}");
}

#[test]
fn certificate_settings_are_read_and_checked() {
    let (_dir, kc) = kubeconfig();
    let l = ok(&["--kubeconfig", &kc], Some("rotateCertificates: true\nserverTLSBootstrap: true\n"));
    let c = l.config.cluster.clone().expect("cluster");
    assert!(c.rotate_certificates && c.server_tls_bootstrap);
    assert_eq!(warned(&l, "rotateCertificates"), None);
    let e = err(
        &["--kubeconfig", &kc],
        Some("serverTLSBootstrap: true\ntlsCertFile: /etc/c.crt\ntlsPrivateKeyFile: /etc/c.key\n"),
    );
    assert!(e.contains("serverTLSBootstrap") && e.contains("tlsCertFile"), "{e}");
    // without --kubeconfig they do nothing: warned
    let l = ok(&[], Some("rotateCertificates: true\nserverTLSBootstrap: true\n"));
    assert!(warned(&l, "rotateCertificates").is_some_and(|m| m.contains("no effect without --kubeconfig")));
    assert!(warned(&l, "serverTLSBootstrap").is_some_and(|m| m.contains("no effect without --kubeconfig")));
}

#[test]
fn node_labels_follow_the_kubelets_rules() {
    let (_dir, kc) = kubeconfig();
    let label_err = |labels: &str| err(&["--kubeconfig", &kc, &format!("--node-labels={labels}")], None);
    let allowed = [
        "kubernetes.io/hostname=h",
        "topology.kubernetes.io/zone=z1",
        "failure-domain.beta.kubernetes.io/region=r",
        "beta.kubernetes.io/os=linux",
        "node.kubernetes.io/instance-type=m5",
        "node.kubernetes.io/anything=x",
        "kubelet.kubernetes.io/x=",
        "a.kubelet.kubernetes.io/x=1",
        "sub.node.kubernetes.io/y=2",
        "example.com/k8s.io=1",
        "k8s.io.example.com/x=1",
    ];
    for label in allowed {
        ok(&["--kubeconfig", &kc, "--node-labels", label], None);
    }
    for label in [
        "node-role.kubernetes.io/worker=",
        "kubernetes.io/role=worker",
        "k8s.io/x=1",
        "sub.k8s.io/x=1",
        "foo.kubernetes.io/x=1",
    ] {
        let e = label_err(label);
        let key = label.split('=').next().expect("key");
        assert!(
            e.starts_with("invalid --node-labels:")
                && e.contains(&format!("{key:?}"))
                && e.contains("kubernetes.io"),
            "{label}: {e}"
        );
    }
    for (label, what) in [
        ("Bad_Prefix/x=1", "prefix"),
        ("a/b/c=1", "at most one '/'"),
        ("/x=1", "prefix"),
        ("-x=1", "alphanumeric"),
        ("x=-bad", "value"),
        (&format!("{}=1", "k".repeat(64)), "63"),
        (&format!("x={}", "v".repeat(64)), "63"),
        ("novalue", "key=value"),
        ("=v", "empty"),
    ] {
        let e = label_err(label);
        assert!(e.starts_with("invalid --node-labels:") && e.contains(what), "{label}: {e}");
    }
}

#[test]
fn taints_are_checked_in_flags_and_file() {
    let (_dir, kc) = kubeconfig();
    for (spec, what) in [
        ("a=1:NoWay", "effect \"NoWay\""),
        ("a=1", "key[=value]:Effect"),
        ("a=1=2:NoSchedule", "key[=value]:Effect"),
        ("bad key:NoSchedule", "taint key"),
        ("a=bad value:NoSchedule", "value"),
        ("a:NoSchedule,a=2:NoSchedule", "twice"),
    ] {
        let e = err(&["--kubeconfig", &kc, "--register-with-taints", spec], None);
        assert!(e.starts_with("invalid --register-with-taints:") && e.contains(what), "{spec}: {e}");
    }
    assert!(
        ok(&["--kubeconfig", &kc, "--register-with-taints", "a:NoSchedule,a:NoExecute"], None)
            .config
            .cluster
            .is_some_and(|c| c.register_with_taints.len() == 2)
    );
    let e = err(&["--kubeconfig", &kc], Some("registerWithTaints: [{key: a, effect: Never}]\n"));
    assert!(e.contains("registerWithTaints[0] in /etc/nodelet/config.yaml") && e.contains("Never"), "{e}");
    let e =
        err(&["--kubeconfig", &kc], Some("registerWithTaints: [{key: a, effect: NoSchedule}, {value: x}]\n"));
    assert!(e.contains("registerWithTaints[1]") && e.contains("taint key"), "{e}");
}

#[test]
fn node_ips_qps_burst_and_durations_are_range_checked() {
    let (_dir, kc) = kubeconfig();
    let e = |flags: &[&str], body: Option<&str>| {
        let mut v = vec!["--kubeconfig", kc.as_str()];
        v.extend_from_slice(flags);
        err(&v, body)
    };
    for (ip, what) in [
        ("10.0.0.300", "not an IP address"),
        ("10.0.0.1,", "not an IP address"),
        ("10.0.0.1,10.0.0.2", "one IPv4 and one IPv6"),
        ("10.0.0.1,fd00::1,10.0.0.2", "at most two"),
        ("0.0.0.0", "not supported"),
    ] {
        let msg = e(&["--node-ip", ip], None);
        assert!(msg.starts_with("invalid --node-ip:") && msg.contains(what), "{ip}: {msg}");
    }
    assert!(e(&["--kube-api-qps", "-1"], None).starts_with("invalid --kube-api-qps:"));
    assert!(e(&["--kube-api-qps", "NaN"], None).starts_with("invalid --kube-api-qps:"));
    assert!(e(&[], Some("kubeAPIQPS: -5\n")).contains("kubeAPIQPS in /etc/nodelet/config.yaml"));
    assert!(e(&["--kube-api-burst", "0"], None).starts_with("invalid --kube-api-burst:"));
    assert!(e(&[], Some("kubeAPIBurst: 0\n")).contains("kubeAPIBurst in"));
    assert!(e(&[], Some("kubeAPIBurst: -3\n")).contains("kubeAPIBurst in"));
    assert!(e(&["--node-status-update-frequency", "0s"], None).contains("--node-status-update-frequency"));
    assert!(e(&[], Some("nodeStatusUpdateFrequency: 0s\n")).contains("nodeStatusUpdateFrequency in"));
    assert!(e(&[], Some("nodeStatusReportFrequency: 0s\n")).contains("nodeStatusReportFrequency in"));
    assert!(e(&[], Some("nodeLeaseDurationSeconds: 0\n")).contains("nodeLeaseDurationSeconds in"));
    assert!(e(&["--kube-api-burst", "-1"], None).starts_with("invalid --kube-api-burst:"));
}

#[test]
fn cluster_settings_without_kubeconfig_are_validated_and_warned_about() {
    let l = ok(
        &["--node-ip", "10.0.0.5", "--node-labels", "a=b", "--register-node=false", "--kube-api-burst", "5"],
        Some(
            "registerWithTaints: [{key: a, effect: NoSchedule}]\nkubeAPIQPS: 10\nnodeLeaseDurationSeconds: 20\n\
              nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 1m\nclusterDomain: cluster.local\n",
        ),
    );
    assert_eq!(l.config.cluster, None);
    for field in [
        "--node-ip",
        "--node-labels",
        "--register-node",
        "--kube-api-burst",
        "registerWithTaints",
        "kubeAPIQPS",
        "nodeLeaseDurationSeconds",
        "nodeStatusUpdateFrequency",
        "nodeStatusReportFrequency",
    ] {
        assert!(
            warned(&l, field).is_some_and(|m| m.contains("no effect without --kubeconfig")),
            "{field}: {:?}",
            l.warnings
        );
    }
    assert_eq!(warned(&l, "clusterDomain"), None, "cluster DNS settings apply in standalone mode too");
    assert_eq!(warned(&l, "registerNode"), None, "given as a flag: named once, as the flag");
    assert!(ok(&[], None).warnings.iter().all(|w| !w.message.contains("--kubeconfig")));
    assert!(
        err(&["--node-labels", "kubernetes.io/role=x"], None).contains("--node-labels"),
        "still validated"
    );
    assert!(err(&["--node-ip", "nowhere"], None).contains("--node-ip"), "still validated");
}

#[test]
fn cluster_dns_and_domain_are_parsed_in_standalone_mode_too() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let c = ok(&[], Some("clusterDNS: [10.96.0.10, \"fd00::a\"]\nclusterDomain: Cluster.Local.\n")).config;
    assert_eq!(c.pods.cluster_dns, vec![ip("10.96.0.10"), ip("fd00::a")]);
    assert_eq!(c.pods.cluster_domain, "cluster.local", "lower-cased, trailing dot trimmed");
    let c = ok(
        &[
            "--cluster-dns",
            "10.0.0.10,10.0.0.11",
            "--cluster-dns",
            "10.0.0.12",
            "--cluster-domain",
            "example.org",
        ],
        Some("clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n"),
    )
    .config;
    assert_eq!(
        c.pods.cluster_dns,
        vec![ip("10.0.0.10"), ip("10.0.0.11"), ip("10.0.0.12")],
        "flags replace the file"
    );
    assert_eq!(c.pods.cluster_domain, "example.org");
    let c = ok(
        &["--cluster-dns", "", "--cluster-domain", ""],
        Some("clusterDNS: [10.96.0.10]\nclusterDomain: x\n"),
    )
    .config;
    assert_eq!((c.pods.cluster_dns.len(), c.pods.cluster_domain.as_str()), (0, ""), "empty flags clear");
    assert!(err(&["--cluster-dns", "10.0.0.1,dns.local"], None).starts_with("invalid --cluster-dns:"));
    let e = err(&[], Some("clusterDNS: [10.96.0.10, nope]\n"));
    assert!(e.contains("clusterDNS[1] in /etc/nodelet/config.yaml") && e.contains("\"nope\""), "{e}");
    assert!(err(&["--cluster-domain", "bad_domain"], None).starts_with("invalid --cluster-domain:"));
    assert!(err(&[], Some("clusterDomain: \".\"\n")).contains("clusterDomain in"));
    let l = ok(&[], Some("clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n"));
    assert!(warned(&l, "clusterDNS").is_none() && warned(&l, "clusterDomain").is_none(), "{:?}", l.warnings);
}

#[test]
fn the_config_file_is_yaml_as_the_kubelet_reads_it_within_limits() {
    // YAML 1.1 octal (go-yaml v2 reads 0144 as 100), anchors, aliases.
    let l = ok(&[], Some("maxPods: 0144\nstaticPodURLHeader:\n  X-A: &v [\"a\"]\n  X-B: *v\n"));
    assert_eq!(l.config.pods.max_pods, 100);
    assert_eq!(
        l.config.sources.static_pod_url_headers,
        vec![("X-A".to_owned(), "a".to_owned()), ("X-B".to_owned(), "a".to_owned())]
    );

    // A "billion laughs" is refused, naming the file and the limit.
    let mut bomb = String::from("x: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for pair in ["a", "b", "c", "d", "e", "f", "g", "h", "i"].windows(2) {
        bomb.push_str(&format!(
            "x{}: &{} [{}]\n",
            pair[1],
            pair[1],
            vec![format!("*{}", pair[0]); 9].join(", ")
        ));
    }
    let e = err(&[], Some(&bomb));
    assert!(e.starts_with("config file /etc/nodelet/config.yaml: .: the "), "{e}");
    assert!(e.contains("aliases expand"), "{e}");
    let e = err(&[], Some(&format!("nodelet: {}", "[".repeat(10_000))));
    assert!(e.starts_with("config file /etc/nodelet/config.yaml: .: nested more than 64 levels deep"), "{e}");

    let e = err(&[], Some("port: 1\n---\nport: 2\n"));
    assert!(e.ends_with(".: holds more than one YAML document; nodelet reads exactly one"), "{e}");
    let e = match ConfigFile::parse(Path::new("/c.yaml"), "# only a comment\n") {
        Ok(_) => panic!("a file without a document is refused"),
        Err(e) => e.to_string(),
    };
    assert!(e.starts_with("config file /c.yaml: "), "{e}");
}

#[test]
fn logging_format_and_verbosity_come_from_the_flags_over_the_file() {
    let c = ok(&[], None).config;
    assert_eq!((c.logging.format, c.logging.verbosity), (LogFormat::Text, None), "text by default");
    let c = ok(&[], Some("logging: {format: json, verbosity: 4}\n")).config;
    assert_eq!((c.logging.format, c.logging.verbosity), (LogFormat::Json, Some(4)));
    let c =
        ok(&["--logging-format", "text", "-v", "2"], Some("logging: {format: json, verbosity: 4}\n")).config;
    assert_eq!((c.logging.format, c.logging.verbosity), (LogFormat::Text, Some(2)), "flags win");
    let e = err(&["--logging-format", "xml"], None);
    assert!(
        e.contains("--logging-format") && e.contains("\"xml\"") && e.contains("\"json\", \"text\""),
        "{e}"
    );
    let e = err(&[], Some("logging: {format: logfmt}\n"));
    assert!(e.contains("logging.format in /etc/nodelet/config.yaml"), "{e}");
    let e = err(&[], Some("logging: {verbosity: 300}\n"));
    assert!(e.contains("logging.verbosity"), "{e}");
    let l = ok(&[], Some("logging: {format: json, flushFrequency: 5s, vmodule: []}\n"));
    assert!(
        warned(&l, "logging.flushFrequency").is_some_and(|m| m.contains("not supported")),
        "{:?}",
        l.warnings
    );
    assert!(warned(&l, "logging.format").is_none());
    let l = ok(&[], Some("logging: {formt: json}\n"));
    assert!(warned(&l, "logging.formt").is_some_and(|m| m.contains("typo")), "{:?}", l.warnings);
}

#[test]
fn configz_shows_the_effective_configuration_with_flags_and_file_fields_merged() {
    let l = ok(
        &["--sync-frequency", "45s", "--max-pods", "20", "--logging-format", "json"],
        Some(
            "containerLogMaxFiles: 3\nmaxPods: 50\nstaticPodURL: https://user:hunter2@example.invalid/m?token=tok3n\n\
             staticPodURLHeader: {Authorization: [Bearer s3cret]}\nnodelet: {cniBridge: br9}\n",
        ),
    );
    let z = configz::configz(&l.config);
    let k = &z["kubeletconfig"];
    assert!(
        k.get("kind").is_none() && k.get("apiVersion").is_none(),
        "the kubelet's configz has neither: {k}"
    );
    assert_eq!(k["syncFrequency"], "45s", "a flag");
    assert_eq!(k["maxPods"], 20, "the flag over the file");
    assert_eq!(k["containerLogMaxFiles"], 3, "a file field");
    assert_eq!(k["fileCheckFrequency"], "20s", "a default");
    assert_eq!(k["containerLogMaxSize"], "10Mi");
    assert_eq!(k["port"], 10250);
    assert_eq!(k["readOnlyPort"], 0);
    assert_eq!(k["address"], "0.0.0.0");
    assert_eq!(k["evictionHard"]["memory.available"], "100Mi");
    assert_eq!(k["evictionHard"]["nodefs.available"], "10%");
    assert_eq!(k["authorization"]["mode"], "AlwaysAllow");
    assert_eq!(k["authentication"]["anonymous"]["enabled"], false);
    assert_eq!(k["logging"]["format"], "json");
    assert_eq!(k["nodelet"]["cniBridge"], "br9");
    assert!(k.get("registerNode").is_none(), "cluster-mode fields only in cluster mode");
    let text = z.to_string();
    assert!(
        !text.contains("hunter2") && !text.contains("s3cret") && !text.contains("tok3n"),
        "no secrets: {text}"
    );
    assert_eq!(k["staticPodURL"], "https://<redacted>@example.invalid/m?<redacted>");
    assert_eq!(k["staticPodURLHeader"]["Authorization"][0], "<redacted>");
}

#[test]
fn pod_security_levels_host_paths_and_seccomp_default_are_read() {
    let defaults = ok(&[], None).config;
    assert_eq!(defaults.pods.pod_security, super::PodSecurityLevels::default());
    let levels = defaults.pods.pod_security;
    assert_eq!(
        [levels.file, levels.url, levels.http, levels.api],
        [Level::Privileged, Level::Baseline, Level::Baseline, Level::Privileged]
    );
    assert!(!defaults.pods.seccomp_default);
    assert!(defaults.pods.allow_privileged, "unset allows privileged pods, as the kubelet's default");
    assert_eq!(defaults, ok(&["--allow-privileged=true"], None).config);

    let l = ok(
        &["--allow-privileged=false", "--port", "11250", "--read-only-port", "10255"],
        Some(
            "seccompDefault: true\nnodelet:\n  podSecurity: {file: baseline, api: restricted}\n  \
             allowedHostPaths: [/srv/data]\n",
        ),
    );
    let c = &l.config;
    assert!(c.pods.seccomp_default);
    assert!(warned(&l, "seccompDefault").is_none(), "read, not ignored");
    assert!(!c.pods.allow_privileged);
    let levels = c.pods.pod_security;
    assert_eq!([levels.file, levels.http, levels.api], [Level::Baseline, Level::Baseline, Level::Restricted]);
    assert_eq!(c.pods.allowed_host_paths, vec![PathBuf::from("/srv/data")]);

    let placed = ok(
        &[],
        Some("nodelet:\n  httpPodNamespaces: [edge, default]\n  httpPodLabels: [app, example.com/tier]\n"),
    );
    assert!(warned(&placed, "nodelet.httpPodNamespaces").is_none(), "read, not ignored");
    assert!(
        err(&[], Some("nodelet: {httpPodNamespaces: [Kube_System]}\n"))
            .contains("nodelet.httpPodNamespaces[0]")
    );
    assert!(err(&[], Some("nodelet: {httpPodLabels: [\"a b\"]}\n")).contains("nodelet.httpPodLabels[0]"));

    assert!(err(&[], Some("nodelet: {podSecurity: {http: root}}\n")).contains("nodelet.podSecurity.http"));
    assert!(
        err(&[], Some("nodelet: {allowedHostPaths: [relative]}\n")).contains("nodelet.allowedHostPaths[0]")
    );
    assert!(err(&[], Some("nodelet: {allowedHostPaths: [/a/../etc]}\n")).contains("without `..`"));
}

#[test]
fn allowed_unsafe_sysctls_come_from_the_file_or_the_flag_and_must_be_namespaced() {
    assert!(ok(&[], None).config.pods.allowed_unsafe_sysctls.is_empty());
    let l = ok(&[], Some("allowedUnsafeSysctls: [\"kernel.msg*\", net.core.somaxconn]\n"));
    assert_eq!(
        l.config.pods.allowed_unsafe_sysctls,
        vec!["kernel.msg*".to_owned(), "net.core.somaxconn".to_owned()]
    );
    assert_eq!(warned(&l, "allowedUnsafeSysctls"), None, "read, not ignored");
    let z = configz::configz(&l.config);
    assert_eq!(z["kubeletconfig"]["allowedUnsafeSysctls"][0], "kernel.msg*");
    let l = ok(
        &["--allowed-unsafe-sysctls", "kernel.msg*,kernel.sem", "--allowed-unsafe-sysctls=fs.mqueue.*"],
        Some("allowedUnsafeSysctls: [net.core.somaxconn]\n"),
    );
    assert_eq!(
        l.config.pods.allowed_unsafe_sysctls,
        vec!["kernel.msg*", "kernel.sem", "fs.mqueue.*"],
        "the flag wins"
    );
    let e = err(&[], Some("allowedUnsafeSysctls: [kernel.panic]\n"));
    assert!(e.contains("allowedUnsafeSysctls") && e.contains("not known to be namespaced"), "{e}");
    let e = err(&["--allowed-unsafe-sysctls", "Kernel.msgmax"], None);
    assert!(e.contains("--allowed-unsafe-sysctls") && e.contains("must have at most 253 characters"), "{e}");
}

#[test]
fn a_pod_pids_limit_needs_a_cgroup_root_for_its_pod_cgroups() {
    let e = err(&[], Some("podPidsLimit: 100\n"));
    assert!(e.contains("podPidsLimit") && e.contains("cgroupRoot"), "{e}");
    let e = err(&["--pod-max-pids", "100", "--cgroup-root", "/"], None);
    assert!(e.contains("--pod-max-pids") && e.contains("cgroupRoot"), "{e}");
    let l = ok(&["--pod-max-pids", "100", "--cgroup-root", "/nodelet"], None);
    assert_eq!(l.config.pods.pod_pids_limit, Some(100));
    // No limit needs nothing.
    for unlimited in ["-1", "0"] {
        assert_eq!(ok(&["--pod-max-pids", unlimited], None).config.pods.pod_pids_limit, None);
    }
}

#[test]
fn the_grace_period_bound_comes_from_the_nodelet_section_or_its_flag() {
    assert_eq!(ok(&[], None).config.pods.max_grace_period, None);
    let l = ok(&[], Some("nodelet:\n  maxTerminationGracePeriodSeconds: 60\n"));
    assert_eq!(l.config.pods.max_grace_period, Some(Duration::from_secs(60)));
    let z = configz::configz(&l.config);
    assert_eq!(z["kubeletconfig"]["nodelet"]["maxTerminationGracePeriodSeconds"], 60);
    let l = ok(
        &["--max-termination-grace-period", "5"],
        Some("nodelet:\n  maxTerminationGracePeriodSeconds: 60\n"),
    );
    assert_eq!(l.config.pods.max_grace_period, Some(Duration::from_secs(5)), "the flag over the file");
    let e = err(&[], Some("nodelet:\n  maxTerminationGracePeriodSeconds: -1\n"));
    assert!(e.contains("nodelet.maxTerminationGracePeriodSeconds"), "{e}");
    assert!(err(&["--max-termination-grace-period", "-3"], None).contains("--max-termination-grace-period"));
}

/// The kubelet flags of file fields that had none in nodelet (`--enable-server`, `--rotate-certificates`, …)
/// set those fields, over the file as every flag.
#[test]
fn kubelet_flags_of_file_fields_set_them_over_the_file() {
    let (_dir, kc) = kubeconfig();
    let body = "enableServer: true\nseccompDefault: false\nvolumeStatsAggPeriod: 2m\nrotateCertificates: false\n\
                serverTLSBootstrap: false\nlocalStorageCapacityIsolation: true\ncontainerLogMaxSize: 1Mi\n\
                containerLogMaxFiles: 3\nevictionMaxPodGracePeriod: 5\n\
                nodelet:\n  housekeepingInterval: 30s\n  containerGC: {period: 5s, minAge: 1m, \
                maxPerPodContainer: 2, maxContainers: 10}\n";
    let from_file = ok(&["--kubeconfig", &kc], Some(body)).config;
    let l = ok(
        &[
            "--kubeconfig",
            &kc,
            "--enable-server=false",
            "--seccomp-default",
            "--volume-stats-agg-period=30s",
            "--rotate-certificates",
            "--rotate-server-certificates=true",
            "--local-storage-capacity-isolation=false",
            "--container-log-max-size=20Mi",
            "--container-log-max-files=7",
            "--eviction-max-pod-grace-period=60",
            "--housekeeping-interval=3s",
            "--minimum-container-ttl-duration=2m",
            "--maximum-dead-containers-per-container=4",
            "--maximum-dead-containers=-1",
        ],
        Some(body),
    );
    let c = l.config.clone();
    assert!(from_file.server.enabled && !c.server.enabled);
    assert!(!from_file.pods.seccomp_default && c.pods.seccomp_default);
    assert_eq!(
        (from_file.storage.volume_stats_agg_period, c.storage.volume_stats_agg_period),
        (Duration::from_secs(120), Duration::from_secs(30))
    );
    let (file_cluster, cluster) = (from_file.cluster.expect("cluster"), c.cluster.expect("cluster"));
    assert!(!file_cluster.rotate_certificates && cluster.rotate_certificates);
    assert!(!file_cluster.server_tls_bootstrap && cluster.server_tls_bootstrap);
    assert!(
        from_file.eviction.local_storage_capacity_isolation && !c.eviction.local_storage_capacity_isolation
    );
    assert_eq!((from_file.container_logs.max_size, c.container_logs.max_size), (1 << 20, 20 << 20));
    assert_eq!((from_file.container_logs.max_files, c.container_logs.max_files), (3, 7));
    assert_eq!((from_file.eviction.max_pod_grace_period, c.eviction.max_pod_grace_period), (5, 60));
    assert_eq!(
        (from_file.housekeeping_interval, c.housekeeping_interval),
        (Duration::from_secs(30), Duration::from_secs(3))
    );
    let (file_gc, gc) = (from_file.container_gc, c.container_gc);
    assert_eq!((file_gc.min_age, gc.min_age), (Duration::from_secs(60), Duration::from_secs(120)));
    assert_eq!((file_gc.max_per_pod_container, gc.max_per_pod_container), (2, 4));
    assert_eq!((file_gc.max_containers, gc.max_containers), (Some(10), None));
    assert_eq!(gc.period, Duration::from_secs(5), "the file's other containerGC fields stay");
    for field in
        ["enableServer", "seccompDefault", "rotateCertificates", "serverTLSBootstrap", "containerLogMaxSize"]
    {
        assert_eq!(warned(&l, field), None, "{field} is acted on");
    }

    // without a file, the flags alone
    let c = ok(&["--maximum-dead-containers=25", "--enable-server=false"], None).config;
    assert_eq!(c.container_gc.max_containers, Some(25));
    assert!(!c.server.enabled);
    // `--rotate-certificates` without --kubeconfig: accepted, and the usual cluster mode warning
    let l = ok(&["--rotate-certificates"], None);
    assert!(warned(&l, "rotateCertificates").is_some_and(|m| m.contains("--kubeconfig")), "{:?}", l.warnings);
}

#[test]
fn kubelet_flags_of_file_fields_are_checked_and_errors_name_the_flag() {
    for (flags, flag) in [
        (&["--volume-stats-agg-period=0s"][..], "--volume-stats-agg-period"),
        (&["--housekeeping-interval=0s"], "--housekeeping-interval"),
        (&["--container-log-max-size=lots"], "--container-log-max-size"),
        (&["--container-log-max-files=1"], "--container-log-max-files"),
        (&["--eviction-max-pod-grace-period=9999999999"], "--eviction-max-pod-grace-period"),
        (&["--maximum-dead-containers-per-container=0"], "--maximum-dead-containers-per-container"),
        (&["--maximum-dead-containers=99999999999"], "--maximum-dead-containers"),
    ] {
        let e = err(flags, Some("containerLogMaxFiles: 4\n"));
        assert!(e.starts_with(&format!("invalid {flag}:")), "{flags:?}: {e}");
    }
}

// ---- issue 37: authentication and authorization defaults (file defaults for a file, flag defaults for flags)

/// What kubeadm writes: a KubeletConfiguration whose only authentication setting is the client CA.
const CLIENT_CA_ONLY: &str = "authentication: {x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}}\n";

const KUBELET_WEBHOOK_AUTHZ: AuthorizationMode = AuthorizationMode::Webhook {
    cache_authorized_ttl: Duration::from_secs(300),
    cache_unauthorized_ttl: Duration::from_secs(30),
};

#[test]
fn file_default_authentication_webhook_enabled_is_true_in_cluster_mode() {
    let (_dir, kc) = kubeconfig();
    for body in [CLIENT_CA_ONLY, "", "authentication: {}\n", "authentication: {webhook: {}}\n"] {
        let l = ok(&["--kubeconfig", &kc], Some(body));
        assert_eq!(
            l.config.server.auth.token_webhook,
            Some(TokenWebhookConfig { cache_ttl: Duration::from_secs(120) }),
            "a config file defaults authentication.webhook.enabled to true (cacheTTL 2m): {body:?}"
        );
    }
    // The file can still turn it off, and the flag wins over the file.
    let l = ok(&["--kubeconfig", &kc], Some("authentication: {webhook: {enabled: false}}\n"));
    assert_eq!(l.config.server.auth.token_webhook, None);
    let l = ok(&["--kubeconfig", &kc, "--authentication-token-webhook=false"], Some(CLIENT_CA_ONLY));
    assert_eq!(l.config.server.auth.token_webhook, None);
}

#[test]
fn file_default_authentication_anonymous_enabled_is_false() {
    let (_dir, kc) = kubeconfig();
    assert!(!ok(&["--kubeconfig", &kc], Some(CLIENT_CA_ONLY)).config.server.auth.anonymous);
    assert!(!ok(&[], Some("")).config.server.auth.anonymous);
    let l = ok(&["--kubeconfig", &kc], Some("authentication: {anonymous: {enabled: true}}\n"));
    assert!(l.config.server.auth.anonymous, "the file's explicit value is taken");
}

#[test]
fn file_default_authorization_mode_is_webhook_in_cluster_mode() {
    let (_dir, kc) = kubeconfig();
    for body in [CLIENT_CA_ONLY, "", "authorization: {}\n", "authorization: {webhook: {}}\n"] {
        let l = ok(&["--kubeconfig", &kc], Some(body));
        assert_eq!(l.config.server.auth.authorization, KUBELET_WEBHOOK_AUTHZ, "{body:?}");
    }
}

#[test]
fn file_default_cache_ttls_are_the_kubelets_and_zero_in_a_file_means_the_default() {
    let (_dir, kc) = kubeconfig();
    let body = "authentication: {webhook: {cacheTTL: 0s}}\n\
                authorization: {webhook: {cacheAuthorizedTTL: 0s, cacheUnauthorizedTTL: 0s}}\n";
    let l = ok(&["--kubeconfig", &kc], Some(body));
    // The kubelet's v1beta1 defaulting cannot tell 0s from unset: both get 2m, 5m and 30s.
    assert_eq!(
        l.config.server.auth.token_webhook,
        Some(TokenWebhookConfig { cache_ttl: Duration::from_secs(120) })
    );
    assert_eq!(l.config.server.auth.authorization, KUBELET_WEBHOOK_AUTHZ);
    for field in [
        "authentication.webhook.cacheTTL",
        "authorization.webhook.cacheAuthorizedTTL",
        "authorization.webhook.cacheUnauthorizedTTL",
    ] {
        assert!(
            warned(&l, field).is_some_and(|m| m.contains("0s in a config file means the default")),
            "{field}: {:?}",
            l.warnings
        );
    }
    // A flag's 0 is 0 (no cache), as with the kubelet's flags.
    let l = ok(&["--kubeconfig", &kc, "--authentication-token-webhook-cache-ttl", "0s"], Some(""));
    assert_eq!(l.config.server.auth.token_webhook, Some(TokenWebhookConfig { cache_ttl: Duration::ZERO }));
}

#[test]
fn flag_defaults_in_cluster_mode_are_webhook_authorization_without_token_reviews() {
    // No config file: the kubelet's command-line defaults (TokenReview off), except authorization, which is
    // Webhook in cluster mode (the kubelet's command line says AlwaysAllow) and anonymous, which stays off.
    let (_dir, kc) = kubeconfig();
    let l = ok(&["--kubeconfig", &kc, "--client-ca-file", "/etc/kubernetes/pki/ca.crt"], None);
    let auth = &l.config.server.auth;
    assert_eq!(auth.token_webhook, None, "--authentication-token-webhook defaults to false");
    assert!(!auth.anonymous);
    assert_eq!(auth.authorization, KUBELET_WEBHOOK_AUTHZ, "--authorization-mode defaults to Webhook");
}

#[test]
fn standalone_defaults_are_always_allow_without_token_reviews_with_or_without_a_file() {
    for body in [None, Some(""), Some(CLIENT_CA_ONLY)] {
        let l = ok(&[], body);
        assert_eq!(l.config.server.auth.token_webhook, None, "{body:?}");
        assert_eq!(l.config.server.auth.authorization, AuthorizationMode::AlwaysAllow, "{body:?}");
    }
}

#[test]
fn always_allow_with_a_cluster_wide_authenticator_is_refused_without_the_insecure_flag() {
    let (_dir, kc) = kubeconfig();
    let insecure = "--insecure-always-allow-authorization";
    for (flags, body, names) in [
        (vec![], "authorization: {mode: AlwaysAllow}\n", "TokenReview"),
        (vec!["--authorization-mode", "AlwaysAllow"], CLIENT_CA_ONLY, "clientCAFile"),
        (vec!["--authorization-mode=AlwaysAllow", "--client-ca-file", "/ca.crt"], "", "clientCAFile"),
        (
            vec!["--authorization-mode=AlwaysAllow", "--anonymous-auth"],
            "authentication: {webhook: {enabled: false}}\n",
            "anonymous",
        ),
    ] {
        let mut with_kc = vec!["--kubeconfig", kc.as_str()];
        with_kc.extend(flags.iter().copied());
        let e = err(&with_kc, Some(body));
        assert!(
            e.contains("AlwaysAllow") && e.contains(names) && e.contains(insecure) && e.contains("every pod"),
            "{flags:?} {body:?}: {e}"
        );
        // With the flag: started, and warned about (logged at every start).
        with_kc.push(insecure);
        let l = ok(&with_kc, Some(body));
        assert_eq!(l.config.server.auth.authorization, AuthorizationMode::AlwaysAllow);
        assert!(
            warned(&l, "authorization.mode").is_some_and(|m| m.starts_with("INSECURE") && m.contains(names)),
            "{:?}",
            l.warnings
        );
    }
    // Without a cluster-wide authenticator (a static token file only) AlwaysAllow needs no flag.
    let l = ok(
        &["--kubeconfig", &kc, "--authorization-mode=AlwaysAllow", "--token-auth-file", "/tokens.csv"],
        Some("authentication: {webhook: {enabled: false}}\n"),
    );
    assert_eq!(l.config.server.auth.authorization, AuthorizationMode::AlwaysAllow);
    assert!(warned(&l, "authorization.mode").is_none(), "{:?}", l.warnings);
    // Standalone: AlwaysAllow is the only mode; a client CA with it is the operator's own.
    assert!(warned(&ok(&["--client-ca-file", "/ca.crt"], Some("")), "authorization.mode").is_none());
    // The flag where it changes nothing is named as ignored.
    let l = ok(&["--kubeconfig", &kc, insecure], Some(CLIENT_CA_ONLY));
    assert_eq!(l.config.server.auth.authorization, KUBELET_WEBHOOK_AUTHZ);
    assert!(warned(&l, insecure).is_some_and(|m| m.contains("ignored")), "{:?}", l.warnings);
}

#[test]
fn streaming_idle_timeout_and_per_user_cap_are_read_with_the_kubelets_default() {
    let c = ok(&[], None).config;
    assert_eq!(c.server.streaming_connection_idle_timeout, Duration::from_secs(4 * 3600), "the kubelet's 4h");
    assert_eq!(c.server.max_streaming_sessions_per_user, 128);
    let l = ok(&[], Some("streamingConnectionIdleTimeout: 30m\nnodelet: {maxStreamingSessionsPerUser: 4}\n"));
    assert_eq!(l.config.server.streaming_connection_idle_timeout, Duration::from_secs(1800));
    assert_eq!(l.config.server.max_streaming_sessions_per_user, 4);
    for field in ["streamingConnectionIdleTimeout", "nodelet.maxStreamingSessionsPerUser"] {
        assert!(warned(&l, field).is_none(), "read, not ignored: {:?}", l.warnings);
    }
    let c =
        ok(&["--streaming-connection-idle-timeout", "90s"], Some("streamingConnectionIdleTimeout: 30m\n"))
            .config;
    assert_eq!(c.server.streaming_connection_idle_timeout, Duration::from_secs(90), "the flag wins");
    // 0s in a file is the kubelet's default; a flag's 0 (the kubelet's "never") is refused.
    let l = ok(&[], Some("streamingConnectionIdleTimeout: 0s\n"));
    assert_eq!(l.config.server.streaming_connection_idle_timeout, Duration::from_secs(4 * 3600));
    assert!(warned(&l, "streamingConnectionIdleTimeout").is_some_and(|m| m.contains("default")));
    let e = err(&["--streaming-connection-idle-timeout", "0s"], None);
    assert!(e.contains("--streaming-connection-idle-timeout") && e.contains("greater than 0"), "{e}");
    for bad in ["0", "257", "-1"] {
        let e = err(&[], Some(&format!("nodelet: {{maxStreamingSessionsPerUser: {bad}}}\n")));
        assert!(e.contains("nodelet.maxStreamingSessionsPerUser") && e.contains("between 1 and 256"), "{e}");
    }
}

#[test]
fn config_value_errors_keep_their_messages() {
    let err = |e: ValueError| e.to_string();
    assert_eq!(
        err(check_signal("x").unwrap_err()),
        format!("unknown eviction signal \"x\" (known: {})", EVICTION_SIGNALS.join(", "))
    );
    assert_eq!(err(check_path(Path::new("")).unwrap_err()), "empty path");
    assert_eq!(err(check_path(Path::new("a\nb")).unwrap_err()), r#"path "a\nb" contains control characters"#);
    assert_eq!(
        err(validate_node_name("A_B").unwrap_err()),
        r#""A_B" is not a valid node name (lower-case letters, digits, '-' and '.', at most 253, starting and ending with a letter or digit)"#
    );
    assert_eq!(
        err(validate_url("ftp://h/x").unwrap_err()),
        r#""ftp://h/x" is not an http:// or https:// URL"#
    );
    assert_eq!(
        err(validate_url("http://h/a b").unwrap_err()),
        r#""http://h/a%20b" contains whitespace or control characters"#
    );
    assert_eq!(err(parse_header_flag("a").unwrap_err()), r#""a" is not key:value"#);
    assert_eq!(err(parse_header_flag("a b:c").unwrap_err()), r#""a b" is not a valid HTTP header name"#);
    assert_eq!(
        err(validate_header("a", "b\nc").unwrap_err()),
        r#"the value of header "a" contains control characters"#
    );
    assert_eq!(
        err(validate_endpoint("tcp://x").unwrap_err()),
        nodelet_cri::parse_endpoint("tcp://x").unwrap_err().to_string()
    );
    assert_eq!(err(validate_image_ref("a b").unwrap_err()), r#""a b" is not an image reference"#);
    assert_eq!(
        err(validate_cgroup("nodelet").unwrap_err()),
        r#""nodelet" is not an absolute cgroup path like /nodelet (segments of [A-Za-z0-9_.-])"#
    );
}

#[test]
fn formats_are_the_kubelets() {
    assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
    assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
    let e = LogFormat::parse("xml").expect_err("refused").to_string();
    assert_eq!(e, r#"Unsupported value: "xml": supported values: "json", "text""#);
    assert_eq!(LogFormat::NAMES.map(|n| LogFormat::parse(n).map(LogFormat::name)), [Ok("json"), Ok("text")]);
}

#[test]
fn label_keys() {
    for ok in ["app", "k8s-app", "example.com/tier", "a.b_c-d"] {
        assert!(is_label_key(ok), "{ok}");
    }
    for bad in ["", "-a", "a/", "/a", "Exa mple", "UPPER.com/x", &"x".repeat(64)] {
        assert!(!is_label_key(bad), "{bad}");
    }
}
