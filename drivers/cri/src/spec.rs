//! The pod → CRI mapping: `PodSandboxConfig` and `ContainerConfig` from a validated, defaulted pod, as the
//! kubelet's `generatePodSandboxConfig` and `generateContainerConfig` build them
//! (`pkg/kubelet/kuberuntime/kuberuntime_sandbox.go`, `kuberuntime_container.go`, `helpers_linux.go`).
//!
//! Everything here is pure: file and runtime access happen in [`crate::pod_runtime`].

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1;
use k8s_openapi::api::core::v1::{Container, EnvVarSource, SeccompProfile};
use nodelet_resources::model::cgroup::CgroupResources;
use nodelet_resources::model::pod::DesiredPod;
use nodelet_resources::model::qos::{QosClass, qos_class};
use nodelet_resources::model::volumes::PodVolumes;
use nodelet_resources::pod::driver::{ContainerKind, container_hash};
use nodelet_resources::pod::resize::container_hash_without_resources;
use nodelet_resources::pod::security::APPARMOR_ANNOTATION_PREFIX;

use crate::labels::{self, PodIdentity};
use crate::pod_runtime::CriPodRuntimeConfig;
use nodelet_resources::quantity::Quantity;

/// Why a pod or container could not be mapped to a CRI config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpecError {
    /// The pod's sandbox config cannot be built (`CreatePodSandboxError`).
    #[error("{0}")]
    Sandbox(String),
    /// A container's config cannot be built (`CreateContainerConfigError`).
    #[error("{0}")]
    Container(String),
}

impl SpecError {
    /// The kubelet's waiting reason for this error.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            SpecError::Sandbox(_) => "CreatePodSandboxError",
            SpecError::Container(_) => "CreateContainerConfigError",
        }
    }
}

/// Why a pod's or container's seccomp or AppArmor profile cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProfileError {
    /// A seccomp `Localhost` profile whose path is empty, absolute or climbs out of the seccomp root.
    #[error("{field}.localhostProfile: {path:?} must be a relative path without `..` under the seccomp root")]
    SeccompPath {
        /// The `seccompProfile` field.
        field: String,
        /// The path as given.
        path: String,
    },
    /// An unknown seccomp profile type.
    #[error("{field}.type: unsupported seccomp profile type {kind:?}")]
    SeccompType {
        /// The `seccompProfile` field.
        field: String,
        /// The type as given.
        kind: String,
    },
    /// An AppArmor `Localhost` profile without a name.
    #[error("appArmorProfile.localhostProfile: Required value for type Localhost")]
    AppArmorLocalhostName,
    /// An unknown AppArmor profile type.
    #[error("appArmorProfile.type: unsupported AppArmor profile type {0:?}")]
    AppArmorType(String),
    /// A malformed AppArmor annotation.
    #[error(
        "annotation {key}: invalid AppArmor profile {value:?} (use runtime/default, localhost/<profile> \
                         or unconfined)"
    )]
    AppArmorAnnotation {
        /// The annotation's key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A confining AppArmor profile on a node without AppArmor.
    #[error("Cannot enforce AppArmor: AppArmor is not enabled on the host")]
    AppArmorDisabled,
}

/// Why a `fieldRef` of an environment variable has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FieldRefError {
    /// `spec.nodeName` is unset and the node's name is not configured.
    #[error("the node name is not known")]
    NodeName,
    /// `status.hostIP(s)` and the node's addresses are not configured.
    #[error("the node IP is not known")]
    NodeIp,
    /// A field path the kubelet does not support.
    #[error("unsupported field path {0:?}")]
    Unsupported(String),
}

/// Annotation on sandboxes: where the pod came from (`file`, `http`, `api`).
const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// Annotation on sandboxes: the pod's config hash (nodelet: its UID, like the kubelet's static pods).
const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// `oom_score_adj` of Guaranteed pods' containers.
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// `oom_score_adj` of BestEffort pods' containers.
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// Longest hostname (a DNS label).
const MAX_HOSTNAME_LEN: usize = 63;
/// Longest FQDN used as hostname (`setHostnameAsFQDN`).
const MAX_FQDN_HOSTNAME_LEN: usize = 64;
/// `terminationMessagePath` default.
const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// `terminationMessagePolicy` default.
const DEFAULT_TERMINATION_MESSAGE_POLICY: &str = "File";

/// Whether `s` can be one path segment: non-empty, no `/` or NUL, not `.` or `..`.
pub(crate) fn is_path_segment(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// Whether `uid` is safe in paths, cgroup names and label filters: `[A-Za-z0-9._-]`, at most 128 bytes.
pub(crate) fn is_safe_uid(uid: &str) -> bool {
    is_path_segment(uid)
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The pod's name, namespace and UID, checked to be safe in paths (the sandbox's log directory) and names.
pub(crate) fn pod_identity(pod: &DesiredPod) -> Result<PodIdentity, SpecError> {
    let (name, namespace, uid) = (pod.name(), pod.namespace(), pod.uid());
    if !is_path_segment(name) || !is_path_segment(namespace) {
        return Err(SpecError::Sandbox(format!(
            "pod name {name:?} or namespace {namespace:?} is empty or not usable in a path"
        )));
    }
    if !is_safe_uid(uid) {
        return Err(SpecError::Sandbox(format!(
            "pod {namespace}/{name}: UID {uid:?} is empty or has characters other than [A-Za-z0-9._-]"
        )));
    }
    Ok(PodIdentity::new(name, namespace, uid))
}

/// `<log root>/<namespace>_<name>_<uid>` (the kubelet's `BuildPodLogsDirectory`).
pub(crate) fn pod_log_dir(root: &Path, pod: &PodIdentity) -> PathBuf {
    root.join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
}

/// `/<root>/pod<uid>` (absolute, whether or not `root` starts with `/`), or empty (the runtime chooses)
/// without a root.
pub(crate) fn cgroup_parent(root: Option<&str>, uid: &str) -> String {
    match root.map(|r| r.trim_matches('/')) {
        Some("") => format!("/pod{uid}"),
        Some(root) => format!("/{root}/pod{uid}"),
        None => String::new(),
    }
}

/// The JSON path of a container in the pod spec: `spec.containers[i]`, `spec.initContainers[i]`
/// or `spec.ephemeralContainers[i]`.
pub(crate) fn container_field_path(pod: &DesiredPod, container: &str, kind: ContainerKind) -> String {
    let (position, field) = match kind {
        ContainerKind::Init => {
            (pod.init_containers().iter().position(|c| c.name == container), "spec.initContainers")
        }
        ContainerKind::App => (pod.containers().iter().position(|c| c.name == container), "spec.containers"),
        ContainerKind::Ephemeral => {
            (pod.ephemeral_specs().iter().position(|c| c.name == container), "spec.ephemeralContainers")
        }
    };
    match position {
        Some(i) => format!("{field}[{i}]"),
        None => format!("{field}[name={container:?}]"),
    }
}

fn is_privileged(container: &Container) -> bool {
    container.security_context.as_ref().and_then(|sc| sc.privileged).unwrap_or(false)
}

/// Refuses a privileged container unless the node allows them.
pub(crate) fn check_privileged(
    pod: &DesiredPod,
    container: &Container,
    kind: ContainerKind,
    config: &CriPodRuntimeConfig,
) -> Result<(), SpecError> {
    if is_privileged(container) && !config.allow_privileged {
        let path = container_field_path(pod, &container.name, kind);
        return Err(SpecError::Container(format!(
            "container {:?}: {path}.securityContext.privileged: privileged containers are not allowed on this \
             node (allow_privileged is off)",
            container.name
        )));
    }
    Ok(())
}

/// The pod's hostname and host domain (the kubelet's `GeneratePodHostNameAndDomain`): `spec.hostname`
/// or the pod's name, cut to 63 characters (without trailing `-` or `.`), and with a `subdomain`
/// `<subdomain>.<namespace>.svc.<cluster domain>`, else empty. A `hostnameOverride` is the hostname
/// as written, without a domain.
pub(crate) fn host_name_and_domain(
    pod: &DesiredPod,
    config: &CriPodRuntimeConfig,
) -> Result<(String, String), SpecError> {
    let spec = pod.spec();
    if let Some(name) = spec.hostname_override.as_deref().filter(|h| !h.is_empty()) {
        return Ok((name.to_owned(), String::new()));
    }
    let mut host = spec.hostname.as_deref().filter(|h| !h.is_empty()).unwrap_or(pod.name()).to_owned();
    if host.len() > MAX_HOSTNAME_LEN {
        let mut cut = MAX_HOSTNAME_LEN;
        while !host.is_char_boundary(cut) {
            cut -= 1;
        }
        host.truncate(cut);
        let trimmed = host.trim_end_matches(['-', '.']).len();
        host.truncate(trimmed);
        if host.is_empty() {
            return Err(SpecError::Sandbox(format!(
                "hostname for pod {:?} is empty after truncation",
                pod.name()
            )));
        }
    }
    let domain = match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        Some(subdomain) => format!("{subdomain}.{}.svc.{}", pod.namespace(), config.cluster_domain),
        None => String::new(),
    };
    Ok((host, domain))
}

fn hostname(pod: &DesiredPod, config: &CriPodRuntimeConfig) -> Result<String, SpecError> {
    let spec = pod.spec();
    if pod.host_network() {
        // The sandbox shares the node's UTS namespace; runc refuses a hostname without one of its own.
        return Ok(String::new());
    }
    if let Some(name) = spec.hostname_override.as_deref().filter(|h| !h.is_empty()) {
        return Ok(name.to_owned());
    }
    let (host, _) = host_name_and_domain(pod, config)?;
    let subdomain = spec.subdomain.as_deref().unwrap_or_default();
    if spec.set_hostname_as_fqdn == Some(true) && !subdomain.is_empty() {
        let mut fqdn = format!("{host}.{subdomain}.{}.svc", pod.namespace());
        if !config.cluster_domain.is_empty() {
            fqdn = format!("{fqdn}.{}", config.cluster_domain);
        }
        if fqdn.len() > MAX_FQDN_HOSTNAME_LEN {
            return Err(SpecError::Sandbox(format!(
                "spec.setHostnameAsFQDN: the FQDN {fqdn:?} is longer than {MAX_FQDN_HOSTNAME_LEN} characters"
            )));
        }
        return Ok(fqdn);
    }
    Ok(host)
}

/// A port protocol other than TCP, UDP and SCTP (the value as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported value {0:?}")]
struct UnsupportedProtocol(String);

