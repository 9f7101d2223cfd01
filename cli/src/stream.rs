//! The streaming connections of `nodelet exec`, `attach`, `cp` and `port-forward` to the local nodelet's
//! main port: TLS (tokio-rustls) verified against `--certificate-authority` (default: nodelet's self-signed
//! certificate under /var/lib/nodelet/pki, when it exists) or not at all with `--insecure-skip-tls-verify`,
//! the bearer token of `--token` / `--token-file` / `NODELET_TOKEN`, and then either a WebSocket upgrade
//! with the subprotocols offered ([`MainPort::websocket`]) or an HTTP/1.1 upgrade to SPDY/3.1 with the
//! stream protocol versions offered in `X-Stream-Protocol-Version` ([`MainPort::spdy`], as client-go's
//! SPDY round tripper does: `POST`, `Connection: Upgrade`, `Upgrade: SPDY/3.1`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::{self, http::Uri};

use super::get::{DEFAULT_SERVER_CA, read_token};
use crate::args::MainPortArgs;

/// How long connecting (TCP, TLS, upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A WebSocket to the main port.
pub(crate) type Ws = WebSocketStream<TlsStream<TcpStream>>;

/// A connection to the main port upgraded to SPDY/3.1.
pub(crate) type SpdyIo = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

/// The most of a refused upgrade's body that is read (for its message).
const MAX_REFUSAL_BODY: usize = 64 * 1024;

/// Why the connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A local file (token, CA) could not be read.
    #[error("cannot read {what} {path}: {message}")]
    ReadFile {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The server URL cannot be used.
    #[error("invalid server URL {0:?}: must be https://HOST:PORT (the main port)")]
    BadUrl(String),
    /// TCP or TLS failed.
    #[error("cannot reach nodelet at {url}: {message}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Why.
        message: String,
    },
    /// The server answered the upgrade with an error.
    #[error("{url} answered {status}: {message}")]
    Refused {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The Status message (or body).
        message: String,
    },
    /// The WebSocket failed.
    #[error("WebSocket: {0}")]
    WebSocket(String),
    /// The SPDY upgrade or session failed.
    #[error("SPDY: {0}")]
    Spdy(String),
    /// A SPDY frame could not be read or written.
    #[error(transparent)]
    SpdyFrame(#[from] super::spdy::SpdyError),
    /// Local I/O (terminal, listening socket, stdout).
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The pod list could not be fetched (to pick the default container).
    #[error(transparent)]
    Get(#[from] super::GetError),
}

/// The main port's connection settings, checked once.
#[derive(Clone)]
pub(crate) struct MainPort {
    base: String,
    host: String,
    port: u16,
    token: Option<String>,
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for MainPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MainPort").field("base", &self.base).finish_non_exhaustive()
    }
}

impl MainPort {
    /// Reads the token and the CA and checks the URL.
    pub(crate) fn new(args: &MainPortArgs) -> Result<Self, StreamError> {
        let base = args.server.trim_end_matches('/').to_owned();
        let uri: Uri = base.parse().map_err(|_| StreamError::BadUrl(base.clone()))?;
        if uri.scheme_str() != Some("https") || uri.path().len() > 1 {
            return Err(StreamError::BadUrl(base));
        }
        let host = uri.host().ok_or_else(|| StreamError::BadUrl(base.clone()))?.to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let token = read_token(args.token.as_deref(), args.token_file.as_deref()).map_err(|e| {
            StreamError::ReadFile {
                what: "token file",
                path: args.token_file.clone().unwrap_or_default(),
                message: e.to_string(),
            }
        })?;
        let tls = Arc::new(tls_config(args.certificate_authority.as_deref(), args.insecure_skip_tls_verify)?);
        Ok(Self { base, host, port, token, tls })
    }

    /// Opens a WebSocket to `path_and_query` offering `protocols`; returns it with the chosen subprotocol.
    pub(crate) async fn websocket(
        &self,
        path_and_query: &str,
        protocols: &[&str],
    ) -> Result<(Ws, String), StreamError> {
        let url = format!("{}{path_and_query}", self.base);
        let ws_url = format!("wss://{}", url.trim_start_matches("https://"));
        tokio::time::timeout(CONNECT_TIMEOUT, self.connect(&url, &ws_url, protocols))
            .await
            .map_err(|_| StreamError::Unreachable { url: url.clone(), message: "timed out".into() })?
    }

