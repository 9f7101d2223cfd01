//! TLS for the main port: the serving certificate (given, or self-signed and kept under `<root-dir>/pki`,
//! or with `serverTLSBootstrap` the one from the cluster in a [`ServingCertHandle`], read at each handshake,
//! with the self-signed one until the first is issued) and client-certificate verification against the
//! client CA bundle.

use std::fs;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tracing::{info, warn};

use super::ServerConfig;

/// Why the TLS material could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Only one of `tlsCertFile` and `tlsPrivateKeyFile` is set.
    #[error("--tls-cert-file and --tls-private-key-file must be given together")]
    IncompleteCertKeyPair,
    /// A file could not be read.
    #[error("cannot read the {what} {}: {source}", path.display())]
    Read {
        /// What the file holds.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM material.
    #[error("the {what} {} is not usable: {reason}", path.display())]
    Invalid {
        /// What the file holds.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The self-signed certificate could not be stored.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The self-signed certificate could not be generated.
    #[error("cannot generate the self-signed serving certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the certificate and key (e.g. the key does not match the certificate).
    #[error("the serving certificate and key cannot be used: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Validity of a generated self-signed certificate (the kubelet's: one year).
const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A stored self-signed certificate expiring sooner than this is replaced at start.
const RENEW_BEFORE: Duration = Duration::from_secs(7 * 24 * 3600);

/// `<root_dir>/pki/nodelet.crt` and `nodelet.key`.
pub(crate) fn self_signed_paths(root_dir: &Path) -> (PathBuf, PathBuf) {
    let dir = root_dir.join("pki");
    (dir.join("nodelet.crt"), dir.join("nodelet.key"))
}

/// The ring provider, chosen explicitly so another crate enabling aws-lc-rs cannot make the choice
/// ambiguous at run time; its AES-128-GCM suites come first (see [`server_config`]).
fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    // A stable sort: the other suites keep their order.
    provider.cipher_suites.sort_by_key(|s| !is_aes_128_gcm(s.suite()));
    Arc::new(provider)
}

fn is_aes_128_gcm(suite: rustls::CipherSuite) -> bool {
    use rustls::CipherSuite as S;
    matches!(
        suite,
        S::TLS13_AES_128_GCM_SHA256
            | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
    )
}

/// The rustls configuration of the main port: TLS 1.2 and 1.3, HTTP/1.1 over ALPN, the configured or
/// self-signed certificate, and client certificates requested (not required) when a client CA is set; the
/// server's cipher suite order (AES-128-GCM first) decides, not the client's.
pub(crate) fn server_config(config: &ServerConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain, key) = match (&config.tls_cert_file, &config.tls_private_key_file) {
        (Some(cert), Some(key)) => (load_certs(cert, "TLS certificate file")?, load_key(key)?),
        (None, None) => load_or_generate_self_signed(&config.root_dir, &config.hostname)?,
        _ => return Err(TlsError::IncompleteCertKeyPair),
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?;
    let builder = match &config.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(path, "client CA file")? {
                roots.add(cert).map_err(|e| TlsError::Invalid {
                    what: "client CA file",
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Invalid {
                    what: "client CA file",
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = match &config.serving_cert {
        None => builder.with_single_cert(chain, key)?,
        Some(handle) => {
            let fallback = Arc::new(certified_key(chain, &key)?);
            builder.with_cert_resolver(Arc::new(SwappableCert { handle: handle.clone(), fallback }))
        }
    };
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    // The server's order decides: AES-128-GCM, which Go clients (the API server, kubectl) prefer anyway,
    // where rustls clients would pick AES-256-GCM, about a fifth more CPU per byte on bulk streams
    // (port-forward; `benches/streaming.rs` prints the per-suite cost).
    server.ignore_client_order = true;
    Ok(Arc::new(server))
}

fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'static>,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let signing = provider().key_provider.load_private_key(key.clone_key())?;
    let certified = rustls::sign::CertifiedKey::new(chain, signing);
    certified.keys_match()?;
    Ok(certified)
}

/// The main port's certificate from the cluster (`serverTLSBootstrap`), replaced when it is rotated; the
/// server reads it at each TLS handshake.
#[derive(Debug, Clone, Default)]
pub struct ServingCertHandle(Arc<std::sync::RwLock<Option<Arc<rustls::sign::CertifiedKey>>>>);

impl ServingCertHandle {
    /// Serves the certificate chain and key of `pem` from now on.
    pub fn set_pem(&self, pem: &[u8]) -> Result<(), TlsError> {
        let invalid = |reason: String| TlsError::Invalid {
            what: "serving certificate from the cluster",
            path: PathBuf::new(),
            reason,
        };
        let chain = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        if chain.is_empty() {
            return Err(invalid("no certificate".to_owned()));
        }
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| invalid(e.to_string()))?;
        let certified = Arc::new(certified_key(chain, &key)?);
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(certified);
        Ok(())
    }

    fn current(&self) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The handle's certificate, or `fallback` (self-signed) while there is none.
#[derive(Debug)]
struct SwappableCert {
    handle: ServingCertHandle,
    fallback: Arc<rustls::sign::CertifiedKey>,
}

impl rustls::server::ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.handle.current().unwrap_or_else(|| self.fallback.clone()))
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })
}

