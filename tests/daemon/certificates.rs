//! The certificate manager against a real kube-apiserver (envtest): TLS bootstrap with the suite's
//! controller manager approving and signing; client and serving certificate rotation with a control plane
//! of the test's own, where the test is approver and signer (60 s certificates signed with the envtest CA);
//! and the hostile cases (a denied CSR, an expired certificate, a certificate of another CA).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::sleep;

use crate::cluster_support::{ClusterEnv, ClusterNode, ControlPlane, cluster_or_skip, kubectl};
use crate::support::{StartOptions, sleep_until_term};

/// How long the waits for something nodelet should do within seconds may take.
const WAIT: Duration = Duration::from_secs(60);
/// The lifetime of the certificates the test signs.
const SHORT_CERT: i64 = 60;

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Writes the bootstrap-token kubeconfig of `cluster` with envtest's `bootstrap-kubeconfig.sh`.
async fn bootstrap_kubeconfig(cluster: &ClusterEnv, out: &Path) {
    let script = cluster.scripts.join("bootstrap-kubeconfig.sh");
    let output = tokio::process::Command::new(&script)
        .arg(out)
        .env("ENVTEST_BASE", &cluster.base)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(output.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&output.stderr));
}

/// The credential flags of a TLS bootstrap: `--bootstrap-kubeconfig <dir>/bootstrap.kubeconfig --kubeconfig
/// <dir>/kubeconfig` (the latter not there yet).
async fn bootstrap_args(cluster: &ClusterEnv, dir: &Path) -> Vec<String> {
    let boot = dir.join("bootstrap.kubeconfig");
    bootstrap_kubeconfig(cluster, &boot).await;
    vec![
        "--bootstrap-kubeconfig".to_owned(),
        boot.display().to_string(),
        "--kubeconfig".to_owned(),
        dir.join("kubeconfig").display().to_string(),
    ]
}

/// The parsed first certificate of a PEM text: (subject, issuer, notBefore, notAfter, SAN text).
fn cert_facts(pem: &[u8]) -> (String, String, i64, i64, String) {
    use rustls::pki_types::pem::PemObject as _;
    match rustls::pki_types::CertificateDer::pem_slice_iter(pem).next() {
        Some(Ok(der)) => cert_facts_der(der.as_ref()),
        _ => panic!("no certificate in {}", String::from_utf8_lossy(pem)),
    }
}

fn cert_facts_der(der: &[u8]) -> (String, String, i64, i64, String) {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).unwrap_or_else(|e| panic!("bad certificate: {e}"));
    let sans =
        cert.subject_alternative_name().ok().flatten().map(|s| format!("{:?}", s.value)).unwrap_or_default();
    (
        cert.subject().to_string(),
        cert.issuer().to_string(),
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
        sans,
    )
}

/// The envtest CA as an rcgen issuer.
fn ca_issuer(cluster: &ClusterEnv) -> rcgen::Issuer<'static, rcgen::KeyPair> {
    let pki = cluster.base.join("pki");
    let read = |name: &str| {
        std::fs::read_to_string(pki.join(name)).unwrap_or_else(|e| panic!("cannot read {name}: {e}"))
    };
    let key = rcgen::KeyPair::from_pem(&read("ca.key")).unwrap_or_else(|e| panic!("ca.key: {e}"));
    rcgen::Issuer::from_ca_cert_pem(&read("ca.crt"), key).unwrap_or_else(|e| panic!("ca.crt: {e}"))
}

/// Signs the PEM CSR `request` with `issuer`, valid from now for `lifetime` seconds (negative start: an
/// already expired certificate), for `usage` (client or server auth).
fn sign(
    request: &str,
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    from: i64,
    lifetime: i64,
    server: bool,
) -> String {
    let mut csr =
        rcgen::CertificateSigningRequestParams::from_pem(request).unwrap_or_else(|e| panic!("CSR: {e}"));
    let start = time::OffsetDateTime::from_unix_timestamp(from).unwrap_or_else(|e| panic!("{e}"));
    csr.params.not_before = start;
    csr.params.not_after = start + Duration::from_secs(lifetime.unsigned_abs());
    csr.params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    csr.params.extended_key_usages = vec![if server {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    }];
    csr.params.is_ca = rcgen::IsCa::ExplicitNoCa;
    csr.signed_by(issuer).unwrap_or_else(|e| panic!("signing: {e}")).pem()
}

