//! Renders the content of `configMap`, `secret`, `downwardAPI` and `projected` volumes as a
//! [`FileSet`], with the kubelet's semantics (`pkg/volume/{configmap,secret,downwardapi,projected}`):
//!
//! - `items` map keys to paths (each with an optional `mode`); without `items` every key becomes a file
//!   named after it. `defaultMode` (0644 when unset) applies to files without their own `mode`; in a
//!   `projected` volume it is the projected source's `defaultMode`.
//! - `optional`: a missing object gives no files, and a missing key referenced by `items` is skipped;
//!   without `optional` both are errors. ConfigMap `data` and `binaryData` are both used; Secret `data`
//!   is bytes already, and `stringData` (write-only, merged into `data` by an API server) is merged
//!   over `data` here, since standalone mode reads the objects from manifests.
//! - Paths and modes are validated as the API server does (there is none in standalone mode): relative,
//!   no `..` element, not starting with `..`, not empty; modes between 0 and 0777. Keys used as file
//!   names must be valid ConfigMap keys.
//! - downwardAPI `fieldRef`: `metadata.name`, `metadata.namespace`, `metadata.uid`, `metadata.labels`,
//!   `metadata.annotations` (sorted `k="v"` lines with Go's `%q` escaping) and the subscripted
//!   `metadata.labels['k']` / `metadata.annotations['k']`. `resourceFieldRef`: `limits.`/`requests.`
//!   `cpu`, `memory`, `ephemeral-storage` and `hugepages-<size>`, with `divisor`; an unset limit
//!   defaults to the node's allocatable amount ([`NodeAllocatable`]), an unset request to the limit
//!   (the API server's defaulting).
//! - `serviceAccountToken` projections are written from the token the [`ObjectLookup`] gives for the
//!   pod (in cluster mode, issued by the API server's TokenRequest API for the pod's service account),
//!   mode `defaultMode`, or 0600 when the pod has an `fsGroup` (as the kubelet: the volume's ownership
//!   change then adds group read);
//!   a lookup without tokens (standalone mode) makes them an error, and so are `clusterTrustBundle`
//!   and `podCertificate` projections.
//!
//! Errors name the volume and the field, e.g. `volume "cfg": configMap "app-config" not found` or
//! `volume "cfg": items[1].path "../x": must not contain ".."`.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, Volume,
};
use nodelet_resources::quantity::Quantity;

use crate::fsutil;

/// `expirationSeconds` of a projected `serviceAccountToken` when unset (the API server's default).
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// The mode of a file without `mode` when `defaultMode` is unset (all four volume types).
pub const DEFAULT_MODE: u32 = 0o644;

/// One file of a volume's content, and a volume's content (validated, clean relative paths, which
/// may contain `/`, to files): the volume resource's own types, so that rendered content is
/// desired state as it is.
pub use nodelet_resources::volume::desired::{FileEntry, FileSet};

/// A ConfigMap's or Secret's content by key, as volumes read it: shared by every volume rendered
/// from one version of the object (the files' [`FileEntry::data`] are references to it).
pub type ObjectData = Arc<BTreeMap<String, Bytes>>;

/// Where ConfigMaps and Secrets come from (in standalone mode: the manifest directory).
pub trait ObjectLookup {
    /// The ConfigMap `namespace/name`, if it exists.
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap>;
    /// The Secret `namespace/name`, if it exists.
    fn secret(&self, namespace: &str, name: &str) -> Option<Secret>;
    /// The content of the ConfigMap `namespace/name` ([`config_map_data`]), if it exists. By default
    /// made from [`config_map`](Self::config_map) on each call; a lookup that keeps objects keeps
    /// this too, so that the volumes rendered from one object share its bytes.
    fn config_map_data(&self, namespace: &str, name: &str) -> Option<ObjectData> {
        self.config_map(namespace, name).map(|cm| config_map_data(&cm))
    }
    /// The content of the Secret `namespace/name` ([`secret_data`]), if it exists; as
    /// [`config_map_data`](Self::config_map_data).
    fn secret_data(&self, namespace: &str, name: &str) -> Option<ObjectData> {
        self.secret(namespace, name).map(|s| secret_data(&s))
    }
    /// A token of `pod`'s service account for a projected `serviceAccountToken` (`audience` empty
    /// for the API server's own): `None` where nothing issues tokens (standalone mode), else the token
    /// or why there is none yet.
    fn service_account_token(
        &self,
        pod: &Pod,
        audience: &str,
        expiration_seconds: i64,
    ) -> Option<Result<Bytes, TokenError>> {
        let _ = (pod, audience, expiration_seconds);
        None
    }
}

/// A ConfigMap's content by key: `binaryData`, then `data` (which wins for a key in both; the API
/// server rejects that, and the kubelet reads `data` first).
pub fn config_map_data(cm: &ConfigMap) -> ObjectData {
    object_data(&cm.binary_data, cm.data.iter().flatten().map(|(k, v)| (k, v.as_bytes())))
}

/// A Secret's content by key: `data`, then `stringData` (which wins, as the API server merges it).
pub fn secret_data(secret: &Secret) -> ObjectData {
    object_data(&secret.data, secret.string_data.iter().flatten().map(|(k, v)| (k, v.as_bytes())))
}

