//! Per-key exponential backoff with jitter.

use std::time::Duration;

/// Backoff policy: the delay after the `n`-th consecutive failure of the same kind of operation on
/// one key is `initial * factor^(n-1)`, capped at `max`, then stretched by a random jitter.
///
/// The defaults follow the kubelet's volume operations (500 ms, doubling, capped at 2 min 2 s;
/// the odd cap makes retries recognizable in logs), plus 10 % jitter so that many keys failing
/// together do not retry in lockstep.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffConfig {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Growth per further failure.
    pub factor: f64,
    /// Upper bound of the delay before jitter.
    pub max: Duration,
    /// Relative jitter: the delay is multiplied by a random factor in `[1, 1 + jitter]`, and still
    /// capped at `max * (1 + jitter)`. Zero disables jitter.
    pub jitter: f64,
}

impl BackoffConfig {
    /// Delay after the first failure: 500 ms, as the kubelet's `initialDurationBeforeRetry`.
    pub const DEFAULT_INITIAL: Duration = Duration::from_millis(500);
    /// Cap: 2 min 2 s, as the kubelet's `maxDurationBeforeRetry`.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(122);
    /// Doubling, as the kubelet.
    pub const DEFAULT_FACTOR: f64 = 2.0;
    /// 10 % jitter (the kubelet has none; without it, keys that failed together retry together).
    pub const DEFAULT_JITTER: f64 = 0.1;

    /// A policy with no jitter, for tests that assert exact delays.
    #[must_use]
    pub fn without_jitter(mut self) -> Self {
        self.jitter = 0.0;
        self
    }

    /// Sets the first delay.
    #[must_use]
    pub fn with_initial(mut self, initial: Duration) -> Self {
        self.initial = initial;
        self
    }

    /// Sets the cap.
    #[must_use]
    pub fn with_max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// The delay after `failures` consecutive failures (`failures >= 1`), before jitter.
    pub fn base_delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(64);
        let secs = self.initial.as_secs_f64() * self.factor.max(1.0).powi(exp as i32);
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The delay after `failures` consecutive failures, with jitter drawn from `rng` (a
    /// [`fastrand::Rng`](https://docs.rs/fastrand/2/fastrand/struct.Rng.html)).
    pub fn delay(&self, failures: u32, rng: &mut fastrand::Rng) -> Duration {
        let base = self.base_delay(failures);
        if self.jitter <= 0.0 {
            return base;
        }
        base.mul_f64(1.0 + rng.f64() * self.jitter)
    }
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Self::DEFAULT_INITIAL,
            factor: Self::DEFAULT_FACTOR,
            max: Self::DEFAULT_MAX,
            jitter: Self::DEFAULT_JITTER,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_backoff_should_double_from_500ms_and_cap_near_two_minutes() {
        let cfg = BackoffConfig::default().without_jitter();
        let delays: Vec<_> = (1..=10).map(|n| cfg.base_delay(n)).collect();
        assert_eq!(delays[0], Duration::from_millis(500));
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[2], Duration::from_secs(2));
        assert_eq!(delays[7], Duration::from_secs(64));
        assert_eq!(delays[8], Duration::from_secs(122));
        assert_eq!(cfg.base_delay(1000), Duration::from_secs(122));
    }

    #[test]
    fn jitter_should_stay_within_its_band() {
        let cfg = BackoffConfig::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut seen_different = false;
        for _ in 0..200 {
            let d = cfg.delay(3, &mut rng);
            assert!(d >= Duration::from_secs(2) && d <= Duration::from_millis(2200), "{d:?}");
            seen_different |= d != Duration::from_secs(2);
        }
        assert!(seen_different);
    }
}