fn protocol(p: Option<&str>) -> Result<v1::Protocol, UnsupportedProtocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(v1::Protocol::Tcp),
        "UDP" => Ok(v1::Protocol::Udp),
        "SCTP" => Ok(v1::Protocol::Sctp),
        other => Err(UnsupportedProtocol(other.to_owned())),
    }
}

/// The sandbox's port mappings: every `hostPort` of the app containers, without duplicates.
fn port_mappings(pod: &DesiredPod) -> Result<Vec<v1::PortMapping>, SpecError> {
    let mut mappings: Vec<v1::PortMapping> = Vec::new();
    for (i, c) in pod.containers().iter().enumerate() {
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let host_port = p.host_port.unwrap_or(0);
            if host_port == 0 {
                continue;
            }
            let path = format!("spec.containers[{i}].ports[{j}]");
            if !(1..=65535).contains(&host_port) || !(1..=65535).contains(&p.container_port) {
                return Err(SpecError::Sandbox(format!("{path}: port out of range")));
            }
            let protocol = protocol(p.protocol.as_deref())
                .map_err(|unsupported| SpecError::Sandbox(format!("{path}.protocol: {unsupported}")))?;
            let host_ip = p.host_ip.clone().unwrap_or_default();
            if !host_ip.is_empty() && host_ip.parse::<std::net::IpAddr>().is_err() {
                return Err(SpecError::Sandbox(format!("{path}.hostIP: {host_ip:?} is not an IP address")));
            }
            let mapping = v1::PortMapping {
                protocol: protocol as i32,
                container_port: p.container_port,
                host_port,
                host_ip,
            };
            if !mappings.contains(&mapping) {
                mappings.push(mapping);
            }
        }
    }
    Ok(mappings)
}

/// The pod's namespaces; `userns` is its own user namespace (`hostUsers: false`, see [`crate::userns`]),
/// `None` for the host's users (no `userns_options`, as the kubelet without `UserNamespacesSupport`).
fn namespace_options(pod: &DesiredPod, userns: Option<&v1::UserNamespace>) -> v1::NamespaceOption {
    let spec = pod.spec();
    let mode = |host: bool, otherwise: v1::NamespaceMode| {
        if host { v1::NamespaceMode::Node as i32 } else { otherwise as i32 }
    };
    let pid_otherwise = if spec.share_process_namespace == Some(true) {
        v1::NamespaceMode::Pod
    } else {
        v1::NamespaceMode::Container
    };
    v1::NamespaceOption {
        network: mode(pod.host_network(), v1::NamespaceMode::Pod),
        pid: mode(spec.host_pid == Some(true), pid_otherwise),
        ipc: mode(spec.host_ipc == Some(true), v1::NamespaceMode::Pod),
        userns_options: userns.cloned(),
        ..Default::default()
    }
}

/// A container's namespaces: the pod's, except that a debug container with a target joins the
/// target container's process namespace (the kubelet's `NamespaceMode_TARGET`).
fn container_namespace_options(
    pod: &DesiredPod,
    pid_target: Option<&str>,
    userns: Option<&v1::UserNamespace>,
) -> v1::NamespaceOption {
    let options = namespace_options(pod, userns);
    match pid_target {
        Some(target) if options.pid == v1::NamespaceMode::Container as i32 => v1::NamespaceOption {
            pid: v1::NamespaceMode::Target as i32,
            target_id: target.to_owned(),
            ..options
        },
        _ => options,
    }
}

/// The pod's seccomp profile (or a container's, which takes precedence). Unset means `Unconfined`, the
/// kubelet's default, or `RuntimeDefault` with `seccompDefault` on.
fn seccomp(
    profile: Option<&SeccompProfile>,
    config: &CriPodRuntimeConfig,
    field: &str,
) -> Result<v1::SecurityProfile, ProfileError> {
    use v1::security_profile::ProfileType;
    let root = &config.seccomp_profile_root;
    let Some(profile) = profile else {
        let default =
            if config.seccomp_default { ProfileType::RuntimeDefault } else { ProfileType::Unconfined };
        return Ok(v1::SecurityProfile { profile_type: default as i32, ..Default::default() });
    };
    match profile.type_.as_str() {
        "RuntimeDefault" => {
            Ok(v1::SecurityProfile { profile_type: ProfileType::RuntimeDefault as i32, ..Default::default() })
        }
        "Unconfined" => {
            Ok(v1::SecurityProfile { profile_type: ProfileType::Unconfined as i32, ..Default::default() })
        }
        "Localhost" => {
            let rel = profile.localhost_profile.as_deref().unwrap_or_default();
            let rel_path = Path::new(rel);
            if rel.is_empty() || !rel_path.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(ProfileError::SeccompPath { field: field.to_owned(), path: rel.to_owned() });
            }
            Ok(v1::SecurityProfile {
                profile_type: ProfileType::Localhost as i32,
                localhost_ref: root.join(rel_path).to_string_lossy().into_owned(),
            })
        }
        other => Err(ProfileError::SeccompType { field: field.to_owned(), kind: other.to_owned() }),
    }
}

fn supplemental_groups(pod: &DesiredPod) -> Vec<i64> {
    let sc = pod.spec().security_context.as_ref();
    let mut groups: Vec<i64> = sc.and_then(|s| s.supplemental_groups.clone()).unwrap_or_default();
    if let Some(fs_group) = sc.and_then(|s| s.fs_group)
        && !groups.contains(&fs_group)
    {
        groups.push(fs_group);
    }
    groups
}

/// The CRI sandbox config of `pod`'s sandbox number `attempt`. `dns` is the DNS config computed from the
/// node's resolv.conf (see [`crate::dns`]); it matters only when the sandbox is created. `userns` is the
/// pod's user namespace (`hostUsers: false`), `None` for the host's users.
pub(crate) fn sandbox_config(
    pod: &DesiredPod,
    attempt: u32,
    config: &CriPodRuntimeConfig,
    dns: Option<v1::DnsConfig>,
    userns: Option<&v1::UserNamespace>,
) -> Result<v1::PodSandboxConfig, SpecError> {
    let identity = pod_identity(pod)?;
    let spec = pod.spec();

    let mut sandbox_labels: HashMap<String, String> =
        pod.pod.metadata.labels.clone().unwrap_or_default().into_iter().collect();
    sandbox_labels.extend(labels::sandbox_labels(&identity));
    if !config.node_name.is_empty() {
        sandbox_labels.insert(labels::NODE.to_owned(), config.node_name.clone());
    }

    let mut annotations: HashMap<String, String> =
        pod.pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect();
    annotations.entry(CONFIG_SOURCE.to_owned()).or_insert_with(|| pod.source.annotation().to_owned());
    annotations.entry(CONFIG_HASH.to_owned()).or_insert_with(|| identity.uid.clone());
    // For tearing the pod down with its grace period after a restart, even before it has containers.
    annotations
        .insert(labels::POD_TERMINATION_GRACE_PERIOD.to_owned(), pod.grace_period().as_secs().to_string());

    let sysctls: HashMap<String, String> = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_ref())
        // In the dotted form (`kernel/shm_rmid_forced` is `kernel.shm_rmid_forced`), as the kubelet passes them.
        .map(|s| {
            s.iter().map(|s| (nodelet_resources::common::sysctl::to_dots(&s.name), s.value.clone())).collect()
        })
        .unwrap_or_default();

    let pod_sc = spec.security_context.as_ref();
    let privileged =
        config.allow_privileged && pod.init_containers().iter().chain(pod.containers()).any(is_privileged);
    let seccomp = seccomp(
        pod_sc.and_then(|sc| sc.seccomp_profile.as_ref()),
        config,
        "spec.securityContext.seccompProfile",
    )
    .map_err(|e| SpecError::Sandbox(e.to_string()))?;
    let security_context = v1::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod, userns)),
        run_as_user: pod_sc.and_then(|sc| sc.run_as_user).map(|value| v1::Int64Value { value }),
        run_as_group: pod_sc.and_then(|sc| sc.run_as_group).map(|value| v1::Int64Value { value }),
        supplemental_groups: supplemental_groups(pod),
        privileged,
        seccomp: Some(seccomp),
        ..Default::default()
    };

    Ok(v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: identity.name.clone(),
            uid: identity.uid.clone(),
            namespace: identity.namespace.clone(),
            attempt,
        }),
        hostname: hostname(pod, config)?,
        log_directory: pod_log_dir(&config.pod_log_root, &identity).to_string_lossy().into_owned(),
        dns_config: dns,
        port_mappings: port_mappings(pod)?,
        labels: sandbox_labels,
        annotations,
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(config.cgroup_root.as_deref(), &identity.uid),
            security_context: Some(security_context),
            sysctls,
            ..Default::default()
        }),
        ..Default::default()
    })
}

// ------------------------------------------------------------------------------------------- containers

/// What [`container_config`] needs besides the pod and the container.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContainerInputs<'a> {
    /// Init or app container.
    pub(crate) kind: ContainerKind,
    /// Restart count, the CRI attempt number.
    pub(crate) restart_count: u32,
    /// The restart count this spec of the container first ran at ([`labels::CONTAINER_BACKOFF_SINCE`]).
    pub(crate) backoff_since: u32,
    /// The image as the runtime has it (its ID is what the container is created from).
    pub(crate) image: &'a v1::Image,
    /// The pod's IPs (empty when not known), for `status.podIP(s)`.
    pub(crate) pod_ips: &'a [String],
    /// The pod's volumes, set up.
    pub(crate) volumes: &'a PodVolumes,
    /// The container's mounts ([`container_mounts`]).
    pub(crate) mounts: &'a [v1::Mount],
    /// For an ephemeral container with a `targetContainerName`: the runtime ID of that container,
    /// whose process namespace it joins (`NamespaceMode::Target`).
    pub(crate) pid_target: Option<&'a str>,
    /// The pod's user namespace (`hostUsers: false`), the same as its sandbox's; `None`: the host's users.
    pub(crate) userns: Option<&'a v1::UserNamespace>,
}

/// Kubernetes' `$(VAR)` expansion (`third_party/forked/golang/expansion`): `$(NAME)` becomes the value of
/// `NAME` when `lookup` knows it and stays as written otherwise; `$$` is a literal `$`; any other `$` is kept.
pub(crate) fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    nodelet_host::subpath::expand_vars(input, |name| lookup(name).unwrap_or_else(|| format!("$({name})")))
}

/// An ordered environment: a later variable of the same name replaces the earlier value in place.
#[derive(Debug, Default)]
struct Env(Vec<(String, String)>);

