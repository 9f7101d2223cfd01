//! Cluster mode settings (`--kubeconfig` and what goes with it) and the cluster DNS of pods: merging and
//! validation, with the kubelet's rules for node labels, taints and node IPs.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

use super::raw::{RawKubeletConfiguration, RawTaint};
use super::{
    ClusterConfig, ConfigError, ConfigWarning, DEFAULT_CLUSTER_DOMAIN, DEFAULT_KUBE_API_BURST,
    DEFAULT_KUBE_API_QPS, DEFAULT_NODE_LEASE_DURATION, DEFAULT_NODE_STATUS_REPORT_FREQUENCY,
    DEFAULT_NODE_STATUS_UPDATE_FREQUENCY, DEFAULT_REGISTER_NODE, Merger, is_dns_subdomain,
};
use crate::cli::RunArgs;

/// The labels in the kubernetes.io / k8s.io namespaces a kubelet may set on its node (the kubelet's
/// `kubeletLabels`).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
];

/// Label namespaces (and their subdomains) a kubelet may set freely (the kubelet's `kubeletLabelNamespaces`).
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The taint effects of core/v1.
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Why a cluster-mode value (a kubeconfig path, node IP, label, taint, cluster domain) is not valid;
/// [`Merger`] wraps it in [`ConfigError::Invalid`] with the flag or field it came from.
#[derive(Debug, thiserror::Error)]
pub enum ClusterValueError {
    /// The file cannot be opened or its metadata read.
    #[error("cannot read {}: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        reason: std::io::Error,
    },
    /// A directory where a kubeconfig file is wanted.
    #[error("{} is a directory, not a kubeconfig file", path.display())]
    Directory {
        /// The path.
        path: PathBuf,
    },
    /// Not an IP address.
    #[error("{text:?} is not an IP address")]
    NotIp {
        /// The text given.
        text: String,
    },
    /// `0.0.0.0` or `::` as a node IP.
    #[error(
        "{ip} (detect an address of that family) is not supported; leave --node-ip out to detect the node's \
         address"
    )]
    UnspecifiedNodeIp {
        /// The address.
        ip: IpAddr,
    },
    /// Two node IPs of the same family.
    #[error("{text:?}: two addresses must be one IPv4 and one IPv6 address (dual-stack)")]
    NotDualStack {
        /// The flag's value.
        text: String,
    },
    /// More than two node IPs.
    #[error("{text:?}: at most two addresses (one IPv4 and one IPv6)")]
    TooManyIps {
        /// The flag's value.
        text: String,
    },
    /// A `--node-labels` item without `=`.
    #[error("{pair:?} is not key=value")]
    NotKeyEqValue {
        /// The item.
        pair: String,
    },
    /// A label key that is not a qualified name.
    #[error("label {key:?}: {reason}")]
    LabelKey {
        /// The key.
        key: String,
        /// Why.
        reason: QualifiedNameError,
    },
    /// A label value that is not valid.
    #[error("label {key:?}: value {value:?}: {reason}")]
    LabelValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Why.
        reason: NameCharsError,
    },
    /// A label in the kubernetes.io / k8s.io namespaces the kubelet may not set.
    #[error(
        "label {key:?} is in the kubernetes.io or k8s.io namespace, where only the kubelet's own labels ({}) and \
         the namespaces {} (and their subdomains) are allowed",
        KUBELET_LABELS.join(", "),
        KUBELET_LABEL_NAMESPACES.join(", ")
    )]
    ReservedLabel {
        /// The key.
        key: String,
    },
    /// A taint key that is not a qualified name.
    #[error("taint key {key:?}: {reason}")]
    TaintKey {
        /// The key.
        key: String,
        /// Why.
        reason: QualifiedNameError,
    },
    /// A taint value that is not a valid label value.
    #[error("taint {key:?}: value {value:?}: {reason}")]
    TaintValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Why.
        reason: NameCharsError,
    },
    /// A taint effect that is not one of [`TAINT_EFFECTS`].
    #[error("taint {key:?}: effect {effect:?} is not one of {}", TAINT_EFFECTS.join(", "))]
    TaintEffect {
        /// The key.
        key: String,
        /// The effect given.
        effect: String,
    },
    /// Two taints with the same key and effect.
    #[error("taint {key:?} with effect {effect} is given twice")]
    DuplicateTaint {
        /// The key.
        key: String,
        /// The effect.
        effect: String,
    },
    /// A `--register-with-taints` item that is not `key[=value]:Effect`.
    #[error("{spec:?} is not key[=value]:Effect")]
    TaintSpec {
        /// The item.
        spec: String,
    },
    /// A cluster domain that is only a dot.
    #[error("{domain:?} is not a DNS domain")]
    BareDot {
        /// The domain given.
        domain: String,
    },
    /// A cluster domain that is not a DNS subdomain.
    #[error(
        "{domain:?} is not a DNS domain (lower-case letters, digits, '-' and '.', at most 253, like cluster.local)"
    )]
    Domain {
        /// The domain given.
        domain: String,
    },
}