/// `binary`'s entries, then `text`'s (which win for a key in both).
fn object_data<'a>(
    binary: &'a Option<BTreeMap<String, k8s_openapi::ByteString>>,
    text: impl Iterator<Item = (&'a String, &'a [u8])>,
) -> ObjectData {
    let binary = binary.iter().flatten().map(|(k, v)| (k, v.0.as_slice()));
    Arc::new(binary.chain(text).map(|(k, v)| (k.clone(), Bytes::copy_from_slice(v))).collect())
}

/// A fixed set of ConfigMaps and Secrets, keyed by namespace (`default` when unset) and name.
#[derive(Debug, Clone, Default)]
pub struct StaticObjects {
    config_maps: BTreeMap<(String, String), ConfigMap>,
    secrets: BTreeMap<(String, String), Secret>,
}

fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".to_string()),
        meta.name.clone().unwrap_or_default(),
    )
}

impl StaticObjects {
    /// An empty set.
    pub fn new() -> StaticObjects {
        StaticObjects::default()
    }

    /// Adds (or replaces) a ConfigMap.
    pub fn insert_config_map(&mut self, config_map: ConfigMap) {
        self.config_maps.insert(object_key(&config_map.metadata), config_map);
    }

    /// Adds (or replaces) a Secret.
    pub fn insert_secret(&mut self, secret: Secret) {
        self.secrets.insert(object_key(&secret.metadata), secret);
    }
}

impl ObjectLookup for StaticObjects {
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.config_maps.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.secrets.get(&(namespace.to_string(), name.to_string())).cloned()
    }
}

/// The node's allocatable resources, the defaults of unset container limits in `resourceFieldRef`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAllocatable {
    /// CPU in millicores.
    pub cpu_millis: i64,
    /// Memory in bytes.
    pub memory_bytes: i64,
    /// Ephemeral storage in bytes; `None` when unknown (an unset limit then renders as 0, as the kubelet
    /// does when allocatable has no such entry).
    pub ephemeral_storage_bytes: Option<i64>,
}

impl NodeAllocatable {
    /// The host's capacity: the number of online CPUs (`/sys/devices/system/cpu/online`, else the
    /// available parallelism) and `MemTotal` from `/proc/meminfo`; ephemeral storage unknown. Node
    /// allocatable proper (capacity minus reservations) is not known to this crate; callers that know it
    /// pass it to [`volume_files_with_node`].
    pub fn from_host() -> std::io::Result<NodeAllocatable> {
        let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| count_cpu_list(s.trim()))
            .filter(|n| *n > 0)
            .map_or_else(|| std::thread::available_parallelism().map(|n| n.get()), Ok)?;
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|n| n.trim().parse::<i64>().ok())
            .ok_or_else(|| std::io::Error::other("/proc/meminfo: no MemTotal"))?;
        Ok(NodeAllocatable {
            cpu_millis: i64::try_from(cpus).unwrap_or(i64::MAX / 1000).saturating_mul(1000),
            memory_bytes: kib.saturating_mul(1024),
            ephemeral_storage_bytes: None,
        })
    }
}

/// Counts the CPUs of a kernel CPU list (`0-3,8,10-11`).
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<usize>().ok()?;
                n += 1;
            }
        }
    }
    Some(n)
}

/// Why [`ObjectLookup::service_account_token`] has no token for a pod (yet).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The token is asked for and not issued yet.
    #[error("requesting a token for service account {service_account:?}")]
    Requesting {
        /// The pod's service account.
        service_account: String,
    },
    /// The last request for the token failed (it is asked for again).
    #[error("the token request for service account {service_account:?} failed: {error}")]
    Failed {
        /// The pod's service account.
        service_account: String,
        /// The request's error (in the message, not a `source`, so that it is printed once).
        error: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
}

