//! Kubernetes resource quantities (`100m`, `0.5`, `128Mi`, `1e3`, `1.5G`): the one parser of the project, exact
//! (no floating point) and overflow-proof (every operation is checked: too large is an error or saturates, never a
//! wrap or a panic).
//!
//! The syntax is `resource.Quantity`'s: `<sign><digits>[.<digits>]<suffix>` with the suffix one of the binary SI
//! `Ki Mi Gi Ti Pi Ei`, the decimal SI `n u m "" k M G T P E`, or an exponent `e<exp>`/`E<exp>` (`e+3`, `e-3`).
//! Up to 38 significant digits are kept exactly; more are refused as too large a precision.

use std::fmt;
use std::str::FromStr;

/// The most significant digits a quantity keeps (`u128` holds every 38-digit number).
const MAX_SIGNIFICANT_DIGITS: usize = 38;
/// Exponents beyond this are refused (no quantity of a node is near `1e1000`).
const MAX_EXPONENT: i64 = 1000;

/// A quantity string that does not parse, or a value that does not fit what it is used for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not of the form `<number><suffix>`.
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Syntax,
    /// Too large to represent, or more significant digits than are kept.
    #[error("quantity is too large")]
    TooLarge,
}

/// An exact quantity: `(-1)^negative × mantissa × 10^exp10 × 2^exp2`, the mantissa without trailing zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exp10: i64,
    exp2: u32,
}

impl FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::try_parse(s)
    }
}

impl Quantity {
    /// The quantity `1`.
    pub const ONE: Quantity = Quantity { negative: false, mantissa: 1, exp10: 0, exp2: 0 };

    /// Parses a quantity; `None` for anything that is not one (see [`Quantity::try_parse`] for why).
    pub fn parse(text: &str) -> Option<Quantity> {
        Quantity::try_parse(text).ok()
    }

    /// Parses `<sign><digits>[.<digits>]<suffix>` as `resource.Quantity` does (no surrounding blanks).
    pub fn try_parse(text: &str) -> Result<Quantity, QuantityError> {
        let bytes = text.as_bytes();
        let (negative, rest) = match bytes.first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        let (number, suffix) = rest.split_at(number_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
            return Err(QuantityError::Syntax);
        }
        let (exp10_suffix, exp2): (i64, u32) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            other => {
                let exponent = other.strip_prefix(['e', 'E']).ok_or(QuantityError::Syntax)?;
                let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(QuantityError::Syntax);
                }
                let value: i64 = exponent.parse().map_err(|_| QuantityError::TooLarge)?;
                // `unsigned_abs`: `i64::MIN.abs()` overflows (a panic with overflow checks on).
                if value.unsigned_abs() > MAX_EXPONENT.unsigned_abs() {
                    return Err(QuantityError::TooLarge);
                }
                (value, 0)
            }
        };
        // The significant digits: leading zeros dropped, trailing zeros moved into the exponent.
        let all: Vec<u8> = int_part.bytes().chain(frac_part.bytes()).collect();
        let first = all.iter().position(|b| *b != b'0').unwrap_or(all.len());
        let last = all.iter().rposition(|b| *b != b'0').map_or(first, |i| i + 1);
        let significant = all.get(first..last).unwrap_or_default();
        if significant.len() > MAX_SIGNIFICANT_DIGITS {
            return Err(QuantityError::TooLarge);
        }
        let trailing_zeros =
            i64::try_from(all.len() - last.max(first)).map_err(|_| QuantityError::TooLarge)?;
        let mut mantissa: u128 = 0;
        for b in significant {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(b - b'0')))
                .ok_or(QuantityError::TooLarge)?;
        }
        let frac_len = i64::try_from(frac_part.len()).map_err(|_| QuantityError::TooLarge)?;
        if mantissa == 0 {
            return Ok(Quantity { negative: false, mantissa: 0, exp10: 0, exp2: 0 });
        }
        let exp10 = exp10_suffix
            .checked_add(trailing_zeros)
            .and_then(|e| e.checked_sub(frac_len))
            .ok_or(QuantityError::TooLarge)?;
        Ok(Quantity { negative, mantissa, exp10, exp2 })
    }

    /// `|value| × scale` rounded up (away from zero), or `None` when it does not fit a `u128`.
    fn magnitude_ceil(self, scale: u128) -> Option<u128> {
        if self.mantissa == 0 {
            return Some(0);
        }
        let mut n = self.mantissa;
        let mut exp10 = self.exp10;
        let mut inexact = false;
        let factor = 2u128.checked_pow(self.exp2)?.checked_mul(scale)?;
        // Divide first when the product would overflow but the value is scaled down anyway.
        let mut product = n.checked_mul(factor);
        while product.is_none() && exp10 < 0 {
            inexact |= !n.is_multiple_of(10);
            n /= 10;
            exp10 += 1;
            product = n.checked_mul(factor);
        }
        n = product?;
        while exp10 > 0 {
            n = n.checked_mul(10)?;
            exp10 -= 1;
        }
        while exp10 < 0 && n > 0 {
            inexact |= !n.is_multiple_of(10);
            n /= 10;
            exp10 += 1;
        }
        if inexact { n.checked_add(1) } else { Some(n) }
    }

    /// The value times `scale`, rounded up (away from zero), or [`QuantityError::TooLarge`] past the `i128` range.
    pub fn checked_scaled(self, scale: u64) -> Result<i128, QuantityError> {
        let magnitude = self.magnitude_ceil(u128::from(scale)).ok_or(QuantityError::TooLarge)?;
        let value = i128::try_from(magnitude).map_err(|_| QuantityError::TooLarge)?;
        Ok(if self.negative { -value } else { value })
    }

    /// The value in billionths of its unit (`100m` is 100 000 000), rounded up below one nano-unit as the API
    /// server does.
    pub fn nanos(self) -> Result<i128, QuantityError> {
        self.checked_scaled(1_000_000_000)
    }

    /// The value as a whole non-negative number, rounded up like `Value()`: `None` for a negative quantity or one
    /// past `u64`.
    pub fn value_u64(self) -> Option<u64> {
        if self.negative {
            return None;
        }
        u64::try_from(self.magnitude_ceil(1)?).ok()
    }

    /// The value times `scale`, rounded up (Kubernetes' `Value()` is `scale` 1, `MilliValue()` 1000), saturated to
    /// the `i64` range.
    pub fn scaled_ceil(self, scale: i64) -> i64 {
        let saturated = if self.negative != (scale < 0) { i64::MIN } else { i64::MAX };
        let Some(magnitude) = self.magnitude_ceil(u128::from(scale.unsigned_abs())) else { return saturated };
        match i128::try_from(magnitude).ok().and_then(|m| i64::try_from(m).ok()) {
            Some(m) if self.negative != (scale < 0) => -m,
            Some(m) => m,
            None => saturated,
        }
    }

    /// Whether the quantity is zero.
    pub fn is_zero(self) -> bool {
        self.mantissa == 0
    }

    /// Whether the quantity is below zero.
    pub fn is_negative(self) -> bool {
        self.negative && self.mantissa != 0
    }
}

