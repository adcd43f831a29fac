//! The text form of records used by `nvstore dump`, `load` and `scan`.
//!
//! One record per line: `key<TAB>value<LF>`. In both key and value:
//!
//! | byte                     | written as            |
//! |--------------------------|-----------------------|
//! | tab (0x09)               | `\t`                  |
//! | newline (0x0a)           | `\n`                  |
//! | backslash (0x5c)         | `\\`                  |
//! | other printable ASCII    | itself (0x20..=0x7e)  |
//! | any other byte           | `\xHH` (lowercase hex)|
//!
//! So every line holds exactly one raw tab and no raw control byte, and
//! `dump` followed by `load` reproduces any bytes exactly.
//!
//! Parsing is strict: a line must contain exactly one raw tab; the only
//! escapes are `\t`, `\n`, `\\` and `\x` followed by two hex digits
//! (either case); raw control bytes (0x00..=0x1f other than the separator,
//! and 0x7f) are rejected, which also catches CRLF line endings. Raw bytes
//! 0x80..=0xff are accepted as themselves so a hand-written UTF-8 file
//! loads as expected (dump never writes them).

use std::fmt;
use std::io::{self, BufRead};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends the escaped form of `bytes` to `out`.
pub fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        match b {
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e => out.push(b),
            _ => out.extend_from_slice(&[b'\\', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]),
        }
    }
}

/// The escaped form of `bytes` (always printable ASCII).
pub fn escape(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    escape_into(&mut out, bytes);
    // Only printable ASCII is ever written.
    String::from_utf8(out).expect("escaped text is ASCII")
}

/// Appends one record line (`key<TAB>value<LF>`) to `out`.
pub fn format_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    escape_into(out, key);
    out.push(b'\t');
    escape_into(out, value);
    out.push(b'\n');
}

/// Why a piece of text could not be unescaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for ParseError {}

