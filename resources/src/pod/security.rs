//! Local pod security: the Pod Security Standards levels (`privileged`, `baseline`, `restricted`)
//! checked on the node for every pod source, and the node's own restrictions of `--allow-privileged=false`.
//!
//! [`evaluate`] runs the checks of k8s.io/pod-security-admission at policy version v1.28 for a level and
//! returns what the pod violates, each with the upstream forbidden reason and detail, in the upstream order
//! (the baseline checks, then the restricted ones). [`PodSecurity::admit`] turns that into the API server's
//! text: `violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)`.
//!
//! [`NodeRestrictions`] is what `--allow-privileged=false` adds: every source is held to at least
//! `baseline` ([`PodSecurity::effective_level`]), and the refusals name the flag for host namespaces,
//! capabilities beyond the runtime's default set, hostPath volumes outside the allowed prefixes and host
//! ports equal to the node agent's own ports. hostPath volumes under the allowed prefixes are the one thing
//! the restrictions let through that `baseline` alone would refuse (the node's operator listed them).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SecurityContext};

use crate::model::pod::ephemeral_as_container;

/// The prefix of the AppArmor annotations (`container.apparmor.security.beta.kubernetes.io/<container>`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The capabilities containerd (and so the CRI runtime nodelet drives) gives a container by default;
/// `--allow-privileged=false` refuses adding any other.
pub const RUNTIME_DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The capabilities the baseline level lets a container add (pod-security-admission's
/// `capabilities_baseline`).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The sysctls the baseline level allows (policy version v1.28).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];

/// The SELinux types the baseline level allows (policy version v1.0 to v1.30).
const SELINUX_TYPES: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t"];

/// A Pod Security Standards level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Level {
    /// Everything is allowed.
    #[default]
    Privileged,
    /// Known privilege escalations are refused.
    Baseline,
    /// Baseline plus the hardening best practices.
    Restricted,
}

impl Level {
    /// The level's name as Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level name that is none of `privileged`, `baseline`, `restricted`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown Pod Security Standards level {0:?} (use privileged, baseline or restricted)")]
pub struct UnknownLevel(pub String);

impl FromStr for Level {
    type Err = UnknownLevel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            other => Err(UnknownLevel(other.to_owned())),
        }
    }
}

/// One failed check: the upstream forbidden reason (`host namespaces`) and detail (`hostNetwork=true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forbidden {
    /// The reason, e.g. `privileged`.
    pub reason: String,
    /// The detail, e.g. `container "a" must not set securityContext.privileged=true`; may be empty.
    pub detail: String,
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{} ({})", self.reason, self.detail)
        }
    }
}

/// Why a pod was refused by the node's security settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    /// The pod violates the Pod Security Standards level enforced for its source.
    #[error("violates PodSecurity \"{level}:latest\": {}", join_display(.violations))]
    PodSecurity {
        /// The level enforced.
        level: Level,
        /// What failed (never empty).
        violations: Vec<Forbidden>,
    },
    /// The pod asks for host access that `--allow-privileged=false` refuses.
    #[error("forbidden by --allow-privileged=false: {}", .0.join("; "))]
    NotPrivileged(Vec<String>),
}

fn join_display(items: &[Forbidden]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// What `--allow-privileged=false` refuses, and the hostPath directories it still allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRestrictions {
    /// Directories (absolute) under which hostPath volumes are allowed, even though the `baseline` level
    /// these restrictions imply refuses hostPath volumes; empty: none.
    pub host_path_prefixes: Vec<PathBuf>,
    /// The node agent's own ports, which no hostPort may take.
    pub reserved_host_ports: BTreeSet<u16>,
}

/// The security settings one pod source is held to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSecurity {
    /// The Pod Security Standards level configured for the source.
    pub level: Level,
    /// `Some` when `--allow-privileged=false` is set: what it refuses; it also raises the level to at least
    /// `baseline` (see [`effective_level`](Self::effective_level)).
    pub restrictions: Option<NodeRestrictions>,
}

