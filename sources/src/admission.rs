//! What a pod from each source is admitted against, on every way in: a source's first reading, an
//! ephemeral container added by `nodelet debug`, the ephemeral containers merged back after a restart.
//!
//! - **The Pod Security Standards level** of the source ([`PodSecurity`], `nodelet.podSecurity`), raised to
//!   `baseline` by `--allow-privileged=false`.
//! - **Manifest files are trusted only when the node's administrator owns them**: a file (links followed)
//!   and the directory it is listed in, both owned by root (or by nodelet's own user) and writable by no one
//!   else (no group or other write bit). A file that is not is held to `baseline` at least, and to the
//!   namespaces and labels below, whatever `nodelet.podSecurity.file` says: whoever can write it is not
//!   known to be root.
//! - **Namespaces and labels** ([`Placement`], `nodelet.httpPodNamespaces` and `nodelet.httpPodLabels`):
//!   pods from the manifest URL, the HTTP endpoint and untrusted files may only use the listed namespaces
//!   (default: `default`) and carry only the listed label keys (default: none), so that their mirror pods
//!   can never be selected by a Service (`k8s-app=kube-dns`) or land in a namespace the node's
//!   administrator did not choose.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use nodelet_resources::model::pod::PodSource;
use nodelet_resources::pod::security::{Level, NodeRestrictions, PodSecurity, SecurityError};

use nodelet_config::Config;

/// The namespaces and label keys pods of the sources nodelet cannot trust as root's may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The namespaces allowed (`None`: any).
    pub namespaces: Option<BTreeSet<String>>,
    /// The label keys allowed (`None`: any).
    pub(crate) label_keys: Option<BTreeSet<String>>,
}

impl Placement {
    /// `metadata.namespace` and `metadata.labels` of `pod` against the allow-lists: one sentence per
    /// refusal, naming the field and the setting.
    fn check(&self, pod: &Pod) -> Vec<String> {
        let mut out = Vec::new();
        let namespace = pod.metadata.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or("default");
        if let Some(allowed) = &self.namespaces
            && !allowed.contains(namespace)
        {
            out.push(format!(
                "metadata.namespace: Forbidden: {namespace:?} is not among the namespaces pods of this source may \
                 use (nodelet.httpPodNamespaces: {})",
                list(allowed)
            ));
        }
        if let Some(allowed) = &self.label_keys {
            for key in pod.metadata.labels.iter().flatten().map(|(k, _)| k) {
                if !allowed.contains(key) {
                    out.push(format!(
                        "metadata.labels[{key}]: Forbidden: pods of this source may only carry the label keys of \
                         nodelet.httpPodLabels ({}): a label could make the pod's mirror an endpoint of a Service",
                        list(allowed)
                    ));
                }
            }
        }
        out
    }
}

fn list(items: &BTreeSet<String>) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")
    }
}

/// Why a pod was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The Pod Security Standards level or `--allow-privileged=false`.
    #[error(transparent)]
    Security(#[from] SecurityError),
    /// A namespace or a label the source may not use.
    #[error("{}", .0.join("; "))]
    Placement(Vec<String>),
}

/// What the pods of one source (or one manifest file) are admitted against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePolicy {
    /// The level and the `--allow-privileged=false` restrictions.
    pub security: PodSecurity,
    /// The namespaces and labels allowed (`None`: any).
    pub placement: Option<Placement>,
}

impl SourcePolicy {
    /// Checks `pod` (the placement first, then the security settings).
    pub fn admit(&self, pod: &Pod) -> Result<(), Refusal> {
        if let Some(placement) = &self.placement {
            let problems = placement.check(pod);
            if !problems.is_empty() {
                return Err(Refusal::Placement(problems));
            }
        }
        self.security.admit(pod)?;
        Ok(())
    }
}

