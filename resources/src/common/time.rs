//! API timestamps from the wall-clock nanoseconds the pairs keep.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A timestamp from nanoseconds since the Unix epoch (`None` for 0).
pub fn time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time)
}
