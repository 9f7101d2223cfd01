//! Validation and defaulting of pods from every source, as the API server would do them for what
//! a node agent runs, plus the kubelet's static-pod rules.
//!
//! [`prepare`] turns a decoded [`Pod`] into a [`DesiredPod`]; [`prepare_value`] does the same from
//! an undecoded document (so that decoding errors, such as a missing container `name`, come back as
//! field errors too). The order is the API server's: defaults first, then validation of the
//! defaulted object, then (for static pods) the kubelet's changes:
//!
//! - **Static pods** (sources [`PodSource::File`], [`PodSource::Url`], [`PodSource::Http`]): the
//!   name gets the suffix `-<node name>` (lowercased); unless the manifest sets `metadata.uid`, the
//!   UID is a hash ([`static_pod_uid`]) of the manifest as written, the node name and the source,
//!   so the same manifest keeps its UID across restarts and a changed manifest gets a new one;
//!   `kubernetes.io/config.hash` is the UID; `spec.nodeName` is this node; file pods tolerate every
//!   `NoExecute` taint.
//! - **API pods** keep their name and UID (which must be set).
//! - Every pod gets `kubernetes.io/config.source`. `kubernetes.io/config.seen` is **not** set
//!   here: it is a wall-clock time and would make two preparations of the same manifest differ;
//!   the pod config sets it from the first time it saw the UID.
//!
//! Errors look like the API server's: `pod "default/web": spec.containers[0].image: Required
//! value`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EphemeralContainer, KeyToPath, LifecycleHandler, Pod, PodSpec, Probe,
    ResourceRequirements, Toleration, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use crate::model::pod::{DesiredPod, PodSource, ephemeral_as_container};

/// Annotation naming the source a pod came from (`file`, `http` or `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation holding a static pod's content hash (equal to its UID).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation holding the time (RFC 3339) a pod was first seen; set by the pod config, not here.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Annotation a mirror pod carries (the kubelet's `kubernetes.io/config.mirror`).
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The API server's default `schedulerName`.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// The default `terminationMessagePath`.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// The default `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// Priority of pods of the `system-node-critical` priority class.
pub const SYSTEM_NODE_CRITICAL_PRIORITY: i32 = 2_000_001_000;
/// Priority of pods of the `system-cluster-critical` priority class.
pub const SYSTEM_CLUSTER_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The longest pod name (a DNS-1123 subdomain), including a static pod's node suffix.
const MAX_SUBDOMAIN_LEN: usize = 253;
/// The longest DNS-1123 label.
const MAX_LABEL_LEN: usize = 63;
/// The longest port name (an IANA service name).
const MAX_PORT_NAME_LEN: usize = 15;
/// The longest UID accepted in a manifest (UIDs end up in paths and runtime labels).
const MAX_UID_LEN: usize = 128;
/// The most a pod's annotations may add up to, as the API server enforces.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// What kind of problem a [`FieldError`] reports; the [`Display`](fmt::Display) text is the API
/// server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// `Not found`: the field refers to something that does not exist (a volume mount naming no
    /// volume).
    NotFound,
    /// `Required value`.
    Required,
    /// `Duplicate value`.
    Duplicate,
    /// `Invalid value`.
    Invalid,
    /// `Unsupported value`: not one of the listed values.
    NotSupported,
    /// `Forbidden`.
    Forbidden,
    /// `Too long`.
    TooLong,
    /// `Too many`.
    TooMany,
    /// `Internal error`.
    Internal,
}

impl fmt::Display for FieldErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldErrorKind::NotFound => "Not found",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::Internal => "Internal error",
        })
    }
}

/// One problem with one field, e.g. `spec.containers[0].ports[0].containerPort: Invalid value:
/// 70000: must be between 1 and 65535, inclusive`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldError {
    /// The field's path as the API server writes it: `spec.containers[0].image`,
    /// `spec.containers[0].resources.limits[cpu]`. Empty for the document as a whole.
    pub path: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// The offending value, rendered (strings quoted), when it helps to show it.
    pub value: Option<String>,
    /// Why, for people; may be empty.
    pub detail: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        write!(f, "{}", self.kind)?;
        if let Some(value) = &self.value {
            write!(f, ": {value}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// The object a [`ValidationError`] is about: its namespace (defaulted) and name as written in the
/// manifest (without a static pod's node suffix).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// The namespace (`default` when unset).
    pub namespace: String,
    /// The name, when the manifest has one.
    pub name: Option<String>,
}

impl ObjectRef {
    /// `namespace/name`, or `namespace/` when the name is missing.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name.as_deref().unwrap_or_default())
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "\"{}/{}\"", self.namespace, name),
            None => write!(f, "with no name in namespace \"{}\"", self.namespace),
        }
    }
}

/// A pod failed validation: every field error found, and the pod they belong to. Displays as
/// `pod "default/web": spec.containers[0].image: Required value; spec.restartPolicy: ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// The pod.
    pub object: ObjectRef,
    /// What is wrong with it (never empty).
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {}: ", self.object)?;
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}

pub use crate::quantity::QuantityError;

/// Parses a Kubernetes quantity (`100m`, `64Mi`, `1.5Gi`, `2e3`, `1`) into billionths of its unit
/// (nano-units), rounding up below one nano-unit as the API server does. Negative values are
/// returned as such. The parser is [`crate::quantity::Quantity`], the project's only one.
///
/// ```
/// use nodelet_resources::pod::validation::parse_quantity;
/// assert_eq!(parse_quantity("100m"), Ok(100_000_000));
/// assert_eq!(parse_quantity("1Ki"), Ok(1024 * 1_000_000_000));
/// assert!(parse_quantity("1.5.0").is_err());
/// ```
pub fn parse_quantity(s: &str) -> Result<i128, QuantityError> {
    crate::quantity::Quantity::try_parse(s)?.nanos()
}

/// A static pod's UID: the first 128 bits, in hex, of a SHA-256 over the node name, the source
/// (`file:<path>`, `url:<url>`, `http:`) and the pod as written (its canonical JSON, so comments
/// and formatting do not count but every field does). The kubelet uses an MD5 of the same inputs.
pub fn static_pod_uid(pod: &Pod, source: &PodSource, node_name: &str) -> Result<String, serde_json::Error> {
    let content = serde_json::to_vec(pod)?;
    let mut hasher = Sha256::new();
    hasher.update(b"nodelet-static-pod-v1\0host:");
    hasher.update(node_name.as_bytes());
    hasher.update(b"\0");
    match source {
        PodSource::File(path) => {
            hasher.update(b"file:");
            hasher.update(path.as_os_str().as_encoded_bytes());
        }
        PodSource::Url(url) => {
            hasher.update(b"url:");
            hasher.update(url.as_bytes());
        }
        PodSource::Http => hasher.update(b"http:"),
        PodSource::Api => hasher.update(b"api:"),
    }
    hasher.update(b"\0");
    hasher.update(&content);
    let digest = hasher.finalize();
    Ok(digest.iter().take(16).map(|b| format!("{b:02x}")).collect())
}

/// The image pull policy the API server defaults to: `Always` when the image has the tag `latest`
/// or no tag and no digest, else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    // A tag is a `:` after the last `/` (a `:` before it is a registry port).
    let last_component = name.rsplit('/').next().unwrap_or(name);
    let tag = last_component.rsplit_once(':').map(|(_, tag)| tag);
    match (tag, digest) {
        (Some("latest"), _) | (None, None) => "Always",
        _ => "IfNotPresent",
    }
}

/// Decodes a document into a [`Pod`] and [`prepare`]s it. Decoding errors (a missing container
/// `name`, a string where a number belongs, `apiVersion: v2`) come back as field errors of the
/// same shape as validation errors.
pub fn prepare_value(
    value: serde_json::Value,
    source: PodSource,
    node_name: &str,
) -> Result<DesiredPod, ValidationError> {
    let pod = decode_pod(value)?;
    prepare(pod, source, node_name)
}

/// Decodes a document into a [`Pod`], reporting what does not fit as field errors.
pub fn decode_pod(value: serde_json::Value) -> Result<Pod, ValidationError> {
    let object = object_ref_of_value(&value);
    let fail = |error: FieldError| ValidationError { object: object.clone(), errors: vec![error] };
    let serde_json::Value::Object(map) = &value else {
        return Err(fail(FieldError {
            path: String::new(),
            kind: FieldErrorKind::Invalid,
            value: None,
            detail: "a pod must be a mapping (an object)".into(),
        }));
    };
    match map.get("apiVersion") {
        None => {}
        Some(serde_json::Value::String(v)) if v == "v1" => {}
        Some(other) => {
            return Err(fail(FieldError {
                path: "apiVersion".into(),
                kind: FieldErrorKind::NotSupported,
                value: Some(render_json(other)),
                detail: "supported values: \"v1\"".into(),
            }));
        }
    }
    match map.get("kind") {
        None => {}
        Some(serde_json::Value::String(v)) if v == "Pod" => {}
        Some(other) => {
            return Err(fail(FieldError {
                path: "kind".into(),
                kind: FieldErrorKind::NotSupported,
                value: Some(render_json(other)),
                detail: "supported values: \"Pod\"".into(),
            }));
        }
    }
    serde_path_to_error::deserialize::<_, Pod>(value).map_err(|error| {
        let path = error.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let message = error.inner().to_string();
        let field_error = match missing_field(&message) {
            Some(field) => FieldError {
                path: if path.is_empty() { field.to_string() } else { format!("{path}.{field}") },
                kind: FieldErrorKind::Required,
                value: None,
                detail: String::new(),
            },
            None => FieldError { path, kind: FieldErrorKind::Invalid, value: None, detail: message },
        };
        fail(field_error)
    })
}

/// `Some("name")` for serde's "missing field `name`" message.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// The namespace and name of an undecoded document, as far as they can be read.
fn object_ref_of_value(value: &serde_json::Value) -> ObjectRef {
    let metadata = value.get("metadata");
    let text = |key: &str| {
        metadata
            .and_then(|m| m.get(key))
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    ObjectRef { namespace: text("namespace").unwrap_or_else(|| "default".into()), name: text("name") }
}

fn render_json(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// Validates and defaults `pod` from `source` for this node (`node_name`), as described in the
/// [module docs](self). On success the pod is ready to run: every default is applied, a static
/// pod has its suffixed name, UID and annotations.
pub fn prepare(pod: Pod, source: PodSource, node_name: &str) -> Result<DesiredPod, ValidationError> {
    let is_static = !matches!(source, PodSource::Api);
    let namespace =
        pod.metadata.namespace.clone().filter(|ns| !ns.is_empty()).unwrap_or_else(|| "default".into());
    let object =
        ObjectRef { namespace: namespace.clone(), name: pod.metadata.name.clone().filter(|n| !n.is_empty()) };
    let fail = |errors: Vec<FieldError>| ValidationError { object: object.clone(), errors };

    let manifest_uid = pod.metadata.uid.clone().filter(|uid| !uid.is_empty());
    let uid = match (&manifest_uid, is_static) {
        (Some(uid), _) => uid.clone(),
        (None, true) => static_pod_uid(&pod, &source, node_name).map_err(|e| {
            fail(vec![FieldError {
                path: String::new(),
                kind: FieldErrorKind::Internal,
                value: None,
                detail: format!("cannot hash the pod: {e}"),
            }])
        })?,
        (None, false) => String::new(),
    };

    let mut pod = pod;
    pod.metadata.namespace = Some(namespace);
    let Some(spec) = pod.spec.as_mut() else {
        return Err(fail(vec![FieldError {
            path: "spec".into(),
            kind: FieldErrorKind::Required,
            value: None,
            detail: String::new(),
        }]));
    };
    apply_spec_defaults(spec);

    let mut errs = Errors::default();
    validate_metadata(&pod, is_static, node_name, &mut errs);
    if let Some(spec) = &pod.spec {
        // Only the API server's ephemeralcontainers subresource adds ephemeral containers: a pod
        // cannot be created with them (static pods get theirs from `nodelet debug`, see
        // [`add_ephemeral_containers`]).
        validate_spec(spec, &Path::new("spec"), !is_static, &mut errs);
    }
    if !is_static && manifest_uid.is_none() {
        errs.required(&Path::new("metadata").child("uid"), "pods from the API server have a UID");
    }
    if !errs.0.is_empty() {
        return Err(fail(errs.0));
    }

    let source_annotation = source.annotation();
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), source_annotation.into());
    if is_static {
        annotations.insert(CONFIG_HASH_ANNOTATION.into(), uid.clone());
        if let Some(name) = pod.metadata.name.as_mut() {
            *name = static_pod_name(name, node_name);
        }
        pod.metadata.uid = Some(uid);
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(node_name.to_owned());
            if matches!(source, PodSource::File(_)) {
                add_no_execute_toleration(spec);
            }
        }
        // What the manifest says about status is not ours to run; status is reported, not desired.
        pod.status = None;
    }
    Ok(DesiredPod { pod, source })
}

