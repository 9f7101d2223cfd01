//! The fake runtime through nodelet's own CRI client and pod runtime, on a real unix socket, and the
//! hollow nodes' configuration.

use std::collections::HashMap;

use k8s_cri::v1;
use tokio_util::sync::CancellationToken;

use super::fake_cri::FakeCri;
use super::*;

struct Served {
    client: nodelet_cri::CriClient,
    fake: FakeCri,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn served(index: u32) -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri.sock");
    let fake = FakeCri::new(index, dir.path());
    let stop = CancellationToken::new();
    let (f, s, path) = (fake.clone(), stop.clone(), socket.clone());
    tokio::spawn(async move { f.serve(&path, s).await.expect("serve") });
    let client = nodelet_cri::CriClient::connect_lazy(nodelet_cri::CriConfig::new(format!(
        "unix://{}",
        socket.display()
    )))
    .expect("client");
    // Until the socket is bound.
    for _ in 0..100 {
        if client.status().await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Served { client, fake, stop, _dir: dir }
}

fn sandbox_config(uid: &str, host_network: bool) -> v1::PodSandboxConfig {
    let network = if host_network { v1::NamespaceMode::Node } else { v1::NamespaceMode::Pod } as i32;
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: format!("pod-{uid}"),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: format!("/var/log/pods/default_pod-{uid}_{uid}"),
        labels: HashMap::from([("io.kubernetes.pod.uid".to_owned(), uid.to_owned())]),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption { network, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str) -> v1::ContainerConfig {
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(v1::ImageSpec { image: "busybox:1".into(), ..Default::default() }),
        log_path: format!("{name}/0.log"),
        labels: HashMap::from([("io.kubernetes.container.name".to_owned(), name.to_owned())]),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_runtime_is_ready_and_names_itself() {
    let s = served(0).await;
    assert!(s.client.status().await.expect("status").is_ready());
    let v = s.client.version().await.expect("version");
    assert_eq!(v.runtime_name, "nodelet-hollow");
    assert_eq!(v.runtime_api_version, "v1");
}

#[tokio::test]
async fn sandboxes_get_made_up_ips_of_the_nodes_subnet_and_give_them_back() {
    let s = served(300).await;
    let a = s.client.run_pod_sandbox(sandbox_config("a", false), "").await.expect("run a");
    let b = s.client.run_pod_sandbox(sandbox_config("b", false), "").await.expect("run b");
    let ip = |id: String| {
        let client = s.client.clone();
        async move { client.pod_sandbox_status(&id).await.expect("status").network.expect("network").ip }
    };
    // Node 300: 10.(64 + 1).(300 % 256).0/24.
    assert_eq!(ip(a.clone()).await, "10.65.44.1");
    assert_eq!(ip(b.clone()).await, "10.65.44.2");
    s.client.stop_pod_sandbox(&a).await.expect("stop");
    s.client.remove_pod_sandbox(&a).await.expect("remove");
    let c = s.client.run_pod_sandbox(sandbox_config("c", false), "").await.expect("run c");
    assert_eq!(ip(c).await, "10.65.44.1", "the freed IP is given again");
    let host = s.client.run_pod_sandbox(sandbox_config("h", true), "").await.expect("run host");
    assert_eq!(ip(host).await, "", "a host-network sandbox gets no pod IP");
    assert_eq!(s.fake.counts(), (3, 0));
}

#[tokio::test]
async fn containers_run_until_stopped_and_go_with_their_sandbox() {
    let s = served(1).await;
    let sandbox = sandbox_config("p", false);
    let id = s.client.run_pod_sandbox(sandbox.clone(), "").await.expect("run");
    let image = s.client.pull_image("busybox:1", None, None).await.expect("pull");
    assert!(image.starts_with("sha256:"), "{image}");
    let c = s.client.create_container(&id, container_config("main"), sandbox.clone()).await.expect("create");
    let status = s.client.container_status(&c).await.expect("status");
    assert_eq!(status.state, v1::ContainerState::ContainerCreated as i32);
    assert_eq!(status.image_ref, image);
    assert_eq!(status.log_path, "/var/log/pods/default_pod-p_p/main/0.log");
    s.client.start_container(&c).await.expect("start");
    let status = s.client.container_status(&c).await.expect("status");
    assert_eq!(status.state, v1::ContainerState::ContainerRunning as i32);
    assert!(status.started_at >= status.created_at && status.started_at > 0);
    assert!(s.client.start_container(&c).await.is_err(), "a running container cannot start again");
    let exec = s.client.exec_sync(&c, vec!["true".to_owned()], std::time::Duration::from_secs(1)).await;
    assert_eq!(exec.expect("exec").exit_code, 0);
    s.client.stop_container(&c, std::time::Duration::from_secs(30)).await.expect("stop");
    let status = s.client.container_status(&c).await.expect("status");
    assert_eq!(status.state, v1::ContainerState::ContainerExited as i32);
    assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));
    s.client.stop_pod_sandbox(&id).await.expect("stop sandbox");
    s.client.remove_pod_sandbox(&id).await.expect("remove sandbox");
    assert_eq!(s.fake.counts(), (0, 0), "the sandbox's containers go with it");
    assert!(s.client.container_status(&c).await.is_err());
}

#[tokio::test]
async fn lists_honour_the_filters() {
    let s = served(2).await;
    let (pa, pb) = (sandbox_config("a", false), sandbox_config("b", false));
    let a = s.client.run_pod_sandbox(pa.clone(), "").await.expect("run a");
    let b = s.client.run_pod_sandbox(pb.clone(), "").await.expect("run b");
    let ca = s.client.create_container(&a, container_config("x"), pa.clone()).await.expect("create");
    let cb = s.client.create_container(&b, container_config("y"), pb.clone()).await.expect("create");
    s.client.start_container(&cb).await.expect("start");
    let filter = nodelet_cri::ContainerFilter::all().pod_sandbox_id(&a);
    let of_a: Vec<String> =
        s.client.list_containers(&filter).await.expect("list").into_iter().map(|c| c.id).collect();
    assert_eq!(of_a, vec![ca.clone()]);
    let running = nodelet_cri::ContainerFilter::all().state(v1::ContainerState::ContainerRunning);
    let running: Vec<String> =
        s.client.list_containers(&running).await.expect("list").into_iter().map(|c| c.id).collect();
    assert_eq!(running, vec![cb]);
    let by_label = nodelet_cri::SandboxFilter::all().label("io.kubernetes.pod.uid", "b");
    let found: Vec<String> =
        s.client.list_pod_sandboxes(&by_label).await.expect("list").into_iter().map(|p| p.id).collect();
    assert_eq!(found, vec![b]);
}

#[tokio::test]
async fn images_are_recorded_and_the_image_filesystem_is_the_nodes_directory() {
    let s = served(3).await;
    let spec = "registry.k8s.io/pause:3.9";
    assert!(s.client.image_status(spec).await.expect("status").is_none());
    s.client.pull_image(spec, None, None).await.expect("pull");
    let image = s.client.image_status(spec).await.expect("status").expect("pulled");
    assert_eq!(image.repo_tags, vec!["registry.k8s.io/pause:3.9".to_owned()]);
    let fs = s.client.image_fs_info().await.expect("fs info");
    let usage = fs.image_filesystems.first().expect("one filesystem");
    assert_eq!(usage.used_bytes.as_ref().map(|u| u.value), Some(1 << 20));
    assert_eq!(
        usage.fs_id.as_ref().map(|f| std::path::PathBuf::from(&f.mountpoint)),
        Some(s._dir.path().to_owned())
    );
    s.client.remove_image(&image.id).await.expect("remove");
    assert!(s.client.image_status(spec).await.expect("status").is_none());
}

#[tokio::test]
async fn unknown_objects_are_not_found_and_streaming_is_refused() {
    let s = served(4).await;
    assert!(s.client.pod_sandbox_status("nope").await.is_err());
    assert!(s.client.start_container("nope").await.is_err());
    // CRI: stopping and removing what is not there succeed.
    s.client.stop_pod_sandbox("nope").await.expect("stop");
    s.client.remove_pod_sandbox("nope").await.expect("remove");
    s.client.remove_container("nope").await.expect("remove");
    let sandbox = sandbox_config("p", false);
    let id = s.client.run_pod_sandbox(sandbox.clone(), "").await.expect("run");
    s.client.stop_pod_sandbox(&id).await.expect("stop");
    assert!(
        s.client.create_container(&id, container_config("late"), sandbox.clone()).await.is_err(),
        "no container in a stopped sandbox"
    );
}

#[test]
fn a_hollow_nodes_config_has_no_servers_static_sources_or_cgroups() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = HollowArgs {
        nodes: 1,
        kubeconfig_dir: dir.path().to_owned(),
        name_prefix: "h-".into(),
        first_index: 0,
        root_dir: dir.path().join("nodes"),
        config: None,
        log: Default::default(),
    };
    let host = HostFacts::detect();
    let (root, socket) = (dir.path().join("nodes/h-0"), dir.path().join("nodes/h-0/cri.sock"));
    let missing = node_config(&args, "h-0", &root, &socket, &host).expect_err("no kubeconfig");
    assert!(missing.to_string().contains("h-0.kubeconfig"), "{missing}");
    std::fs::write(dir.path().join("h-0.kubeconfig"), "apiVersion: v1\nkind: Config\n").expect("write");
    let c = node_config(&args, "h-0", &root, &socket, &host).expect("config").config;
    assert_eq!(c.node_name, "h-0");
    assert_eq!(c.root_dir, root);
    assert!(!c.server.enabled);
    assert!(c.sources.static_pod_path.is_none() && c.sources.manifest_http_addr.is_none());
    assert!(c.pods.cgroup_root.is_none());
    assert_eq!(c.pods.pod_logs_dir, root.join("logs"));
    assert_eq!(c.runtime.endpoint.as_deref(), Some(format!("unix://{}", socket.display()).as_str()));
    assert_eq!(c.cluster.as_ref().map(|k| k.kubeconfig.clone()), Some(dir.path().join("h-0.kubeconfig")));
}