/// Errors of volume rendering; each names the volume and, where there is one, the field.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The volume is not one of the four kinds rendered here.
    #[error("volume {volume:?}: not a configMap, secret, downwardAPI or projected volume")]
    UnsupportedKind {
        /// The volume name.
        volume: String,
    },
    /// A required field is missing or empty.
    #[error("volume {volume:?}: {field}: required")]
    Required {
        /// The volume name.
        volume: String,
        /// The field (e.g. `items[0].key`).
        field: String,
    },
    /// A field has an invalid value.
    #[error("volume {volume:?}: {field} {value}: {reason}")]
    Invalid {
        /// The volume name.
        volume: String,
        /// The field (e.g. `items[1].path`).
        field: String,
        /// The value, quoted when a string.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A field asks for something standalone mode cannot provide.
    #[error("volume {volume:?}: {field}: {reason}")]
    Unsupported {
        /// The volume name.
        volume: String,
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// A service-account token is not issued yet (or could not be).
    #[error("volume {volume:?}: {field}: no token yet: {reason}")]
    TokenNotReady {
        /// The volume.
        volume: String,
        /// The projection's field.
        field: String,
        /// Why.
        reason: TokenError,
    },
    /// The ConfigMap does not exist and the reference is not optional.
    #[error("volume {volume:?}: configMap {name:?} not found")]
    ConfigMapNotFound {
        /// The volume name.
        volume: String,
        /// The ConfigMap name.
        name: String,
    },
    /// The Secret does not exist and the reference is not optional.
    #[error("volume {volume:?}: secret {name:?} not found")]
    SecretNotFound {
        /// The volume name.
        volume: String,
        /// The Secret name.
        name: String,
    },
    /// `items` references a key the object does not have, and the reference is not optional.
    #[error("volume {volume:?}: {field} {key:?}: {kind} {name:?} has no such key")]
    MissingKey {
        /// The volume name.
        volume: String,
        /// The field (e.g. `items[0].key`).
        field: String,
        /// `configMap` or `secret`.
        kind: &'static str,
        /// The object name.
        name: String,
        /// The key.
        key: String,
    },
    /// A key of the object cannot be a file name (when used without `items`).
    #[error("volume {volume:?}: {kind} {name:?}: key {key:?}: {reason}")]
    InvalidKey {
        /// The volume name.
        volume: String,
        /// `configMap` or `secret`.
        kind: &'static str,
        /// The object name.
        name: String,
        /// The key.
        key: String,
        /// Why.
        reason: ConfigKeyError,
    },
    /// Two files of the content collide (`a` and `a/b`).
    #[error("volume {volume:?}: file {path:?} conflicts with the file {other:?}")]
    PathConflict {
        /// The volume name.
        volume: String,
        /// The nested path.
        path: String,
        /// The file that is also a directory of it.
        other: String,
    },
    /// The node's resources (for an unset limit) could not be read.
    #[error("volume {volume:?}: cannot read the node's allocatable resources: {source}")]
    NodeAllocatable {
        /// The volume name.
        volume: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl FilesError {
    /// Whether the volume only waits for something under way (a token being requested, see
    /// [`TokenError::Requesting`]) rather than failed: a wait, not a failed mount.
    pub fn is_pending(&self) -> bool {
        matches!(self, Self::TokenNotReady { reason: TokenError::Requesting { .. }, .. })
    }
}

/// Renders the content of `volume` (a `configMap`, `secret`, `downwardAPI` or `projected` volume of
/// `pod`), looking objects up in the pod's namespace through `lookup`. Unset CPU and memory limits in a
/// `resourceFieldRef` default to the host's capacity ([`NodeAllocatable::from_host`], read only when
/// needed).
pub fn volume_files(pod: &Pod, volume: &Volume, lookup: &dyn ObjectLookup) -> Result<FileSet, FilesError> {
    Renderer::new(pod, volume, lookup, None).render(volume)
}

/// Like [`volume_files`] with the node's allocatable resources given.
pub fn volume_files_with_node(
    pod: &Pod,
    volume: &Volume,
    lookup: &dyn ObjectLookup,
    node: &NodeAllocatable,
) -> Result<FileSet, FilesError> {
    Renderer::new(pod, volume, lookup, Some(*node)).render(volume)
}

struct Renderer<'a> {
    pod: &'a Pod,
    volume: &'a str,
    namespace: String,
    lookup: &'a dyn ObjectLookup,
    node: OnceCell<NodeAllocatable>,
}

/// A validated `items` entry: index, key, clean path, mode.
type Item = (usize, String, String, Option<u32>);

/// Where a projected source's item paths are collected to reject duplicates (the API server's check).
type PathSet = Option<BTreeSet<String>>;

impl<'a> Renderer<'a> {
    fn new(
        pod: &'a Pod,
        volume: &'a Volume,
        lookup: &'a dyn ObjectLookup,
        node: Option<NodeAllocatable>,
    ) -> Self {
        let cell = OnceCell::new();
        if let Some(node) = node {
            let _ = cell.set(node);
        }
        Renderer {
            pod,
            volume: &volume.name,
            namespace: pod
                .metadata
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".into()),
            lookup,
            node: cell,
        }
    }

    fn render(&self, volume: &Volume) -> Result<FileSet, FilesError> {
        let kinds = [
            volume.config_map.is_some(),
            volume.secret.is_some(),
            volume.downward_api.is_some(),
            volume.projected.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() > 1 {
            return Err(self.invalid("volume source", "", "may not specify more than 1 volume type"));
        }
        let mut out = FileSet::new();
        let mut no_paths: PathSet = None;
        if let Some(src) = &volume.config_map {
            let mode = self.mode(src.default_mode, "defaultMode")?.unwrap_or(DEFAULT_MODE);
            self.config_map(
                &mut out,
                &mut no_paths,
                "",
                &src.name,
                src.items.as_deref(),
                src.optional,
                mode,
            )?;
        } else if let Some(src) = &volume.secret {
            let mode = self.mode(src.default_mode, "defaultMode")?.unwrap_or(DEFAULT_MODE);
            let name = src.secret_name.as_deref().unwrap_or("");
            self.secret(&mut out, &mut no_paths, "", name, src.items.as_deref(), src.optional, mode)?;
        } else if let Some(src) = &volume.downward_api {
            let mode = self.mode(src.default_mode, "defaultMode")?.unwrap_or(DEFAULT_MODE);
            self.downward_api(&mut out, &mut no_paths, "", src.items.as_deref().unwrap_or_default(), mode)?;
        } else if let Some(src) = &volume.projected {
            let mode = self.mode(src.default_mode, "defaultMode")?.unwrap_or(DEFAULT_MODE);
            let mut paths: PathSet = Some(BTreeSet::new());
            for (i, source) in src.sources.iter().flatten().enumerate() {
                let field = format!("sources[{i}]");
                let set = [
                    source.config_map.is_some(),
                    source.secret.is_some(),
                    source.downward_api.is_some(),
                    source.service_account_token.is_some(),
                    source.cluster_trust_bundle.is_some(),
                    source.pod_certificate.is_some(),
                ]
                .iter()
                .filter(|s| **s)
                .count();
                if set != 1 {
                    return Err(self.invalid(&field, "", "exactly one projection source must be specified"));
                }
                if let Some(p) = &source.config_map {
                    let prefix = format!("{field}.configMap.");
                    self.config_map(
                        &mut out,
                        &mut paths,
                        &prefix,
                        &p.name,
                        p.items.as_deref(),
                        p.optional,
                        mode,
                    )?;
                } else if let Some(p) = &source.secret {
                    let prefix = format!("{field}.secret.");
                    self.secret(
                        &mut out,
                        &mut paths,
                        &prefix,
                        &p.name,
                        p.items.as_deref(),
                        p.optional,
                        mode,
                    )?;
                } else if let Some(p) = &source.downward_api {
                    let prefix = format!("{field}.downwardAPI.");
                    self.downward_api(
                        &mut out,
                        &mut paths,
                        &prefix,
                        p.items.as_deref().unwrap_or_default(),
                        mode,
                    )?;
                } else if let Some((p, Some(result))) = source.service_account_token.as_ref().map(|p| {
                    let expiration = p.expiration_seconds.unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
                    let audience = p.audience.as_deref().unwrap_or_default();
                    (p, self.lookup.service_account_token(self.pod, audience, expiration))
                }) {
                    // A lookup that issues tokens (cluster mode); otherwise the error below.
                    let field = format!("{field}.serviceAccountToken");
                    let path = self.path(&p.path, &format!("{field}.path"), &mut paths)?;
                    match result {
                        Ok(token) => {
                            // The kubelet writes a token 0600 when the pod has an fsGroup (its
                            // SetVolumeOwnership then makes it 0640, group fsGroup).
                            let has_fs_group = self
                                .pod
                                .spec
                                .as_ref()
                                .and_then(|s| s.security_context.as_ref())
                                .and_then(|s| s.fs_group)
                                .is_some();
                            let mode = if has_fs_group { 0o600 } else { mode };
                            out.insert(path, FileEntry { data: token, mode });
                        }
                        Err(reason) => {
                            return Err(FilesError::TokenNotReady {
                                volume: self.volume.to_string(),
                                field,
                                reason,
                            });
                        }
                    }
                } else {
                    let (what, reason) = if source.service_account_token.is_some() {
                        (
                            "serviceAccountToken",
                            "not supported in standalone mode: there is no API server to issue tokens",
                        )
                    } else if source.cluster_trust_bundle.is_some() {
                        (
                            "clusterTrustBundle",
                            "not supported in standalone mode: there is no API server to read ClusterTrustBundles from",
                        )
                    } else {
                        (
                            "podCertificate",
                            "not supported in standalone mode: there is no API server to sign certificates",
                        )
                    };
                    return Err(FilesError::Unsupported {
                        volume: self.volume.to_string(),
                        field: format!("{field}.{what}"),
                        reason: reason.to_string(),
                    });
                }
            }
        } else {
            return Err(FilesError::UnsupportedKind { volume: self.volume.to_string() });
        }
        self.check_conflicts(&out)?;
        Ok(out)
    }

    fn invalid(&self, field: &str, value: impl Into<String>, reason: impl Into<String>) -> FilesError {
        FilesError::Invalid {
            volume: self.volume.to_string(),
            field: field.to_string(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    fn required(&self, field: String) -> FilesError {
        FilesError::Required { volume: self.volume.to_string(), field }
    }

    /// A `mode`/`defaultMode` value: 0..=0777.
    fn mode(&self, mode: Option<i32>, field: &str) -> Result<Option<u32>, FilesError> {
        match mode {
            None => Ok(None),
            Some(m) => match u32::try_from(m) {
                Ok(m) if m <= 0o777 => Ok(Some(m)),
                _ => Err(self.invalid(
                    field,
                    if m < 0 { m.to_string() } else { format!("{m:#o}") },
                    "must be a number between 0 and 0777 (octal), both inclusive",
                )),
            },
        }
    }

    fn path(&self, path: &str, field: &str, paths: &mut PathSet) -> Result<String, FilesError> {
        if path.is_empty() {
            return Err(self.required(field.to_string()));
        }
        let clean = fsutil::clean_relative_path(path)
            .map_err(|reason| self.invalid(field, format!("{path:?}"), reason))?;
        if let Some(seen) = paths
            && !seen.insert(path.to_string())
        {
            return Err(self.invalid(field, format!("{path:?}"), "conflicting duplicate paths"));
        }
        Ok(clean)
    }

    #[allow(clippy::too_many_arguments)]
    fn config_map(
        &self,
        out: &mut FileSet,
        paths: &mut PathSet,
        prefix: &str,
        name: &str,
        items: Option<&[KeyToPath]>,
        optional: Option<bool>,
        default_mode: u32,
    ) -> Result<(), FilesError> {
        if name.is_empty() {
            return Err(self.required(format!("{prefix}name")));
        }
        let items = self.items(prefix, items, paths)?;
        let Some(data) = self.lookup.config_map_data(&self.namespace, name) else {
            return if optional.unwrap_or(false) {
                Ok(())
            } else {
                Err(FilesError::ConfigMapNotFound { volume: self.volume.to_string(), name: name.to_string() })
            };
        };
        self.project(out, prefix, "configMap", name, &data, items, optional.unwrap_or(false), default_mode)
    }

    #[allow(clippy::too_many_arguments)]
    fn secret(
        &self,
        out: &mut FileSet,
        paths: &mut PathSet,
        prefix: &str,
        name: &str,
        items: Option<&[KeyToPath]>,
        optional: Option<bool>,
        default_mode: u32,
    ) -> Result<(), FilesError> {
        if name.is_empty() {
            return Err(
                self.required(format!("{prefix}{}", if prefix.is_empty() { "secretName" } else { "name" }))
            );
        }
        let items = self.items(prefix, items, paths)?;
        let Some(data) = self.lookup.secret_data(&self.namespace, name) else {
            return if optional.unwrap_or(false) {
                Ok(())
            } else {
                Err(FilesError::SecretNotFound { volume: self.volume.to_string(), name: name.to_string() })
            };
        };
        self.project(out, prefix, "secret", name, &data, items, optional.unwrap_or(false), default_mode)
    }

    /// Validates `items` (before the object is looked up, as the API server validates the pod):
    /// `(index, key, clean path, mode)`.
    fn items(
        &self,
        prefix: &str,
        items: Option<&[KeyToPath]>,
        paths: &mut PathSet,
    ) -> Result<Vec<Item>, FilesError> {
        let mut out = Vec::new();
        for (i, item) in items.unwrap_or_default().iter().enumerate() {
            let field = format!("{prefix}items[{i}]");
            if item.key.is_empty() {
                return Err(self.required(format!("{field}.key")));
            }
            let path = self.path(&item.path, &format!("{field}.path"), paths)?;
            let mode = self.mode(item.mode, &format!("{field}.mode"))?;
            out.push((i, item.key.clone(), path, mode));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        out: &mut FileSet,
        prefix: &str,
        kind: &'static str,
        name: &str,
        data: &BTreeMap<String, Bytes>,
        items: Vec<Item>,
        optional: bool,
        default_mode: u32,
    ) -> Result<(), FilesError> {
        if items.is_empty() {
            for (key, value) in data {
                if let Err(reason) = config_key_error(key) {
                    return Err(FilesError::InvalidKey {
                        volume: self.volume.to_string(),
                        kind,
                        name: name.to_string(),
                        key: key.to_string(),
                        reason,
                    });
                }
                out.insert(key.clone(), FileEntry { data: value.clone(), mode: default_mode });
            }
            return Ok(());
        }
        for (i, key, path, mode) in items {
            match data.get(key.as_str()) {
                Some(value) => {
                    out.insert(path, FileEntry { data: value.clone(), mode: mode.unwrap_or(default_mode) });
                }
                None if optional => {}
                None => {
                    return Err(FilesError::MissingKey {
                        volume: self.volume.to_string(),
                        field: format!("{prefix}items[{i}].key"),
                        kind,
                        name: name.to_string(),
                        key,
                    });
                }
            }
        }
        Ok(())
    }

    fn downward_api(
        &self,
        out: &mut FileSet,
        paths: &mut PathSet,
        prefix: &str,
        items: &[DownwardAPIVolumeFile],
        default_mode: u32,
    ) -> Result<(), FilesError> {
        for (i, item) in items.iter().enumerate() {
            let field = format!("{prefix}items[{i}]");
            let path = self.path(&item.path, &format!("{field}.path"), paths)?;
            let mode = self.mode(item.mode, &format!("{field}.mode"))?.unwrap_or(default_mode);
            let value = match (&item.field_ref, &item.resource_field_ref) {
                (Some(f), None) => {
                    self.field_value(&f.field_path, f.api_version.as_deref(), &format!("{field}.fieldRef"))?
                }
                (None, Some(r)) => self.resource_value(r, &format!("{field}.resourceFieldRef"))?,
                (Some(_), Some(_)) => {
                    return Err(self.invalid(
                        &field,
                        "",
                        "fieldRef and resourceFieldRef can not be specified simultaneously",
                    ));
                }
                (None, None) => return Err(self.required(format!("{field}.fieldRef"))),
            };
            out.insert(path, FileEntry { data: value.into_bytes().into(), mode });
        }
        Ok(())
    }

    fn field_value(
        &self,
        field_path: &str,
        api_version: Option<&str>,
        field: &str,
    ) -> Result<String, FilesError> {
        if let Some(v) = api_version
            && !v.is_empty()
            && v != "v1"
        {
            return Err(self.invalid(
                &format!("{field}.apiVersion"),
                format!("{v:?}"),
                "only \"v1\" is supported",
            ));
        }
        let meta = &self.pod.metadata;
        let field = format!("{field}.fieldPath");
        let empty = BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&empty);
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        if let Some((path, key)) = split_subscript(field_path) {
            let bad_key = |errs: QualifiedNameError| {
                self.invalid(&field, format!("{field_path:?}"), format!("invalid key subscript: {errs}"))
            };
            return match path {
                "metadata.labels" => {
                    qualified_name_error(key).map_err(bad_key)?;
                    Ok(labels.get(key).cloned().unwrap_or_default())
                }
                "metadata.annotations" => {
                    qualified_name_error(&key.to_lowercase()).map_err(bad_key)?;
                    Ok(annotations.get(key).cloned().unwrap_or_default())
                }
                _ => Err(self.invalid(&field, format!("{field_path:?}"), "does not support subscript")),
            };
        }
        Ok(match field_path {
            "metadata.name" => meta.name.clone().unwrap_or_default(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => meta.uid.clone().unwrap_or_default(),
            "metadata.labels" => format_map(labels),
            "metadata.annotations" => format_map(annotations),
            _ => {
                return Err(self.invalid(
                    &field,
                    format!("{field_path:?}"),
                    "supported values in downwardAPI volumes: \"metadata.annotations\", \"metadata.labels\", \
                     \"metadata.name\", \"metadata.namespace\", \"metadata.uid\" and the subscripted \
                     metadata.annotations['key'] and metadata.labels['key']",
                ));
            }
        })
    }

    fn find_container(&self, name: &str) -> Option<&'a Container> {
        let spec = self.pod.spec.as_ref()?;
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
    }

    fn node(&self) -> Result<NodeAllocatable, FilesError> {
        if let Some(node) = self.node.get() {
            return Ok(*node);
        }
        let node = NodeAllocatable::from_host()
            .map_err(|source| FilesError::NodeAllocatable { volume: self.volume.to_string(), source })?;
        let _ = self.node.set(node);
        Ok(node)
    }

    fn resource_value(
        &self,
        selector: &k8s_openapi::api::core::v1::ResourceFieldSelector,
        field: &str,
    ) -> Result<String, FilesError> {
        let container_name = selector.container_name.as_deref().unwrap_or("");
        if container_name.is_empty() {
            return Err(self.required(format!("{field}.containerName")));
        }
        let Some(container) = self.find_container(container_name) else {
            return Err(self.invalid(
                &format!("{field}.containerName"),
                format!("{container_name:?}"),
                "no such container in the pod",
            ));
        };
        let resource = selector.resource.as_str();
        let resource_field = format!("{field}.resource");
        let unsupported =
            || self.invalid(&resource_field, format!("{resource:?}"), "unsupported container resource");
        let (is_limit, name) = if let Some(name) = resource.strip_prefix("limits.") {
            (true, name)
        } else if let Some(name) = resource.strip_prefix("requests.") {
            (false, name)
        } else {
            return Err(unsupported());
        };
        let cpu = match name {
            "cpu" => true,
            "memory" | "ephemeral-storage" => false,
            n if n.strip_prefix("hugepages-").is_some_and(|size| Quantity::parse(size).is_some()) => false,
            _ => return Err(unsupported()),
        };
        // The divisor, in millicores for cpu and bytes otherwise.
        let divisor_field = format!("{field}.divisor");
        let divisor = match selector.divisor.as_ref().map(|q| q.0.as_str()) {
            None | Some("") => None,
            Some(text) => {
                let q = Quantity::parse(text).ok_or_else(|| {
                    self.invalid(&divisor_field, format!("{text:?}"), "not a valid quantity")
                })?;
                (!q.is_zero()).then_some((text, q))
            }
        };
        let divisor_units = match divisor {
            None => if cpu { 1000 } else { 1 },
            Some((text, q)) => valid_divisor(q, cpu).ok_or_else(|| {
                let allowed = if cpu {
                    "only 1m and 1 are supported with the cpu resource"
                } else {
                    "only 1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the memory, \
                     ephemeral-storage and hugepages resources"
                };
                self.invalid(&divisor_field, format!("{text:?}"), allowed)
            })?,
        };
        let resources = container.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.as_ref());
        let requests = resources.and_then(|r| r.requests.as_ref());
        let amount_of = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity, which: &str| {
            Quantity::parse(&q.0)
                .map(|q| if cpu { q.scaled_ceil(1000) } else { q.scaled_ceil(1) })
                .ok_or_else(|| {
                    self.invalid(
                        &format!("containers[{container_name:?}].resources.{which}.{name}"),
                        format!("{:?}", q.0),
                        "not a valid quantity",
                    )
                })
        };
        let limit =
            limits.and_then(|l| l.get(name)).map(|q| amount_of(q, "limits")).transpose()?.filter(|v| *v != 0);
        let amount = if is_limit {
            match limit {
                Some(v) => v,
                // The kubelet merges node allocatable into unset (or zero) cpu, memory and
                // ephemeral-storage limits; hugepages have no default.
                None => match name {
                    "cpu" => self.node()?.cpu_millis,
                    "memory" => self.node()?.memory_bytes,
                    "ephemeral-storage" => self.node()?.ephemeral_storage_bytes.unwrap_or(0),
                    _ => 0,
                },
            }
        } else {
            match requests.and_then(|r| r.get(name)) {
                Some(q) => amount_of(q, "requests")?,
                // The API server defaults an unset request to the limit.
                None => limit.unwrap_or(0),
            }
        };
        Ok(ceil_div(amount, divisor_units).to_string())
    }

    fn check_conflicts(&self, files: &FileSet) -> Result<(), FilesError> {
        for path in files.keys() {
            let mut end = 0;
            while let Some(slash) = path[end..].find('/') {
                end += slash;
                let prefix = &path[..end];
                if files.contains_key(prefix) {
                    return Err(FilesError::PathConflict {
                        volume: self.volume.to_string(),
                        path: path.clone(),
                        other: prefix.to_string(),
                    });
                }
                end += 1;
            }
        }
        Ok(())
    }
}

/// The divisor in base units (millicores for cpu, bytes otherwise) if it is one the API server allows.
fn valid_divisor(q: Quantity, cpu: bool) -> Option<i64> {
    if cpu {
        return match q.scaled_ceil(1_000_000) {
            1_000 => Some(1),
            1_000_000 => Some(1000),
            _ => None,
        };
    }
    let allowed: [i64; 13] = [
        1,
        1_000,
        1_000_000,
        1_000_000_000,
        1_000_000_000_000,
        1_000_000_000_000_000,
        1_000_000_000_000_000_000,
        1 << 10,
        1 << 20,
        1 << 30,
        1 << 40,
        1 << 50,
        1 << 60,
    ];
    let v = q.scaled_ceil(1);
    // `scaled_ceil` rounds up: also require the value to be whole (checked where `v * 1000` fits).
    let whole = v.checked_mul(1000).is_none_or(|milli| q.scaled_ceil(1000) == milli);
    (allowed.contains(&v) && whole).then_some(v)
}

/// `ceil(a / d)` for `d > 0`, exactly (the kubelet uses float64 `math.Ceil`).
fn ceil_div(a: i64, d: i64) -> i64 {
    let (a, d) = (i128::from(a), i128::from(d.max(1)));
    let q = a.div_euclid(d) + i128::from(a.rem_euclid(d) != 0);
    i64::try_from(q).unwrap_or(if q < 0 { i64::MIN } else { i64::MAX })
}

/// `metadata.labels['key']` → `("metadata.labels", "key")` (the kubelet's `SplitMaybeSubscriptedPath`).
fn split_subscript(field_path: &str) -> Option<(&str, &str)> {
    let inner = field_path.strip_suffix("']")?;
    let (path, key) = inner.split_once("['")?;
    (!path.is_empty()).then_some((path, key))
}

/// The kubelet's `FormatMap`: sorted `key="value"` lines (value quoted as Go's `%q`), no final newline.
fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter().map(|(k, v)| format!("{k}={}", go_quote(v))).collect::<Vec<_>>().join("\n")
}

/// Go's `strconv.Quote` (`%q`) for valid UTF-8. Printability follows Go's `unicode.IsPrint` for
/// controls, separators, private-use and the common format characters; unassigned code points (which
/// Go escapes) are printed as they are.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if go_is_print(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn go_is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let u = c as u32;
    let format_chars = matches!(
        u,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E | 0x200B..=0x200F
            | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD
            | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F
    );
    let private_or_non =
        matches!(u, 0xE000..=0xF8FF | 0xF0000..=0x10FFFF | 0xFDD0..=0xFDEF) || (u & 0xFFFE) == 0xFFFE;
    !(format_chars || private_or_non)
}

/// Why a label or annotation key is not a qualified name (`qualified_name_error`): the API's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QualifiedNameError {
    /// More than one `/`.
    #[error(
        "a qualified name must consist of alphanumeric characters, '-', '_' or '.', \
                        with an optional DNS subdomain prefix and '/'"
    )]
    Shape,
    /// An empty prefix before the `/`.
    #[error("prefix part must be non-empty")]
    EmptyPrefix,
    /// A prefix that is not a lowercase DNS-1123 subdomain.
    #[error("prefix part must be a lowercase RFC 1123 subdomain")]
    Prefix,
    /// An empty name part.
    #[error("name part must be non-empty")]
    EmptyName,
    /// A name part over 63 characters.
    #[error("name part must be no more than 63 characters")]
    NameTooLong,
    /// A name part with other characters or ends.
    #[error(
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
                    end with an alphanumeric character"
    )]
    Name,
}

