//! Tests of the pod config: merging, duplicates, sync, problems, `config.seen`.

use std::path::PathBuf;

use nodelet_resources::model::pod::PodSource;
use nodelet_resources::pod::validation::CONFIG_SEEN_ANNOTATION;

use super::testutil::{NODE, by_name, desired, names};
use super::*;

fn file(name: &str) -> PodSource {
    PodSource::File(PathBuf::from(format!("/manifests/{name}.yaml")))
}

fn problem(location: &str, message: &str) -> Problem {
    Problem { location: location.into(), object: None, message: message.into() }
}

#[test]
fn a_report_replaces_the_sources_whole_set() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let files = config.add_source("file").expect("first source");
    assert_eq!((config.node_name(), files.node_name()), (NODE, NODE));
    files.report(vec![desired("a", "nginx", file("a")), desired("b", "nginx", file("b"))], Vec::new());
    assert_eq!(names(&store), ["a-node-a", "b-node-a"]);
    files.report(vec![desired("b", "nginx", file("b"))], Vec::new());
    assert_eq!(names(&store), ["b-node-a"], "a pod its source no longer lists disappears");
    let b = by_name(&store, "b-node-a").expect("b present");
    assert!(store.contains_key(&b.uid().to_owned()), "keyed by UID");
}

#[test]
fn the_store_syncs_once_every_source_reported_after_seal() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let files = config.add_source("file").expect("file");
    let http = config.add_source("http").expect("http");
    files.report(Vec::new(), Vec::new());
    assert!(!store.is_synced());
    config.seal();
    assert!(!store.is_synced(), "http has not reported");
    http.set_problems(vec![problem("x", "not yet")]);
    assert!(!store.is_synced(), "problems alone are not a report");
    http.report(Vec::new(), Vec::new());
    assert!(store.is_synced());
    assert_eq!(config.add_source("api").err(), Some(PodConfigError::Sealed("api".into())));
}

#[test]
fn a_config_without_sources_syncs_at_seal_and_names_are_unique() {
    let config = PodConfig::new(NODE);
    let _files = config.add_source("file").expect("file");
    assert_eq!(config.add_source("file").err(), Some(PodConfigError::DuplicateSource("file".into())));
    let empty = PodConfig::new(NODE);
    empty.seal();
    assert!(empty.store().is_synced());
}

#[test]
fn duplicates_across_sources_first_wins_and_the_other_is_a_problem() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let files = config.add_source("file").expect("file");
    let http = config.add_source("http").expect("http");
    files.report(vec![desired("web", "nginx:1", file("web"))], Vec::new());
    http.report(vec![desired("web", "nginx:2", PodSource::Http)], Vec::new());
    let web = by_name(&store, "web-node-a").expect("web present");
    assert_eq!(web.source, file("web"));
    let problems = config.problems().list();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].location, "http endpoint");
    assert_eq!(problems[0].object.as_deref(), Some("default/web-node-a"));
    assert!(problems[0].message.contains("duplicate pod name"), "{}", problems[0]);
    assert!(problems[0].message.contains("/manifests/web.yaml"), "{}", problems[0]);

    // The file pod goes away: the submitted one takes its place and the problem is resolved.
    files.report(Vec::new(), Vec::new());
    assert_eq!(by_name(&store, "web-node-a").map(|p| p.source), Some(PodSource::Http));
    assert!(config.problems().is_empty(), "{:?}", config.problems().list());
}

#[test]
fn a_running_pod_is_not_displaced_by_a_new_duplicate() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let files = config.add_source("file").expect("file");
    let http = config.add_source("http").expect("http");
    http.report(vec![desired("web", "nginx:2", PodSource::Http)], Vec::new());
    files.report(vec![desired("web", "nginx:1", file("web"))], Vec::new());
    assert_eq!(by_name(&store, "web-node-a").map(|p| p.source), Some(PodSource::Http));
    assert_eq!(config.problems().list()[0].location, "/manifests/web.yaml");

    // Editing the running pod (new UID, same name, same place) keeps it first.
    http.report(vec![desired("web", "nginx:3", PodSource::Http)], Vec::new());
    let web = by_name(&store, "web-node-a").expect("web present");
    assert_eq!(web.source, PodSource::Http);
    assert_eq!(web.containers()[0].image.as_deref(), Some("nginx:3"));
}