/// Why a qualified name (`[prefix/]name`: a label or taint key) is not valid.
#[derive(Debug, thiserror::Error)]
pub enum QualifiedNameError {
    /// `/name`.
    #[error("the prefix before '/' must not be empty")]
    EmptyPrefix,
    /// A prefix that is not a DNS subdomain.
    #[error(
        "prefix {prefix:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)"
    )]
    Prefix {
        /// The prefix.
        prefix: String,
    },
    /// More than one `/`.
    #[error("a qualified name has at most one '/' (an optional DNS subdomain prefix)")]
    Slashes,
    /// `prefix/`.
    #[error("the name part must not be empty")]
    EmptyName,
    /// A name part that is not valid.
    #[error("name part {name:?}: {reason}")]
    Name {
        /// The name part.
        name: String,
        /// Why.
        reason: NameCharsError,
    },
}

/// Why a name part or label value is not valid.
#[derive(Debug, thiserror::Error)]
pub enum NameCharsError {
    /// Longer than 63 characters.
    #[error("must be no more than 63 characters")]
    TooLong,
    /// Characters outside `[A-Za-z0-9-_.]`, or not starting and ending with an alphanumeric.
    #[error(
        "must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character"
    )]
    Chars,
}

impl Merger<'_> {
    /// `--kubeconfig` and the cluster-mode settings. Without `--kubeconfig` the settings are still
    /// validated, and each one given explicitly gets a warning (it has no effect).
    pub(super) fn cluster(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
        cert_dir: &Path,
        tls_files_given: bool,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<Option<ClusterConfig>, ConfigError> {
        let bootstrap_kubeconfig = match args.bootstrap_kubeconfig.as_deref() {
            Some(p) => {
                let p = self.flag_path("--bootstrap-kubeconfig", p)?;
                check_readable_file(&p)
                    .map_err(|e| self.flag_err("--bootstrap-kubeconfig", e.to_string()))?;
                if args.kubeconfig.is_none() {
                    return Err(self.flag_err(
                        "--bootstrap-kubeconfig",
                        "needs --kubeconfig: the file TLS bootstrap writes the node's kubeconfig to".into(),
                    ));
                }
                Some(p)
            }
            None => None,
        };
        let kubeconfig = match args.kubeconfig.as_deref() {
            Some(p) => {
                let p = self.flag_path("--kubeconfig", p)?;
                // with TLS bootstrap the file is written when it is missing
                if bootstrap_kubeconfig.is_none() || p.exists() {
                    check_readable_file(&p).map_err(|e| self.flag_err("--kubeconfig", e.to_string()))?;
                }
                Some(p)
            }
            None => None,
        };
        let rotate_certificates = raw.rotate_certificates.unwrap_or(false);
        let server_tls_bootstrap = raw.server_tls_bootstrap.unwrap_or(false);
        if server_tls_bootstrap && tls_files_given {
            return Err(self.file_err(
                "serverTLSBootstrap",
                "the serving certificate comes from the cluster: leave tlsCertFile and tlsPrivateKeyFile out"
                    .into(),
            ));
        }

        let node_ips = match &args.node_ip {
            Some(s) => parse_node_ips(s).map_err(|e| self.flag_err("--node-ip", e.to_string()))?,
            None => Vec::new(),
        };
        let node_labels = parse_node_labels(&args.node_labels)
            .map_err(|e| self.flag_err("--node-labels", e.to_string()))?;
        let register_node = args.register_node.or(raw.register_node).unwrap_or(DEFAULT_REGISTER_NODE);
        let register_with_taints = match (&args.register_with_taints, &raw.register_with_taints) {
            (Some(s), _) => {
                parse_taints_flag(s).map_err(|e| self.flag_err("--register-with-taints", e.to_string()))?
            }
            (None, Some(list)) => self.file_taints(list)?,
            (None, None) => Vec::new(),
        };
        let kube_api_qps = match (args.kube_api_qps, raw.kube_api_qps) {
            (Some(q), _) | (None, Some(q)) if !(q.is_finite() && q >= 0.0) => {
                return Err(self.origin_err(
                    args.kube_api_qps.is_some(),
                    "--kube-api-qps",
                    "kubeAPIQPS",
                    format!("{q} must be a number of at least 0 (0: the default {DEFAULT_KUBE_API_QPS})"),
                ));
            }
            (Some(q), _) | (None, Some(q)) if q > 0.0 => q,
            _ => DEFAULT_KUBE_API_QPS,
        };
        let kube_api_burst = match (args.kube_api_burst, raw.kube_api_burst) {
            (Some(n), _) | (None, Some(n)) => u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                self.origin_err(
                    args.kube_api_burst.is_some(),
                    "--kube-api-burst",
                    "kubeAPIBurst",
                    format!("{n} is not between 1 and {}", u32::MAX),
                )
            })?,
            (None, None) => DEFAULT_KUBE_API_BURST,
        };
        let update_explicit =
            args.node_status_update_frequency.is_some() || raw.node_status_update_frequency.is_some();
        let node_status_update_frequency = self.positive_duration(
            args.node_status_update_frequency,
            "--node-status-update-frequency",
            raw.node_status_update_frequency,
            "nodeStatusUpdateFrequency",
            DEFAULT_NODE_STATUS_UPDATE_FREQUENCY,
        )?;
        // the kubelet: an explicit update frequency is also the report frequency unless that is set too
        let node_status_report_frequency = self.positive_duration(
            None,
            "",
            raw.node_status_report_frequency,
            "nodeStatusReportFrequency",
            if update_explicit { node_status_update_frequency } else { DEFAULT_NODE_STATUS_REPORT_FREQUENCY },
        )?;
        let node_lease_duration = match raw.node_lease_duration_seconds {
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .map(|n| Duration::from_secs(u64::from(n)))
                .ok_or_else(|| {
                    self.file_err(
                        "nodeLeaseDurationSeconds",
                        format!("{n} is not between 1 and {}", u32::MAX),
                    )
                })?,
            None => DEFAULT_NODE_LEASE_DURATION,
        };

        let Some(kubeconfig) = kubeconfig else {
            let given = [
                (args.node_ip.is_some(), "--node-ip"),
                (!args.node_labels.is_empty(), "--node-labels"),
                (args.register_node.is_some(), "--register-node"),
                (args.register_node.is_none() && raw.register_node.is_some(), "registerNode"),
                (args.register_with_taints.is_some(), "--register-with-taints"),
                (
                    args.register_with_taints.is_none() && raw.register_with_taints.is_some(),
                    "registerWithTaints",
                ),
                (args.kube_api_qps.is_some(), "--kube-api-qps"),
                (args.kube_api_qps.is_none() && raw.kube_api_qps.is_some(), "kubeAPIQPS"),
                (args.kube_api_burst.is_some(), "--kube-api-burst"),
                (args.kube_api_burst.is_none() && raw.kube_api_burst.is_some(), "kubeAPIBurst"),
                (args.node_status_update_frequency.is_some(), "--node-status-update-frequency"),
                (
                    args.node_status_update_frequency.is_none() && raw.node_status_update_frequency.is_some(),
                    "nodeStatusUpdateFrequency",
                ),
                (raw.node_status_report_frequency.is_some(), "nodeStatusReportFrequency"),
                (raw.node_lease_duration_seconds.is_some(), "nodeLeaseDurationSeconds"),
                (raw.rotate_certificates.is_some(), "rotateCertificates"),
                (raw.server_tls_bootstrap.is_some(), "serverTLSBootstrap"),
            ];
            for (_, name) in given.iter().filter(|(set, _)| *set) {
                warnings.push(ConfigWarning {
                    field: (*name).to_owned(),
                    message: "a cluster mode setting: it has no effect without --kubeconfig".into(),
                });
            }
            return Ok(None);
        };
        Ok(Some(ClusterConfig {
            kubeconfig,
            node_ips,
            node_labels,
            register_node,
            register_with_taints,
            kube_api_qps,
            kube_api_burst,
            node_status_update_frequency,
            node_status_report_frequency,
            node_lease_duration,
            bootstrap_kubeconfig,
            rotate_certificates,
            server_tls_bootstrap,
            cert_dir: cert_dir.to_owned(),
        }))
    }

    /// `registerWithTaints` from the file: each entry checked, errors naming it (`registerWithTaints[1]`).
    fn file_taints(&self, list: &[RawTaint]) -> Result<Vec<Taint>, ConfigError> {
        let mut out = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let field = format!("registerWithTaints[{i}]");
            let taint = taint(
                t.key.as_deref().unwrap_or_default(),
                t.value.as_deref().unwrap_or_default(),
                t.effect.as_deref().unwrap_or_default(),
            )
            .map_err(|e| self.file_err(&field, e.to_string()))?;
            push_unique(&mut out, taint).map_err(|e| self.file_err(&field, e.to_string()))?;
        }
        Ok(out)
    }

    /// `--cluster-dns` (comma-separated, repeatable; replaces the file's list) or `clusterDNS`.
    pub(super) fn cluster_dns(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
    ) -> Result<Vec<IpAddr>, ConfigError> {
        if !args.cluster_dns.is_empty() {
            return args
                .cluster_dns
                .iter()
                .flat_map(|s| s.split(','))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| parse_ip(s).map_err(|e| self.flag_err("--cluster-dns", e.to_string())))
                .collect();
        }
        raw.cluster_dns
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| {
                parse_ip(s.trim()).map_err(|e| self.file_err(&format!("clusterDNS[{i}]"), e.to_string()))
            })
            .collect()
    }

    /// `--cluster-domain` or `clusterDomain`: a DNS subdomain, lower-cased, without its trailing dot; "" for
    /// none.
    pub(super) fn cluster_domain(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
    ) -> Result<String, ConfigError> {
        match (&args.cluster_domain, &raw.cluster_domain) {
            (Some(d), _) => {
                validate_cluster_domain(d).map_err(|e| self.flag_err("--cluster-domain", e.to_string()))
            }
            (None, Some(d)) => {
                validate_cluster_domain(d).map_err(|e| self.file_err("clusterDomain", e.to_string()))
            }
            (None, None) => Ok(DEFAULT_CLUSTER_DOMAIN.to_owned()),
        }
    }
}

