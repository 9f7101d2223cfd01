//! A pod's DNS configuration, as the kubelet computes it (`pkg/kubelet/network/dns/dns.go`): the node's
//! resolv.conf (`--resolv-conf`), the cluster DNS servers and domain, the pod's `dnsPolicy` and its
//! `dnsConfig`, cut to the resolver's limits.

use k8s_cri::v1;
use k8s_openapi::api::core::v1::PodDNSConfig;

/// At most this many nameservers reach the pod's resolv.conf (glibc reads no more).
pub(crate) const MAX_NAMESERVERS: usize = 3;
/// At most this many search domains (glibc ≥ 2.26 and the kubelet's `MaxDNSSearchPaths`).
pub(crate) const MAX_SEARCHES: usize = 32;
/// At most this many characters in the search line (the kubelet's `MaxDNSSearchListChars`).
pub(crate) const MAX_SEARCH_CHARS: usize = 2048;
/// The options the kubelet gives `ClusterFirst` pods.
const CLUSTER_FIRST_OPTIONS: &[&str] = &["ndots:5"];

/// What a resolv.conf file says: nameservers, search domains and options, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResolvConf {
    /// `nameserver` lines.
    pub(crate) nameservers: Vec<String>,
    /// The last `search` line's domains, trailing dots removed, `.` dropped.
    pub(crate) searches: Vec<String>,
    /// Every `options` entry; a later entry of the same name replaces an earlier one.
    pub(crate) options: Vec<String>,
}

impl ResolvConf {
    /// Parses resolv.conf text like the kubelet: comment lines (`#`, `;`) are skipped, the last `search`
    /// line wins, options accumulate. Malformed lines (a `nameserver` without an address) are ignored.
    pub(crate) fn parse(text: &str) -> Self {
        let mut conf = ResolvConf::default();
        for line in text.lines() {
            if line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("nameserver") => {
                    if let Some(server) = fields.next() {
                        conf.nameservers.push(server.to_owned());
                    }
                }
                Some("search") => {
                    conf.searches = fields
                        .filter(|s| *s != ".")
                        .map(|s| s.strip_suffix('.').unwrap_or(s).to_owned())
                        .collect();
                }
                Some("options") => {
                    let options = std::mem::take(&mut conf.options);
                    conf.options = merge_options(options, fields.map(split_option));
                }
                _ => {}
            }
        }
        conf
    }
}

/// The pod's `dnsPolicy` as the kubelet resolves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DnsKind {
    /// Cluster DNS servers and search path (`ClusterFirst` off the host network, `ClusterFirstWithHostNet`).
    Cluster,
    /// The node's resolv.conf (`Default`, and `ClusterFirst` on the host network).
    Host,
    /// Only the pod's `dnsConfig` (`None`).
    None,
}

/// A `dnsPolicy` the kubelet does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.dnsPolicy: unsupported value {0:?}")]
pub(crate) struct UnknownDnsPolicy(pub(crate) String);

/// Resolves `dnsPolicy` (unset means `ClusterFirst`); `Err` with the unknown value otherwise.
pub(crate) fn dns_kind(policy: Option<&str>, host_network: bool) -> Result<DnsKind, UnknownDnsPolicy> {
    match policy.unwrap_or("ClusterFirst") {
        "None" => Ok(DnsKind::None),
        "ClusterFirstWithHostNet" => Ok(DnsKind::Cluster),
        "ClusterFirst" if !host_network => Ok(DnsKind::Cluster),
        "ClusterFirst" | "Default" => Ok(DnsKind::Host),
        other => Err(UnknownDnsPolicy(other.to_owned())),
    }
}

/// Inputs of [`pod_dns_config`] that come from the node rather than the pod.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeDns<'a> {
    /// The parsed `--resolv-conf`; `None` when the kubelet's resolv.conf is configured empty.
    pub(crate) host: Option<&'a ResolvConf>,
    /// Cluster DNS server addresses (empty: `ClusterFirst` falls back to the host's).
    pub(crate) cluster_dns: &'a [String],
    /// The cluster domain (`cluster.local`); empty for none.
    pub(crate) cluster_domain: &'a str,
}