#[test]
fn the_same_uid_twice_in_one_source_is_reported() {
    let config = PodConfig::new(NODE);
    let files = config.add_source("file").expect("file");
    let pod = desired("web", "nginx", file("web"));
    files.report(vec![pod.clone(), pod], Vec::new());
    assert_eq!(config.store().len(), 1);
    let problems = config.problems().list();
    assert!(problems[0].message.contains("duplicate pod UID"), "{problems:?}");
}

#[test]
fn config_seen_is_set_once_and_rescans_change_nothing() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let files = config.add_source("file").expect("file");
    let pod = desired("web", "nginx", file("web"));
    files.report(vec![pod.clone()], Vec::new());
    let first = store.get(&pod.uid().to_owned()).expect("present");
    let seen = first.pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SEEN_ANNOTATION)).cloned();
    let seen = seen.expect("config.seen set");
    assert_eq!(seen.len(), "2024-01-01T00:00:00Z".len(), "{seen}");
    assert!(seen.ends_with('Z') && seen.as_bytes()[10] == b'T', "{seen}");

    let changes = store.subscribe();
    files.report(vec![pod.clone()], Vec::new());
    let again = store.get(&pod.uid().to_owned()).expect("present");
    assert!(Arc::ptr_eq(&first, &again), "an identical report does not rewrite the pod");
    assert!(changes.is_empty(), "and notifies nobody");
}

#[test]
fn problems_are_listed_sorted_and_replaced_per_source() {
    let config = PodConfig::new(NODE);
    let problems = config.problems();
    let files = config.add_source("file").expect("file");
    let url = config.add_source("url").expect("url");
    files.report(Vec::new(), vec![problem("/m/b.yaml", "bad"), problem("/m/a.yaml", "worse")]);
    url.set_problems(vec![problem("http://127.0.0.1:1/", "connection refused")]);
    let list: Vec<String> = problems.list().iter().map(ToString::to_string).collect();
    assert_eq!(list, ["/m/a.yaml: worse", "/m/b.yaml: bad", "http://127.0.0.1:1/: connection refused"]);
    let version = problems.version();
    url.set_problems(vec![problem("http://127.0.0.1:1/", "connection refused")]);
    assert_eq!(problems.version(), version, "the same problems again are no change");
    files.report(Vec::new(), Vec::new());
    assert_eq!(problems.list().len(), 1);
    assert_ne!(problems.version(), version, "a problem resolved is a change");
    url.report(Vec::new(), Vec::new());
    assert!(problems.is_empty());
}

#[test]
fn problems_are_capped_per_location_and_in_all_with_a_count_of_the_rest() {
    let config = PodConfig::new(NODE);
    let problems = config.problems();
    let files = config.add_source("file").expect("file");
    // One file with 1,000 problems: 20 kept, the rest counted.
    let many: Vec<Problem> = (0..1000).map(|i| problem("/m/big.yaml", &format!("bad {i:04}"))).collect();
    files.report(Vec::new(), many);
    let list = problems.list();
    assert_eq!(list.len(), MAX_PROBLEMS_PER_LOCATION + 1);
    assert!(list.iter().any(|p| p.to_string() == "/m/big.yaml: … and 980 more problems"), "{list:?}");
    // 300 files with 2 problems each: 200 in all, the last one counting the rest.
    let spread: Vec<Problem> = (0..300)
        .flat_map(|f| [problem(&format!("/m/{f:03}.yaml"), "a"), problem(&format!("/m/{f:03}.yaml"), "b")])
        .collect();
    files.report(Vec::new(), spread);
    let list = problems.list();
    assert_eq!(list.len(), MAX_PROBLEMS);
    assert!(list.iter().any(|p| p.to_string() == "pod sources: … and 401 more problems"), "{list:?}");
    files.report(Vec::new(), Vec::new());
    assert!(problems.is_empty());
}