/// Whether `path` is a file this process can open for reading.
fn check_readable_file(path: &Path) -> Result<(), ClusterValueError> {
    let unreadable = |reason| ClusterValueError::Unreadable { path: path.to_owned(), reason };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if meta.is_dir() {
        return Err(ClusterValueError::Directory { path: path.to_owned() });
    }
    Ok(())
}

fn parse_ip(s: &str) -> Result<IpAddr, ClusterValueError> {
    s.parse().map_err(|_| ClusterValueError::NotIp { text: s.to_owned() })
}

/// `--node-ip`: one IP, or a dual-stack pair (an IPv4 and an IPv6 address); "" for none (detected).
fn parse_node_ips(s: &str) -> Result<Vec<IpAddr>, ClusterValueError> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    let ips = s.split(',').map(|p| parse_ip(p.trim())).collect::<Result<Vec<_>, _>>()?;
    if let Some(ip) = ips.iter().find(|ip| ip.is_unspecified()) {
        return Err(ClusterValueError::UnspecifiedNodeIp { ip: *ip });
    }
    match ips.as_slice() {
        [_] => Ok(ips),
        [a, b] if a.is_ipv4() != b.is_ipv4() => Ok(ips),
        [_, _] => Err(ClusterValueError::NotDualStack { text: s.to_owned() }),
        _ => Err(ClusterValueError::TooManyIps { text: s.to_owned() }),
    }
}

