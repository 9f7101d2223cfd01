//! When to ask the runtime for sandbox stats again after `ListPodSandboxStats` failed.
//!
//! A runtime whose sandbox stats call fails is not asked again at every housekeeping round (every 10 s):
//! containerd logs every failed call at error level, and its answer will not change soon. containerd 2.x
//! fails the whole call when one ready sandbox has no readable cgroup, e.g. `failed to decode sandbox
//! container metrics … cgroupPath is empty` for every pod of a nodelet without `--cgroup-root` (its
//! sandboxes have no cgroup parent). After a failure the call waits [`INITIAL_BACKOFF`], doubling after
//! each further failure up to [`MAX_BACKOFF`]; a success starts over. A runtime that does not implement
//! the call (gRPC `UNIMPLEMENTED`) is not asked again at all. Meanwhile the pod stats come from the pod
//! cgroups and the sandboxes' network namespaces, as when the runtime gives nothing. The first failure is
//! logged once (warning), later ones at debug level, a recovery once (info).

use std::time::Duration;

use nodelet_cri::CriError;
use tokio::time::Instant;

/// The wait after the first failure.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_secs(60);
/// The longest wait between two calls while they fail.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Whether to ask for sandbox stats now; fed with the outcome of every call.
#[derive(Debug, Default)]
pub(crate) struct SandboxStatsBackoff {
    /// Failures in a row.
    failures: u32,
    /// No call before this instant.
    next_call: Option<Instant>,
    /// The runtime does not implement the call: never ask again.
    unimplemented: bool,
}

impl SandboxStatsBackoff {
    /// Whether a call may be made at `now`.
    pub(crate) fn may_ask(&self, now: Instant) -> bool {
        !self.unimplemented && self.next_call.is_none_or(|at| now >= at)
    }

    /// A call succeeded.
    pub(crate) fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "the runtime answers ListPodSandboxStats again");
        }
        self.failures = 0;
        self.next_call = None;
    }

    /// A call made at `now` failed with `error`. Returns the wait before the next call (`None`: never).
    pub(crate) fn failed(&mut self, error: &CriError, now: Instant) -> Option<Duration> {
        if error.is_unimplemented() {
            if !self.unimplemented {
                tracing::info!(
                    error = %error,
                    "the runtime does not implement ListPodSandboxStats: pod stats come from the pod cgroups"
                );
            }
            self.unimplemented = true;
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        let wait = INITIAL_BACKOFF.saturating_mul(1 << (self.failures - 1).min(16)).min(MAX_BACKOFF);
        self.next_call = Some(now + wait);
        if self.failures == 1 {
            tracing::warn!(
                error = %error,
                retry_in = ?wait,
                "ListPodSandboxStats failed: pod stats come from the pod cgroups; not asking the runtime again \
                 before the back-off (doubling up to {MAX_BACKOFF:?}) has passed"
            );
        } else {
            tracing::debug!(error = %error, failures = self.failures, retry_in = ?wait, "ListPodSandboxStats failed again");
        }
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed call (as containerd 2.x fails it for a sandbox without a cgroup parent).
    fn unknown() -> CriError {
        CriError::InvalidResponse {
            call: "ListPodSandboxStats",
            reason: "failed to decode sandbox container metrics for sandbox \"x\"".into(),
        }
    }

    /// A fake runtime whose sandbox stats fail `fail_until` times, driven through the back-off for `rounds`
    /// housekeeping rounds of 10 s: the rounds in which the runtime was asked.
    fn asked_rounds(
        backoff: &mut SandboxStatsBackoff,
        rounds: u32,
        answer: impl Fn(u32) -> Result<(), CriError>,
    ) -> Vec<u32> {
        let start = Instant::now();
        let mut asked = Vec::new();
        for round in 0..rounds {
            let now = start + Duration::from_secs(10) * round;
            if !backoff.may_ask(now) {
                continue;
            }
            asked.push(round);
            match answer(round) {
                Ok(()) => backoff.succeeded(),
                Err(e) => {
                    backoff.failed(&e, now);
                }
            }
        }
        asked
    }

    #[test]
    fn a_runtime_that_answers_is_asked_every_round() {
        let mut b = SandboxStatsBackoff::default();
        assert_eq!(asked_rounds(&mut b, 5, |_| Ok(())), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn failing_calls_are_repeated_after_a_doubling_back_off_and_a_success_starts_over() {
        let mut b = SandboxStatsBackoff::default();
        // 10 minutes of housekeeping on a runtime that always fails: asked at 0 s, 60 s, 180 s, 420 s
        let asked = asked_rounds(&mut b, 60, |_| Err(unknown()));
        assert_eq!(asked, vec![0, 6, 18, 42], "instead of 60 calls");
        // it recovers: asked at every round again once a call succeeded
        let mut b = SandboxStatsBackoff::default();
        let asked = asked_rounds(&mut b, 12, |round| if round == 0 { Err(unknown()) } else { Ok(()) });
        assert_eq!(asked, vec![0, 6, 7, 8, 9, 10, 11]);
        // the wait is capped
        let mut b = SandboxStatsBackoff::default();
        let now = Instant::now();
        let waits: Vec<Option<Duration>> = (0..10).map(|_| b.failed(&unknown(), now)).collect();
        assert_eq!(waits[0], Some(INITIAL_BACKOFF));
        assert_eq!(waits[1], Some(INITIAL_BACKOFF * 2));
        assert_eq!(waits[9], Some(MAX_BACKOFF));
    }

    #[test]
    fn a_runtime_without_the_call_is_never_asked_again() {
        let mut b = SandboxStatsBackoff::default();
        let unimplemented =
            || CriError::Unimplemented { call: "ListPodSandboxStats", message: "unknown method".into() };
        let asked = asked_rounds(&mut b, 1000, |_| Err(unimplemented()));
        assert_eq!(asked, vec![0]);
    }
}
