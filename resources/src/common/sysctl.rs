//! Which sysctls a pod may set (`spec.securityContext.sysctls`): the kubelet's sysctl admit handler
//! (`pkg/kubelet/sysctl/allowlist.go`, `safe_sysctls.go`, v1.28) and its namespace table
//! (`k8s.io/component-helpers/node/util/sysctl`).
//!
//! - The allowlist is the safe set ([`SAFE_SYSCTLS`]) plus the node's `allowedUnsafeSysctls`
//!   (`--allowed-unsafe-sysctls`): names, or prefixes ending in `*`. Every entry must be known to be
//!   namespaced (`kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`: IPC; `net.*`: network);
//!   others are refused when the allowlist is built, as the kubelet refuses to start.
//! - A pod's sysctl outside the allowlist is refused: `forbidden sysctl: "kernel.msgmax" not
//!   allowlisted` (reason [`FORBIDDEN_REASON`]). An allowlisted sysctl of the IPC namespace in a
//!   `hostIPC` pod, or of the network namespace in a `hostNetwork` pod, is refused too:
//!   `forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host net enabled`.
//! - Names may use `/` as the separator (`kernel/shm_rmid_forced`); they are compared in the dotted form.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

/// The status reason of a pod refused for its sysctls.
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// The sysctls every pod may set (the kubelet's safe set of v1.28; `net.ipv4.ip_local_reserved_ports`
/// needs Linux 3.16, older than any kernel nodelet runs on).
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
];

/// The longest sysctl name or pattern (the API's `SysctlMaxLength`).
const MAX_LENGTH: usize = 253;

/// The kernel namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    /// The IPC namespace (shared with the node by `hostIPC`).
    Ipc,
    /// The network namespace (shared with the node by `hostNetwork`).
    Net,
}

impl Namespace {
    /// The kubelet's name of the namespace in its messages.
    fn as_str(self) -> &'static str {
        match self {
            Namespace::Ipc => "ipc",
            Namespace::Net => "net",
        }
    }

    /// The namespace of the sysctl (or sysctl prefix) `name` in the dotted form, `None` when it is not
    /// known to be namespaced.
    pub fn of(name: &str) -> Option<Namespace> {
        if name == "kernel.sem" {
            return Some(Namespace::Ipc);
        }
        if ["kernel.shm", "kernel.msg", "fs.mqueue."].iter().any(|p| name.starts_with(p)) {
            return Some(Namespace::Ipc);
        }
        name.starts_with("net.").then_some(Namespace::Net)
    }
}

/// A pattern of `allowedUnsafeSysctls` that the kubelet would not start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlPatternError {
    /// Not a sysctl name or a prefix ending in `*`.
    #[error(
        "sysctl {0:?} must have at most 253 characters and match regex ([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]"
    )]
    Invalid(String),
    /// A prefix not known to be namespaced.
    #[error("the sysctls {0:?} are not known to be namespaced")]
    PrefixNotNamespaced(String),
    /// A name not known to be namespaced.
    #[error("the sysctl {0:?} are not known to be namespaced")]
    NotNamespaced(String),
}

/// Why a pod may not set a sysctl ([`SysctlAllowlist::admit`]): the kubelet's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlForbidden {
    /// Neither a safe sysctl nor one of the node's allowed unsafe ones.
    #[error("forbidden sysctl: {0:?} not allowlisted")]
    NotAllowlisted(String),
    /// A sysctl of a namespace the pod shares with the node (`hostNetwork`, `hostIPC`).
    #[error("forbidden sysctl: {name:?} not allowed with host {} enabled", .namespace.as_str())]
    HostNamespace {
        /// The sysctl, with `.` as the separator.
        name: String,
        /// The namespace shared with the node.
        namespace: Namespace,
    },
}

/// The sysctls pods may set on this node: the safe set and the node's unsafe ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlAllowlist {
    names: BTreeMap<String, Namespace>,
    prefixes: BTreeMap<String, Namespace>,
}

impl Default for SysctlAllowlist {
    /// The safe set alone.
    fn default() -> Self {
        Self::new(&[]).unwrap_or_else(|_| Self { names: BTreeMap::new(), prefixes: BTreeMap::new() })
    }
}

