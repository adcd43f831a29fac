//! The wire protocol between front-ends and a back-end (docs/asym-protocol.md).
//!
//! One request frame carries a list of [`Verb`]s and costs one round trip;
//! the back-end executes them in order and answers one response frame with a
//! [`Reply`] per verb. Every frame has a fixed header with an epoch and a
//! sequence number and ends with a CRC-32C of everything before it, so a torn
//! frame, a frame from before the back-end restarted (stale epoch) and a
//! replayed frame (old sequence number) are all recognised and rejected.
//!
//! All integers are little-endian. Frames travel length-delimited (a 4-byte
//! big-endian length before each frame on TCP); the length is not part of
//! the frame.

use crate::Error;

/// First four bytes of a request frame.
pub const REQ_MAGIC: u32 = u32::from_le_bytes(*b"ANVQ");
/// First four bytes of a response frame.
pub const RESP_MAGIC: u32 = u32::from_le_bytes(*b"ANVR");
/// Protocol version carried in every frame.
pub const VERSION: u16 = 1;
/// Header bytes: magic 4, version 2, status/flags 2, epoch 8, client 8, seq 8, verb count 4.
pub const HEADER: usize = 36;
/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 64 << 20;
/// Longest name in the naming space.
pub const MAX_NAME: usize = 39;

/// One memory log of a `tx_write`: the back-end applies it when it replays
/// the transaction (AsymNVM §4.2, Figure 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemLog {
    /// Write `data` at `addr` of the data area.
    Write { addr: u64, data: Vec<u8> },
    /// Return `slabs` slabs starting at `addr` to the back-end allocator, atomically with the rest.
    Free { addr: u64, slabs: u32 },
}

/// A request of the back-end's fixed API (AsymNVM Table 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verb {
    /// Opens a session (frame epoch may be 0): answers [`Reply::Hello`].
    Hello,
    /// Reads `len` bytes at `addr` (data area or naming table).
    Read { addr: u64, len: u32 },
    /// Writes `data` at `addr` of the data area, durable when answered (not atomic beyond 8-byte words).
    Write { addr: u64, data: Vec<u8> },
    /// 8-byte compare-and-swap in the data area, durable when answered; answers the previous word.
    Cas { addr: u64, old: u64, new: u64 },
    /// Appends one operation log; answers its sequence number once durable.
    OpLog { payload: Vec<u8> },
    /// Reads the operation logs with sequence numbers `>= from` still in the ring (at most `max`).
    OpLogRead { from: u64, max: u32 },
    /// A batch of memory logs, atomic and durable when answered, then replayed into the data area.
    /// `op_applied` (0: none) is the last operation log whose effects the batch completes.
    TxWrite { op_applied: u64, logs: Vec<MemLog> },
    /// Allocates `slabs` contiguous slabs; answers their address.
    Malloc { slabs: u32 },
    /// Frees `slabs` slabs at `addr`.
    Free { addr: u64, slabs: u32 },
    /// Looks up a name: answers its value word, or [`Reply::Err`] `NotFound`.
    NameGet { name: String },
    /// Creates or sets a name's value word.
    NameSet { name: String, value: u64 },
    /// Compare-and-swap on a name's value word (a missing name reads as 0 and is created on success).
    NameCas { name: String, old: u64, new: u64 },
    /// SWMR writer lock (AsymNVM §6.1): sets lock word `name` to `owner` if it is 0 or already `owner`.
    /// Answers the holder after the call (`owner` on success). The lock word is persistent.
    WriterLock { name: String, owner: u64 },
    /// Releases the writer lock if `owner` holds it.
    WriterUnlock { name: String, owner: u64 },
    /// Reads the replay sequence number (AsymNVM §6.3, Algorithm 2): odd while a replay runs.
    SeqRead,
    /// Reads the "replicated up to" mark: every operation log with a lower
    /// sequence number is durable on every mirror (docs/asym-protocol.md,
    /// "Replication and failover").
    ReplMark,
}