#[test]
fn the_hollow_command_parses_with_its_defaults_and_needs_its_two_flags() {
    let command =
        crate::cli::try_parse_from(["nodelet", "hollow", "--nodes", "3", "--kubeconfig-dir", "/kc"])
            .expect("parse");
    let crate::cli::Command::Hollow(args) = command else { panic!("not hollow: {command:?}") };
    assert_eq!(args.nodes, 3);
    assert_eq!(args.kubeconfig_dir, std::path::PathBuf::from("/kc"));
    assert_eq!(args.name_prefix, "hollow-node-");
    assert_eq!(args.first_index, 0);
    assert_eq!(args.root_dir, std::path::PathBuf::from("/var/lib/nodelet-hollow"));
    assert!(crate::cli::try_parse_from(["nodelet", "hollow", "--nodes", "3"]).is_err());
    assert!(crate::cli::try_parse_from(["nodelet", "hollow", "--kubeconfig-dir", "/kc"]).is_err());
    assert_eq!(node_name("hollow-node-", 7), "hollow-node-7");
}

#[tokio::test]
async fn no_node_starts_when_a_kubeconfig_is_missing_or_nodes_is_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("h-0.kubeconfig"), "apiVersion: v1\nkind: Config\n").expect("write");
    let mut args = HollowArgs {
        nodes: 2,
        kubeconfig_dir: dir.path().to_owned(),
        name_prefix: "h-".into(),
        first_index: 0,
        root_dir: dir.path().join("nodes"),
        config: None,
        log: Default::default(),
    };
    let e = run(&args).await.expect_err("h-1 has no kubeconfig");
    assert!(e.to_string().contains("h-1.kubeconfig"), "{e}");
    assert!(!dir.path().join("nodes/h-0").exists(), "a node started before every configuration was read");
    args.nodes = 0;
    assert!(run(&args).await.is_err());
}

