//! The pod lifecycle event generator: relists the runtime periodically (and at once when the
//! runtime reports an event) and reports every pod whose state differs from the actual store. The
//! same listing feeds the sandbox pair's actual store ([`Pleg::with_sandboxes`]): one relist, two
//! stores.

use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{Observer, Store, Update};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::actual::PodActual;
use super::desired::PodUid;
use super::driver::PodRuntime;
use super::metrics::PodMetrics;
use crate::sandbox::actual::PodSandboxes;

/// The kubelet's relist period.
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// How soon the PLEG relists again after a runtime event or after a relist that reported changes;
/// the follow-ups double up to the period. Two races make one relist not enough:
/// - containerd's CRI view lags its native events by tens of milliseconds, so the relist an exit event
///   triggers can still see the container running, and no further event comes;
/// - the engine drops an observation that races an operation on the same pod (a container that exits
///   while the operation that started it completes), and the PLEG must report it again.
pub const FOLLOW_UP_RELIST: Duration = Duration::from_millis(100);

/// A relist woken by a runtime event waits until at least this many times the previous relist's
/// duration has passed since that relist ended (and never longer than [`FOLLOW_UP_RELIST`]), so
/// that a storm of events (a hundred pods starting or stopping at once) costs at most a third of
/// the time in relists instead of relisting back to back, while a lone event on a quiet node is
/// still seen at once.
pub const COALESCE_FACTOR: u32 = 2;

/// How long a relist woken at `since_last` after the previous relist ended, which took `last_cost`,
/// waits first (see [`COALESCE_FACTOR`]).
fn coalesce_delay(last_cost: Duration, since_last: Duration) -> Duration {
    last_cost.saturating_mul(COALESCE_FACTOR).min(FOLLOW_UP_RELIST).saturating_sub(since_last)
}

/// The keys of `store` that `listed` lacks (without copying the keys that it has).
fn gone<V: Send + Sync + 'static>(
    store: &Store<PodUid, V>,
    listed: &std::collections::HashMap<PodUid, Arc<PodActual>>,
) -> Vec<PodUid> {
    let mut gone = Vec::new();
    store.for_each(|uid, _| {
        if !listed.contains_key(uid) {
            gone.push(uid.clone());
        }
    });
    gone
}

/// The relist loop.
#[derive(Debug)]
pub struct Pleg<R> {
    runtime: Arc<R>,
    actual: Store<PodUid, PodActual>,
    observer: Observer<PodUid, PodActual>,
    period: Duration,
    wake: Arc<Notify>,
    metrics: PodMetrics,
    sandboxes: Option<(Store<PodUid, PodSandboxes>, Observer<PodUid, PodSandboxes>)>,
}

impl<R: PodRuntime> Pleg<R> {
    /// A PLEG that compares `runtime`'s listing with `actual` and reports through `observer`.
    pub fn new(
        runtime: Arc<R>,
        actual: Store<PodUid, PodActual>,
        observer: Observer<PodUid, PodActual>,
        period: Duration,
        metrics: PodMetrics,
    ) -> Self {
        Self { runtime, actual, observer, period, wake: Arc::new(Notify::new()), metrics, sandboxes: None }
    }

    /// Also reports the pods' sandboxes that differ from the sandbox pair's actual store `actual`,
    /// through its `observer`.
    pub fn with_sandboxes(
        mut self,
        actual: Store<PodUid, PodSandboxes>,
        observer: Observer<PodUid, PodSandboxes>,
    ) -> Self {
        self.sandboxes = Some((actual, observer));
        self
    }

    /// A handle that makes the PLEG relist at once (for the runtime's event stream).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// One relist: returns how many pods were reported. `kubelet_pleg_relist_duration_seconds`
    /// observes the whole of it, as the kubelet's does: the listing and the comparison with the
    /// stores.
    pub async fn relist(&self) -> Result<usize, super::driver::RuntimeError> {
        let started = Instant::now();
        let listed = self.runtime.list_pods().await?;
        let reported = self.report(&listed, started);
        self.metrics.pleg_relist_duration.observe(started.elapsed().as_secs_f64());
        Ok(reported)
    }

