//! Limits the node enforces, on the real containerd: `podPidsLimit` on the pod cgroup (also written to a
//! running pod's when nodelet restarts with another limit), `maxPods` at admission, postStart hooks that
//! never return, and the node's bound on grace periods. Each case also checks what every hostile-input
//! case does: nodelet is alive at the end, its peak RSS stays under [`PEAK_RSS_MIB`], a healthy pod beside
//! it is untouched, and the refusal names the problem.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::support::{
    Nodelet, StartOptions, container, cri_state, env_or_skip, phase, runtime_id, sleep_until_term,
    terminated, uid,
};
use nodelet_cri::proto;

/// nodelet's peak RSS (VmHWM) bound through each case. A debug build, measured on the test machine, peaked at
/// 57-59 MiB in these cases (up to six pods, forty processes in one, a restart; start-up is nearly all of
/// it); 80 MiB leaves room for noise while a leak or an unbounded buffer of 20 MiB fails.
const PEAK_RSS_MIB: u64 = 80;

/// A healthy pod beside the case, to check that nothing touches it.
fn steady(n: &Nodelet) -> serde_json::Value {
    n.pod_manifest(
        "steady",
        json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
    )
}

/// Where the test machine mounts its cgroup hierarchies.
const CGROUP_FS: &str = "/sys/fs/cgroup";

/// A pod whose `forker` container starts 40 background processes, then says so and exits, beside a
/// `keeper` that keeps the pod (and its cgroup) alive.
fn forker_pod(n: &Nodelet) -> serde_json::Value {
    n.pod_manifest(
        "forker",
        json!({
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                // One process that never forks (a shell loop would fail to fork too once the limit is hit).
                {"name": "keeper", "command": ["sleep", "3600"]},
                {"name": "forker", "command": ["sh", "-c",
                    "i=0; while [ $i -lt 40 ]; do sleep 3600 & i=$((i+1)); done; echo all-forked"]},
            ],
        }),
    )
}

/// The `forker` container's log (CRI format) once it exited, with its exit code.
async fn forker_result(n: &Nodelet) -> (i32, String, String) {
    let pod = n
        .wait_for_pod("forker", "forker exited", Duration::from_secs(60), |p| {
            container(p, "forker").and_then(terminated).is_some()
        })
        .await;
    let uid = uid(&pod);
    let code = container(&pod, "forker").and_then(terminated).map_or(-1, |t| t.0);
    let log_path =
        n.logs_dir().join(format!("default_{}_{uid}", n.pod_name("forker"))).join("forker").join("0.log");
    let log = std::fs::read_to_string(&log_path).unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
    (code, log, uid)
}

fn pod_cgroup(env_parent: &str, uid: &str) -> String {
    format!("{}/pod{uid}", env_parent.trim_end_matches('/'))
}

#[tokio::test]
async fn a_pod_cannot_fork_beyond_the_pod_pids_limit_set_on_its_pod_cgroup() {
    let env = env_or_skip!("a_pod_cannot_fork_beyond_the_pod_pids_limit_set_on_its_pod_cgroup");
    let options = StartOptions { config_extra: "podPidsLimit: 16".into(), ..StartOptions::default() };
    let mut n = Nodelet::start_with(&env, "pids", options).await;
    n.write_manifest("steady.yaml", &steady(&n));
    let steady_before = n.wait_running("steady").await;
    n.write_manifest("forker.yaml", &forker_pod(&n));
    let (code, log, uid) = forker_result(&n).await;
    assert_ne!(code, 0, "the fork loop failed: {log}");
    assert!(log.contains("can't fork"), "the shell could not fork: {log}");
    assert!(!log.contains("all-forked"), "{log}");
    let limit =
        nodelet_cri::pod_cgroup::pids_limit(Path::new(CGROUP_FS), &pod_cgroup(&env.cgroup_parent, &uid));
    assert_eq!(limit, Some(Some(16)), "pids.max of the pod cgroup");
    // The keeper is unaffected: the pod runs on.
    let pod = n.pod("forker").await.unwrap_or_else(|| panic!("pod gone"));
    assert_eq!(phase(&pod), "Running");
    n.assert_untouched("steady", &steady_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "podPidsLimit");
    n.shutdown().await;
}

