//! End-to-end tests of the servers over real sockets on 127.0.0.1 (ports picked by the OS), with real
//! time and bounded timeouts: a test that hangs fails within [`LIMIT`].

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;

/// Upper bound for any single step of a test.
const LIMIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------------------
// A node view the tests control.

struct FakeView {
    pods: Mutex<List<Pod>>,
    metrics: String,
    health: Mutex<Result<(), Unhealthy>>,
    logs: Mutex<HashMap<(String, String, String), PathBuf>>,
    running: AtomicBool,
}

impl FakeView {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            pods: Mutex::new(List { items: vec![sample_pod()], metadata: Default::default() }),
            metrics: "# HELP kubelet_running_pods Number of pods.\n# TYPE kubelet_running_pods gauge\nkubelet_running_pods 1\n"
                .to_owned(),
            health: Mutex::new(Ok(())),
            logs: Mutex::new(HashMap::new()),
            running: AtomicBool::new(true),
        })
    }

    fn set_log(&self, namespace: &str, pod: &str, container: &str, path: &Path) {
        self.logs
            .lock()
            .expect("lock")
            .insert((namespace.into(), pod.into(), container.into()), path.to_owned());
    }
}

impl NodeView for FakeView {
    fn pods(&self) -> List<Pod> {
        self.pods.lock().expect("lock").clone()
    }
    fn metrics(&self) -> String {
        self.metrics.clone()
    }
    fn probe_metrics(&self) -> String {
        PROBE_METRICS.to_owned()
    }
    fn healthy(&self) -> Result<(), Unhealthy> {
        *self.health.lock().expect("lock")
    }
    fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf> {
        self.logs.lock().expect("lock").get(&(namespace.into(), pod.into(), container.into())).cloned()
    }
    fn container_running(&self, _: &str, _: &str, _: &str) -> bool {
        self.running.load(Ordering::SeqCst)
    }
    fn checkpoint_target(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<checkpoint::CheckpointTarget, checkpoint::CheckpointTargetError> {
        use checkpoint::CheckpointTargetError as E;
        if (namespace, pod) != ("default", "web") {
            return Err(E::PodNotFound);
        }
        match container {
            "app" => {
                Ok(checkpoint::CheckpointTarget { pod_uid: "uid-web".into(), container_id: "c-app".into() })
            }
            "done" => Err(E::NotRunning),
            _ => Err(E::NoSuchContainer),
        }
    }
}

const PROBE_METRICS: &str = "# TYPE prober_probe_total counter\nprober_probe_total{pod_uid=\"u\"} 1\n";

fn sample_pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("0b8f8a3c-0000-4000-8000-000000000001".into()),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("198.18.0.7".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                ready: true,
                restart_count: 2,
                image: "localhost/nodelet/busybox:latest".into(),
                image_id: String::new(),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------------------
// Starting and stopping servers.

fn test_config(root: &Path) -> ServerConfig {
    let mut config = ServerConfig::new("node-a");
    config.address = IpAddr::V4(Ipv4Addr::LOCALHOST);
    config.port = 0;
    config.healthz_port = Some(0);
    config.root_dir = root.to_owned();
    config.shutdown_grace = Duration::from_secs(3);
    config
}

struct Running {
    main: SocketAddr,
    read_only: Option<SocketAddr>,
    healthz: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    async fn start(config: &ServerConfig, view: Arc<FakeView>) -> Self {
        let servers = tokio::time::timeout(LIMIT, Servers::bind(config, view))
            .await
            .expect("bind in time")
            .expect("bind");
        let (main, read_only, healthz) =
            (servers.main_addr(), servers.read_only_addr(), servers.healthz_addr());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(servers.run(async move {
            let _ = stopped.await;
        }));
        Self { main, read_only, healthz, stop: Some(stop), task }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(LIMIT, &mut self.task).await.expect("servers stop in time").expect("run task");
    }
}

// ---------------------------------------------------------------------------------------------------------
// A small HTTP/1.1 client, with TLS as the tests need it.

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any server certificate (like `--insecure-skip-tls-verify`) but still checks the handshake
/// signatures; the tests look at the certificate themselves.
#[derive(Debug)]
struct AcceptAnyServerCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
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

#[derive(Clone)]
enum ClientTls {
    Plain,
    /// TLS without verifying the server, optionally presenting a client certificate.
    Insecure(Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>),
    /// TLS verifying the server against these roots for the name `localhost`.
    Verify(Arc<rustls::RootCertStore>),
}

fn https() -> ClientTls {
    ClientTls::Insecure(None)
}

struct Opened {
    response: Response<Incoming>,
    server_cert: Option<CertificateDer<'static>>,
}

async fn open(
    addr: SocketAddr,
    tls: &ClientTls,
    method: Method,
    path: &str,
    bearer: Option<&str>,
) -> Result<Opened, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (io, server_cert): (Box<dyn Io>, _) = match tls {
        ClientTls::Plain => (Box::new(tcp), None),
        ClientTls::Insecure(_) | ClientTls::Verify(_) => {
            let builder = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?;
            let mut config = match tls {
                ClientTls::Insecure(identity) => {
                    let builder = builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert(provider())));
                    match identity {
                        None => builder.with_no_client_auth(),
                        Some((chain, key)) => builder
                            .with_client_auth_cert(chain.clone(), key.clone_key())
                            .map_err(|e| e.to_string())?,
                    }
                }
                ClientTls::Verify(roots) => {
                    builder.with_root_certificates(roots.clone()).with_no_client_auth()
                }
                ClientTls::Plain => unreachable!("handled above"),
            };
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
            let stream = connector.connect(name, tcp).await.map_err(|e| format!("TLS handshake: {e}"))?;
            let cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.clone().into_owned());
            (Box::new(stream), cert)
        }
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("http handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut request = Request::builder().method(method).uri(path).header(header::HOST, "localhost");
    if let Some(token) = bearer {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
    Ok(Opened { response, server_cert })
}

struct Reply {
    status: StatusCode,
    content_type: String,
    body: String,
    server_cert: Option<CertificateDer<'static>>,
}

impl Reply {
    /// The body as an API `Status` (fails the test if it is not one).
    fn api_status(&self) -> Status {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not a Status ({e}): {}", self.body))
    }
}

async fn request(
    addr: SocketAddr,
    tls: &ClientTls,
    method: Method,
    path: &str,
    bearer: Option<&str>,
) -> Result<Reply, String> {
    tokio::time::timeout(LIMIT, async {
        let Opened { response, server_cert } = open(addr, tls, method, path, bearer).await?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
        let body = String::from_utf8(body.to_vec()).map_err(|e| e.to_string())?;
        Ok(Reply { status, content_type, body, server_cert })
    })
    .await
    .map_err(|_| "request timed out".to_owned())?
}

async fn get(addr: SocketAddr, tls: &ClientTls, path: &str, bearer: Option<&str>) -> Reply {
    request(addr, tls, Method::GET, path, bearer).await.unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

// ---------------------------------------------------------------------------------------------------------
// Certificates for the tests.

struct TestCa {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

fn test_ca(name: &str) -> TestCa {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let key = rcgen::KeyPair::generate().expect("key");
    let pem = params.self_signed(&key).expect("CA cert").pem();
    TestCa { params, key, pem }
}

fn client_identity(
    ca: &TestCa,
    cn: &str,
    orgs: &[&str],
) -> (Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    for org in orgs {
        params.distinguished_name.push(rcgen::DnType::OrganizationName, *org);
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().expect("key");
    let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).expect("client cert");
    let key = PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
    (vec![cert.der().clone()], Arc::new(key))
}

fn write_file(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

// ---------------------------------------------------------------------------------------------------------
// Authentication.

#[tokio::test]
async fn main_port_refuses_anonymous_requests() {
    let dir = tempdir();
    let server = Running::start(&test_config(dir.path()), FakeView::new()).await;
    for path in ["/pods", "/healthz", "/metrics", "/containerLogs/default/web/app", "/no-such-path"] {
        let reply = get(server.main, &https(), path, None).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path}: {}", reply.body);
        assert_eq!(reply.content_type, "application/json");
        let status = reply.api_status();
        assert_eq!(status.code, Some(401));
        assert_eq!(status.reason.as_deref(), Some("Unauthorized"));
        assert!(!reply.body.contains("\"items\""), "no pod data leaks: {}", reply.body);
    }
    // The main port speaks TLS only.
    assert!(request(server.main, &ClientTls::Plain, Method::GET, "/pods", None).await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn anonymous_requests_are_served_only_when_enabled() {
    let dir = tempdir();
    let mut config = test_config(dir.path());
    config.anonymous_auth = true;
    let server = Running::start(&config, FakeView::new()).await;
    let reply = get(server.main, &https(), "/pods", None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    server.stop().await;
}

#[tokio::test]
async fn bearer_tokens_from_the_token_file_authenticate() {
    let dir = tempdir();
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "s3cret-token,alice,uid-1,\"system:masters,ops\"\nother,bob,uid-2\n");
    let mut config = test_config(dir.path());
    config.token_auth_file = Some(token_file);
    config.anonymous_auth = true; // a wrong token is refused even so
    let server = Running::start(&config, FakeView::new()).await;

    let ok = get(server.main, &https(), "/pods", Some("s3cret-token")).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(get(server.main, &https(), "/healthz", Some("other")).await.status, StatusCode::OK);

    let wrong = get(server.main, &https(), "/pods", Some("s3cret-tokeN")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.api_status().reason.as_deref(), Some("Unauthorized"));
    assert!(wrong.api_status().message.unwrap_or_default().contains("invalid bearer token"));
    server.stop().await;
}

#[tokio::test]
async fn token_reviews_and_subject_access_reviews_decide_on_the_main_port() {
    use serde_json::{Value, json};
    // The "API server": TokenReviews by token, SubjectAccessReviews by user and subresource.
    let (client, seen, _calls) = webhook::tests::fake_client(|body: &Value| {
        if body["kind"] == "TokenReview" {
            let user = match body["spec"]["token"].as_str() {
                Some("sa-token") => json!({"username": "system:serviceaccount:ns:sa", "uid": "sa-uid",
                                           "groups": ["system:serviceaccounts"]}),
                Some("broken-authz") => json!({"username": "broken"}),
                Some("forged") => {
                    return Ok(json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                                     "spec": body["spec"], "status": {"authenticated": false}}));
                }
                _ => return Err(503),
            };
            return Ok(json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                             "spec": body["spec"], "status": {"authenticated": true, "user": user}}));
        }
        let spec = &body["spec"];
        if spec["user"] == "broken" {
            return Err(500);
        }
        let allowed = spec["user"] == "alice"
            || (spec["user"] == "system:serviceaccount:ns:sa"
                && spec["resourceAttributes"]["subresource"] == "metrics");
        Ok(json!({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "spec": spec,
                  "status": {"allowed": allowed}}))
    });
    let dir = tempdir();
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "static-token,alice,uid-1\n");
    let mut config = test_config(dir.path());
    config.token_auth_file = Some(token_file);
    config.token_webhook = Some(TokenWebhookConfig { cache_ttl: Duration::from_secs(120) });
    config.authorization = AuthorizationMode::Webhook {
        cache_authorized_ttl: Duration::from_secs(300),
        cache_unauthorized_ttl: Duration::from_secs(30),
    };
    config.kube_client = Some(ApiClient(client));
    let server = Running::start(&config, FakeView::new()).await;
    let reviews =
        |path: &str| seen.lock().expect("lock").iter().filter(|(_, p, _)| p.ends_with(path)).count();

    // The token file first: no TokenReview for its tokens, but a SubjectAccessReview.
    let ok = get(server.main, &https(), "/pods", Some("static-token")).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(reviews("/tokenreviews"), 0);
    assert_eq!(reviews("/subjectaccessreviews"), 1);

    // A reviewed token: its user is authorized per subresource.
    let denied = get(server.main, &https(), "/pods", Some("sa-token")).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{}", denied.body);
    assert_eq!(
        denied.api_status().message.as_deref(),
        Some(
            "Forbidden (user=system:serviceaccount:ns:sa, verb=get, resource=nodes, subresource(s)=[proxy])"
        )
    );
    let metrics = get(server.main, &https(), "/metrics", Some("sa-token")).await;
    assert_eq!(metrics.status, StatusCode::OK, "{}", metrics.body);
    assert_eq!(reviews("/tokenreviews"), 1, "the second request's token came from the cache");
    let sar = seen
        .lock()
        .expect("lock")
        .iter()
        .rev()
        .find(|(_, p, _)| p.ends_with("/subjectaccessreviews"))
        .cloned();
    let Some((_, _, sar)) = sar else { panic!("no SubjectAccessReview") };
    assert_eq!(
        sar["spec"],
        json!({"user": "system:serviceaccount:ns:sa", "uid": "sa-uid", "groups": ["system:serviceaccounts"],
               "resourceAttributes": {"verb": "get", "version": "v1", "resource": "nodes",
                                      "subresource": "metrics", "name": "node-a"}})
    );

    // Not authenticated, a failed TokenReview, no credentials: 401. A failed SubjectAccessReview: 500.
    for token in [Some("forged"), Some("api-down"), None] {
        let reply = get(server.main, &https(), "/pods", token).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{token:?}: {}", reply.body);
    }
    let broken = get(server.main, &https(), "/stats/summary", Some("broken-authz")).await;
    assert_eq!(broken.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", broken.body);
    assert_eq!(
        broken.api_status().message.as_deref(),
        Some("Authorization error (user=broken, verb=get, resource=nodes, subresource(s)=[stats])")
    );
    server.stop().await;

    // Webhooks without the cluster's client do not start.
    config.kube_client = None;
    let err = Servers::bind(&config, FakeView::new()).await.expect_err("no API client");
    assert!(err.to_string().contains("cluster mode"), "{err}");
}

#[tokio::test]
async fn unreadable_or_malformed_token_files_stop_the_start() {
    let dir = tempdir();
    let mut config = test_config(dir.path());
    config.token_auth_file = Some(dir.path().join("missing.csv"));
    let err = Servers::bind(&config, FakeView::new()).await.expect_err("missing token file");
    assert!(err.to_string().contains("missing.csv"), "{err}");

    let bad = dir.path().join("bad.csv");
    write_file(&bad, "t1,alice,1\nt2-only-two,cols\n");
    config.token_auth_file = Some(bad);
    let err = Servers::bind(&config, FakeView::new()).await.expect_err("malformed token file");
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[tokio::test]
async fn client_certificates_signed_by_the_client_ca_authenticate() {
    let dir = tempdir();
    let ca = test_ca("nodelet-test-client-ca");
    let ca_file = dir.path().join("client-ca.crt");
    write_file(&ca_file, &ca.pem);
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "tok,carol,3\n");
    let mut config = test_config(dir.path());
    config.client_ca_file = Some(ca_file);
    config.token_auth_file = Some(token_file);
    let server = Running::start(&config, FakeView::new()).await;

    let alice = ClientTls::Insecure(Some(client_identity(&ca, "alice", &["system:masters"])));
    let reply = get(server.main, &alice, "/pods", None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

    // A certificate from another CA does not get through the handshake (or is refused).
    let rogue_ca = test_ca("rogue");
    let mallory = ClientTls::Insecure(Some(client_identity(&rogue_ca, "mallory", &[])));
    match request(server.main, &mallory, Method::GET, "/pods", None).await {
        Err(_) => {}
        Ok(reply) => {
            assert_ne!(reply.status, StatusCode::OK, "a rogue certificate was accepted: {}", reply.body)
        }
    }

    // A verified certificate without a common name names no user.
    let nameless = ClientTls::Insecure(Some(client_identity(&ca, "", &["system:masters"])));
    if let Ok(reply) = request(server.main, &nameless, Method::GET, "/pods", None).await {
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    }

    // Without a certificate: tokens still work, nothing else does.
    assert_eq!(get(server.main, &https(), "/pods", None).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(get(server.main, &https(), "/pods", Some("tok")).await.status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn only_get_and_head_are_served() {
    let dir = tempdir();
    let mut config = test_config(dir.path());
    config.anonymous_auth = true;
    let server = Running::start(&config, FakeView::new()).await;
    let reply = request(server.main, &https(), Method::POST, "/pods", None).await.expect("POST");
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.api_status().reason.as_deref(), Some("MethodNotAllowed"));
    let head = request(server.main, &https(), Method::HEAD, "/pods", None).await.expect("HEAD");
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// Serving certificate.

#[tokio::test]
async fn self_signed_certificate_is_generated_once_and_reused() {
    let dir = tempdir();
    let config = test_config(dir.path());
    let (cert_path, key_path) = tls::self_signed_paths(dir.path());

    let first = Running::start(&config, FakeView::new()).await;
    let served = get(first.main, &https(), "/healthz", None).await.server_cert.expect("server certificate");
    first.stop().await;

    assert_eq!(std::fs::metadata(&key_path).expect("key file").permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(cert_path.parent().expect("pki")).expect("pki dir").permissions().mode() & 0o777,
        0o700
    );
    let stored = std::fs::read(&cert_path).expect("cert file");
    assert_eq!(
        CertificateDer::pem_slice_iter(&stored).next().expect("one cert").expect("PEM").as_ref(),
        served.as_ref(),
        "the served certificate is the stored one"
    );

    // A restart serves the very same certificate.
    let second = Running::start(&config, FakeView::new()).await;
    let again = get(second.main, &https(), "/healthz", None).await.server_cert.expect("server certificate");
    assert_eq!(again, served, "the certificate is reused across restarts");

    // Clients can pin it: it verifies for "localhost" with itself as the only root.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(served.clone()).expect("root");
    let pinned = get(second.main, &ClientTls::Verify(Arc::new(roots)), "/healthz", None).await;
    assert_eq!(pinned.status, StatusCode::UNAUTHORIZED, "TLS verified; anonymous still refused");
    second.stop().await;
    assert!(!dir.path().join("pki/nodelet.key.tmp").exists());
}

#[tokio::test]
async fn configured_certificate_and_key_are_served() {
    let dir = tempdir();
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let cert_file = dir.path().join("serving.crt");
    let key_file = dir.path().join("serving.key");
    write_file(&cert_file, &cert.pem());
    write_file(&key_file, &key.serialize_pem());

    let mut config = test_config(dir.path());
    config.tls_cert_file = Some(cert_file.clone());
    let err = Servers::bind(&config, FakeView::new()).await.expect_err("a certificate without a key");
    assert!(matches!(err, ServerError::Tls(TlsError::IncompleteCertKeyPair)), "{err}");

    config.tls_private_key_file = Some(key_file);
    let server = Running::start(&config, FakeView::new()).await;
    let served = get(server.main, &https(), "/healthz", None).await.server_cert.expect("server cert");
    assert_eq!(served.as_ref(), cert.der().as_ref());
    server.stop().await;
    assert!(!dir.path().join("pki").exists(), "no self-signed certificate when one is configured");

    // A key that does not match the certificate is refused at start.
    let other_key = rcgen::KeyPair::generate().expect("key");
    let wrong_key_file = dir.path().join("wrong.key");
    write_file(&wrong_key_file, &other_key.serialize_pem());
    config.tls_private_key_file = Some(wrong_key_file);
    let err = Servers::bind(&config, FakeView::new()).await.expect_err("mismatched key");
    assert!(matches!(err, ServerError::Tls(TlsError::Rustls(_))), "{err}");
}

// ---------------------------------------------------------------------------------------------------------
// Endpoints.

#[tokio::test]
async fn pods_returns_the_views_pod_list() {
    let dir = tempdir();
    let mut config = test_config(dir.path());
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "tok,alice,1\n");
    config.token_auth_file = Some(token_file);
    let view = FakeView::new();
    let server = Running::start(&config, view.clone()).await;

    let reply = get(server.main, &https(), "/pods", Some("tok")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.content_type, "application/json");
    let raw: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(raw["kind"], "PodList");
    assert_eq!(raw["apiVersion"], "v1");
    let list: List<Pod> = serde_json::from_str(&reply.body).expect("a v1 PodList");
    assert_eq!(list, view.pods());
    assert_eq!(list.items[0].status.as_ref().and_then(|s| s.pod_ip.as_deref()), Some("198.18.0.7"));

    // Live: the next request sees the view's new state.
    view.pods.lock().expect("lock").items.clear();
    let list: List<Pod> =
        serde_json::from_str(&get(server.main, &https(), "/pods", Some("tok")).await.body).expect("JSON");
    assert!(list.items.is_empty());

    let metrics = get(server.main, &https(), "/metrics", Some("tok")).await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert_eq!(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert_eq!(metrics.body, view.metrics);
    // The other metric endpoints: behind authentication too.
    for path in ["/metrics/probes", "/metrics/cadvisor"] {
        assert_eq!(get(server.main, &https(), path, None).await.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let probes = get(server.main, &https(), "/metrics/probes", Some("tok")).await;
    assert_eq!((probes.status, probes.body.as_str()), (StatusCode::OK, PROBE_METRICS));
    // No summary here: cAdvisor's scrape error, nothing made up.
    let cadvisor = get(server.main, &https(), "/metrics/cadvisor", Some("tok")).await;
    assert_eq!(cadvisor.content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(cadvisor.body.contains("container_scrape_error 1\n"), "{}", cadvisor.body);
    assert!(!cadvisor.body.contains("container_cpu"), "{}", cadvisor.body);
    server.stop().await;
}

#[tokio::test]
async fn read_only_port_serves_pods_without_auth_and_has_no_logs() {
    let dir = tempdir();
    let mut config = test_config(dir.path());
    config.read_only_port = Some(0);
    let view = FakeView::new();
    let log = dir.path().join("0.log");
    write_file(&log, "2024-01-01T00:00:00.000000001Z stdout F secret log line\n");
    view.set_log("default", "web", "app", &log);
    let server = Running::start(&config, view.clone()).await;
    let read_only = server.read_only.expect("read-only port enabled");
    assert_ne!(read_only, server.main);

    let pods = get(read_only, &ClientTls::Plain, "/pods", None).await;
    assert_eq!(pods.status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<List<Pod>>(&pods.body).expect("PodList"), view.pods());
    assert_eq!(get(read_only, &ClientTls::Plain, "/metrics", None).await.body, view.metrics);
    assert_eq!(get(read_only, &ClientTls::Plain, "/metrics/probes", None).await.body, PROBE_METRICS);
    let cadvisor = get(read_only, &ClientTls::Plain, "/metrics/cadvisor", None).await;
    assert_eq!(cadvisor.status, StatusCode::OK);
    assert!(cadvisor.body.contains("container_scrape_error 1\n"), "{}", cadvisor.body);
    assert_eq!(get(read_only, &ClientTls::Plain, "/healthz", None).await.body, "ok");

    let logs = get(read_only, &ClientTls::Plain, "/containerLogs/default/web/app", None).await;
    assert_eq!(logs.status, StatusCode::NOT_FOUND);
    assert!(!logs.body.contains("secret"));
    assert_eq!(logs.api_status().reason.as_deref(), Some("NotFound"));
    server.stop().await;

    // Disabled by default.
    let server = Running::start(&test_config(dir.path()), FakeView::new()).await;
    assert!(server.read_only.is_none());
    server.stop().await;
}

/// Issue 37: the read-only port serves the kubelet's set (`/pods`, `/stats/summary`, `/metrics*`,
/// `/healthz`) and no more: events, nodes, volumes, storage classes, CSI nodes and extension tables are
/// served on the main port only, behind authentication.
#[tokio::test]
async fn objects_beyond_the_kubelets_read_only_set_are_served_on_the_main_port_only() {
    struct Table;
    impl crate::StatusTable for Table {
        fn columns(&self) -> Vec<String> {
            vec!["NAME".into()]
        }
        fn rows(&self) -> Vec<Vec<String>> {
            vec![vec!["row-1".into()]]
        }
    }
    let dir = tempdir();
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "tok,alice,uid-1\n");
    let mut config = test_config(dir.path());
    config.read_only_port = Some(0);
    config.token_auth_file = Some(token_file);
    config.extensions.insert("prepull".into(), Arc::new(Table));
    let server = Running::start(&config, FakeView::new()).await;
    let read_only = server.read_only.expect("read-only port enabled");
    for path in [
        "/api/v1/events",
        "/api/v1/nodes",
        "/api/v1/nodes/node-a",
        "/api/v1/persistentvolumes",
        "/api/v1/persistentvolumeclaims",
        "/apis/storage.k8s.io/v1/storageclasses",
        "/apis/storage.k8s.io/v1/csinodes",
        "/extensions/prepull",
    ] {
        let plain = get(read_only, &ClientTls::Plain, path, None).await;
        assert_eq!(plain.status, StatusCode::NOT_FOUND, "{path} on the read-only port: {}", plain.body);
        let anonymous = get(server.main, &https(), path, None).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{path} on the main port without credentials");
        let served = get(server.main, &https(), path, Some("tok")).await;
        // The fake view has no node-a: 404 from the handler itself, with its own message.
        if path.ends_with("/node-a") {
            assert_eq!(served.status, StatusCode::NOT_FOUND, "{path}: {}", served.body);
            assert!(served.body.contains("nodes \\\"node-a\\\" not found"), "{path}: {}", served.body);
        } else {
            assert_eq!(served.status, StatusCode::OK, "{path} on the main port: {}", served.body);
        }
    }
    // The kubelet's read-only set is still there.
    for path in ["/pods", "/healthz", "/metrics", "/metrics/resource", "/metrics/cadvisor", "/metrics/probes"]
    {
        let reply = get(read_only, &ClientTls::Plain, path, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{path} on the read-only port: {}", reply.body);
    }
    server.stop().await;
}

#[tokio::test]
async fn healthz_port_answers_on_loopback() {
    let dir = tempdir();
    let view = FakeView::new();
    let server = Running::start(&test_config(dir.path()), view.clone()).await;
    let healthz = server.healthz.expect("healthz port enabled");
    assert_eq!(healthz.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(ServerConfig::new("n").healthz_bind_address, IpAddr::V4(Ipv4Addr::LOCALHOST));

    let ok = get(healthz, &ClientTls::Plain, "/healthz", None).await;
    assert_eq!((ok.status, ok.body.as_str()), (StatusCode::OK, "ok"));

    *view.health.lock().expect("lock") = Err(Unhealthy::RuntimeNotReady);
    let failing = get(healthz, &ClientTls::Plain, "/healthz", None).await;
    assert_eq!(failing.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failing.body, "healthz check failed: container runtime is not ready\n");

    assert_eq!(get(healthz, &ClientTls::Plain, "/pods", None).await.status, StatusCode::NOT_FOUND);
    server.stop().await;
}

#[tokio::test]
async fn bind_errors_name_the_port_and_the_address() {
    let dir = tempdir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let mut config = test_config(dir.path());
    config.healthz_port = Some(port);
    let err = tokio::time::timeout(LIMIT, serve(&config, FakeView::new(), std::future::pending()))
        .await
        .expect("serve returns at once")
        .expect_err("port in use");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")) && text.contains("--healthz-port"), "{text}");
    assert!(matches!(err, ServerError::Bind { .. }));
}

// ---------------------------------------------------------------------------------------------------------
// Container logs.

const LOG: &str = "\
2024-05-01T10:00:00.1Z stdout F first line
2024-05-01T10:00:01.000000002+02:00 stderr P second
2024-05-01T10:00:01.000000003+02:00 stderr P  line in
2024-05-01T10:00:01.000000004+02:00 stderr F  three parts
this line is not in CRI format
2024-05-01T10:00:02Z stdout F third line
2024-05-01T10:00:03Z stdout F fourth line
";

async fn logs_server(dir: &Path, contents: &str) -> (Running, Arc<FakeView>, PathBuf) {
    let mut config = test_config(dir);
    let token_file = dir.join("tokens.csv");
    write_file(&token_file, "tok,alice,1\n");
    config.token_auth_file = Some(token_file);
    let view = FakeView::new();
    let log = dir.join("2.log");
    write_file(&log, contents);
    view.set_log("default", "web", "app", &log);
    (Running::start(&config, view.clone()).await, view, log)
}

#[tokio::test]
async fn container_logs_return_the_containers_lines() {
    let dir = tempdir();
    let (server, view, _log) = logs_server(dir.path(), LOG).await;
    let logs = |query: &str| {
        let path = format!("/containerLogs/default/web/app{query}");
        async move { get(server.main, &https(), &path, Some("tok")).await }
    };

    let all = logs("").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    assert_eq!(all.body, "first line\nsecond line in three parts\nthird line\nfourth line\n");

    assert_eq!(logs("?tailLines=2").await.body, "third line\nfourth line\n");
    assert_eq!(logs("?tailLines=3").await.body, "second line in three parts\nthird line\nfourth line\n");
    assert_eq!(logs("?tailLines=0").await.body, "");
    assert_eq!(logs("?tailLines=100").await.body, all.body);
    assert_eq!(logs("?limitBytes=14").await.body, "first line\nsec");
    assert_eq!(
        logs("?timestamps=true&tailLines=3").await.body,
        "2024-05-01T10:00:01.000000002+02:00 second line in three parts\n\
         2024-05-01T10:00:02.000000000Z third line\n\
         2024-05-01T10:00:03.000000000Z fourth line\n"
    );
    // A container that has stopped: follow returns what there is and ends.
    view.running.store(false, Ordering::SeqCst);
    assert_eq!(logs("?follow=true&tailLines=1").await.body, "fourth line\n");

    let bad = logs("?tailLines=-1").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    // The kubelet's errors on this path are plain text (the API server quotes them verbatim).
    assert_eq!(bad.content_type, "text/plain; charset=utf-8");
    assert!(bad.body.starts_with("tailLines: must be 0 or more"), "{}", bad.body);
    // The newest log is 2.log: no 1.log yet, so no previous instance.
    let no_previous = logs("?previous=true").await;
    assert_eq!(no_previous.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_previous.body, "previous terminated container \"app\" in pod \"web\" not found");
    write_file(&dir.path().join("1.log"), "2024-05-01T09:00:00.000000000Z stdout F the previous run\n");
    let previous = logs("?previous=true&follow=true").await;
    assert_eq!(previous.body, "the previous run\n", "a previous instance is read to its end, not followed");
    assert_eq!(logs("?sinceTime=2024-05-01T10:00:01.5Z").await.body, "third line\nfourth line\n");

    let missing_container =
        get(server.main, &https(), "/containerLogs/default/web/sidecar", Some("tok")).await;
    assert_eq!(missing_container.status, StatusCode::NOT_FOUND);
    let missing_pod = get(server.main, &https(), "/containerLogs/default/nope/app", Some("tok")).await;
    assert_eq!(missing_pod.status, StatusCode::NOT_FOUND);
    assert_eq!(missing_pod.body, "pod \"default/nope\" does not exist");
    for hostile in [
        "/containerLogs/default/%2e%2e/app",
        "/containerLogs/default/web/..%2F..%2Fetc",
        "/containerLogs/Default/web/app",
    ] {
        let reply = get(server.main, &https(), hostile, Some("tok")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{hostile}: {}", reply.body);
    }
    server.stop().await;
}

#[tokio::test]
async fn container_logs_refuse_symbolic_links() {
    let dir = tempdir();
    let (server, view, _log) = logs_server(dir.path(), LOG).await;
    let target = dir.path().join("host-secret");
    write_file(&target, "2024-05-01T10:00:00Z stdout F host secret\n");
    let link = dir.path().join("linked.log");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    view.set_log("default", "web", "app", &link);
    let reply = get(server.main, &https(), "/containerLogs/default/web/app", Some("tok")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert!(!reply.body.contains("host secret"));
    server.stop().await;
}

/// Reads body frames until `want` has been received in total, or fails after [`LIMIT`].
async fn read_until(body: &mut Incoming, got: &mut String, want: &str) {
    tokio::time::timeout(LIMIT, async {
        while !got.contains(want) {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        got.push_str(std::str::from_utf8(&data).expect("UTF-8"));
                    }
                }
                Some(Err(e)) => panic!("body error: {e}"),
                None => panic!("stream ended before {want:?}; got {got:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {want:?}; got {got:?}"));
}

fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).expect("open log");
    file.write_all(text.as_bytes()).expect("append");
    file.flush().expect("flush");
}

#[tokio::test]
async fn follow_streams_new_lines_until_the_container_stops() {
    let dir = tempdir();
    let (server, view, log) = logs_server(dir.path(), "2024-05-01T10:00:00Z stdout F before\n").await;
    let opened = open(
        server.main,
        &https(),
        Method::GET,
        "/containerLogs/default/web/app?follow=true&timestamps=true",
        Some("tok"),
    )
    .await
    .expect("open follow");
    assert_eq!(opened.response.status(), StatusCode::OK);
    let mut body = opened.response.into_body();
    let mut got = String::new();
    read_until(&mut body, &mut got, "before\n").await;
    assert_eq!(got, "2024-05-01T10:00:00.000000000Z before\n");

    append(&log, "2024-05-01T10:00:05Z stdout F after one\n");
    read_until(&mut body, &mut got, "after one\n").await;
    // A line whose write is split in the middle, and a partial segment, arrive as one line.
    append(&log, "2024-05-01T10:00:06Z stderr P joi");
    tokio::time::sleep(Duration::from_millis(300)).await;
    append(&log, "ned \n2024-05-01T10:00:06.5Z stderr F later\n");
    read_until(&mut body, &mut got, "later\n").await;
    assert_eq!(
        got,
        "2024-05-01T10:00:00.000000000Z before\n\
         2024-05-01T10:00:05.000000000Z after one\n\
         2024-05-01T10:00:06.000000000Z joined later\n"
    );

    // The container exits after a last line: the line is delivered, then the stream ends.
    append(&log, "2024-05-01T10:00:07Z stdout F last words\n");
    view.running.store(false, Ordering::SeqCst);
    let rest =
        tokio::time::timeout(LIMIT, body.collect()).await.expect("stream ends").expect("body").to_bytes();
    assert_eq!(String::from_utf8_lossy(&rest), "2024-05-01T10:00:07.000000000Z last words\n");
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_followed_logs_promptly() {
    let dir = tempdir();
    let (server, _view, _log) = logs_server(dir.path(), "2024-05-01T10:00:00Z stdout F hello\n").await;
    let opened =
        open(server.main, &https(), Method::GET, "/containerLogs/default/web/app?follow=1", Some("tok"))
            .await
            .expect("open follow");
    let mut body = opened.response.into_body();
    let mut got = String::new();
    read_until(&mut body, &mut got, "hello\n").await;

    let started = tokio::time::Instant::now();
    server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "stopping waited {:?} on a follower",
        started.elapsed()
    );
    let rest = tokio::time::timeout(LIMIT, body.collect()).await.expect("stream ends");
    assert!(rest.is_ok_and(|r| r.to_bytes().is_empty()));
}

// ---------------------------------------------------------------------------------------------------------
// Hostile request lines (issue 14): random and mutated HTTP/1.1 requests, as bytes on a plain port and as
// query strings on the authenticated main port. The servers answer each with a 2xx, 3xx or 4xx status (never
// a 5xx) or close the connection, within `LIMIT`, and still serve a real client afterwards. Cases:
// `NODELET_FUZZ_CASES` (default 256), as in `crate::fuzz_tests`.

fn fuzz_cases() -> u32 {
    std::env::var("NODELET_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// A request line and headers: well-formed pieces, mutated ones, and bytes.
fn hostile_request() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let method = prop_oneof![
        Just("GET".to_owned()),
        Just("HEAD".to_owned()),
        Just("POST".to_owned()),
        Just("CONNECT".to_owned()),
        "[A-Z]{0,12}",
        "[\\x00-\\x7f]{0,8}",
    ];
    let path = prop_oneof![
        Just("/pods".to_owned()),
        Just("/metrics".to_owned()),
        Just("/healthz".to_owned()),
        "/(pods|metrics|healthz|stats|containerLogs|exec|run|attach|portForward|runningpods|configz|logs)(/[a-zA-Z0-9%._~-]{0,40}){0,6}(\\?([a-zA-Z%=&+;0-9-]{0,120}))?",
        "[\\x21-\\x7e]{0,200}",
        "\\*|https?://[a-z.]{0,20}(:[0-9]{0,6})?/[a-z]{0,10}",
    ];
    let version = prop_oneof![
        Just("HTTP/1.1".to_owned()),
        Just("HTTP/1.0".to_owned()),
        "HTTP/[0-9]\\.[0-9]{0,3}",
        "[\\x00-\\x7f]{0,10}"
    ];
    let header = prop_oneof![
        Just("Host: localhost".to_owned()),
        Just("Transfer-Encoding: chunked".to_owned()),
        Just("Content-Length: 18446744073709551616".to_owned()),
        Just("Content-Length: -1".to_owned()),
        Just("Upgrade: websocket\r\nConnection: Upgrade".to_owned()),
        "[A-Za-z-]{1,20}: [\\x20-\\x7e]{0,100}",
        "[\\x00-\\x7f]{0,60}",
    ];
    let junk = proptest::collection::vec(any::<u8>(), 0..512);
    (method, path, version, proptest::collection::vec(header, 0..6), junk, any::<bool>()).prop_map(
        |(method, path, version, headers, junk, raw)| {
            if raw {
                return junk;
            }
            let mut request = format!("{method} {path} {version}\r\n");
            for h in headers {
                request.push_str(&h);
                request.push_str("\r\n");
            }
            request.push_str("\r\n");
            let mut bytes = request.into_bytes();
            bytes.extend_from_slice(&junk[..junk.len().min(64)]);
            bytes
        },
    )
}

/// Sends `request` on a new connection and returns the status code of the answer, or `None` when the
/// server closed the connection without one.
async fn raw_status(addr: SocketAddr, request: &[u8]) -> Result<Option<u16>, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    // The server may close before reading everything: a write error is an answer too.
    let _ = tcp.write_all(request).await;
    let _ = tcp.shutdown().await;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(LIMIT, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    head.extend_from_slice(&buf[..n]);
                    if head.windows(2).any(|w| w == b"\r\n") || head.len() > 64 * 1024 {
                        return;
                    }
                }
            }
        }
    })
    .await;
    if read.is_err() {
        return Err(format!("no answer and no close within {LIMIT:?}"));
    }
    let line = String::from_utf8_lossy(&head);
    let Some(status) = line.strip_prefix("HTTP/1.").and_then(|r| r.get(2..5)) else {
        return if head.is_empty() { Ok(None) } else { Err(format!("not an HTTP answer: {line:?}")) };
    };
    status.parse().map(Some).map_err(|_| format!("bad status line {line:?}"))
}

#[test]
fn hostile_request_lines_get_a_4xx_or_a_close_and_the_servers_keep_serving() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempdir();
    let mut config = test_config(dir.path());
    config.read_only_port = Some(0);
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "tok,alice,1\n");
    config.token_auth_file = Some(token_file);
    let view = FakeView::new();
    let log = dir.path().join("0.log");
    write_file(&log, "2024-01-01T00:00:00.000000001Z stdout F a log line\n");
    view.set_log("default", "web", "app", &log);
    let server = rt.block_on(Running::start(&config, view));
    let read_only = server.read_only.expect("read-only port");
    let healthz = server.healthz.expect("healthz port");

    let mut runner =
        TestRunner::new(Config { cases: fuzz_cases(), failure_persistence: None, ..Config::default() });
    runner
        .run(&hostile_request(), |request| {
            for addr in [read_only, healthz] {
                match rt.block_on(raw_status(addr, &request)) {
                    Ok(Some(status)) if status >= 500 => {
                        return Err(TestCaseError::fail(format!(
                            "{status} for {:?}",
                            String::from_utf8_lossy(&request)
                        )));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "{e} for {:?}",
                            String::from_utf8_lossy(&request)
                        )));
                    }
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));

    // Query strings on the main port's routes, authenticated: every answer below 500.
    let query = "[a-zA-Z0-9%=&+;._~-]{0,160}";
    let route = proptest::sample::select(vec![
        "/containerLogs/default/web/app",
        "/containerLogs/default/web/nope",
        "/pods",
        "/stats/summary",
        "/runningpods/",
        "/exec/default/web/app",
        "/run/default/web/app",
        "/attach/default/web/app",
        "/portForward/default/web",
        "/metrics/resource",
    ]);
    runner
        .run(&(route, query), |(route, query)| {
            let path = format!("{route}?{query}");
            let reply = rt.block_on(request(server.main, &https(), Method::GET, &path, Some("tok")));
            match reply {
                Ok(r) if r.status.is_server_error() && r.status != StatusCode::SERVICE_UNAVAILABLE => {
                    Err(TestCaseError::fail(format!("{} for {path}: {}", r.status, r.body)))
                }
                Ok(_) => Ok(()),
                // hyper's client refuses some URIs itself: nothing reached the server
                Err(e) if e.starts_with("request: ") || e.contains("invalid") => Ok(()),
                Err(e) => Err(TestCaseError::fail(format!("{e} for {path}"))),
            }
        })
        .unwrap_or_else(|e| panic!("{e}"));

    // Still serving.
    let pods = rt.block_on(get(server.main, &https(), "/pods", Some("tok")));
    assert_eq!(pods.status, StatusCode::OK);
    let plain = rt.block_on(get(read_only, &ClientTls::Plain, "/healthz", None));
    assert_eq!(plain.body, "ok");
    rt.block_on(server.stop());
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoints.

#[tokio::test]
async fn checkpoints_need_their_own_subresource_and_answer_as_the_kubelet() {
    use serde_json::{Value, json};
    // alice may do everything; "exec-only" may use the proxy subresource (exec, attach, ...) only.
    let (client, seen, _calls) = webhook::tests::fake_client(|body: &Value| {
        let spec = &body["spec"];
        let allowed = spec["user"] == "alice"
            || (spec["user"] == "exec-only" && spec["resourceAttributes"]["subresource"] == "proxy");
        Ok(json!({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "spec": spec,
                  "status": {"allowed": allowed}}))
    });
    let dir = tempdir();
    let token_file = dir.path().join("tokens.csv");
    write_file(&token_file, "alice-token,alice,uid-1\nexec-token,exec-only,uid-2\n");
    let mut config = test_config(dir.path());
    config.token_auth_file = Some(token_file);
    config.authorization = AuthorizationMode::Webhook {
        cache_authorized_ttl: Duration::from_secs(300),
        cache_unauthorized_ttl: Duration::from_secs(30),
    };
    config.kube_client = Some(ApiClient(client));
    // A runtime that is not there: the checkpoint call fails with its error.
    let socket = dir.path().join("no-runtime.sock");
    let cri = nodelet_cri::CriConfig::new(format!("unix://{}", socket.display()))
        .with_connect_timeout(Duration::from_secs(2));
    config.runtime = Some(nodelet_cri::CriClient::connect_lazy(cri).expect("lazy client"));
    let server = Running::start(&config, FakeView::new()).await;
    let post = |path: &'static str, token: &'static str| {
        let main = server.main;
        async move {
            request(main, &https(), Method::POST, path, Some(token))
                .await
                .unwrap_or_else(|e| panic!("POST {path}: {e}"))
        }
    };

    // Allowed to exec is not allowed to checkpoint: a 403 naming the checkpoint subresource, verb create.
    let denied = post("/checkpoint/default/web/app", "exec-token").await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{}", denied.body);
    assert_eq!(
        denied.api_status().message.as_deref(),
        Some("Forbidden (user=exec-only, verb=create, resource=nodes, subresource(s)=[checkpoint])")
    );
    assert!(!dir.path().join("checkpoints").exists(), "nothing is made for a refused request");
    // GET is not the checkpoint verb: authorized (as get), then 405.
    let get_reply =
        request(server.main, &https(), Method::GET, "/checkpoint/default/web/app", Some("alice-token"))
            .await
            .expect("GET");
    assert_eq!(get_reply.status, StatusCode::METHOD_NOT_ALLOWED, "{}", get_reply.body);

    // The kubelet's answers, in its order: pod, container in the spec, timeout, running container.
    for (path, code, message) in [
        ("/checkpoint/default/nope/app", StatusCode::NOT_FOUND, "pod does not exist".to_owned()),
        ("/checkpoint/default/web/nope", StatusCode::NOT_FOUND, "container nope does not exist".to_owned()),
        (
            "/checkpoint/default/web/app?timeout=10&timeout=x",
            StatusCode::NOT_FOUND,
            "cannot parse value of timeout parameter".to_owned(),
        ),
        (
            "/checkpoint/default/web/done",
            StatusCode::INTERNAL_SERVER_ERROR,
            "checkpointing of default/web/done failed (container done not found)".to_owned(),
        ),
        (
            "/checkpoint/default/web/app?timeout=-1",
            StatusCode::INTERNAL_SERVER_ERROR,
            "checkpointing of default/web/app failed (CheckpointContainer requires the timeout value to be > 0)"
                .to_owned(),
        ),
    ] {
        let reply = post(path, "alice-token").await;
        assert_eq!(reply.status, code, "{path}: {}", reply.body);
        assert_eq!(reply.api_status().message.as_deref(), Some(message.as_str()), "{path}");
    }
    // The runtime's error comes back in a 500; the directory was made 0700 for the archive.
    let failed = post("/checkpoint/default/web/app?timeout=5", "alice-token").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", failed.body);
    let message = failed.api_status().message.unwrap_or_default();
    assert!(
        message.starts_with("checkpointing of default/web/app failed (CRI CheckpointContainer"),
        "{message}"
    );
    let mode = std::fs::metadata(dir.path().join("checkpoints")).expect("made").permissions().mode();
    assert_eq!(mode & 0o7777, 0o700);
    let sar = seen
        .lock()
        .expect("lock")
        .iter()
        .rev()
        .find(|(_, p, _)| p.ends_with("/subjectaccessreviews"))
        .cloned();
    let Some((_, _, sar)) = sar else { panic!("no SubjectAccessReview") };
    assert_eq!(sar["spec"]["resourceAttributes"]["subresource"], "checkpoint");
    assert_eq!(sar["spec"]["resourceAttributes"]["verb"], "create");
    server.stop().await;
}
