//! RESP2/RESP3 requests and replies.
//!
//! Requests are either multibulk (`*N\r\n$L\r\n<L bytes>\r\n...`) or inline
//! (`SET k v\r\n`, split like Redis' `sdssplitargs`, quotes and escapes
//! included). The parser is incremental: it consumes whatever complete pieces
//! the buffer holds (each bulk is split off the buffer without copying) and
//! keeps its place between calls, so a request that arrives one byte at a
//! time costs no rescanning. Declared lengths are checked against [`Limits`]
//! and never used to reserve memory: buffers grow only as bytes arrive.
//!
//! Replies are a small tree ([`Reply`]) encoded for the connection's protocol:
//! maps, doubles, sets and nulls have their own RESP3 types and fall back to
//! arrays, bulk strings and `$-1`/`*-1` under RESP2, as Redis does.

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;

/// One request's arguments (the command name first). Each is split off the
/// read buffer without copying; up to four (GET, SET, HSET of one field,
/// HGETALL) live inline, so a request costs no allocation of its own.
pub type Args = SmallVec<[Bytes; 4]>;

/// Most arguments reserved from a request's declared count before they
/// arrive; past it they grow as they arrive.
const RESERVE_ARGS: usize = 64;

/// Request-size limits (Redis: `proto-max-bulk-len`, the multibulk count cap,
/// `PROTO_INLINE_MAX_SIZE`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest bulk argument in bytes.
    pub max_bulk: usize,
    /// Most arguments in one multibulk request.
    pub max_args: usize,
    /// Longest inline request or `*`/`$` header line.
    pub max_inline: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 512 << 20,
            max_args: 1 << 20,
            max_inline: 64 << 10,
        }
    }
}

/// A malformed request; the text follows `ERR Protocol error: ` in the reply,
/// after which the connection is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

fn perr<T>(s: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(s.into()))
}

/// Incremental request parser; one per connection.
#[derive(Default, Debug)]
pub struct Parser {
    /// Arguments of the multibulk request in progress.
    args: Args,
    /// Arguments still expected by the multibulk request in progress.
    pending: usize,
    /// Declared length of the bulk whose header was consumed.
    bulk: Option<usize>,
    /// Whether a multibulk request is in progress.
    in_multibulk: bool,
}

/// Position of the first `\r\n` in `buf`, if any.
fn find_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\n') {
        let at = from + i;
        if at > 0 && buf[at - 1] == b'\r' {
            return Some(at - 1);
        }
        from = at + 1;
    }
    None
}

/// Parses a decimal length as Redis' `string2ll` does (no `+`, no spaces).
fn parse_len(s: &[u8]) -> Option<i64> {
    crate::num::parse_i64(s)
}

impl Parser {
    pub fn new() -> Self {
        Parser::default()
    }