/// A static pod's name on this node: `<name>-<lowercased node name>`.
pub fn static_pod_name(name: &str, node_name: &str) -> String {
    if node_name.is_empty() { name.to_owned() } else { format!("{name}-{}", node_name.to_lowercase()) }
}

/// The kubelet lets file pods tolerate every `NoExecute` taint, so node problems do not evict them.
fn add_no_execute_toleration(spec: &mut PodSpec) {
    let toleration = Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Toleration::default()
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations.contains(&toleration) {
        tolerations.push(toleration);
    }
}

// ===== defaults =====

fn apply_spec_defaults(spec: &mut PodSpec) {
    set_if_empty(&mut spec.restart_policy, "Always");
    set_if_empty(&mut spec.dns_policy, "ClusterFirst");
    set_if_empty(&mut spec.scheduler_name, DEFAULT_SCHEDULER_NAME);
    spec.termination_grace_period_seconds.get_or_insert(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    spec.enable_service_links.get_or_insert(true);
    spec.security_context.get_or_insert_with(Default::default);
    if spec.priority.is_none() {
        spec.priority = Some(match spec.priority_class_name.as_deref() {
            Some("system-node-critical") => SYSTEM_NODE_CRITICAL_PRIORITY,
            Some("system-cluster-critical") => SYSTEM_CLUSTER_CRITICAL_PRIORITY,
            _ => 0,
        });
    }
    let host_network = spec.host_network.unwrap_or(false);
    for container in spec.init_containers.iter_mut().flatten().chain(spec.containers.iter_mut()) {
        apply_container_defaults(container, host_network);
    }
    for container in spec.ephemeral_containers.iter_mut().flatten() {
        apply_ephemeral_defaults(container, host_network);
    }
}

fn set_if_empty(field: &mut Option<String>, value: &str) {
    if field.as_deref().is_none_or(str::is_empty) {
        *field = Some(value.to_owned());
    }
}

fn apply_container_defaults(container: &mut Container, host_network: bool) {
    if container.image_pull_policy.as_deref().is_none_or(str::is_empty) {
        let policy = default_pull_policy(container.image.as_deref().unwrap_or_default());
        container.image_pull_policy = Some(policy.to_owned());
    }
    set_if_empty(&mut container.termination_message_path, DEFAULT_TERMINATION_MESSAGE_PATH);
    set_if_empty(&mut container.termination_message_policy, "File");
    for port in container.ports.iter_mut().flatten() {
        set_if_empty(&mut port.protocol, "TCP");
        if host_network && port.host_port.unwrap_or(0) == 0 {
            port.host_port = Some(port.container_port);
        }
    }
    for probe in [&mut container.liveness_probe, &mut container.readiness_probe, &mut container.startup_probe]
        .into_iter()
        .flatten()
    {
        apply_probe_defaults(probe);
    }
    if let Some(resources) = container.resources.as_mut() {
        apply_resource_defaults(resources);
    }
}

/// Zero counts as unset for these fields, as in the API (they are plain integers there).
fn apply_probe_defaults(probe: &mut Probe) {
    for (field, default) in [
        (&mut probe.timeout_seconds, 1),
        (&mut probe.period_seconds, 10),
        (&mut probe.success_threshold, 1),
        (&mut probe.failure_threshold, 3),
    ] {
        if field.unwrap_or(0) == 0 {
            *field = Some(default);
        }
    }
    if let Some(http) = probe.http_get.as_mut() {
        set_if_empty(&mut http.path, "/");
        set_if_empty(&mut http.scheme, "HTTP");
    }
}

/// A limit without a request makes the request equal to the limit.
fn apply_resource_defaults(resources: &mut ResourceRequirements) {
    let Some(limits) = resources.limits.as_ref().filter(|l| !l.is_empty()) else {
        return;
    };
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    for (name, quantity) in limits {
        requests.entry(name.clone()).or_insert_with(|| quantity.clone());
    }
}

// ===== validation helpers =====

/// A field path under construction.
#[derive(Debug, Clone)]
struct Path(String);

impl Path {
    fn new(root: &str) -> Self {
        Path(root.to_owned())
    }
    fn child(&self, name: &str) -> Self {
        Path(format!("{}.{name}", self.0))
    }
    fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }
    fn key(&self, key: &str) -> Self {
        Path(format!("{}[{key}]", self.0))
    }
}

#[derive(Debug, Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: &Path, kind: FieldErrorKind, value: Option<String>, detail: impl Into<String>) {
        self.0.push(FieldError { path: path.0.clone(), kind, value, detail: detail.into() });
    }
    fn required(&mut self, path: &Path, detail: &str) {
        self.push(path, FieldErrorKind::Required, None, detail);
    }
    fn invalid_str(&mut self, path: &Path, value: &str, detail: impl Into<String>) {
        self.push(path, FieldErrorKind::Invalid, Some(format!("{value:?}")), detail);
    }
    fn invalid_num(&mut self, path: &Path, value: i64, detail: impl Into<String>) {
        self.push(path, FieldErrorKind::Invalid, Some(value.to_string()), detail);
    }
    fn forbidden(&mut self, path: &Path, detail: impl Into<String>) {
        self.push(path, FieldErrorKind::Forbidden, None, detail);
    }
    fn duplicate(&mut self, path: &Path, value: &str) {
        self.push(path, FieldErrorKind::Duplicate, Some(format!("{value:?}")), "");
    }
    fn not_found(&mut self, path: &Path, value: &str) {
        self.push(path, FieldErrorKind::NotFound, Some(format!("{value:?}")), "");
    }
    /// `value` must be one of `supported`.
    fn one_of(&mut self, path: &Path, value: &str, supported: &[&str]) {
        if !supported.contains(&value) {
            let list = supported.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
            self.push(
                path,
                FieldErrorKind::NotSupported,
                Some(format!("{value:?}")),
                format!("supported values: {list}"),
            );
        }
    }
    /// Reports a name check's messages.
    fn check_name(&mut self, path: &Path, value: &str, problems: Vec<String>) {
        for problem in problems {
            self.invalid_str(path, value, problem);
        }
    }
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

const LABEL_FMT: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters \
    or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex \
    used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN_FMT: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
    characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex \
    used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn label_shape_ok(s: &str) -> bool {
    crate::common::names::has_label_shape(s)
}

/// DNS-1123 label problems of `s` (empty when valid).
fn dns1123_label(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > MAX_LABEL_LEN {
        problems.push(format!("must be no more than {MAX_LABEL_LEN} characters"));
    }
    if !label_shape_ok(s) {
        problems.push(LABEL_FMT.into());
    }
    problems
}

/// DNS-1123 subdomain problems of `s` (empty when valid).
fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > MAX_SUBDOMAIN_LEN {
        problems.push(format!("must be no more than {MAX_SUBDOMAIN_LEN} characters"));
    }
    if !s.split('.').all(label_shape_ok) {
        problems.push(SUBDOMAIN_FMT.into());
    }
    problems
}

/// IANA service name problems (port names): at most 15 characters, lowercase letters, digits and
/// `-`, at least one letter, no `--`, no `-` at either end.
fn iana_svc_name(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > MAX_PORT_NAME_LEN {
        problems.push(format!("must be no more than {MAX_PORT_NAME_LEN} characters"));
    }
    if !s.bytes().all(|c| is_alnum_lower(c) || c == b'-') {
        problems.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if s.contains("--") {
        problems.push("must not contain consecutive hyphens".into());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        problems.push("must contain at least one letter (a-z)".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        problems.push("must not begin or end with a hyphen".into());
    }
    problems
}

/// Qualified-name problems (label and annotation keys): an optional DNS subdomain prefix and `/`,
/// then a name of at most 63 characters of `[A-Za-z0-9_.-]` starting and ending alphanumeric.
fn qualified_name(s: &str) -> Vec<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    let mut problems = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            problems.push("prefix part must be non-empty".into());
        } else {
            problems.extend(dns1123_subdomain(prefix).into_iter().map(|p| format!("prefix part {p}")));
        }
    }
    if name.is_empty() {
        problems.push("name part must be non-empty".into());
    } else {
        if name.len() > MAX_LABEL_LEN {
            problems.push(format!("name part must be no more than {MAX_LABEL_LEN} characters"));
        }
        if !label_value_shape_ok(name) {
            problems.push(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
                 end with an alphanumeric character"
                    .into(),
            );
        }
    }
    problems
}

fn label_value_shape_ok(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => true,
    }
}

fn label_value(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > MAX_LABEL_LEN {
        problems.push(format!("must be no more than {MAX_LABEL_LEN} characters"));
    }
    if !label_value_shape_ok(s) {
        problems.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
                .into(),
        );
    }
    problems
}

/// Environment variable names: any printable ASCII but `=` (the API's relaxed rule, GA in 1.34).
fn env_var_name(s: &str) -> Vec<String> {
    if s.bytes().all(|c| (b' '..=b'~').contains(&c) && c != b'=') {
        Vec::new()
    } else {
        vec!["a valid environment variable name must consist only of printable ASCII characters other than '='".into()]
    }
}

/// A path inside a volume: relative, with no `..` element.
fn check_relative_path(errs: &mut Errors, path: &Path, value: &str) {
    if value.starts_with('/') {
        errs.invalid_str(path, value, "must be a relative path");
    }
    if value.split('/').any(|element| element == "..") {
        errs.invalid_str(path, value, "must not contain '..'");
    }
}

fn check_non_negative(errs: &mut Errors, path: &Path, value: Option<i64>) {
    if let Some(v) = value.filter(|v| *v < 0) {
        errs.invalid_num(path, v, "must be greater than or equal to 0");
    }
}

fn check_port_number(errs: &mut Errors, path: &Path, port: i64) {
    if !(1..=65535).contains(&port) {
        errs.invalid_num(path, port, "must be between 1 and 65535, inclusive");
    }
}

fn check_mode(errs: &mut Errors, path: &Path, mode: Option<i32>) {
    if let Some(mode) = mode.filter(|m| !(0..=0o777).contains(m)) {
        errs.invalid_num(
            path,
            i64::from(mode),
            "must be a number between 0 and 0777 (octal), both inclusive",
        );
    }
}

// ===== metadata =====