static TRIMS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn counted_trim() -> bool {
    TRIMS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    true
}

#[tokio::test(start_paused = true)]
async fn the_allocator_is_trimmed_every_period_until_stopped() {
    let trims = || TRIMS.load(std::sync::atomic::Ordering::SeqCst);
    let stop = CancellationToken::new();
    let task = tokio::spawn(trim_periodically(Duration::from_secs(60), counted_trim, stop.clone()));
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(trims(), 0, "not before the first period");
    tokio::time::sleep(Duration::from_secs(62)).await;
    for _ in 0..1000 {
        if trims() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(trims(), 2, "once a period (at 60 s and 120 s)");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(1), task).await.expect("ends at stop").expect("no panic");
}

/// A trim that holds its blocking thread for 50 ms, as `malloc_trim` does (not a timer, so not tokio's).
#[allow(clippy::disallowed_methods)]
fn slow_trim() -> bool {
    SLOW_TRIMS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    true
}

static SLOW_TRIMS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[tokio::test]
async fn a_trim_that_took_long_puts_the_next_one_off() {
    // every 10 ms, but each trim takes 50 ms: the next waits 60 times that, 3 s
    let stop = CancellationToken::new();
    let task = tokio::spawn(trim_periodically(Duration::from_millis(10), slow_trim, stop.clone()));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(2), task).await.expect("ends at stop").expect("no panic");
    assert_eq!(
        SLOW_TRIMS.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one trim in 1.5 s, not one every 60 ms"
    );
}