    /// Takes the next complete request from `buf`. `Ok(None)`: more bytes are
    /// needed (what was complete has been consumed). Empty requests (`*0`,
    /// blank inline lines) are skipped.
    pub fn next(&mut self, buf: &mut BytesMut, lim: &Limits) -> Result<Option<Args>, ProtocolError> {
        loop {
            if !self.in_multibulk {
                if buf.is_empty() {
                    return Ok(None);
                }
                if buf[0] != b'*' {
                    match self.inline(buf, lim)? {
                        None => return Ok(None),
                        Some(a) if a.is_empty() => continue,
                        Some(a) => return Ok(Some(a)),
                    }
                }
                let Some(end) = find_crlf(buf) else {
                    if buf.len() > lim.max_inline {
                        return perr("too big mbulk count string");
                    }
                    return Ok(None);
                };
                let n = match parse_len(&buf[1..end]) {
                    Some(n) if n <= lim.max_args as i64 => n,
                    _ => return perr("invalid multibulk length"),
                };
                buf.advance(end + 2);
                if n <= 0 {
                    continue;
                }
                self.in_multibulk = true;
                self.pending = n as usize;
                // Room for the declared count up to RESERVE_ARGS (a
                // client's claim alone reserves little): an HMSET or MSET
                // spills out of the inline four once, not by doubling.
                self.args = Args::new();
                if n as usize > self.args.inline_size() {
                    self.args.reserve_exact((n as usize).min(RESERVE_ARGS));
                }
            }
            while self.pending > 0 {
                let len = match self.bulk {
                    Some(l) => l,
                    None => {
                        if buf.is_empty() {
                            return Ok(None);
                        }
                        if buf[0] != b'$' {
                            return perr(format!("expected '$', got '{}'", buf[0] as char));
                        }
                        let Some(end) = find_crlf(buf) else {
                            if buf.len() > lim.max_inline {
                                return perr("too big bulk count string");
                            }
                            return Ok(None);
                        };
                        let l = match parse_len(&buf[1..end]) {
                            Some(l) if l >= 0 && l <= lim.max_bulk as i64 => l as usize,
                            _ => return perr("invalid bulk length"),
                        };
                        buf.advance(end + 2);
                        self.bulk = Some(l);
                        l
                    }
                };
                if buf.len() < len + 2 {
                    return Ok(None);
                }
                if &buf[len..len + 2] != b"\r\n" {
                    return perr("bulk string is not terminated by CRLF");
                }
                let arg = buf.split_to(len).freeze();
                buf.advance(2);
                self.args.push(arg);
                self.bulk = None;
                self.pending -= 1;
            }
            self.in_multibulk = false;
            return Ok(Some(std::mem::take(&mut self.args)));
        }
    }

    fn inline(&mut self, buf: &mut BytesMut, lim: &Limits) -> Result<Option<Args>, ProtocolError> {
        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
            if buf.len() > lim.max_inline {
                return perr("too big inline request");
            }
            return Ok(None);
        };
        if nl > lim.max_inline {
            return perr("too big inline request");
        }
        let line = buf.split_to(nl + 1);
        let mut line = &line[..nl];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        match split_args(line) {
            Some(a) => Ok(Some(a.into_iter().map(Bytes::from).collect())),
            None => perr("unbalanced quotes in request"),
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Splits an inline request like Redis' `sdssplitargs`: whitespace separates
/// arguments; `"..."` takes `\n \r \t \b \a \\ \" \xHH` escapes; `'...'`
/// takes `\'`. A closing quote must be followed by a space or the end.
/// `None` on unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= n {
            return Some(out);
        }
        let mut cur = Vec::new();
        let mut inq = false;
        let mut insq = false;
        loop {
            if inq {
                if i >= n {
                    return None;
                }
                if line[i] == b'\\' && i + 3 < n && line[i + 1] == b'x' {
                    if let (Some(h), Some(l)) = (hex(line[i + 2]), hex(line[i + 3])) {
                        cur.push(h * 16 + l);
                        i += 4;
                        continue;
                    }
                }
                if line[i] == b'\\' && i + 1 < n {
                    let c = match line[i + 1] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        c => c,
                    };
                    cur.push(c);
                    i += 2;
                    continue;
                }
                if line[i] == b'"' {
                    if i + 1 < n && !line[i + 1].is_ascii_whitespace() {
                        return None;
                    }
                    i += 1;
                    break;
                }
                cur.push(line[i]);
                i += 1;
            } else if insq {
                if i >= n {
                    return None;
                }
                if line[i] == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    cur.push(b'\'');
                    i += 2;
                    continue;
                }
                if line[i] == b'\'' {
                    if i + 1 < n && !line[i + 1].is_ascii_whitespace() {
                        return None;
                    }
                    i += 1;
                    break;
                }
                cur.push(line[i]);
                i += 1;
            } else {
                if i >= n || line[i].is_ascii_whitespace() {
                    break;
                }
                match line[i] {
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    c => cur.push(c),
                }
                i += 1;
            }
        }
        out.push(cur);
    }
}

