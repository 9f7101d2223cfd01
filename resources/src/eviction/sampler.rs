//! The eviction pair's populator: samples the node's signals every monitoring period (and, with
//! `localStorageCapacityIsolation`, the pods' local storage usage its [`SignalSource`] measures in
//! the background) and writes each [`Sample`] to the pair's actual store at
//! [`EvictionKey::Signals`] through the engine's [`Observer`]; the engine then plans the node again.
//! A sample that cannot be read is skipped (logged), as the kubelet skips a pass.

use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{Observer, Update};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::warn;

use super::reconciler::{EvictionActual, EvictionKey, Sample};
use super::signal::SignalSource;

/// Samples the signals into the eviction pair's actual store.
pub struct SignalSampler {
    source: Arc<dyn SignalSource>,
    observer: Observer<EvictionKey, EvictionActual>,
    local_storage: bool,
    seq: u64,
}

impl std::fmt::Debug for SignalSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalSampler").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl SignalSampler {
    /// A sampler of `source` reporting through `observer`; with `local_storage`, each sample
    /// also carries the pods' local storage usage.
    pub fn new(
        source: Arc<dyn SignalSource>,
        observer: Observer<EvictionKey, EvictionActual>,
        local_storage: bool,
    ) -> Self {
        Self { source, observer, local_storage, seq: 0 }
    }

    /// Takes one sample and reports it; returns whether it did (`false` when the signals could
    /// not be read or the engine has stopped).
    pub async fn sample(&mut self) -> bool {
        let at = Instant::now();
        let observations = match self.source.observe().await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "eviction: cannot read the node's signals");
                return false;
            }
        };
        let local_storage = if self.local_storage {
            match self.source.local_storage().await {
                Ok(m) => Some(m),
                Err(e) => {
                    warn!(error = %e, "eviction: cannot read the pods' local storage usage");
                    None
                }
            }
        } else {
            None
        };
        self.seq += 1;
        let sample = Sample { seq: self.seq, at, observations, local_storage };
        self.observer.observe(EvictionKey::Signals, Update::Set(EvictionActual::Signals(sample)), at)
    }

    /// Samples at once, then every `period`, until `shutdown` completes.
    pub async fn run(mut self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticks.tick() => {}
            }
            tokio::select! {
                () = &mut shutdown => return,
                _ = self.sample() => {}
            }
        }
    }
}
