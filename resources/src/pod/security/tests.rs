use serde_json::{Value, json};

use super::*;

fn pod(spec: Value) -> Pod {
    pod_with(json!({}), spec)
}

fn pod_with(metadata: Value, spec: Value) -> Pod {
    serde_json::from_value(json!({"metadata": metadata, "spec": spec})).expect("test pod")
}

fn c(name: &str, sc: Value) -> Value {
    json!({"name": name, "image": "busybox", "securityContext": sc})
}

/// A container that passes every restricted check.
fn good(name: &str) -> Value {
    c(name, json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}))
}

fn restricted_pod_sc() -> Value {
    json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
}

fn messages(p: &Pod, level: Level) -> Vec<String> {
    evaluate(p, level).iter().map(ToString::to_string).collect()
}

fn only(p: &Pod, level: Level) -> String {
    let all = messages(p, level);
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].clone()
}

#[test]
fn plain_pod_passes_baseline_and_privileged_allows_everything() {
    let plain = pod(json!({"containers": [c("a", json!({}))]}));
    assert!(evaluate(&plain, Level::Baseline).is_empty());
    let wild = pod(json!({"hostNetwork": true, "containers": [c("a", json!({"privileged": true}))]}));
    assert!(evaluate(&wild, Level::Privileged).is_empty());
}

#[test]
fn host_namespaces() {
    let p = pod(
        json!({"hostNetwork": true, "hostPID": true, "hostIPC": true, "containers": [c("a", json!({}))]}),
    );
    assert_eq!(only(&p, Level::Baseline), "host namespaces (hostNetwork=true, hostPID=true, hostIPC=true)");
    let p = pod(json!({"hostNetwork": false, "containers": [c("a", json!({}))]}));
    assert!(evaluate(&p, Level::Baseline).is_empty());
}

#[test]
fn privileged() {
    let p = pod(json!({"initContainers": [c("i", json!({"privileged": true}))],
        "containers": [c("a", json!({"privileged": true})), c("b", json!({"privileged": false}))]}));
    assert_eq!(
        only(&p, Level::Baseline),
        r#"privileged (containers "i", "a" must not set securityContext.privileged=true)"#
    );
}

#[test]
fn capabilities_baseline() {
    let p = pod(
        json!({"containers": [c("a", json!({"capabilities": {"add": ["NET_ADMIN", "CHOWN", "NET_RAW"]}}))]}),
    );
    assert_eq!(
        only(&p, Level::Baseline),
        r#"non-default capabilities (container "a" must not include "NET_ADMIN", "NET_RAW" in securityContext.capabilities.add)"#
    );
    let p = pod(json!({"containers": [c("a", json!({"capabilities": {"add": ["CHOWN", "KILL"]}}))]}));
    assert!(evaluate(&p, Level::Baseline).is_empty());
}

#[test]
fn host_path_volumes_and_ports() {
    let p = pod(json!({"containers": [
            {"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]},
            {"name": "b", "image": "x", "ports": [{"containerPort": 81, "hostPort": 8081}, {"containerPort": 82}]}],
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}, {"name": "e", "emptyDir": {}}]}));
    assert_eq!(
        messages(&p, Level::Baseline),
        [r#"hostPath volumes (volume "h")"#, r#"hostPort (containers "a", "b" use hostPorts 8080, 8081)"#]
    );
    let one = pod(
        json!({"containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
    );
    assert_eq!(only(&one, Level::Baseline), r#"hostPort (container "a" uses hostPort 80)"#);
}

#[test]
fn app_armor() {
    let p = pod_with(
        json!({"annotations": {
            "container.apparmor.security.beta.kubernetes.io/a": "runtime/default",
            "container.apparmor.security.beta.kubernetes.io/b": "localhost/foo",
            "container.apparmor.security.beta.kubernetes.io/c": "unconfined"}}),
        json!({"containers": [c("a", json!({})), c("b", json!({})), c("c", json!({}))]}),
    );
    assert_eq!(
        only(&p, Level::Baseline),
        r#"forbidden AppArmor profile (container.apparmor.security.beta.kubernetes.io/c="unconfined")"#
    );
    let fine = pod_with(
        json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "runtime/default"}}),
        json!({"containers": [c("a", json!({}))]}),
    );
    assert!(evaluate(&fine, Level::Baseline).is_empty());
}