impl SysctlAllowlist {
    /// The safe set and `allowed_unsafe` (`allowedUnsafeSysctls`: names or prefixes ending in `*`).
    pub fn new(allowed_unsafe: &[String]) -> Result<Self, SysctlPatternError> {
        let mut list = Self { names: BTreeMap::new(), prefixes: BTreeMap::new() };
        for pattern in SAFE_SYSCTLS.iter().copied().chain(allowed_unsafe.iter().map(String::as_str)) {
            if !valid_pattern(pattern) {
                return Err(SysctlPatternError::Invalid(pattern.to_owned()));
            }
            let pattern = to_dots(pattern);
            if let Some(prefix) = pattern.strip_suffix('*') {
                let ns = Namespace::of(prefix)
                    .ok_or_else(|| SysctlPatternError::PrefixNotNamespaced(pattern.clone()))?;
                list.prefixes.insert(prefix.to_owned(), ns);
            } else {
                let ns = Namespace::of(&pattern)
                    .ok_or_else(|| SysctlPatternError::NotNamespaced(pattern.clone()))?;
                list.names.insert(pattern, ns);
            }
        }
        Ok(list)
    }

    /// Whether a pod with `spec` may set its sysctls: `Err` with the kubelet's message (for the
    /// [`FORBIDDEN_REASON`] rejection) naming the first one it may not.
    pub fn admit(&self, spec: &PodSpec) -> Result<(), SysctlForbidden> {
        let sysctls = spec.security_context.as_ref().and_then(|sc| sc.sysctls.as_deref()).unwrap_or_default();
        let host_network = spec.host_network == Some(true);
        let host_ipc = spec.host_ipc == Some(true);
        for sysctl in sysctls {
            self.check(&sysctl.name, host_network, host_ipc)?;
        }
        Ok(())
    }

    fn check(&self, name: &str, host_network: bool, host_ipc: bool) -> Result<(), SysctlForbidden> {
        let name = to_dots(name);
        let ns = match self.names.get(&name) {
            Some(ns) => *ns,
            None => match self.prefixes.iter().find(|(p, _)| name.starts_with(p.as_str())) {
                Some((_, ns)) => *ns,
                None => return Err(SysctlForbidden::NotAllowlisted(name)),
            },
        };
        if (ns == Namespace::Ipc && host_ipc) || (ns == Namespace::Net && host_network) {
            return Err(SysctlForbidden::HostNamespace { name, namespace: ns });
        }
        Ok(())
    }
}