/// Verb kinds, for counters.
pub const VERB_KINDS: [&str; 16] = [
    "hello",
    "read",
    "write",
    "cas",
    "op_log",
    "op_log_read",
    "tx_write",
    "malloc",
    "free",
    "name_get",
    "name_set",
    "name_cas",
    "writer_lock",
    "writer_unlock",
    "seq_read",
    "repl_mark",
];

impl Verb {
    /// Index into [`VERB_KINDS`].
    pub fn kind(&self) -> usize {
        match self {
            Verb::Hello => 0,
            Verb::Read { .. } => 1,
            Verb::Write { .. } => 2,
            Verb::Cas { .. } => 3,
            Verb::OpLog { .. } => 4,
            Verb::OpLogRead { .. } => 5,
            Verb::TxWrite { .. } => 6,
            Verb::Malloc { .. } => 7,
            Verb::Free { .. } => 8,
            Verb::NameGet { .. } => 9,
            Verb::NameSet { .. } => 10,
            Verb::NameCas { .. } => 11,
            Verb::WriterLock { .. } => 12,
            Verb::WriterUnlock { .. } => 13,
            Verb::SeqRead => 14,
            Verb::ReplMark => 15,
        }
    }
}

/// Facts a session starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloInfo {
    /// Back-end epoch: bumped at every back-end start; requests must carry it.
    pub epoch: u64,
    /// Last operation log covered by a replayed transaction.
    pub op_applied: u64,
    /// Sequence number the next operation log will get.
    pub op_next: u64,
    /// Data area: first byte and length.
    pub data_off: u64,
    pub data_len: u64,
    /// Back-end allocation unit.
    pub slab: u64,
}

/// Per-verb error codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Code {
    /// Address range outside what the verb may touch.
    Bounds = 1,
    NotFound = 2,
    /// Out of slabs.
    NoSpace = 3,
    /// Operation-log ring or memory-log area full: flush a transaction first.
    LogFull = 4,
    /// Lock held by another owner, or unlock by a non-owner.
    Locked = 5,
    /// Malformed argument (e.g. a name too long, a misaligned word).
    Invalid = 6,
}

impl Code {
    fn from_u16(v: u16) -> Option<Code> {
        Some(match v {
            1 => Code::Bounds,
            2 => Code::NotFound,
            3 => Code::NoSpace,
            4 => Code::LogFull,
            5 => Code::Locked,
            6 => Code::Invalid,
            _ => return None,
        })
    }
}

/// The answer to one verb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok,
    Hello(HelloInfo),
    Data(Vec<u8>),
    /// A word: CAS previous value, a name's value, a lock holder, a sequence number, an address.
    Word(u64),
    OpLogs(Vec<(u64, Vec<u8>)>),
    Err(Code, String),
}

/// Whole-frame status of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    /// Verbs executed; one reply each.
    Ok = 0,
    /// The request failed its checksum or could not be parsed: nothing executed.
    Torn = 1,
    /// The request carried an epoch other than the back-end's: nothing executed.
    Stale = 2,
    /// The request's sequence number is older than the session's: nothing executed.
    Replayed = 3,
    /// Unknown session, or a sequence number that skips ahead: nothing executed.
    NoSession = 4,
}

impl Status {
    fn from_u16(v: u16) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::Torn,
            2 => Status::Stale,
            3 => Status::Replayed,
            4 => Status::NoSession,
            _ => return None,
        })
    }
}

/// A decoded request frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub epoch: u64,
    pub client: u64,
    pub seq: u64,
    pub verbs: Vec<Verb>,
}

/// A decoded response frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    /// The back-end's current epoch.
    pub epoch: u64,
    pub client: u64,
    /// The sequence number answered.
    pub seq: u64,
    pub replies: Vec<Reply>,
}