/// A kubeconfig for `cluster` with the given client certificate and key.
fn write_cert_kubeconfig(cluster: &ClusterEnv, out: &Path, cert_pem: &str, key_pem: &str) {
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = std::fs::read(&cluster.ca).unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{}\", certificate-authority-data: \
         \"{}\"}}\nusers:\n- name: u\n  user: {{client-certificate-data: \"{}\", client-key-data: \"{}\"}}\n\
         contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        cluster.apiserver_url,
        b64(&ca),
        b64(cert_pem.as_bytes()),
        b64(key_pem.as_bytes())
    );
    std::fs::write(out, text).unwrap_or_else(|e| panic!("{e}"));
}

/// A key and CSR of `system:node:<node>`, like nodelet's.
fn node_key_and_csr(node: &str) -> (rcgen::KeyPair, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap_or_else(|e| panic!("{e}"));
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    let csr = params.serialize_request(&key).and_then(|c| c.pem()).unwrap_or_else(|e| panic!("{e}"));
    (key, csr)
}

/// The CSRs whose request is for `system:node:<node>`.
async fn csrs_of(client: &kube::Client, node: &str) -> Vec<CertificateSigningRequest> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await.unwrap_or_else(|e| panic!("list CSRs: {e}"));
    let cn = format!("CN=system:node:{node}");
    list.items
        .into_iter()
        .filter(|c| {
            use rustls::pki_types::pem::PemObject as _;
            use x509_parser::prelude::FromDer as _;
            let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(&c.spec.request.0)
                .map(|d| d.as_ref().to_vec())
                .unwrap_or_default();
            x509_parser::certification_request::X509CertificationRequest::from_der(&der)
                .is_ok_and(|(_, r)| r.certification_request_info.subject.to_string().contains(&cn))
        })
        .collect()
}

fn has_condition(c: &CertificateSigningRequest, kind: &str) -> bool {
    c.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|v| v.iter().any(|x| x.type_ == kind))
}

fn is_issued(c: &CertificateSigningRequest) -> bool {
    c.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|b| !b.0.is_empty())
}

/// What the test's signer did: (CSR name, signer, user who created it, when it was first seen, notBefore
/// and notAfter of the certificate it issued).
#[derive(Debug, Clone)]
struct Issued {
    #[allow(dead_code, reason = "shown in failure messages")]
    name: String,
    signer: String,
    username: String,
    seen: i64,
    not_before: i64,
    not_after: i64,
}

/// The test as approver and signer: approves (or, while `deny` is set, denies) every pending CSR of
/// `node`, signs approved ones with the envtest CA for [`SHORT_CERT`] seconds; until `stop`.
async fn signer_loop(
    client: kube::Client,
    cluster: ClusterEnv,
    node: String,
    deny: std::sync::Arc<std::sync::atomic::AtomicBool>,
    issued: std::sync::Arc<std::sync::Mutex<Vec<Issued>>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let issuer = ca_issuer(&cluster);
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    while !stop.is_cancelled() {
        for csr in csrs_of(&client, &node).await {
            let Some(name) = csr.metadata.name.clone() else { continue };
            if is_issued(&csr) || has_condition(&csr, "Denied") || has_condition(&csr, "Failed") {
                continue;
            }
            let seen = now_unix();
            if !has_condition(&csr, "Approved") {
                let denying = deny.load(std::sync::atomic::Ordering::SeqCst);
                let (kind, reason) =
                    if denying { ("Denied", "E2EDenied") } else { ("Approved", "E2EApproved") };
                let patch = json!({"status": {"conditions": [{
                    "type": kind, "status": "True", "reason": reason, "message": "the e2e test decided",
                }]}});
                if let Err(e) =
                    api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch)).await
                {
                    panic!("approval of {name}: {e}");
                }
                if denying {
                    continue;
                }
            }
            let request = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
            let server = csr.spec.signer_name == "kubernetes.io/kubelet-serving";
            let pem = sign(&request, &issuer, seen, SHORT_CERT, server);
            let patch =
                json!({"status": {"certificate": base64::engine::general_purpose::STANDARD.encode(&pem)}});
            if let Err(e) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                panic!("status of {name}: {e}");
            }
            if let Ok(mut v) = issued.lock() {
                v.push(Issued {
                    name,
                    signer: csr.spec.signer_name.clone(),
                    username: csr.spec.username.clone().unwrap_or_default(),
                    seen,
                    not_before: seen,
                    not_after: seen + SHORT_CERT,
                });
            }
        }
        sleep(Duration::from_millis(250)).await;
    }
}

