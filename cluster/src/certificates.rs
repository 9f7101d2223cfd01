//! The certificate manager: the node's client certificate (TLS bootstrap and rotation) and, with
//! `serverTLSBootstrap`, the main port's serving certificate, both issued by the cluster through
//! `certificates.k8s.io/v1` CertificateSigningRequests.
//!
//! - **Keys** are ECDSA P-256, generated here; only the CSR (public key, subject, SANs) leaves the node.
//! - **Store**: `<root-dir>/pki/nodelet-client-<YYYY-MM-DD-HH-MM-SS>.pem` (certificate then key, mode 0600,
//!   written atomically) and the symlink `nodelet-client-current.pem` pointing at the newest one (a
//!   symlink under a temporary name renamed over the old one); `nodelet-server-*` likewise. Older dated
//!   files are left in place, as the kubelet leaves its `kubelet-client-*.pem`.
//! - **TLS bootstrap** (`--bootstrap-kubeconfig`): when `--kubeconfig` is missing or its client
//!   certificate is missing, unreadable or expired, a CSR for `system:node:<node>` (group `system:nodes`,
//!   signer `kubernetes.io/kube-apiserver-client-kubelet`) is created with the bootstrap credentials and
//!   watched until it is issued (Denied or Failed: an error, a new CSR after a back-off); then the pem and
//!   symlink are written, then `--kubeconfig` (the bootstrap kubeconfig's cluster, a user whose
//!   `client-certificate` and `client-key` are the `-current.pem` symlink). Until then the cluster tasks
//!   wait; standalone pods run meanwhile.
//! - **Rotation** (`rotateCertificates: true`, or after a TLS bootstrap): at a random point between 70 %
//!   and 90 % of the certificate's lifetime a new key and CSR are sent with the current identity (or the
//!   bootstrap credentials once the certificate expired); the issued certificate is stored and every API
//!   request from then on uses it: the [`kube::Client`] cluster mode holds forwards each request to the
//!   current inner client ([`SwapService`]), so nothing restarts. A failed renewal counts in
//!   `kubelet_certificate_manager_client_expiration_renew_errors`, is logged as an error and retried with back-off.
//! - **Serving certificate** (`serverTLSBootstrap: true`): signer `kubernetes.io/kubelet-serving`, SANs
//!   the node name and its InternalIP addresses, rotated the same way; the main port reads it through a
//!   [`ServingCertHandle`](crate::server::ServingCertHandle) at each handshake and serves the self-signed
//!   certificate until the first one is issued.
//! - **Metrics**: `kubelet_certificate_manager_client_ttl_seconds`,
//!   `kubelet_certificate_manager_server_ttl_seconds` (seconds until expiry, updated every second).
//! - A 401 answer of the API server is logged as an error (at most every 30 s) naming the client
//!   certificate's subject and expiry. Nothing here ever stops a pod. Keys are never logged.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use nodelet_resources::common::task::{Lifetime, NamedTask};
use rcgen::PublicKeyData as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::Backoff;
use super::lane::HeartbeatLane;

/// The signer of kubelet client certificates.
pub(crate) const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelet serving certificates.
pub(crate) const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// How long one CSR is waited for before a new one is made (the kubelet's 15 minutes).
const CSR_WAIT: Duration = Duration::from_secs(15 * 60);
/// How often the TTL gauges are refreshed while waiting for the renewal point.
const TTL_TICK: Duration = Duration::from_secs(1);