/// The CRI DNS config of a pod in `namespace` with `kind` and the pod's own `dnsConfig`.
pub(crate) fn pod_dns_config(
    kind: DnsKind,
    namespace: &str,
    pod_dns: Option<&PodDNSConfig>,
    node: NodeDns<'_>,
) -> v1::DnsConfig {
    let host = node.host.cloned().unwrap_or_default();
    let mut config =
        v1::DnsConfig { servers: host.nameservers, searches: host.searches, options: host.options };
    let mut kind = kind;
    if kind == DnsKind::Cluster && node.cluster_dns.is_empty() {
        // The kubelet warns ("ClusterFirst policy specified but no cluster DNS") and uses the host's.
        tracing::debug!(
            namespace,
            "ClusterFirst DNS policy without cluster DNS: using the node's resolv.conf"
        );
        kind = DnsKind::Host;
    }
    match kind {
        DnsKind::None => config = v1::DnsConfig::default(),
        DnsKind::Cluster => {
            config.servers = node.cluster_dns.to_vec();
            if !node.cluster_domain.is_empty() {
                let domain = node.cluster_domain;
                let mut searches =
                    vec![format!("{namespace}.svc.{domain}"), format!("svc.{domain}"), domain.to_owned()];
                searches.append(&mut config.searches);
                config.searches = searches;
            }
            config.options = CLUSTER_FIRST_OPTIONS.iter().map(|s| (*s).to_owned()).collect();
        }
        DnsKind::Host => {
            if node.host.is_none() {
                // `--resolv-conf=""`: DNS lookups go nowhere but the node itself.
                if config.servers.is_empty() {
                    config.servers.push("127.0.0.1".to_owned());
                }
                config.searches = vec![".".to_owned()];
            }
        }
    }
    if let Some(pod_dns) = pod_dns {
        config.servers.extend(pod_dns.nameservers.iter().flatten().cloned());
        config.searches.extend(pod_dns.searches.iter().flatten().cloned());
        let pod_options =
            pod_dns.options.iter().flatten().filter_map(|o| {
                o.name.as_deref().map(|n| (n.to_owned(), o.value.clone().unwrap_or_default()))
            });
        config.options = merge_options(std::mem::take(&mut config.options), pod_options);
    }
    config.servers = dedup(config.servers);
    config.searches = dedup(config.searches);
    fit_limits(&mut config);
    config
}

/// Cuts a DNS config to what the resolver reads: three nameservers, 32 search domains, 2048 characters of
/// search line.
fn fit_limits(config: &mut v1::DnsConfig) {
    config.servers.truncate(MAX_NAMESERVERS);
    config.searches.truncate(MAX_SEARCHES);
    while !config.searches.is_empty()
        && config.searches.iter().map(String::len).sum::<usize>() + config.searches.len() - 1
            > MAX_SEARCH_CHARS
    {
        config.searches.pop();
    }
}

fn split_option(option: &str) -> (String, String) {
    match option.split_once(':') {
        Some((name, value)) => (name.to_owned(), value.to_owned()),
        None => (option.to_owned(), String::new()),
    }
}

/// Merges options by name: a later value replaces an earlier one in place; output `name` or `name:value`.
fn merge_options(existing: Vec<String>, more: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let mut merged: Vec<(String, String)> = existing.iter().map(|o| split_option(o)).collect();
    for (name, value) in more {
        match merged.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => merged.push((name, value)),
        }
    }
    merged.into_iter().map(|(n, v)| if v.is_empty() { n } else { format!("{n}:{v}") }).collect()
}