impl PodSecurity {
    /// The level enforced: [`level`](Self::level), raised to `baseline` under `--allow-privileged=false`.
    pub fn effective_level(&self) -> Level {
        if self.restrictions.is_some() { self.level.max(Level::Baseline) } else { self.level }
    }

    /// Checks `pod` against these settings: the restrictions first, then the effective level (hostPath
    /// volumes the restrictions allow are not counted against it).
    pub fn admit(&self, pod: &Pod) -> Result<(), SecurityError> {
        let level = self.effective_level();
        let violations = match &self.restrictions {
            Some(restrictions) => {
                let problems = restrictions.check(pod);
                if !problems.is_empty() {
                    return Err(SecurityError::NotPrivileged(problems));
                }
                if restrictions.host_path_prefixes.is_empty() {
                    evaluate(pod, level)
                } else {
                    // Every hostPath volume is under an allowed prefix (checked above).
                    evaluate(&without_host_paths(pod), level)
                }
            }
            None => evaluate(pod, level),
        };
        if violations.is_empty() { Ok(()) } else { Err(SecurityError::PodSecurity { level, violations }) }
    }
}

/// `pod` without its hostPath volumes.
fn without_host_paths(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    if let Some(volumes) = pod.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
        volumes.retain(|v| v.host_path.is_none());
    }
    pod
}

impl NodeRestrictions {
    /// What `pod` asks for that these restrictions refuse, one sentence each, naming the field.
    pub fn check(&self, pod: &Pod) -> Vec<String> {
        let mut out = Vec::new();
        let Some(spec) = pod.spec.as_ref() else { return out };
        for (field, set) in
            [("hostNetwork", spec.host_network), ("hostPID", spec.host_pid), ("hostIPC", spec.host_ipc)]
        {
            if set == Some(true) {
                out.push(format!("spec.{field}: host namespaces are not allowed"));
            }
        }
        for (i, volume) in spec.volumes.iter().flatten().enumerate() {
            if let Some(host_path) = &volume.host_path
                && !self.host_path_allowed(&host_path.path)
            {
                out.push(format!(
                    "spec.volumes[{i}].hostPath.path: {:?} is not under an allowed hostPath prefix ({})",
                    host_path.path,
                    if self.host_path_prefixes.is_empty() {
                        "none is allowed".to_owned()
                    } else {
                        self.host_path_prefixes
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ));
            }
        }
        for (path, c) in containers_with_paths(spec) {
            if let Some(added) =
                c.security_context.as_ref().and_then(|sc| sc.capabilities.as_ref()?.add.as_ref())
            {
                let extra: Vec<&str> = added
                    .iter()
                    .map(String::as_str)
                    .filter(|cap| {
                        let name = cap.strip_prefix("CAP_").unwrap_or(cap);
                        !RUNTIME_DEFAULT_CAPABILITIES.contains(&name)
                    })
                    .collect();
                if !extra.is_empty() {
                    out.push(format!(
                        "{path}.securityContext.capabilities.add: {} beyond the runtime's default set",
                        join_quote(extra.iter().copied())
                    ));
                }
            }
            for (j, port) in c.ports.iter().flatten().enumerate() {
                let host_port = port.host_port.unwrap_or(0);
                let taken = u16::try_from(host_port).is_ok_and(|p| self.reserved_host_ports.contains(&p));
                let host_net = spec.host_network == Some(true)
                    && u16::try_from(port.container_port)
                        .is_ok_and(|p| self.reserved_host_ports.contains(&p));
                if taken || host_net {
                    let port_number = if taken { host_port } else { port.container_port };
                    out.push(format!(
                        "{path}.ports[{j}]: port {port_number} is one of the node agent's own ports"
                    ));
                }
            }
        }
        out
    }

    fn host_path_allowed(&self, path: &str) -> bool {
        let path = Path::new(path);
        if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir)) {
            return false;
        }
        self.host_path_prefixes.iter().any(|prefix| path.starts_with(prefix))
    }
}

