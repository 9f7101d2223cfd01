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
use nodelet_resources::pod::security::{Level, PodSecurity, SecurityError};

/// The namespaces and label keys pods of the sources nodelet cannot trust as root's may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The namespaces allowed (`None`: any).
    pub(crate) namespaces: Option<BTreeSet<String>>,
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
pub(crate) enum Refusal {
    /// The Pod Security Standards level or `--allow-privileged=false`.
    #[error(transparent)]
    Security(#[from] SecurityError),
    /// A namespace or a label the source may not use.
    #[error("{}", .0.join("; "))]
    Placement(Vec<String>),
}

/// What the pods of one source (or one manifest file) are admitted against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SourcePolicy {
    /// The level and the `--allow-privileged=false` restrictions.
    pub(crate) security: PodSecurity,
    /// The namespaces and labels allowed (`None`: any).
    pub(crate) placement: Option<Placement>,
}

impl SourcePolicy {
    /// Checks `pod` (the placement first, then the security settings).
    pub(crate) fn admit(&self, pod: &Pod) -> Result<(), Refusal> {
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
pub(crate) struct SecurityPolicies {
    /// Manifest files the node's administrator owns (`--pod-manifest-path`).
    pub(crate) file: PodSecurity,
    /// The manifest URL.
    pub(crate) url: PodSecurity,
    /// The manifest HTTP endpoint.
    pub(crate) http: PodSecurity,
    /// The API server (cluster mode).
    pub(crate) api: PodSecurity,
    /// Manifest files the node's administrator does not own: `file` raised to `baseline`, without the
    /// allowed hostPath prefixes.
    pub(crate) untrusted_file: PodSecurity,
    /// The namespaces and labels of the URL, HTTP and untrusted-file sources.
    pub(crate) placement: Placement,
}

impl SecurityPolicies {
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

/// Whether `key` is a label key: an optional DNS subdomain prefix and `/`, then a name of 1 to 63
/// characters of `[A-Za-z0-9_.-]` that starts and ends alphanumeric.
pub(crate) fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(nodelet_resources::common::names::is_dns_subdomain)
}

/// The level of an untrusted manifest file: `level`, but at least `baseline`.
pub(crate) fn untrusted_level(level: Level) -> Level {
    level.max(Level::Baseline)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

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

    #[test]
    fn label_keys() {
        for ok in ["app", "k8s-app", "example.com/tier", "a.b_c-d"] {
            assert!(is_label_key(ok), "{ok}");
        }
        for bad in ["", "-a", "a/", "/a", "Exa mple", "UPPER.com/x", &"x".repeat(64)] {
            assert!(!is_label_key(bad), "{bad}");
        }
    }
}
