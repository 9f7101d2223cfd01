//! The client (`nodelet-cli`, as `nodelet get pods` runs it) against these servers: the read-only port over
//! HTTP, and the main port over HTTPS with its self-signed certificate under <root-dir>/pki and a bearer
//! token from --token-file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use nodelet_cli::args::GetArgs;

use super::{NodeView, ServerConfig, Servers};
use nodelet_config::cli::{Commands, try_parse_with};

/// nodelet's self-signed certificate, which the client trusts by default when it exists.
const DEFAULT_SERVER_CA: &str = "/var/lib/nodelet/pki/nodelet.crt";

fn get_args(flags: &[&str]) -> GetArgs {
    let mut v = vec!["nodelet", "get", "pods"];
    v.extend_from_slice(flags);
    match try_parse_with::<nodelet_cli::Command, _, _>(v).expect("parse") {
        Commands::Client(nodelet_cli::Command::Get(g)) => g,
        other => panic!("{other:?}"),
    }
}

fn pods() -> Vec<Pod> {
    let list = serde_json::json!([
        {"metadata": {"name": "web-node1", "namespace": "default"},
         "spec": {"nodeName": "node1", "containers": [{"name": "httpd"}]},
         "status": {"phase": "Running"}},
        {"metadata": {"name": "crashloop-node1", "namespace": "default"},
         "spec": {"containers": [{"name": "app"}]},
         "status": {"phase": "Running", "containerStatuses": [{"name": "app", "ready": false, "restartCount": 2,
                    "image": "i", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
        {"metadata": {"name": "dns-node1", "namespace": "kube-system"},
         "spec": {"containers": [{"name": "dns"}]}, "status": {"phase": "Pending"}}
    ]);
    serde_json::from_value(list).expect("pods")
}

fn names(pods: &[Pod]) -> Vec<&str> {
    pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
}

#[tokio::test]
async fn get_pods_works_against_nodelets_servers() {
    struct View(Vec<Pod>);
    impl NodeView for View {
        fn pods(&self) -> k8s_openapi::List<Pod> {
            k8s_openapi::List { items: self.0.clone(), metadata: Default::default() }
        }
        fn metrics(&self) -> String {
            String::new()
        }
        fn healthy(&self) -> Result<(), super::Unhealthy> {
            Ok(())
        }
        fn container_log(&self, _: &str, _: &str, _: &str) -> Option<PathBuf> {
            None
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "s3cret,admin,uid-1\n").expect("write");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("write");
    let mut config = ServerConfig::new("node1");
    config.address = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    config.port = 0;
    config.read_only_port = Some(0);
    config.healthz_port = None;
    config.root_dir = dir.path().to_owned();
    config.token_auth_file = Some(tokens);
    let servers = Servers::bind(&config, Arc::new(View(pods()))).await.expect("bind");
    let main = format!("https://{}", servers.main_addr());
    let read_only = format!("http://{}", servers.read_only_addr().expect("read-only port"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(servers.run(async move {
        let _ = stopped.await;
    }));
    let ca = dir.path().join("pki/nodelet.crt");
    let (ca, token_file) = (ca.to_str().expect("utf8"), token_file.to_str().expect("utf8"));

    let via_read_only =
        nodelet_cli::fetch_pods(&get_args(&["--server", &read_only])).await.expect("read-only port");
    assert_eq!(names(&via_read_only), ["web-node1", "crashloop-node1", "dns-node1"]);
    let via_main = nodelet_cli::fetch_pods(&get_args(&[
        "--server",
        &main,
        "--certificate-authority",
        ca,
        "--token-file",
        token_file,
    ]))
    .await
    .expect("main port with token and CA");
    assert_eq!(names(&via_main), ["web-node1", "crashloop-node1", "dns-node1"]);
    let waiting =
        via_main[1].status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| {
            c[0].state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.clone())
        });
    assert_eq!(waiting.as_deref(), Some("CrashLoopBackOff"), "the status comes through whole");
    let no_token = nodelet_cli::fetch_pods(&get_args(&["--server", &main, "--certificate-authority", ca]))
        .await
        .expect_err("anonymous is refused");
    assert!(matches!(no_token, nodelet_cli::GetError::Unauthorized { status: 401, .. }), "{no_token}");
    let insecure = nodelet_cli::fetch_pods(&get_args(&[
        "--server",
        &main,
        "--insecure-skip-tls-verify",
        "--token",
        "s3cret",
    ]))
    .await
    .expect("insecure");
    assert_eq!(insecure.len(), 3);
    if !Path::new(DEFAULT_SERVER_CA).exists() {
        let untrusted = nodelet_cli::fetch_pods(&get_args(&["--server", &main, "--token", "s3cret"]))
            .await
            .expect_err("the self-signed certificate is not trusted without --certificate-authority");
        assert!(untrusted.to_string().contains("--certificate-authority"), "{untrusted}");
    }
    let _ = stop.send(());
    let _ = task.await;
}