    async fn connect(
        &self,
        url: &str,
        ws_url: &str,
        protocols: &[&str],
    ) -> Result<(Ws, String), StreamError> {
        let mut request =
            ws_url.into_client_request().map_err(|e| StreamError::WebSocket(format!("{ws_url}: {e}")))?;
        let headers = request.headers_mut();
        if let Some(token) = &self.token {
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| StreamError::Usage("the token is not a valid header value".into()))?;
            headers.insert(header::AUTHORIZATION, value);
        }
        let offered = HeaderValue::from_str(&protocols.join(", "))
            .map_err(|_| StreamError::Usage("bad subprotocol".into()))?;
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, offered);
        let tls = self.tls_connect(url).await?;
        match tokio_tungstenite::client_async(request, tls).await {
            Ok((ws, response)) => {
                let chosen = response
                    .headers()
                    .get(header::SEC_WEBSOCKET_PROTOCOL)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                Ok((ws, chosen))
            }
            Err(tungstenite::Error::Http(response)) => {
                let body = response.body().as_deref().unwrap_or_default();
                Err(StreamError::Refused {
                    url: url.to_owned(),
                    status: response.status().as_u16(),
                    message: refusal_message(body),
                })
            }
            Err(e) => Err(StreamError::WebSocket(format!("{url}: {e}"))),
        }
    }

    /// TCP and TLS to the main port.
    async fn tls_connect(&self, url: &str) -> Result<TlsStream<TcpStream>, StreamError> {
        let unreachable = |message: String| StreamError::Unreachable { url: url.to_owned(), message };
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // Interactive sessions send small frames (keystrokes): no Nagle delay on them.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let name = match self.host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(self.host.clone()).map_err(|e| unreachable(e.to_string()))?,
        };
        TlsConnector::from(self.tls.clone()).connect(name, tcp).await.map_err(|e| {
            let mut message = e.to_string();
            if message.contains("certificate") || message.contains("UnknownIssuer") {
                message.push_str(" (pass --certificate-authority FILE, or --insecure-skip-tls-verify)");
            }
            unreachable(message)
        })
    }

    /// Upgrades a `POST` of `path_and_query` to SPDY/3.1, offering `protocols` (in order of preference) in
    /// `X-Stream-Protocol-Version`; returns the connection with the version the server chose.
    pub(crate) async fn spdy(
        &self,
        path_and_query: &str,
        protocols: &[&str],
    ) -> Result<(SpdyIo, String), StreamError> {
        let url = format!("{}{path_and_query}", self.base);
        tokio::time::timeout(CONNECT_TIMEOUT, self.spdy_upgrade(&url, path_and_query, protocols))
            .await
            .map_err(|_| StreamError::Unreachable { url: url.clone(), message: "timed out".into() })?
    }

    async fn spdy_upgrade(
        &self,
        url: &str,
        path_and_query: &str,
        protocols: &[&str],
    ) -> Result<(SpdyIo, String), StreamError> {
        use http_body_util::BodyExt as _;
        let failed = |what: &str, e: &dyn std::fmt::Display| StreamError::Spdy(format!("{url}: {what}: {e}"));
        let mut request = hyper::Request::builder()
            .method(hyper::Method::POST)
            .uri(path_and_query)
            .header(header::HOST, format!("{}:{}", self.host, self.port))
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1");
        for protocol in protocols {
            request = request.header("X-Stream-Protocol-Version", *protocol);
        }
        if let Some(token) = &self.token {
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| StreamError::Usage("the token is not a valid header value".into()))?;
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| failed("the request", &e))?;
        let tls = self.tls_connect(url).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| failed("HTTP handshake", &e))?;
        // Drives the connection until the upgrade hands its socket over (or it fails); a bare spawn, per
        // connection.
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%error, "SPDY upgrade connection ended with an error");
            }
        });
        let mut response = sender.send_request(request).await.map_err(|e| failed("no answer", &e))?;
        let status = response.status();
        if status != hyper::StatusCode::SWITCHING_PROTOCOLS {
            let body = http_body_util::Limited::new(response.into_body(), MAX_REFUSAL_BODY)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(StreamError::Refused {
                url: url.to_owned(),
                status: status.as_u16(),
                message: refusal_message(&body),
            });
        }
        let upgraded_to = response.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
        if !upgraded_to.is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1")) {
            return Err(StreamError::Spdy(format!("{url} switched to {upgraded_to:?}, not SPDY/3.1")));
        }
        let chosen = response
            .headers()
            .get("X-Stream-Protocol-Version")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let upgraded = hyper::upgrade::on(&mut response).await.map_err(|e| failed("upgrade", &e))?;
        Ok((hyper_util::rt::TokioIo::new(upgraded), chosen))
    }
}

/// The message of a refused upgrade: the `Status`' message, else the body's text.
fn refusal_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned())
}

fn tls_config(ca: Option<&Path>, insecure: bool) -> Result<rustls::ClientConfig, StreamError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StreamError::Usage(format!("TLS: {e}")))?;
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    let path = match ca {
        Some(p) => Some(p.to_owned()),
        None => Some(PathBuf::from(DEFAULT_SERVER_CA)).filter(|p| p.is_file()),
    };
    if let Some(path) = path {
        let read_error =
            |message: String| StreamError::ReadFile { what: "CA certificate", path: path.clone(), message };
        let certs = CertificateDer::pem_file_iter(&path).map_err(|e| read_error(e.to_string()))?;
        for cert in certs {
            let cert = cert.map_err(|e| read_error(e.to_string()))?;
            roots.add(cert).map_err(|e| read_error(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(read_error("no certificate in the file".into()));
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `--insecure-skip-tls-verify`: any certificate is accepted, signatures are still checked.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Percent-encodes a query value.
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("sh -c 'exit 3'&x=1"), "sh%20-c%20%27exit%203%27%26x%3D1");
    }

    #[test]
    fn only_https_urls_are_taken() {
        let args = |server: &str| MainPortArgs {
            server: server.into(),
            token: None,
            token_file: None,
            certificate_authority: None,
            insecure_skip_tls_verify: true,
        };
        assert!(MainPort::new(&args("https://127.0.0.1:10250")).is_ok());
        assert!(MainPort::new(&args("https://127.0.0.1:10250/")).is_ok());
        assert!(matches!(MainPort::new(&args("http://127.0.0.1:10255")), Err(StreamError::BadUrl(_))));
        assert!(matches!(MainPort::new(&args("https://127.0.0.1/pods")), Err(StreamError::BadUrl(_))));
    }
}