/// Why a certificate could not be obtained, stored or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The key or the CSR could not be generated.
    #[error("cannot generate a key and CSR: {0}")]
    Generate(#[from] rcgen::Error),
    /// The API server refused or failed a call.
    #[error("{what}: {source}")]
    Api {
        /// The call.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Watching the CSR failed.
    #[error("watching CertificateSigningRequest {name}: {source}")]
    Watch {
        /// The CSR.
        name: String,
        /// Why.
        #[source]
        source: kube::runtime::wait::Error,
    },
    /// The CSR was denied.
    #[error("CertificateSigningRequest {name} was denied ({reason}: {message})")]
    Denied {
        /// The CSR.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The signer failed the CSR.
    #[error("CertificateSigningRequest {name} failed ({reason}: {message})")]
    Failed {
        /// The CSR.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The CSR was deleted before it was issued.
    #[error("CertificateSigningRequest {0} was deleted before a certificate was issued")]
    Deleted(String),
    /// Nobody issued the CSR in time.
    #[error("CertificateSigningRequest {name} was not approved and issued within {waited:?}")]
    Timeout {
        /// The CSR.
        name: String,
        /// How long it was waited for.
        waited: Duration,
    },
    /// A certificate (issued, stored or in a kubeconfig) is not usable.
    #[error("certificate {origin}: {reason}")]
    BadCertificate {
        /// Where it came from.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be written.
    #[error(transparent)]
    Write(#[from] nodelet_node::atomic::AtomicWriteError),
    /// A file or directory could not be read or created.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A kubeconfig lacks what is needed.
    #[error("kubeconfig {path}: {reason}")]
    KubeconfigContent {
        /// The file.
        path: String,
        /// What is missing.
        reason: String,
    },
    /// The kubeconfig could not be encoded.
    #[error("cannot encode the kubeconfig: {0}")]
    Encode(#[from] crate::yaml::EncodeError),
    /// A client could not be built.
    #[error("API client from {path}: {source}")]
    Client {
        /// The kubeconfig.
        path: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A request was made before the node had credentials (TLS bootstrap not finished).
    #[error("no client credentials yet (TLS bootstrap has not finished)")]
    NoCredentials,
}

// ------------------------------------------------------------------------------------------------ certificates

/// What nodelet needs to know of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertInfo {
    /// `notBefore`, Unix seconds.
    pub(crate) not_before: i64,
    /// `notAfter`, Unix seconds.
    pub(crate) not_after: i64,
    /// The subject, e.g. `CN=system:node:n1, O=system:nodes`.
    pub(crate) subject: String,
    /// The DER SubjectPublicKeyInfo.
    pub(crate) spki: Vec<u8>,
}

impl CertInfo {
    /// Whether it expired at `now` (Unix seconds).
    pub(crate) fn expired_at(&self, now: i64) -> bool {
        self.not_after <= now
    }
}

/// Now, Unix seconds.
pub(crate) fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn format_unix(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| t.to_string())
}

/// The first certificate of a PEM text.
pub(crate) fn parse_cert_pem(pem: &[u8], origin: &str) -> Result<CertInfo, CertError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let bad = |reason: String| CertError::BadCertificate { origin: origin.to_owned(), reason };
    let der = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or_else(|| bad("no PEM certificate".to_owned()))?
        .map_err(|e| bad(e.to_string()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(|e| bad(e.to_string()))?;
    Ok(CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        subject: cert.subject().to_string(),
        spki: cert.public_key().raw.to_vec(),
    })
}

/// The kubelet's rotation point: a random moment between 70 % and 90 % of the lifetime; `jitter` in
/// [0, 1).
pub(crate) fn rotation_deadline(info: &CertInfo, jitter: f64) -> i64 {
    let total = (info.not_after - info.not_before).max(0) as f64;
    info.not_before + (total * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// A new ECDSA P-256 key and a PEM CSR for `system:node:<node>` in `system:nodes` with `sans` (DNS names
/// and IP addresses; none for a client certificate).
pub(crate) fn new_key_and_csr(node: &str, sans: &[String]) -> Result<(rcgen::KeyPair, String), CertError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::new(sans.to_vec())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    let csr = params.serialize_request(&key)?;
    Ok((key, csr.pem()?))
}

fn random_suffix() -> String {
    (0..10).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect()
}

fn condition<'a>(
    csr: &'a CertificateSigningRequest,
    kind: &str,
) -> Option<&'a k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition> {
    csr.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind && c.status == "True")
}

fn issued(csr: &CertificateSigningRequest) -> Option<&[u8]> {
    csr.status.as_ref()?.certificate.as_ref().map(|b| b.0.as_slice()).filter(|b| !b.is_empty())
}

/// Creates a CSR `node-csr-<random>` for `csr_pem` with `signer` and `usages`, and watches it until it is
/// issued (the certificate PEM), denied, failed, deleted or [`CSR_WAIT`] passed.
pub(crate) async fn request_certificate(
    client: &Client,
    signer: &str,
    usages: &[&str],
    csr_pem: &str,
) -> Result<Vec<u8>, CertError> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let name = format!("node-csr-{}", random_suffix());
    let object = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta { name: Some(name.clone()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: signer.to_owned(),
            usages: Some(usages.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        status: None,
    };
    api.create(&PostParams::default(), &object).await.map_err(|source| CertError::Api {
        what: format!("creating CertificateSigningRequest {name}"),
        source,
    })?;
    info!(csr = %name, signer, "created a CertificateSigningRequest; waiting for it to be approved and issued");
    let decided = |o: Option<&CertificateSigningRequest>| match o {
        None => true,
        Some(c) => {
            issued(c).is_some() || condition(c, "Denied").is_some() || condition(c, "Failed").is_some()
        }
    };
    let waited =
        tokio::time::timeout(CSR_WAIT, kube::runtime::wait::await_condition(api, &name, decided)).await;
    let csr = match waited {
        Err(_) => return Err(CertError::Timeout { name, waited: CSR_WAIT }),
        Ok(Err(source)) => return Err(CertError::Watch { name, source }),
        Ok(Ok(None)) => return Err(CertError::Deleted(name)),
        Ok(Ok(Some(csr))) => csr,
    };
    for (kind, denied) in [("Denied", true), ("Failed", false)] {
        if let Some(c) = condition(&csr, kind) {
            let reason = c.reason.clone().unwrap_or_default();
            let message = c.message.clone().unwrap_or_default();
            return Err(if denied {
                CertError::Denied { name, reason, message }
            } else {
                CertError::Failed { name, reason, message }
            });
        }
    }
    match issued(&csr) {
        Some(pem) => {
            info!(csr = %name, "the CertificateSigningRequest was issued");
            Ok(pem.to_vec())
        }
        None => Err(CertError::Deleted(name)),
    }
}

// ------------------------------------------------------------------------------------------------ the store

/// The dated pem files and the `-current.pem` symlink of one kind (`nodelet-client`, `nodelet-server`)
/// in the certificate directory.
#[derive(Debug, Clone)]
pub(crate) struct PemStore {
    dir: PathBuf,
    prefix: &'static str,
}

impl PemStore {
    pub(crate) fn new(dir: &Path, prefix: &'static str) -> Self {
        Self { dir: dir.to_owned(), prefix }
    }

    /// `<dir>/<prefix>-current.pem`.
    pub(crate) fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The current certificate and key PEM, if the symlink exists and holds a certificate.
    pub(crate) fn load_current(&self) -> Option<(Vec<u8>, CertInfo)> {
        let path = self.current_path();
        let pem = std::fs::read(&path).ok()?;
        match parse_cert_pem(&pem, &path.display().to_string()) {
            Ok(info) => Some((pem, info)),
            Err(e) => {
                warn!(error = %e, "ignoring the stored certificate");
                None
            }
        }
    }

    /// Writes `cert_pem` + `key_pem` to a new dated file (mode 0600) and points the symlink at it;
    /// returns the symlink's path.
    pub(crate) fn store(&self, cert_pem: &[u8], key_pem: &str) -> Result<PathBuf, CertError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|source| CertError::Io { path: self.dir.clone(), source })?;
        let now = time::OffsetDateTime::now_utc();
        let name = format!(
            "{}-{:04}-{:02}-{:02}-{:02}-{:02}-{:02}.pem",
            self.prefix,
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second()
        );
        let mut contents = cert_pem.to_vec();
        if !contents.ends_with(b"\n") {
            contents.push(b'\n');
        }
        contents.extend_from_slice(key_pem.as_bytes());
        nodelet_node::atomic::write_atomically(&self.dir.join(&name), &contents, 0o600)?;
        let link = self.current_path();
        nodelet_node::atomic::replace_symlink(&link, Path::new(&name))?;
        Ok(link)
    }
}

/// Asks for a certificate (`signer`, `usages`, `sans`) with `client`, checks it carries the new key and
/// stores it; returns what it is.
async fn obtain(
    client: &Client,
    node: &str,
    signer: &str,
    usages: &[&str],
    sans: &[String],
    store: &PemStore,
) -> Result<(Vec<u8>, String, CertInfo), CertError> {
    let (key, csr) = new_key_and_csr(node, sans)?;
    let cert_pem = request_certificate(client, signer, usages, &csr).await?;
    let info = parse_cert_pem(&cert_pem, "issued by the cluster")?;
    if info.spki != key.subject_public_key_info() {
        return Err(CertError::BadCertificate {
            origin: "issued by the cluster".to_owned(),
            reason: "it does not carry the public key of the CSR".to_owned(),
        });
    }
    let key_pem = key.serialize_pem();
    let link = store.store(&cert_pem, &key_pem)?;
    info!(
        path = %link.display(),
        subject = %info.subject,
        not_after = %format_unix(info.not_after),
        "stored a new certificate"
    );
    Ok((cert_pem, key_pem, info))
}

// ------------------------------------------------------------------------------------------------ kubeconfigs

fn kubeconfig_err(path: &Path) -> impl FnOnce(kube::config::KubeconfigError) -> CertError {
    let path = path.display().to_string();
    move |source| CertError::Kubeconfig { path, source }
}

/// The current context's cluster (name and entry) and user of a kubeconfig.
fn current(
    file: &Kubeconfig,
    path: &Path,
) -> Result<(kube::config::NamedCluster, Option<kube::config::AuthInfo>), CertError> {
    let content = |reason: String| CertError::KubeconfigContent { path: path.display().to_string(), reason };
    let context_name = file.current_context.clone().ok_or_else(|| content("no current-context".into()))?;
    let context = file
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| content(format!("no context {context_name:?}")))?;
    let cluster = file
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .cloned()
        .ok_or_else(|| content(format!("no cluster {:?}", context.cluster)))?;
    let user = context
        .user
        .as_ref()
        .and_then(|u| file.auth_infos.iter().find(|a| &a.name == u))
        .and_then(|a| a.auth_info.clone());
    Ok((cluster, user))
}

/// The client certificate of a kubeconfig's current user (certificate and key must both be there).
pub(crate) fn kubeconfig_client_cert(path: &Path) -> Result<CertInfo, CertError> {
    let file = Kubeconfig::read_from(path).map_err(kubeconfig_err(path))?;
    let (_, user) = current(&file, path)?;
    let content = |reason: &str| CertError::KubeconfigContent {
        path: path.display().to_string(),
        reason: reason.to_owned(),
    };
    let user = user.ok_or_else(|| content("the current context has no user"))?;
    if user.client_key.is_none() && user.client_key_data.is_none() {
        return Err(content("the user has no client-key"));
    }
    let pem = if let Some(data) = &user.client_certificate_data {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|_| content("client-certificate-data is not base64"))?
    } else if let Some(file) = &user.client_certificate {
        std::fs::read(file).map_err(|source| CertError::Io { path: PathBuf::from(file), source })?
    } else {
        return Err(content("the user has no client certificate"));
    };
    parse_cert_pem(&pem, &format!("client certificate of {}", path.display()))
}