fn validate_metadata(pod: &Pod, is_static: bool, node_name: &str, errs: &mut Errors) {
    let meta = Path::new("metadata");
    match pod.metadata.name.as_deref().filter(|n| !n.is_empty()) {
        None => errs.required(&meta.child("name"), "name or generateName is required"),
        Some(name) => {
            errs.check_name(&meta.child("name"), name, dns1123_subdomain(name));
            if is_static {
                let full = static_pod_name(name, node_name);
                if full.len() > MAX_SUBDOMAIN_LEN && name.len() <= MAX_SUBDOMAIN_LEN {
                    errs.push(
                        &meta.child("name"),
                        FieldErrorKind::TooLong,
                        None,
                        format!(
                            "with the node-name suffix the name {full:?} would be longer than \
                             {MAX_SUBDOMAIN_LEN} characters"
                        ),
                    );
                }
            }
        }
    }
    if let Some(ns) = pod.metadata.namespace.as_deref() {
        errs.check_name(&meta.child("namespace"), ns, dns1123_label(ns));
    }
    if let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty())
        && (uid.len() > MAX_UID_LEN || !uid.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'))
    {
        errs.invalid_str(
            &meta.child("uid"),
            uid,
            format!("must consist of at most {MAX_UID_LEN} alphanumeric characters or '-'"),
        );
    }
    for (key, value) in pod.metadata.labels.iter().flatten() {
        let path = meta.child("labels");
        errs.check_name(&path, key, qualified_name(key));
        errs.check_name(&path, value, label_value(value));
    }
    let mut total = 0;
    for (key, value) in pod.metadata.annotations.iter().flatten() {
        errs.check_name(&meta.child("annotations"), key, qualified_name(&key.to_lowercase()));
        total += key.len() + value.len();
    }
    if total > MAX_ANNOTATIONS_BYTES {
        errs.push(
            &meta.child("annotations"),
            FieldErrorKind::TooLong,
            None,
            format!("may not be more than {MAX_ANNOTATIONS_BYTES} bytes"),
        );
    }
}

// ===== spec =====

fn validate_spec(spec: &PodSpec, path: &Path, allow_ephemeral: bool, errs: &mut Errors) {
    // Volumes first: mounts refer to them.
    let volume_names =
        validate_volumes(spec.volumes.as_deref().unwrap_or_default(), &path.child("volumes"), errs);

    if spec.containers.is_empty() {
        errs.required(&path.child("containers"), "");
    }
    let mut container_names = HashSet::new();
    let host_network = spec.host_network.unwrap_or(false);
    let mut host_ports = HashSet::new();
    let init_path = path.child("initContainers");
    for (i, container) in spec.init_containers.iter().flatten().enumerate() {
        let p = init_path.index(i);
        validate_container(container, &p, ContainerRole::Init, &volume_names, host_network, errs);
        check_unique_name(&container.name, &p, &mut container_names, errs);
        check_host_ports(container, &p, &mut host_ports, errs);
    }
    let app_path = path.child("containers");
    for (i, container) in spec.containers.iter().enumerate() {
        let p = app_path.index(i);
        validate_container(container, &p, ContainerRole::App, &volume_names, host_network, errs);
        check_unique_name(&container.name, &p, &mut container_names, errs);
        check_host_ports(container, &p, &mut host_ports, errs);
    }
    if allow_ephemeral {
        validate_ephemeral_containers(spec, path, &volume_names, errs);
    } else if spec.ephemeral_containers.as_ref().is_some_and(|e| !e.is_empty()) {
        errs.forbidden(&path.child("ephemeralContainers"), "cannot be set on create");
    }

    if let Some(policy) = spec.restart_policy.as_deref() {
        errs.one_of(&path.child("restartPolicy"), policy, &["Always", "OnFailure", "Never"]);
    }
    if let Some(policy) = spec.dns_policy.as_deref() {
        errs.one_of(
            &path.child("dnsPolicy"),
            policy,
            &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        );
        validate_dns_config(spec, policy, path, errs);
    }
    check_non_negative(
        errs,
        &path.child("terminationGracePeriodSeconds"),
        spec.termination_grace_period_seconds,
    );
    if let Some(deadline) = spec.active_deadline_seconds.filter(|d| *d < 1) {
        errs.invalid_num(
            &path.child("activeDeadlineSeconds"),
            deadline,
            "must be between 1 and 2147483647, inclusive",
        );
    }
    for (field, value) in [("hostname", &spec.hostname), ("subdomain", &spec.subdomain)] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            errs.check_name(&path.child(field), v, dns1123_label(v));
        }
    }
    for (field, value) in [
        ("serviceAccountName", &spec.service_account_name),
        ("priorityClassName", &spec.priority_class_name),
        ("runtimeClassName", &spec.runtime_class_name),
        ("schedulerName", &spec.scheduler_name),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            errs.check_name(&path.child(field), v, dns1123_subdomain(v));
        }
    }
    // The API server's `validateHostUsers`: a pod in its own user namespace shares none of the host's
    // (its field names, capitals included).
    if spec.host_users == Some(false) {
        for (field, on) in [
            ("hostNetwork", spec.host_network == Some(true)),
            ("HostPID", spec.host_pid == Some(true)),
            ("HostIPC", spec.host_ipc == Some(true)),
        ] {
            if on {
                errs.forbidden(&path.child(field), "when `pod.Spec.HostUsers` is false");
            }
        }
    }
    if spec.share_process_namespace == Some(true) && spec.host_pid == Some(true) {
        errs.invalid_str(
            &path.child("shareProcessNamespace"),
            "true",
            "ShareProcessNamespace and HostPID cannot both be enabled",
        );
    }
    for (key, value) in spec.node_selector.iter().flatten() {
        let p = path.child("nodeSelector");
        errs.check_name(&p, key, qualified_name(key));
        errs.check_name(&p, value, label_value(value));
    }
    for (i, toleration) in spec.tolerations.iter().flatten().enumerate() {
        validate_toleration(toleration, &path.child("tolerations").index(i), errs);
    }
    for (i, alias) in spec.host_aliases.iter().flatten().enumerate() {
        let p = path.child("hostAliases").index(i);
        match alias.ip.parse::<IpAddr>() {
            Ok(_) => {}
            Err(_) => errs.invalid_str(&p.child("ip"), &alias.ip, "must be a valid IP address"),
        }
        for (j, hostname) in alias.hostnames.iter().flatten().enumerate() {
            errs.check_name(&p.child("hostnames").index(j), hostname, dns1123_subdomain(hostname));
        }
    }
    for (name, quantity) in spec.overhead.iter().flatten() {
        check_quantity(errs, &path.child("overhead").key(name), quantity);
    }
}

/// `spec.ephemeralContainers`, as the API server validates them (`validateEphemeralContainers`):
/// a container's fields, unique names among all the pod's containers, a `targetContainerName` that
/// names an init or app container; and nothing that makes a container part of the pod's service
/// (ports, probes, lifecycle hooks, resources, restart policy) nor sub-path mounts.
fn validate_ephemeral_containers(spec: &PodSpec, path: &Path, volumes: &HashSet<String>, errs: &mut Errors) {
    let mut names: HashSet<String> =
        spec.init_containers.iter().flatten().chain(&spec.containers).map(|c| c.name.clone()).collect();
    let targets = names.clone();
    let host_network = spec.host_network.unwrap_or(false);
    let list = path.child("ephemeralContainers");
    for (i, ec) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let p = list.index(i);
        let mut c = ephemeral_as_container(ec);
        const WHY: &str = "cannot be set for an Ephemeral Container";
        for (field, set) in [
            ("ports", c.ports.take().is_some_and(|v| !v.is_empty())),
            ("lifecycle", c.lifecycle.take().is_some()),
            ("livenessProbe", c.liveness_probe.take().is_some()),
            ("readinessProbe", c.readiness_probe.take().is_some()),
            ("startupProbe", c.startup_probe.take().is_some()),
            ("resources", c.resources.take().is_some_and(|r| r != ResourceRequirements::default())),
            ("resizePolicy", c.resize_policy.take().is_some_and(|v| !v.is_empty())),
            ("restartPolicy", c.restart_policy.take().is_some()),
            ("restartPolicyRules", c.restart_policy_rules.take().is_some_and(|v| !v.is_empty())),
            ("volumeDevices", c.volume_devices.take().is_some_and(|v| !v.is_empty())),
        ] {
            if set {
                errs.forbidden(&p.child(field), WHY);
            }
        }
        for (j, mount) in c.volume_mounts.iter().flatten().enumerate() {
            let mp = p.child("volumeMounts").index(j);
            if mount.sub_path.as_deref().is_some_and(|s| !s.is_empty()) {
                errs.forbidden(&mp.child("subPath"), WHY);
            }
            if mount.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty()) {
                errs.forbidden(&mp.child("subPathExpr"), WHY);
            }
        }
        validate_container(&c, &p, ContainerRole::App, volumes, host_network, errs);
        check_unique_name(&c.name, &p, &mut names, errs);
        if let Some(target) = ec.target_container_name.as_deref().filter(|t| !t.is_empty())
            && !targets.contains(target)
        {
            errs.not_found(&p.child("targetContainerName"), target);
        }
    }
}

/// Adds `containers` to a prepared static pod's ephemeral containers (what `nodelet debug` asked
/// for), defaulted and validated as the API server's `ephemeralcontainers` subresource would. The
/// pod keeps its name and UID.
pub fn add_ephemeral_containers(
    pod: &DesiredPod,
    containers: Vec<EphemeralContainer>,
) -> Result<DesiredPod, ValidationError> {
    let mut pod = pod.clone();
    let object = ObjectRef { namespace: pod.namespace().to_owned(), name: Some(pod.name().to_owned()) };
    let Some(spec) = pod.pod.spec.as_mut() else {
        return Err(ValidationError {
            object,
            errors: vec![FieldError {
                path: "spec".into(),
                kind: FieldErrorKind::Required,
                value: None,
                detail: String::new(),
            }],
        });
    };
    let host_network = spec.host_network.unwrap_or(false);
    let mut added = containers;
    for ec in &mut added {
        apply_ephemeral_defaults(ec, host_network);
    }
    spec.ephemeral_containers.get_or_insert_with(Vec::new).extend(added);
    let volume_names: HashSet<String> = spec.volumes.iter().flatten().map(|v| v.name.clone()).collect();
    let mut errs = Errors::default();
    validate_ephemeral_containers(spec, &Path::new("spec"), &volume_names, &mut errs);
    if !errs.0.is_empty() {
        return Err(ValidationError { object, errors: errs.0 });
    }
    Ok(pod)
}

/// The container defaults, on an ephemeral container's common fields.
fn apply_ephemeral_defaults(ec: &mut EphemeralContainer, host_network: bool) {
    let mut c = ephemeral_as_container(ec);
    apply_container_defaults(&mut c, host_network);
    ec.image_pull_policy = c.image_pull_policy;
    ec.termination_message_path = c.termination_message_path;
    ec.termination_message_policy = c.termination_message_policy;
}

fn check_unique_name(name: &str, path: &Path, seen: &mut HashSet<String>, errs: &mut Errors) {
    if !name.is_empty() && !seen.insert(name.to_owned()) {
        errs.duplicate(&path.child("name"), name);
    }
}

/// Two containers may not ask for the same host port, protocol and host IP.
fn check_host_ports(
    container: &Container,
    path: &Path,
    seen: &mut HashSet<(i32, String, String)>,
    errs: &mut Errors,
) {
    for (i, port) in container.ports.iter().flatten().enumerate() {
        let Some(host_port) = port.host_port.filter(|p| *p != 0) else { continue };
        let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
        let host_ip = port.host_ip.clone().unwrap_or_default();
        if !seen.insert((host_port, protocol.clone(), host_ip)) {
            errs.duplicate(
                &path.child("ports").index(i).child("hostPort"),
                &format!("{host_port}/{protocol}"),
            );
        }
    }
}