// ---------------------------------------------------------------- encoding

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn finish(mut self) -> Vec<u8> {
        let crc = crc32c::crc32c(&self.0);
        self.u32(crc);
        self.0
    }
}

struct R<'a> {
    b: &'a [u8],
    at: usize,
}

type Parse<T> = std::result::Result<T, ()>;

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Parse<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(());
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Parse<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Parse<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> Parse<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> Parse<String> {
        String::from_utf8(self.bytes()?).map_err(|_| ())
    }
}

/// Splits a frame into body and checked checksum.
fn checked(frame: &[u8], magic: u32) -> Parse<&[u8]> {
    if frame.len() < HEADER + 4 || frame.len() > MAX_FRAME {
        return Err(());
    }
    let (body, crc) = frame.split_at(frame.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
        return Err(());
    }
    if u32::from_le_bytes(body[..4].try_into().unwrap()) != magic {
        return Err(());
    }
    Ok(body)
}

fn put_verb(w: &mut W, v: &Verb) {
    w.u8(v.kind() as u8);
    match v {
        Verb::Hello | Verb::SeqRead | Verb::ReplMark => {}
        Verb::Read { addr, len } => {
            w.u64(*addr);
            w.u32(*len);
        }
        Verb::Write { addr, data } => {
            w.u64(*addr);
            w.bytes(data);
        }
        Verb::Cas { addr, old, new } => {
            w.u64(*addr);
            w.u64(*old);
            w.u64(*new);
        }
        Verb::OpLog { payload } => w.bytes(payload),
        Verb::OpLogRead { from, max } => {
            w.u64(*from);
            w.u32(*max);
        }
        Verb::TxWrite { op_applied, logs } => {
            w.u64(*op_applied);
            w.u32(logs.len() as u32);
            for l in logs {
                match l {
                    MemLog::Write { addr, data } => {
                        w.u8(0);
                        w.u64(*addr);
                        w.bytes(data);
                    }
                    MemLog::Free { addr, slabs } => {
                        w.u8(1);
                        w.u64(*addr);
                        w.u32(*slabs);
                    }
                }
            }
        }
        Verb::Malloc { slabs } => w.u32(*slabs),
        Verb::Free { addr, slabs } => {
            w.u64(*addr);
            w.u32(*slabs);
        }
        Verb::NameGet { name } => w.bytes(name.as_bytes()),
        Verb::NameSet { name, value } => {
            w.bytes(name.as_bytes());
            w.u64(*value);
        }
        Verb::NameCas { name, old, new } => {
            w.bytes(name.as_bytes());
            w.u64(*old);
            w.u64(*new);
        }
        Verb::WriterLock { name, owner } | Verb::WriterUnlock { name, owner } => {
            w.bytes(name.as_bytes());
            w.u64(*owner);
        }
    }
}

fn get_verb(r: &mut R) -> Parse<Verb> {
    Ok(match r.u8()? {
        0 => Verb::Hello,
        1 => Verb::Read {
            addr: r.u64()?,
            len: r.u32()?,
        },
        2 => Verb::Write {
            addr: r.u64()?,
            data: r.bytes()?,
        },
        3 => Verb::Cas {
            addr: r.u64()?,
            old: r.u64()?,
            new: r.u64()?,
        },
        4 => Verb::OpLog { payload: r.bytes()? },
        5 => Verb::OpLogRead {
            from: r.u64()?,
            max: r.u32()?,
        },
        6 => {
            let op_applied = r.u64()?;
            let n = r.u32()? as usize;
            let mut logs = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                logs.push(match r.u8()? {
                    0 => MemLog::Write {
                        addr: r.u64()?,
                        data: r.bytes()?,
                    },
                    1 => MemLog::Free {
                        addr: r.u64()?,
                        slabs: r.u32()?,
                    },
                    _ => return Err(()),
                });
            }
            Verb::TxWrite { op_applied, logs }
        }
        7 => Verb::Malloc { slabs: r.u32()? },
        8 => Verb::Free {
            addr: r.u64()?,
            slabs: r.u32()?,
        },
        9 => Verb::NameGet { name: r.string()? },
        10 => Verb::NameSet {
            name: r.string()?,
            value: r.u64()?,
        },
        11 => Verb::NameCas {
            name: r.string()?,
            old: r.u64()?,
            new: r.u64()?,
        },
        12 => Verb::WriterLock {
            name: r.string()?,
            owner: r.u64()?,
        },
        13 => Verb::WriterUnlock {
            name: r.string()?,
            owner: r.u64()?,
        },
        14 => Verb::SeqRead,
        15 => Verb::ReplMark,
        _ => return Err(()),
    })
}