#[test]
fn the_next_trim_waits_the_period_or_sixty_times_the_last_trim() {
    let minute = Duration::from_secs(60);
    assert_eq!(next_trim_after(minute, Duration::from_millis(300)), minute);
    assert_eq!(next_trim_after(minute, Duration::from_secs(1)), minute);
    assert_eq!(next_trim_after(minute, Duration::from_secs(2)), Duration::from_secs(120));
    assert_eq!(next_trim_after(minute, Duration::from_millis(8_900)), Duration::from_secs(534));
}

#[tokio::test]
async fn labels_and_annotations_come_back_as_sent() {
    use k8s_cri::v1::runtime_service_server::RuntimeService as _;
    let s = served(3).await;
    let mut sandbox = sandbox_config("p", false);
    sandbox.labels.insert("app".to_owned(), "web".to_owned());
    sandbox.annotations = HashMap::from([
        ("kubernetes.io/config.seen".to_owned(), "2026-12-05T22:00:00Z".to_owned()),
        ("kubernetes.io/config.source".to_owned(), "api".to_owned()),
    ]);
    let id = s.client.run_pod_sandbox(sandbox.clone(), "").await.expect("run");
    let mut config = container_config("main");
    config.annotations = HashMap::from([("io.kubernetes.container.hash".to_owned(), "1a2b".to_owned())]);
    let c = s.client.create_container(&id, config.clone(), sandbox.clone()).await.expect("create");

    let status = s.client.container_status(&c).await.expect("status");
    assert_eq!((status.labels, status.annotations), (config.labels.clone(), config.annotations.clone()));
    let listed = s.client.list_containers(&nodelet_cri::ContainerFilter::all()).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!((&listed[0].labels, &listed[0].annotations), (&config.labels, &config.annotations));
    assert_eq!(listed[0].pod_sandbox_id, id);

    let request =
        tonic::Request::new(v1::PodSandboxStatusRequest { pod_sandbox_id: id.clone(), verbose: false });
    let status = s.fake.pod_sandbox_status(request).await.expect("sandbox status").into_inner().status;
    let status = status.expect("a status");
    assert_eq!((status.labels, status.annotations), (sandbox.labels.clone(), sandbox.annotations.clone()));
    let listed = s.client.list_pod_sandboxes(&nodelet_cri::SandboxFilter::all()).await.expect("list");
    assert_eq!((&listed[0].labels, &listed[0].annotations), (&sandbox.labels, &sandbox.annotations));
    let by_label = nodelet_cri::SandboxFilter::all().label("app", "web");
    assert_eq!(s.client.list_pod_sandboxes(&by_label).await.expect("list").len(), 1);
    let by_other = nodelet_cri::SandboxFilter::all().label("app", "db");
    assert!(s.client.list_pod_sandboxes(&by_other).await.expect("list").is_empty());
}