/// Every container of `spec` (init, regular, ephemeral) with its field path.
fn containers_with_paths(spec: &PodSpec) -> Vec<(String, Container)> {
    let mut out = Vec::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        out.push((format!("spec.initContainers[{i}]"), c.clone()));
    }
    for (i, c) in spec.containers.iter().enumerate() {
        out.push((format!("spec.containers[{i}]"), c.clone()));
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        out.push((format!("spec.ephemeralContainers[{i}]"), ephemeral_as_container(c)));
    }
    out
}

fn pluralize<'a>(one: &'a str, many: &'a str, n: usize) -> &'a str {
    if n == 1 { one } else { many }
}

fn join_quote<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items.into_iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase(names: &[String]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names.iter().map(String::as_str))
    )
}

struct Ctx<'a> {
    pod: &'a Pod,
    spec: &'a PodSpec,
    containers: Vec<(String, Container)>,
}

impl Ctx<'_> {
    fn names_where(&self, mut f: impl FnMut(&Container) -> bool) -> Vec<String> {
        self.containers.iter().filter(|(_, c)| f(c)).map(|(_, c)| c.name.clone()).collect()
    }
    fn pod_sc(&self) -> Option<&k8s_openapi::api::core::v1::PodSecurityContext> {
        self.spec.security_context.as_ref()
    }
}

fn sc(c: &Container) -> Option<&SecurityContext> {
    c.security_context.as_ref()
}

fn forbidden(reason: impl Into<String>, detail: impl Into<String>) -> Option<Forbidden> {
    Some(Forbidden { reason: reason.into(), detail: detail.into() })
}

/// Runs the checks of `level` on `pod` and returns what fails, in the upstream order (empty: allowed).
pub fn evaluate(pod: &Pod, level: Level) -> Vec<Forbidden> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let ctx = Ctx { pod, spec, containers: containers_with_paths(spec) };
    let restricted = level == Level::Restricted;
    let mut checks: Vec<fn(&Ctx) -> Option<Forbidden>> = vec![app_armor];
    if !restricted {
        checks.push(capabilities_baseline);
    }
    checks.extend([host_namespaces as fn(&Ctx) -> Option<Forbidden>]);
    if !restricted {
        checks.push(host_path_volumes);
    }
    checks.extend([host_ports as fn(&Ctx) -> Option<Forbidden>, privileged, proc_mount, se_linux_options]);
    if !restricted {
        checks.push(seccomp_baseline);
    }
    checks.extend([sysctls as fn(&Ctx) -> Option<Forbidden>, windows_host_process]);
    if restricted {
        checks.extend([
            allow_privilege_escalation as fn(&Ctx) -> Option<Forbidden>,
            capabilities_restricted,
            restricted_volumes,
            run_as_non_root,
            run_as_user,
            seccomp_restricted,
        ]);
    }
    checks.iter().filter_map(|check| check(&ctx)).collect()
}

// ===== baseline =====

fn app_armor(ctx: &Ctx) -> Option<Forbidden> {
    let mut bad = Vec::new();
    let annotations: BTreeMap<&String, &String> = ctx
        .pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(APPARMOR_ANNOTATION_PREFIX))
        .collect();
    for (key, value) in annotations {
        if !(value == "runtime/default" || value.starts_with("localhost/")) {
            bad.push(format!("{key}={value:?}"));
        }
    }
    let unconfined =
        |p: Option<&k8s_openapi::api::core::v1::AppArmorProfile>| p.is_some_and(|p| p.type_ == "Unconfined");
    let mut setters = Vec::new();
    if unconfined(ctx.pod_sc().and_then(|s| s.app_armor_profile.as_ref())) {
        setters.push("pod".to_owned());
    }
    let names = ctx.names_where(|c| unconfined(sc(c).and_then(|s| s.app_armor_profile.as_ref())));
    if !names.is_empty() {
        setters.push(containers_phrase(&names));
    }
    if !setters.is_empty() {
        bad.push(format!("{} must not set AppArmor profile type to \"Unconfined\"", setters.join(" and ")));
    }
    if bad.is_empty() {
        return None;
    }
    forbidden(
        pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", bad.len()),
        bad.join(", "),
    )
}