    /// Reports every pod of `listed` (a relist started at `started`) that differs from the stores,
    /// and every pod of the stores that `listed` lacks; returns how many reports it made.
    fn report(&self, listed: &std::collections::HashMap<PodUid, Arc<PodActual>>, started: Instant) -> usize {
        let mut reported = 0;
        for (uid, state) in listed {
            if self.actual.get(uid).is_none_or(|a| *a != **state) {
                self.observer.observe(uid.clone(), Update::Set(PodActual::clone(state)), started);
                reported += 1;
            }
        }
        for uid in gone(&self.actual, listed) {
            self.observer.observe(uid, Update::Remove, started);
            reported += 1;
        }
        if let Some((actual, observer)) = &self.sandboxes {
            for (uid, state) in listed {
                let same = actual.get(uid).is_some_and(|a| {
                    !a.needs_refresh
                        && a.sandboxes == state.sandboxes
                        && a.namespace == state.namespace
                        && a.name == state.name
                });
                if same {
                    continue;
                }
                let update = PodSandboxes::of(state).map_or(Update::Remove, Update::Set);
                if matches!(update, Update::Remove) && !actual.contains_key(uid) {
                    continue;
                }
                observer.observe(uid.clone(), update, started);
                reported += 1;
            }
            for uid in gone(actual, listed) {
                observer.observe(uid, Update::Remove, started);
                reported += 1;
            }
        }
        reported
    }

    /// Relists every period, or sooner when woken, with follow-ups (see [`FOLLOW_UP_RELIST`]), until
    /// `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut last = Instant::now();
        let mut woken = false;
        let mut follow_up: Option<Duration> = None;
        loop {
            let now = Instant::now();
            self.metrics.pleg_relist_interval.observe((now - last).as_secs_f64());
            last = now;
            let reported = match self.relist().await {
                Ok(reported) => reported,
                Err(e) => {
                    tracing::warn!(error = %e, "relist failed");
                    0
                }
            };
            let ended = Instant::now();
            let cost = ended - now;
            follow_up = match follow_up {
                _ if woken => Some(FOLLOW_UP_RELIST),
                // a chain of follow-ups ends at the period
                Some(d) => Some(d.saturating_mul(2)).filter(|d| *d < self.period),
                None if reported > 0 => Some(FOLLOW_UP_RELIST),
                None => None,
            };
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(follow_up.unwrap_or(self.period)) => woken = false,
                () = self.wake.notified() => woken = true,
            }
            if woken {
                let delay = coalesce_delay(cost, ended.elapsed());
                if !delay.is_zero() {
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_gone_are_those_of_the_store_the_listing_lacks() {
        let (store, mut writer) = reconcile_engine::store::<PodUid, u8>();
        let listed = |uids: &[&str]| -> std::collections::HashMap<PodUid, Arc<PodActual>> {
            uids.iter().map(|u| ((*u).to_owned(), Arc::default())).collect()
        };
        assert!(gone(&store, &listed(&["a"])).is_empty(), "an empty store lacks nothing");
        for uid in ["a", "b", "c"] {
            writer.insert(uid.to_owned(), 0);
        }
        let mut left = gone(&store, &listed(&["b", "d"]));
        left.sort();
        assert_eq!(left, ["a", "c"]);
        assert!(gone(&store, &listed(&["a", "b", "c"])).is_empty());
        writer.remove(&"a".to_owned());
        assert_eq!(gone(&store, &listed(&["b", "c"])), Vec::<PodUid>::new(), "a removed key is not reported");
        assert_eq!(gone(&store, &listed(&[])).len(), 2);
    }

    #[test]
    fn a_woken_relist_waits_twice_the_last_cost_at_most_the_follow_up() {
        let ms = Duration::from_millis;
        assert_eq!(coalesce_delay(ms(0), ms(0)), ms(0), "a cheap relist is not delayed");
        assert_eq!(coalesce_delay(ms(20), ms(0)), ms(40));
        assert_eq!(coalesce_delay(ms(20), ms(15)), ms(25), "time already passed counts");
        assert_eq!(coalesce_delay(ms(20), ms(500)), ms(0), "a lone event on a quiet node is seen at once");
        assert_eq!(coalesce_delay(ms(300), ms(0)), FOLLOW_UP_RELIST, "never longer than a follow-up");
        assert_eq!(coalesce_delay(Duration::MAX, ms(0)), FOLLOW_UP_RELIST, "no overflow");
    }
}