/// The certificate the main port presents (PEM), as `openssl s_client` shows it.
async fn served_cert(port: u16) -> Vec<u8> {
    let output = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-showcerts"])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run openssl s_client: {e}"));
    output.stdout
}

/// `kubelet_certificate_manager_*` of `/metrics` (read-only port).
async fn metric(n: &ClusterNode, name: &str) -> Option<f64> {
    let url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let text = n.http().get(&url).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).and_then(|v| v.trim().parse().ok()))
}

fn ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

// ------------------------------------------------------------------------------------------------ bootstrap

#[tokio::test]
async fn tls_bootstrap_gets_a_client_certificate_from_the_cluster_and_the_node_joins() {
    let (env, cluster) =
        cluster_or_skip!("tls_bootstrap_gets_a_client_certificate_from_the_cluster_and_the_node_joins");
    if let Err(e) = cluster.controllers_running() {
        panic!("this test needs the suite's kube-controller-manager (ENVTEST_CONTROLLERS=1): {e}");
    }
    let mut n = ClusterNode::start_with_credentials(
        &env,
        &cluster,
        "tlsboot",
        StartOptions::default(),
        async |c, _, d| bootstrap_args(c, d).await,
    )
    .await;
    let node = n.node().to_owned();
    n.wait_until("the Node to register and be Ready", WAIT, async || match n.node_object().await {
        Some(o) if ready(&o) => Ok(()),
        Some(o) => Err(crate::cluster_support::pretty(&o)),
        None => Err("no Node".to_owned()),
    })
    .await;

    // the pem, its symlink and the kubeconfig
    let pki = n.root_dir().join("pki");
    let link = pki.join("nodelet-client-current.pem");
    let target =
        std::fs::read_link(&link).unwrap_or_else(|e| panic!("{}: not a symlink: {e}", link.display()));
    let target_name = target.display().to_string();
    assert!(
        target_name.starts_with("nodelet-client-20")
            && target_name.ends_with(".pem")
            && target_name.len() == 38,
        "the symlink points at {target_name}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(pki.join(&target)).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
    assert_eq!(mode, 0o600, "mode of {target_name}");
    let pem = std::fs::read(&link).unwrap_or_else(|e| panic!("{e}"));
    assert!(String::from_utf8_lossy(&pem).contains("PRIVATE KEY"), "cert and key in one file");
    let (subject, issuer, ..) = cert_facts(&pem);
    assert!(
        subject.contains(&format!("CN=system:node:{node}")) && subject.contains("O=system:nodes"),
        "{subject}"
    );
    assert!(issuer.contains("nodelet-envtest-ca"), "{issuer}");
    let kubeconfig_path = PathBuf::from(
        n.log()
            .lines()
            .filter(|l| l.contains("wrote the node's kubeconfig"))
            .find_map(|l| {
                l.split("kubeconfig=").nth(1).and_then(|s| s.split_whitespace().next()).map(str::to_owned)
            })
            .unwrap_or_default(),
    );
    let kubeconfig = std::fs::read_to_string(&kubeconfig_path)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", kubeconfig_path.display(), n.tail()));
    assert!(kubeconfig.contains(&format!("client-certificate: {}", link.display())), "{kubeconfig}");
    assert!(kubeconfig.contains(&format!("client-key: {}", link.display())), "{kubeconfig}");
    assert!(
        !kubeconfig.contains("token"),
        "the bootstrap token is not in the node's kubeconfig: {kubeconfig}"
    );

    // the CSR: Approved,Issued by the controller manager, kube-apiserver-client-kubelet
    let csrs = csrs_of(&n.client(), &node).await;
    assert_eq!(csrs.len(), 1, "one CSR: {}", crate::cluster_support::pretty(&csrs));
    let name = csrs[0].metadata.name.clone().unwrap_or_default();
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(csrs[0].spec.usages.clone().unwrap_or_default(), vec!["digital signature", "client auth"]);
    let (ok, out, err) = kubectl(&cluster, &["get", "csr", &name], None).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("kubernetes.io/kube-apiserver-client-kubelet") && out.contains("Approved,Issued"),
        "{out}"
    );
    assert!(out.contains("system:bootstrap:"), "created with the bootstrap token: {out}");
    let log = n.log();
    let token = std::fs::read_to_string(cluster.base.join("pki/bootstrap.token")).unwrap_or_default();
    let token = token.trim();
    assert!(token.len() > 10, "the envtest bootstrap token: {token:?}");
    assert!(!log.contains(token), "the bootstrap token is not in the log");
    let secret = token.split('.').nth(1).unwrap_or(token);
    assert!(!log.contains(secret), "the bootstrap token's secret is not in the log");
    assert!(!log.contains("BEGIN EC PRIVATE") && !log.contains("BEGIN PRIVATE"), "no key in the log");

    // a second start with the kubeconfig in place: no new CSR
    n.stop().await;
    n.start_again().await;
    sleep(Duration::from_secs(5)).await;
    n.wait_until("the Node to be Ready after the restart", WAIT, async || match n.node_object().await {
        Some(o) if ready(&o) => Ok(()),
        _ => Err("not Ready".to_owned()),
    })
    .await;
    let after = csrs_of(&n.client(), &node).await;
    assert_eq!(after.len(), 1, "no new CSR after a restart: {}", crate::cluster_support::pretty(&after));
    n.assert_no_forbidden_in_log();
    let _ = kubectl(&cluster, &["delete", "csr", &name], None).await;
    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ rotation

#[tokio::test]
async fn short_client_and_serving_certificates_rotate_without_a_restart() {
    let (env, suite) = cluster_or_skip!("short_client_and_serving_certificates_rotate_without_a_restart");
    let plane = ControlPlane::start(&suite).await;
    let cluster = plane.env();
    let admin = crate::cluster_support::admin_client(&cluster).await;
    let node = crate::support::node_name("rotate");
    let issued = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Issued>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let deny = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let signer = tokio::spawn(signer_loop(
        admin.clone(),
        cluster.clone(),
        node.clone(),
        deny,
        issued.clone(),
        stop.clone(),
    ));
    let _stop_guard = stop.clone().drop_guard();
    let options = StartOptions {
        config_extra: "serverTLSBootstrap: true\n".to_owned(),
        node_name: Some(node.clone()),
        ..StartOptions::default()
    };
    let n = ClusterNode::start_with_credentials(&env, &cluster, "rotate", options, async |c, _, d| {
        bootstrap_args(c, d).await
    })
    .await;
    let snapshot = || issued.lock().map(|v| v.clone()).unwrap_or_default();
    let of = |signer: &str| snapshot().into_iter().filter(|i| i.signer == signer).collect::<Vec<_>>();
    // bootstrap (client) and the first serving certificate
    n.wait_until("the bootstrap CSR to be issued", WAIT, async || {
        of("kubernetes.io/kube-apiserver-client-kubelet")
            .first()
            .cloned()
            .ok_or_else(|| format!("{:?}", snapshot()))
    })
    .await;
    let first = of("kubernetes.io/kube-apiserver-client-kubelet")[0].clone();
    assert!(first.username.starts_with("system:bootstrap:"), "{first:?}");

    // the serving certificate: the main port presents it (envtest CA, node IP SAN)
    n.wait_until("a serving CSR to be issued", WAIT, async || {
        of("kubernetes.io/kubelet-serving").first().cloned().ok_or_else(|| format!("{:?}", snapshot()))
    })
    .await;
    let ca = std::fs::read(&cluster.ca).unwrap_or_else(|e| panic!("{e}"));
    let ca = reqwest::Certificate::from_pem(&ca).unwrap_or_else(|e| panic!("{e}"));
    let https = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .add_root_certificate(ca)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    // verified against the envtest CA only, with 127.0.0.1 as the name: any HTTP answer proves the chain and
    // the IP SAN
    let status = n
        .wait_until("the main port to present the cluster-issued certificate", WAIT, async || {
            https.get(n.main_url("/healthz")).send().await.map(|r| r.status()).map_err(|e| format!("{e:?}"))
        })
        .await;
    let served = served_cert(n.ports().main).await;
    let (subject, issuer, _, _, sans) = cert_facts(&served);
    assert!(subject.contains(&format!("CN=system:node:{node}")), "{subject}");
    assert!(issuer.contains("nodelet-envtest-ca"), "{issuer}");
    assert!(sans.contains("IPAddress([127, 0, 0, 1])") && sans.contains(&node), "{sans}");
    eprintln!("main port answered {status} over the cluster-issued certificate");

    // rotation: a new client CSR between 42 and 54 s into the first certificate, with the node's identity
    let second = n
        .wait_until("the client certificate to be renewed", Duration::from_secs(70), async || {
            of("kubernetes.io/kube-apiserver-client-kubelet")
                .get(1)
                .cloned()
                .ok_or_else(|| format!("{:?}", snapshot()))
        })
        .await;
    let into = second.seen - first.not_before;
    assert!((41..=56).contains(&into), "renewed {into} s into the first certificate: {second:?}");
    assert_eq!(second.username, format!("system:node:{node}"), "renewed with the current identity");
    // The CSR is seen issued before nodelet has fetched and written the certificate: wait for the link.
    let link = n.root_dir().join("pki/nodelet-client-current.pem");
    n.wait_until("the symlink to point at the new certificate", Duration::from_secs(15), async || {
        let (_, _, nb, _, _) = cert_facts(&std::fs::read(&link).unwrap_or_default());
        if nb >= second.not_before { Ok(()) } else { Err(format!("notBefore {nb} < {}", second.not_before)) }
    })
    .await;

    // past the first certificate's notAfter the API server still accepts nodelet: the Lease is renewed
    let deadline = first.not_after + 4;
    while now_unix() < deadline {
        sleep(Duration::from_millis(500)).await;
    }
    n.wait_until(
        "a Lease renewal after the first certificate expired",
        Duration::from_secs(20),
        async || {
            let lease = n.lease().await.ok_or("no lease")?;
            let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0.as_second()).unwrap_or(0);
            if renewed > first.not_after + 1 { Ok(()) } else { Err(format!("renewTime {renewed}")) }
        },
    )
    .await;
    let ttl = metric(&n, "kubelet_certificate_manager_client_ttl_seconds").await.unwrap_or(f64::NAN);
    assert!(
        ttl > 0.0 && ttl <= SHORT_CERT as f64,
        "client TTL {ttl} reflects a new certificate\n{}",
        n.tail()
    );
    let server_ttl = metric(&n, "kubelet_certificate_manager_server_ttl_seconds").await.unwrap_or(f64::NAN);
    assert!(server_ttl > -5.0 && server_ttl <= SHORT_CERT as f64, "server TTL {server_ttl}");
    assert!(n.node_object().await.is_some_and(|o| ready(&o)), "the Node is Ready");
    let renew_errors = metric(&n, "kubelet_certificate_manager_client_expiration_renew_errors").await;
    assert_eq!(renew_errors, Some(0.0));
    stop.cancel();
    let _ = signer.await;
    n.shutdown().await;
    drop(plane);
}