/// `name` with `.` as the separator: a name whose first separator is `/` has its `/` and `.` swapped
/// (`net/ipv4/conf/eth0.100/forwarding` is `net.ipv4.conf.eth0/100.forwarding`), as the kubelet's
/// `ConvertSysctlVariableToDotsSeparator` does.
pub fn to_dots(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes().get(i) == Some(&b'/') => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// The API's `IsValidSysctlPattern`: segments `[a-z0-9]([-_a-z0-9]*[a-z0-9])?` separated by `.` or
/// `/`, the last one possibly ending in `*` instead (`([a-z0-9][-_a-z0-9]*)?[a-z0-9*]`: `kernel.msg*`,
/// `net.*`), at most 253 characters.
fn valid_pattern(pattern: &str) -> bool {
    if pattern.len() > MAX_LENGTH {
        return false;
    }
    let segments: Vec<&str> = pattern.split(['.', '/']).collect();
    let last = segments.len() - 1;
    segments.iter().enumerate().all(|(i, s)| match s.strip_suffix('*') {
        Some(head) if i == last => {
            head.is_empty()
                || head.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                    && head
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        }
        _ => valid_segment(s),
    })
}

fn valid_segment(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-' || *b == b'_')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sysctls: &[&str], host_network: bool, host_ipc: bool) -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "containers": [{"name": "c", "image": "i"}],
            "hostNetwork": host_network,
            "hostIPC": host_ipc,
            "securityContext": {"sysctls": sysctls.iter().map(|n| serde_json::json!({"name": n, "value": "1"})).collect::<Vec<_>>()},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn the_safe_set_is_allowed_and_the_rest_is_forbidden_with_the_kubelets_message() {
        let list = SysctlAllowlist::default();
        assert_eq!(
            list.admit(&spec(&["kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range"], false, false))
                .map_err(|e| e.to_string()),
            Ok(())
        );
        assert_eq!(
            list.admit(&spec(&["kernel/shm_rmid_forced"], false, false)).map_err(|e| e.to_string()),
            Ok(()),
            "slashes as separators"
        );
        assert_eq!(list.admit(&spec(&[], true, true)), Ok(()));
        assert_eq!(
            list.admit(&spec(&["kernel.shm_rmid_forced", "kernel.msgmax"], false, false))
                .map_err(|e| e.to_string()),
            Err(r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#.to_owned())
        );
        assert_eq!(
            list.admit(&spec(&["net.ipv4.tcp_keepalive_time"], false, false)).map_err(|e| e.to_string()),
            Err(r#"forbidden sysctl: "net.ipv4.tcp_keepalive_time" not allowlisted"#.to_owned()),
            "not safe before v1.29"
        );
    }

    #[test]
    fn host_namespaces_forbid_the_sysctls_of_those_namespaces() {
        let list = SysctlAllowlist::default();
        assert_eq!(
            list.admit(&spec(&["net.ipv4.ip_local_port_range"], true, false)).map_err(|e| e.to_string()),
            Err(r#"forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host net enabled"#
                .to_owned())
        );
        assert_eq!(list.admit(&spec(&["net.ipv4.ip_local_port_range"], false, true)), Ok(()));
        assert_eq!(
            list.admit(&spec(&["kernel.shm_rmid_forced"], false, true)).map_err(|e| e.to_string()),
            Err(r#"forbidden sysctl: "kernel.shm_rmid_forced" not allowed with host ipc enabled"#.to_owned())
        );
        let unsafe_list = SysctlAllowlist::new(&["kernel.msg*".into()]).expect("valid");
        assert_eq!(
            unsafe_list.admit(&spec(&["kernel.msgmax"], false, true)).map_err(|e| e.to_string()),
            Err(r#"forbidden sysctl: "kernel.msgmax" not allowed with host ipc enabled"#.to_owned())
        );
    }

    #[test]
    fn allowed_unsafe_sysctls_add_names_and_prefixes() {
        let list =
            SysctlAllowlist::new(&["kernel.msg*".into(), "net.core.somaxconn".into(), "kernel.sem".into()])
                .expect("valid");
        assert_eq!(
            list.admit(&spec(&["kernel.msgmax", "kernel.msgmnb", "kernel.sem"], false, false))
                .map_err(|e| e.to_string()),
            Ok(())
        );
        assert_eq!(
            list.admit(&spec(&["net.core.somaxconn", "kernel.shm_rmid_forced"], false, false))
                .map_err(|e| e.to_string()),
            Ok(())
        );
        assert_eq!(
            list.admit(&spec(&["net.core.rmem_max"], false, false)).map_err(|e| e.to_string()),
            Err(r#"forbidden sysctl: "net.core.rmem_max" not allowlisted"#.to_owned())
        );
        let slashed = SysctlAllowlist::new(&["net/core/somaxconn".into()]).expect("valid");
        assert_eq!(slashed.admit(&spec(&["net.core.somaxconn"], false, false)), Ok(()));
    }

    #[test]
    fn patterns_the_kubelet_would_not_start_with_are_errors() {
        assert_eq!(
            SysctlAllowlist::new(&["kernel.panic".into()]),
            Err(SysctlPatternError::NotNamespaced("kernel.panic".into()))
        );
        assert_eq!(
            SysctlAllowlist::new(&["vm.*".into()]),
            Err(SysctlPatternError::PrefixNotNamespaced("vm.*".into()))
        );
        for bad in
            ["", "Net.core", "net..core", "net.*.x", "net.core-", "*x", "net.m*g", "net.-*", &"a".repeat(254)]
        {
            assert_eq!(
                SysctlAllowlist::new(&[bad.to_owned()]),
                Err(SysctlPatternError::Invalid(bad.to_owned())),
                "{bad:?}"
            );
        }
        assert!(SysctlAllowlist::new(&["*".into()]).is_err(), "`*` alone is not namespaced");
        assert!(SysctlAllowlist::new(&["net.*".into(), "fs.mqueue.*".into()]).is_ok());
    }

    #[test]
    fn slashes_swap_with_dots_only_when_first() {
        assert_eq!(to_dots("net/ipv4/conf/eth0.100/forwarding"), "net.ipv4.conf.eth0/100.forwarding");
        assert_eq!(to_dots("net.ipv4.conf.eth0/100.forwarding"), "net.ipv4.conf.eth0/100.forwarding");
        assert_eq!(to_dots("kernel"), "kernel");
    }
}