impl Env {
    fn set(&mut self, name: &str, value: String) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }
    fn get(&self, name: &str) -> Option<String> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }
}

fn quantity_of(
    container: &Container,
    which: &str,
    resource: &str,
    path: &str,
) -> Result<Option<Quantity>, SpecError> {
    let resources = container.resources.as_ref();
    let map = match which {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        _ => resources.and_then(|r| r.requests.as_ref()),
    };
    match map.and_then(|m| m.get(resource)) {
        None => Ok(None),
        Some(q) => Quantity::parse(&q.0).map(Some).ok_or_else(|| {
            SpecError::Container(format!("{path}.resources.{which}.{resource}: invalid quantity {:?}", q.0))
        }),
    }
}

fn field_ref_value(
    pod: &DesiredPod,
    field_path: &str,
    inputs: &ContainerInputs<'_>,
    config: &CriPodRuntimeConfig,
) -> Result<String, FieldRefError> {
    let meta = &pod.pod.metadata;
    let spec = pod.spec();
    let subscript = |prefix: &str| {
        field_path
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_owned)
    };
    let pod_ips: Vec<String> =
        if pod.host_network() { config.node_ips.clone() } else { inputs.pod_ips.to_vec() };
    match field_path {
        "metadata.name" => Ok(pod.name().to_owned()),
        "metadata.namespace" => Ok(pod.namespace().to_owned()),
        "metadata.uid" => Ok(pod.uid().to_owned()),
        "spec.nodeName" => match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => Ok(n.to_owned()),
            None if !config.node_name.is_empty() => Ok(config.node_name.clone()),
            None => Err(FieldRefError::NodeName),
        },
        "spec.serviceAccountName" => Ok(spec.service_account_name.clone().unwrap_or_default()),
        "status.podIP" => Ok(pod_ips.first().cloned().unwrap_or_default()),
        "status.podIPs" => Ok(pod_ips.join(",")),
        "status.hostIP" => config.node_ips.first().cloned().ok_or(FieldRefError::NodeIp),
        "status.hostIPs" if !config.node_ips.is_empty() => Ok(config.node_ips.join(",")),
        "status.hostIPs" => Err(FieldRefError::NodeIp),
        _ => {
            if let Some(key) = subscript("metadata.labels") {
                Ok(meta.labels.as_ref().and_then(|l| l.get(&key)).cloned().unwrap_or_default())
            } else if let Some(key) = subscript("metadata.annotations") {
                Ok(meta.annotations.as_ref().and_then(|a| a.get(&key)).cloned().unwrap_or_default())
            } else {
                Err(FieldRefError::Unsupported(field_path.to_owned()))
            }
        }
    }
}

/// The value of a `resourceFieldRef`, as the kubelet's `ExtractContainerResourceValue`
/// (`pkg/api/v1/resource/helpers.go`) computes it: an absent or zero `divisor` is 1; a limit that is unset or
/// zero reads as the node's allocatable amount (`defaultPodLimitsForDownwardAPI`, for `cpu`, `memory` and
/// `ephemeral-storage`); an unset request reads 0; the quotient is rounded up (CPU in millicores over the
/// divisor's millicores, the rest in whole units over the divisor's whole units).
fn resource_field_value(
    pod: &DesiredPod,
    this: &Container,
    selector: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    config: &CriPodRuntimeConfig,
    path: &str,
) -> Result<String, SpecError> {
    let err = |what: String| SpecError::Container(format!("{path}.valueFrom.resourceFieldRef: {what}"));
    let container = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        None => this,
        Some(name) => pod
            .init_containers()
            .iter()
            .chain(pod.containers())
            .find(|c| c.name == name)
            .ok_or_else(|| err(format!("no container named {name:?}")))?,
    };
    let divisor = match &selector.divisor {
        Some(d) => Quantity::parse(&d.0).ok_or_else(|| err(format!("invalid divisor {:?}", d.0)))?,
        None => Quantity::ONE,
    };
    let divisor = if divisor.is_zero() { Quantity::ONE } else { divisor };
    let (which, resource) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| err(format!("unsupported resource {:?}", selector.resource)))?;
    let known =
        matches!(resource, "cpu" | "memory" | "ephemeral-storage") || resource.starts_with("hugepages-");
    if !matches!(which, "limits" | "requests") || !known {
        return Err(err(format!("unsupported resource {:?}", selector.resource)));
    }
    let scale = if resource == "cpu" { 1000 } else { 1 };
    let value = quantity_of(container, which, resource, path)?.filter(|q| !q.is_zero());
    let value = match value {
        Some(q) => q.scaled_ceil(scale),
        None if which == "limits" && !resource.starts_with("hugepages-") => {
            node_allocatable(config, resource, scale)
        }
        None => 0,
    };
    let divisor = divisor.scaled_ceil(scale);
    if divisor <= 0 {
        return Err(err("divisor must be positive".into()));
    }
    // Rounded up, like the kubelet's math.Ceil.
    let out = value.div_euclid(divisor) + i64::from(value.rem_euclid(divisor) != 0);
    Ok(out.to_string())
}

/// The node's allocatable `resource` in units of `1/scale` (millicores for `cpu` with scale 1000): from
/// [`CriPodRuntimeConfig::allocatable`], else the machine's CPUs or memory capacity, else 0.
fn node_allocatable(config: &CriPodRuntimeConfig, resource: &str, scale: i64) -> i64 {
    if let Some(q) = config.allocatable.get(resource) {
        return q.scaled_ceil(scale).max(0);
    }
    match resource {
        "cpu" => {
            let node_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            i64::try_from(node_cpus).unwrap_or(1).saturating_mul(scale)
        }
        "memory" => config.memory_capacity_bytes.map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        _ => 0,
    }
}

/// The container's environment, in order: `env` entries with `$(VAR)` references to earlier ones expanded
/// and `valueFrom` resolved where nodelet can know the value.
fn container_env(
    pod: &DesiredPod,
    container: &Container,
    path: &str,
    inputs: &ContainerInputs<'_>,
    config: &CriPodRuntimeConfig,
) -> Result<Env, SpecError> {
    let mut env = Env::default();
    let namespace = pod.namespace();
    // Service variables: the lowest precedence, and what `$(VAR)` falls back to.
    let services = crate::service_env::service_env(
        config.services.0.as_deref(),
        namespace,
        pod.spec().enable_service_links.unwrap_or(true),
        !matches!(pod.source, nodelet_resources::model::pod::PodSource::Api),
    )
    .map_err(|why| SpecError::Container(format!("container {:?}: {why}", container.name)))?;
    for (i, from) in container.env_from.iter().flatten().enumerate() {
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(c), _) => ("configMapRef", c.name.as_str(), c.optional),
            (None, Some(s)) => ("secretRef", s.name.as_str(), s.optional),
            (None, None) => continue,
        };
        let field = format!("{path}.envFrom[{i}].{kind}");
        let Some(data) = object_data(config, pod, kind == "configMapRef", name) else {
            if optional == Some(true) {
                continue;
            }
            return Err(SpecError::Container(format!(
                "container {:?}: {field}: {} {name:?} not found",
                container.name,
                if kind == "configMapRef" { "configmap" } else { "secret" },
            )));
        };
        let prefix = from.prefix.as_deref().unwrap_or_default();
        for (key, value) in data {
            // Keys that are no valid variable names are skipped, as the kubelet does.
            let var = format!("{prefix}{key}");
            if !var.is_empty()
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
                && !var.starts_with(|c: char| c.is_ascii_digit())
            {
                env.set(&var, value);
            }
        }
    }
    for (i, var) in container.env.iter().flatten().enumerate() {
        let var_path = format!("{path}.env[{i}]");
        let value = match (var.value.as_deref().filter(|v| !v.is_empty()), &var.value_from) {
            (Some(v), _) => expand(v, |name| env.get(name).or_else(|| services.get(name).cloned())),
            (None, None) => String::new(),
            (None, Some(from)) => match env_var_source(pod, container, from, &var_path, inputs, config)? {
                Some(v) => v,
                None => continue,
            },
        };
        env.set(&var.name, value);
    }
    for (name, value) in services {
        if env.get(&name).is_none() {
            env.set(&name, value);
        }
    }
    Ok(env)
}

/// The value of a `valueFrom`; `None` to leave the variable out (an optional reference).
fn env_var_source(
    pod: &DesiredPod,
    container: &Container,
    from: &EnvVarSource,
    var_path: &str,
    inputs: &ContainerInputs<'_>,
    config: &CriPodRuntimeConfig,
) -> Result<Option<String>, SpecError> {
    let name = &container.name;
    if let Some(field) = &from.field_ref {
        if field.api_version.as_deref().is_some_and(|v| v != "v1") {
            return Err(SpecError::Container(format!(
                "container {name:?}: {var_path}.valueFrom.fieldRef.apiVersion: unsupported {:?}",
                field.api_version
            )));
        }
        return field_ref_value(pod, &field.field_path, inputs, config).map(Some).map_err(|why| {
            SpecError::Container(format!(
                "container {name:?}: {var_path}.valueFrom.fieldRef.fieldPath: {why}"
            ))
        });
    }
    if let Some(resource) = &from.resource_field_ref {
        return resource_field_value(pod, container, resource, config, var_path).map(Some);
    }
    let (kind, object, key, optional) = match (&from.config_map_key_ref, &from.secret_key_ref) {
        (Some(c), _) => ("configMapKeyRef", c.name.as_str(), c.key.as_str(), c.optional),
        (None, Some(s)) => ("secretKeyRef", s.name.as_str(), s.key.as_str(), s.optional),
        (None, None) if from.file_key_ref.is_some() => {
            return Err(SpecError::Container(format!(
                "container {name:?}: {var_path}.valueFrom.fileKeyRef: not supported by nodelet"
            )));
        }
        (None, None) => return Ok(Some(String::new())),
    };
    let is_config_map = kind == "configMapKeyRef";
    let what = if is_config_map { "configmap" } else { "secret" };
    match object_data(config, pod, is_config_map, object) {
        Some(data) => match data.into_iter().find(|(k, _)| k == key) {
            Some((_, value)) => Ok(Some(value)),
            None if optional == Some(true) => Ok(None),
            None => Err(SpecError::Container(format!(
                "container {name:?}: {var_path}.valueFrom.{kind}: couldn't find key {key} in {what} {}/{object}",
                pod.namespace()
            ))),
        },
        None if optional == Some(true) => Ok(None),
        None if config.objects.for_pod(pod).is_none() => Err(SpecError::Container(format!(
            "container {name:?}: {var_path}.valueFrom.{kind}: not supported by nodelet without an API server"
        ))),
        None => Err(SpecError::Container(format!(
            "container {name:?}: {var_path}.valueFrom.{kind}: {what} {:?} not found",
            object
        ))),
    }
}