/// Writes `kubeconfig`: the current cluster of the bootstrap kubeconfig, a user with `client-certificate`
/// and `client-key` both `pem` (mode 0600, atomically).
fn write_node_kubeconfig(kubeconfig: &Path, bootstrap: &Path, pem: &Path) -> Result<(), CertError> {
    let file = Kubeconfig::read_from(bootstrap).map_err(kubeconfig_err(bootstrap))?;
    let (cluster, _) = current(&file, bootstrap)?;
    let pem = pem.display().to_string();
    let out = Kubeconfig {
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        clusters: vec![kube::config::NamedCluster {
            name: "default-cluster".to_owned(),
            cluster: cluster.cluster,
            ..Default::default()
        }],
        auth_infos: vec![kube::config::NamedAuthInfo {
            name: "default-auth".to_owned(),
            auth_info: Some(kube::config::AuthInfo {
                client_certificate: Some(pem.clone()),
                client_key: Some(pem),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![kube::config::NamedContext {
            name: "default-context".to_owned(),
            context: Some(kube::config::Context {
                cluster: "default-cluster".to_owned(),
                user: Some("default-auth".to_owned()),
                namespace: Some("default".to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some("default-context".to_owned()),
        ..Default::default()
    };
    let yaml = crate::yaml::to_string(&out)?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(|source| CertError::Io { path: dir.to_owned(), source })?;
    }
    nodelet_node::atomic::write_atomically(kubeconfig, yaml.as_bytes(), 0o600)?;
    info!(kubeconfig = %kubeconfig.display(), "wrote the node's kubeconfig");
    Ok(())
}

/// The clients (no rate limit: the outer client has it) from `kubeconfig`, its identity replaced by the
/// certificate and key in `identity` when given; and the kubeconfig's default namespace. The requests of
/// each share one connection ([`super::transport`]); the Lease client's is its own and is driven on `lane`.
pub(crate) async fn build_client(
    kubeconfig: &Path,
    identity: Option<&Path>,
    node: &str,
    lane: &HeartbeatLane,
) -> Result<NodeClients, CertError> {
    let file = Kubeconfig::read_from(kubeconfig).map_err(kubeconfig_err(kubeconfig))?;
    let mut config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_err(kubeconfig))?;
    if let Some(pem) = identity {
        let pem = pem.display().to_string();
        let auth = &mut config.auth_info;
        auth.client_certificate = Some(pem.clone());
        auth.client_key = Some(pem);
        auth.client_certificate_data = None;
        auth.client_key_data = None;
        auth.token = None;
        auth.token_file = None;
    }
    super::tune(&mut config, node);
    let client_err = |source| CertError::Client { path: kubeconfig.display().to_string(), source };
    // The Lease's connection is made where its first request is sent: on the lane, by the Lease's outer
    // client (`heartbeat_client`), whose request queue runs there. Made in the lane's context too, so that
    // anything the stack spawns when it is built runs there.
    let lease = lane.enter(|| super::transport::reconnecting(config.clone())).map_err(client_err)?;
    let api = super::transport::stack(config).map_err(client_err)?;
    Ok(NodeClients { api, lease })
}

/// The clients of the current credentials.
#[derive(Clone)]
pub(crate) struct NodeClients {
    /// Every request but the Lease's: one connection, driven on the process's runtime.
    pub(crate) api: super::transport::Stack,
    /// The Lease renewals: a connection of their own (HTTP/2, replaced after a renewal without an answer:
    /// [`super::transport::reconnecting`]), driven on the heartbeat lane ([`HeartbeatLane`]).
    pub(crate) lease: super::transport::Stack,
}

/// Which of the [`NodeClients`] a [`SwapService`] sends through.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Conn {
    /// [`NodeClients::api`].
    Api,
    /// [`NodeClients::lease`].
    Lease,
}

// ------------------------------------------------------------------------------------------------ the client

/// The current inner clients; `None` until TLS bootstrap finished.
pub(crate) type CurrentClient = watch::Receiver<Option<NodeClients>>;

/// The service below the rate limit of cluster mode's client: every request goes to the client that is
/// current at that moment. A 401 answer is logged as an error (at most every 30 s).
#[derive(Clone)]
pub(crate) struct SwapService {
    current: CurrentClient,
    conn: Conn,
    unauthorized: Arc<Unauthorized>,
}

impl std::fmt::Debug for SwapService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapService").finish_non_exhaustive()
    }
}

/// What the 401 error log says about the certificate in use.
#[derive(Debug, Default)]
pub(crate) struct Unauthorized {
    last_logged: AtomicI64,
    identity: std::sync::Mutex<Option<CertInfo>>,
}

impl Unauthorized {
    fn set_identity(&self, info: Option<CertInfo>) {
        *self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = info;
    }

    fn log(&self) {
        let now = now_unix();
        let last = self.last_logged.load(Ordering::Relaxed);
        if now - last < 30
            || self.last_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        match identity {
            Some(info) if info.expired_at(now) => error!(
                subject = %info.subject,
                expired = %format_unix(info.not_after),
                "the API server refused nodelet's credentials (401 Unauthorized): the client certificate expired; \
                 cluster mode retries, pods keep running"
            ),
            Some(info) => error!(
                subject = %info.subject,
                not_after = %format_unix(info.not_after),
                "the API server refused nodelet's credentials (401 Unauthorized): the client certificate is not \
                 trusted by the cluster (signed by another CA?); cluster mode retries, pods keep running"
            ),
            None => error!(
                "the API server refused nodelet's credentials (401 Unauthorized); cluster mode retries, pods \
                 keep running"
            ),
        }
    }
}

impl tower::Service<http::Request<kube::client::Body>> for SwapService {
    type Response = http::Response<super::transport::StackBody>;
    /// The inner stack's error as it is (the outer client makes it a `kube::Error` as it would have).
    type Error = tower::BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let inner = self.current.borrow().as_ref().map(|c| match self.conn {
            Conn::Api => c.api.clone(),
            Conn::Lease => c.lease.clone(),
        });
        let unauthorized = self.unauthorized.clone();
        Box::pin(async move {
            let Some(inner) = inner else {
                return Err(
                    Box::new(kube::Error::Service(Box::new(CertError::NoCredentials))) as tower::BoxError
                );
            };
            let res = super::transport::send(inner, req).await?;
            if res.status() == http::StatusCode::UNAUTHORIZED {
                unauthorized.log();
            }
            Ok(res)
        })
    }
}

/// The outer client: `layer` (the rate limit) over a [`SwapService`].
pub(crate) fn swapping_client(
    current: CurrentClient,
    unauthorized: Arc<Unauthorized>,
    layer: &super::ratelimit::RateLimitLayer,
    default_namespace: &str,
) -> Client {
    let service = tower::Layer::layer(layer, SwapService { current, conn: Conn::Api, unauthorized });
    Client::new(service, default_namespace)
}

/// The heartbeat client: a [`SwapService`] without the rate limit (the kubelet's heartbeat client has
/// `QPS = -1`), over `conn`: the connection of [`swapping_client`] ([`Conn::Api`]) or the Lease's
/// ([`Conn::Lease`]).
pub(crate) fn heartbeat_client(
    current: CurrentClient,
    conn: Conn,
    unauthorized: Arc<Unauthorized>,
    default_namespace: &str,
) -> Client {
    Client::new(SwapService { current, conn, unauthorized }, default_namespace)
}

// ------------------------------------------------------------------------------------------------ metrics

/// The certificate manager's metrics: `kubelet_certificate_manager_client_ttl_seconds`,
/// `kubelet_certificate_manager_server_ttl_seconds`,
/// `kubelet_certificate_manager_client_expiration_renew_errors`.
#[derive(Debug, Clone)]
pub struct CertMetrics {
    client_ttl: prometheus::Gauge,
    server_ttl: prometheus::Gauge,
    renew_errors: prometheus::IntCounter,
}

impl CertMetrics {
    /// The metrics, registered in `registry`.
    pub fn new(registry: &prometheus::Registry) -> prometheus::Result<Self> {
        let client_ttl = prometheus::Gauge::new(
            "kubelet_certificate_manager_client_ttl_seconds",
            "Seconds until the node's client certificate expires (negative: expired).",
        )?;
        let server_ttl = prometheus::Gauge::new(
            "kubelet_certificate_manager_server_ttl_seconds",
            "Seconds until the main port's serving certificate from the cluster expires (negative: expired).",
        )?;
        let renew_errors = prometheus::IntCounter::new(
            "kubelet_certificate_manager_client_expiration_renew_errors",
            "Failed renewals of the node's client certificate.",
        )?;
        registry.register(Box::new(client_ttl.clone()))?;
        registry.register(Box::new(server_ttl.clone()))?;
        registry.register(Box::new(renew_errors.clone()))?;
        Ok(Self { client_ttl, server_ttl, renew_errors })
    }
}

// ------------------------------------------------------------------------------------------------ managers

/// The client certificate's settings.
#[derive(Debug, Clone)]
pub(crate) struct ClientCertConfig {
    /// `--kubeconfig`.
    pub(crate) kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`.
    pub(crate) bootstrap_kubeconfig: Option<PathBuf>,
    /// `rotateCertificates`.
    pub(crate) rotate: bool,
    /// `<root-dir>/pki`.
    pub(crate) cert_dir: PathBuf,
}

/// Cluster mode's client and the task that keeps its certificate.
pub(crate) struct ClientCerts {
    /// The rate-limited client that follows the current certificate.
    pub(crate) client: Client,
    /// The same connection without the rate limit, for the Node status only (the kubelet's heartbeat
    /// client, `QPS = -1`): a node's status never queues behind its other requests.
    pub(crate) heartbeat: Client,
    /// The Lease's client: no rate limit either, over the Lease's own connection, which runs on the
    /// heartbeat lane.
    pub(crate) lease: Client,
    /// The current inner client (`None` until bootstrap finished).
    pub(crate) current: CurrentClient,
}

impl std::fmt::Debug for ClientCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCerts").finish_non_exhaustive()
    }
}

/// Sets up the client: from `--kubeconfig` when its certificate is good (or it has no certificate and no
/// bootstrap is asked for), else through TLS bootstrap in the background. Returns the client and the
/// certificate's task (`client-certificate`, bootstrap then rotation; it may end, and ends at `shutdown`) for
/// the daemon to spawn.
pub(crate) async fn start_client(
    node: &str,
    config: &ClientCertConfig,
    layer: &super::ratelimit::RateLimitLayer,
    metrics: &CertMetrics,
    lane: &HeartbeatLane,
    shutdown: &CancellationToken,
) -> Result<(ClientCerts, NamedTask), CertError> {
    let store = PemStore::new(&config.cert_dir, "nodelet-client");
    let unauthorized = Arc::new(Unauthorized::default());
    let rotate = config.rotate || config.bootstrap_kubeconfig.is_some();
    let kubeconfig_cert = if config.kubeconfig.exists() || config.bootstrap_kubeconfig.is_none() {
        Some(kubeconfig_client_cert(&config.kubeconfig))
    } else {
        None
    };
    let now = now_unix();
    let mut task = ClientTask {
        node: node.to_owned(),
        config: config.clone(),
        rotate,
        store: store.clone(),
        identity: None,
        info: None,
        tx: watch::Sender::new(None),
        unauthorized: unauthorized.clone(),
        metrics: metrics.clone(),
        lane: lane.clone(),
    };
    match (&config.bootstrap_kubeconfig, kubeconfig_cert) {
        (Some(bootstrap), cert) if !matches!(&cert, Some(Ok(info)) if !info.expired_at(now)) => {
            // check the bootstrap kubeconfig now: a bad one is a start-up error
            Kubeconfig::read_from(bootstrap).map_err(kubeconfig_err(bootstrap))?;
            let why = match cert {
                None => format!("{} does not exist", config.kubeconfig.display()),
                Some(Ok(info)) => {
                    format!("its client certificate expired at {}", format_unix(info.not_after))
                }
                Some(Err(e)) => e.to_string(),
            };
            info!(
                kubeconfig = %config.kubeconfig.display(),
                bootstrap = %bootstrap.display(),
                "TLS bootstrap: {why}; requesting a client certificate with the bootstrap credentials"
            );
        }
        (_, cert) => {
            let cert = cert.and_then(Result::ok);
            // with rotation, a stored certificate at least as new as the kubeconfig's wins (as the kubelet's
            // store does)
            if rotate
                && let Some((_, stored)) = store.load_current()
                && !stored.expired_at(now)
                && cert.as_ref().is_none_or(|c| stored.not_after >= c.not_after)
            {
                task.identity = Some(store.current_path());
                task.info = Some(stored);
            } else {
                task.info = cert;
            }
            let clients = build_client(&config.kubeconfig, task.identity.as_deref(), node, lane).await?;
            task.tx.send_replace(Some(clients));
            unauthorized.set_identity(task.info.clone());
            match &task.info {
                Some(info) if info.expired_at(now) => error!(
                    subject = %info.subject,
                    expired = %format_unix(info.not_after),
                    "the client certificate of --kubeconfig expired{}; the API server will refuse nodelet",
                    if rotate { "" } else { " and rotateCertificates is off (no --bootstrap-kubeconfig)" }
                ),
                Some(info) => info!(
                    subject = %info.subject,
                    not_after = %format_unix(info.not_after),
                    rotate,
                    "client certificate"
                ),
                None if rotate => warn!(
                    "rotateCertificates: --kubeconfig has no client certificate (token credentials?); nothing to \
                     rotate"
                ),
                None => {}
            }
        }
    }
    let current = task.tx.subscribe();
    let default_ns = "default";
    let client = swapping_client(current.clone(), unauthorized.clone(), layer, default_ns);
    let heartbeat = heartbeat_client(current.clone(), Conn::Api, unauthorized.clone(), default_ns);
    // The outer client's request queue runs on the lane too.
    let lease = lane.enter(|| heartbeat_client(current.clone(), Conn::Lease, unauthorized, default_ns));
    let task = NamedTask::new("client-certificate", Lifetime::Bounded, task.run(shutdown.clone()));
    Ok((ClientCerts { client, heartbeat, lease, current }, task))
}

/// The client certificate's task: bootstrap when needed, then rotation (or, without rotation, the TTL
/// gauge and an error log once the certificate expired).
struct ClientTask {
    node: String,
    config: ClientCertConfig,
    rotate: bool,
    store: PemStore,
    /// The certificate file replacing the kubeconfig's identity (after a rotation).
    identity: Option<PathBuf>,
    /// The certificate in use; `None` before bootstrap (or with token credentials).
    info: Option<CertInfo>,
    tx: watch::Sender<Option<NodeClients>>,
    unauthorized: Arc<Unauthorized>,
    metrics: CertMetrics,
    /// Where the Lease clients' connections run.
    lane: HeartbeatLane,
}

impl ClientTask {
    async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let has_client = self.tx.borrow().is_some();
            let step = match (&self.info, has_client) {
                // Boxed: the requests' state is held only while they are under way.
                (None, false) => Box::pin(self.bootstrap()).await,
                (None, true) => return, // token credentials: nothing to do
                (Some(info), true) => {
                    let info = info.clone();
                    if !self.wait_for_renewal(&info, &shutdown).await {
                        return;
                    }
                    Box::pin(self.renew(&info)).await
                }
                (Some(_), false) => return,
            };
            match step {
                Ok(()) => backoff.reset(),
                Err(e) => {
                    let delay = backoff.next_delay();
                    let expired = self.info.as_ref().is_some_and(|i| i.expired_at(now_unix()));
                    match &self.info {
                        None => error!(error = %e, retry_in = ?delay, "TLS bootstrap failed"),
                        Some(info) => {
                            self.metrics.renew_errors.inc();
                            error!(
                                error = %e,
                                retry_in = ?delay,
                                expired,
                                not_after = %format_unix(info.not_after),
                                "cannot renew the client certificate{}",
                                if expired {
                                    "; it expired: the API server refuses nodelet until one is issued (pods keep \
                                     running)"
                                } else {
                                    ""
                                }
                            );
                        }
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Waits until the renewal point (refreshing the TTL gauge); false on shutdown. Without rotation it
    /// waits for ever, logging an error every minute once the certificate expired.
    async fn wait_for_renewal(&self, info: &CertInfo, shutdown: &CancellationToken) -> bool {
        let deadline = rotation_deadline(info, fastrand::f64());
        if self.rotate {
            info!(renew_at = %format_unix(deadline), not_after = %format_unix(info.not_after), "client certificate rotation scheduled");
        }
        let mut last_error = 0;
        loop {
            let now = now_unix();
            self.metrics.client_ttl.set((info.not_after - now) as f64);
            if self.rotate && now >= deadline {
                return true;
            }
            if !self.rotate && info.expired_at(now) && now - last_error >= 60 {
                last_error = now;
                error!(
                    subject = %info.subject,
                    expired = %format_unix(info.not_after),
                    "the client certificate expired and cannot be renewed (rotateCertificates is off and no \
                     --bootstrap-kubeconfig): the API server refuses nodelet; pods keep running"
                );
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(TTL_TICK) => {}
            }
        }
    }

    /// The client to ask for a certificate with: the current one, or the bootstrap credentials once the
    /// current certificate expired (or before there is one).
    async fn csr_client(&self) -> Result<Client, CertError> {
        let expired = self.info.as_ref().is_none_or(|i| i.expired_at(now_unix()));
        let stack = match (&self.config.bootstrap_kubeconfig, expired) {
            (Some(bootstrap), true) => build_client(bootstrap, None, &self.node, &self.lane).await?.api,
            _ => self.tx.borrow().as_ref().map(|c| c.api.clone()).ok_or(CertError::NoCredentials)?,
        };
        // CertificateSigningRequests are cluster-scoped: the default namespace is not used.
        Ok(Client::new(stack, "default"))
    }

    async fn bootstrap(&mut self) -> Result<(), CertError> {
        let client = self.csr_client().await?;
        let (_, _, info) = obtain(
            &client,
            &self.node,
            CLIENT_SIGNER,
            &["digital signature", "client auth"],
            &[],
            &self.store,
        )
        .await?;
        let bootstrap = self.config.bootstrap_kubeconfig.as_deref().ok_or(CertError::NoCredentials)?;
        write_node_kubeconfig(&self.config.kubeconfig, bootstrap, &self.store.current_path())?;
        let client = build_client(&self.config.kubeconfig, None, &self.node, &self.lane).await?;
        info!(subject = %info.subject, not_after = %format_unix(info.not_after), "TLS bootstrap done");
        self.set(client, info);
        Ok(())
    }

    async fn renew(&mut self, old: &CertInfo) -> Result<(), CertError> {
        info!(not_after = %format_unix(old.not_after), "renewing the client certificate");
        let client = self.csr_client().await?;
        let (_, _, info) = obtain(
            &client,
            &self.node,
            CLIENT_SIGNER,
            &["digital signature", "client auth"],
            &[],
            &self.store,
        )
        .await?;
        // A kubeconfig nodelet wrote already points at the symlink; any other gets its identity replaced.
        let identity = self.store.current_path();
        let points_at_store = kubeconfig_points_at(&self.config.kubeconfig, &identity);
        self.identity = (!points_at_store).then_some(identity);
        let client =
            build_client(&self.config.kubeconfig, self.identity.as_deref(), &self.node, &self.lane).await?;
        info!(subject = %info.subject, not_after = %format_unix(info.not_after), "rotated the client certificate; API requests use it from now on");
        self.set(client, info);
        Ok(())
    }

    fn set(&mut self, client: NodeClients, info: CertInfo) {
        self.metrics.client_ttl.set((info.not_after - now_unix()) as f64);
        self.unauthorized.set_identity(Some(info.clone()));
        self.info = Some(info);
        self.tx.send_replace(Some(client));
    }
}

/// Whether the kubeconfig's current user takes its certificate from `pem`.
fn kubeconfig_points_at(kubeconfig: &Path, pem: &Path) -> bool {
    let Ok(file) = Kubeconfig::read_from(kubeconfig) else { return false };
    let Ok((_, Some(user))) = current(&file, kubeconfig) else { return false };
    user.client_certificate_data.is_none() && user.client_certificate.as_deref().map(Path::new) == Some(pem)
}

/// The serving certificate's manager (`serverTLSBootstrap`): loads a stored certificate into `handle`
/// at once, then [`run`](Self::run) keeps it issued and rotated.
#[derive(Debug)]
pub(crate) struct ServingCerts {
    handle: crate::server::ServingCertHandle,
    store: PemStore,
    info: Option<CertInfo>,
    metrics: CertMetrics,
}

impl ServingCerts {
    /// The handle the main port reads; a valid stored certificate is in it already.
    pub(crate) fn new(cert_dir: &Path, metrics: &CertMetrics) -> Self {
        let store = PemStore::new(cert_dir, "nodelet-server");
        let handle = crate::server::ServingCertHandle::default();
        let mut info = None;
        if let Some((pem, stored)) = store.load_current()
            && !stored.expired_at(now_unix())
        {
            match handle.set_pem(&pem) {
                Ok(()) => {
                    info!(subject = %stored.subject, not_after = %format_unix(stored.not_after), "serving the stored certificate from the cluster");
                    info = Some(stored);
                }
                Err(e) => warn!(error = %e, "ignoring the stored serving certificate"),
            }
        }
        Self { handle, store, info, metrics: metrics.clone() }
    }

    pub(crate) fn handle(&self) -> crate::server::ServingCertHandle {
        self.handle.clone()
    }

    /// Requests the first certificate (unless one is stored) and rotates it at 70–90 % of its lifetime,
    /// with `client`; SANs: the node name and `ips`.
    pub(crate) async fn run(
        mut self,
        client: Client,
        node: String,
        ips: Vec<String>,
        shutdown: CancellationToken,
    ) {
        let mut sans = vec![node.clone()];
        sans.extend(ips);
        let mut backoff = Backoff::default();
        loop {
            if let Some(info) = &self.info {
                let deadline = rotation_deadline(info, fastrand::f64());
                info!(renew_at = %format_unix(deadline), "serving certificate rotation scheduled");
                loop {
                    let now = now_unix();
                    self.metrics.server_ttl.set((info.not_after - now) as f64);
                    if now >= deadline {
                        break;
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(TTL_TICK) => {}
                    }
                }
            }
            let result = obtain(
                &client,
                &node,
                SERVING_SIGNER,
                &["digital signature", "server auth"],
                &sans,
                &self.store,
            )
            .await;
            let result = result.and_then(|(cert, key, info)| {
                let mut pem = cert;
                pem.push(b'\n');
                pem.extend_from_slice(key.as_bytes());
                self.handle.set_pem(&pem).map_err(|e| CertError::BadCertificate {
                    origin: "issued serving certificate".to_owned(),
                    reason: e.to_string(),
                })?;
                Ok(info)
            });
            match result {
                Ok(info) => {
                    info!(not_after = %format_unix(info.not_after), "the main port serves the new certificate from the cluster");
                    self.metrics.server_ttl.set((info.not_after - now_unix()) as f64);
                    self.info = Some(info);
                    backoff.reset();
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    error!(error = %e, retry_in = ?delay, "cannot obtain a serving certificate from the cluster");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inner client that answers every request at once with an empty object, counting them in `count`.
    fn answering_client(count: Arc<std::sync::atomic::AtomicUsize>) -> crate::transport::Stack {
        crate::transport::stack_of(tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            count.fetch_add(1, Ordering::Relaxed);
            async { crate::test_support::json_response(200, "{}") }
        }))
    }

    /// Inner clients that answer at once, and how many requests each (`api`, `lease`) got.
    fn answering_clients() -> (NodeClients, [Arc<std::sync::atomic::AtomicUsize>; 2]) {
        let counts: [Arc<std::sync::atomic::AtomicUsize>; 2] = Default::default();
        let clients = NodeClients {
            api: answering_client(counts[0].clone()),
            lease: answering_client(counts[1].clone()),
        };
        (clients, counts)
    }

    /// How long three requests through `client` take (paused time: the rate limit's waits only).
    async fn three_requests(client: &Client) -> Duration {
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            let request = http::Request::get("/api").body(Vec::new()).expect("request");
            client.request_text(request).await.expect("answer");
        }
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_clients_skip_the_rate_limit_and_the_lease_has_its_own_connection() {
        let (clients, [api, lease]) = answering_clients();
        let current = watch::channel(Some(clients)).1;
        let unauthorized = Arc::new(Unauthorized::default());
        // One request per 10 s after a burst of one.
        let layer = super::super::ratelimit::RateLimitLayer::new(0.1, 1);
        let limited = swapping_client(current.clone(), unauthorized.clone(), &layer, "default");
        let status = heartbeat_client(current.clone(), Conn::Api, unauthorized.clone(), "default");
        let leases = heartbeat_client(current, Conn::Lease, unauthorized, "default");
        assert!(three_requests(&limited).await >= Duration::from_secs(19), "the rate limit holds");
        assert_eq!(three_requests(&status).await, Duration::ZERO, "the status patches never wait for it");
        assert_eq!(three_requests(&leases).await, Duration::ZERO, "nor do the Lease renewals");
        assert_eq!(api.load(Ordering::Relaxed), 6, "the limited client and the status share a connection");
        assert_eq!(lease.load(Ordering::Relaxed), 3, "the Lease's connection is its own");
    }

    fn sample(not_before: i64, not_after: i64) -> CertInfo {
        CertInfo { not_before, not_after, subject: String::new(), spki: Vec::new() }
    }

    #[test]
    fn rotation_deadline_is_between_70_and_90_percent() {
        let info = sample(1000, 1060);
        assert_eq!(rotation_deadline(&info, 0.0), 1042);
        assert_eq!(rotation_deadline(&info, 0.999_999), 1054);
        assert_eq!(rotation_deadline(&info, 0.5), 1048);
    }

    #[test]
    fn csr_has_the_node_identity_and_sans() {
        let (key, pem) = new_key_and_csr("n1", &["n1".to_owned(), "10.0.0.5".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|d: rustls::pki_types::CertificateSigningRequestDer<'static>| d)
            .unwrap_or_else(|e| panic!("{e}"));
        use x509_parser::prelude::FromDer as _;
        let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .unwrap_or_else(|e| panic!("{e}"));
        let subject = csr.certification_request_info.subject.to_string();
        assert!(subject.contains("CN=system:node:n1") && subject.contains("O=system:nodes"), "{subject}");
        assert_eq!(csr.certification_request_info.subject_pki.raw, key.subject_public_key_info().as_slice());
        let sans = format!("{:?}", csr.requested_extensions().map(|e| e.collect::<Vec<_>>()));
        assert!(sans.contains("n1") && sans.contains("10.0.0.5") || sans.contains("[10, 0, 0, 5]"), "{sans}");
        assert!(!pem.contains("PRIVATE"), "the CSR carries no key");
    }

    #[test]
    fn store_writes_a_dated_0600_file_and_the_symlink() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let pki = dir.path().join("pki");
        let store = PemStore::new(&pki, "nodelet-client");
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap_or_else(|e| panic!("{e}"));
        let cert = rcgen::CertificateParams::new(vec!["x".to_owned()])
            .and_then(|p| p.self_signed(&key))
            .unwrap_or_else(|e| panic!("{e}"));
        let link = store.store(cert.pem().as_bytes(), &key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{e}"));
        let name = target.display().to_string();
        assert!(
            name.starts_with("nodelet-client-20") && name.ends_with(".pem") && name.len() == 38,
            "{name}"
        );
        let mode = std::fs::metadata(pki.join(&target)).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
        assert_eq!(mode, 0o600);
        let (_, info) = store.load_current().unwrap_or_else(|| panic!("nothing stored"));
        assert_eq!(info.spki, key.subject_public_key_info());
        let text = std::fs::read_to_string(&link).unwrap_or_default();
        assert!(text.contains("BEGIN CERTIFICATE") && text.contains("PRIVATE KEY"));
    }
}
