//! The RESP request parser of `nvstore serve` on arbitrary bytes.
//!
//! - It never panics, whatever the bytes and however they are split.
//! - It is incremental: the input fed in chunks (sizes taken from the first
//!   byte) yields the same requests, and the same error, as the input fed
//!   at once.
//! - Every request it returns, encoded as a RESP array of bulk strings by
//!   the server's own reply encoder, parses back to the same arguments.
//! - Every request, written as an inline request with each byte quoted as
//!   `\xHH`, splits back to the same arguments.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use nvstore_server::resp::{split_args, Parser, ProtocolError, Reply};
use nvstore_server::Limits;

/// What a parser made of an input: the requests, then the error if one
/// ended the input.
type Outcome = (Vec<Vec<Bytes>>, Option<ProtocolError>);

/// Feeds `input` to a fresh parser in pieces of the given sizes (cycled),
/// taking every request after each piece.
fn parse(input: &[u8], sizes: &[usize], lim: &Limits) -> Outcome {
    let mut parser = Parser::new();
    let mut buf = BytesMut::new();
    let mut reqs = Vec::new();
    let mut at = 0;
    let mut piece = 0;
    loop {
        loop {
            match parser.next(&mut buf, lim) {
                Ok(Some(r)) => {
                    assert!(!r.is_empty(), "an empty request was returned");
                    reqs.push(r.to_vec());
                }
                Ok(None) => break,
                Err(e) => return (reqs, Some(e)),
            }
        }
        if at == input.len() {
            return (reqs, None);
        }
        let n = sizes[piece % sizes.len()].clamp(1, input.len() - at);
        piece += 1;
        buf.extend_from_slice(&input[at..at + n]);
        at += n;
    }
}

fn quote_inline(args: &[Bytes]) -> Vec<u8> {
    let mut line = Vec::new();
    for a in args {
        line.extend_from_slice(b" \"");
        for &b in a.iter() {
            line.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
        line.push(b'"');
    }
    line
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, input)) = data.split_first() else {
        return;
    };
    let lim = Limits::default();
    let whole = parse(input, &[input.len().max(1)], &lim);
    // Piece sizes 1..=15 from the first byte (0 counts as 1).
    let split = split as usize;
    let sizes = [(split & 15).max(1), (split >> 4).max(1), 1 + split % 7];
    let pieces = parse(input, &sizes, &lim);
    // Longer inputs may trip a length limit at a different point when split.
    if input.len() <= lim.max_inline {
        assert_eq!(whole, pieces, "split into pieces of {sizes:?}");
    }
    for req in &whole.0 {
        let mut out = BytesMut::new();
        Reply::Array(req.iter().map(|a| Reply::Bulk(a.to_vec())).collect()).encode(2, &mut out);
        let again = parse(&out, &[out.len()], &lim);
        assert_eq!(again, (vec![req.clone()], None), "re-encoded as {out:?}");

        let line = quote_inline(req);
        let split = split_args(&line).expect("a quoted line splits");
        assert_eq!(split.len(), req.len());
        assert!(split.iter().zip(req).all(|(a, b)| a[..] == b[..]), "inline {line:?}");
    }
    // The inline splitter alone, on every line of the input.
    for line in input.split(|&b| b == b'\n') {
        let _ = split_args(line);
    }
});
