//! Numbers from the runtime are outside nodelet's control (a corrupt annotation, a clock far off, a
//! container that claims to have restarted `u32::MAX` times): the pod logic saturates on them instead of
//! overflowing (a panic in debug builds, a wrapped nonsense value in release builds).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodelet_resources::model::actual::{
    ContainerRecord, ContainerState, PodActual, PodSandboxes, SandboxRecord,
};
use nodelet_resources::model::cgroup::CgroupResources;
use nodelet_resources::model::pod::{DesiredPod, PodSource};
use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodInputs, PodReconciler};
use nodelet_resources::pod::status::{pod_status, time};
use nodelet_resources::sandbox::status::SandboxView;
use reconcile_engine::{Reconciler, Store, View};

const EXTREMES: [i64; 6] = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX];

fn pod() -> DesiredPod {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    }))
    .expect("pod");
    DesiredPod { pod, source: PodSource::Http }
}

/// Inputs whose sandbox pair has the pod in a ready sandbox created at `created_at`.
fn in_sandbox(created_at: i64) -> PodInputs {
    let (sandboxes, mut writer) = reconcile_engine::store();
    let sandbox = SandboxRecord {
        id: "s1".into(),
        ready: true,
        ip: Some("198.18.0.2".into()),
        created_at,
        ..SandboxRecord::default()
    };
    let pod = PodSandboxes {
        uid: "u1".into(),
        namespace: "default".into(),
        name: "p".into(),
        sandboxes: vec![sandbox],
        needs_refresh: false,
    };
    writer.insert("u1".to_owned(), pod);
    writer.mark_synced();
    PodInputs { sandboxes: Some(SandboxView::new(sandboxes, None)), ..PodInputs::default() }
}

fn actual(state: ContainerState, restart_count: u32, started_at: i64, finished_at: i64) -> PodActual {
    PodActual {
        uid: "u1".into(),
        namespace: "default".into(),
        name: "p".into(),
        containers: vec![ContainerRecord {
            id: "c1".into(),
            name: "app".into(),
            sandbox_id: "s1".into(),
            restart_count,
            state,
            created_at: started_at,
            started_at,
            finished_at,
            exit_code: 1,
            applied: Some(CgroupResources {
                cpu_shares: i64::MAX,
                cpu_quota: i64::MAX,
                cpu_period: 1,
                memory_limit: i64::MAX,
            }),
            ..ContainerRecord::default()
        }],
        ..PodActual::default()
    }
}

#[test]
fn the_crash_loop_delay_saturates_on_extreme_times_and_restart_counts() {
    let backoff = CrashLoopBackOff::default();
    for started_at in EXTREMES {
        for finished_at in EXTREMES {
            for restarts in [0, 1, 2, 63, 64, u32::MAX - 1, u32::MAX] {
                let record = ContainerRecord {
                    restart_count: restarts,
                    started_at,
                    finished_at,
                    ..ContainerRecord::default()
                };
                let delay = backoff.delay(&record);
                assert!(
                    delay <= Duration::from_secs(300),
                    "{started_at} {finished_at} {restarts}: {delay:?}"
                );
            }
        }
    }
}

#[test]
fn pod_status_and_plans_survive_extreme_runtime_values() {
    let desired = pod();
    let (desired_store, mut writer) = reconcile_engine::store();
    writer.insert("u1".to_owned(), desired.clone());
    writer.mark_synced();
    let actual_store: Store<String, PodActual> = reconcile_engine::store().0;
    for now in EXTREMES {
        let reconciler = PodReconciler::new(CrashLoopBackOff::default());
        for state in [ContainerState::Running, ContainerState::Exited] {
            for started_at in EXTREMES {
                let inputs = in_sandbox(started_at);
                for finished_at in EXTREMES {
                    for restarts in [0, u32::MAX] {
                        let a = actual(state, restarts, started_at, finished_at);
                        let status = pod_status(&reconciler, &inputs, &desired, Some(&a), None, now);
                        let app = status.container_statuses.as_ref().and_then(|c| c.first());
                        let count = app.map_or(-1, |c| c.restart_count);
                        assert!(count >= 0, "restartCount {count} of {restarts}");
                        // The plan, too (the next attempt's restart count saturates).
                        let key = "u1".to_owned();
                        let view = View::new(&key, Some(&desired), Some(&a), &desired_store, &actual_store)
                            .with_inputs(&inputs)
                            .with_wall(reconcile_engine::from_unix_nanos(now));
                        let _ = reconciler.reconcile(&view);
                    }
                }
            }
        }
    }
}

#[test]
fn timestamps_outside_the_representable_range_are_left_out() {
    assert_eq!(time(0), None);
    assert_eq!(time(-1), None);
    assert_eq!(time(i64::MIN), None);
    assert!(time(i64::MAX).is_some(), "i64::MAX nanoseconds is the year 2262");
}
