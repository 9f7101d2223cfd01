//! The wall clock, as a value the pairs are given (tests pass one driven by paused tokio time).

use std::sync::Arc;

/// Wall-clock time in nanoseconds since the Unix epoch. Runtimes stamp containers with wall
/// time; tests pass a clock driven by paused tokio time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    })
}

/// `clock` as an engine's wall clock ([`reconcile_engine::WallClock`], read into
/// [`View::wall`](reconcile_engine::View::wall)), so that a reconciler compares the world's
/// timestamps with the same clock that stamped them (tests pass one driven by paused tokio time).
pub fn wall_clock(clock: &Clock) -> reconcile_engine::WallClock {
    let clock = clock.clone();
    reconcile_engine::WallClock::new(move || reconcile_engine::from_unix_nanos(clock()))
}