fn validate_dns_config(spec: &PodSpec, policy: &str, path: &Path, errs: &mut Errors) {
    let p = path.child("dnsConfig");
    let config = spec.dns_config.as_ref();
    let nameservers = config.and_then(|c| c.nameservers.as_deref()).unwrap_or_default();
    if policy == "None" && nameservers.is_empty() {
        errs.required(
            &p.child("nameservers"),
            "must provide at least one DNS nameserver when `dnsPolicy` is None",
        );
    }
    if nameservers.len() > 3 {
        errs.push(
            &p.child("nameservers"),
            FieldErrorKind::Invalid,
            None,
            "must not have more than 3 nameservers",
        );
    }
    for (i, ns) in nameservers.iter().enumerate() {
        if ns.parse::<IpAddr>().is_err() {
            errs.invalid_str(&p.child("nameservers").index(i), ns, "must be a valid IP address");
        }
    }
    let searches = config.and_then(|c| c.searches.as_deref()).unwrap_or_default();
    if searches.len() > 32 {
        errs.push(
            &p.child("searches"),
            FieldErrorKind::Invalid,
            None,
            "must not have more than 32 search paths",
        );
    }
    for (i, search) in searches.iter().enumerate() {
        let trimmed = search.strip_suffix('.').unwrap_or(search);
        errs.check_name(&p.child("searches").index(i), search, dns1123_subdomain(trimmed));
    }
    for (i, option) in config.and_then(|c| c.options.as_deref()).unwrap_or_default().iter().enumerate() {
        if option.name.as_deref().is_none_or(str::is_empty) {
            errs.required(&p.child("options").index(i).child("name"), "");
        }
    }
}

fn validate_toleration(toleration: &Toleration, path: &Path, errs: &mut Errors) {
    if let Some(key) = toleration.key.as_deref().filter(|k| !k.is_empty()) {
        errs.check_name(&path.child("key"), key, qualified_name(key));
    }
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    errs.one_of(&path.child("operator"), operator, &["Equal", "Exists"]);
    if operator == "Exists" && toleration.value.as_deref().is_some_and(|v| !v.is_empty()) {
        errs.invalid_str(
            &path.child("value"),
            toleration.value.as_deref().unwrap_or_default(),
            "value must be empty when `operator` is 'Exists'",
        );
    }
    if operator == "Equal" && toleration.key.as_deref().is_none_or(str::is_empty) {
        errs.invalid_str(&path.child("operator"), operator, "operator must be Exists when `key` is empty");
    }
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty()) {
        errs.one_of(&path.child("effect"), effect, &["NoSchedule", "PreferNoSchedule", "NoExecute"]);
    }
}

// ===== volumes =====

fn validate_volumes(volumes: &[Volume], path: &Path, errs: &mut Errors) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, volume) in volumes.iter().enumerate() {
        let p = path.index(i);
        if volume.name.is_empty() {
            errs.required(&p.child("name"), "");
        } else {
            errs.check_name(&p.child("name"), &volume.name, dns1123_label(&volume.name));
            if !names.insert(volume.name.clone()) {
                errs.duplicate(&p.child("name"), &volume.name);
            }
        }
        // Count the volume sources through the serialized form: every set source is a key.
        let sources = match serde_json::to_value(volume) {
            Ok(serde_json::Value::Object(map)) => map.keys().filter(|k| *k != "name").count(),
            _ => 1,
        };
        match sources {
            0 => errs.required(&p, "must specify a volume type"),
            1 => {}
            _ => errs.forbidden(&p, "may not specify more than 1 volume type"),
        }
        validate_volume_source(volume, &p, errs);
    }
    names
}

fn validate_volume_source(volume: &Volume, p: &Path, errs: &mut Errors) {
    if let Some(host_path) = &volume.host_path {
        let hp = p.child("hostPath");
        if host_path.path.is_empty() {
            errs.required(&hp.child("path"), "");
        } else if host_path.path.split('/').any(|e| e == "..") {
            errs.invalid_str(&hp.child("path"), &host_path.path, "must not contain '..'");
        }
        if let Some(kind) = host_path.type_.as_deref() {
            errs.one_of(
                &hp.child("type"),
                kind,
                &[
                    "",
                    "DirectoryOrCreate",
                    "Directory",
                    "FileOrCreate",
                    "File",
                    "Socket",
                    "CharDevice",
                    "BlockDevice",
                ],
            );
        }
    }
    if let Some(empty_dir) = &volume.empty_dir {
        let ep = p.child("emptyDir");
        if let Some(medium) = empty_dir.medium.as_deref()
            && !medium.starts_with("HugePages-")
        {
            errs.one_of(&ep.child("medium"), medium, &["", "Memory", "HugePages"]);
        }
        if let Some(limit) = &empty_dir.size_limit {
            check_quantity(errs, &ep.child("sizeLimit"), limit);
        }
    }
    if let Some(secret) = &volume.secret {
        let sp = p.child("secret");
        if secret.secret_name.as_deref().is_none_or(str::is_empty) {
            errs.required(&sp.child("secretName"), "");
        }
        check_mode(errs, &sp.child("defaultMode"), secret.default_mode);
        validate_items(secret.items.as_deref(), &sp.child("items"), errs);
    }
    if let Some(config_map) = &volume.config_map {
        let cp = p.child("configMap");
        if config_map.name.is_empty() {
            errs.required(&cp.child("name"), "");
        }
        check_mode(errs, &cp.child("defaultMode"), config_map.default_mode);
        validate_items(config_map.items.as_deref(), &cp.child("items"), errs);
    }
    if let Some(pvc) = &volume.persistent_volume_claim
        && pvc.claim_name.is_empty()
    {
        errs.required(&p.child("persistentVolumeClaim").child("claimName"), "");
    }
    if let Some(downward) = &volume.downward_api {
        let dp = p.child("downwardAPI");
        check_mode(errs, &dp.child("defaultMode"), downward.default_mode);
        for (i, item) in downward.items.iter().flatten().enumerate() {
            let ip = dp.child("items").index(i);
            if item.path.is_empty() {
                errs.required(&ip.child("path"), "");
            } else {
                check_relative_path(errs, &ip.child("path"), &item.path);
            }
            check_mode(errs, &ip.child("mode"), item.mode);
        }
    }
    if let Some(projected) = &volume.projected {
        let pp = p.child("projected");
        check_mode(errs, &pp.child("defaultMode"), projected.default_mode);
        for (i, source) in projected.sources.iter().flatten().enumerate() {
            let sp = pp.child("sources").index(i);
            if let Some(secret) = &source.secret {
                validate_items(secret.items.as_deref(), &sp.child("secret").child("items"), errs);
            }
            if let Some(config_map) = &source.config_map {
                validate_items(config_map.items.as_deref(), &sp.child("configMap").child("items"), errs);
            }
            if let Some(token) = &source.service_account_token {
                check_relative_path(errs, &sp.child("serviceAccountToken").child("path"), &token.path);
            }
        }
    }
}

fn validate_items(items: Option<&[KeyToPath]>, path: &Path, errs: &mut Errors) {
    for (i, item) in items.unwrap_or_default().iter().enumerate() {
        let p = path.index(i);
        if item.key.is_empty() {
            errs.required(&p.child("key"), "");
        }
        if item.path.is_empty() {
            errs.required(&p.child("path"), "");
        } else {
            check_relative_path(errs, &p.child("path"), &item.path);
        }
        check_mode(errs, &p.child("mode"), item.mode);
    }
}

// ===== containers =====

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContainerRole {
    Init,
    App,
}

fn validate_container(
    c: &Container,
    path: &Path,
    role: ContainerRole,
    volumes: &HashSet<String>,
    host_network: bool,
    errs: &mut Errors,
) {
    if c.name.is_empty() {
        errs.required(&path.child("name"), "");
    } else {
        errs.check_name(&path.child("name"), &c.name, dns1123_label(&c.name));
    }
    match c.image.as_deref() {
        None | Some("") => errs.required(&path.child("image"), ""),
        Some(image) if image.trim() != image => {
            errs.invalid_str(&path.child("image"), image, "must not have leading or trailing whitespace")
        }
        Some(image) if image.chars().any(char::is_control) => {
            errs.invalid_str(&path.child("image"), image, "must not contain control characters")
        }
        Some(_) => {}
    }
    if let Some(policy) = c.image_pull_policy.as_deref() {
        errs.one_of(&path.child("imagePullPolicy"), policy, &["Always", "IfNotPresent", "Never"]);
    }
    if let Some(policy) = c.termination_message_policy.as_deref() {
        errs.one_of(&path.child("terminationMessagePolicy"), policy, &["File", "FallbackToLogsOnError"]);
    }

    let sidecar = match (role, c.restart_policy.as_deref()) {
        (_, None) => false,
        (ContainerRole::Init, Some(policy)) => {
            errs.one_of(&path.child("restartPolicy"), policy, &["Always"]);
            policy == "Always"
        }
        (ContainerRole::App, Some(_)) => {
            errs.forbidden(&path.child("restartPolicy"), "may not be set for non-init containers");
            false
        }
    };
    if role == ContainerRole::Init && !sidecar {
        for (field, set) in [
            ("lifecycle", c.lifecycle.is_some()),
            ("livenessProbe", c.liveness_probe.is_some()),
            ("readinessProbe", c.readiness_probe.is_some()),
            ("startupProbe", c.startup_probe.is_some()),
        ] {
            if set {
                errs.forbidden(
                    &path.child(field),
                    "may not be set for init containers without restartPolicy=Always",
                );
            }
        }
    }

    validate_ports(c.ports.as_deref().unwrap_or_default(), &path.child("ports"), host_network, errs);
    validate_env(c.env.as_deref().unwrap_or_default(), &path.child("env"), errs);
    for (i, env_from) in c.env_from.iter().flatten().enumerate() {
        let p = path.child("envFrom").index(i);
        let sources =
            usize::from(env_from.config_map_ref.is_some()) + usize::from(env_from.secret_ref.is_some());
        if sources != 1 {
            errs.push(
                &p,
                FieldErrorKind::Invalid,
                None,
                "must specify exactly one of: `configMapRef` or `secretRef`",
            );
        }
        if let Some(prefix) = env_from.prefix.as_deref() {
            errs.check_name(&p.child("prefix"), prefix, env_var_name(prefix));
        }
    }
    validate_mounts(c, path, volumes, errs);
    if let Some(resources) = &c.resources {
        validate_resources(resources, &path.child("resources"), errs);
    }
    for (field, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(probe) = probe {
            validate_probe(probe, &path.child(field), field, errs);
        }
    }
    if let Some(lifecycle) = &c.lifecycle {
        let lp = path.child("lifecycle");
        for (field, handler) in [("postStart", &lifecycle.post_start), ("preStop", &lifecycle.pre_stop)] {
            if let Some(handler) = handler {
                validate_lifecycle_handler(handler, &lp.child(field), errs);
            }
        }
    }
}

fn validate_ports(ports: &[ContainerPort], path: &Path, host_network: bool, errs: &mut Errors) {
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = path.index(i);
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            errs.check_name(&p.child("name"), name, iana_svc_name(name));
            if !names.insert(name) {
                errs.duplicate(&p.child("name"), name);
            }
        }
        if port.container_port == 0 {
            errs.required(&p.child("containerPort"), "");
        } else {
            check_port_number(errs, &p.child("containerPort"), i64::from(port.container_port));
        }
        if let Some(host_port) = port.host_port.filter(|h| *h != 0) {
            check_port_number(errs, &p.child("hostPort"), i64::from(host_port));
            if host_network && host_port != port.container_port {
                errs.invalid_num(
                    &p.child("hostPort"),
                    i64::from(host_port),
                    "must match `containerPort` when `hostNetwork` is true",
                );
            }
        }
        if let Some(protocol) = port.protocol.as_deref() {
            errs.one_of(&p.child("protocol"), protocol, &["SCTP", "TCP", "UDP"]);
        }
        if let Some(ip) = port.host_ip.as_deref().filter(|ip| !ip.is_empty())
            && ip.parse::<IpAddr>().is_err()
        {
            errs.invalid_str(&p.child("hostIP"), ip, "must be a valid IP address");
        }
    }
}