fn put_reply(w: &mut W, rep: &Reply) {
    match rep {
        Reply::Ok => w.u8(0),
        Reply::Hello(h) => {
            w.u8(1);
            for v in [h.epoch, h.op_applied, h.op_next, h.data_off, h.data_len, h.slab] {
                w.u64(v);
            }
        }
        Reply::Data(d) => {
            w.u8(2);
            w.bytes(d);
        }
        Reply::Word(v) => {
            w.u8(3);
            w.u64(*v);
        }
        Reply::OpLogs(logs) => {
            w.u8(4);
            w.u32(logs.len() as u32);
            for (s, p) in logs {
                w.u64(*s);
                w.bytes(p);
            }
        }
        Reply::Err(c, m) => {
            w.u8(5);
            w.u16(*c as u16);
            w.bytes(m.as_bytes());
        }
    }
}

fn get_reply(r: &mut R) -> Parse<Reply> {
    Ok(match r.u8()? {
        0 => Reply::Ok,
        1 => Reply::Hello(HelloInfo {
            epoch: r.u64()?,
            op_applied: r.u64()?,
            op_next: r.u64()?,
            data_off: r.u64()?,
            data_len: r.u64()?,
            slab: r.u64()?,
        }),
        2 => Reply::Data(r.bytes()?),
        3 => Reply::Word(r.u64()?),
        4 => {
            let n = r.u32()? as usize;
            let mut v = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                v.push((r.u64()?, r.bytes()?));
            }
            Reply::OpLogs(v)
        }
        5 => {
            let c = Code::from_u16(r.u16()?).ok_or(())?;
            Reply::Err(c, r.string()?)
        }
        _ => return Err(()),
    })
}

/// Encodes a request frame.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(64));
    w.u32(REQ_MAGIC);
    w.u16(VERSION);
    w.u16(0);
    w.u64(req.epoch);
    w.u64(req.client);
    w.u64(req.seq);
    w.u32(req.verbs.len() as u32);
    for v in &req.verbs {
        put_verb(&mut w, v);
    }
    w.finish()
}

/// Decodes a request frame; `Err` for a torn, truncated or malformed one.
pub fn decode_request(frame: &[u8]) -> Result<Request, Error> {
    let body = checked(frame, REQ_MAGIC).map_err(|_| Error::Torn)?;
    let parse = || -> Parse<Request> {
        let mut r = R { b: body, at: 4 };
        if r.u16()? != VERSION {
            return Err(());
        }
        r.u16()?;
        let (epoch, client, seq) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.u32()? as usize;
        let mut verbs = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            verbs.push(get_verb(&mut r)?);
        }
        if r.at != body.len() {
            return Err(());
        }
        Ok(Request {
            epoch,
            client,
            seq,
            verbs,
        })
    };
    parse().map_err(|_| Error::Torn)
}

/// Encodes a response frame.
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(64));
    w.u32(RESP_MAGIC);
    w.u16(VERSION);
    w.u16(resp.status as u16);
    w.u64(resp.epoch);
    w.u64(resp.client);
    w.u64(resp.seq);
    w.u32(resp.replies.len() as u32);
    for r in &resp.replies {
        put_reply(&mut w, r);
    }
    w.finish()
}