/// `--node-labels` values: `k=v[,k=v...]` each (a later key wins), checked like the kubelet does.
fn parse_node_labels(values: &[String]) -> Result<BTreeMap<String, String>, ClusterValueError> {
    let mut labels = BTreeMap::new();
    for pair in values.iter().flat_map(|v| v.split(',')).filter(|p| !p.is_empty()) {
        let (k, v) =
            pair.split_once('=').ok_or_else(|| ClusterValueError::NotKeyEqValue { pair: pair.to_owned() })?;
        let (k, v) = (k.trim(), v.trim());
        check_node_label(k, v)?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(labels)
}

/// A node label the kubelet would accept from `--node-labels` (and may set on its Node).
pub fn check_node_label(key: &str, value: &str) -> Result<(), ClusterValueError> {
    check_qualified_name(key)
        .map_err(|reason| ClusterValueError::LabelKey { key: key.to_owned(), reason })?;
    check_label_value(value).map_err(|reason| ClusterValueError::LabelValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason,
    })?;
    if is_kubernetes_label(key) && !is_kubelet_label(key) {
        return Err(ClusterValueError::ReservedLabel { key: key.to_owned() });
    }
    Ok(())
}

/// The prefix of a qualified name (`prefix/name`), "" without one.
fn label_namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(prefix, _)| prefix)
}