/// The settings each pod source is held to. The default holds no source to anything (tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecurityPolicies {
    /// Manifest files the node's administrator owns (`--pod-manifest-path`).
    pub file: PodSecurity,
    /// The manifest URL.
    pub url: PodSecurity,
    /// The manifest HTTP endpoint.
    pub http: PodSecurity,
    /// The API server (cluster mode).
    pub api: PodSecurity,
    /// Manifest files the node's administrator does not own: `file` raised to `baseline`, without the
    /// allowed hostPath prefixes.
    pub(crate) untrusted_file: PodSecurity,
    /// The namespaces and labels of the URL, HTTP and untrusted-file sources.
    pub placement: Placement,
}

impl SecurityPolicies {
    /// The settings each pod source is held to, from the node's configuration: its `nodelet.podSecurity` level; with
    /// `--allow-privileged=false`, the node restrictions (which raise every level to `baseline`; the allowed
    /// hostPath prefixes only for sources whose level is `privileged`; nodelet's own ports, which no hostPort
    /// may take); and for the URL, HTTP and untrusted-file sources, the namespaces and labels they may use.
    pub fn from_config(config: &Config) -> Self {
        let mut ports = BTreeSet::new();
        if config.server.enabled {
            ports.insert(config.server.port);
        }
        ports.extend(config.server.read_only_port);
        ports.extend(config.server.healthz.map(|a| a.port()));
        ports.extend(config.sources.manifest_http_addr.map(|a| a.port()));
        let restrictions = |level: Level| {
            (!config.pods.allow_privileged).then(|| NodeRestrictions {
                host_path_prefixes: if level == Level::Privileged {
                    config.pods.allowed_host_paths.clone()
                } else {
                    Vec::new()
                },
                reserved_host_ports: ports.clone(),
            })
        };
        let policy = |level: Level| PodSecurity { level, restrictions: restrictions(level) };
        let levels = config.pods.pod_security;
        SecurityPolicies {
            file: policy(levels.file),
            url: policy(levels.url),
            http: policy(levels.http),
            api: policy(levels.api),
            untrusted_file: policy(untrusted_level(levels.file)),
            placement: Placement {
                namespaces: Some(config.pods.http_pod_namespaces.iter().cloned().collect()),
                label_keys: Some(config.pods.http_pod_labels.iter().cloned().collect()),
            },
        }
    }

    /// The policy of a manifest file, trusted (see [`trusted_manifest`]) or not.
    pub(crate) fn for_file(&self, trusted: bool) -> SourcePolicy {
        if trusted {
            SourcePolicy { security: self.file.clone(), placement: None }
        } else {
            SourcePolicy { security: self.untrusted_file.clone(), placement: Some(self.placement.clone()) }
        }
    }

    /// The policy of the URL, HTTP and API sources (a file source: [`for_file`](Self::for_file)).
    pub(crate) fn for_remote(&self, source: &PodSource) -> SourcePolicy {
        let restricted = |security: &PodSecurity| SourcePolicy {
            security: security.clone(),
            placement: Some(self.placement.clone()),
        };
        match source {
            PodSource::Url(_) => restricted(&self.url),
            PodSource::Http => restricted(&self.http),
            PodSource::Api => SourcePolicy { security: self.api.clone(), placement: None },
            PodSource::File(_) => self.for_file(false),
        }
    }

    /// The policy of a pod already read from `source`: a manifest file's trust is read again now (a file that
    /// became untrusted holds what is added to its pods to the untrusted policy).
    pub(crate) fn for_source(&self, source: &PodSource) -> SourcePolicy {
        match source {
            PodSource::File(path) => self.for_file(trusted_manifest(path)),
            other => self.for_remote(other),
        }
    }
}

/// Whether `meta` (of a manifest file or its directory) is the node administrator's: owned by root or by
/// nodelet's own user, and with no group or other write bit.
pub(crate) fn trusted_metadata(meta: &std::fs::Metadata) -> bool {
    let euid = rustix::process::geteuid().as_raw();
    (meta.uid() == 0 || meta.uid() == euid) && meta.mode() & 0o022 == 0
}