fn capabilities_baseline(ctx: &Ctx) -> Option<Forbidden> {
    let mut caps = BTreeSet::new();
    let names = ctx.names_where(|c| {
        let mut bad = false;
        for cap in sc(c).and_then(|s| s.capabilities.as_ref()?.add.as_ref()).into_iter().flatten() {
            if !BASELINE_CAPABILITIES.contains(&cap.as_str()) {
                caps.insert(cap.clone());
                bad = true;
            }
        }
        bad
    });
    if names.is_empty() {
        return None;
    }
    forbidden(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&names),
            join_quote(caps.iter().map(String::as_str))
        ),
    )
}

fn host_namespaces(ctx: &Ctx) -> Option<Forbidden> {
    let s = ctx.spec;
    let set: Vec<&str> =
        [("hostNetwork=true", s.host_network), ("hostPID=true", s.host_pid), ("hostIPC=true", s.host_ipc)]
            .into_iter()
            .filter(|(_, v)| *v == Some(true))
            .map(|(name, _)| name)
            .collect();
    if set.is_empty() { None } else { forbidden("host namespaces", set.join(", ")) }
}

fn host_path_volumes(ctx: &Ctx) -> Option<Forbidden> {
    let names: Vec<&str> = ctx
        .spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.as_str())
        .collect();
    if names.is_empty() {
        return None;
    }
    forbidden(
        "hostPath volumes",
        format!("{} {}", pluralize("volume", "volumes", names.len()), join_quote(names)),
    )
}

fn host_ports(ctx: &Ctx) -> Option<Forbidden> {
    let mut ports = Vec::new();
    let names = ctx.names_where(|c| {
        let mut bad = false;
        for port in c.ports.iter().flatten() {
            if let Some(p) = port.host_port.filter(|p| *p != 0) {
                ports.push(p.to_string());
                bad = true;
            }
        }
        bad
    });
    if names.is_empty() {
        return None;
    }
    forbidden(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&names),
            pluralize("uses", "use", names.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    )
}

fn privileged(ctx: &Ctx) -> Option<Forbidden> {
    let names = ctx.names_where(|c| sc(c).and_then(|s| s.privileged) == Some(true));
    if names.is_empty() {
        return None;
    }
    forbidden(
        "privileged",
        format!("{} must not set securityContext.privileged=true", containers_phrase(&names)),
    )
}

fn proc_mount(ctx: &Ctx) -> Option<Forbidden> {
    let mut values = BTreeSet::new();
    let names = ctx.names_where(|c| match sc(c).and_then(|s| s.proc_mount.as_deref()) {
        None | Some("" | "Default") => false,
        Some(other) => {
            values.insert(other.to_owned());
            true
        }
    });
    if names.is_empty() {
        return None;
    }
    forbidden(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&names),
            join_quote(values.iter().map(String::as_str))
        ),
    )
}

fn se_linux_options(ctx: &Ctx) -> Option<Forbidden> {
    let mut types = BTreeSet::new();
    let (mut user, mut role) = (false, false);
    let mut inspect = |o: Option<&k8s_openapi::api::core::v1::SELinuxOptions>| {
        let Some(o) = o else { return false };
        let mut bad = false;
        let t = o.type_.as_deref().unwrap_or("");
        if !SELINUX_TYPES.contains(&t) {
            types.insert(t.to_owned());
            bad = true;
        }
        if o.user.as_deref().is_some_and(|u| !u.is_empty()) {
            user = true;
            bad = true;
        }
        if o.role.as_deref().is_some_and(|r| !r.is_empty()) {
            role = true;
            bad = true;
        }
        bad
    };
    let mut setters = Vec::new();
    if inspect(ctx.pod_sc().and_then(|s| s.se_linux_options.as_ref())) {
        setters.push("pod".to_owned());
    }
    let names = ctx.names_where(|c| inspect(sc(c).and_then(|s| s.se_linux_options.as_ref())));
    if !names.is_empty() {
        setters.push(containers_phrase(&names));
    }
    if setters.is_empty() {
        return None;
    }
    let mut data = Vec::new();
    if !types.is_empty() {
        data.push(format!(
            "{} {}",
            pluralize("type", "types", types.len()),
            join_quote(types.iter().map(String::as_str))
        ));
    }
    if user {
        data.push("user may not be set".to_owned());
    }
    if role {
        data.push("role may not be set".to_owned());
    }
    forbidden(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            data.join("; ")
        ),
    )
}

