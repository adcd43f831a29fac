//! The record text of `nvstore load` (and `dump`) on arbitrary bytes.
//!
//! - Reading the input as `load` does never panics; a line either parses
//!   or stops the reader with an error naming it.
//! - The lines read account for the whole input (until an error).
//! - Every record read, written back as `dump` writes it, reads back the
//!   same; so does the input itself taken as a raw key and value (split at
//!   a point given by the first byte), which is `dump` then `load` of any
//!   bytes.
//! - What `dump` writes is printable ASCII, one tab, one newline.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nvstore_cli::escape::{escape, format_record, parse_record, unescape, ReadError, Record, Records};

fn round_trip(key: &[u8], value: &[u8]) {
    let mut line = Vec::new();
    format_record(&mut line, key, value);
    let body = line.strip_suffix(b"\n").expect("a record ends with a newline");
    assert!(
        body.iter().all(|&b| (0x20..=0x7e).contains(&b) || b == b'\t'),
        "{line:?}"
    );
    assert_eq!(body.iter().filter(|&&b| b == b'\t').count(), 1, "{line:?}");
    let (k, v) = parse_record(body).expect("a formatted record parses");
    assert_eq!((&k[..], &v[..]), (key, value));
    let mut records = Records::new(&line[..]);
    let rec = records.next_record().expect("reads").expect("one record");
    let len = line.len();
    assert_eq!(rec, Record { key: k, value: v, len });
    assert!(records.next_record().expect("reads").is_none());
}

fuzz_target!(|data: &[u8]| {
    let Some((&at, input)) = data.split_first() else {
        return;
    };
    let mut records = Records::new(input);
    let mut consumed = 0;
    let mut read = Vec::new();
    let clean_end = loop {
        match records.next_record() {
            Ok(Some(rec)) => {
                consumed += rec.len;
                read.push((rec.key, rec.value));
            }
            Ok(None) => break true,
            Err(ReadError::Parse(_)) => break false,
            Err(ReadError::Io(e)) => panic!("reading a slice failed: {e}"),
        }
    };
    if clean_end {
        assert_eq!(consumed, input.len());
        assert_eq!(records.line() as usize, read.len());
    } else {
        assert_eq!(records.line() as usize, read.len() + 1);
    }
    for (k, v) in &read {
        round_trip(k, v);
    }
    // The whole input as one key and value.
    let at = (at as usize).min(input.len());
    round_trip(&input[..at], &input[at..]);
    // A field unescapes to at most its own length.
    if let Ok(raw) = unescape(input, "key") {
        assert!(raw.len() <= input.len());
        // An escaped field unescapes to itself.
        assert_eq!(unescape(escape(&raw).as_bytes(), "key").as_deref(), Ok(&raw[..]));
    }
});
