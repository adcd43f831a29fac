//! Byte sizes on the command line and in reports.
//!
//! Accepted: a whole or decimal number, optionally followed (with or without
//! a space) by a unit. All units are binary: `K`, `KB`, `KiB` = 1024;
//! `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB` likewise; `B` or nothing
//! means bytes. Units are case-insensitive. A decimal must come out as a
//! whole number of bytes (`1.5K` = 1536 is fine, `0.1K` is not).

/// Parses a size such as `64MiB`, `1G`, `1.5 KiB` or `4096`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "unknown size unit '{unit}' in '{s}' (use bytes or KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(format!("'{s}' is not a size (e.g. 4096, 64MiB, 1GiB)"));
    }
    let too_big = || format!("size '{s}' is too large");
    let unit_bytes = 1u128 << shift;
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_big())?
    };
    let mut total = int_v.checked_mul(unit_bytes).ok_or_else(too_big)?;
    if !frac.is_empty() {
        if frac.len() > 30 {
            return Err(format!("size '{s}' has too many decimals"));
        }
        let f: u128 = frac.parse().map_err(|_| too_big())?;
        let denom = 10u128.pow(frac.len() as u32);
        let scaled = f * unit_bytes;
        if !scaled.is_multiple_of(denom) {
            return Err(format!("size '{s}' is not a whole number of bytes"));
        }
        total += scaled / denom;
    }
    u64::try_from(total).map_err(|_| too_big())
}

/// `67108864` → `64.0 MiB`; below 1 KiB, `512 B`.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1gb"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("1KB"), Ok(1024));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("512B"), Ok(512));
        assert!(parse_size("0.1K").is_err());
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.2.3K").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
        assert!(parse_size("16777216T").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(64 << 20), "64.0 MiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
    }
}
