//! The wall clock an engine gives its reconciler ([`View::wall`](crate::View::wall)).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A source of wall-clock time, read once per planning pass into
/// [`View::wall`](crate::View::wall): [`WallClock::system`] by default, another one given to
/// [`EngineBuilder::wall_clock`](crate::EngineBuilder::wall_clock). Cheap to clone.
///
/// Reconcilers read wall time only through their view, so tests control it: with
/// [`WallClock::tokio`] it follows tokio's clock, paused and advanced in `start_paused` tests.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reconcile_engine::WallClock;
///
/// let fixed = WallClock::new(|| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000));
/// assert_eq!(fixed.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_000));
/// assert!(WallClock::system().now() > SystemTime::UNIX_EPOCH);
/// ```
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> SystemTime + Send + Sync>);

impl WallClock {
    /// The system clock ([`SystemTime::now`]).
    pub fn system() -> Self {
        Self(Arc::new(SystemTime::now))
    }

    /// A clock that reads `now`.
    pub fn new(now: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    /// A clock that reads `start` now and then moves with tokio's clock
    /// ([`tokio::time::Instant`]): paused, auto-advanced and advanced by hand in tests on paused
    /// time, so that decisions on wall time are tested without waiting.
    pub fn tokio(start: SystemTime) -> Self {
        let anchor = tokio::time::Instant::now();
        Self(Arc::new(move || start + anchor.elapsed()))
    }

    /// The time now.
    pub fn now(&self) -> SystemTime {
        (self.0)()
    }

    /// The time now in nanoseconds since the Unix epoch (see [`unix_nanos`]).
    pub fn now_unix_nanos(&self) -> i64 {
        unix_nanos(self.now())
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::system()
    }
}

impl fmt::Debug for WallClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WallClock").field(&self.now()).finish()
    }
}

/// `time` in nanoseconds since the Unix epoch, negative before it, saturated at the ends of `i64`
/// (years 1677 and 2262).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reconcile_engine::{from_unix_nanos, unix_nanos};
///
/// assert_eq!(unix_nanos(SystemTime::UNIX_EPOCH + Duration::from_secs(2)), 2_000_000_000);
/// assert_eq!(unix_nanos(from_unix_nanos(-5)), -5);
/// ```
pub fn unix_nanos(time: SystemTime) -> i64 {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The time `nanos` nanoseconds after the Unix epoch (before it when negative).
pub fn from_unix_nanos(nanos: i64) -> SystemTime {
    let offset = Duration::from_nanos(nanos.unsigned_abs());
    let time = if nanos >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(offset)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(offset)
    };
    time.unwrap_or(SystemTime::UNIX_EPOCH)
}