/// The data of the ConfigMap (or Secret) `name` in `pod`'s namespace, from the objects of `pod`'s kind (an
/// API pod's from the API server, a static pod's from the manifest directory), as strings (a Secret's bytes
/// decoded as UTF-8, lossily; a ConfigMap's `binaryData` is not used for variables), sorted by key; `None`
/// when there is no such object or no lookup.
fn object_data(
    config: &CriPodRuntimeConfig,
    pod: &DesiredPod,
    config_map: bool,
    name: &str,
) -> Option<Vec<(String, String)>> {
    let namespace = pod.namespace();
    let lookup = config.objects.for_pod(pod)?;
    if config_map {
        let cm = lookup.config_map(namespace, name)?;
        Some(cm.data.unwrap_or_default().into_iter().collect())
    } else {
        let secret = lookup.secret(namespace, name)?;
        let mut data: std::collections::BTreeMap<String, String> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        data.extend(secret.string_data.unwrap_or_default());
        Some(data.into_iter().collect())
    }
}

/// cgroup settings from the container's requests and limits (`generateLinuxContainerResources`, cgroup v1
/// and v2 alike through CRI).
fn linux_resources(
    pod: &DesiredPod,
    container: &Container,
    path: &str,
    config: &CriPodRuntimeConfig,
) -> Result<v1::LinuxContainerResources, SpecError> {
    let cpu_request = quantity_of(container, "requests", "cpu", path)?;
    let cpu_limit = quantity_of(container, "limits", "cpu", path)?;
    let memory_request = quantity_of(container, "requests", "memory", path)?;
    let memory_limit = quantity_of(container, "limits", "memory", path)?;

    let cgroup = CgroupResources::from_quantities(cpu_request, cpu_limit, memory_limit);

    let oom_score_adj = match qos_class(pod) {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let request = memory_request.map_or(0, |q| q.scaled_ceil(1).max(0));
            let capacity = config.memory_capacity_bytes.and_then(|c| i64::try_from(c).ok()).unwrap_or(0);
            let adj = if capacity > 0 {
                1000 - i64::try_from(i128::from(request) * 1000 / i128::from(capacity)).unwrap_or(1000)
            } else {
                BEST_EFFORT_OOM_SCORE_ADJ - 1
            };
            if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
                1000 + GUARANTEED_OOM_SCORE_ADJ
            } else if adj >= BEST_EFFORT_OOM_SCORE_ADJ {
                BEST_EFFORT_OOM_SCORE_ADJ - 1
            } else {
                adj
            }
        }
    };
    Ok(v1::LinuxContainerResources {
        cpu_period: cgroup.cpu_period,
        cpu_quota: cgroup.cpu_quota,
        cpu_shares: cgroup.cpu_shares,
        memory_limit_in_bytes: cgroup.memory_limit,
        oom_score_adj,
        ..Default::default()
    })
}

fn container_security_context(
    pod: &DesiredPod,
    container: &Container,
    path: &str,
    config: &CriPodRuntimeConfig,
    pid_target: Option<&str>,
    userns: Option<&v1::UserNamespace>,
) -> Result<v1::LinuxContainerSecurityContext, SpecError> {
    let sc = container.security_context.as_ref();
    let pod_sc = pod.spec().security_context.as_ref();
    let privileged = is_privileged(container);
    let capabilities = sc.and_then(|s| s.capabilities.as_ref()).map(|caps| v1::Capability {
        add_capabilities: caps.add.clone().unwrap_or_default(),
        drop_capabilities: caps.drop.clone().unwrap_or_default(),
        ..Default::default()
    });
    let (profile, field) = match sc.and_then(|s| s.seccomp_profile.as_ref()) {
        Some(p) => (Some(p), format!("{path}.securityContext.seccompProfile")),
        None => (
            pod_sc.and_then(|s| s.seccomp_profile.as_ref()),
            "spec.securityContext.seccompProfile".to_owned(),
        ),
    };
    let seccomp = seccomp(profile, config, &field)
        .map_err(|why| SpecError::Container(format!("container {:?}: {why}", container.name)))?;
    let apparmor = apparmor(pod, container, config)
        .map_err(|why| SpecError::Container(format!("container {:?}: {why}", container.name)))?;
    Ok(v1::LinuxContainerSecurityContext {
        capabilities,
        privileged,
        namespace_options: Some(container_namespace_options(pod, pid_target, userns)),
        run_as_user: sc
            .and_then(|s| s.run_as_user)
            .or(pod_sc.and_then(|s| s.run_as_user))
            .map(|value| v1::Int64Value { value }),
        run_as_group: sc
            .and_then(|s| s.run_as_group)
            .or(pod_sc.and_then(|s| s.run_as_group))
            .map(|value| v1::Int64Value { value }),
        readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
        supplemental_groups: supplemental_groups(pod),
        no_new_privs: !privileged && sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: Some(seccomp),
        apparmor,
        ..Default::default()
    })
}

/// The container's AppArmor profile: its `securityContext.appArmorProfile`, else the pod's, else the
/// `container.apparmor.security.beta.kubernetes.io/<name>` annotation (`runtime/default`, `localhost/<profile>`,
/// `unconfined`). `None` when nothing is set (the runtime's default). A profile other than unconfined on a node
/// without AppArmor is refused, as the kubelet refuses it, rather than silently not applied.
fn apparmor(
    pod: &DesiredPod,
    container: &Container,
    config: &CriPodRuntimeConfig,
) -> Result<Option<v1::SecurityProfile>, ProfileError> {
    use v1::security_profile::ProfileType;
    let field = container
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| pod.spec().security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref()));
    let profile = if let Some(field) = field {
        match field.type_.as_str() {
            "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
            "Unconfined" => (ProfileType::Unconfined, String::new()),
            "Localhost" => match field.localhost_profile.as_deref().filter(|p| !p.is_empty()) {
                Some(name) => (ProfileType::Localhost, name.to_owned()),
                None => {
                    return Err(ProfileError::AppArmorLocalhostName);
                }
            },
            other => {
                return Err(ProfileError::AppArmorType(other.to_owned()));
            }
        }
    } else {
        let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", container.name);
        let Some(value) = pod.pod.metadata.annotations.as_ref().and_then(|a| a.get(&key)) else {
            return Ok(None);
        };
        match value.as_str() {
            "runtime/default" => (ProfileType::RuntimeDefault, String::new()),
            "unconfined" => (ProfileType::Unconfined, String::new()),
            other => match other.strip_prefix("localhost/").filter(|p| !p.is_empty()) {
                Some(name) => (ProfileType::Localhost, name.to_owned()),
                None => {
                    return Err(ProfileError::AppArmorAnnotation { key, value: other.to_owned() });
                }
            },
        }
    };
    if profile.0 != ProfileType::Unconfined && !config.apparmor_enabled {
        return Err(ProfileError::AppArmorDisabled);
    }
    Ok(Some(v1::SecurityProfile { profile_type: profile.0 as i32, localhost_ref: profile.1 }))
}

/// Refuses to run a `runAsNonRoot` container as root: the effective user is `runAsUser`, else the image's.
fn check_run_as_non_root(
    pod: &DesiredPod,
    container: &Container,
    image: &v1::Image,
    path: &str,
) -> Result<(), SpecError> {
    let sc = container.security_context.as_ref();
    let pod_sc = pod.spec().security_context.as_ref();
    let non_root = sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|s| s.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let fail = |why: String| {
        Err(SpecError::Container(format!(
            "container {:?}: {path}.securityContext.runAsNonRoot: {why}",
            container.name
        )))
    };
    match sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user)) {
        Some(0) => fail("runAsUser is 0 (root)".into()),
        Some(_) => Ok(()),
        None => match (&image.uid, image.username.as_str()) {
            (Some(uid), _) if uid.value == 0 => fail("the image will run as root".into()),
            (Some(_), _) => Ok(()),
            (None, "") => fail("the image will run as root".into()),
            (None, user) => {
                fail(format!("the image has non-numeric user ({user}), cannot verify it is not root"))
            }
        },
    }
}

/// A bind mount of a volume's `subPath` the runtime makes before it creates the container (safely: see
/// `nodelet_host::subpath`); the container mounts `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubPathBind {
    /// The volume's directory.
    pub(crate) volume_root: PathBuf,
    /// The path beneath it (relative, checked again when binding).
    pub(crate) sub_path: String,
    /// Where the bind goes: `<pod dir>/volume-subpaths/<volume>/<container>/<mount index>`.
    pub(crate) target: PathBuf,
}