fn err(what: String) -> ParseError {
    ParseError { what }
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes the escaped form of one field. `field` names it in errors.
pub fn unescape(text: &[u8], field: &str) -> Result<Vec<u8>, ParseError> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        match b {
            b'\\' => {
                let Some(&c) = text.get(i + 1) else {
                    return Err(err(format!(
                        "{field} ends with a lone backslash (write \\\\ for a backslash)"
                    )));
                };
                match c {
                    b't' => out.push(b'\t'),
                    b'n' => out.push(b'\n'),
                    b'\\' => out.push(b'\\'),
                    b'x' => {
                        let h = text.get(i + 2).copied().and_then(hex_digit);
                        let l = text.get(i + 3).copied().and_then(hex_digit);
                        match (h, l) {
                            (Some(h), Some(l)) => out.push(h << 4 | l),
                            _ => {
                                return Err(err(format!(
                                    "{field}: \\x at byte {} must be followed by two hex digits",
                                    i + 1
                                )))
                            }
                        }
                        i += 2;
                    }
                    _ => {
                        return Err(err(format!(
                            "{field}: unknown escape {} at byte {} (the escapes are \\t \\n \\\\ \\xHH)",
                            escape(&[b'\\', c]),
                            i + 1
                        )))
                    }
                }
                i += 2;
            }
            0x00..=0x1f | 0x7f => {
                let hint = if b == b'\r' { " (CRLF line endings?)" } else { "" };
                return Err(err(format!(
                    "{field}: raw control byte 0x{b:02x} at byte {}{hint}; write it as \\x{b:02x}",
                    i + 1
                )));
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Parses one record line (without its line terminator).
pub fn parse_record(line: &[u8]) -> Result<(Vec<u8>, Vec<u8>), ParseError> {
    let tabs = line.iter().filter(|&&b| b == b'\t').count();
    match tabs {
        0 => Err(err(
            "missing the tab between key and value (each line is key<TAB>value)".into(),
        )),
        1 => {
            let t = line.iter().position(|&b| b == b'\t').unwrap();
            let key = unescape(&line[..t], "key")?;
            let value = unescape(&line[t + 1..], "value")?;
            Ok((key, value))
        }
        n => Err(err(format!(
            "{n} tabs on the line; a record has exactly one (write a tab inside a key or value as \\t)"
        ))),
    }
}

/// Why a `load` input could not be read: the input failed, or a line is
/// not a record.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Parse(ParseError),
}

/// One record read from a `load` input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// Input bytes its line took, its newline included.
    pub len: usize,
}

/// Reads the records of a `load` input, one a line. The last line may lack
/// its newline; every other byte of the input belongs to a record.
pub struct Records<R> {
    input: R,
    line: Vec<u8>,
    lineno: u64,
}

impl<R: BufRead> Records<R> {
    pub fn new(input: R) -> Self {
        Records {
            input,
            line: Vec::new(),
            lineno: 0,
        }
    }

    /// The number of the line last read (1 for the first).
    pub fn line(&self) -> u64 {
        self.lineno
    }

    /// The next record; `None` at the end of the input.
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        self.line.clear();
        let n = self.input.read_until(b'\n', &mut self.line).map_err(ReadError::Io)?;
        if n == 0 {
            return Ok(None);
        }
        self.lineno += 1;
        let body = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
        let (key, value) = parse_record(body).map_err(ReadError::Parse)?;
        Ok(Some(Record { key, value, len: n }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn round_trip(key: &[u8], value: &[u8]) {
        let mut line = Vec::new();
        format_record(&mut line, key, value);
        assert_eq!(line.last(), Some(&b'\n'));
        let body = &line[..line.len() - 1];
        assert!(body.iter().all(|&b| (0x20..=0x7e).contains(&b) || b == b'\t'));
        assert_eq!(body.iter().filter(|&&b| b == b'\t').count(), 1);
        let (k, v) = parse_record(body).unwrap();
        assert_eq!(k, key);
        assert_eq!(v, value);
    }

    #[test]
    fn documented_escapes() {
        assert_eq!(escape(b"a\tb\nc\\d"), "a\\tb\\nc\\\\d");
        assert_eq!(
            escape(&[0, 0x1f, 0x7f, 0x80, 0xff, b' ', b'~']),
            "\\x00\\x1f\\x7f\\x80\\xff ~"
        );
        assert_eq!(escape(b"\r"), "\\x0d");
        assert_eq!(escape(b""), "");
    }

    #[test]
    fn every_single_byte_round_trips() {
        for b in 0..=255u8 {
            round_trip(&[b], &[b]);
            round_trip(&[b, b'x', b], &[]);
            let e = escape(&[b]);
            assert_eq!(unescape(e.as_bytes(), "key").unwrap(), vec![b]);
        }
    }

    #[test]
    fn every_byte_pair_round_trips() {
        for a in 0..=255u8 {
            let key: Vec<u8> = (0..=255u8).flat_map(|b| [a, b]).collect();
            round_trip(&key, &key[..key.len() / 2]);
        }
    }

    #[test]
    fn random_byte_strings_round_trip() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        for _ in 0..5000 {
            let klen = rng.gen_range(0..64);
            let vlen = rng.gen_range(0..200);
            // Bias towards the interesting bytes half of the time.
            let pick = |rng: &mut rand::rngs::StdRng| -> u8 {
                if rng.gen_bool(0.5) {
                    *[b'\t', b'\n', b'\\', b'x', b'0', b'\r', 0, 0xff]
                        .get(rng.gen_range(0..8))
                        .unwrap()
                } else {
                    rng.gen()
                }
            };
            let k: Vec<u8> = (0..klen).map(|_| pick(&mut rng)).collect();
            let v: Vec<u8> = (0..vlen).map(|_| pick(&mut rng)).collect();
            round_trip(&k, &v);
        }
    }

    #[test]
    fn uppercase_hex_and_raw_high_bytes_are_accepted() {
        assert_eq!(unescape(b"\\xFF\\xaB", "key").unwrap(), vec![0xff, 0xab]);
        assert_eq!(unescape("é".as_bytes(), "key").unwrap(), "é".as_bytes());
    }

    #[test]
    fn malformed_lines_are_rejected() {
        let bad: &[&[u8]] = &[
            b"no tab here",
            b"a\tb\tc",
            b"a\\\tb",
            b"a\tb\\",
            b"a\\q\tb",
            b"a\t\\x4",
            b"a\t\\xg0",
            b"a\tb\r",
            b"a\x00\tb",
            b"\x7f\t",
        ];
        for line in bad {
            assert!(
                parse_record(line).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(line)
            );
        }
        let e = parse_record(b"a\tb\r").unwrap_err();
        assert!(e.what.contains("0x0d"), "{e}");
        assert!(parse_record(b"a\tb\tc").unwrap_err().what.contains("2 tabs"));
    }

    #[test]
    fn records_reads_lines_and_numbers_them() {
        let input: &[u8] = b"a\tb\n\t\nk\\x00\tv";
        let mut r = Records::new(input);
        let rec = |key: &[u8], value: &[u8], len| {
            Some(Record {
                key: key.to_vec(),
                value: value.to_vec(),
                len,
            })
        };
        assert_eq!(r.next_record().unwrap(), rec(b"a", b"b", 4));
        assert_eq!(r.next_record().unwrap(), rec(b"", b"", 2));
        assert_eq!(r.next_record().unwrap(), rec(&[b'k', 0], b"v", 7));
        assert_eq!(r.line(), 3);
        assert_eq!(r.next_record().unwrap(), None);
        let mut r = Records::new(&b"a\tb\nbad\nc\td\n"[..]);
        assert!(r.next_record().unwrap().is_some());
        match r.next_record() {
            Err(ReadError::Parse(e)) => assert!(e.what.contains("missing the tab"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.line(), 2);
    }

    #[test]
    fn empty_key_and_value_parse() {
        assert_eq!(parse_record(b"\t").unwrap(), (vec![], vec![]));
    }
}
