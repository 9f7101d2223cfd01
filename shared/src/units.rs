//! Go durations (`1m30s`, `500ms`) as the kubelet's flags and KubeletConfiguration fields write them
//! (`time.ParseDuration` and `time.Duration.String()`), and the error of every value syntax shared with the
//! kubelet: the daemon's configuration and the client's `--since` and `--request-timeout` read them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A duration written like Go's `time.ParseDuration` accepts it (`2m`, `1m30s`, `500ms`, `1.5h`, `0`), as
/// the kubelet's flags and KubeletConfiguration fields take them. Negative durations are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub Duration);

/// Why a duration or a quantity could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The text was empty.
    #[error("empty value")]
    Empty,
    /// A duration number without a unit (other than `0`).
    #[error("missing unit in duration {0:?} (use ns, us, ms, s, m or h, e.g. \"1m30s\")")]
    MissingUnit(String),
    /// A unit nodelet does not know.
    #[error("unknown unit {unit:?} in {value:?}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole value.
        value: String,
    },
    /// Not a number where one was expected.
    #[error("invalid number in {0:?}")]
    InvalidNumber(String),
    /// A negative value where only non-negative ones make sense.
    #[error("negative value {0:?} is not allowed")]
    Negative(String),
    /// The value does not fit.
    #[error("value {0:?} is out of range")]
    OutOfRange(String),
}

const NANOS_PER_UNIT: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration string (`time.ParseDuration` syntax) into a [`Duration`]; negatives are refused.
pub fn parse_go_duration(text: &str) -> Result<Duration, UnitError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(UnitError::Empty);
    }
    let (negative, mut rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(UnitError::InvalidNumber(text.to_owned()));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        // number: digits [. digits]
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &after_dot[..frac_len];
            rest = &after_dot[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(UnitError::InvalidNumber(text.to_owned()));
        }
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(UnitError::MissingUnit(text.to_owned()));
        }
        let Some(&(_, scale)) = NANOS_PER_UNIT.iter().find(|(u, _)| *u == unit) else {
            return Err(UnitError::UnknownUnit { unit: unit.to_owned(), value: text.to_owned() });
        };
        let overflow = || UnitError::OutOfRange(text.to_owned());
        let int: u128 = if int_part.is_empty() { 0 } else { int_part.parse().map_err(|_| overflow())? };
        let mut value = int.checked_mul(scale).ok_or_else(overflow)?;
        // fraction: keep at most 30 digits; exact for every unit (scale <= 3.6e12)
        let mut denom: u128 = 1;
        let mut frac: u128 = 0;
        for d in frac_part.bytes().take(30) {
            frac = frac * 10 + u128::from(d - b'0');
            denom *= 10;
        }
        value =
            value.checked_add(frac.checked_mul(scale).ok_or_else(overflow)? / denom).ok_or_else(overflow)?;
        total = total.checked_add(value).ok_or_else(overflow)?;
    }
    if negative && total > 0 {
        return Err(UnitError::Negative(text.to_owned()));
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| UnitError::OutOfRange(text.to_owned()))?;
    // Go durations are int64 nanoseconds: refuse what Go would refuse
    if total > i64::MAX as u128 {
        return Err(UnitError::OutOfRange(text.to_owned()));
    }
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Formats a duration like Go's `time.Duration.String()`: `0s`, `500ms`, `1.5µs`, `2m0s`, `1h30m0s`.
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}\u{b5}s", decimal(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", decimal(nanos, 1_000_000));
    }
    let hours = nanos / 3_600_000_000_000;
    let minutes = (nanos / 60_000_000_000) % 60;
    let sec_nanos = nanos % 60_000_000_000;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{}s", decimal(sec_nanos, 1_000_000_000)));
    out
}

/// `value / unit` as a decimal without trailing zeros (`1500, 1000` → `1.5`).
fn decimal(value: u128, unit: u128) -> String {
    let int = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return int.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{int}.{}", digits.trim_end_matches('0'))
}

impl FromStr for GoDuration {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_go_duration(s).map(GoDuration)
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

impl From<GoDuration> for Duration {
    fn from(d: GoDuration) -> Self {
        d.0
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string like \"1m30s\", \"500ms\" or \"2h\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GoDuration, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Duration {
        parse_go_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn go_durations_parse_like_go() {
        assert_eq!(d("2m"), Duration::from_secs(120));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("0"), Duration::ZERO);
        assert_eq!(d("0s"), Duration::ZERO);
        assert_eq!(d("1h2m3s4ms5us6ns"), Duration::new(3723, 4_005_006));
        assert_eq!(d("1µs"), Duration::from_micros(1));
        assert_eq!(d(".5s"), Duration::from_millis(500));
        assert_eq!(d("2.s"), Duration::from_secs(2));
        assert_eq!(d("+20s"), Duration::from_secs(20));
        assert_eq!(d("-0s"), Duration::ZERO);
    }

    #[test]
    fn go_durations_reject_what_go_rejects_and_negatives() {
        assert_eq!(parse_go_duration(""), Err(UnitError::Empty));
        assert!(matches!(parse_go_duration("10"), Err(UnitError::MissingUnit(_))));
        assert!(matches!(parse_go_duration("3d"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(parse_go_duration("-1s"), Err(UnitError::Negative(_))));
        assert!(matches!(parse_go_duration("."), Err(UnitError::InvalidNumber(_))));
        assert!(matches!(parse_go_duration("s"), Err(UnitError::InvalidNumber(_))));
        assert!(matches!(parse_go_duration("1m 30s"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(parse_go_duration("3000000h"), Err(UnitError::OutOfRange(_))));
    }

    #[test]
    fn go_durations_format_like_go() {
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
        assert_eq!(format_go_duration(Duration::from_secs(120)), "2m0s");
        assert_eq!(format_go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(format_go_duration(Duration::from_nanos(1500)), "1.5\u{b5}s");
        assert_eq!(format_go_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(format_go_duration(Duration::from_millis(2500)), "2.5s");
        for s in ["2m0s", "1m30s", "500ms", "1h0m20s", "20s"] {
            assert_eq!(format_go_duration(d(s)), s);
        }
    }

    #[test]
    fn go_duration_deserializes_from_strings_only() {
        let v: GoDuration = crate::yaml::from_str("1m30s").expect("string");
        assert_eq!(v.0, Duration::from_secs(90));
        let err = crate::yaml::from_str::<GoDuration>("60").expect_err("a number is not a duration");
        assert!(err.to_string().contains("missing unit"), "{err}");
        let err = crate::yaml::from_str::<GoDuration>("[1]").expect_err("a list is not a duration");
        assert!(err.to_string().contains("expected string"), "{err}");
    }
}
