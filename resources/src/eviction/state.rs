//! The eviction pair's comparison: thresholds (desired) against observed signals (actual), with
//! the soft thresholds' grace periods, the minimum reclaim and the pressure transition period.
//! Pure and synchronous: the [`reconciler`](super::reconciler) feeds it each sample of the signals and
//! the sample's time, and keeps what it remembers in the pair's actual state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::signal::{Observation, Observations, Threshold};

use crate::model::pressure::Condition;

/// The thresholds and how long a pressure condition outlives its last met threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Hard and soft thresholds.
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`: a condition stays `True` this long after its
    /// thresholds were last met (5 minutes in the kubelet).
    pub pressure_transition_period: Duration,
}

/// A threshold that is met, with what was observed.
#[derive(Debug, Clone, PartialEq)]
pub struct Met {
    /// The threshold.
    pub threshold: Threshold,
    /// The observation that meets it.
    pub observed: Observation,
}

impl Met {
    /// The amount below which the threshold is met (without the minimum reclaim).
    pub fn limit(&self) -> u64 {
        self.threshold.limit(self.observed.capacity, false)
    }

    /// How much must be freed for the signal to reach the threshold plus the minimum reclaim.
    pub fn to_reclaim(&self) -> u64 {
        self.threshold.limit(self.observed.capacity, true).saturating_sub(self.observed.available)
    }
}

/// The outcome of one comparison.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Assessment {
    /// The node conditions that are `True` now (met thresholds, soft ones before their grace
    /// period included, and those met within the transition period).
    pub conditions: BTreeSet<Condition>,
    /// Thresholds that are met and past their grace period: pressure to act on, most urgent
    /// first (memory, then disk, then PIDs; hard before soft).
    pub act_on: Vec<Met>,
    /// Every threshold met now (grace periods not considered).
    pub met: Vec<Met>,
}

/// What the comparison remembers between passes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvictionState {
    /// When each met threshold was first seen met (index into the policy's thresholds).
    first_met: BTreeMap<usize, Instant>,
    /// When each condition was last seen.
    condition_last_seen: BTreeMap<Condition, Instant>,
    /// Thresholds acted on last time: they stay met until the minimum reclaim is reached.
    reclaiming: BTreeSet<usize>,
}

impl EvictionState {
    /// A fresh state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Compares `observations` made at `now` with `policy`.
    pub fn observe(&mut self, policy: &Policy, observations: &Observations, now: Instant) -> Assessment {
        let mut met = Vec::new();
        for (i, threshold) in policy.thresholds.iter().enumerate() {
            let Some(observed) = observations.get(&threshold.signal) else { continue };
            let reclaiming = self.reclaiming.contains(&i);
            if observed.capacity == 0 && matches!(threshold.value, super::signal::Amount::Percentage(_)) {
                continue;
            }
            if observed.available < threshold.limit(observed.capacity, reclaiming) {
                met.push((i, Met { threshold: threshold.clone(), observed: *observed }));
            }
        }
        // Thresholds no longer met forget when they were first met.
        self.first_met.retain(|i, _| met.iter().any(|(j, _)| j == i));
        for (i, _) in &met {
            self.first_met.entry(*i).or_insert(now);
        }
        for (_, m) in &met {
            self.condition_last_seen.insert(m.threshold.signal.condition(), now);
        }
        let conditions: BTreeSet<Condition> = self
            .condition_last_seen
            .iter()
            .filter(|(_, seen)| now.saturating_duration_since(**seen) < policy.pressure_transition_period)
            .map(|(c, _)| *c)
            .chain(met.iter().map(|(_, m)| m.threshold.signal.condition()))
            .collect();
        let mut act_on: Vec<(usize, Met)> = met
            .iter()
            .filter(|(i, m)| {
                let since =
                    self.first_met.get(i).map_or(Duration::ZERO, |t| now.saturating_duration_since(*t));
                m.threshold.grace_period.is_none_or(|g| since >= g)
            })
            .cloned()
            .collect();
        act_on.sort_by_key(|(i, m)| (m.threshold.signal.priority(), !m.threshold.is_hard(), *i));
        self.reclaiming = act_on.iter().map(|(i, _)| *i).collect();
        Assessment {
            conditions,
            act_on: act_on.into_iter().map(|(_, m)| m).collect(),
            met: met.into_iter().map(|(_, m)| m).collect(),
        }
    }
}

/// Whether a threshold for `signal` is still met in `observations` (with its minimum reclaim),
/// for checking again after node-level reclaim.
pub fn still_met(threshold: &Threshold, observations: &Observations) -> bool {
    observations.get(&threshold.signal).is_some_and(|o| o.available < threshold.limit(o.capacity, true))
}

#[cfg(test)]
mod tests {
    use super::super::signal::Amount;
    use super::*;
    use crate::model::pressure::Signal;

    const MI: u64 = 1 << 20;

    fn obs(signal: Signal, available: u64, capacity: u64) -> Observations {
        [(signal, Observation { available, capacity })].into_iter().collect()
    }

    fn policy(thresholds: Vec<Threshold>) -> Policy {
        Policy { thresholds, pressure_transition_period: Duration::from_secs(300) }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hard_threshold_acts_at_once_and_percentages_use_the_capacity() {
        let p = policy(vec![Threshold::hard(Signal::NodeFsAvailable, Amount::Percentage(10.0))]);
        let mut s = EvictionState::new();
        let a = s.observe(&p, &obs(Signal::NodeFsAvailable, 11 * MI, 100 * MI), Instant::now());
        assert!(a.conditions.is_empty() && a.act_on.is_empty(), "11% free is above 10%");
        let a = s.observe(&p, &obs(Signal::NodeFsAvailable, 9 * MI, 100 * MI), Instant::now());
        assert_eq!(a.conditions, [Condition::DiskPressure].into());
        assert_eq!(a.act_on.len(), 1);
        assert_eq!(a.act_on[0].limit(), 10 * MI);
        assert_eq!(a.act_on[0].to_reclaim(), MI);
    }

    #[tokio::test(start_paused = true)]
    async fn a_soft_threshold_waits_for_its_grace_period_but_reports_pressure_at_once() {
        let p = policy(vec![Threshold::soft(
            Signal::MemoryAvailable,
            Amount::Quantity(500 * MI),
            Duration::from_secs(90),
        )]);
        let mut s = EvictionState::new();
        let low = obs(Signal::MemoryAvailable, 400 * MI, 1000 * MI);
        let a = s.observe(&p, &low, Instant::now());
        assert_eq!(
            a.conditions,
            [Condition::MemoryPressure].into(),
            "pressure is reported before the grace period"
        );
        assert!(a.act_on.is_empty());
        tokio::time::advance(Duration::from_secs(89)).await;
        assert!(s.observe(&p, &low, Instant::now()).act_on.is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(s.observe(&p, &low, Instant::now()).act_on.len(), 1, "acted on after 90 s");
        // Recovering resets the grace period.
        s.observe(&p, &obs(Signal::MemoryAvailable, 600 * MI, 1000 * MI), Instant::now());
        assert!(s.observe(&p, &low, Instant::now()).act_on.is_empty(), "the grace period starts again");
    }

    #[tokio::test(start_paused = true)]
    async fn the_condition_outlives_the_pressure_by_the_transition_period() {
        let mut p = policy(vec![Threshold::hard(Signal::PidAvailable, Amount::Quantity(100))]);
        p.pressure_transition_period = Duration::from_secs(30);
        let mut s = EvictionState::new();
        s.observe(&p, &obs(Signal::PidAvailable, 50, 1000), Instant::now());
        let fine = obs(Signal::PidAvailable, 900, 1000);
        tokio::time::advance(Duration::from_secs(29)).await;
        let a = s.observe(&p, &fine, Instant::now());
        assert_eq!(a.conditions, [Condition::PidPressure].into(), "still within the transition period");
        assert!(a.act_on.is_empty(), "nothing to act on once the threshold is no longer met");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(s.observe(&p, &fine, Instant::now()).conditions.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn minimum_reclaim_keeps_a_threshold_met_until_the_signal_is_above_it() {
        let p = policy(vec![
            Threshold::hard(Signal::ImageFsAvailable, Amount::Quantity(100 * MI))
                .with_min_reclaim(Amount::Quantity(50 * MI)),
        ]);
        let mut s = EvictionState::new();
        assert_eq!(
            s.observe(&p, &obs(Signal::ImageFsAvailable, 120 * MI, 1000 * MI), Instant::now()).met.len(),
            0
        );
        let a = s.observe(&p, &obs(Signal::ImageFsAvailable, 90 * MI, 1000 * MI), Instant::now());
        assert_eq!(a.act_on[0].to_reclaim(), 60 * MI, "down to 150Mi: threshold plus minimum reclaim");
        let a = s.observe(&p, &obs(Signal::ImageFsAvailable, 120 * MI, 1000 * MI), Instant::now());
        assert_eq!(a.act_on.len(), 1, "120Mi is above the threshold but below threshold + minimum reclaim");
        assert!(still_met(&p.thresholds[0], &obs(Signal::ImageFsAvailable, 149 * MI, 1000 * MI)));
        let a = s.observe(&p, &obs(Signal::ImageFsAvailable, 151 * MI, 1000 * MI), Instant::now());
        assert!(a.act_on.is_empty());
        let a = s.observe(&p, &obs(Signal::ImageFsAvailable, 120 * MI, 1000 * MI), Instant::now());
        assert!(a.act_on.is_empty(), "once resolved, the plain threshold applies again");
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_handled_before_disk_and_missing_signals_are_ignored() {
        let p = policy(vec![
            Threshold::hard(Signal::NodeFsAvailable, Amount::Quantity(10)),
            Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(10)),
            Threshold::hard(Signal::PidAvailable, Amount::Quantity(10)),
        ]);
        let mut o = obs(Signal::NodeFsAvailable, 1, 100);
        o.insert(Signal::MemoryAvailable, Observation { available: 1, capacity: 100 });
        let a = EvictionState::new().observe(&p, &o, Instant::now());
        let order: Vec<Signal> = a.act_on.iter().map(|m| m.threshold.signal).collect();
        assert_eq!(
            order,
            [Signal::MemoryAvailable, Signal::NodeFsAvailable],
            "pid.available was not observed"
        );
        assert_eq!(a.conditions, [Condition::MemoryPressure, Condition::DiskPressure].into());
    }
}