#[test]
fn conflicts_name_the_other_source() {
    let config = PodConfig::new(NODE);
    let files = config.add_source("file").expect("file");
    let http = config.add_source("http").expect("http");
    files.report(vec![desired("web", "nginx", file("web"))], Vec::new());
    let clash =
        http.conflicts(&[desired("web", "other", PodSource::Http), desired("api", "x", PodSource::Http)]);
    assert_eq!(clash.len(), 1, "{clash:?}");
    assert!(
        clash[0].contains("\"default/web-node-a\"") && clash[0].contains("/manifests/web.yaml"),
        "{clash:?}"
    );
    assert!(files.conflicts(&[desired("web", "nginx", file("web"))]).is_empty(), "own pods never conflict");
}

#[test]
fn ephemeral_containers_of_static_pods_are_kept_merged_and_dropped_with_their_pod() {
    use k8s_openapi::api::core::v1::EphemeralContainer;
    let dir = tempfile::tempdir().expect("tempdir");
    let debugger = |name: &str| EphemeralContainer {
        name: name.into(),
        image: Some("busybox".into()),
        target_container_name: Some("app".into()),
        ..Default::default()
    };
    let config = PodConfig::new(NODE).with_debug_state(debug::DebugState::load(dir.path()).expect("load"));
    let store = config.store();
    let files = config.add_source("file").expect("file");
    config.seal();
    files.report(vec![desired("a", "nginx", file("a"))], Vec::new());
    config.add_ephemeral_container("default", "a-node-a", debugger("dbg")).expect("added");
    let pod = by_name(&store, "a-node-a").expect("a");
    assert_eq!(pod.ephemeral_specs().len(), 1);
    let err = config.add_ephemeral_container("default", "a-node-a", debugger("dbg")).expect_err("duplicate");
    assert!(err.to_string().contains("Duplicate value"), "{err}");
    let err = config.add_ephemeral_container("default", "nope", debugger("x")).expect_err("unknown pod");
    assert!(matches!(err, debug::DebugError::PodNotFound { .. }), "{err}");

    // A new pod config (a restart) merges the kept container into the same pod again.
    let again = PodConfig::new(NODE).with_debug_state(debug::DebugState::load(dir.path()).expect("reload"));
    let files2 = again.add_source("file").expect("file");
    again.seal();
    files2.report(vec![desired("a", "nginx", file("a"))], Vec::new());
    let pod = by_name(&again.store(), "a-node-a").expect("a");
    assert_eq!(pod.ephemeral_specs().first().map(|c| c.name.as_str()), Some("dbg"));

    // The pod goes: so do its ephemeral containers.
    files2.report(Vec::new(), Vec::new());
    files2.report(vec![desired("a", "nginx", file("a"))], Vec::new());
    assert!(by_name(&again.store(), "a-node-a").expect("a").ephemeral_specs().is_empty());
}

