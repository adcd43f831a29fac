//! Numbers as Redis reads and writes them.

/// A signed 64-bit integer as Redis' `string2ll` accepts it: optional `-`,
/// digits without leading zeros (except `0` itself), no `+`, no spaces,
/// no overflow.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let (neg, digits) = match s[0] {
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits[0] == b'0' && (digits.len() > 1 || neg) {
        return None;
    }
    let mut v: i128 = 0;
    for &d in digits {
        v = v * 10 + (d - b'0') as i128;
    }
    if neg {
        v = -v;
    }
    i64::try_from(v).ok()
}

/// A double as Redis' `string2d`/`strtod` accepts it for scores and
/// increments: `1.5`, `-3`, `1.2E9`, `inf`, `+inf`, `-inf`, `infinity`.
/// Rejected: NaN, empty, surrounding spaces, values that overflow to infinity
/// without being spelled as one.
pub fn parse_f64(s: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(s).ok()?;
    if t.is_empty() || t.trim() != t {
        return None;
    }
    let v: f64 = t.parse().ok()?;
    if v.is_nan() {
        return None;
    }
    if v.is_infinite() {
        let body = t.trim_start_matches(['+', '-']).to_ascii_lowercase();
        if body != "inf" && body != "infinity" {
            return None;
        }
    }
    Some(v)
}

/// A double as Redis 7 prints scores: shortest round-trip digits, `inf`,
/// `-inf`, exponent form (`1e+20`) for very large or small magnitudes.
pub fn format_double(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if d == 0.0 {
        return "0".into();
    }
    let a = d.abs();
    if !(1e-5..1e17).contains(&a) {
        let s = format!("{d:e}");
        // Rust prints `1e20` / `1.5e-7`; Redis prints `1e+20` / `1.5e-07`.
        let (m, e) = s.split_once('e').unwrap();
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        return format!("{m}e{sign}{digits:0>2}");
    }
    format!("{d}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_like_string2ll() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"9223372036854775808"[..],
            b"+1",
            b" 1",
            b"01",
            b"-0",
            b"",
            b"-",
            b"1.0",
            b"1e3",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn doubles_like_strtod() {
        assert_eq!(parse_f64(b"1.2E9"), Some(1.2e9));
        assert_eq!(parse_f64(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_f64(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_f64(b"inf"), Some(f64::INFINITY));
        for bad in [&b"nan"[..], b"1e400", b"", b" 1", b"abc", b"1,5"] {
            assert_eq!(parse_f64(bad), None, "{bad:?}");
        }
        assert_eq!(format_double(1.5), "1.5");
        assert_eq!(format_double(3.0), "3");
        assert_eq!(format_double(-2.25), "-2.25");
        assert_eq!(format_double(f64::INFINITY), "inf");
        assert_eq!(format_double(1e20), "1e+20");
        assert_eq!(format_double(1.5e-7), "1.5e-07");
    }
}