// ------------------------------------------------------------------------------------------------ hostile

#[tokio::test]
async fn a_denied_csr_is_an_error_and_retried_while_static_pods_run() {
    let (env, suite) = cluster_or_skip!("a_denied_csr_is_an_error_and_retried_while_static_pods_run");
    let plane = ControlPlane::start(&suite).await;
    let cluster = plane.env();
    let admin = crate::cluster_support::admin_client(&cluster).await;
    let node = crate::support::node_name("denied");
    let issued = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Issued>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let deny = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let signer = tokio::spawn(signer_loop(
        admin.clone(),
        cluster.clone(),
        node.clone(),
        deny.clone(),
        issued.clone(),
        stop.clone(),
    ));
    let _stop_guard = stop.clone().drop_guard();
    let options = StartOptions { node_name: Some(node.clone()), ..StartOptions::default() };
    let mut n = ClusterNode::start_with_credentials(&env, &cluster, "denied", options, async |c, _, d| {
        bootstrap_args(c, d).await
    })
    .await;
    let manifest =
        n.pod_manifest("static", json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}));
    n.write_manifest("static.yaml", &manifest);
    n.wait_running("static").await;
    n.wait_until("a clear error about the denied CSR, twice (retried)", WAIT, async || {
        let log = n.log();
        let lines: Vec<_> =
            log.lines().filter(|l| l.contains("TLS bootstrap failed") && l.contains("was denied")).collect();
        if lines.len() >= 2 { Ok(()) } else { Err(format!("{lines:?}")) }
    })
    .await;
    assert!(n.exit_status().is_none(), "nodelet runs");
    n.wait_running("static").await;
    assert!(n.node_object().await.is_none(), "no Node without credentials");
    // approving the next one: the node joins
    deny.store(false, std::sync::atomic::Ordering::SeqCst);
    n.wait_until("the Node to register once a CSR is approved", Duration::from_secs(90), async || {
        match n.node_object().await {
            Some(o) if ready(&o) => Ok(()),
            _ => Err("not yet".to_owned()),
        }
    })
    .await;
    n.wait_running("static").await;
    stop.cancel();
    let _ = signer.await;
    n.remove_manifest("static.yaml");
    n.shutdown().await;
    drop(plane);
}