/// An ephemeral container adding `SYS_ADMIN`.
fn sys_admin_debugger(name: &str) -> k8s_openapi::api::core::v1::EphemeralContainer {
    use k8s_openapi::api::core::v1::{Capabilities, EphemeralContainer, SecurityContext};
    EphemeralContainer {
        name: name.into(),
        image: Some("busybox".into()),
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities { add: Some(vec!["SYS_ADMIN".into()]), drop: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Pods of the HTTP endpoint held to `baseline`, nothing else restricted.
fn http_at_baseline() -> SecurityPolicies {
    use nodelet_resources::pod::security::{Level, PodSecurity};
    SecurityPolicies {
        http: PodSecurity { level: Level::Baseline, restrictions: None },
        ..Default::default()
    }
}

#[test]
fn an_ephemeral_container_is_admitted_with_its_pod_at_the_sources_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = PodConfig::new(NODE)
        .with_debug_state(debug::DebugState::load(dir.path()).expect("load"))
        .with_security(http_at_baseline());
    let store = config.store();
    let http = config.add_source("http").expect("http");
    config.seal();
    http.report(vec![desired("a", "nginx", PodSource::Http)], Vec::new());
    let err = config
        .add_ephemeral_container("default", "a-node-a", sys_admin_debugger("dbg"))
        .expect_err("SYS_ADMIN");
    assert!(matches!(err, debug::DebugError::Forbidden(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "pods \"default/a-node-a\" is forbidden: violates PodSecurity \"baseline:latest\": non-default capabilities \
         (container \"dbg\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add)"
    );
    assert!(by_name(&store, "a-node-a").expect("a").ephemeral_specs().is_empty(), "not added");
    assert!(
        debug::DebugState::load(dir.path())
            .expect("reload")
            .containers(by_name(&store, "a-node-a").expect("a").uid())
            .is_empty(),
        "not kept"
    );
    // A plain debugger is still welcome.
    let plain = k8s_openapi::api::core::v1::EphemeralContainer {
        name: "plain".into(),
        image: Some("busybox".into()),
        ..Default::default()
    };
    config.add_ephemeral_container("default", "a-node-a", plain).expect("baseline allows it");
}

#[test]
fn ephemeral_containers_kept_from_before_are_admitted_again_when_merged() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Added while the HTTP source was privileged...
    let config = PodConfig::new(NODE).with_debug_state(debug::DebugState::load(dir.path()).expect("load"));
    let http = config.add_source("http").expect("http");
    config.seal();
    http.report(vec![desired("a", "nginx", PodSource::Http)], Vec::new());
    config
        .add_ephemeral_container("default", "a-node-a", sys_admin_debugger("dbg"))
        .expect("privileged source");

    // ...then nodelet restarts with the source at baseline: the kept container is left out.
    let again = PodConfig::new(NODE)
        .with_debug_state(debug::DebugState::load(dir.path()).expect("reload"))
        .with_security(http_at_baseline());
    let http = again.add_source("http").expect("http");
    again.seal();
    http.report(vec![desired("a", "nginx", PodSource::Http)], Vec::new());
    let pod = by_name(&again.store(), "a-node-a").expect("the pod itself runs");
    assert!(pod.ephemeral_specs().is_empty(), "{:?}", pod.ephemeral_specs());
}

#[test]
fn api_pods_get_no_ephemeral_containers_from_nodelet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = PodConfig::new(NODE).with_debug_state(debug::DebugState::empty(dir.path()));
    let api = config.add_source("api").expect("api");
    config.seal();
    let mut value: serde_json::Value =
        nodelet_shared::yaml::from_str(&super::testutil::pod_yaml("web", "nginx")).expect("yaml");
    value["metadata"]["uid"] = serde_json::json!("0b1c4f2e-7d3a-4c55-9b8e-0f1e2d3c4b5a");
    let pod = nodelet_resources::pod::validation::prepare_value(value, PodSource::Api, NODE).expect("valid");
    api.report(vec![pod], Vec::new());
    let container = k8s_openapi::api::core::v1::EphemeralContainer {
        name: "dbg".into(),
        image: Some("busybox".into()),
        ..Default::default()
    };
    let err = config.add_ephemeral_container("default", "web", container).expect_err("API pod");
    assert!(matches!(err, debug::DebugError::ApiPod(_)), "{err}");
}

#[test]
fn a_pod_reported_again_is_written_again_only_when_it_or_the_nodes_bound_changed() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let files = config.add_source("file").expect("file");
    let (a, b) = (Arc::new(desired("a", "nginx", file("a"))), Arc::new(desired("b", "nginx", file("b"))));
    files.report_shared(vec![a.clone(), b.clone()], Vec::new());
    let written = |name: &str| {
        let uid = by_name(&store, name).expect("present").uid().to_owned();
        store.get(&uid).expect("in the store")
    };
    let (a1, b1) = (written("a-node-a"), written("b-node-a"));
    let sub = store.subscribe();
    let b2 = Arc::new(desired("b", "nginx:2", file("b")));
    files.report_shared(vec![a.clone(), b2], Vec::new());
    assert!(Arc::ptr_eq(&written("a-node-a"), &a1), "the unchanged pod is the value written before");
    assert!(!Arc::ptr_eq(&written("b-node-a"), &b1));
    assert_eq!(
        written("b-node-a").pod.spec.as_ref().map(|s| s.containers[0].image.clone()),
        Some(Some("nginx:2".into()))
    );
    // (b's UID, a hash of its manifest, changed with it: the old one went, the new one came)
    let a_uid = a1.uid().to_owned();
    let changed = sub.drain();
    assert!(!changed.is_empty() && !changed.contains(&a_uid), "only the changed pod is written: {changed:?}");
    // An equal pod in a new `Arc` (a source that rebuilds its pods) is compared, and left alone.
    let a_again = Arc::new(desired("a", "nginx", file("a")));
    files.report_shared(vec![a_again, Arc::new(desired("b", "nginx:2", file("b")))], Vec::new());
    assert!(Arc::ptr_eq(&written("a-node-a"), &a1));
    assert!(sub.drain().is_empty(), "nothing changed");
    // What the merge adds still follows the node's settings.
    let seen = |p: &DesiredPod| {
        p.pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SEEN_ANNOTATION)).cloned()
    };
    assert_eq!(seen(&written("a-node-a")), seen(&a1), "config.seen stays");
    let config = config
        .with_grace_cap(nodelet_resources::pod::grace::GraceCap::at_most(std::time::Duration::from_secs(5)));
    files.report_shared(vec![a, Arc::new(desired("b", "nginx:2", file("b")))], Vec::new());
    let grace = |p: &DesiredPod| p.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
    assert_eq!(grace(&written("a-node-a")), Some(5), "a new bound applies to the same source pod");
    assert_eq!(config.store().len(), 2);
}