/// The container's CRI mounts from its `volumeMounts` and the pod's set-up `volumes`, plus the subPath binds to
/// make first. `pod_dir` is the pod's directory (`<root>/pods/<uid>`). Block devices (`volumeDevices`) are
/// refused with an error naming the field.
pub(crate) fn container_mounts(
    pod: &DesiredPod,
    container: &Container,
    inputs: &ContainerInputs<'_>,
    config: &CriPodRuntimeConfig,
    pod_dir: &Path,
) -> Result<(Vec<v1::Mount>, Vec<SubPathBind>), SpecError> {
    let path = container_field_path(pod, &container.name, inputs.kind);
    if let Some(device) = container.volume_devices.iter().flatten().next() {
        return Err(SpecError::Container(format!(
            "container {:?}: {path}.volumeDevices[0]: volume {:?}: raw block devices are not supported by nodelet yet",
            container.name, device.name
        )));
    }
    let mut mounts = Vec::new();
    let mut binds = Vec::new();
    let mut env = None;
    for (i, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let field = format!("{path}.volumeMounts[{i}]");
        let Some(volume) = inputs.volumes.get(&mount.name) else {
            return Err(SpecError::Container(format!(
                "container {:?}: {field}: volume {:?} ({}) is not set up",
                container.name,
                mount.name,
                volume_type(pod, &mount.name)
            )));
        };
        let sub_path = match (mount.sub_path.as_deref(), mount.sub_path_expr.as_deref()) {
            (Some(s), _) if !s.is_empty() => Some(s.to_owned()),
            (_, Some(expr)) if !expr.is_empty() => {
                if env.is_none() {
                    env = Some(container_env(pod, container, &path, inputs, config)?);
                }
                let vars: std::collections::BTreeMap<String, String> =
                    env.iter().flat_map(|e| e.0.iter().cloned()).collect();
                let expanded = nodelet_host::subpath::expand_sub_path_expr(expr, &vars).map_err(|e| {
                    SpecError::Container(format!("container {:?}: {field}.subPathExpr: {e}", container.name))
                })?;
                Some(expanded)
            }
            _ => None,
        };
        let host_path = match sub_path {
            Some(sub_path) if !sub_path.trim_matches('/').is_empty() && sub_path != "." => {
                let target = pod_dir
                    .join("volume-subpaths")
                    .join(&mount.name)
                    .join(&container.name)
                    .join(i.to_string());
                binds.push(SubPathBind {
                    volume_root: volume.path.clone(),
                    sub_path,
                    target: target.clone(),
                });
                target
            }
            _ => volume.path.clone(),
        };
        let propagation = match mount.mount_propagation.as_deref() {
            Some("HostToContainer") => v1::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => v1::MountPropagation::PropagationBidirectional,
            _ => v1::MountPropagation::PropagationPrivate,
        };
        mounts.push(v1::Mount {
            container_path: mount.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: mount.read_only.unwrap_or(false) || volume.forced_read_only(),
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok((mounts, binds))
}

/// The source type of the pod's volume `name`, as the API field calls it (`emptyDir`, `hostPath`, ...).
fn volume_type(pod: &DesiredPod, name: &str) -> &'static str {
    let Some(v) = pod.spec().volumes.iter().flatten().find(|v| v.name == name) else {
        return "not defined";
    };
    let types = [
        (v.empty_dir.is_some(), "emptyDir"),
        (v.host_path.is_some(), "hostPath"),
        (v.config_map.is_some(), "configMap"),
        (v.secret.is_some(), "secret"),
        (v.projected.is_some(), "projected"),
        (v.downward_api.is_some(), "downwardAPI"),
        (v.persistent_volume_claim.is_some(), "persistentVolumeClaim"),
        (v.ephemeral.is_some(), "ephemeral"),
        (v.csi.is_some(), "csi"),
        (v.image.is_some(), "image"),
    ];
    types.iter().find(|(set, _)| *set).map_or("other", |(_, t)| t)
}

/// The CRI container config of `container` (checked against the node's rules: see [`check_privileged`]), with
/// `inputs.mounts` as its mounts (from [`container_mounts`]).
pub(crate) fn container_config(
    pod: &DesiredPod,
    container: &Container,
    inputs: &ContainerInputs<'_>,
    config: &CriPodRuntimeConfig,
) -> Result<v1::ContainerConfig, SpecError> {
    let identity = pod_identity(pod).map_err(|e| SpecError::Container(e.to_string()))?;
    let path = container_field_path(pod, &container.name, inputs.kind);
    if !is_path_segment(&container.name) {
        return Err(SpecError::Container(format!(
            "{path}.name: {:?} is not usable in a path",
            container.name
        )));
    }
    check_privileged(pod, container, inputs.kind, config)?;
    check_run_as_non_root(pod, container, inputs.image, &path)?;

    let env = container_env(pod, container, &path, inputs, config)?;
    let expand_all = |items: &Option<Vec<String>>| -> Vec<String> {
        items.iter().flatten().map(|s| expand(s, |name| env.get(name))).collect()
    };
    let command = expand_all(&container.command);
    let args = expand_all(&container.args);

    let mut container_labels = labels::container_labels(&identity, &container.name);
    if !config.node_name.is_empty() {
        container_labels.insert(labels::NODE.to_owned(), config.node_name.clone());
    }
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_owned(), container_hash(container)),
        (labels::CONTAINER_HASH_WITHOUT_RESOURCES.to_owned(), container_hash_without_resources(container)),
        (labels::CONTAINER_RESTART_COUNT.to_owned(), inputs.restart_count.to_string()),
        (labels::CONTAINER_BACKOFF_SINCE.to_owned(), inputs.backoff_since.to_string()),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_owned(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.into()),
        ),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.to_owned(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_POLICY.into()),
        ),
        (
            labels::CONTAINER_KIND.to_owned(),
            match inputs.kind {
                ContainerKind::Init => labels::CONTAINER_KIND_INIT,
                ContainerKind::App => labels::CONTAINER_KIND_APP,
                ContainerKind::Ephemeral => labels::CONTAINER_KIND_EPHEMERAL,
            }
            .to_owned(),
        ),
        (labels::CONTAINER_IMAGE.to_owned(), container.image.clone().unwrap_or_default()),
    ]);
    annotations
        .insert(labels::POD_TERMINATION_GRACE_PERIOD.to_owned(), pod.grace_period().as_secs().to_string());
    if inputs.kind == ContainerKind::Init
        && let Some((index, _)) = pod.sidecars().find(|(_, c)| c.name == container.name)
    {
        annotations.insert(labels::CONTAINER_SIDECAR_INDEX.to_owned(), index.to_string());
    }
    if inputs.kind == ContainerKind::Init
        && let Some((index, _)) = pod.sidecars().find(|(_, c)| c.name == container.name)
    {
        annotations.insert(labels::CONTAINER_SIDECAR_INDEX.to_owned(), index.to_string());
    }
    // As the kubelet: the preStop hook and the ports it may name travel with the container.
    if let Some(Ok(json)) =
        container.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).map(serde_json::to_string)
    {
        annotations.insert(labels::CONTAINER_PRE_STOP_HANDLER.to_owned(), json);
    }
    if let Some(Ok(json)) = container.ports.as_ref().filter(|p| !p.is_empty()).map(serde_json::to_string) {
        annotations.insert(labels::CONTAINER_PORTS.to_owned(), json);
    }

    Ok(v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata { name: container.name.clone(), attempt: inputs.restart_count }),
        image: Some(v1::ImageSpec { image: inputs.image.id.clone(), ..Default::default() }),
        command,
        args,
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env.0.into_iter().map(|(key, value)| v1::KeyValue { key, value }).collect(),
        labels: container_labels,
        annotations,
        log_path: container_log_path(&container.name, inputs.restart_count),
        mounts: inputs.mounts.to_vec(),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(v1::LinuxContainerConfig {
            resources: Some(linux_resources(pod, container, &path, config)?),
            security_context: Some(container_security_context(
                pod,
                container,
                &path,
                config,
                inputs.pid_target,
                inputs.userns,
            )?),
        }),
        ..Default::default()
    })
}