#[tokio::test]
async fn container_events_reach_the_nodes_event_stream_so_its_pleg_runs_evented() {
    use futures::StreamExt;
    use nodelet_cri::{EventSource, RuntimeEvent};
    let s = served(0).await;
    let (events, feed) = s.client.events(nodelet_cri::EventsConfig::default());
    tokio::spawn(feed);
    let mut events = events;
    let next = async |events: &mut nodelet_cri::RuntimeEventStream| {
        tokio::time::timeout(std::time::Duration::from_secs(10), events.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream goes on")
    };
    // GetContainerEvents is served: the CRI source, not "none".
    assert_eq!(next(&mut events).await, RuntimeEvent::Reconnected { source: EventSource::Cri });
    let sandbox = s.client.run_pod_sandbox(sandbox_config("a", false), "").await.expect("run");
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerCreated { id: sandbox.clone(), pid: None });
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerStarted { id: sandbox.clone(), pid: None });
    let id = s
        .client
        .create_container(&sandbox, container_config("c"), sandbox_config("a", false))
        .await
        .expect("create");
    s.client.start_container(&id).await.expect("start");
    s.client.stop_container(&id, std::time::Duration::ZERO).await.expect("stop");
    s.client.remove_container(&id).await.expect("remove");
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerCreated { id: id.clone(), pid: None });
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerStarted { id: id.clone(), pid: None });
    assert!(
        matches!(next(&mut events).await, RuntimeEvent::ContainerExited { id: ref e, .. } if *e == id),
        "stopped"
    );
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerRemoved { id: id.clone() });
    // A second container goes with its sandbox: stopped, then removed, each before the sandbox.
    let second = s
        .client
        .create_container(&sandbox, container_config("d"), sandbox_config("a", false))
        .await
        .expect("create");
    s.client.stop_pod_sandbox(&sandbox).await.expect("stop sandbox");
    s.client.remove_pod_sandbox(&sandbox).await.expect("remove sandbox");
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerCreated { id: second.clone(), pid: None });
    assert!(
        matches!(next(&mut events).await, RuntimeEvent::ContainerExited { id: ref e, .. } if *e == second)
    );
    // The sandbox's own stop (the node's PLEG relists its pod: sandbox stops are not the node's marked
    // changes), and its removal after its containers'.
    assert!(
        matches!(next(&mut events).await, RuntimeEvent::ContainerExited { id: ref e, .. } if *e == sandbox)
    );
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerRemoved { id: second });
    assert_eq!(next(&mut events).await, RuntimeEvent::ContainerRemoved { id: sandbox });
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_its_stream_ended_not_a_gap() {
    use futures::StreamExt;
    use k8s_cri::v1::runtime_service_server::RuntimeService;
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeCri::new(0, dir.path());
    let stream =
        fake.get_container_events(tonic::Request::new(v1::GetEventsRequest {})).await.expect("served");
    let mut stream = stream.into_inner();
    let sandbox = fake.run_pod_sandbox(tonic::Request::new(v1::RunPodSandboxRequest {
        config: Some(sandbox_config("a", false)),
        runtime_handler: String::new(),
    }));
    let sandbox = sandbox.await.expect("run").into_inner().pod_sandbox_id;
    // More creations than the queue holds, with nobody reading.
    for i in 0..40 {
        let request = v1::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(container_config(&format!("c{i}"))),
            sandbox_config: Some(sandbox_config("a", false)),
        };
        fake.create_container(tonic::Request::new(request)).await.expect("create");
    }
    let first = stream.next().await.expect("an item");
    assert_eq!(first.expect_err("the stream ends with an error").code(), tonic::Code::Aborted);
    assert!(stream.next().await.is_none(), "and ends");
}

/// The labels nodelet puts on a sandbox (`pod` true) or a container of pod `uid` on node `node`.
fn node_labels(node: &str, uid: &str, pod: bool) -> HashMap<String, String> {
    use nodelet_cri::labels;
    let mut l = HashMap::from([
        (labels::MANAGED.to_owned(), labels::MANAGED_VALUE.to_owned()),
        (labels::NODE.to_owned(), node.to_owned()),
        (labels::POD_UID.to_owned(), uid.to_owned()),
    ]);
    if pod {
        l.insert(labels::POD_NAME.to_owned(), format!("pod-{uid}"));
        l.insert(labels::POD_NAMESPACE.to_owned(), "default".to_owned());
    } else {
        l.insert(labels::CONTAINER_NAME.to_owned(), "c".to_owned());
    }
    l
}

#[tokio::test]
async fn the_stats_summary_kept_between_rounds_has_no_spare_room() {
    let s = served(0).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = "hollow-stats";
    for uid in ["a", "b", "c"] {
        let mut config = sandbox_config(uid, false);
        config.labels = node_labels(node, uid, true);
        let sandbox = s.client.run_pod_sandbox(config.clone(), "").await.expect("run");
        let mut container = container_config("c");
        container.labels = node_labels(node, uid, false);
        let id = s.client.create_container(&sandbox, container, config).await.expect("create");
        s.client.start_container(&id).await.expect("start");
    }
    let runtime = nodelet_cri::CriPodRuntime::new(
        s.client.clone(),
        nodelet_cri::CriPodRuntimeConfig::default().with_root_dir(dir.path()),
    );
    let stats = nodelet_stats::StatsProvider::new(
        Arc::new(runtime),
        nodelet_stats::StatsConfig::new(node, dir.path(), dir.path()),
        nodelet_resources::common::clock::system_clock(),
    );
    // The summary as kept (`summary()` answers a copy).
    let summary = stats.refresh().await.expect("summary");
    assert_eq!(summary.pods.len(), 3);
    assert_eq!(summary.pods.capacity(), 3);
    for pod in &summary.pods {
        assert_eq!(pod.containers.len(), 1, "{:?}", pod.pod_ref);
        // A `Vec` grown by one push has room for four.
        assert_eq!(pod.containers.capacity(), 1, "{:?}", pod.pod_ref);
        assert_eq!(pod.volume.capacity(), pod.volume.len());
    }
}

#[test]
fn the_fake_runtimes_maps_hold_boxed_records() {
    // A map's spare buckets (up to as many as it holds) then cost a pointer each, not a record.
    assert_eq!(FakeCri::record_value_sizes(), (std::mem::size_of::<usize>(), std::mem::size_of::<usize>()));
}