#[test]
fn a_pod_its_source_marked_seen_is_kept_once_unless_the_merge_changes_it() {
    let config = PodConfig::new(NODE);
    let store = config.store();
    let http = config.add_source("http").expect("http");
    let mut marked = desired("a", "nginx", PodSource::Http);
    http.mark_seen(&mut marked);
    let marked = Arc::new(marked);
    let unmarked = Arc::new(desired("b", "nginx", PodSource::Http));
    http.report_shared(vec![marked.clone(), unmarked.clone()], Vec::new());
    let written = |name: &str| {
        let uid = by_name(&store, name).expect("present").uid().to_owned();
        store.get(&uid).expect("in the store")
    };
    assert!(Arc::ptr_eq(&written("a-node-a"), &marked), "the source's pod is the desired pod: no copy");
    assert!(!Arc::ptr_eq(&written("b-node-a"), &unmarked), "an unmarked pod gets an annotated copy");
    let seen = |p: &DesiredPod| {
        p.pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SEEN_ANNOTATION)).cloned()
    };
    assert!(seen(&written("b-node-a")).is_some() && seen(&unmarked).is_none());
    // Marking a pod again gives the time its UID was first seen.
    let mut again = desired("a", "nginx", PodSource::Http);
    http.mark_seen(&mut again);
    assert_eq!(seen(&again), seen(&marked));
    // A grace-period bound changes the pod: it is written as a copy, lowered, with the same mark.
    let config = config
        .with_grace_cap(nodelet_resources::pod::grace::GraceCap::at_most(std::time::Duration::from_secs(5)));
    http.report_shared(vec![marked.clone(), unmarked], Vec::new());
    let grace = |p: &DesiredPod| p.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
    assert!(!Arc::ptr_eq(&written("a-node-a"), &marked));
    assert_eq!((grace(&written("a-node-a")), seen(&written("a-node-a"))), (Some(5), seen(&marked)));
    assert_eq!(config.store().len(), 2);
}