fn load_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid { what, path: path.to_owned(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: "no PEM certificate found".to_owned(),
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let what = "TLS private key file";
    let pem = read(path, what)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Invalid {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Loads `<root_dir>/pki/nodelet.{crt,key}`, or generates and stores them when either is missing or the
/// certificate expires within [`RENEW_BEFORE`]. The key is written with mode 0600 (and an existing key
/// readable by others is tightened to 0600); files are replaced atomically.
fn load_or_generate_self_signed(
    root_dir: &Path,
    hostname: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let (cert_path, key_path) = self_signed_paths(root_dir);
    if cert_path.exists() && key_path.exists() {
        let chain = load_certs(&cert_path, "self-signed certificate")?;
        let expiring = match chain.first().map(|c| x509_parser::parse_x509_certificate(c.as_ref())) {
            Some(Ok((_, cert))) => {
                let not_after = cert.validity().not_after.timestamp();
                let renew_at = time::OffsetDateTime::now_utc() + RENEW_BEFORE;
                not_after < renew_at.unix_timestamp()
            }
            _ => {
                return Err(TlsError::Invalid {
                    what: "self-signed certificate",
                    path: cert_path,
                    reason: "not an X.509 certificate (delete it to have a new one generated)".to_owned(),
                });
            }
        };
        if !expiring {
            tighten_key_permissions(&key_path)?;
            let key = load_key(&key_path)?;
            info!(cert = %cert_path.display(), "using the stored self-signed serving certificate");
            return Ok((chain, key));
        }
        warn!(cert = %cert_path.display(), "the self-signed serving certificate expires soon; generating a new one");
    }
    generate_self_signed(&cert_path, &key_path, hostname)
}

fn tighten_key_permissions(key_path: &Path) -> Result<(), TlsError> {
    let write_err = |source| TlsError::Write { path: key_path.to_owned(), source };
    let mode = fs::metadata(key_path).map_err(write_err)?.permissions().mode();
    if mode & 0o077 != 0 {
        warn!(key = %key_path.display(), mode = format!("{:o}", mode & 0o777), "private key readable by others; setting mode 0600");
        fs::set_permissions(key_path, fs::Permissions::from_mode(0o600)).map_err(write_err)?;
    }
    Ok(())
}

fn generate_self_signed(
    cert_path: &Path,
    key_path: &Path,
    hostname: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let mut names =
        vec![hostname.to_owned(), "localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    names.retain(|n| !n.is_empty());
    names.dedup();
    let mut params = rcgen::CertificateParams::new(names)?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + SELF_SIGNED_VALIDITY;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let cn = if hostname.is_empty() { "nodelet" } else { hostname };
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("{cn}@{}", now.unix_timestamp()));
    params.key_usages =
        vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key_pair = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key_pair)?;

    if let Some(dir) = cert_path.parent() {
        if let Some(root) = dir.parent() {
            fs::create_dir_all(root).map_err(|source| TlsError::Write { path: root.to_owned(), source })?;
        }
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(TlsError::Write { path: dir.to_owned(), source }),
        }
    }
    write_atomically(key_path, key_pair.serialize_pem().as_bytes(), 0o600)?;
    write_atomically(cert_path, cert.pem().as_bytes(), 0o644)?;
    info!(cert = %cert_path.display(), key = %key_path.display(), "generated a self-signed serving certificate");
    let key = PrivateKeyDer::try_from(key_pair.serialize_der()).map_err(|reason| TlsError::Invalid {
        what: "generated private key",
        path: key_path.to_owned(),
        reason: reason.to_owned(),
    })?;
    Ok((vec![cert.der().clone()], key))
}

/// [`nodelet_node::atomic::write_atomically`], its error as a [`TlsError::Write`].
fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    nodelet_node::atomic::write_atomically(path, contents, mode)
        .map_err(|e| TlsError::Write { path: e.path, source: e.source })
}