fn dedup(items: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodDNSConfigOption;

    use super::*;

    const HOST: &str = "# generated\n; also a comment\nnameserver 127.0.0.1\nnameserver 127.0.0.2\n\
                        search old.example\nsearch corp.example. . lab.example\noptions ndots:2 timeout:1\n\
                        options ndots:3 rotate\nnameserver\n";

    fn node<'a>(host: Option<&'a ResolvConf>, cluster_dns: &'a [String]) -> NodeDns<'a> {
        NodeDns { host, cluster_dns, cluster_domain: "cluster.local" }
    }

    #[test]
    fn parses_resolv_conf_like_the_kubelet() {
        let conf = ResolvConf::parse(HOST);
        assert_eq!(conf.nameservers, ["127.0.0.1", "127.0.0.2"]);
        assert_eq!(conf.searches, ["corp.example", "lab.example"]);
        assert_eq!(conf.options, ["ndots:3", "timeout:1", "rotate"]);
    }

    #[test]
    fn policies() {
        assert_eq!(dns_kind(None, false), Ok(DnsKind::Cluster));
        assert_eq!(dns_kind(None, true), Ok(DnsKind::Host));
        assert_eq!(dns_kind(Some("ClusterFirstWithHostNet"), true), Ok(DnsKind::Cluster));
        assert_eq!(dns_kind(Some("Default"), false), Ok(DnsKind::Host));
        assert_eq!(dns_kind(Some("None"), false), Ok(DnsKind::None));
        assert_eq!(dns_kind(Some("Bogus"), false), Err(UnknownDnsPolicy("Bogus".to_owned())));
    }

    #[test]
    fn cluster_first_uses_cluster_dns_and_search_path() {
        let host = ResolvConf::parse(HOST);
        let cluster = ["198.18.255.10".to_owned()];
        let c = pod_dns_config(DnsKind::Cluster, "web", None, node(Some(&host), &cluster));
        assert_eq!(c.servers, ["198.18.255.10"]);
        assert_eq!(
            c.searches,
            ["web.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "lab.example"]
        );
        assert_eq!(c.options, ["ndots:5"]);
        // Without cluster DNS it falls back to the host's config.
        let c = pod_dns_config(DnsKind::Cluster, "web", None, node(Some(&host), &[]));
        assert_eq!(c.servers, ["127.0.0.1", "127.0.0.2"]);
        assert_eq!(c.options, ["ndots:3", "timeout:1", "rotate"]);
    }

    #[test]
    fn none_policy_takes_only_the_pod_config_and_merges_options() {
        let host = ResolvConf::parse(HOST);
        let pod = PodDNSConfig {
            nameservers: Some(vec!["127.0.0.53".into(), "127.0.0.53".into()]),
            searches: Some(vec!["a.example".into()]),
            options: Some(vec![
                PodDNSConfigOption { name: Some("ndots".into()), value: Some("1".into()) },
                PodDNSConfigOption { name: Some("edns0".into()), value: None },
                PodDNSConfigOption { name: None, value: Some("ignored".into()) },
            ]),
        };
        let c = pod_dns_config(DnsKind::None, "web", Some(&pod), node(Some(&host), &[]));
        assert_eq!(c.servers, ["127.0.0.53"]);
        assert_eq!(c.searches, ["a.example"]);
        assert_eq!(c.options, ["ndots:1", "edns0"]);
        // Host + pod: appended, options replaced by name in place.
        let c = pod_dns_config(DnsKind::Host, "web", Some(&pod), node(Some(&host), &[]));
        assert_eq!(c.servers, ["127.0.0.1", "127.0.0.2", "127.0.0.53"]);
        assert_eq!(c.searches, ["corp.example", "lab.example", "a.example"]);
        assert_eq!(c.options, ["ndots:1", "timeout:1", "rotate", "edns0"]);
    }

    #[test]
    fn empty_resolv_conf_setting_points_at_localhost() {
        let c = pod_dns_config(DnsKind::Host, "web", None, node(None, &[]));
        assert_eq!((c.servers, c.searches), (vec!["127.0.0.1".to_owned()], vec![".".to_owned()]));
    }

    #[test]
    fn limits() {
        let pod = PodDNSConfig {
            nameservers: Some((1..=5).map(|i| format!("127.0.0.{i}")).collect()),
            searches: Some((0..40).map(|i| format!("{i:0>60}.example")).collect()),
            options: None,
        };
        let c = pod_dns_config(DnsKind::None, "web", Some(&pod), node(None, &[]));
        assert_eq!(c.servers.len(), MAX_NAMESERVERS);
        assert!(c.searches.len() <= MAX_SEARCHES);
        assert!(c.searches.iter().map(|s| s.len() + 1).sum::<usize>() - 1 <= MAX_SEARCH_CHARS);
        assert_eq!(c.searches.len(), 2048 / 69);
    }
}