fn seccomp_type_of_pod<'a>(ctx: &'a Ctx<'a>) -> Option<&'a str> {
    ctx.pod_sc().and_then(|s| s.seccomp_profile.as_ref()).map(|p| p.type_.as_str())
}

fn seccomp_type(c: &Container) -> Option<&str> {
    sc(c).and_then(|s| s.seccomp_profile.as_ref()).map(|p| p.type_.as_str())
}

fn seccomp_baseline(ctx: &Ctx) -> Option<Forbidden> {
    let mut setters = Vec::new();
    if seccomp_type_of_pod(ctx) == Some("Unconfined") {
        setters.push("pod".to_owned());
    }
    let names = ctx.names_where(|c| seccomp_type(c) == Some("Unconfined"));
    if !names.is_empty() {
        setters.push(containers_phrase(&names));
    }
    if setters.is_empty() {
        return None;
    }
    forbidden(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
            setters.join(" and ")
        ),
    )
}

fn sysctls(ctx: &Ctx) -> Option<Forbidden> {
    let bad: Vec<&str> = ctx
        .pod_sc()
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| s.name.as_str())
        .filter(|name| !SAFE_SYSCTLS.contains(name))
        .collect();
    if bad.is_empty() { None } else { forbidden("forbidden sysctls", bad.join(", ")) }
}

fn windows_host_process(ctx: &Ctx) -> Option<Forbidden> {
    let mut setters = Vec::new();
    if ctx.pod_sc().and_then(|s| s.windows_options.as_ref()?.host_process) == Some(true) {
        setters.push("pod".to_owned());
    }
    let names =
        ctx.names_where(|c| sc(c).and_then(|s| s.windows_options.as_ref()?.host_process) == Some(true));
    if !names.is_empty() {
        setters.push(containers_phrase(&names));
    }
    if setters.is_empty() {
        return None;
    }
    forbidden(
        "hostProcess",
        format!("{} must not set securityContext.windowsOptions.hostProcess=true", setters.join(" and ")),
    )
}

// ===== restricted =====

fn allow_privilege_escalation(ctx: &Ctx) -> Option<Forbidden> {
    let names = ctx.names_where(|c| sc(c).and_then(|s| s.allow_privilege_escalation) != Some(false));
    if names.is_empty() {
        return None;
    }
    forbidden(
        "allowPrivilegeEscalation != false",
        format!("{} must set securityContext.allowPrivilegeEscalation=false", containers_phrase(&names)),
    )
}

fn capabilities_restricted(ctx: &Ctx) -> Option<Forbidden> {
    let missing_drop = ctx.names_where(|c| {
        !sc(c)
            .and_then(|s| s.capabilities.as_ref()?.drop.as_ref())
            .is_some_and(|d| d.iter().any(|x| x == "ALL"))
    });
    let mut caps = BTreeSet::new();
    let adding = ctx.names_where(|c| {
        let mut bad = false;
        for cap in sc(c).and_then(|s| s.capabilities.as_ref()?.add.as_ref()).into_iter().flatten() {
            if cap != "NET_BIND_SERVICE" {
                caps.insert(cap.clone());
                bad = true;
            }
        }
        bad
    });
    let mut details = Vec::new();
    if !missing_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_phrase(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding),
            join_quote(caps.iter().map(String::as_str))
        ));
    }
    if details.is_empty() { None } else { forbidden("unrestricted capabilities", details.join("; ")) }
}