#[test]
fn se_linux_options() {
    let p = pod(json!({"securityContext": {"seLinuxOptions": {"type": "foo", "user": "bar"}},
        "containers": [c("a", json!({"seLinuxOptions": {"type": "container_t"}})),
                       c("b", json!({"seLinuxOptions": {"role": "baz", "type": "bar"}}))]}));
    assert_eq!(
        only(&p, Level::Baseline),
        r#"seLinuxOptions (pod and container "b" set forbidden securityContext.seLinuxOptions: types "bar", "foo"; user may not be set; role may not be set)"#
    );
}

#[test]
fn proc_mount_seccomp_sysctls_host_process() {
    let p = pod(
        json!({"containers": [c("a", json!({"procMount": "Unmasked"})), c("b", json!({"procMount": "Default"}))]}),
    );
    assert_eq!(
        only(&p, Level::Baseline),
        r#"procMount (container "a" must not set securityContext.procMount to "Unmasked")"#
    );

    let p = pod(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}},
        "containers": [c("a", json!({"seccompProfile": {"type": "Unconfined"}})), c("b", json!({}))]}));
    assert_eq!(
        only(&p, Level::Baseline),
        r#"seccompProfile (pod and container "a" must not set securityContext.seccompProfile.type to "Unconfined")"#
    );
    let p = pod(
        json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}, "containers": [c("a", json!({}))]}),
    );
    assert!(evaluate(&p, Level::Baseline).is_empty());

    let p = pod(json!({"securityContext": {"sysctls": [
            {"name": "net.core.somaxconn", "value": "1"}, {"name": "kernel.shm_rmid_forced", "value": "1"},
            {"name": "kernel.msgmax", "value": "1"}]},
        "containers": [c("a", json!({}))]}));
    assert_eq!(only(&p, Level::Baseline), "forbidden sysctls (net.core.somaxconn, kernel.msgmax)");

    let p = pod(json!({"securityContext": {"windowsOptions": {"hostProcess": true}},
        "containers": [c("a", json!({"windowsOptions": {"hostProcess": true}}))]}));
    assert_eq!(
        only(&p, Level::Baseline),
        r#"hostProcess (pod and container "a" must not set securityContext.windowsOptions.hostProcess=true)"#
    );
}

#[test]
fn restricted_reports_in_upstream_order() {
    let p = pod(json!({"containers": [c("nginx-120", json!({"privileged": true, "runAsUser": 0}))]}));
    assert_eq!(
        messages(&p, Level::Restricted),
        [
            r#"privileged (container "nginx-120" must not set securityContext.privileged=true)"#,
            r#"allowPrivilegeEscalation != false (container "nginx-120" must set securityContext.allowPrivilegeEscalation=false)"#,
            r#"unrestricted capabilities (container "nginx-120" must set securityContext.capabilities.drop=["ALL"])"#,
            r#"runAsNonRoot != true (pod or container "nginx-120" must set securityContext.runAsNonRoot=true)"#,
            r#"runAsUser=0 (container "nginx-120" must not set runAsUser=0)"#,
            r#"seccompProfile (pod or container "nginx-120" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
        ]
    );
}

#[test]
fn restricted_passes_a_hardened_pod() {
    let p = pod(json!({"securityContext": restricted_pod_sc(), "containers": [good("a")],
        "volumes": [{"name": "e", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "x"}}]}));
    assert_eq!(messages(&p, Level::Restricted), Vec::<String>::new());
}

#[test]
fn restricted_volumes_and_capabilities_replace_the_baseline_checks() {
    let p = pod(json!({"securityContext": restricted_pod_sc(),
        "containers": [c("a", json!({"allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "NET_BIND_SERVICE"]}}))],
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}, {"name": "n", "nfs": {"server": "s", "path": "/"}}]}));
    assert_eq!(
        messages(&p, Level::Restricted),
        [
            r#"unrestricted capabilities (container "a" must not include "SYS_ADMIN" in securityContext.capabilities.add)"#,
            r#"restricted volume types (volumes "h", "n" use restricted volume types "hostPath", "nfs")"#,
        ]
    );
}

#[test]
fn restricted_run_as_non_root_and_seccomp_explicit() {
    let p = pod(json!({"securityContext": {"runAsNonRoot": false, "seccompProfile": {"type": "Unconfined"}},
        "containers": [good("a"), c("b", json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}))]}));
    assert_eq!(
        messages(&p, Level::Restricted),
        [
            r#"runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false; pod or container "a" must set securityContext.runAsNonRoot=true)"#,
            r#"seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined"; pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
        ]
    );
}