fn validate_env(env: &[EnvVar], path: &Path, errs: &mut Errors) {
    for (i, var) in env.iter().enumerate() {
        let p = path.index(i);
        if var.name.is_empty() {
            errs.required(&p.child("name"), "");
        } else {
            errs.check_name(&p.child("name"), &var.name, env_var_name(&var.name));
        }
        let Some(from) = &var.value_from else { continue };
        if var.value.as_deref().is_some_and(|v| !v.is_empty()) {
            errs.push(
                &p.child("valueFrom"),
                FieldErrorKind::Invalid,
                None,
                "may not be specified when `value` is not empty",
            );
        }
        let sources = [
            from.field_ref.is_some(),
            from.resource_field_ref.is_some(),
            from.config_map_key_ref.is_some(),
            from.secret_key_ref.is_some(),
            from.file_key_ref.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count();
        match sources {
            0 => errs.push(
                &p.child("valueFrom"),
                FieldErrorKind::Invalid,
                None,
                "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef`, `secretKeyRef` or `fileKeyRef`",
            ),
            1 => {}
            _ => errs.push(
                &p.child("valueFrom"),
                FieldErrorKind::Invalid,
                None,
                "may not have more than one field specified at a time",
            ),
        }
        if let Some(field_ref) = &from.field_ref
            && field_ref.field_path.is_empty()
        {
            errs.required(&p.child("valueFrom").child("fieldRef").child("fieldPath"), "");
        }
        if let Some(key_ref) = &from.config_map_key_ref
            && key_ref.key.is_empty()
        {
            errs.required(&p.child("valueFrom").child("configMapKeyRef").child("key"), "");
        }
        if let Some(key_ref) = &from.secret_key_ref
            && key_ref.key.is_empty()
        {
            errs.required(&p.child("valueFrom").child("secretKeyRef").child("key"), "");
        }
    }
}

fn validate_mounts(c: &Container, path: &Path, volumes: &HashSet<String>, errs: &mut Errors) {
    let mut mount_paths = HashSet::new();
    for (i, mount) in c.volume_mounts.iter().flatten().enumerate() {
        let p = path.child("volumeMounts").index(i);
        if mount.name.is_empty() {
            errs.required(&p.child("name"), "");
        } else if !volumes.contains(&mount.name) {
            errs.not_found(&p.child("name"), &mount.name);
        }
        if mount.mount_path.is_empty() {
            errs.required(&p.child("mountPath"), "");
        } else if !mount_paths.insert(mount.mount_path.trim_end_matches('/').to_owned()) {
            errs.invalid_str(&p.child("mountPath"), &mount.mount_path, "must be unique");
        }
        if let Some(sub_path) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            check_relative_path(errs, &p.child("subPath"), sub_path);
            if mount.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty()) {
                errs.invalid_str(
                    &p.child("subPathExpr"),
                    sub_path,
                    "subPathExpr and subPath are mutually exclusive",
                );
            }
        }
        if let Some(expr) = mount.sub_path_expr.as_deref().filter(|s| !s.is_empty()) {
            check_relative_path(errs, &p.child("subPathExpr"), expr);
        }
        if let Some(propagation) = mount.mount_propagation.as_deref() {
            errs.one_of(
                &p.child("mountPropagation"),
                propagation,
                &["None", "HostToContainer", "Bidirectional"],
            );
            let privileged = c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
            if propagation == "Bidirectional" && !privileged {
                errs.forbidden(
                    &p.child("mountPropagation"),
                    "Bidirectional mount propagation is available only to privileged containers",
                );
            }
        }
    }
    for (i, device) in c.volume_devices.iter().flatten().enumerate() {
        let p = path.child("volumeDevices").index(i);
        if !volumes.contains(&device.name) {
            errs.not_found(&p.child("name"), &device.name);
        }
        if device.device_path.is_empty() {
            errs.required(&p.child("devicePath"), "");
        }
    }
}

/// Quantity syntax and sign.
fn check_quantity(errs: &mut Errors, path: &Path, quantity: &Quantity) -> Option<i128> {
    match parse_quantity(&quantity.0) {
        Ok(value) if value < 0 => {
            errs.invalid_str(path, &quantity.0, "must be greater than or equal to 0");
            None
        }
        Ok(value) => Some(value),
        Err(e) => {
            errs.invalid_str(path, &quantity.0, e.to_string());
            None
        }
    }
}

fn check_resource_name(errs: &mut Errors, path: &Path, name: &str) {
    if name.contains('/') {
        errs.check_name(path, name, qualified_name(name));
    } else if !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !name.starts_with("hugepages-") {
        errs.invalid_str(path, name, "must be a standard resource for containers");
    }
}

fn validate_resources(resources: &ResourceRequirements, path: &Path, errs: &mut Errors) {
    let mut limits = HashMap::new();
    for (name, quantity) in resources.limits.iter().flatten() {
        let p = path.child("limits").key(name);
        check_resource_name(errs, &p, name);
        if let Some(value) = check_quantity(errs, &p, quantity) {
            limits.insert(name.as_str(), (value, quantity));
        }
    }
    for (name, quantity) in resources.requests.iter().flatten() {
        let p = path.child("requests").key(name);
        check_resource_name(errs, &p, name);
        let Some(request) = check_quantity(errs, &p, quantity) else { continue };
        if let Some((limit, limit_quantity)) = limits.get(name.as_str()) {
            if request > *limit {
                errs.invalid_str(
                    &p,
                    &quantity.0,
                    format!("must be less than or equal to {name} limit of {}", limit_quantity.0),
                );
            } else if name.contains('/') && request != *limit {
                errs.invalid_str(
                    &p,
                    &quantity.0,
                    format!("must be equal to {name} limit of {}", limit_quantity.0),
                );
            }
        } else if name.contains('/') {
            errs.forbidden(&p, "extended resources must have a limit");
        }
    }
}