#[tokio::test]
async fn an_expired_client_certificate_without_bootstrap_is_a_clear_error_and_pods_keep_running() {
    let (env, cluster) = cluster_or_skip!(
        "an_expired_client_certificate_without_bootstrap_is_a_clear_error_and_pods_keep_running"
    );
    let kubeconfig = std::sync::Mutex::new(PathBuf::new());
    let mut n = ClusterNode::start_with_credentials(
        &env,
        &cluster,
        "expired",
        StartOptions::default(),
        async |c, node, d| {
            let (key, csr) = node_key_and_csr(node);
            let cert = sign(&csr, &ca_issuer(c), now_unix() - 7200, 3600, false);
            let path = d.join("kubeconfig");
            write_cert_kubeconfig(c, &path, &cert, &key.serialize_pem());
            if let Ok(mut k) = kubeconfig.lock() {
                *k = path.clone();
            }
            vec!["--kubeconfig".to_owned(), path.display().to_string()]
        },
    )
    .await;
    let manifest =
        n.pod_manifest("static", json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}));
    n.write_manifest("static.yaml", &manifest);
    n.wait_running("static").await;
    n.wait_until("a clear error about the expired certificate", WAIT, async || {
        let log = n.log();
        let expired = log
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("client certificate") && l.contains("expired"));
        let refused = log.lines().any(|l| l.contains("ERROR") && l.contains("401 Unauthorized"));
        if expired && refused { Ok(()) } else { Err(format!("expired error {expired}, 401 error {refused}")) }
    })
    .await;
    let ttl = metric(&n, "kubelet_certificate_manager_client_ttl_seconds").await.unwrap_or(f64::NAN);
    assert!(ttl < -3000.0, "TTL {ttl} of a certificate that expired an hour ago");
    sleep(Duration::from_secs(3)).await;
    n.wait_running("static").await;
    assert!(n.node_object().await.is_none(), "the API server refused the Node");
    // a valid certificate in the kubeconfig and a restart: the node joins, the static pod still runs
    let path = kubeconfig.lock().map(|k| k.clone()).unwrap_or_default();
    n.stop().await;
    crate::cluster_support::mint_node_kubeconfig(&cluster, n.node(), &path).await;
    n.start_again().await;
    n.wait_until("the Node to register with a valid certificate", WAIT, async || {
        match n.node_object().await {
            Some(o) if ready(&o) => Ok(()),
            _ => Err("not yet".to_owned()),
        }
    })
    .await;
    n.wait_running("static").await;
    n.remove_manifest("static.yaml");
    n.shutdown().await;
}