/// Why a ConfigMap or Secret key cannot name a file (`config_key_error`): the API's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigKeyError {
    /// The key is empty.
    #[error("must not be empty")]
    Empty,
    /// The key exceeds 253 characters.
    #[error("must be no more than 253 characters")]
    TooLong,
    /// A character outside `[-._a-zA-Z0-9]`.
    #[error("a valid config key must consist of alphanumeric characters, '-', '_' or '.'")]
    Characters,
    /// The key is `.`.
    #[error("must not be '.'")]
    Dot,
    /// The key is `..`.
    #[error("must not be '..'")]
    DotDot,
    /// The key starts with `..`.
    #[error("must not start with '..'")]
    DotDotPrefix,
}

/// `IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain, name at most 63 characters of
/// `[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]`.
fn qualified_name_error(value: &str) -> Result<(), QualifiedNameError> {
    let (prefix, name) = match value.split('/').collect::<Vec<_>>()[..] {
        [name] => (None, name),
        [prefix, name] => (Some(prefix), name),
        _ => {
            return Err(QualifiedNameError::Shape);
        }
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err(QualifiedNameError::EmptyPrefix);
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err(QualifiedNameError::Prefix);
        }
    }
    if name.is_empty() {
        return Err(QualifiedNameError::EmptyName);
    }
    if name.len() > 63 {
        return Err(QualifiedNameError::NameTooLong);
    }
    let inner_ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = name.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && name.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric);
    if !inner_ok || !ends_ok {
        return Err(QualifiedNameError::Name);
    }
    Ok(())
}

