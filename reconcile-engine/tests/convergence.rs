//! Property tests: random desired-state changes with random driver faults always converge once
//! the faults stop, and never overlap two operations on conflicting keys.

mod common;

use std::time::Duration;

use common::*;
use proptest::prelude::*;
use reconcile_engine::testing::{Step, wait_converged};

#[derive(Debug, Clone)]
enum Action {
    SetDev(u8, u32),
    RemoveDev(u8),
    SetPod(u8, u8, u32),
    RemovePod(u8, u8),
    Wait(u64),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (0..3u8, 0..4u32).prop_map(|(d, v)| Action::SetDev(d, v)),
        (0..3u8).prop_map(Action::RemoveDev),
        (0..3u8, 0..PODS_PER_DEV, 0..4u32).prop_map(|(d, p, v)| Action::SetPod(d, p, v)),
        (0..3u8, 0..PODS_PER_DEV).prop_map(|(d, p)| Action::RemovePod(d, p)),
        (0..3000u64).prop_map(Action::Wait),
    ]
}

/// Fault mix in per mille: fail, uncertain, hang (until timeout or cancel), slow.
fn faults() -> impl Strategy<Value = (u32, u32, u32, u32, u64)> {
    (0..300u32, 0..200u32, 0..100u32, 0..300u32, any::<u64>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_changes_with_random_faults_should_converge_without_overlap(
        actions in proptest::collection::vec(action(), 1..60),
        (fail, uncertain, hang, slow, seed) in faults(),
        max_concurrent in 0..4usize,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("runtime");
        rt.block_on(async move {
            let mut h = harness();
            let mut rng = fastrand::Rng::with_seed(seed);
            h.driver.inject(move |_k, _op| {
                let r = rng.u32(0..1000);
                if r < fail { Step::Fail }
                else if r < fail + uncertain { Step::Uncertain }
                else if r < fail + uncertain + hang { Step::Hang }
                else if r < fail + uncertain + hang + slow { Step::Delay(Duration::from_millis(u64::from(r))) }
                else { Step::Succeed }
            });
            let engine = engine(&h).max_concurrent(max_concurrent).default_timeout(Duration::from_secs(2)).build();
            let (actual, _stop, _join) = spawn(engine);
            h.writer.mark_synced();
            for a in actions {
                match a {
                    // A pod's device is desired whenever the pod is (as a real populator does).
                    Action::SetDev(d, v) => h.writer.insert(K::Dev(d), v),
                    Action::RemoveDev(d) => {
                        for p in 0..PODS_PER_DEV { h.writer.remove(&K::Pod(d, p)); }
                        h.writer.remove(&K::Dev(d));
                    }
                    Action::SetPod(d, p, v) => {
                        if !h.desired.contains_key(&K::Dev(d)) { h.writer.insert(K::Dev(d), 0); }
                        h.writer.insert(K::Pod(d, p), v);
                    }
                    Action::RemovePod(d, p) => { h.writer.remove(&K::Pod(d, p)); }
                    Action::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                }
            }
            h.driver.stop_injecting();
            // Backoff is capped near 2 min; a few rounds of it are always enough.
            wait_converged(&h.desired, &actual, Duration::from_secs(900), matches).await;
            h.driver.assert_no_overlap();
        });
    }
}