const DECIMAL_SUFFIXES: &[(i64, &str)] = &[
    (-9, "n"),
    (-6, "u"),
    (-3, "m"),
    (0, ""),
    (3, "k"),
    (6, "M"),
    (9, "G"),
    (12, "T"),
    (15, "P"),
    (18, "E"),
];
const BINARY_SUFFIXES: &[&str] = &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

impl fmt::Display for Quantity {
    /// The canonical form, as `resource.Quantity` writes it: a binary quantity with a whole value as the largest
    /// binary suffix that keeps it whole (`2048Ki` is `2Mi`), anything else in decimal SI with a whole number and
    /// the largest suffix that keeps it whole (`1.5` is `1500m`); an exponent (`1e21`) past the suffixes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.is_negative() { "-" } else { "" };
        if self.exp2 > 0 {
            // A whole number of bytes: mantissa × 10^exp10 × 2^exp2 when exp10 >= 0, or divisible.
            if let Some(mut whole) = self.magnitude_ceil(1).filter(|w| self.magnitude_exact(*w)) {
                let mut power = 0;
                while power + 1 < BINARY_SUFFIXES.len() && whole.is_multiple_of(1024) && whole != 0 {
                    whole /= 1024;
                    power += 1;
                }
                if power > 0 {
                    return write!(f, "{sign}{whole}{}", BINARY_SUFFIXES[power]);
                }
            }
        }
        // Decimal: a whole mantissa with an exponent, folding the binary factor in exactly.
        let (mut mantissa, mut exp10) = (self.mantissa, self.exp10);
        let Some(with_binary) = 2u128.checked_pow(self.exp2).and_then(|b| mantissa.checked_mul(b)) else {
            return write!(f, "{sign}{}e{}", self.mantissa, self.exp10);
        };
        mantissa = with_binary;
        if mantissa == 0 {
            return f.write_str("0");
        }
        while mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exp10 += 1;
        }
        // The suffix exponent: the largest multiple of 3 not above exp10, within the named ones.
        let k = exp10.div_euclid(3) * 3;
        if let Some((k, suffix)) = DECIMAL_SUFFIXES.iter().rev().find(|(e, _)| *e <= k.min(18)).copied()
            && exp10 >= -9
        {
            let mut shown = mantissa;
            for _ in 0..(exp10 - k) {
                match shown.checked_mul(10) {
                    Some(s) => shown = s,
                    None => return write!(f, "{sign}{mantissa}e{exp10}"),
                }
            }
            return write!(f, "{sign}{shown}{suffix}");
        }
        write!(f, "{sign}{mantissa}e{exp10}")
    }
}

impl Quantity {
    /// Whether `|value|` is exactly `whole` (no rounding happened).
    fn magnitude_exact(self, whole: u128) -> bool {
        if self.exp10 >= 0 {
            return true;
        }
        // whole × 10^-exp10 == mantissa × 2^exp2
        let Ok(power) = u32::try_from(-self.exp10) else { return false };
        let lhs = 10u128.checked_pow(power).and_then(|p| whole.checked_mul(p));
        let rhs = 2u128.checked_pow(self.exp2).and_then(|b| self.mantissa.checked_mul(b));
        lhs.is_some() && lhs == rhs
    }
}

#[cfg(test)]
mod tests;