/// `<container name>/<restart count>.log`, relative to the sandbox's log directory.
pub(crate) fn container_log_path(name: &str, restart_count: u32) -> String {
    format!("{name}/{restart_count}.log")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Capabilities, ContainerPort, EnvVar, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec,
        ResourceRequirements, SecurityContext, Sysctl,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use nodelet_resources::model::pod::PodSource;

    use super::*;

    fn container(name: &str) -> Container {
        Container { name: name.into(), image: Some("busybox:1".into()), ..Default::default() }
    }

    fn pod(containers: Vec<Container>) -> DesiredPod {
        DesiredPod {
            pod: Pod {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    namespace: Some("prod".into()),
                    uid: Some("0123-abcd".into()),
                    labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                    annotations: Some(BTreeMap::from([("note".into(), "x".into())])),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers,
                    termination_grace_period_seconds: Some(7),
                    ..Default::default()
                }),
                ..Default::default()
            },
            source: PodSource::Http,
        }
    }

    fn image() -> v1::Image {
        v1::Image { id: "sha256:feed".into(), ..Default::default() }
    }

    static NO_VOLUMES: std::sync::LazyLock<PodVolumes> = std::sync::LazyLock::new(PodVolumes::new);

    fn inputs<'a>(image: &'a v1::Image, ips: &'a [String]) -> ContainerInputs<'a> {
        ContainerInputs {
            kind: ContainerKind::App,
            restart_count: 2,
            backoff_since: 0,
            image,
            pod_ips: ips,
            volumes: &NO_VOLUMES,
            mounts: &[],
            pid_target: None,
            userns: None,
        }
    }

    fn cfg() -> CriPodRuntimeConfig {
        CriPodRuntimeConfig::default()
            .with_pod_log_root("/logs")
            .with_cgroup_root(Some("/nodelet/".into()))
            .with_memory_capacity_bytes(Some(1 << 30))
    }

    fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Option<ResourceRequirements> {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| kv.iter().map(|(k, v)| ((*k).to_owned(), Q((*v).to_owned()))).collect())
        };
        Some(ResourceRequirements { requests: map(requests), limits: map(limits), ..Default::default() })
    }

    #[test]
    fn expansion_matches_kubernetes() {
        let vars = |n: &str| match n {
            "A" => Some("alpha".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(expand("$(A)", vars), "alpha");
        assert_eq!(expand("x$(A)y$(A)", vars), "xalphayalpha");
        assert_eq!(expand("$(MISSING)", vars), "$(MISSING)");
        assert_eq!(expand("$$(A)", vars), "$(A)");
        assert_eq!(expand("$$$(A)", vars), "$alpha");
        assert_eq!(expand("$(A", vars), "$(A");
        assert_eq!(expand("$A $", vars), "$A $");
        assert_eq!(expand("$(EMPTY)-", vars), "-");
        assert_eq!(expand("é$é$(A)ü", vars), "é$é".to_owned() + "alphaü");
        assert_eq!(expand("", vars), "");
        assert_eq!(expand("$()", vars), "$()");
    }

    #[test]
    fn sandbox_config_like_the_kubelet() {
        let mut c = container("app");
        c.ports = Some(vec![
            ContainerPort { container_port: 8080, host_port: Some(18080), ..Default::default() },
            ContainerPort { container_port: 8080, host_port: Some(18080), ..Default::default() },
            ContainerPort {
                container_port: 53,
                host_port: Some(1053),
                protocol: Some("UDP".into()),
                host_ip: Some("127.0.0.1".into()),
                ..Default::default()
            },
            ContainerPort { container_port: 9090, ..Default::default() },
        ]);
        let mut p = pod(vec![c]);
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.security_context = Some(PodSecurityContext {
                sysctls: Some(vec![Sysctl {
                    name: "net.ipv4.ip_unprivileged_port_start".into(),
                    value: "0".into(),
                }]),
                fs_group: Some(2000),
                ..Default::default()
            });
        }
        let s = sandbox_config(&p, 3, &cfg(), None, None).expect("sandbox config");
        let meta = s.metadata.as_ref().expect("metadata");
        assert_eq!(
            (meta.name.as_str(), meta.namespace.as_str(), meta.uid.as_str(), meta.attempt),
            ("web", "prod", "0123-abcd", 3)
        );
        assert_eq!(s.hostname, "web");
        assert_eq!(s.log_directory, "/logs/prod_web_0123-abcd");
        assert_eq!(s.labels.get(labels::POD_UID).map(String::as_str), Some("0123-abcd"));
        assert_eq!(s.labels.get("app").map(String::as_str), Some("web"));
        assert!(labels::is_managed(&s.labels));
        assert!(!s.labels.contains_key(labels::NODE), "no node name, no node label");
        let on_node =
            sandbox_config(&p, 3, &cfg().with_node_name("node-1"), None, None).expect("sandbox config");
        assert_eq!(on_node.labels.get(labels::NODE).map(String::as_str), Some("node-1"));
        assert_eq!(s.annotations.get("note").map(String::as_str), Some("x"));
        assert_eq!(s.annotations.get(CONFIG_SOURCE).map(String::as_str), Some("http"));
        assert_eq!(s.port_mappings.len(), 2, "{:?}", s.port_mappings);
        assert_eq!(s.port_mappings[1].protocol, v1::Protocol::Udp as i32);
        assert_eq!(s.port_mappings[1].host_ip, "127.0.0.1");
        let linux = s.linux.as_ref().expect("linux");
        assert_eq!(linux.cgroup_parent, "/nodelet/pod0123-abcd");
        assert_eq!(linux.sysctls.get("net.ipv4.ip_unprivileged_port_start").map(String::as_str), Some("0"));
        let sc = linux.security_context.as_ref().expect("security context");
        let ns = sc.namespace_options.as_ref().expect("namespaces");
        assert_eq!((ns.network, ns.pid, ns.ipc), (0, v1::NamespaceMode::Container as i32, 0));
        assert_eq!(sc.supplemental_groups, vec![2000]);
        assert!(!sc.privileged);

        // Host network: empty hostname, node network namespace.
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.host_network = Some(true);
            spec.host_pid = Some(true);
        }
        let s = sandbox_config(&p, 0, &cfg(), None, None).expect("sandbox config");
        assert_eq!(s.hostname, "");
        let ns = s.linux.and_then(|l| l.security_context).and_then(|sc| sc.namespace_options).expect("ns");
        assert_eq!((ns.network, ns.pid), (v1::NamespaceMode::Node as i32, v1::NamespaceMode::Node as i32));
    }

    #[test]
    fn hostile_names_are_refused() {
        for (name, ns, uid) in [
            ("..", "default", "u1"),
            ("web", "a/b", "u1"),
            ("web", "default", "../x"),
            ("web", "default", ""),
        ] {
            let mut p = pod(vec![container("app")]);
            p.pod.metadata.name = Some(name.into());
            p.pod.metadata.namespace = Some(ns.into());
            p.pod.metadata.uid = Some(uid.into());
            let err = sandbox_config(&p, 0, &cfg(), None, None).expect_err("hostile identity accepted");
            assert_eq!(err.reason(), "CreatePodSandboxError");
        }
        let p = pod(vec![container("../evil")]);
        let img = image();
        let err =
            container_config(&p, &container("../evil"), &inputs(&img, &[]), &cfg()).expect_err("bad name");
        assert!(err.to_string().contains("spec.containers[0].name"), "{err}");
    }

    #[test]
    fn cgroup_parents_are_absolute() {
        assert_eq!(cgroup_parent(Some("/nodelet/"), "u1"), "/nodelet/podu1");
        assert_eq!(cgroup_parent(Some("nodelet/pods"), "u1"), "/nodelet/pods/podu1");
        assert_eq!(cgroup_parent(Some("/"), "u1"), "/podu1");
        assert_eq!(cgroup_parent(None, "u1"), "");
    }

    #[test]
    fn long_hostnames_are_truncated() {
        let mut p = pod(vec![container("app")]);
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.hostname = Some(format!("{}-.x", "a".repeat(61)));
        }
        let s = sandbox_config(&p, 0, &cfg(), None, None).expect("sandbox config");
        assert_eq!(s.hostname, "a".repeat(61));
    }

    #[test]
    fn an_ephemeral_container_joins_its_targets_pid_namespace_and_is_labelled_ephemeral() {
        let mut p = pod(vec![container("app")]);
        let debug = k8s_openapi::api::core::v1::EphemeralContainer {
            name: "debug".into(),
            image: Some("busybox:1".into()),
            target_container_name: Some("app".into()),
            ..Default::default()
        };
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.ephemeral_containers = Some(vec![debug]);
        }
        let img = image();
        let ephemeral = &p.ephemeral_containers()[0];
        assert_eq!(
            container_field_path(&p, "debug", ContainerKind::Ephemeral),
            "spec.ephemeralContainers[0]"
        );
        let inputs = ContainerInputs {
            kind: ContainerKind::Ephemeral,
            restart_count: 0,
            backoff_since: 0,
            pid_target: Some("target-id"),
            ..inputs(&img, &[])
        };
        let cc = container_config(&p, ephemeral, &inputs, &cfg()).expect("config");
        assert_eq!(cc.annotations.get(labels::CONTAINER_KIND).map(String::as_str), Some("ephemeral"));
        let ns = cc
            .linux
            .and_then(|l| l.security_context)
            .and_then(|sc| sc.namespace_options)
            .expect("namespaces");
        assert_eq!((ns.pid, ns.target_id.as_str()), (v1::NamespaceMode::Target as i32, "target-id"));
        assert_eq!(ns.network, v1::NamespaceMode::Pod as i32);
        // A pod sharing its process namespace keeps it: the target is in it already.
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.share_process_namespace = Some(true);
        }
        let cc = container_config(&p, ephemeral, &inputs, &cfg()).expect("config");
        let ns = cc.linux.and_then(|l| l.security_context).and_then(|sc| sc.namespace_options).expect("ns");
        assert_eq!((ns.pid, ns.target_id.as_str()), (v1::NamespaceMode::Pod as i32, ""));
    }

    #[test]
    fn a_user_namespace_goes_to_the_sandbox_and_every_container() {
        let p = pod(vec![container("app")]);
        let ns = crate::userns::user_namespace(2 * crate::userns::RANGE_LENGTH);
        let of_sandbox = |s: v1::PodSandboxConfig| {
            s.linux
                .and_then(|l| l.security_context)
                .and_then(|sc| sc.namespace_options)
                .and_then(|n| n.userns_options)
        };
        let s = sandbox_config(&p, 0, &cfg(), None, Some(&ns)).expect("sandbox config");
        assert_eq!(of_sandbox(s), Some(ns.clone()));
        let s = sandbox_config(&p, 0, &cfg(), None, None).expect("sandbox config");
        assert_eq!(of_sandbox(s), None, "the host's users: no userns_options at all");
        let img = image();
        let inputs = ContainerInputs { userns: Some(&ns), ..inputs(&img, &[]) };
        let cc = container_config(&p, &p.containers()[0], &inputs, &cfg()).expect("config");
        let got = cc.linux.and_then(|l| l.security_context).and_then(|sc| sc.namespace_options);
        assert_eq!(got.and_then(|n| n.userns_options), Some(ns));
    }

    #[test]
    fn container_config_maps_everything() {
        let mut c = container("app");
        c.command = Some(vec!["/bin/$(PROG)".into()]);
        c.args = Some(vec!["--name=$(POD_NAME)".into(), "$$(POD_NAME)".into(), "$(UNKNOWN)".into()]);
        c.working_dir = Some("/srv".into());
        c.tty = Some(true);
        c.env = Some(vec![
            EnvVar { name: "PROG".into(), value: Some("httpd".into()), ..Default::default() },
            EnvVar {
                name: "POD_NAME".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.name".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            EnvVar {
                name: "IP".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "status.podIP".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            EnvVar {
                name: "APP".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.labels['app']".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            EnvVar {
                name: "GREETING".into(),
                value: Some("hi $(POD_NAME) from $(IP)".into()),
                ..Default::default()
            },
            EnvVar { name: "PROG".into(), value: Some("sh".into()), ..Default::default() },
        ]);
        c.resources =
            resources(&[("cpu", "250m"), ("memory", "64Mi")], &[("cpu", "500m"), ("memory", "128Mi")]);
        c.security_context = Some(SecurityContext {
            run_as_user: Some(1000),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        });
        let p = pod(vec![c.clone()]);
        let img = image();
        let ips = ["198.18.0.9".to_owned()];
        let cc = container_config(&p, &c, &inputs(&img, &ips), &cfg()).expect("container config");
        assert_eq!(cc.metadata, Some(v1::ContainerMetadata { name: "app".into(), attempt: 2 }));
        assert_eq!(cc.image.as_ref().map(|i| i.image.as_str()), Some("sha256:feed"));
        assert_eq!(cc.command, ["/bin/sh"]);
        assert_eq!(cc.args, ["--name=web", "$(POD_NAME)", "$(UNKNOWN)"]);
        let env: Vec<(&str, &str)> = cc.envs.iter().map(|kv| (kv.key.as_str(), kv.value.as_str())).collect();
        assert_eq!(
            env,
            [
                ("PROG", "sh"),
                ("POD_NAME", "web"),
                ("IP", "198.18.0.9"),
                ("APP", "web"),
                ("GREETING", "hi web from 198.18.0.9")
            ]
        );
        assert_eq!(cc.log_path, "app/2.log");
        assert_eq!(cc.working_dir, "/srv");
        assert!(cc.tty && !cc.stdin);
        assert_eq!(cc.annotations.get(labels::CONTAINER_HASH), Some(&container_hash(&c)));
        assert_eq!(cc.annotations.get(labels::CONTAINER_RESTART_COUNT).map(String::as_str), Some("2"));
        assert_eq!(cc.annotations.get(labels::POD_TERMINATION_GRACE_PERIOD).map(String::as_str), Some("7"));
        assert_eq!(cc.annotations.get(labels::CONTAINER_KIND).map(String::as_str), Some("app"));
        assert_eq!(cc.annotations.get(labels::CONTAINER_IMAGE).map(String::as_str), Some("busybox:1"));
        assert_eq!(
            cc.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_PATH).map(String::as_str),
            Some("/dev/termination-log")
        );
        assert_eq!(cc.labels.get(labels::CONTAINER_NAME).map(String::as_str), Some("app"));
        assert!(labels::is_managed(&cc.labels));
        assert!(!cc.labels.contains_key(labels::NODE));
        let on_node = container_config(&p, &c, &inputs(&img, &ips), &cfg().with_node_name("node-1"))
            .expect("container config");
        assert_eq!(on_node.labels.get(labels::NODE).map(String::as_str), Some("node-1"));
        let linux = cc.linux.expect("linux");
        let r = linux.resources.expect("resources");
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period), (256, 50_000, 100_000));
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
        // Burstable: 1000 - 1000 * 64Mi / 1Gi.
        assert_eq!(r.oom_score_adj, 938);
        let sc = linux.security_context.expect("security context");
        assert_eq!(sc.run_as_user, Some(v1::Int64Value { value: 1000 }));
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        let caps = sc.capabilities.expect("caps");
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".into()], vec!["ALL".into()])
        );
    }

    #[test]
    fn qos_and_cpu_edges() {
        let mut g = container("g");
        g.resources = resources(&[], &[("cpu", "1m"), ("memory", "1Gi")]);
        let p = pod(vec![g.clone()]);
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        let img = image();
        let r = container_config(&p, &g, &inputs(&img, &[]), &cfg())
            .expect("config")
            .linux
            .and_then(|l| l.resources)
            .expect("resources");
        assert_eq!((r.cpu_shares, r.cpu_quota, r.oom_score_adj), (2, 1000, -997));
        let be = pod(vec![container("b")]);
        assert_eq!(qos_class(&be), QosClass::BestEffort);
        let r = container_config(&be, &container("b"), &inputs(&img, &[]), &cfg())
            .expect("config")
            .linux
            .and_then(|l| l.resources)
            .expect("resources");
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit_in_bytes, r.oom_score_adj),
            (2, 0, 0, 0, 1000)
        );
        let mut bad = container("bad");
        bad.resources = resources(&[("cpu", "lots")], &[]);
        let err = container_config(&pod(vec![bad.clone()]), &bad, &inputs(&img, &[]), &cfg())
            .expect_err("bad quantity");
        assert!(err.to_string().contains("spec.containers[0].resources.requests.cpu"), "{err}");
    }

    fn volume_pod(mounts: Vec<k8s_openapi::api::core::v1::VolumeMount>) -> (DesiredPod, Container) {
        use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
        let mut c = container("server");
        c.volume_mounts = Some(mounts);
        c.env = Some(vec![EnvVar { name: "DIR".into(), value: Some("logs/a".into()), ..Default::default() }]);
        let mut p = pod(vec![container("other"), c.clone()]);
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.volumes = Some(vec![
                Volume {
                    name: "shared".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
                Volume { name: "cfg".into(), config_map: Some(Default::default()), ..Default::default() },
            ]);
        }
        (p, c)
    }

    fn mount(name: &str, path: &str) -> k8s_openapi::api::core::v1::VolumeMount {
        k8s_openapi::api::core::v1::VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        }
    }

    fn set_up_volumes() -> PodVolumes {
        use nodelet_resources::model::volumes::MountedVolume;
        use nodelet_resources::model::volumes::Plugin;
        PodVolumes::from([
            (
                "shared".into(),
                MountedVolume { path: "/root/pods/u/volumes/e/shared".into(), plugin: Plugin::EmptyDir },
            ),
            (
                "cfg".into(),
                MountedVolume { path: "/root/pods/u/volumes/c/cfg".into(), plugin: Plugin::ConfigMap },
            ),
        ])
    }

    #[test]
    fn volume_mounts_become_cri_mounts_with_subpath_binds() {
        let mut ro = mount("shared", "/ro");
        ro.read_only = Some(true);
        let mut sub = mount("shared", "/sub");
        sub.sub_path = Some("a/b".into());
        let mut expr = mount("shared", "/expr");
        expr.sub_path_expr = Some("$(DIR)/x".into());
        let mut prop = mount("shared", "/prop");
        prop.mount_propagation = Some("HostToContainer".into());
        let (p, c) = volume_pod(vec![mount("shared", "/rw"), ro, mount("cfg", "/cfg"), sub, expr, prop]);
        let img = image();
        let volumes = set_up_volumes();
        let inputs = ContainerInputs { volumes: &volumes, ..inputs(&img, &[]) };
        let (mounts, binds) =
            container_mounts(&p, &c, &inputs, &cfg(), Path::new("/root/pods/u")).expect("mounts");
        let summary: Vec<(&str, &str, bool)> =
            mounts.iter().map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.readonly)).collect();
        assert_eq!(
            summary,
            vec![
                ("/rw", "/root/pods/u/volumes/e/shared", false),
                ("/ro", "/root/pods/u/volumes/e/shared", true),
                // configMap volumes are always read-only
                ("/cfg", "/root/pods/u/volumes/c/cfg", true),
                ("/sub", "/root/pods/u/volume-subpaths/shared/server/3", false),
                ("/expr", "/root/pods/u/volume-subpaths/shared/server/4", false),
                ("/prop", "/root/pods/u/volumes/e/shared", false),
            ]
        );
        assert_eq!(mounts[5].propagation, v1::MountPropagation::PropagationHostToContainer as i32);
        assert_eq!(mounts[0].propagation, v1::MountPropagation::PropagationPrivate as i32);
        let subs: Vec<(&str, &str)> =
            binds.iter().map(|b| (b.sub_path.as_str(), b.volume_root.to_str().unwrap_or(""))).collect();
        assert_eq!(
            subs,
            vec![("a/b", "/root/pods/u/volumes/e/shared"), ("logs/a/x", "/root/pods/u/volumes/e/shared")]
        );
        // the config carries the mounts
        let inputs = ContainerInputs { mounts: &mounts, ..inputs };
        let config = container_config(&p, &c, &inputs, &cfg()).expect("config");
        assert_eq!(config.mounts, mounts);
    }

    #[test]
    fn a_subpath_expr_escaping_the_volume_is_refused_naming_the_field() {
        let mut expr = mount("shared", "/expr");
        expr.sub_path_expr = Some("$(UP)/etc".into());
        let (mut p, mut c) = volume_pod(vec![expr]);
        c.env = Some(vec![EnvVar { name: "UP".into(), value: Some("..".into()), ..Default::default() }]);
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.containers[1] = c.clone();
        }
        let img = image();
        let volumes = set_up_volumes();
        let inputs = ContainerInputs { volumes: &volumes, ..inputs(&img, &[]) };
        let err = container_mounts(&p, &c, &inputs, &cfg(), Path::new("/r")).expect_err("escape accepted");
        assert_eq!(err.reason(), "CreateContainerConfigError");
        assert!(err.to_string().contains("spec.containers[1].volumeMounts[0].subPathExpr"), "{err}");
    }

    #[test]
    fn a_mount_of_a_volume_not_set_up_fails_naming_the_volume() {
        let (p, c) = volume_pod(vec![mount("shared", "/shared")]);
        let img = image();
        let err =
            container_mounts(&p, &c, &inputs(&img, &[]), &cfg(), Path::new("/r")).expect_err("accepted");
        assert_eq!(err.reason(), "CreateContainerConfigError");
        assert!(
            err.to_string().contains("spec.containers[1].volumeMounts[0]: volume \"shared\" (emptyDir)"),
            "{err}"
        );
    }

    #[test]
    fn privileged_is_gated() {
        let mut c = container("root");
        c.security_context = Some(SecurityContext { privileged: Some(true), ..Default::default() });
        let p = pod(vec![container("other"), c.clone()]);
        let img = image();
        let err = container_config(&p, &c, &inputs(&img, &[]), &cfg()).expect_err("privileged accepted");
        assert_eq!(err.reason(), "CreateContainerConfigError");
        assert!(err.to_string().contains("\"root\""), "{err}");
        assert!(err.to_string().contains("spec.containers[1].securityContext.privileged"), "{err}");
        assert!(
            !sandbox_config(&p, 0, &cfg(), None, None)
                .ok()
                .and_then(|s| s.linux)
                .and_then(|l| l.security_context)
                .is_some_and(|s| s.privileged)
        );

        let allowed = cfg().with_allow_privileged(true);
        let cc = container_config(&p, &c, &inputs(&img, &[]), &allowed).expect("allowed");
        assert!(cc.linux.and_then(|l| l.security_context).is_some_and(|s| s.privileged));
        let s = sandbox_config(&p, 0, &allowed, None, None).expect("sandbox");
        assert!(s.linux.and_then(|l| l.security_context).is_some_and(|s| s.privileged));
    }

    #[test]
    fn seccomp_default_makes_unset_profiles_runtime_default() {
        use v1::security_profile::ProfileType;
        let c = container("app");
        let p = pod(vec![c.clone()]);
        let img = image();
        let profile = |config: &CriPodRuntimeConfig, c: &Container| {
            container_config(&p, c, &inputs(&img, &[]), config)
                .expect("config")
                .linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.seccomp)
                .map(|s| s.profile_type)
        };
        assert_eq!(profile(&cfg(), &c), Some(ProfileType::Unconfined as i32), "the kubelet's default");
        let on = cfg().with_seccomp_default(true);
        assert_eq!(profile(&on, &c), Some(ProfileType::RuntimeDefault as i32));
        let sandbox = sandbox_config(&p, 0, &on, None, None).expect("sandbox");
        let sandbox_profile = sandbox.linux.and_then(|l| l.security_context).and_then(|s| s.seccomp);
        assert_eq!(sandbox_profile.map(|s| s.profile_type), Some(ProfileType::RuntimeDefault as i32));
        let mut explicit = c.clone();
        explicit.security_context = Some(SecurityContext {
            seccomp_profile: Some(SeccompProfile { type_: "Unconfined".into(), localhost_profile: None }),
            ..Default::default()
        });
        assert_eq!(profile(&on, &explicit), Some(ProfileType::Unconfined as i32), "an explicit profile wins");
    }

    #[test]
    fn apparmor_annotations_and_fields_map_to_the_cri_or_are_refused_without_apparmor() {
        use v1::security_profile::ProfileType;
        let c = container("app");
        let img = image();
        let with = |value: &str| {
            let mut p = pod(vec![c.clone()]);
            p.pod
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert("container.apparmor.security.beta.kubernetes.io/app".into(), value.into());
            p
        };
        let apparmor = |p: &DesiredPod, config: &CriPodRuntimeConfig| {
            container_config(p, &c, &inputs(&img, &[]), config)
                .map(|cc| cc.linux.and_then(|l| l.security_context).and_then(|s| s.apparmor))
        };
        let enabled = cfg().with_apparmor_enabled(true);
        let none = apparmor(&pod(vec![c.clone()]), &enabled).expect("no profile");
        assert_eq!(none, None, "nothing asked, nothing set");
        let local = apparmor(&with("localhost/my-profile"), &enabled).expect("localhost").expect("set");
        assert_eq!(
            (local.profile_type, local.localhost_ref.as_str()),
            (ProfileType::Localhost as i32, "my-profile")
        );
        let default = apparmor(&with("runtime/default"), &enabled).expect("runtime/default").expect("set");
        assert_eq!(default.profile_type, ProfileType::RuntimeDefault as i32);
        assert!(apparmor(&with("bogus"), &enabled).is_err(), "an unknown value is refused");

        // Without AppArmor on the node: refused, not dropped; unconfined still runs.
        let err = apparmor(&with("localhost/my-profile"), &cfg()).expect_err("no AppArmor");
        assert_eq!(err.reason(), "CreateContainerConfigError");
        assert!(err.to_string().contains("AppArmor is not enabled on the host"), "{err}");
        let unconfined = apparmor(&with("unconfined"), &cfg()).expect("unconfined").expect("set");
        assert_eq!(unconfined.profile_type, ProfileType::Unconfined as i32);

        let mut field = c.clone();
        field.security_context = Some(SecurityContext {
            app_armor_profile: Some(k8s_openapi::api::core::v1::AppArmorProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        });
        let p = pod(vec![field.clone()]);
        assert!(
            container_config(&p, &field, &inputs(&img, &[]), &cfg()).is_err(),
            "the field is refused too"
        );
    }

    #[test]
    fn unknowable_env_is_an_error_naming_the_field() {
        let mut c = container("app");
        c.env = Some(vec![
            EnvVar { name: "OK".into(), value: Some("1".into()), ..Default::default() },
            EnvVar {
                name: "NODE_IP".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "status.hostIP".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]);
        let p = pod(vec![c.clone()]);
        let img = image();
        let err = container_config(&p, &c, &inputs(&img, &[]), &cfg()).expect_err("unknown host IP");
        assert!(err.to_string().contains("spec.containers[0].env[1].valueFrom.fieldRef.fieldPath"), "{err}");
        let known = cfg().with_node_ips(vec!["127.0.0.1".into()]);
        let cc = container_config(&p, &c, &inputs(&img, &[]), &known).expect("known host IP");
        assert!(cc.envs.iter().any(|kv| kv.key == "NODE_IP" && kv.value == "127.0.0.1"));
    }

    #[test]
    fn resource_field_refs_read_as_the_kubelet_computes_them() {
        let field = |name: &str, resource: &str, divisor: Option<&str>| EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(k8s_openapi::api::core::v1::ResourceFieldSelector {
                    resource: resource.into(),
                    divisor: divisor.map(|d| Q(d.into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut c = container("app");
        c.resources =
            resources(&[("cpu", "250m"), ("memory", "32Mi")], &[("cpu", "1250m"), ("memory", "64Mi")]);
        c.env = Some(vec![
            // The API server sends an unset divisor as "0": both mean 1.
            field("CPU_LIMIT", "limits.cpu", None),
            field("MEMORY_LIMIT", "limits.memory", Some("0")),
            field("CPU_REQUEST", "requests.cpu", Some("1m")),
            field("MEMORY_REQUEST", "requests.memory", Some("1Mi")),
            field("STORAGE_REQUEST", "requests.ephemeral-storage", None),
        ]);
        let p = pod(vec![c.clone()]);
        let img = image();
        let env = |c: &Container, p: &DesiredPod, config: &CriPodRuntimeConfig| {
            let cc = container_config(p, c, &inputs(&img, &[]), config).expect("config");
            cc.envs.into_iter().map(|kv| (kv.key, kv.value)).collect::<BTreeMap<_, _>>()
        };
        let got = env(&c, &p, &cfg());
        assert_eq!(got["CPU_LIMIT"], "2", "1250m rounds up to 2 cores");
        assert_eq!(got["MEMORY_LIMIT"], (64u64 << 20).to_string());
        assert_eq!(got["CPU_REQUEST"], "250");
        assert_eq!(got["MEMORY_REQUEST"], "32");
        assert_eq!(got["STORAGE_REQUEST"], "0", "an unset request reads 0");

        // Without limits: the node's allocatable amounts.
        let mut bare = c.clone();
        bare.resources = None;
        let p = pod(vec![bare.clone()]);
        let allocatable: BTreeMap<String, Quantity> =
            [("cpu", "3500m"), ("memory", "2Gi"), ("ephemeral-storage", "10G")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), Quantity::parse(v).expect("quantity")))
                .collect();
        let mut bare_env = bare.clone();
        bare_env.env.get_or_insert_with(Vec::new).push(field(
            "STORAGE_LIMIT",
            "limits.ephemeral-storage",
            Some("1G"),
        ));
        let p_env = pod(vec![bare_env.clone()]);
        let got = env(&bare_env, &p_env, &cfg().with_allocatable(allocatable));
        assert_eq!(got["CPU_LIMIT"], "4");
        assert_eq!(got["MEMORY_LIMIT"], (2u64 << 30).to_string());
        assert_eq!(got["STORAGE_LIMIT"], "10");
        assert_eq!(got["CPU_REQUEST"], "0");
        // No allocatable known: the machine's CPUs and memory capacity.
        let got = env(&bare, &p, &cfg());
        assert_eq!(got["MEMORY_LIMIT"], (1u64 << 30).to_string());
        assert!(got["CPU_LIMIT"].parse::<u64>().is_ok_and(|n| n >= 1), "{got:?}");

        let mut negative = c.clone();
        negative.env = Some(vec![field("BAD", "limits.cpu", Some("-1"))]);
        let p = pod(vec![negative.clone()]);
        let err = container_config(&p, &negative, &inputs(&img, &[]), &cfg()).expect_err("negative divisor");
        assert!(err.to_string().contains("divisor must be positive"), "{err}");
    }

    #[test]
    fn env_from_config_maps_and_secrets_reads_the_lookup() {
        use k8s_openapi::api::core::v1::{
            ConfigMap, ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, Secret, SecretKeySelector,
        };
        let ns = pod(vec![container("x")]).namespace().to_owned();
        let mut objects = nodelet_host::files::StaticObjects::new();
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("cfg".into());
        cm.metadata.namespace = Some(ns.clone());
        cm.data = Some([("A".to_owned(), "1".to_owned()), ("bad key".to_owned(), "x".to_owned())].into());
        objects.insert_config_map(cm);
        let mut secret = Secret::default();
        secret.metadata.name = Some("sec".into());
        secret.metadata.namespace = Some(ns);
        secret.data = Some([("pw".to_owned(), k8s_openapi::ByteString(b"hunter2".to_vec()))].into());
        objects.insert_secret(secret);
        let mut c = container("app");
        c.env_from = Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource { name: "cfg".into(), optional: None }),
            prefix: Some("CFG_".into()),
            ..Default::default()
        }]);
        let key_ref = |name: &str, key: &str, optional: Option<bool>, secret: bool| EnvVarSource {
            config_map_key_ref: (!secret).then(|| ConfigMapKeySelector {
                name: name.into(),
                key: key.into(),
                optional,
            }),
            secret_key_ref: secret.then(|| SecretKeySelector {
                name: name.into(),
                key: key.into(),
                optional,
            }),
            ..Default::default()
        };
        c.env = Some(vec![
            EnvVar {
                name: "PW".into(),
                value_from: Some(key_ref("sec", "pw", None, true)),
                ..Default::default()
            },
            EnvVar {
                name: "OPT".into(),
                value_from: Some(key_ref("none", "x", Some(true), false)),
                ..Default::default()
            },
        ]);
        let p = pod(vec![c.clone()]);
        let img = image();
        let with = cfg().with_objects(std::sync::Arc::new(objects));
        let cc = container_config(&p, &c, &inputs(&img, &[]), &with).expect("resolved");
        let get = |k: &str| cc.envs.iter().find(|kv| kv.key == k).map(|kv| kv.value.clone());
        assert_eq!(get("CFG_A").as_deref(), Some("1"));
        assert_eq!(get("CFG_bad key"), None, "not a variable name");
        assert_eq!(get("PW").as_deref(), Some("hunter2"));
        assert_eq!(get("OPT"), None, "optional and missing: left out");
        // A required key that is missing names the field and the object.
        let mut missing = c.clone();
        missing.env = Some(vec![EnvVar {
            name: "X".into(),
            value_from: Some(key_ref("cfg", "nope", None, false)),
            ..Default::default()
        }]);
        let err = container_config(&pod(vec![missing.clone()]), &missing, &inputs(&img, &[]), &with)
            .expect_err("missing key");
        assert!(
            err.to_string().contains("env[0].valueFrom.configMapKeyRef: couldn't find key nope"),
            "{err}"
        );
        // Without a lookup (standalone), a required reference is refused.
        let err = container_config(&p, &c, &inputs(&img, &[]), &cfg()).expect_err("no lookup");
        assert!(err.to_string().contains("envFrom[0].configMapRef"), "{err}");
        // Objects do not cross sources: an API pod does not read the static pods' objects.
        let mut api_pod = p.clone();
        api_pod.source = PodSource::Api;
        let err = container_config(&api_pod, &c, &inputs(&img, &[]), &with).expect_err("not the API's");
        assert!(err.to_string().contains("envFrom[0].configMapRef"), "{err}");
        let api_only = cfg().with_api_objects(with.objects.local.clone().expect("local"));
        assert!(container_config(&api_pod, &c, &inputs(&img, &[]), &api_only).is_ok(), "the API's own");
        assert!(container_config(&p, &c, &inputs(&img, &[]), &api_only).is_err(), "and not a static pod's");
    }

    #[test]
    fn run_as_non_root() {
        let mut c = container("app");
        c.security_context = Some(SecurityContext { run_as_non_root: Some(true), ..Default::default() });
        let p = pod(vec![c.clone()]);
        let root_image =
            v1::Image { id: "sha256:1".into(), uid: Some(v1::Int64Value { value: 0 }), ..Default::default() };
        let err = container_config(&p, &c, &inputs(&root_image, &[]), &cfg()).expect_err("root image");
        assert!(err.to_string().contains("runAsNonRoot"), "{err}");
        let user_image = v1::Image {
            id: "sha256:1".into(),
            uid: Some(v1::Int64Value { value: 1000 }),
            ..Default::default()
        };
        assert!(container_config(&p, &c, &inputs(&user_image, &[]), &cfg()).is_ok());
    }
}