#[tokio::test]
async fn a_client_certificate_of_another_ca_is_a_clear_401_error() {
    let (env, cluster) = cluster_or_skip!("a_client_certificate_of_another_ca_is_a_clear_401_error");
    let n = ClusterNode::start_with_credentials(
        &env,
        &cluster,
        "wrongca",
        StartOptions::default(),
        async |c, node, d| {
            let (key, csr) = node_key_and_csr(node);
            let mut ca_params =
                rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
            ca_params.distinguished_name.push(rcgen::DnType::CommonName, "another-ca");
            ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
            let issuer = rcgen::Issuer::new(ca_params, ca_key);
            let cert = sign(&csr, &issuer, now_unix() - 60, 3600, false);
            let path = d.join("kubeconfig");
            write_cert_kubeconfig(c, &path, &cert, &key.serialize_pem());
            vec!["--kubeconfig".to_owned(), path.display().to_string()]
        },
    )
    .await;
    n.wait_until("a clear 401 error", WAIT, async || {
        let log = n.log();
        let lines: Vec<_> = log
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("401 Unauthorized") && l.contains("not trusted"))
            .collect();
        if lines.is_empty() { Err("none yet".to_owned()) } else { Ok(()) }
    })
    .await;
    assert!(n.healthz_ok().await.is_ok(), "nodelet is healthy");
    n.shutdown().await;
}