/// Decodes a response frame; `Err` for a torn, truncated or malformed one.
pub fn decode_response(frame: &[u8]) -> Result<Response, Error> {
    let body = checked(frame, RESP_MAGIC).map_err(|_| Error::Torn)?;
    let parse = || -> Parse<Response> {
        let mut r = R { b: body, at: 4 };
        if r.u16()? != VERSION {
            return Err(());
        }
        let status = Status::from_u16(r.u16()?).ok_or(())?;
        let (epoch, client, seq) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.u32()? as usize;
        let mut replies = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            replies.push(get_reply(&mut r)?);
        }
        if r.at != body.len() {
            return Err(());
        }
        Ok(Response {
            status,
            epoch,
            client,
            seq,
            replies,
        })
    };
    parse().map_err(|_| Error::Torn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Request {
        Request {
            epoch: 7,
            client: 99,
            seq: 3,
            verbs: vec![
                Verb::Hello,
                Verb::Read { addr: 4096, len: 64 },
                Verb::Write {
                    addr: 8,
                    data: vec![1, 2, 3],
                },
                Verb::Cas {
                    addr: 16,
                    old: 1,
                    new: 2,
                },
                Verb::OpLog {
                    payload: b"insert k v".to_vec(),
                },
                Verb::OpLogRead { from: 5, max: 10 },
                Verb::TxWrite {
                    op_applied: 4,
                    logs: vec![
                        MemLog::Write {
                            addr: 64,
                            data: vec![9; 70],
                        },
                        MemLog::Free { addr: 8192, slabs: 2 },
                    ],
                },
                Verb::Malloc { slabs: 3 },
                Verb::Free { addr: 12288, slabs: 1 },
                Verb::NameGet { name: "root".into() },
                Verb::NameSet {
                    name: "root".into(),
                    value: 42,
                },
                Verb::NameCas {
                    name: "root".into(),
                    old: 42,
                    new: 43,
                },
                Verb::WriterLock {
                    name: "w".into(),
                    owner: 5,
                },
                Verb::WriterUnlock {
                    name: "w".into(),
                    owner: 5,
                },
                Verb::SeqRead,
                Verb::ReplMark,
            ],
        }
    }

    #[test]
    fn request_round_trips_and_every_kind_is_covered() {
        let req = sample();
        let kinds: std::collections::BTreeSet<usize> = req.verbs.iter().map(Verb::kind).collect();
        assert_eq!(kinds.len(), VERB_KINDS.len());
        let f = encode_request(&req);
        assert_eq!(decode_request(&f).unwrap(), req);
    }

    #[test]
    fn response_round_trips() {
        let resp = Response {
            status: Status::Ok,
            epoch: 2,
            client: 1,
            seq: 9,
            replies: vec![
                Reply::Ok,
                Reply::Hello(HelloInfo {
                    epoch: 2,
                    op_applied: 1,
                    op_next: 3,
                    data_off: 4,
                    data_len: 5,
                    slab: 6,
                }),
                Reply::Data(vec![1; 100]),
                Reply::Word(u64::MAX),
                Reply::OpLogs(vec![(1, vec![2]), (2, vec![])]),
                Reply::Err(Code::Locked, "held by 3".into()),
            ],
        };
        assert_eq!(decode_response(&encode_response(&resp)).unwrap(), resp);
    }

    #[test]
    fn every_torn_or_flipped_request_is_rejected() {
        let f = encode_request(&sample());
        for cut in 0..f.len() {
            assert!(decode_request(&f[..cut]).is_err(), "prefix of {cut} bytes accepted");
        }
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x10;
            assert!(decode_request(&g).is_err(), "bit flip at byte {i} accepted");
        }
        // A response frame is not a request.
        let resp = encode_response(&Response {
            status: Status::Ok,
            epoch: 1,
            client: 1,
            seq: 1,
            replies: vec![],
        });
        assert!(decode_request(&resp).is_err());
    }
}