/// `IsConfigMapKey` (also used for Secret keys): `[-._a-zA-Z0-9]+`, at most 253, not `.`/`..`, not
/// starting with `..`.
fn config_key_error(key: &str) -> Result<(), ConfigKeyError> {
    if key.is_empty() {
        return Err(ConfigKeyError::Empty);
    }
    if key.len() > 253 {
        return Err(ConfigKeyError::TooLong);
    }
    if !key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return Err(ConfigKeyError::Characters);
    }
    match key {
        "." => Err(ConfigKeyError::Dot),
        ".." => Err(ConfigKeyError::DotDot),
        k if k.starts_with("..") => Err(ConfigKeyError::DotDotPrefix),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_data_takes_text_over_binary_for_a_key_in_both() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"},
            "binaryData": {"both": "YmluYXJ5", "bin": "AAE="},
            "data": {"both": "text", "txt": "t"},
        }))
        .expect("configmap");
        let data = config_map_data(&cm);
        let got: Vec<(&str, &[u8])> = data.iter().map(|(k, v)| (k.as_str(), &v[..])).collect();
        assert_eq!(got, [("bin", &[0u8, 1][..]), ("both", b"text"), ("txt", b"t")]);
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "data": {"both": "YmluYXJ5"},
            "stringData": {"both": "string"},
        }))
        .expect("secret");
        assert_eq!(&secret_data(&secret)["both"][..], b"string");
    }

    #[test]
    fn a_token_error_names_the_service_account_and_the_failure() {
        let waiting = TokenError::Requesting { service_account: "default".into() };
        assert_eq!(waiting.to_string(), "requesting a token for service account \"default\"");
        let io = std::io::Error::other("connection refused");
        let failed = TokenError::Failed { service_account: "app".into(), error: std::sync::Arc::new(io) };
        assert_eq!(
            failed.to_string(),
            "the token request for service account \"app\" failed: connection refused"
        );
        let e = FilesError::TokenNotReady {
            volume: "kube-api".into(),
            field: "projected.sources[0]".into(),
            reason: waiting,
        };
        assert_eq!(
            e.to_string(),
            "volume \"kube-api\": projected.sources[0]: no token yet: requesting a token for service account \"default\""
        );
        assert!(e.is_pending(), "a token being requested is a wait");
        let e = FilesError::TokenNotReady {
            volume: "kube-api".into(),
            field: "projected.sources[0]".into(),
            reason: failed,
        };
        assert!(!e.is_pending(), "a failed request is a failure");
        assert!(!FilesError::ConfigMapNotFound { volume: "v".into(), name: "c".into() }.is_pending());
    }

    #[test]
    fn go_quote_matches_go() {
        assert_eq!(go_quote("plain"), r#""plain""#);
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote("l1\nl2\t\r\u{7}\u{8}\u{b}\u{c}"), r#""l1\nl2\t\r\a\b\v\f""#);
        assert_eq!(go_quote("\u{1}\u{7f}"), r#""\x01\x7f""#);
        assert_eq!(go_quote("caf\u{e9} \u{65e5}\u{672c}"), "\"caf\u{e9} \u{65e5}\u{672c}\"");
        assert_eq!(go_quote("\u{85}\u{a0}\u{2028}\u{200b}\u{feff}"), r#""\u0085\u00a0\u2028\u200b\ufeff""#);
        assert_eq!(go_quote("\u{f0000}\u{1f600}"), "\"\\U000f0000\u{1f600}\"");
    }

    #[test]
    fn format_map_sorted_lines() {
        let m: BTreeMap<String, String> = [("b", "2"), ("a", "x\"y"), ("c", "multi\nline")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(format_map(&m), "a=\"x\\\"y\"\nb=\"2\"\nc=\"multi\\nline\"");
        assert_eq!(format_map(&BTreeMap::new()), "");
    }

    #[test]
    fn subscripts_and_names() {
        assert_eq!(split_subscript("metadata.labels['app']"), Some(("metadata.labels", "app")));
        assert_eq!(split_subscript("metadata.labels['a/b']"), Some(("metadata.labels", "a/b")));
        assert_eq!(split_subscript("['x']"), None);
        assert_eq!(split_subscript("metadata.labels"), None);
        assert!(qualified_name_error("app.kubernetes.io/name").is_ok());
        assert!(qualified_name_error("a").is_ok());
        assert!(qualified_name_error("-a").is_err());
        assert!(qualified_name_error("A.B/x").is_err());
        assert!(qualified_name_error("/x").is_err());
        assert!(qualified_name_error("a/b/c").is_err());
        assert!(qualified_name_error(&"x".repeat(64)).is_err());
        assert!(config_key_error("tls.crt").is_ok());
        assert!(config_key_error("a/b").is_err());
        assert!(config_key_error("..data").is_err());
        assert!(config_key_error("..").is_err());
    }

    #[test]
    fn divisors_and_ceil() {
        let q = |s: &str| Quantity::parse(s).unwrap_or_else(|| panic!("{s}"));
        assert_eq!(valid_divisor(q("1m"), true), Some(1));
        assert_eq!(valid_divisor(q("1"), true), Some(1000));
        assert_eq!(valid_divisor(q("1000m"), true), Some(1000));
        assert_eq!(valid_divisor(q("0.5m"), true), None);
        assert_eq!(valid_divisor(q("2"), true), None);
        assert_eq!(valid_divisor(q("1Mi"), false), Some(1 << 20));
        assert_eq!(valid_divisor(q("1k"), false), Some(1000));
        assert_eq!(valid_divisor(q("1Ei"), false), Some(1 << 60));
        assert_eq!(valid_divisor(q("0.5"), false), None);
        assert_eq!(valid_divisor(q("3Mi"), false), None);
        assert_eq!(ceil_div(1500, 1000), 2);
        assert_eq!(ceil_div(2000, 1000), 2);
        assert_eq!(ceil_div(0, 7), 0);
        assert_eq!(ceil_div(1, 1 << 20), 1);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }
}
