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
