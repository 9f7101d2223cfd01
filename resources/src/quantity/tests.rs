use proptest::prelude::*;

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
    assert_eq!(value("-8Ei"), Some(i64::MIN), "saturates");
    assert!(Quantity::parse("0").is_some_and(Quantity::is_zero));
    assert!(Quantity::parse("-0").is_some_and(|q| q.is_zero() && !q.is_negative()));
}

/// Upstream examples (k8s.io/apimachinery resource.Quantity tests and docs): text, nanos.
#[test]
fn agrees_with_upstream_examples() {
    const G: i128 = 1_000_000_000;
    for (text, nanos) in [
        ("1", G),
        ("0", 0),
        ("100m", 100_000_000),
        ("64Mi", 64 * 1024 * 1024 * G),
        ("1.5Gi", 3 * 512 * 1024 * 1024 * G),
        ("2e3", 2000 * G),
        ("1E3", 1000 * G),
        ("1e-3", 1_000_000),
        ("1e+3", 1000 * G),
        ("1E", 1_000_000_000_000_000_000 * G),
        ("1k", 1000 * G),
        ("1M", 1_000_000 * G),
        (".5", G / 2),
        ("5.", 5 * G),
        ("+2", 2 * G),
        ("-2", -2 * G),
        ("1n", 1),
        ("0.1n", 1),
        ("1u", 1000),
        ("129e6", 129_000_000 * G),
        ("123Mi", 123 * 1024 * 1024 * G),
        ("0.000000000000000000000000000000000000000000001", 1),
    ] {
        assert_eq!(Quantity::try_parse(text).and_then(Quantity::nanos), Ok(nanos), "{text}");
    }
    for text in [
        "", "abc", "1.2.3", "1Kb", "Ki", ".", "1e", "1e+", "1 ", " 1", "1K", "1mi", "--1", "0x10", "1ki", "m",
    ] {
        assert_eq!(Quantity::try_parse(text), Err(QuantityError::Syntax), "{text:?}");
    }
    for text in ["999999999999999999999999999999999999999999", "1e999", "1000000000000Ei"] {
        assert_eq!(
            Quantity::try_parse(text).and_then(Quantity::nanos),
            Err(QuantityError::TooLarge),
            "{text:?}"
        );
    }
    assert_eq!(Quantity::try_parse("1e1001"), Err(QuantityError::TooLarge));
}

#[test]
fn canonical_forms() {
    for (text, canonical) in [
        ("1.5", "1500m"),
        ("1000m", "1"),
        ("2048Ki", "2Mi"),
        ("1.5Gi", "1536Mi"),
        ("1024", "1024"),
        ("1e3", "1k"),
        ("0.1", "100m"),
        ("100Mi", "100Mi"),
        ("0", "0"),
        ("-5m", "-5m"),
        ("1n", "1n"),
        ("12e20", "1200E"),
    ] {
        let q = Quantity::try_parse(text).expect(text);
        assert_eq!(q.to_string(), canonical, "{text}");
    }
}

#[test]
fn u64_values() {
    assert_eq!(Quantity::parse("100Mi").and_then(Quantity::value_u64), Some(100 << 20));
    assert_eq!(Quantity::parse("100m").and_then(Quantity::value_u64), Some(1));
    assert_eq!(Quantity::parse("-1").and_then(Quantity::value_u64), None);
    assert_eq!(Quantity::parse("99Ei").and_then(Quantity::value_u64), None);
}