fn in_namespace(namespace: &str, domain: &str) -> bool {
    namespace == domain || namespace.strip_suffix(domain).is_some_and(|head| head.ends_with('.'))
}

fn is_kubernetes_label(key: &str) -> bool {
    let ns = label_namespace(key);
    in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io")
}

fn is_kubelet_label(key: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES.iter().any(|d| in_namespace(label_namespace(key), d))
}

/// A Kubernetes qualified name: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63 of
/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?` (label keys, taint keys).
fn check_qualified_name(s: &str) -> Result<(), QualifiedNameError> {
    let name = match s.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err(QualifiedNameError::EmptyPrefix);
            }
            if !is_dns_subdomain(prefix) {
                return Err(QualifiedNameError::Prefix { prefix: (*prefix).to_owned() });
            }
            *name
        }
        _ => return Err(QualifiedNameError::Slashes),
    };
    if name.is_empty() {
        return Err(QualifiedNameError::EmptyName);
    }
    check_name_chars(name).map_err(|reason| QualifiedNameError::Name { name: name.to_owned(), reason })
}

/// A label value: empty, or at most 63 of `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
fn check_label_value(s: &str) -> Result<(), NameCharsError> {
    if s.is_empty() { Ok(()) } else { check_name_chars(s) }
}

fn check_name_chars(s: &str) -> Result<(), NameCharsError> {
    let b = s.as_bytes();
    if b.len() > 63 {
        return Err(NameCharsError::TooLong);
    }
    let ok = b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if ok { Ok(()) } else { Err(NameCharsError::Chars) }
}

/// A taint from its parts, checked like the kubelet checks `registerWithTaints`; the effect is required.
fn taint(key: &str, value: &str, effect: &str) -> Result<Taint, ClusterValueError> {
    check_qualified_name(key)
        .map_err(|reason| ClusterValueError::TaintKey { key: key.to_owned(), reason })?;
    check_label_value(value).map_err(|reason| ClusterValueError::TaintValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason,
    })?;
    if !TAINT_EFFECTS.contains(&effect) {
        return Err(ClusterValueError::TaintEffect { key: key.to_owned(), effect: effect.to_owned() });
    }
    Ok(Taint {
        key: key.to_owned(),
        value: (!value.is_empty()).then(|| value.to_owned()),
        effect: effect.to_owned(),
        time_added: None,
    })
}

/// Adds `t` unless a taint with the same key and effect is there (the kubelet refuses those).
fn push_unique(taints: &mut Vec<Taint>, t: Taint) -> Result<(), ClusterValueError> {
    if taints.iter().any(|o| o.key == t.key && o.effect == t.effect) {
        return Err(ClusterValueError::DuplicateTaint { key: t.key, effect: t.effect });
    }
    taints.push(t);
    Ok(())
}

/// `--register-with-taints`: `key[=value]:Effect[,...]`; "" for none.
fn parse_taints_flag(s: &str) -> Result<Vec<Taint>, ClusterValueError> {
    let mut out = Vec::new();
    for spec in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (kv, effect) =
            spec.split_once(':').ok_or_else(|| ClusterValueError::TaintSpec { spec: spec.to_owned() })?;
        if effect.contains(':') {
            return Err(ClusterValueError::TaintSpec { spec: spec.to_owned() });
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if value.contains('=') {
            return Err(ClusterValueError::TaintSpec { spec: spec.to_owned() });
        }
        push_unique(&mut out, taint(key, value, effect)?)?;
    }
    Ok(out)
}

