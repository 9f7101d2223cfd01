//! Cluster mode settings (`--kubeconfig` and what goes with it) and the cluster DNS of pods: merging and
//! validation, with the kubelet's rules for node labels, taints and node IPs.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
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
                check_readable_file(&p).map_err(|msg| self.flag_err("--bootstrap-kubeconfig", msg))?;
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
                    check_readable_file(&p).map_err(|msg| self.flag_err("--kubeconfig", msg))?;
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
            Some(s) => parse_node_ips(s).map_err(|msg| self.flag_err("--node-ip", msg))?,
            None => Vec::new(),
        };
        let node_labels =
            parse_node_labels(&args.node_labels).map_err(|msg| self.flag_err("--node-labels", msg))?;
        let register_node = args.register_node.or(raw.register_node).unwrap_or(DEFAULT_REGISTER_NODE);
        let register_with_taints = match (&args.register_with_taints, &raw.register_with_taints) {
            (Some(s), _) => {
                parse_taints_flag(s).map_err(|msg| self.flag_err("--register-with-taints", msg))?
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
            .map_err(|msg| self.file_err(&field, msg))?;
            push_unique(&mut out, taint).map_err(|msg| self.file_err(&field, msg))?;
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
                .map(|s| parse_ip(s).map_err(|msg| self.flag_err("--cluster-dns", msg)))
                .collect();
        }
        raw.cluster_dns
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| parse_ip(s.trim()).map_err(|msg| self.file_err(&format!("clusterDNS[{i}]"), msg)))
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
            (Some(d), _) => validate_cluster_domain(d).map_err(|msg| self.flag_err("--cluster-domain", msg)),
            (None, Some(d)) => validate_cluster_domain(d).map_err(|msg| self.file_err("clusterDomain", msg)),
            (None, None) => Ok(DEFAULT_CLUSTER_DOMAIN.to_owned()),
        }
    }
}

/// Whether `path` is a file this process can open for reading.
fn check_readable_file(path: &Path) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.is_dir() {
        return Err(format!("{} is a directory, not a kubeconfig file", path.display()));
    }
    Ok(())
}

fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("{s:?} is not an IP address"))
}

/// `--node-ip`: one IP, or a dual-stack pair (an IPv4 and an IPv6 address); "" for none (detected).
fn parse_node_ips(s: &str) -> Result<Vec<IpAddr>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    let ips = s.split(',').map(|p| parse_ip(p.trim())).collect::<Result<Vec<_>, _>>()?;
    if let Some(ip) = ips.iter().find(|ip| ip.is_unspecified()) {
        return Err(format!(
            "{ip} (detect an address of that family) is not supported; leave --node-ip out to detect the \
             node's address"
        ));
    }
    match ips.as_slice() {
        [_] => Ok(ips),
        [a, b] if a.is_ipv4() != b.is_ipv4() => Ok(ips),
        [_, _] => Err(format!("{s:?}: two addresses must be one IPv4 and one IPv6 address (dual-stack)")),
        _ => Err(format!("{s:?}: at most two addresses (one IPv4 and one IPv6)")),
    }
}

/// `--node-labels` values: `k=v[,k=v...]` each (a later key wins), checked like the kubelet does.
fn parse_node_labels(values: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in values.iter().flat_map(|v| v.split(',')).filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim());
        check_node_label(k, v)?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(labels)
}

/// A node label the kubelet would accept from `--node-labels` (and may set on its Node).
pub(crate) fn check_node_label(key: &str, value: &str) -> Result<(), String> {
    check_qualified_name(key).map_err(|msg| format!("label {key:?}: {msg}"))?;
    check_label_value(value).map_err(|msg| format!("label {key:?}: value {value:?}: {msg}"))?;
    if is_kubernetes_label(key) && !is_kubelet_label(key) {
        return Err(format!(
            "label {key:?} is in the kubernetes.io or k8s.io namespace, where only the kubelet's own labels ({}) \
             and the namespaces {} (and their subdomains) are allowed",
            KUBELET_LABELS.join(", "),
            KUBELET_LABEL_NAMESPACES.join(", "),
        ));
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
fn check_qualified_name(s: &str) -> Result<(), String> {
    let name = match s.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err("the prefix before '/' must not be empty".into());
            }
            if !is_dns_subdomain(prefix) {
                return Err(format!(
                    "prefix {prefix:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most \
                     253)"
                ));
            }
            *name
        }
        _ => return Err("a qualified name has at most one '/' (an optional DNS subdomain prefix)".into()),
    };
    if name.is_empty() {
        return Err("the name part must not be empty".into());
    }
    check_name_chars(name).map_err(|msg| format!("name part {name:?}: {msg}"))
}

/// A label value: empty, or at most 63 of `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
fn check_label_value(s: &str) -> Result<(), String> {
    if s.is_empty() { Ok(()) } else { check_name_chars(s) }
}

fn check_name_chars(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    if b.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    let ok = b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if ok {
        Ok(())
    } else {
        Err("must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric \
             character"
            .into())
    }
}

/// A taint from its parts, checked like the kubelet checks `registerWithTaints`; the effect is required.
fn taint(key: &str, value: &str, effect: &str) -> Result<Taint, String> {
    check_qualified_name(key).map_err(|msg| format!("taint key {key:?}: {msg}"))?;
    check_label_value(value).map_err(|msg| format!("taint {key:?}: value {value:?}: {msg}"))?;
    if !TAINT_EFFECTS.contains(&effect) {
        return Err(format!("taint {key:?}: effect {effect:?} is not one of {}", TAINT_EFFECTS.join(", ")));
    }
    Ok(Taint {
        key: key.to_owned(),
        value: (!value.is_empty()).then(|| value.to_owned()),
        effect: effect.to_owned(),
        time_added: None,
    })
}

/// Adds `t` unless a taint with the same key and effect is there (the kubelet refuses those).
fn push_unique(taints: &mut Vec<Taint>, t: Taint) -> Result<(), String> {
    if taints.iter().any(|o| o.key == t.key && o.effect == t.effect) {
        return Err(format!("taint {:?} with effect {} is given twice", t.key, t.effect));
    }
    taints.push(t);
    Ok(())
}

/// `--register-with-taints`: `key[=value]:Effect[,...]`; "" for none.
fn parse_taints_flag(s: &str) -> Result<Vec<Taint>, String> {
    let mut out = Vec::new();
    for spec in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (kv, effect) =
            spec.split_once(':').ok_or_else(|| format!("{spec:?} is not key[=value]:Effect"))?;
        if effect.contains(':') {
            return Err(format!("{spec:?} is not key[=value]:Effect"));
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if value.contains('=') {
            return Err(format!("{spec:?} is not key[=value]:Effect"));
        }
        push_unique(&mut out, taint(key, value, effect)?)?;
    }
    Ok(out)
}

/// `clusterDomain`: "" (none) or a DNS subdomain; lower-cased, a trailing dot removed.
fn validate_cluster_domain(d: &str) -> Result<String, String> {
    let trimmed = d.trim();
    let domain = trimmed.strip_suffix('.').unwrap_or(trimmed).to_ascii_lowercase();
    if domain.is_empty() && !trimmed.is_empty() {
        return Err(format!("{d:?} is not a DNS domain"));
    }
    if !domain.is_empty() && !is_dns_subdomain(&domain) {
        return Err(format!(
            "{d:?} is not a DNS domain (lower-case letters, digits, '-' and '.', at most 253, like cluster.local)"
        ));
    }
    Ok(domain)
}