#[tokio::test]
async fn without_a_pod_pids_limit_a_pod_forks_freely() {
    let env = env_or_skip!("without_a_pod_pids_limit_a_pod_forks_freely");
    let mut n = Nodelet::start(&env, "nopids").await;
    n.write_manifest("forker.yaml", &forker_pod(&n));
    let (code, log, uid) = forker_result(&n).await;
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("all-forked"), "{log}");
    let limit =
        nodelet_cri::pod_cgroup::pids_limit(Path::new(CGROUP_FS), &pod_cgroup(&env.cgroup_parent, &uid));
    assert_eq!(limit, Some(None), "pids.max of the pod cgroup is max");
    n.assert_alive_within(PEAK_RSS_MIB, "no podPidsLimit");
    n.shutdown().await;
}

#[tokio::test]
async fn a_running_pod_gets_the_new_pod_pids_limit_when_nodelet_restarts_with_another() {
    let env = env_or_skip!("a_running_pod_gets_the_new_pod_pids_limit_when_nodelet_restarts_with_another");
    let options = StartOptions { config_extra: "podPidsLimit: 16".into(), ..StartOptions::default() };
    let mut n = Nodelet::start_with(&env, "pids-again", options).await;
    n.write_manifest("steady.yaml", &steady(&n));
    let before = n.wait_running("steady").await;
    let cgroup = pod_cgroup(&env.cgroup_parent, &uid(&before));
    let limit = || nodelet_cri::pod_cgroup::pids_limit(Path::new(CGROUP_FS), &cgroup);
    assert_eq!(limit(), Some(Some(16)), "pids.max of the pod cgroup");
    let sandboxes: Vec<String> = n.sandboxes_of(&uid(&before)).await.into_iter().map(|s| s.id).collect();

    let config = std::fs::read_to_string(n.config_path()).unwrap_or_default();
    assert!(config.contains("podPidsLimit: 16"), "{config}");
    if let Err(e) = std::fs::write(n.config_path(), config.replace("podPidsLimit: 16", "podPidsLimit: 32")) {
        panic!("cannot rewrite the config: {e}");
    }
    n.stop().await;
    n.start_again().await;
    n.wait_for("pids.max 32 on the running pod's cgroup", Duration::from_secs(30), async || {
        (limit() == Some(Some(32))).then_some(())
    })
    .await;
    // The same pod, sandbox and container: adopted, not restarted.
    n.wait_running("steady").await;
    n.assert_untouched("steady", &before).await;
    let after: Vec<String> = n.sandboxes_of(&uid(&before)).await.into_iter().map(|s| s.id).collect();
    assert_eq!(after, sandboxes, "the same sandbox");
    let app = container(&before, "app").map(runtime_id).unwrap_or_default();
    assert_eq!(
        cri_state(
            n.containers_of(&uid(&before))
                .await
                .iter()
                .find(|c| c.id == app)
                .unwrap_or_else(|| { panic!("container {app} is gone") })
        ),
        proto::ContainerState::ContainerRunning
    );
    n.assert_alive_within(PEAK_RSS_MIB, "podPidsLimit changed by a restart");
    n.shutdown().await;
}

#[tokio::test]
async fn the_pod_beyond_max_pods_is_rejected_out_of_pods() {
    let env = env_or_skip!("the_pod_beyond_max_pods_is_rejected_out_of_pods");
    let options = StartOptions { config_extra: "maxPods: 2".into(), ..StartOptions::default() };
    let mut n = Nodelet::start_with(&env, "maxpods", options).await;
    let spec = || json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]});
    let mut admitted = Vec::new();
    for name in ["first", "second"] {
        n.write_manifest(&format!("{name}.yaml"), &n.pod_manifest(name, spec()));
        admitted.push((name, n.wait_running(name).await));
    }
    n.write_manifest("third.yaml", &n.pod_manifest("third", spec()));
    let pod = n.wait_for_pod("third", "rejected", Duration::from_secs(30), |p| phase(p) == "Failed").await;
    let status = pod.status.unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("OutOfpods"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2")
    );
    let uid = n.pod("third").await.map(|p| uid(&p)).unwrap_or_default();
    assert!(n.sandboxes_of(&uid).await.is_empty(), "a rejected pod gets no sandbox");
    for (name, before) in &admitted {
        n.assert_untouched(name, before).await;
    }
    n.assert_alive_within(PEAK_RSS_MIB, "maxPods");
    n.shutdown().await;
}