/// `clusterDomain`: "" (none) or a DNS subdomain; lower-cased, a trailing dot removed.
fn validate_cluster_domain(d: &str) -> Result<String, ClusterValueError> {
    let trimmed = d.trim();
    let domain = trimmed.strip_suffix('.').unwrap_or(trimmed).to_ascii_lowercase();
    if domain.is_empty() && !trimmed.is_empty() {
        return Err(ClusterValueError::BareDot { domain: d.to_owned() });
    }
    if !domain.is_empty() && !is_dns_subdomain(&domain) {
        return Err(ClusterValueError::Domain { domain: d.to_owned() });
    }
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err<T: std::fmt::Debug>(r: Result<T, ClusterValueError>) -> String {
        r.expect_err("an invalid value").to_string()
    }

    #[test]
    fn cluster_value_errors_read_as_the_kubelets_messages() {
        assert_eq!(err(parse_ip("x")), r#""x" is not an IP address"#);
        assert_eq!(
            err(parse_node_ips("0.0.0.0")),
            "0.0.0.0 (detect an address of that family) is not supported; leave --node-ip out to detect the \
             node's address"
        );
        assert_eq!(
            err(parse_node_ips("10.0.0.1,10.0.0.2")),
            r#""10.0.0.1,10.0.0.2": two addresses must be one IPv4 and one IPv6 address (dual-stack)"#
        );
        assert_eq!(
            err(parse_node_ips("10.0.0.1,::1,10.0.0.2")),
            r#""10.0.0.1,::1,10.0.0.2": at most two addresses (one IPv4 and one IPv6)"#
        );
        assert_eq!(err(parse_node_labels(&["a".into()])), r#""a" is not key=value"#);
        assert_eq!(
            err(check_node_label("/a", "b")),
            r#"label "/a": the prefix before '/' must not be empty"#
        );
        assert_eq!(
            err(check_node_label("a/b/c", "")),
            r#"label "a/b/c": a qualified name has at most one '/' (an optional DNS subdomain prefix)"#
        );
        assert_eq!(
            err(check_node_label("A_/b", "")),
            r#"label "A_/b": prefix "A_" is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)"#
        );
        assert_eq!(err(check_node_label("a/", "")), r#"label "a/": the name part must not be empty"#);
        assert_eq!(
            err(check_node_label("-a", "")),
            r#"label "-a": name part "-a": must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character"#
        );
        assert_eq!(
            err(check_node_label("a", &"v".repeat(64))),
            format!(r#"label "a": value "{}": must be no more than 63 characters"#, "v".repeat(64))
        );
        assert_eq!(
            err(check_node_label("kubernetes.io/x", "")),
            format!(
                "label \"kubernetes.io/x\" is in the kubernetes.io or k8s.io namespace, where only the kubelet's own \
                 labels ({}) and the namespaces {} (and their subdomains) are allowed",
                KUBELET_LABELS.join(", "),
                KUBELET_LABEL_NAMESPACES.join(", ")
            )
        );
        assert_eq!(err(parse_taints_flag("a")), r#""a" is not key[=value]:Effect"#);
        assert_eq!(
            err(parse_taints_flag("a=b=c:NoSchedule")),
            r#""a=b=c:NoSchedule" is not key[=value]:Effect"#
        );
        assert_eq!(
            err(parse_taints_flag("a:Never")),
            r#"taint "a": effect "Never" is not one of NoSchedule, PreferNoSchedule, NoExecute"#
        );
        assert_eq!(
            err(parse_taints_flag("/a:NoSchedule")),
            r#"taint key "/a": the prefix before '/' must not be empty"#
        );
        assert_eq!(
            err(parse_taints_flag("a=-:NoSchedule")),
            r#"taint "a": value "-": must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character"#
        );
        assert_eq!(
            err(parse_taints_flag("a=1:NoSchedule,a=2:NoSchedule")),
            r#"taint "a" with effect NoSchedule is given twice"#
        );
        assert_eq!(err(validate_cluster_domain(".")), r#""." is not a DNS domain"#);
        assert_eq!(
            err(validate_cluster_domain("a_b")),
            r#""a_b" is not a DNS domain (lower-case letters, digits, '-' and '.', at most 253, like cluster.local)"#
        );
        let dir = std::env::temp_dir();
        assert_eq!(
            err(check_readable_file(&dir)),
            format!("{} is a directory, not a kubeconfig file", dir.display())
        );
        let missing = dir.join("nodelet-no-such-kubeconfig");
        assert!(
            err(check_readable_file(&missing)).starts_with(&format!("cannot read {}: ", missing.display()))
        );
    }
}
