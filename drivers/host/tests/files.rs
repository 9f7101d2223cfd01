//! Rendering every volume type (items, modes, optional, missing keys) and writing it to disk with the
//! atomic writer, checking what a container would see.

mod common;

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Volume};
use nodelet_host::atomic::write_atomic;
use nodelet_host::files::{
    FileSet, FilesError, NodeAllocatable, StaticObjects, volume_files, volume_files_with_node,
};
use serde_json::json;

fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid test object")
}

fn pod() -> Pod {
    from(json!({
        "metadata": {
            "name": "web-0", "namespace": "prod", "uid": "1111-2222",
            "labels": {"app": "web", "tier": "front\"end"},
            "annotations": {"note": "line1\nline2", "example.com/owner": "team-a"}
        },
        "spec": {
            "containers": [
                {"name": "app", "image": "x", "resources": {
                    "limits": {"cpu": "1500m", "memory": "64Mi"},
                    "requests": {"cpu": "250m", "memory": "32Mi"}
                }},
                {"name": "nolimits", "image": "x"}
            ],
            "initContainers": [{"name": "init", "image": "x", "resources": {"limits": {"memory": "1Gi"}}}]
        }
    }))
}

fn objects() -> StaticObjects {
    let mut objects = StaticObjects::new();
    objects.insert_config_map(from::<ConfigMap>(json!({
        "metadata": {"name": "app-config", "namespace": "prod"},
        "data": {"app.yaml": "port: 8080\n", "log.level": "debug"},
        "binaryData": {"logo.png": "iVBORw0K"}
    })));
    objects.insert_config_map(from::<ConfigMap>(json!({
        "metadata": {"name": "other-ns", "namespace": "default"},
        "data": {"x": "y"}
    })));
    objects.insert_secret(from::<Secret>(json!({
        "metadata": {"name": "creds", "namespace": "prod"},
        "data": {"password": "czNjcjN0", "user": "YWRtaW4="},
        "stringData": {"user": "root"}
    })));
    objects
}

fn volume(v: serde_json::Value) -> Volume {
    from(v)
}

fn render(v: serde_json::Value) -> Result<FileSet, FilesError> {
    volume_files(&pod(), &volume(v), &objects())
}

fn text(files: &FileSet, path: &str) -> (String, u32) {
    let entry = files
        .get(path)
        .unwrap_or_else(|| panic!("no file {path:?} in {:?}", files.keys().collect::<Vec<_>>()));
    (String::from_utf8_lossy(&entry.data).into_owned(), entry.mode)
}

fn err(v: serde_json::Value) -> String {
    match render(v) {
        Ok(files) => panic!("expected an error, got {:?}", files.keys().collect::<Vec<_>>()),
        Err(e) => e.to_string(),
    }
}

/// Writes `files` into a fresh directory and returns it.
fn on_disk(files: &FileSet) -> common::TestDir {
    let dir = common::TestDir::new();
    assert!(write_atomic(dir.path(), files).expect("write_atomic"));
    dir
}