/// A pod whose container ignores SIGTERM and whose postStart hook never returns.
fn hooked_pod(n: &Nodelet, name: &str, grace: u32) -> serde_json::Value {
    n.pod_manifest(
        name,
        json!({
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "app",
                "command": ["sleep", "3600"],
                "lifecycle": {"postStart": {"exec": {"command": ["sleep", "3600"]}}},
            }],
        }),
    )
}

/// Waits until the static pod `name` has a running container in the runtime (its hook then runs).
async fn wait_container_running(n: &Nodelet, name: &str) -> String {
    n.wait_for(&format!("a running container of {name}"), Duration::from_secs(60), async || {
        let pod = n.pod(name).await?;
        let uid = uid(&pod);
        let containers = n.containers_of(&uid).await;
        containers.iter().any(|c| cri_state(c) == proto::ContainerState::ContainerRunning).then_some(uid)
    })
    .await
}

#[tokio::test]
async fn post_start_hooks_that_never_return_hold_neither_other_pods_nor_their_deletion() {
    let env = env_or_skip!("post_start_hooks_that_never_return_hold_neither_other_pods_nor_their_deletion");
    let mut n = Nodelet::start(&env, "hooks").await;
    const HOOKED: usize = 4;
    const GRACE: u32 = 3;
    for i in 0..HOOKED {
        let name = format!("hooked-{i}");
        n.write_manifest(&format!("{name}.yaml"), &hooked_pod(&n, &name, GRACE));
    }
    let mut uids = Vec::new();
    for i in 0..HOOKED {
        uids.push(wait_container_running(&n, &format!("hooked-{i}")).await);
    }
    // The hooks hang; a plain pod still starts at once.
    let added = Instant::now();
    let spec = json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]});
    n.write_manifest("plain.yaml", &n.pod_manifest("plain", spec));
    let plain_before = n.wait_running("plain").await;
    assert!(added.elapsed() < Duration::from_secs(20), "the plain pod took {:?}", added.elapsed());
    let hooked = n.pod("hooked-0").await.unwrap_or_else(|| panic!("hooked-0 gone"));
    assert_ne!(phase(&hooked), "Running", "a container whose postStart has not returned is not started");

    // Deleting a hooked pod ends its hook: it is gone within its grace period (plus the time to notice).
    let deleted = Instant::now();
    n.remove_manifest("hooked-0.yaml");
    n.wait_for("hooked-0 gone from /pods and the runtime", Duration::from_secs(60), async || {
        let listed = n.pod("hooked-0").await.is_some();
        let containers = n.containers_of(&uids[0]).await;
        (!listed && containers.is_empty()).then_some(())
    })
    .await;
    let took = deleted.elapsed();
    assert!(
        took < Duration::from_secs(u64::from(GRACE) + 10),
        "deleting a pod whose postStart hangs took {took:?} (its grace period is {GRACE}s)"
    );
    n.assert_untouched("plain", &plain_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "postStart hooks that never return");
    n.shutdown().await;
}

#[tokio::test]
async fn the_node_bound_on_grace_periods_shortens_a_long_termination_grace_period() {
    let env = env_or_skip!("the_node_bound_on_grace_periods_shortens_a_long_termination_grace_period");
    let options = StartOptions {
        nodelet_extra: "maxTerminationGracePeriodSeconds: 3".into(),
        ..StartOptions::default()
    };
    let mut n = Nodelet::start_with(&env, "gracecap", options).await;
    n.write_manifest("steady.yaml", &steady(&n));
    let steady_before = n.wait_running("steady").await;
    // Ignores SIGTERM: only the SIGKILL at the end of the grace period stops it.
    let spec = json!({"terminationGracePeriodSeconds": 600, "containers": [{"name": "app", "command": ["sleep", "3600"]}]});
    n.write_manifest("long.yaml", &n.pod_manifest("long", spec));
    let pod = n.wait_running("long").await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds),
        Some(3),
        "the spec shows the grace period the node gives"
    );
    let uid = uid(&pod);
    let deleted = Instant::now();
    n.remove_manifest("long.yaml");
    n.wait_for("the pod gone from the runtime", Duration::from_secs(60), async || {
        n.containers_of(&uid).await.is_empty().then_some(())
    })
    .await;
    let took = deleted.elapsed();
    assert!(took >= Duration::from_secs(3), "the container got the bounded grace period: {took:?}");
    assert!(took < Duration::from_secs(15), "not the pod's 600 s: {took:?}");
    n.assert_untouched("steady", &steady_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "maxTerminationGracePeriodSeconds");
    n.shutdown().await;
}