fn validate_probe(probe: &Probe, path: &Path, kind: &str, errs: &mut Errors) {
    let handlers = usize::from(probe.exec.is_some())
        + usize::from(probe.http_get.is_some())
        + usize::from(probe.tcp_socket.is_some())
        + usize::from(probe.grpc.is_some());
    match handlers {
        0 => errs.required(path, "must specify a handler type"),
        1 => {}
        _ => errs.forbidden(path, "may not specify more than 1 handler type"),
    }
    for (field, value) in [
        ("initialDelaySeconds", probe.initial_delay_seconds),
        ("timeoutSeconds", probe.timeout_seconds),
        ("periodSeconds", probe.period_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ] {
        check_non_negative(errs, &path.child(field), value.map(i64::from));
    }
    if kind != "readinessProbe"
        && let Some(threshold) = probe.success_threshold.filter(|t| *t != 1)
    {
        errs.invalid_num(&path.child("successThreshold"), i64::from(threshold), "must be 1");
    }
    if let Some(grace) = probe.termination_grace_period_seconds {
        if kind == "readinessProbe" {
            errs.invalid_num(
                &path.child("terminationGracePeriodSeconds"),
                grace,
                "must not be set for readinessProbes",
            );
        } else if grace <= 0 {
            errs.invalid_num(&path.child("terminationGracePeriodSeconds"), grace, "must be greater than 0");
        }
    }
    if let Some(exec) = &probe.exec
        && exec.command.as_ref().is_none_or(Vec::is_empty)
    {
        errs.required(&path.child("exec").child("command"), "");
    }
    if let Some(http) = &probe.http_get {
        validate_http_get(http, &path.child("httpGet"), errs);
    }
    if let Some(tcp) = &probe.tcp_socket {
        check_named_or_number_port(errs, &path.child("tcpSocket").child("port"), &tcp.port);
    }
    if let Some(grpc) = &probe.grpc {
        check_port_number(errs, &path.child("grpc").child("port"), i64::from(grpc.port));
    }
}

fn validate_http_get(http: &k8s_openapi::api::core::v1::HTTPGetAction, path: &Path, errs: &mut Errors) {
    check_named_or_number_port(errs, &path.child("port"), &http.port);
    if let Some(scheme) = http.scheme.as_deref() {
        errs.one_of(&path.child("scheme"), scheme, &["HTTP", "HTTPS"]);
    }
    for (i, header) in http.http_headers.iter().flatten().enumerate() {
        let valid = !header.name.is_empty()
            && header.name.bytes().all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
        if !valid {
            errs.invalid_str(
                &path.child("httpHeaders").index(i).child("name"),
                &header.name,
                "a valid HTTP header must consist of alphanumeric characters or '-'",
            );
        }
    }
}

fn check_named_or_number_port(errs: &mut Errors, path: &Path, port: &IntOrString) {
    match port {
        IntOrString::Int(n) => check_port_number(errs, path, i64::from(*n)),
        IntOrString::String(name) => errs.check_name(path, name, iana_svc_name(name)),
    }
}

fn validate_lifecycle_handler(handler: &LifecycleHandler, path: &Path, errs: &mut Errors) {
    let handlers = usize::from(handler.exec.is_some())
        + usize::from(handler.http_get.is_some())
        + usize::from(handler.tcp_socket.is_some())
        + usize::from(handler.sleep.is_some());
    match handlers {
        0 => errs.required(path, "must specify a handler type"),
        1 => {}
        _ => errs.forbidden(path, "may not specify more than 1 handler type"),
    }
    if handler.tcp_socket.is_some() {
        errs.forbidden(&path.child("tcpSocket"), "tcpSocket is not supported for lifecycle hooks");
    }
    if let Some(exec) = &handler.exec
        && exec.command.as_ref().is_none_or(Vec::is_empty)
    {
        errs.required(&path.child("exec").child("command"), "");
    }
    if let Some(http) = &handler.http_get {
        validate_http_get(http, &path.child("httpGet"), errs);
    }
    if let Some(sleep) = &handler.sleep {
        check_non_negative(errs, &path.child("sleep").child("seconds"), Some(sleep.seconds));
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::{Value, json};

    use super::*;

    const NODE: &str = "Node-1";

    fn web() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]}
        })
    }

    fn file_source() -> PodSource {
        PodSource::File(PathBuf::from("/etc/nodelet/manifests/web.yaml"))
    }

    /// Merges `extra` into the object at `pointer` of `doc` (creating nothing: the object must exist).
    fn merge(mut doc: Value, pointer: &str, extra: Value) -> Value {
        let target = doc.pointer_mut(pointer).expect("pointer exists in test document");
        let (Value::Object(target), Value::Object(extra)) = (target, extra) else {
            panic!("both must be objects")
        };
        target.extend(extra);
        doc
    }

    fn with_spec(extra: Value) -> Value {
        merge(web(), "/spec", extra)
    }

    fn with_container(extra: Value) -> Value {
        merge(web(), "/spec/containers/0", extra)
    }

    fn ok(doc: Value) -> DesiredPod {
        match prepare_value(doc, file_source(), NODE) {
            Ok(pod) => pod,
            Err(e) => panic!("expected a valid pod, got {e}"),
        }
    }

    fn errors(doc: Value) -> Vec<String> {
        match prepare_value(doc, file_source(), NODE) {
            Ok(pod) => panic!("expected errors, got a valid pod {}", pod.name()),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[track_caller]
    fn assert_error(doc: Value, expected: &str) {
        let errors = errors(doc);
        assert!(errors.iter().any(|e| e == expected), "expected {expected:?} among {errors:#?}");
    }

    #[track_caller]
    fn assert_error_starts(doc: Value, expected: &str) {
        let errors = errors(doc);
        assert!(errors.iter().any(|e| e.starts_with(expected)), "expected {expected:?}... among {errors:#?}");
    }

    fn container(pod: &DesiredPod) -> &Container {
        &pod.containers()[0]
    }

    // ===== defaults =====

    #[test]
    fn pod_level_defaults_are_applied() {
        let pod = ok(merge(web(), "/metadata", json!({"namespace": null})));
        let spec = pod.spec();
        assert_eq!(pod.namespace(), "default");
        assert_eq!(pod.pod.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(spec.enable_service_links, Some(true));
        assert_eq!(spec.priority, Some(0));
        assert!(spec.security_context.is_some());
    }

    #[test]
    fn explicit_values_are_kept() {
        let pod = ok(with_spec(json!({
            "restartPolicy": "Never",
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": false,
            "schedulerName": "mine",
        })));
        let spec = pod.spec();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
        assert_eq!(spec.termination_grace_period_seconds, Some(0));
        assert_eq!(spec.enable_service_links, Some(false));
        assert_eq!(spec.scheduler_name.as_deref(), Some("mine"));
        assert_eq!(pod.restart_policy(), crate::model::pod::RestartPolicy::Never);
    }

    #[test]
    fn critical_priority_classes_get_their_priority() {
        let node = ok(with_spec(json!({"priorityClassName": "system-node-critical"})));
        assert_eq!(node.spec().priority, Some(SYSTEM_NODE_CRITICAL_PRIORITY));
        let cluster = ok(with_spec(json!({"priorityClassName": "system-cluster-critical"})));
        assert_eq!(cluster.spec().priority, Some(SYSTEM_CLUSTER_CRITICAL_PRIORITY));
        let other = ok(with_spec(json!({"priorityClassName": "high"})));
        assert_eq!(other.spec().priority, Some(0));
        let explicit = ok(with_spec(json!({"priority": 7})));
        assert_eq!(explicit.spec().priority, Some(7));
    }

    #[test]
    fn container_defaults_are_applied() {
        let pod = ok(with_container(
            json!({"ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}]}),
        ));
        let c = container(&pod);
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(c.termination_message_path.as_deref(), Some("/dev/termination-log"));
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        let ports = c.ports.as_deref().unwrap_or_default();
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[1].protocol.as_deref(), Some("UDP"));
        assert_eq!(ports[0].host_port, None, "no host port without hostNetwork");
    }

    #[test]
    fn init_containers_get_defaults_too() {
        let pod = ok(with_spec(json!({"initContainers": [{"name": "init", "image": "busybox"}]})));
        let init = &pod.init_containers()[0];
        assert_eq!(init.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(init.termination_message_policy.as_deref(), Some("File"));
    }

    #[test]
    fn pull_policy_follows_the_tag() {
        for (image, policy) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.25", "IfNotPresent"),
            ("registry.local:5000/nginx", "Always"),
            ("registry.local:5000/nginx:1.25", "IfNotPresent"),
            ("registry.local:5000/team/nginx:latest", "Always"),
            ("nginx@sha256:0123456789abcdef", "IfNotPresent"),
            ("nginx:1.25@sha256:0123456789abcdef", "IfNotPresent"),
            ("nginx:latest@sha256:0123456789abcdef", "Always"),
        ] {
            assert_eq!(default_pull_policy(image), policy, "{image}");
            let pod = ok(with_container(json!({"image": image})));
            assert_eq!(container(&pod).image_pull_policy.as_deref(), Some(policy), "{image}");
        }
        let pod = ok(with_container(json!({"image": "nginx", "imagePullPolicy": "Never"})));
        assert_eq!(container(&pod).image_pull_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn host_network_ports_default_host_port_to_container_port() {
        let pod = ok(merge(
            with_spec(json!({"hostNetwork": true})),
            "/spec/containers/0",
            json!({"ports": [{"containerPort": 8080}]}),
        ));
        assert_eq!(container(&pod).ports.as_deref().unwrap_or_default()[0].host_port, Some(8080));
    }

    #[test]
    fn probe_defaults_are_applied_when_probes_are_present() {
        let pod = ok(with_container(json!({
            "livenessProbe": {"httpGet": {"port": 80}},
            "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 0, "failureThreshold": 5},
        })));
        let c = container(&pod);
        let live = c.liveness_probe.as_ref().expect("liveness probe kept");
        assert_eq!(
            (live.timeout_seconds, live.period_seconds, live.success_threshold, live.failure_threshold),
            (Some(1), Some(10), Some(1), Some(3))
        );
        let http = live.http_get.as_ref().expect("httpGet kept");
        assert_eq!((http.path.as_deref(), http.scheme.as_deref()), (Some("/"), Some("HTTP")));
        let ready = c.readiness_probe.as_ref().expect("readiness probe kept");
        assert_eq!((ready.period_seconds, ready.failure_threshold), (Some(10), Some(5)));
        assert!(c.startup_probe.is_none(), "no probe is invented");
    }

    #[test]
    fn limits_default_requests() {
        let pod = ok(with_container(json!({
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "100m"}}
        })));
        let requests =
            container(&pod).resources.as_ref().and_then(|r| r.requests.clone()).unwrap_or_default();
        assert_eq!(requests.get("cpu"), Some(&Quantity("100m".into())));
        assert_eq!(requests.get("memory"), Some(&Quantity("64Mi".into())));
    }

    // ===== static pods =====

    #[test]
    fn static_pods_get_name_suffix_uid_annotations_node_and_toleration() {
        let pod = ok(web());
        assert_eq!(pod.name(), "web-node-1");
        let uid = pod.uid().to_owned();
        assert_eq!(uid.len(), 32);
        assert!(uid.bytes().all(|b| b.is_ascii_hexdigit()));
        let annotations = pod.pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get(CONFIG_SOURCE_ANNOTATION).map(String::as_str), Some("file"));
        assert_eq!(annotations.get(CONFIG_HASH_ANNOTATION), Some(&uid));
        assert!(!annotations.contains_key(CONFIG_SEEN_ANNOTATION), "seen is the pod config's job");
        assert_eq!(pod.spec().node_name.as_deref(), Some(NODE));
        let tolerations = pod.spec().tolerations.clone().unwrap_or_default();
        assert!(tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.effect.as_deref() == Some("NoExecute")
            && t.key.is_none()));
        assert_eq!(pod.source, file_source());
    }

    #[test]
    fn static_uid_is_stable_for_the_same_manifest_and_changes_with_it() {
        let a = ok(web());
        let b = ok(web());
        assert_eq!(a.uid(), b.uid());
        assert_eq!(a, b, "preparing the same manifest twice gives equal desired pods");
        let changed = ok(with_container(json!({"image": "nginx:1.26"})));
        assert_ne!(a.uid(), changed.uid());
        let other_node = prepare_value(web(), file_source(), "node-2").expect("valid");
        assert_ne!(a.uid(), other_node.uid());
        let other_file = prepare_value(web(), PodSource::File("/other.yaml".into()), NODE).expect("valid");
        assert_ne!(a.uid(), other_file.uid());
    }

    #[test]
    fn url_and_http_pods_are_static_with_source_http() {
        for source in [PodSource::Url("http://127.0.0.1:1/pods".into()), PodSource::Http] {
            let pod = prepare_value(web(), source.clone(), NODE).expect("valid");
            assert_eq!(pod.name(), "web-node-1");
            let annotations = pod.pod.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(annotations.get(CONFIG_SOURCE_ANNOTATION).map(String::as_str), Some("http"));
            assert_eq!(annotations.get(CONFIG_HASH_ANNOTATION).map(String::as_str), Some(pod.uid()));
            assert!(pod.spec().tolerations.is_none(), "only file pods get the NoExecute toleration");
            assert_eq!(pod.source, source);
        }
    }

    #[test]
    fn a_static_manifest_uid_is_kept_and_must_be_safe() {
        let pod = ok(merge(web(), "/metadata", json!({"uid": "abc-123"})));
        assert_eq!(pod.uid(), "abc-123");
        assert_eq!(
            pod.pod
                .metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .get(CONFIG_HASH_ANNOTATION)
                .map(String::as_str),
            Some("abc-123")
        );
        assert_error_starts(
            merge(web(), "/metadata", json!({"uid": "../../etc"})),
            "metadata.uid: Invalid value: \"../../etc\"",
        );
    }

    #[test]
    fn api_pods_keep_name_and_uid() {
        let doc = merge(web(), "/metadata", json!({"uid": "0b1c4f2e-7d3a-4c55-9b8e-0f1e2d3c4b5a"}));
        let pod = prepare_value(doc, PodSource::Api, NODE).expect("valid");
        assert_eq!(pod.name(), "web");
        assert_eq!(pod.uid(), "0b1c4f2e-7d3a-4c55-9b8e-0f1e2d3c4b5a");
        let annotations = pod.pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get(CONFIG_SOURCE_ANNOTATION).map(String::as_str), Some("api"));
        assert!(!annotations.contains_key(CONFIG_HASH_ANNOTATION));
        let missing = prepare_value(web(), PodSource::Api, NODE).expect_err("no uid");
        assert_eq!(
            missing.to_string(),
            "pod \"default/web\": metadata.uid: Required value: pods from the API server have a UID"
        );
    }

    #[test]
    fn a_static_name_too_long_with_the_suffix_is_rejected() {
        let name = "a".repeat(250);
        assert_error_starts(merge(web(), "/metadata", json!({"name": name})), "metadata.name: Too long");
    }

    // ===== errors: shape =====

    #[test]
    fn errors_name_the_object_and_the_field_like_the_api_server() {
        let doc = with_container(json!({"image": null}));
        let error = prepare_value(doc, file_source(), NODE).expect_err("image missing");
        assert_eq!(error.to_string(), "pod \"default/web\": spec.containers[0].image: Required value");
        assert_eq!(error.object, ObjectRef { namespace: "default".into(), name: Some("web".into()) });
        assert_eq!(error.errors[0].kind, FieldErrorKind::Required);
        assert_eq!(error.errors[0].path, "spec.containers[0].image");
    }

    #[test]
    fn host_users_false_shares_no_host_namespace() {
        ok(with_spec(json!({"hostUsers": false})));
        ok(with_spec(json!({"hostUsers": true, "hostNetwork": true, "hostPID": true, "hostIPC": true})));
        let errs = errors(with_spec(
            json!({"hostUsers": false, "hostNetwork": true, "hostPID": true, "hostIPC": true}),
        ));
        for field in ["spec.hostNetwork", "spec.HostPID", "spec.HostIPC"] {
            let want = format!("{field}: Forbidden: when `pod.Spec.HostUsers` is false");
            assert!(errs.iter().any(|e| e.contains(&want)), "{want} in {errs:?}");
        }
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let doc = with_spec(json!({
            "restartPolicy": "Sometimes",
            "containers": [{"name": "App", "image": ""}],
        }));
        let error = prepare_value(doc, file_source(), NODE).expect_err("invalid");
        assert_eq!(error.errors.len(), 3, "{error}");
        let text = error.to_string();
        assert!(text.starts_with("pod \"default/web\": "), "{text}");
        assert!(
            text.contains("spec.containers[0].name: Invalid value: \"App\": a lowercase RFC 1123 label"),
            "{text}"
        );
        assert!(text.contains("; spec.containers[0].image: Required value"), "{text}");
        assert!(
            text.contains("spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""),
            "{text}"
        );
    }

    #[test]
    fn decoding_errors_become_field_errors() {
        // k8s-openapi requires a container name: the API server's message, not serde's.
        let doc = merge(web(), "/spec", json!({"containers": [{"image": "nginx"}]}));
        assert_error(doc, "spec.containers[0].name: Required value");
        let doc = merge(web(), "/spec", json!({"volumes": [{"hostPath": {"path": "/x"}}]}));
        assert_error(doc, "spec.volumes[0].name: Required value");
        let doc = with_container(json!({"ports": [{"containerPort": "eighty"}]}));
        assert_error_starts(
            doc,
            "spec.containers[0].ports[0].containerPort: Invalid value: invalid type: string \"eighty\"",
        );
        let doc = merge(web(), "", json!({"apiVersion": "v2"}));
        assert_error(doc, "apiVersion: Unsupported value: \"v2\": supported values: \"v1\"");
        let error = prepare_value(json!(["not", "a", "pod"]), file_source(), NODE).expect_err("not a map");
        assert_eq!(
            error.to_string(),
            "pod with no name in namespace \"default\": Invalid value: a pod must be a mapping (an object)"
        );
    }

    // ===== metadata =====

    #[test]
    fn pod_name_is_required_and_a_dns_subdomain() {
        let error = prepare_value(merge(web(), "/metadata", json!({"name": null})), file_source(), NODE)
            .expect_err("no name");
        assert_eq!(
            error.to_string(),
            "pod with no name in namespace \"default\": metadata.name: Required value: name or generateName is required"
        );
        assert_error_starts(
            merge(web(), "/metadata", json!({"name": "Web_1"})),
            "metadata.name: Invalid value: \"Web_1\": a lowercase RFC 1123 subdomain",
        );
        assert_error_starts(
            merge(web(), "/metadata", json!({"name": "web."})),
            "metadata.name: Invalid value: \"web.\"",
        );
        ok(merge(web(), "/metadata", json!({"name": "web.v1-2"})));
    }

    #[test]
    fn namespace_is_a_dns_label() {
        assert_error_starts(
            merge(web(), "/metadata", json!({"namespace": "team.a"})),
            "metadata.namespace: Invalid value: \"team.a\"",
        );
        let long = "n".repeat(64);
        assert_error(
            merge(web(), "/metadata", json!({"namespace": long.clone()})),
            &format!("metadata.namespace: Invalid value: {long:?}: must be no more than 63 characters"),
        );
        let pod = ok(merge(web(), "/metadata", json!({"namespace": "kube-system"})));
        assert_eq!(pod.namespace(), "kube-system");
    }

    #[test]
    fn labels_and_annotations_keys_are_checked() {
        assert_error_starts(
            merge(web(), "/metadata", json!({"labels": {"bad key": "x"}})),
            "metadata.labels: Invalid value: \"bad key\"",
        );
        assert_error_starts(
            merge(web(), "/metadata", json!({"labels": {"app": "-x"}})),
            "metadata.labels: Invalid value: \"-x\"",
        );
        assert_error_starts(
            merge(web(), "/metadata", json!({"annotations": {"/x": "y"}})),
            "metadata.annotations: Invalid value: \"/x\"",
        );
        ok(merge(
            web(),
            "/metadata",
            json!({"labels": {"app.kubernetes.io/name": "web", "tier": ""}, "annotations": {"Example.com/Note": "free text: anything"}}),
        ));
        let big = "x".repeat(MAX_ANNOTATIONS_BYTES);
        assert_error_starts(
            merge(web(), "/metadata", json!({"annotations": {"note": big}})),
            "metadata.annotations: Too long",
        );
    }

    // ===== spec =====

    #[test]
    fn spec_and_containers_are_required() {
        let error =
            prepare_value(merge(web(), "", json!({"spec": null})), file_source(), NODE).expect_err("no spec");
        assert_eq!(error.to_string(), "pod \"default/web\": spec: Required value");
        assert_error(with_spec(json!({"containers": []})), "spec.containers: Required value");
    }

    #[test]
    fn container_names_are_dns_labels_and_unique_across_init_and_app() {
        assert_error_starts(
            with_container(json!({"name": "my_app"})),
            "spec.containers[0].name: Invalid value: \"my_app\"",
        );
        assert_error(with_container(json!({"name": ""})), "spec.containers[0].name: Required value");
        let doc = with_spec(json!({
            "initContainers": [{"name": "app", "image": "busybox"}],
            "containers": [{"name": "app", "image": "nginx"}, {"name": "side", "image": "nginx"}, {"name": "side", "image": "nginx"}],
        }));
        let errors = errors(doc);
        assert!(
            errors.contains(&"spec.containers[0].name: Duplicate value: \"app\"".to_string()),
            "{errors:#?}"
        );
        assert!(
            errors.contains(&"spec.containers[2].name: Duplicate value: \"side\"".to_string()),
            "{errors:#?}"
        );
    }

    #[test]
    fn images_are_required_and_trimmed() {
        assert_error(with_container(json!({"image": ""})), "spec.containers[0].image: Required value");
        assert_error(
            with_container(json!({"image": " nginx"})),
            "spec.containers[0].image: Invalid value: \" nginx\": must not have leading or trailing whitespace",
        );
    }

    #[test]
    fn enum_fields_accept_only_their_values() {
        assert_error(
            with_spec(json!({"dnsPolicy": "Google"})),
            "spec.dnsPolicy: Unsupported value: \"Google\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
        );
        assert_error(
            with_container(json!({"imagePullPolicy": "Sometimes"})),
            "spec.containers[0].imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\"",
        );
        assert_error_starts(
            with_container(json!({"terminationMessagePolicy": "Log"})),
            "spec.containers[0].terminationMessagePolicy: Unsupported value: \"Log\"",
        );
        for policy in ["Always", "OnFailure", "Never"] {
            ok(with_spec(json!({"restartPolicy": policy})));
        }
    }

    #[test]
    fn dns_policy_none_needs_nameservers() {
        assert_error_starts(
            with_spec(json!({"dnsPolicy": "None"})),
            "spec.dnsConfig.nameservers: Required value",
        );
        assert_error_starts(
            with_spec(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["not-an-ip"]}})),
            "spec.dnsConfig.nameservers[0]: Invalid value: \"not-an-ip\"",
        );
        ok(with_spec(
            json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["198.18.0.10"], "searches": ["svc.local."]}}),
        ));
    }

    #[test]
    fn termination_grace_period_must_not_be_negative() {
        assert_error(
            with_spec(json!({"terminationGracePeriodSeconds": -1})),
            "spec.terminationGracePeriodSeconds: Invalid value: -1: must be greater than or equal to 0",
        );
        assert_error_starts(
            with_spec(json!({"activeDeadlineSeconds": 0})),
            "spec.activeDeadlineSeconds: Invalid value: 0",
        );
    }

    #[test]
    fn ephemeral_containers_cannot_be_created() {
        assert_error(
            with_spec(json!({"ephemeralContainers": [{"name": "debug", "image": "busybox"}]})),
            "spec.ephemeralContainers: Forbidden: cannot be set on create",
        );
    }

    fn api_errors(ephemeral: Value) -> Result<DesiredPod, Vec<String>> {
        let doc = merge(web(), "/metadata", json!({"uid": "0b1c4f2e-7d3a-4c55-9b8e-0f1e2d3c4b5a"}));
        let doc = merge(doc, "/spec", json!({"ephemeralContainers": [ephemeral]}));
        prepare_value(doc, PodSource::Api, NODE)
            .map_err(|e| e.errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn api_pods_may_have_ephemeral_containers_defaulted_and_validated() {
        let pod = api_errors(json!({"name": "debug", "image": "busybox", "targetContainerName": "app",
            "stdin": true, "tty": true, "resources": {}}))
        .expect("valid");
        let debug = &pod.ephemeral_containers()[0];
        assert_eq!(debug.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(debug.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(pod.ephemeral_target("debug"), Some("app"));
        for (field, value) in [
            ("ports", json!([{"containerPort": 80}])),
            ("readinessProbe", json!({"exec": {"command": ["true"]}})),
            ("lifecycle", json!({"preStop": {"exec": {"command": ["true"]}}})),
            ("resources", json!({"limits": {"cpu": "1"}})),
            ("restartPolicy", json!("Always")),
        ] {
            let errors = api_errors(json!({"name": "debug", "image": "busybox", field: value}))
                .expect_err("forbidden field");
            let expected = format!(
                "spec.ephemeralContainers[0].{field}: Forbidden: cannot be set for an Ephemeral Container"
            );
            assert!(errors.contains(&expected), "{expected} in {errors:?}");
        }
        let errors = api_errors(json!({"name": "app", "image": "busybox", "targetContainerName": "gone"}))
            .expect_err("invalid");
        assert!(
            errors.contains(&"spec.ephemeralContainers[0].name: Duplicate value: \"app\"".to_owned()),
            "{errors:?}"
        );
        assert!(
            errors
                .contains(&"spec.ephemeralContainers[0].targetContainerName: Not found: \"gone\"".to_owned()),
            "{errors:?}"
        );
        let errors = api_errors(json!({"name": "debug"})).expect_err("no image");
        assert!(
            errors.contains(&"spec.ephemeralContainers[0].image: Required value".to_owned()),
            "{errors:?}"
        );
    }

    #[test]
    fn static_pods_get_ephemeral_containers_only_through_add_ephemeral_containers() {
        let pod = ok(web());
        let debug: EphemeralContainer = serde_json::from_value(
            json!({"name": "debug", "image": "busybox", "targetContainerName": "app"}),
        )
        .expect("ephemeral container");
        let with = add_ephemeral_containers(&pod, vec![debug.clone()]).expect("valid");
        assert_eq!((with.uid(), with.name()), (pod.uid(), pod.name()));
        assert_eq!(with.ephemeral_containers()[0].image_pull_policy.as_deref(), Some("Always"));
        let twice = add_ephemeral_containers(&with, vec![debug]).expect_err("duplicate");
        assert_eq!(
            twice.errors[0].to_string(),
            "spec.ephemeralContainers[1].name: Duplicate value: \"debug\""
        );
    }

    #[test]
    fn restart_policy_per_container_only_for_sidecars() {
        assert_error(
            with_container(json!({"restartPolicy": "Always"})),
            "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers",
        );
        assert_error_starts(
            with_spec(json!({"initContainers": [{"name": "i", "image": "b", "restartPolicy": "Never"}]})),
            "spec.initContainers[0].restartPolicy: Unsupported value: \"Never\"",
        );
        assert_error(
            with_spec(
                json!({"initContainers": [{"name": "i", "image": "b", "readinessProbe": {"exec": {"command": ["true"]}}}]}),
            ),
            "spec.initContainers[0].readinessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
        );
        ok(with_spec(
            json!({"initContainers": [{"name": "i", "image": "b", "restartPolicy": "Always", "readinessProbe": {"exec": {"command": ["true"]}}}]}),
        ));
    }

    // ===== ports =====

    #[test]
    fn port_numbers_are_in_range() {
        assert_error(
            with_container(json!({"ports": [{"containerPort": 0}]})),
            "spec.containers[0].ports[0].containerPort: Required value",
        );
        assert_error(
            with_container(json!({"ports": [{"containerPort": 70000}]})),
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
        );
        assert_error(
            with_container(json!({"ports": [{"containerPort": 80, "hostPort": -5}]})),
            "spec.containers[0].ports[0].hostPort: Invalid value: -5: must be between 1 and 65535, inclusive",
        );
        ok(with_container(json!({"ports": [{"containerPort": 65535, "hostPort": 1}]})));
    }

    #[test]
    fn port_protocols_are_tcp_udp_or_sctp() {
        assert_error(
            with_container(json!({"ports": [{"containerPort": 80, "protocol": "HTTP"}]})),
            "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
        );
        ok(with_container(json!({"ports": [{"containerPort": 80, "protocol": "SCTP"}]})));
    }

    #[test]
    fn port_names_are_short_unique_service_names() {
        assert_error(
            with_container(json!({"ports": [{"containerPort": 80, "name": "a-very-long-port-name"}]})),
            "spec.containers[0].ports[0].name: Invalid value: \"a-very-long-port-name\": must be no more than 15 characters",
        );
        assert_error_starts(
            with_container(json!({"ports": [{"containerPort": 80, "name": "HTTP"}]})),
            "spec.containers[0].ports[0].name: Invalid value: \"HTTP\"",
        );
        assert_error_starts(
            with_container(json!({"ports": [{"containerPort": 80, "name": "8080"}]})),
            "spec.containers[0].ports[0].name: Invalid value: \"8080\": must contain at least one letter",
        );
        assert_error(
            with_container(
                json!({"ports": [{"containerPort": 80, "name": "web"}, {"containerPort": 81, "name": "web"}]}),
            ),
            "spec.containers[0].ports[1].name: Duplicate value: \"web\"",
        );
    }

    #[test]
    fn host_ports_are_unique_per_protocol_and_match_with_host_network() {
        let doc = with_spec(json!({"containers": [
            {"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]},
            {"name": "b", "image": "x", "ports": [{"containerPort": 81, "hostPort": 8080}, {"containerPort": 82, "hostPort": 8080, "protocol": "UDP"}]},
        ]}));
        let errors = errors(doc);
        assert_eq!(
            errors,
            vec!["spec.containers[1].ports[0].hostPort: Duplicate value: \"8080/TCP\"".to_string()]
        );
        assert_error(
            merge(
                with_spec(json!({"hostNetwork": true})),
                "/spec/containers/0",
                json!({"ports": [{"containerPort": 80, "hostPort": 8080}]}),
            ),
            "spec.containers[0].ports[0].hostPort: Invalid value: 8080: must match `containerPort` when `hostNetwork` is true",
        );
    }

    // ===== env =====

    #[test]
    fn env_var_names_and_sources_are_checked() {
        assert_error_starts(
            with_container(json!({"env": [{"name": "A=B", "value": "x"}]})),
            "spec.containers[0].env[0].name: Invalid value: \"A=B\"",
        );
        assert_error(
            with_container(json!({"env": [{"name": ""}]})),
            "spec.containers[0].env[0].name: Required value",
        );
        assert_error(
            with_container(
                json!({"env": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
            ),
            "spec.containers[0].env[0].valueFrom: Invalid value: may not be specified when `value` is not empty",
        );
        assert_error_starts(
            with_container(json!({"env": [{"name": "A", "valueFrom": {}}]})),
            "spec.containers[0].env[0].valueFrom: Invalid value: must specify one of",
        );
        ok(with_container(
            json!({"env": [{"name": "MY_VAR.with-dots", "value": "x"}, {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}),
        ));
    }

    // ===== volumes =====

    #[test]
    fn volumes_are_unique_typed_and_mounted_by_name() {
        let volumes =
            json!({"volumes": [{"name": "data", "emptyDir": {}}, {"name": "data", "emptyDir": {}}]});
        assert_error(with_spec(volumes), "spec.volumes[1].name: Duplicate value: \"data\"");
        assert_error(
            with_spec(json!({"volumes": [{"name": "data"}]})),
            "spec.volumes[0]: Required value: must specify a volume type",
        );
        assert_error(
            with_spec(json!({"volumes": [{"name": "data", "emptyDir": {}, "hostPath": {"path": "/srv"}}]})),
            "spec.volumes[0]: Forbidden: may not specify more than 1 volume type",
        );
        assert_error_starts(
            with_spec(json!({"volumes": [{"name": "Data", "emptyDir": {}}]})),
            "spec.volumes[0].name: Invalid value: \"Data\"",
        );
        assert_error(
            with_container(json!({"volumeMounts": [{"name": "missing", "mountPath": "/data"}]})),
            "spec.containers[0].volumeMounts[0].name: Not found: \"missing\"",
        );
        let doc = merge(
            with_spec(json!({"volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}]})),
            "/spec/containers/0",
            json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
        );
        ok(doc);
    }

    #[test]
    fn paths_may_not_escape() {
        let base = with_spec(json!({"volumes": [{"name": "data", "hostPath": {"path": "/srv/../etc"}}]}));
        assert_error(
            base,
            "spec.volumes[0].hostPath.path: Invalid value: \"/srv/../etc\": must not contain '..'",
        );
        let doc = merge(
            with_spec(json!({"volumes": [{"name": "data", "emptyDir": {}}]})),
            "/spec/containers/0",
            json!({"volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "../../etc"}]}),
        );
        assert_error(
            doc,
            "spec.containers[0].volumeMounts[0].subPath: Invalid value: \"../../etc\": must not contain '..'",
        );
        let doc = with_spec(
            json!({"volumes": [{"name": "cfg", "configMap": {"name": "c", "items": [{"key": "k", "path": "/abs"}]}}]}),
        );
        assert_error(
            doc,
            "spec.volumes[0].configMap.items[0].path: Invalid value: \"/abs\": must be a relative path",
        );
        assert_error(
            with_spec(json!({"volumes": [{"name": "s", "secret": {}}]})),
            "spec.volumes[0].secret.secretName: Required value",
        );
    }

    #[test]
    fn mount_paths_are_unique_and_propagation_checked() {
        let doc = merge(
            with_spec(json!({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}]})),
            "/spec/containers/0",
            json!({"volumeMounts": [{"name": "a", "mountPath": "/data"}, {"name": "b", "mountPath": "/data/", "mountPropagation": "Bidirectional"}]}),
        );
        let errors = errors(doc);
        assert!(
            errors.contains(
                &"spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/data/\": must be unique"
                    .to_string()
            ),
            "{errors:#?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("spec.containers[0].volumeMounts[1].mountPropagation: Forbidden")),
            "{errors:#?}"
        );
    }

    // ===== resources =====

    #[test]
    fn resource_quantities_must_parse() {
        ok(with_container(
            json!({"resources": {"limits": {"cpu": "1.5", "memory": "1.5Gi", "ephemeral-storage": "2e9"}, "requests": {"cpu": "100m", "memory": "64Mi"}}}),
        ));
        assert_error_starts(
            with_container(json!({"resources": {"limits": {"memory": "64MB"}}})),
            "spec.containers[0].resources.limits[memory]: Invalid value: \"64MB\": quantities must match",
        );
        assert_error(
            with_container(json!({"resources": {"requests": {"cpu": "-1"}}})),
            "spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0",
        );
    }

    #[test]
    fn requests_may_not_exceed_limits() {
        assert_error(
            with_container(json!({"resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1500m"}}})),
            "spec.containers[0].resources.requests[cpu]: Invalid value: \"1500m\": must be less than or equal to cpu limit of 1",
        );
        ok(with_container(
            json!({"resources": {"limits": {"memory": "1Gi"}, "requests": {"memory": "1073741824"}}}),
        ));
    }

    #[test]
    fn resource_names_are_standard_or_qualified() {
        assert_error(
            with_container(json!({"resources": {"limits": {"gpu": "1"}}})),
            "spec.containers[0].resources.limits[gpu]: Invalid value: \"gpu\": must be a standard resource for containers",
        );
        ok(with_container(
            json!({"resources": {"limits": {"example.com/widget": "2", "hugepages-2Mi": "4Mi"}}}),
        ));
        assert_error(
            with_container(json!({"resources": {"requests": {"example.com/widget": "2"}}})),
            "spec.containers[0].resources.requests[example.com/widget]: Forbidden: extended resources must have a limit",
        );
    }

    #[test]
    fn quantities_parse_like_kubernetes() {
        const G: i128 = 1_000_000_000;
        for (text, nanos) in [
            ("1", G),
            ("0", 0),
            ("100m", 100_000_000),
            ("64Mi", 64 * 1024 * 1024 * G),
            ("1.5Gi", 3 * 512 * 1024 * 1024 * G),
            ("2e3", 2000 * G),
            ("1E3", 1000 * G),
            ("1e-3", 1_000_000),
            ("1E", 1_000_000_000_000_000_000 * G),
            ("1k", 1000 * G),
            ("1M", 1_000_000 * G),
            (".5", G / 2),
            ("5.", 5 * G),
            ("+2", 2 * G),
            ("-2", -2 * G),
            ("1n", 1),
            ("0.1n", 1),
            ("1u", 1000),
            ("0.000000000000000000000000000000000000000000001", 1),
        ] {
            assert_eq!(parse_quantity(text), Ok(nanos), "{text}");
        }
        for text in
            ["", "abc", "1.2.3", "1Kb", "Ki", ".", "1e", "1e+", "1 ", " 1", "1K", "1mi", "--1", "0x10"]
        {
            assert_eq!(parse_quantity(text), Err(QuantityError::Syntax), "{text:?}");
        }
        for text in ["999999999999999999999999999999999999999999", "1e999", "1000000000000Ei"] {
            assert_eq!(parse_quantity(text), Err(QuantityError::TooLarge), "{text:?}");
        }
    }

    // ===== probes and hooks =====

    #[test]
    fn probe_numbers_must_not_be_negative() {
        assert_error(
            with_container(json!({"livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": -1}})),
            "spec.containers[0].livenessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
        );
        assert_error(
            with_container(
                json!({"readinessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": -5}}),
            ),
            "spec.containers[0].readinessProbe.initialDelaySeconds: Invalid value: -5: must be greater than or equal to 0",
        );
    }

    #[test]
    fn liveness_and_startup_success_threshold_is_one() {
        assert_error(
            with_container(json!({"livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2}})),
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
        );
        assert_error(
            with_container(json!({"startupProbe": {"exec": {"command": ["true"]}, "successThreshold": 3}})),
            "spec.containers[0].startupProbe.successThreshold: Invalid value: 3: must be 1",
        );
        ok(with_container(json!({"readinessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2}})));
    }

    #[test]
    fn probes_need_exactly_one_valid_handler() {
        assert_error(
            with_container(json!({"livenessProbe": {"periodSeconds": 5}})),
            "spec.containers[0].livenessProbe: Required value: must specify a handler type",
        );
        assert_error(
            with_container(
                json!({"livenessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}}}),
            ),
            "spec.containers[0].livenessProbe: Forbidden: may not specify more than 1 handler type",
        );
        assert_error(
            with_container(json!({"livenessProbe": {"httpGet": {"port": 0}}})),
            "spec.containers[0].livenessProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive",
        );
        assert_error(
            with_container(json!({"livenessProbe": {"exec": {"command": []}}})),
            "spec.containers[0].livenessProbe.exec.command: Required value",
        );
        assert_error_starts(
            with_container(json!({"livenessProbe": {"httpGet": {"port": 80, "scheme": "FTP"}}})),
            "spec.containers[0].livenessProbe.httpGet.scheme: Unsupported value: \"FTP\"",
        );
        assert_error(
            with_container(
                json!({"readinessProbe": {"grpc": {"port": 9090}, "terminationGracePeriodSeconds": 5}}),
            ),
            "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: Invalid value: 5: must not be set for readinessProbes",
        );
        ok(with_container(
            json!({"livenessProbe": {"httpGet": {"port": "http"}}, "ports": [{"containerPort": 80, "name": "http"}]}),
        ));
    }

    #[test]
    fn lifecycle_hooks_need_one_handler() {
        assert_error(
            with_container(json!({"lifecycle": {"preStop": {}}})),
            "spec.containers[0].lifecycle.preStop: Required value: must specify a handler type",
        );
        assert_error(
            with_container(json!({"lifecycle": {"postStart": {"tcpSocket": {"port": 80}}}})),
            "spec.containers[0].lifecycle.postStart.tcpSocket: Forbidden: tcpSocket is not supported for lifecycle hooks",
        );
        ok(with_container(
            json!({"lifecycle": {"preStop": {"sleep": {"seconds": 5}}, "postStart": {"exec": {"command": ["true"]}}}}),
        ));
    }
}