fn read(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn config_map_all_keys_default_mode_and_binary_data() {
    let files = render(json!({"name": "cfg", "configMap": {"name": "app-config"}})).expect("render");
    assert_eq!(files.keys().collect::<Vec<_>>(), ["app.yaml", "log.level", "logo.png"]);
    assert_eq!(text(&files, "app.yaml"), ("port: 8080\n".into(), 0o644));
    assert_eq!(files["logo.png"].data[..], [0x89, b'P', b'N', b'G', 0x0d, 0x0a], "binaryData is decoded");
    let dir = on_disk(&files);
    assert_eq!(read(dir.path(), "app.yaml"), "port: 8080\n");
    assert_eq!(common::mode_of(&dir.path().join("..data/app.yaml")), 0o644);
    assert_eq!(std::fs::read_link(dir.path().join("app.yaml")).ok(), Some("..data/app.yaml".into()));
}

#[test]
fn config_map_items_with_modes_and_nested_paths() {
    let files =
        render(json!({"name": "cfg", "configMap": {"name": "app-config", "defaultMode": 0o600, "items": [
            {"key": "app.yaml", "path": "conf/app.yaml"},
            {"key": "log.level", "path": "./level", "mode": 0o400}
        ]}}))
        .expect("render");
    assert_eq!(files.keys().collect::<Vec<_>>(), ["conf/app.yaml", "level"]);
    assert_eq!(text(&files, "conf/app.yaml").1, 0o600);
    assert_eq!(text(&files, "level"), ("debug".into(), 0o400));
    let dir = on_disk(&files);
    assert_eq!(read(dir.path(), "conf/app.yaml"), "port: 8080\n");
    assert_eq!(common::mode_of(&dir.path().join("..data/conf/app.yaml")), 0o600);
    assert_eq!(common::mode_of(&dir.path().join("..data/level")), 0o400);
    assert_eq!(common::mode_of(&dir.path().join("..data/conf")), 0o755);
    assert!(!dir.path().join("log.level").exists(), "only the items are projected");
}

#[test]
fn config_map_missing_object_and_keys() {
    assert_eq!(
        err(json!({"name": "cfg", "configMap": {"name": "nope"}})),
        "volume \"cfg\": configMap \"nope\" not found"
    );
    // Objects are looked up in the pod's namespace only.
    assert_eq!(
        err(json!({"name": "cfg", "configMap": {"name": "other-ns"}})),
        "volume \"cfg\": configMap \"other-ns\" not found"
    );
    let files =
        render(json!({"name": "cfg", "configMap": {"name": "nope", "optional": true}})).expect("optional");
    assert!(files.is_empty());
    assert_eq!(
        err(json!({"name": "cfg", "configMap": {"name": "app-config", "items": [
            {"key": "app.yaml", "path": "a"}, {"key": "missing", "path": "b"}
        ]}})),
        "volume \"cfg\": items[1].key \"missing\": configMap \"app-config\" has no such key"
    );
    let files =
        render(json!({"name": "cfg", "configMap": {"name": "app-config", "optional": true, "items": [
            {"key": "app.yaml", "path": "a"}, {"key": "missing", "path": "b"}
        ]}}))
        .expect("optional skips missing keys");
    assert_eq!(files.keys().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn paths_modes_and_keys_are_validated() {
    let item = |path: &str| {
        json!({"name": "cfg", "configMap": {"name": "app-config", "items": [
            {"key": "app.yaml", "path": "ok"}, {"key": "app.yaml", "path": path}
        ]}})
    };
    assert_eq!(err(item("../x")), "volume \"cfg\": items[1].path \"../x\": must not contain \"..\"");
    assert_eq!(
        err(item("a/../../x")),
        "volume \"cfg\": items[1].path \"a/../../x\": must not contain \"..\""
    );
    assert_eq!(
        err(item("/etc/passwd")),
        "volume \"cfg\": items[1].path \"/etc/passwd\": must be a relative path"
    );
    assert_eq!(err(item("..data")), "volume \"cfg\": items[1].path \"..data\": must not start with \"..\"");
    assert_eq!(err(item("")), "volume \"cfg\": items[1].path: required");
    assert_eq!(err(item("ok/sub")), "volume \"cfg\": file \"ok/sub\" conflicts with the file \"ok\"");
    // Validated even when the object is missing and optional (the API server validates the pod).
    assert_eq!(
        err(
            json!({"name": "cfg", "configMap": {"name": "nope", "optional": true, "items": [{"key": "k", "path": "../x"}]}})
        ),
        "volume \"cfg\": items[0].path \"../x\": must not contain \"..\""
    );
    assert_eq!(
        err(json!({"name": "cfg", "configMap": {"name": "app-config", "defaultMode": 0o1777}})),
        "volume \"cfg\": defaultMode 0o1777: must be a number between 0 and 0777 (octal), both inclusive"
    );
    assert_eq!(
        err(
            json!({"name": "cfg", "secret": {"secretName": "creds", "items": [{"key": "user", "path": "u", "mode": -1}]}})
        ),
        "volume \"cfg\": items[0].mode -1: must be a number between 0 and 0777 (octal), both inclusive"
    );
    // Keys become file names without items: a hostile key in a manifest is rejected.
    let mut objects = objects();
    objects.insert_config_map(from::<ConfigMap>(json!({
        "metadata": {"name": "evil", "namespace": "prod"}, "data": {"../../etc/cron.d/x": "boom"}
    })));
    let e = volume_files(&pod(), &volume(json!({"name": "cfg", "configMap": {"name": "evil"}})), &objects)
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some(
            "volume \"cfg\": configMap \"evil\": key \"../../etc/cron.d/x\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
        )
    );
    assert_eq!(
        err(json!({"name": "e", "emptyDir": {}})),
        "volume \"e\": not a configMap, secret, downwardAPI or projected volume"
    );
}

#[test]
fn secret_data_string_data_and_optional() {
    let files = render(json!({"name": "s", "secret": {"secretName": "creds", "defaultMode": 0o400}}))
        .expect("render");
    assert_eq!(text(&files, "password"), ("s3cr3t".into(), 0o400));
    assert_eq!(text(&files, "user").0, "root", "stringData wins over data");
    let dir = on_disk(&files);
    assert_eq!(read(dir.path(), "password"), "s3cr3t");
    assert_eq!(common::mode_of(&dir.path().join("..data/password")), 0o400);
    assert_eq!(
        err(json!({"name": "s", "secret": {"secretName": "gone"}})),
        "volume \"s\": secret \"gone\" not found"
    );
    assert!(
        render(json!({"name": "s", "secret": {"secretName": "gone", "optional": true}}))
            .expect("optional")
            .is_empty()
    );
    assert_eq!(err(json!({"name": "s", "secret": {}})), "volume \"s\": secretName: required");
}

#[test]
fn downward_api_metadata() {
    let files = render(json!({"name": "info", "downwardAPI": {"items": [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace", "apiVersion": "v1"}},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}, "mode": 0o444},
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
        {"path": "owner", "fieldRef": {"fieldPath": "metadata.annotations['example.com/owner']"}},
        {"path": "absent", "fieldRef": {"fieldPath": "metadata.labels['absent']"}}
    ]}}))
    .expect("render");
    assert_eq!(text(&files, "name"), ("web-0".into(), 0o644));
    assert_eq!(text(&files, "ns").0, "prod");
    assert_eq!(text(&files, "uid").0, "1111-2222");
    assert_eq!(text(&files, "labels"), ("app=\"web\"\ntier=\"front\\\"end\"".into(), 0o444));
    assert_eq!(text(&files, "annotations").0, "example.com/owner=\"team-a\"\nnote=\"line1\\nline2\"");
    assert_eq!(text(&files, "app").0, "web");
    assert_eq!(text(&files, "owner").0, "team-a");
    assert_eq!(text(&files, "absent").0, "");
    let dir = on_disk(&files);
    assert_eq!(read(dir.path(), "labels"), "app=\"web\"\ntier=\"front\\\"end\"");

    let bad = |field_path: &str| {
        err(json!({"name": "info", "downwardAPI": {"items": [
            {"path": "x", "fieldRef": {"fieldPath": field_path}}
        ]}}))
    };
    assert!(
        bad("spec.nodeName")
            .starts_with("volume \"info\": items[0].fieldRef.fieldPath \"spec.nodeName\": supported values")
    );
    assert!(bad("metadata.labels['-bad-']").contains("invalid key subscript"));
    assert!(bad("metadata.name['x']").ends_with("does not support subscript"));
}

#[test]
fn downward_api_resources() {
    let node =
        NodeAllocatable { cpu_millis: 4000, memory_bytes: 8 << 30, ephemeral_storage_bytes: Some(100 << 30) };
    let render_node = |items: serde_json::Value| {
        volume_files_with_node(
            &pod(),
            &volume(json!({"name": "res", "downwardAPI": {"items": items}})),
            &objects(),
            &node,
        )
    };
    let files = render_node(json!([
        {"path": "cpu_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}},
        {"path": "cpu_limit_m", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu", "divisor": "1m"}},
        {"path": "cpu_request", "resourceFieldRef": {"containerName": "app", "resource": "requests.cpu", "divisor": "1m"}},
        {"path": "mem_limit_mi", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
        {"path": "mem_request", "resourceFieldRef": {"containerName": "app", "resource": "requests.memory"}},
        {"path": "unset_cpu", "resourceFieldRef": {"containerName": "nolimits", "resource": "limits.cpu"}},
        {"path": "unset_mem_gi", "resourceFieldRef": {"containerName": "nolimits", "resource": "limits.memory", "divisor": "1Gi"}},
        {"path": "unset_eph_gi", "resourceFieldRef": {"containerName": "nolimits", "resource": "limits.ephemeral-storage", "divisor": "1Gi"}},
        {"path": "unset_request", "resourceFieldRef": {"containerName": "nolimits", "resource": "requests.cpu"}},
        {"path": "init_request", "resourceFieldRef": {"containerName": "init", "resource": "requests.memory", "divisor": "1Mi"}},
        {"path": "huge", "resourceFieldRef": {"containerName": "app", "resource": "limits.hugepages-2Mi"}}
    ]))
    .expect("render");
    let value = |p: &str| text(&files, p).0;
    assert_eq!(value("cpu_limit"), "2", "1500m rounds up to 2 cores");
    assert_eq!(value("cpu_limit_m"), "1500");
    assert_eq!(value("cpu_request"), "250");
    assert_eq!(value("mem_limit_mi"), "64");
    assert_eq!(value("mem_request"), (32u64 << 20).to_string());
    assert_eq!(value("unset_cpu"), "4", "an unset limit is the node's allocatable");
    assert_eq!(value("unset_mem_gi"), "8");
    assert_eq!(value("unset_eph_gi"), "100");
    assert_eq!(value("unset_request"), "0");
    assert_eq!(value("init_request"), "1024", "an unset request defaults to the limit");
    assert_eq!(value("huge"), "0");

    // Without given allocatable: the host's CPUs and memory.
    let files = render(json!({"name": "res", "downwardAPI": {"items": [
        {"path": "cpu", "resourceFieldRef": {"containerName": "nolimits", "resource": "limits.cpu"}},
        {"path": "mem", "resourceFieldRef": {"containerName": "nolimits", "resource": "limits.memory"}}
    ]}}))
    .expect("render");
    let host = NodeAllocatable::from_host().expect("host facts");
    assert!(host.cpu_millis >= 1000 && host.memory_bytes > 0);
    assert_eq!(text(&files, "cpu").0, (host.cpu_millis / 1000).to_string());
    assert_eq!(text(&files, "mem").0, host.memory_bytes.to_string());

    let e = |items: serde_json::Value| render_node(items).err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(
        e(json!([{"path": "x", "resourceFieldRef": {"containerName": "ghost", "resource": "limits.cpu"}}])),
        "volume \"res\": items[0].resourceFieldRef.containerName \"ghost\": no such container in the pod"
    );
    assert_eq!(
        e(json!([{"path": "x", "resourceFieldRef": {"resource": "limits.cpu"}}])),
        "volume \"res\": items[0].resourceFieldRef.containerName: required"
    );
    assert_eq!(
        e(json!([{"path": "x", "resourceFieldRef": {"containerName": "app", "resource": "limits.gpu"}}])),
        "volume \"res\": items[0].resourceFieldRef.resource \"limits.gpu\": unsupported container resource"
    );
    assert!(e(json!([{"path": "x", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu", "divisor": "1Mi"}}]))
        .ends_with("only 1m and 1 are supported with the cpu resource"));
}

#[test]
fn projected_sources() {
    let files = render(json!({"name": "all", "projected": {"defaultMode": 0o640, "sources": [
        {"configMap": {"name": "app-config", "items": [{"key": "app.yaml", "path": "config/app.yaml"}]}},
        {"secret": {"name": "creds", "items": [{"key": "password", "path": "secret/password", "mode": 0o400}]}},
        {"downwardAPI": {"items": [{"path": "meta/name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        {"configMap": {"name": "absent", "optional": true}},
        {"secret": {"name": "absent", "optional": true, "items": [{"key": "k", "path": "never"}]}}
    ]}}))
    .expect("render");
    assert_eq!(files.keys().collect::<Vec<_>>(), ["config/app.yaml", "meta/name", "secret/password"]);
    assert_eq!(text(&files, "config/app.yaml").1, 0o640, "projected defaultMode");
    assert_eq!(text(&files, "secret/password"), ("s3cr3t".into(), 0o400));
    assert_eq!(text(&files, "meta/name"), ("web-0".into(), 0o640));
    let dir = on_disk(&files);
    assert_eq!(read(dir.path(), "secret/password"), "s3cr3t");
    assert_eq!(read(dir.path(), "meta/name"), "web-0");

    assert_eq!(
        err(json!({"name": "all", "projected": {"sources": [
            {"configMap": {"name": "app-config", "items": [{"key": "app.yaml", "path": "same"}]}},
            {"secret": {"name": "creds", "items": [{"key": "user", "path": "same"}]}}
        ]}})),
        "volume \"all\": sources[1].secret.items[0].path \"same\": conflicting duplicate paths"
    );
    assert_eq!(
        err(json!({"name": "all", "projected": {"sources": [{"secret": {"name": "gone"}}]}})),
        "volume \"all\": secret \"gone\" not found"
    );
    assert_eq!(
        err(json!({"name": "all", "projected": {"sources": [
            {"configMap": {"name": "app-config"}},
            {"serviceAccountToken": {"path": "token"}}
        ]}})),
        "volume \"all\": sources[1].serviceAccountToken: not supported in standalone mode: there is no API server to issue tokens"
    );
    assert!(
        err(json!({"name": "all", "projected": {"sources": [{"clusterTrustBundle": {"path": "b", "name": "x"}}]}}))
            .starts_with("volume \"all\": sources[0].clusterTrustBundle: not supported in standalone mode")
    );
    assert_eq!(
        err(
            json!({"name": "all", "projected": {"sources": [{"configMap": {"name": "app-config", "items": [{"key": "zzz", "path": "z"}]}}]}})
        ),
        "volume \"all\": sources[0].configMap.items[0].key \"zzz\": configMap \"app-config\" has no such key"
    );
}