fn restricted_volumes(ctx: &Ctx) -> Option<Forbidden> {
    let mut names = Vec::new();
    let mut types = BTreeSet::new();
    for v in ctx.spec.volumes.iter().flatten() {
        let allowed = v.config_map.is_some()
            || v.csi.is_some()
            || v.downward_api.is_some()
            || v.empty_dir.is_some()
            || v.ephemeral.is_some()
            || v.persistent_volume_claim.is_some()
            || v.projected.is_some()
            || v.secret.is_some();
        if allowed {
            continue;
        }
        names.push(v.name.as_str());
        types.insert(restricted_volume_type(v));
    }
    if names.is_empty() {
        return None;
    }
    forbidden(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", names.len()),
            join_quote(names.iter().copied()),
            pluralize("uses", "use", names.len()),
            pluralize("restricted volume type", "restricted volume types", types.len()),
            join_quote(types.iter().copied())
        ),
    )
}

fn restricted_volume_type(v: &k8s_openapi::api::core::v1::Volume) -> &'static str {
    let kinds: [(&'static str, bool); 20] = [
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("cinder", v.cinder.is_some()),
        ("fc", v.fc.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("flocker", v.flocker.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("hostPath", v.host_path.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("nfs", v.nfs.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("rbd", v.rbd.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
    ];
    kinds
        .iter()
        .find(|(_, set)| *set)
        .map(|(name, _)| *name)
        .or_else(|| v.vsphere_volume.as_ref().map(|_| "vsphereVolume"))
        .unwrap_or("unknown")
}

fn run_as_non_root(ctx: &Ctx) -> Option<Forbidden> {
    let mut setters = Vec::new();
    let pod_value = ctx.pod_sc().and_then(|s| s.run_as_non_root);
    if pod_value == Some(false) {
        setters.push("pod".to_owned());
    }
    let pod_true = pod_value == Some(true);
    let explicit = ctx.names_where(|c| sc(c).and_then(|s| s.run_as_non_root) == Some(false));
    let implicit = ctx.names_where(|c| sc(c).and_then(|s| s.run_as_non_root).is_none() && !pod_true);
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    let mut details = Vec::new();
    if !setters.is_empty() {
        details.push(format!("{} must not set securityContext.runAsNonRoot=false", setters.join(" and ")));
    }
    if !implicit.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            containers_phrase(&implicit)
        ));
    }
    if details.is_empty() { None } else { forbidden("runAsNonRoot != true", details.join("; ")) }
}

fn run_as_user(ctx: &Ctx) -> Option<Forbidden> {
    let mut setters = Vec::new();
    if ctx.pod_sc().and_then(|s| s.run_as_user) == Some(0) {
        setters.push("pod".to_owned());
    }
    let names = ctx.names_where(|c| sc(c).and_then(|s| s.run_as_user) == Some(0));
    if !names.is_empty() {
        setters.push(containers_phrase(&names));
    }
    if setters.is_empty() {
        return None;
    }
    forbidden("runAsUser=0", format!("{} must not set runAsUser=0", setters.join(" and ")))
}

fn seccomp_restricted(ctx: &Ctx) -> Option<Forbidden> {
    let valid = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let mut setters = Vec::new();
    let mut values = BTreeSet::new();
    let pod_type = seccomp_type_of_pod(ctx);
    let pod_set = pod_type.is_some_and(valid);
    if let Some(t) = pod_type.filter(|t| !valid(t)) {
        setters.push("pod".to_owned());
        values.insert(t.to_owned());
    }
    let explicit = ctx.names_where(|c| match seccomp_type(c) {
        Some(t) if !valid(t) => {
            values.insert(t.to_owned());
            true
        }
        _ => false,
    });
    let implicit = ctx.names_where(|c| seccomp_type(c).is_none() && !pod_set);
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    let mut details = Vec::new();
    if !setters.is_empty() {
        details.push(format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters.join(" and "),
            join_quote(values.iter().map(String::as_str))
        ));
    }
    if !implicit.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            containers_phrase(&implicit)
        ));
    }
    if details.is_empty() { None } else { forbidden("seccompProfile", details.join("; ")) }
}

#[cfg(test)]
mod tests;