/// A reply, encoded per protocol version by [`Reply::encode`].
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+text`
    Status(&'static str),
    /// `+text` with owned text (e.g. TYPE's answer).
    StatusOwned(String),
    /// `-text`; the text starts with the error code (`ERR`, `WRONGTYPE`, ...).
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// `$-1` (RESP2) / `_` (RESP3).
    Nil,
    /// `*-1` (RESP2) / `_` (RESP3).
    NilArray,
    Array(Vec<Reply>),
    /// `%n` (RESP3) / flat array (RESP2).
    Map(Vec<(Reply, Reply)>),
    /// `~n` (RESP3) / array (RESP2).
    Set(Vec<Reply>),
    /// `,x` (RESP3) / bulk string (RESP2).
    Double(f64),
    /// Pre-encoded bytes (identical in both protocols).
    Raw(&'static [u8]),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Status("OK")
    }

    pub fn err(s: impl Into<String>) -> Reply {
        Reply::Error(s.into())
    }

    pub fn bulk(b: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(b.into())
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends the encoding for protocol `proto` (2 or 3) to `out`.
    pub fn encode(&self, proto: u8, out: &mut BytesMut) {
        match self {
            Reply::Status(s) => line(out, b'+', s.as_bytes()),
            Reply::StatusOwned(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(s) => line(out, b'-', s.as_bytes()),
            Reply::Int(i) => line(out, b':', Decimal::new(*i).as_bytes()),
            Reply::Bulk(b) => bulk(out, b),
            Reply::Nil => nil(out, proto),
            Reply::NilArray => out.extend_from_slice(if proto >= 3 { b"_\r\n" } else { b"*-1\r\n" }),
            Reply::Array(v) => {
                head(out, b'*', v.len());
                v.iter().for_each(|r| r.encode(proto, out));
            }
            Reply::Set(v) => {
                head(out, if proto >= 3 { b'~' } else { b'*' }, v.len());
                v.iter().for_each(|r| r.encode(proto, out));
            }
            Reply::Map(v) => {
                map_head(out, proto, v.len());
                for (k, val) in v {
                    k.encode(proto, out);
                    val.encode(proto, out);
                }
            }
            Reply::Double(d) => {
                let s = crate::num::format_double(*d);
                if proto >= 3 {
                    line(out, b',', s.as_bytes());
                } else {
                    Reply::Bulk(s.into_bytes()).encode(proto, out);
                }
            }
            Reply::Raw(b) => out.extend_from_slice(b),
        }
    }
}

/// `c n\r\n`: the header of a bulk string or an aggregate of `n`.
pub fn head(out: &mut BytesMut, c: u8, n: usize) {
    out.extend_from_slice(&[c]);
    out.extend_from_slice(Decimal::new(n as i64).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A bulk string (the same in RESP2 and RESP3).
pub fn bulk(out: &mut BytesMut, b: &[u8]) {
    head(out, b'$', b.len());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// A nil bulk string: `$-1` (RESP2) / `_` (RESP3).
pub fn nil(out: &mut BytesMut, proto: u8) {
    out.extend_from_slice(if proto >= 3 { b"_\r\n" } else { b"$-1\r\n" });
}

/// The header of a map of `n` pairs: `%n` (RESP3) / an array of `2n` (RESP2).
pub fn map_head(out: &mut BytesMut, proto: u8, n: usize) {
    if proto >= 3 {
        head(out, b'%', n);
    } else {
        head(out, b'*', 2 * n);
    }
}

/// An integer in decimal, formatted without allocating.
struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    fn new(i: i64) -> Decimal {
        let mut buf = [0u8; 20];
        let mut pos = buf.len();
        let mut n = i.unsigned_abs();
        loop {
            pos -= 1;
            buf[pos] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if i < 0 {
            pos -= 1;
            buf[pos] = b'-';
        }
        Decimal { buf, start: pos }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `c text\r\n`, with CR/LF in `text` replaced by spaces (a status or error
/// line must stay one line).
fn line(out: &mut BytesMut, c: u8, text: &[u8]) {
    out.extend_from_slice(&[c]);
    if text.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(text.iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    } else {
        out.extend_from_slice(text);
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut p = Parser::new();
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(a) = p.next(&mut buf, &Limits::default())? {
            out.push(a.iter().map(|b| b.to_vec()).collect());
        }
        Ok(out)
    }

    #[test]
    fn integers_encode_in_decimal() {
        for i in [0, 7, -7, 10, 1234567890, i64::MAX, i64::MIN] {
            let mut out = BytesMut::new();
            Reply::Int(i).encode(2, &mut out);
            assert_eq!(&out[..], format!(":{i}\r\n").as_bytes());
        }
    }

    fn v(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn multibulk_and_inline_pipelined() {
        let got = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n*0\r\n\r\n*-1\r\nset a \"b c\"\r\n").unwrap();
        assert_eq!(got, vec![v(&["GET", "k"]), v(&["PING"]), v(&["set", "a", "b c"])]);
    }

    #[test]
    fn declared_count_is_reserved_once_and_capped() {
        let lim = Limits::default();
        // MSET of ten pairs: 21 arguments, room for all of them at once.
        let mut req = b"*21\r\n$4\r\nMSET\r\n".to_vec();
        for i in 0..20 {
            req.extend_from_slice(format!("$2\r\nk{}\r\n", i % 10).as_bytes());
        }
        let mut buf = BytesMut::from(&req[..]);
        let a = Parser::new().next(&mut buf, &lim).unwrap().unwrap();
        assert_eq!((a.len(), a.capacity()), (21, 21));
        // A huge claim reserves only RESERVE_ARGS; the rest never arrives.
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*1000000\r\n$1\r\nx\r\n"[..]);
        assert!(p.next(&mut buf, &lim).unwrap().is_none());
        assert_eq!(p.args.capacity(), RESERVE_ARGS);
        assert_eq!(p.args.len(), 1);
    }

    #[test]
    fn binary_bulk_with_crlf_inside() {
        let got = parse_all(b"*2\r\n$4\r\na\r\nb\r\n$0\r\n\r\n").unwrap();
        assert_eq!(got, vec![vec![b"a\r\nb".to_vec(), vec![]]]);
    }

    #[test]
    fn every_split_point_gives_the_same_requests() {
        let input: &[u8] = b"*3\r\n$3\r\nSET\r\n$5\r\nhello\r\n$10\r\n0123456789\r\nECHO 'x y'\r\n*1\r\n$4\r\nPING\r\n";
        let whole = parse_all(input).unwrap();
        assert_eq!(whole.len(), 3);
        for split in 0..=input.len() {
            let mut p = Parser::new();
            let mut buf = BytesMut::from(&input[..split]);
            let mut out = Vec::new();
            while let Some(a) = p.next(&mut buf, &Limits::default()).unwrap() {
                out.push(a.iter().map(|b| b.to_vec()).collect::<Vec<_>>());
            }
            buf.extend_from_slice(&input[split..]);
            while let Some(a) = p.next(&mut buf, &Limits::default()).unwrap() {
                out.push(a.iter().map(|b| b.to_vec()).collect());
            }
            assert_eq!(out, whole, "split at {split}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn byte_at_a_time() {
        let input: &[u8] = b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n";
        let mut p = Parser::new();
        let mut buf = BytesMut::new();
        let mut got = None;
        for &b in input {
            buf.extend_from_slice(&[b]);
            if let Some(a) = p.next(&mut buf, &Limits::default()).unwrap() {
                got = Some(a);
            }
        }
        assert_eq!(
            got.unwrap().to_vec(),
            vec![Bytes::from_static(b"ECHO"), Bytes::from_static(b"abc")]
        );
    }

    #[test]
    fn malformed_inputs_are_protocol_errors_with_redis_texts() {
        let cases: &[(&[u8], &str)] = &[
            (b"*abc\r\n", "invalid multibulk length"),
            (b"*2\r\n$x\r\n", "invalid bulk length"),
            (b"*1\r\n$-5\r\n", "invalid bulk length"),
            (b"*2\r\n+a\r\n", "expected '$', got '+'"),
            (b"set \"a b\r\n", "unbalanced quotes in request"),
            (b"set 'a\r\n", "unbalanced quotes in request"),
            (b"set \"a\"b\r\n", "unbalanced quotes in request"),
            (b"*1\r\n$3\r\nabcX\r\n", "bulk string is not terminated by CRLF"),
            (b"*+1\r\n", "invalid multibulk length"),
        ];
        for (input, msg) in cases {
            assert_eq!(parse_all(input), Err(ProtocolError(msg.to_string())), "{input:?}");
        }
    }

    #[test]
    fn huge_declared_lengths_are_refused_without_allocating() {
        let lim = Limits {
            max_bulk: 1 << 20,
            max_args: 1000,
            max_inline: 1024,
        };
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*1001\r\n"[..]);
        assert!(p.next(&mut buf, &lim).is_err());
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*1\r\n$1048577\r\n"[..]);
        assert_eq!(p.next(&mut buf, &lim), Err(ProtocolError("invalid bulk length".into())));
        // A legal but huge declared bulk: nothing is reserved for it.
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*1\r\n$1048576\r\nab"[..]);
        assert_eq!(p.next(&mut buf, &lim), Ok(None));
        assert!(buf.capacity() < 4096, "capacity {}", buf.capacity());
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*1000\r\n"[..]);
        assert_eq!(p.next(&mut buf, &lim), Ok(None));
        assert!(p.args.capacity() <= 64);
        // A header line that never ends.
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&[b'*'; 2000][..]);
        assert!(p.next(&mut buf, &lim).is_err());
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&[b'a'; 2000][..]);
        assert_eq!(
            p.next(&mut buf, &lim),
            Err(ProtocolError("too big inline request".into()))
        );
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*9223372036854775808\r\n"[..]);
        assert!(p.next(&mut buf, &lim).is_err());
    }

    #[test]
    fn inline_escapes() {
        assert_eq!(
            split_args(br#"set "a\x41\n" 'it\'s' plain"#).unwrap(),
            vec![b"set".to_vec(), b"aA\n".to_vec(), b"it's".to_vec(), b"plain".to_vec()]
        );
        assert_eq!(split_args(b"   ").unwrap(), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn encodings_per_protocol() {
        let r = Reply::Map(vec![
            (Reply::bulk("a"), Reply::Double(1.5)),
            (Reply::bulk("b"), Reply::Nil),
        ]);
        let mut b2 = BytesMut::new();
        r.encode(2, &mut b2);
        assert_eq!(&b2[..], b"*4\r\n$1\r\na\r\n$3\r\n1.5\r\n$1\r\nb\r\n$-1\r\n");
        let mut b3 = BytesMut::new();
        r.encode(3, &mut b3);
        assert_eq!(&b3[..], b"%2\r\n$1\r\na\r\n,1.5\r\n$1\r\nb\r\n_\r\n");
        let mut e = BytesMut::new();
        Reply::err("ERR a\r\nb").encode(2, &mut e);
        assert_eq!(&e[..], b"-ERR a  b\r\n");
    }

    proptest::proptest! {
        /// Random bytes never panic the parser; it either waits, yields
        /// requests, or reports a protocol error.
        #[test]
        fn fuzz_random_bytes(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let lim = Limits { max_bulk: 4096, max_args: 64, max_inline: 256 };
            let mut p = Parser::new();
            let mut buf = BytesMut::from(&data[..]);
            for _ in 0..1000 {
                match p.next(&mut buf, &lim) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// RESP-shaped random input, fed in random chunks, behaves the same as whole.
        #[test]
        fn fuzz_resp_shaped(args in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 1..6),
                            cut in 0usize..400) {
            let mut input = format!("*{}\r\n", args.len()).into_bytes();
            for a in &args {
                input.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                input.extend_from_slice(a);
                input.extend_from_slice(b"\r\n");
            }
            let cut = cut.min(input.len());
            let mut p = Parser::new();
            let mut buf = BytesMut::from(&input[..cut]);
            let mut got = p.next(&mut buf, &Limits::default()).unwrap();
            if got.is_none() {
                buf.extend_from_slice(&input[cut..]);
                got = p.next(&mut buf, &Limits::default()).unwrap();
            }
            let got: Vec<Vec<u8>> = got.unwrap().iter().map(|b| b.to_vec()).collect();
            proptest::prop_assert_eq!(got, args);
        }
    }
}