/// Whether the manifest file `path` (links followed) and its directory are trusted ([`trusted_metadata`]);
/// `false` when either cannot be read.
pub(crate) fn trusted_manifest(path: &Path) -> bool {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let trusted = |p: &Path| std::fs::metadata(p).is_ok_and(|m| trusted_metadata(&m));
    trusted(dir) && trusted(path)
}

/// The level of an untrusted manifest file: `level`, but at least `baseline`.
pub(crate) fn untrusted_level(level: Level) -> Level {
    level.max(Level::Baseline)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    use std::path::PathBuf;

    /// The configuration of `flags` and of the file /etc/nodelet/config.yaml with `body` (after the
    /// KubeletConfiguration header), if any.
    fn config(flags: &[&str], body: Option<&str>) -> Config {
        use nodelet_config::{ConfigFile, HostFacts};
        let mut argv = vec!["nodelet"];
        argv.extend_from_slice(flags);
        let nodelet_config::cli::Command::Run(args) =
            nodelet_config::cli::try_parse_from(argv).expect("flags")
        else {
            panic!("not run")
        };
        let header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        let file = body.map(|b| {
            ConfigFile::parse(Path::new("/etc/nodelet/config.yaml"), &format!("{header}{b}")).expect("file")
        });
        let host = HostFacts { hostname: Ok("node-1".into()), cwd: PathBuf::from("/work") };
        Config::resolve(&args, file, &host).expect("config").config
    }

    #[test]
    fn security_policies_come_from_the_levels_the_restrictions_and_the_placement_configured() {
        let policies = SecurityPolicies::from_config(&config(&[], None));
        assert_eq!(policies.file.level, Level::Privileged);
        assert_eq!(policies.untrusted_file.level, Level::Baseline, "files not owned by root");
        assert_eq!(policies.http.level, Level::Baseline);
        assert_eq!(policies.url.level, Level::Baseline);
        assert_eq!(policies.api.level, Level::Privileged);
        assert!(policies.http.restrictions.is_none());
        assert!(policies.api.restrictions.is_none(), "API pods run as the API server admitted them");
        assert_eq!(
            policies.placement.namespaces,
            Some(["default".to_owned()].into()),
            "URL and HTTP pods: the default namespace only"
        );
        assert_eq!(policies.placement.label_keys, Some(Default::default()), "and no labels");
        assert_eq!(policies, SecurityPolicies::from_config(&config(&["--allow-privileged=true"], None)));

        let policies = SecurityPolicies::from_config(&config(
            &["--allow-privileged=false", "--port", "11250", "--read-only-port", "10255"],
            Some(
                "seccompDefault: true\nnodelet:\n  podSecurity: {file: baseline, api: restricted}\n  \
                 allowedHostPaths: [/srv/data]\n",
            ),
        ));
        assert_eq!(policies.file.level, Level::Baseline);
        assert_eq!(policies.http.level, Level::Baseline, "unset keeps its default");
        assert_eq!(policies.api.level, Level::Restricted);
        let restrictions = policies.file.restrictions.clone().expect("--allow-privileged=false restricts");
        assert!(restrictions.host_path_prefixes.is_empty(), "a baseline source gets no hostPath");
        assert!(
            restrictions.reserved_host_ports.contains(&11250)
                && restrictions.reserved_host_ports.contains(&10255)
        );

        // --allow-privileged=false caps every source at baseline; the allowed hostPath prefixes go only to the
        // sources whose own level is privileged.
        let capped = SecurityPolicies::from_config(&config(
            &["--allow-privileged=false"],
            Some("nodelet:\n  allowedHostPaths: [/srv/data]\n"),
        ));
        for (name, policy) in
            [("file", &capped.file), ("api", &capped.api), ("url", &capped.url), ("http", &capped.http)]
        {
            assert_eq!(policy.effective_level(), Level::Baseline, "{name}");
        }
        let api = capped.api.restrictions.clone().expect("restricted");
        assert_eq!(api.host_path_prefixes, vec![PathBuf::from("/srv/data")]);
        assert!(capped.http.restrictions.clone().expect("restricted").host_path_prefixes.is_empty());
        assert!(
            capped.untrusted_file.restrictions.clone().expect("restricted").host_path_prefixes.is_empty()
        );

        let placement = SecurityPolicies::from_config(&config(
            &[],
            Some(
                "nodelet:\n  httpPodNamespaces: [edge, default]\n  httpPodLabels: [app, example.com/tier]\n",
            ),
        ))
        .placement;
        assert_eq!(placement.namespaces, Some(["default".to_owned(), "edge".to_owned()].into()));
        assert_eq!(placement.label_keys, Some(["app".to_owned(), "example.com/tier".to_owned()].into()));
    }

    fn pod(namespace: &str, labels: &[(&str, &str)]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some(namespace.into());
        if !labels.is_empty() {
            pod.metadata.labels =
                Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        }
        pod
    }

    #[test]
    fn placement_refuses_other_namespaces_and_labels_naming_the_field() {
        let placement = Placement {
            namespaces: Some(["default".to_owned()].into()),
            label_keys: Some(["app".to_owned()].into()),
        };
        let policy = SourcePolicy { security: PodSecurity::default(), placement: Some(placement) };
        assert!(policy.admit(&pod("default", &[("app", "web")])).is_ok());
        let err = policy.admit(&pod("kube-system", &[])).expect_err("namespace").to_string();
        assert!(err.starts_with("metadata.namespace: Forbidden: \"kube-system\""), "{err}");
        assert!(err.contains("nodelet.httpPodNamespaces: \"default\""), "{err}");
        let err = policy.admit(&pod("default", &[("k8s-app", "kube-dns")])).expect_err("label").to_string();
        assert!(err.starts_with("metadata.labels[k8s-app]: Forbidden"), "{err}");
        assert!(err.contains("nodelet.httpPodLabels (\"app\")"), "{err}");
        let none = Placement { namespaces: None, label_keys: Some(BTreeSet::new()) };
        let err = none.check(&pod("x", &[("a", "b")]));
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(err[0].contains("nodelet.httpPodLabels (none)"), "{err:?}");
    }

    #[test]
    fn files_are_trusted_only_when_root_owns_them_and_no_one_else_may_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
        let file = dir.path().join("pod.yaml");
        std::fs::write(&file, "x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(trusted_manifest(&file), "our own file, 0644, in our own 0755 directory");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(!trusted_manifest(&file), "writable by others");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).expect("chmod");
        assert!(!trusted_manifest(&file), "writable by the group");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod dir");
        assert!(!trusted_manifest(&file), "a directory anyone may add files to");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
        if rustix::process::geteuid().is_root() {
            rustix::fs::chown(&file, Some(rustix::fs::Uid::from_raw(65534)), None).expect("chown");
            assert!(!trusted_manifest(&file), "owned by another user");
        }
        assert!(!trusted_manifest(&dir.path().join("missing.yaml")));
    }

    #[test]
    fn untrusted_files_get_baseline_and_the_placement() {
        let policies = SecurityPolicies {
            untrusted_file: PodSecurity { level: untrusted_level(Level::Privileged), restrictions: None },
            placement: Placement { namespaces: Some(["default".to_owned()].into()), label_keys: None },
            ..SecurityPolicies::default()
        };
        assert_eq!(policies.for_file(true).security.level, Level::Privileged);
        assert_eq!(policies.for_file(true).placement, None);
        assert_eq!(policies.for_file(false).security.level, Level::Baseline);
        assert!(policies.for_file(false).placement.is_some());
        assert!(policies.for_remote(&PodSource::Http).placement.is_some());
        assert!(policies.for_remote(&PodSource::Url("http://x".into())).placement.is_some());
        assert_eq!(policies.for_remote(&PodSource::Api).placement, None);
        assert_eq!(untrusted_level(Level::Restricted), Level::Restricted);
    }
}
