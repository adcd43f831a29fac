//! Parsers for the benchmarks' command-line values.

/// Parses a count with an optional k/M/G suffix (powers of ten): `2000`, `1M`.
pub fn parse_count(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000),
        Some('m' | 'M') => (&t[..t.len() - 1], 1_000_000),
        Some('g' | 'G' | 'b' | 'B') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (&t[..], 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a count (e.g. 2000, 100k, 1M)"))?;
    if v < 0.0 || !v.is_finite() {
        return Err(format!("'{s}' is not a count"));
    }
    Ok((v * mul as f64).round() as u64)
}

pub use nvstore::units::parse_size;
