//! Value syntaxes shared with the kubelet: Go durations (`1m30s`, in [`nodelet_shared::units`], which the
//! client reads too) and Kubernetes quantities (`100Mi`).

use std::fmt;
use std::str::FromStr;

use nodelet_resources::quantity::{Quantity, QuantityError};

pub use nodelet_shared::units::{GoDuration, UnitError, format_go_duration, parse_go_duration};

/// A threshold value as the kubelet's eviction settings write it: an absolute quantity (`100Mi`, `1k`, `500`)
/// or a percentage of capacity (`10%`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute amount (bytes, inodes or process ids), rounded up to a whole number.
    Quantity(u64),
    /// A percentage of the capacity, 0–100.
    Percentage(f64),
}

impl FromStr for ThresholdValue {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| UnitError::InvalidNumber(s.to_owned()))?;
            if !v.is_finite() {
                return Err(UnitError::InvalidNumber(s.to_owned()));
            }
            if v < 0.0 {
                return Err(UnitError::Negative(s.to_owned()));
            }
            if v > 100.0 {
                return Err(UnitError::OutOfRange(s.to_owned()));
            }
            return Ok(ThresholdValue::Percentage(v));
        }
        parse_quantity(t).map(ThresholdValue::Quantity)
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => write!(f, "{q}"),
            ThresholdValue::Percentage(p) => write!(f, "{p}%"),
        }
    }
}

/// Parses a non-negative Kubernetes quantity (`128974848`, `129e6`, `129M`, `123Mi`, `1.5Gi`, `100m`) into a
/// whole number, rounding up like `resource.Quantity.Value()`, with the project's one quantity parser
/// ([`Quantity`]); surrounding blanks are allowed, as in YAML values.
pub fn parse_quantity(text: &str) -> Result<u64, UnitError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(UnitError::Empty);
    }
    if s.starts_with('-') {
        return Err(UnitError::Negative(text.to_owned()));
    }
    match Quantity::try_parse(s) {
        Ok(q) => q.value_u64().ok_or_else(|| UnitError::OutOfRange(text.to_owned())),
        Err(QuantityError::TooLarge) => Err(UnitError::OutOfRange(text.to_owned())),
        Err(QuantityError::Syntax) => {
            let unsigned = s.strip_prefix('+').unwrap_or(s);
            let number_len = unsigned.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
            let (number, unit) = unsigned.split_at(number_len);
            if !number.bytes().any(|b| b.is_ascii_digit())
                || number.matches('.').count() > 1
                || unit.is_empty()
            {
                Err(UnitError::InvalidNumber(text.to_owned()))
            } else {
                Err(UnitError::UnknownUnit { unit: unit.to_owned(), value: text.to_owned() })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_binary_decimal_and_exponent_forms() {
        assert_eq!(parse_quantity("100Mi"), Ok(100 << 20));
        assert_eq!(parse_quantity("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_quantity("129M"), Ok(129_000_000));
        assert_eq!(parse_quantity("129e6"), Ok(129_000_000));
        assert_eq!(parse_quantity("128974848"), Ok(128_974_848));
        assert_eq!(parse_quantity("1k"), Ok(1000));
        assert_eq!(parse_quantity("100m"), Ok(1), "milli-units round up");
        assert_eq!(parse_quantity("0"), Ok(0));
        assert!(matches!(parse_quantity("-1"), Err(UnitError::Negative(_))));
        assert!(matches!(parse_quantity("12Xi"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(parse_quantity("Mi"), Err(UnitError::InvalidNumber(_))));
        assert!(matches!(parse_quantity("99Ei"), Err(UnitError::OutOfRange(_))));
    }

    #[test]
    fn threshold_values_are_quantities_or_percentages() {
        assert_eq!("10%".parse::<ThresholdValue>(), Ok(ThresholdValue::Percentage(10.0)));
        assert_eq!("100Mi".parse::<ThresholdValue>(), Ok(ThresholdValue::Quantity(100 << 20)));
        assert!("101%".parse::<ThresholdValue>().is_err());
        assert!("-5%".parse::<ThresholdValue>().is_err());
        assert!("abc%".parse::<ThresholdValue>().is_err());
    }
}
