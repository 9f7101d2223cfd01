//! Kubernetes resource quantities (`100m`, `0.5`, `128Mi`, `1e3`, `1.5G`), exactly, without floating point.

/// A quantity as an exact fraction `num / den` (`den > 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    num: i128,
    den: i128,
}

/// Digits beyond this many make a quantity unparseable (the API server accepts far fewer).
const MAX_DIGITS: usize = 30;

impl Quantity {
    /// Parses `<sign><digits>[.<digits>]<suffix>` with suffix one of `Ki Mi Gi Ti Pi Ei`, `n u m k M G T P E`,
    /// `e<exp>`/`E<exp>` or nothing. `None` for anything else.
    pub fn parse(text: &str) -> Option<Quantity> {
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first()? {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_len = s.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        let (number, suffix) = s.split_at(number_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if int_part.is_empty() && frac_part.is_empty()
            || frac_part.contains('.')
            || int_part.len() + frac_part.len() > MAX_DIGITS
        {
            return None;
        }
        let mut num: i128 = 0;
        for b in int_part.bytes().chain(frac_part.bytes()) {
            num = num.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
        }
        let mut den: i128 = 10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
        let binary = |power: u32| 1024i128.checked_pow(power);
        let (mul, div) = match suffix {
            "" => (1, 1),
            "Ki" => (binary(1)?, 1),
            "Mi" => (binary(2)?, 1),
            "Gi" => (binary(3)?, 1),
            "Ti" => (binary(4)?, 1),
            "Pi" => (binary(5)?, 1),
            "Ei" => (binary(6)?, 1),
            "n" => (1, 1_000_000_000),
            "u" => (1, 1_000_000),
            "m" => (1, 1_000),
            "k" => (1_000, 1),
            "M" => (1_000_000, 1),
            "G" => (1_000_000_000, 1),
            "T" => (1_000_000_000_000, 1),
            "P" => (1_000_000_000_000_000, 1),
            "E" => (1_000_000_000_000_000_000, 1),
            exp => {
                let exp = exp.strip_prefix(['e', 'E'])?;
                let value: i32 = exp.parse().ok()?;
                if !(-30..=30).contains(&value) {
                    return None;
                }
                let pow = 10i128.checked_pow(value.unsigned_abs())?;
                if value >= 0 { (pow, 1) } else { (1, pow) }
            }
        };
        num = num.checked_mul(mul)?;
        den = den.checked_mul(div)?;
        Some(Quantity { num: if negative { -num } else { num }, den })
    }

    /// The value times `scale`, rounded up (Kubernetes' `Value()` is `scale` 1, `MilliValue()` 1000),
    /// saturated to the `i64` range.
    pub fn scaled_ceil(self, scale: i64) -> i64 {
        let Some(n) = self.num.checked_mul(i128::from(scale)) else {
            return if self.num < 0 { i64::MIN } else { i64::MAX };
        };
        let q = n.div_euclid(self.den) + i128::from(n.rem_euclid(self.den) != 0);
        i64::try_from(q).unwrap_or(if q < 0 { i64::MIN } else { i64::MAX })
    }

    /// Whether the quantity is zero.
    pub fn is_zero(self) -> bool {
        self.num == 0
    }

    /// Whether the quantity is below zero.
    pub fn is_negative(self) -> bool {
        self.num < 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn milli(s: &str) -> Option<i64> {
        Quantity::parse(s).map(|q| q.scaled_ceil(1000))
    }
    fn value(s: &str) -> Option<i64> {
        Quantity::parse(s).map(|q| q.scaled_ceil(1))
    }

    #[test]
    fn cpu_and_memory_forms() {
        assert_eq!(milli("100m"), Some(100));
        assert_eq!(milli("0.5"), Some(500));
        assert_eq!(milli(".25"), Some(250));
        assert_eq!(milli("2"), Some(2000));
        assert_eq!(milli("1.0001"), Some(1001), "rounds up like MilliValue");
        assert_eq!(milli("1e-3"), Some(1));
        assert_eq!(value("128Mi"), Some(128 << 20));
        assert_eq!(value("1.5Gi"), Some(3 << 29));
        assert_eq!(value("1G"), Some(1_000_000_000));
        assert_eq!(value("1e3"), Some(1000));
        assert_eq!(value("1E3"), Some(1000));
        assert_eq!(value("500m"), Some(1), "Value rounds up");
        assert_eq!(value("+7k"), Some(7000));
        assert_eq!(value("-1"), Some(-1));
        assert_eq!(value("8Ei"), Some(i64::MAX), "saturates");
        assert!(Quantity::parse("0").is_some_and(Quantity::is_zero));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "m",
            "1.2.3",
            "12Q",
            "1 Gi",
            "ten",
            "1e",
            "1e99",
            ".",
            "1ki",
            "9999999999999999999999999999999",
        ] {
            assert_eq!(Quantity::parse(bad), None, "{bad:?}");
        }
    }
}