#[tokio::test]
async fn rotate_certificates_renews_a_kubeconfig_certificate_without_bootstrap() {
    let (env, suite) =
        cluster_or_skip!("rotate_certificates_renews_a_kubeconfig_certificate_without_bootstrap");
    let plane = ControlPlane::start(&suite).await;
    let cluster = plane.env();
    let admin = crate::cluster_support::admin_client(&cluster).await;
    let node = crate::support::node_name("rotkc");
    let issued = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Issued>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let deny = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let signer = tokio::spawn(signer_loop(
        admin.clone(),
        cluster.clone(),
        node.clone(),
        deny,
        issued.clone(),
        stop.clone(),
    ));
    let _stop_guard = stop.clone().drop_guard();
    let first_not_after = now_unix() + SHORT_CERT;
    let kubeconfig = std::sync::Mutex::new(PathBuf::new());
    let options = StartOptions {
        config_extra: "rotateCertificates: true\n".to_owned(),
        node_name: Some(node.clone()),
        ..StartOptions::default()
    };
    let n = ClusterNode::start_with_credentials(&env, &cluster, "rotkc", options, async |c, node, d| {
        let (key, csr) = node_key_and_csr(node);
        let cert = sign(&csr, &ca_issuer(c), first_not_after - SHORT_CERT, SHORT_CERT, false);
        let path = d.join("kubeconfig");
        write_cert_kubeconfig(c, &path, &cert, &key.serialize_pem());
        if let Ok(mut k) = kubeconfig.lock() {
            *k = path.clone();
        }
        vec!["--kubeconfig".to_owned(), path.display().to_string()]
    })
    .await;
    let path = kubeconfig.lock().map(|k| k.clone()).unwrap_or_default();
    let before = std::fs::read(&path).unwrap_or_default();
    let snapshot = || issued.lock().map(|v| v.clone()).unwrap_or_default();
    let renewal = n
        .wait_until("the kubeconfig's certificate to be renewed", Duration::from_secs(75), async || {
            snapshot().first().cloned().ok_or_else(|| "no CSR yet".to_owned())
        })
        .await;
    let into = renewal.seen - (first_not_after - SHORT_CERT);
    assert!((41..=56).contains(&into), "renewed {into} s into the certificate: {renewal:?}");
    assert_eq!(renewal.username, format!("system:node:{node}"));
    while now_unix() < first_not_after + 4 {
        sleep(Duration::from_millis(500)).await;
    }
    n.wait_until(
        "a Lease renewal after the kubeconfig's certificate expired",
        Duration::from_secs(20),
        async || {
            let lease = n.lease().await.ok_or("no lease")?;
            let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0.as_second()).unwrap_or(0);
            if renewed > first_not_after + 1 { Ok(()) } else { Err(format!("renewTime {renewed}")) }
        },
    )
    .await;
    assert_eq!(
        std::fs::read(&path).unwrap_or_default(),
        before,
        "nodelet leaves a kubeconfig it did not write alone"
    );
    assert!(n.root_dir().join("pki/nodelet-client-current.pem").is_file());
    stop.cancel();
    let _ = signer.await;
    n.shutdown().await;
    drop(plane);
}