#[test]
fn admit_text_is_the_api_servers() {
    let p = pod(json!({"hostNetwork": true, "containers": [c("a", json!({}))]}));
    let policy = PodSecurity { level: Level::Baseline, restrictions: None };
    let err = policy.admit(&p).expect_err("hostNetwork at baseline");
    assert_eq!(
        err.to_string(),
        r#"violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)"#
    );
    assert!(PodSecurity::default().admit(&p).is_ok(), "privileged allows it");
    assert_eq!("restricted".parse::<Level>(), Ok(Level::Restricted));
    assert!("root".parse::<Level>().is_err());
}

#[test]
fn node_restrictions_refuse_every_way_to_root() {
    let r = NodeRestrictions {
        host_path_prefixes: vec![PathBuf::from("/srv/data")],
        reserved_host_ports: [10250u16, 10248].into_iter().collect(),
    };
    let policy = PodSecurity { level: Level::Privileged, restrictions: Some(r.clone()) };
    assert_eq!(policy.effective_level(), Level::Baseline, "--allow-privileged=false caps at baseline");
    let plain = pod(json!({"containers": [c("a", json!({"capabilities": {"add": ["CHOWN"]}}))],
        "volumes": [{"name": "ok", "hostPath": {"path": "/srv/data/x"}}]}));
    assert!(policy.admit(&plain).is_ok(), "a hostPath under an allowed prefix passes the cap");
    let baseline = PodSecurity { level: Level::Baseline, restrictions: None };
    assert!(baseline.admit(&plain).is_err(), "baseline alone refuses every hostPath");
    // NET_RAW is in the runtime's default set but not in baseline's.
    let raw = pod(json!({"containers": [c("a", json!({"capabilities": {"add": ["NET_RAW"]}}))]}));
    let err = policy.admit(&raw).expect_err("NET_RAW at the cap");
    assert!(
        err.to_string().starts_with(r#"violates PodSecurity "baseline:latest": non-default capabilities"#),
        "{err}"
    );
    let restricted = PodSecurity { level: Level::Restricted, restrictions: Some(r.clone()) };
    assert_eq!(restricted.effective_level(), Level::Restricted, "the cap never lowers a level");

    let pid = pod(json!({"hostPID": true, "containers": [c("a", json!({}))]}));
    assert_eq!(r.check(&pid), ["spec.hostPID: host namespaces are not allowed"]);
    let err = policy.admit(&pid).expect_err("hostPID");
    assert!(err.to_string().starts_with("forbidden by --allow-privileged=false: spec.hostPID"), "{err}");

    let caps = pod(json!({"containers": [c("a", json!({"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}))]}));
    assert_eq!(
        r.check(&caps),
        [
            r#"spec.containers[0].securityContext.capabilities.add: "SYS_ADMIN" beyond the runtime's default set"#
        ]
    );

    let paths = pod(json!({"containers": [c("a", json!({}))], "volumes": [
        {"name": "root", "hostPath": {"path": "/"}},
        {"name": "sneaky", "hostPath": {"path": "/srv/data/../../etc"}},
        {"name": "near", "hostPath": {"path": "/srv/database"}}]}));
    let problems = r.check(&paths);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("spec.volumes[0].hostPath.path: \"/\" is not under an allowed hostPath prefix")
    );

    let ports = pod(json!({"containers": [{"name": "a", "image": "x",
        "ports": [{"containerPort": 80, "hostPort": 10250}, {"containerPort": 81, "hostPort": 8081}]}]}));
    assert_eq!(
        r.check(&ports),
        ["spec.containers[0].ports[0]: port 10250 is one of the node agent's own ports"]
    );

    let none = NodeRestrictions::default();
    let any_path = pod(
        json!({"containers": [c("a", json!({}))], "volumes": [{"name": "h", "hostPath": {"path": "/srv"}}]}),
    );
    assert!(none.check(&any_path)[0].ends_with("(none is allowed)"));
}