/// Exponents and digit strings at and beyond every integer limit: refused as too large (or read as zero, or the
/// smallest unit rounded up), never a panic. `1e-9223372036854775808` once panicked (`i64::MIN.abs()`).
#[test]
fn exponents_and_digits_at_integer_limits_are_refused_not_panics() {
    let limits = [
        i64::MIN.to_string(),
        i64::MAX.to_string(),
        u64::MAX.to_string(),
        i128::MIN.to_string(),
        i128::MAX.to_string(),
        u128::MAX.to_string(),
        "-9223372036854775809".to_owned(),
        "9223372036854775808".to_owned(),
        "9".repeat(1000),
    ];
    for n in &limits {
        let unsigned = n.trim_start_matches('-');
        for text in [
            format!("1e{n}"),
            format!("1E{n}"),
            format!("-1e{n}"),
            format!("1e+{unsigned}"),
            format!("1.5e{n}"),
        ] {
            assert_eq!(Quantity::try_parse(&text), Err(QuantityError::TooLarge), "{text}");
        }
        // Zero times anything is zero.
        assert_eq!(
            Quantity::try_parse(&format!("0e{n}")).map(Quantity::is_zero),
            Err(QuantityError::TooLarge)
        );
        for text in [n.clone(), format!("{n}Ei"), format!("{n}E"), format!("{n}n"), format!("{n}.{n}")] {
            let q = Quantity::try_parse(&text);
            let _ = q.map(|q| {
                (q.nanos(), q.scaled_ceil(i64::MIN), q.scaled_ceil(i64::MAX), q.value_u64(), q.to_string())
            });
        }
    }
    assert_eq!(Quantity::try_parse("1e-1000").and_then(Quantity::nanos), Ok(1), "rounds up to one nano-unit");
    assert_eq!(Quantity::try_parse("1e-1001"), Err(QuantityError::TooLarge));
    let q = Quantity::try_parse(&format!("0.{}1", "0".repeat(5000))).expect("a tiny number");
    assert_eq!(q.nanos(), Ok(1));
    assert_eq!(Quantity::try_parse("-1").map(|q| q.scaled_ceil(i64::MIN)), Ok(i64::MAX));
}

fn canonical_text() -> impl Strategy<Value = String> {
    let suffix = prop::sample::select(vec![
        "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ]);
    (1u64..1_000_000, suffix).prop_map(|(n, s)| format!("{n}{s}"))
}

proptest! {
    #[test]
    fn never_panics_on_any_string(s in ".{0,40}") {
        let _ = Quantity::try_parse(&s).map(|q| (q.nanos(), q.scaled_ceil(1000), q.value_u64(), q.to_string()));
    }

    #[test]
    fn never_panics_on_quantity_shaped_strings(s in "[+-]?[0-9]{0,45}(\\.[0-9]{0,45})?([eE][+-]?[0-9]{1,5}|[numkMGTPE]|[KMGTPE]i)?") {
        let _ = Quantity::try_parse(&s).map(|q| (q.nanos(), q.scaled_ceil(i64::MAX), q.value_u64(), q.to_string()));
    }

    #[test]
    fn never_panics_on_any_exponent(mantissa in "[+-]?[0-9]{0,40}(\\.[0-9]{0,40})?", exp in prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()], wide in prop_oneof![Just(i128::MIN), Just(i128::MAX), any::<i128>()]) {
        for text in [format!("{mantissa}e{exp}"), format!("{mantissa}E{wide}"), format!("{mantissa}e+{}", exp.unsigned_abs())] {
            let _ = Quantity::try_parse(&text).map(|q| (q.nanos(), q.scaled_ceil(i64::MIN), q.value_u64(), q.to_string()));
        }
    }

    #[test]
    fn canonical_forms_round_trip(text in canonical_text()) {
        let q = Quantity::try_parse(&text).expect("canonical text parses");
        let shown = q.to_string();
        let again = Quantity::try_parse(&shown).expect("display parses");
        prop_assert_eq!(again.nanos(), q.nanos(), "{} shown as {}", text, shown);
        prop_assert_eq!(Quantity::try_parse(&again.to_string()).map(|q| q.to_string()), Ok(shown));
    }

    #[test]
    fn milli_and_value_agree(n in 0u64..1_000_000_000, suffix in prop::sample::select(vec!["", "k", "M", "Ki", "Mi"])) {
        let q = Quantity::try_parse(&format!("{n}{suffix}")).expect("parses");
        let v = q.scaled_ceil(1);
        prop_assert_eq!(q.scaled_ceil(1000), v.saturating_mul(1000));
        prop_assert_eq!(q.value_u64(), u64::try_from(v).ok());
    }
}
