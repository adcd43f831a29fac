//! Mirror nodes (AsymNVM §7): a primary back-end streams every
//! state-changing verb it runs to its mirrors, which repeat them on their
//! own pools, so a mirror's pool is a replica of the primary's (byte for
//! byte in every area but the epoch and replication words).
//!
//! A mirror subscribes over TCP to the primary's own port with a frame of
//! magic `ANVM` naming the primary epoch its pool copies and the last batch
//! it applied. The primary answers with the batches it sent since then, if
//! it still has them (same epoch, within its backlog), or else a full copy
//! of its pool. From then on each frame that changed state is one *batch*
//! `(seq, verbs, replies)`; the mirror applies it, checks it got the same
//! replies, persists its applied-batch word and acknowledges.
//!
//! Replication is synchronous: the primary answers a front-end's frame only
//! after every mirror has acknowledged the batch, so an acknowledged write is
//! durable on every mirror. A mirror that fails (times out, disconnects) is
//! dropped from the group and the primary goes on (AsymNVM §7 case 5); it
//! catches up when it subscribes again.
//!
//! Crash safety of a mirror: the applied-batch word carries [`DIRTY`] while
//! a batch or a copy is half applied; a mirror that restarts dirty (or whose
//! pool does not open) asks for a full copy.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nvstore::pmem::file::FileOptions;
use nvstore::pmem::{FileSpace, OpenMode, Space};
use parking_lot::Mutex;

use crate::backend::{set_repl_words, Backend, DIRTY, REPL_SEQ_OFF, REPL_SOURCE_OFF};
use crate::points as P;
use crate::transport::FrameHandler;
use crate::wire::{self, Reply, Request, Response, Status, Verb};
use crate::{Error, Result};

/// First 4 bytes of a mirror's subscribe frame.
pub const SUBSCRIBE_MAGIC: [u8; 4] = *b"ANVM";

const T_HELLO: u8 = 0;
const T_COPY_BEGIN: u8 = 1;
const T_CHUNK: u8 = 2;
const T_COPY_END: u8 = 3;
const T_BATCH: u8 = 4;
const T_ACK: u8 = 5;

/// Bytes per full-copy chunk.
const CHUNK: u64 = 1 << 20;
/// Batches the primary keeps for mirrors that resubscribe.
const BACKLOG_BYTES: usize = 64 << 20;
/// How long a primary waits for a mirror's acknowledgement before dropping it.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `frame` is a mirror's subscribe frame.
pub fn is_subscribe(frame: &[u8]) -> bool {
    frame.len() == 20 && frame[..4] == SUBSCRIBE_MAGIC
}

fn subscribe_frame(source: u64, seq: u64) -> Vec<u8> {
    let mut f = SUBSCRIBE_MAGIC.to_vec();
    f.extend_from_slice(&source.to_le_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

/// Writes one length-delimited message (4 big-endian length bytes).
fn send(s: &mut TcpStream, msg: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(msg.len() + 4);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    s.write_all(&out)
}

/// Reads one length-delimited message.
fn recv(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > wire::MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "replication frame too large",
        ));
    }
    let mut buf = vec![0; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

fn msg(tag: u8, words: &[u64], tail: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + words.len() * 8 + tail.len());
    m.push(tag);
    for w in words {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(tail);
    m
}

fn batch_msg(epoch: u64, seq: u64, j: Vec<(Verb, Reply)>) -> Vec<u8> {
    let (verbs, replies): (Vec<_>, Vec<_>) = j.into_iter().unzip();
    let req = wire::encode_request(&Request {
        epoch,
        client: 0,
        seq,
        verbs,
    });
    let resp = wire::encode_response(&Response {
        status: Status::Ok,
        epoch,
        client: 0,
        seq,
        replies,
    });
    let mut m = msg(T_BATCH, &[seq, req.len() as u64], &req);
    m.extend_from_slice(&resp);
    m
}

fn bad(what: &str) -> Error {
    Error::Protocol(format!("replication: {what}"))
}

/// How a node answers front-ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves front-ends and streams its batches to its mirrors.
    Primary,
    /// Applies a primary's batches; refuses front-ends (stale).
    Mirror,
}

/// Whether a primary may still serve: its lease is held (set by the
/// cluster's keep-alive) and no newer epoch was seen.
#[derive(Debug)]
pub struct Lease {
    base: Instant,
    /// Milliseconds after `base` until which the lease is certainly held
    /// (`u64::MAX`: no lease, a stand-alone node).
    valid_until_ms: AtomicU64,
    fenced: AtomicBool,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(u64::MAX),
            fenced: AtomicBool::new(false),
        }
    }
}

impl Lease {
    /// The lease is held until `until`.
    pub fn renewed_until(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.valid_until_ms.store(ms, Ordering::SeqCst);
    }

    /// The node is deposed: it refuses every frame from now on.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Whether the node may serve now.
    pub fn holds(&self) -> bool {
        !self.is_fenced() && (self.base.elapsed().as_millis() as u64) < self.valid_until_ms.load(Ordering::SeqCst)
    }
}

/// How a primary waits for its mirrors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Replication {
    /// A frame is answered once every mirror has its batch durable.
    #[default]
    Sync,
    /// A frame is answered at once; `repl_mark` tells front-ends which
    /// operation logs every mirror has, and they keep the others.
    Async,
}

struct Link {
    peer: SocketAddr,
    /// Sync: the primary sends and waits on the stream itself.
    stream: Option<TcpStream>,
    /// Async: batches go to the link's sender thread.
    tx: Option<mpsc::Sender<(u64, Arc<Vec<u8>>)>>,
    /// Last batch the mirror acknowledged.
    acked: Arc<AtomicU64>,
    dead: Arc<AtomicBool>,
}

/// A back-end node on a pool file: a primary with mirrors, or a mirror.
pub struct Node {
    path: PathBuf,
    backend: Option<Backend<FileSpace>>,
    role: Role,
    mirrors: Vec<Link>,
    /// Batches sent in this epoch, for mirrors that resubscribe.
    backlog: VecDeque<(u64, Vec<u8>)>,
    backlog_bytes: usize,
    /// Last batch number (primary: sent; mirror: applied).
    seq: u64,
    /// Mirror: the primary epoch the pool copies.
    source: u64,
    /// Mirror: full copies received.
    copies: u64,
    mode: Replication,
    /// Primary: `(batch, op_next after it)`, to turn acknowledged batches
    /// into the "replicated up to" mark (async).
    marks: VecDeque<(u64, u64)>,
    lease: Arc<Lease>,
}

fn open_pool(path: &Path, size: Option<u64>) -> Result<FileSpace> {
    let mode = match size {
        Some(size) => OpenMode::Create { size },
        None => OpenMode::Open,
    };
    Ok(FileSpace::open(
        path,
        &FileOptions {
            mode,
            ..Default::default()
        },
    )?)
}

impl Node {
    /// A node in `role` with no mirrors, no backlog and synchronous replication.
    fn new(path: &Path, backend: Option<Backend<FileSpace>>, role: Role) -> Node {
        Node {
            path: path.to_path_buf(),
            backend,
            role,
            mirrors: Vec::new(),
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            seq: 0,
            source: 0,
            copies: 0,
            mode: Replication::Sync,
            marks: VecDeque::new(),
            lease: Arc::new(Lease::default()),
        }
    }

    /// A primary on an open back-end.
    pub fn primary(path: &Path, backend: Backend<FileSpace>) -> Node {
        let mut n = Node::new(path, Some(backend), Role::Primary);
        n.backend.as_mut().unwrap().set_journal(true);
        n
    }

    /// A mirror on `path`: opens the pool if it exists and is clean (a
    /// dirty or unreadable pool waits for a full copy).
    pub fn mirror(path: &Path) -> Node {
        let mut n = Node::new(path, None, Role::Mirror);
        if path.exists() {
            if let Ok(b) = open_pool(path, None).and_then(Backend::open) {
                let (source, seq) = b.repl_words();
                if seq & DIRTY == 0 {
                    n.source = source;
                    n.seq = seq;
                }
                n.backend = Some(b);
            }
        }
        n
    }

    /// Sets how the primary waits for its mirrors.
    pub fn with_replication(mut self, mode: Replication) -> Node {
        self.mode = mode;
        self
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn backend(&self) -> Option<&Backend<FileSpace>> {
        self.backend.as_ref()
    }

    /// The epoch the node serves (0 without a pool).
    pub fn epoch(&self) -> u64 {
        self.backend.as_ref().map_or(0, |b| b.epoch())
    }

    /// Mirror: whether the pool is a clean copy of a primary's.
    pub fn in_sync(&self) -> bool {
        self.role == Role::Mirror && self.backend.is_some() && self.source != 0
    }

    /// Mirror: `(source epoch, last applied batch)`.
    pub fn applied(&self) -> (u64, u64) {
        (self.source, self.seq)
    }

    /// Mirror: full copies received since the node started.
    pub fn copies(&self) -> u64 {
        self.copies
    }

    /// Mirrors currently in the group.
    pub fn mirror_count(&self) -> usize {
        self.mirrors.len()
    }

    pub fn lease(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    /// A mirror becomes primary at `epoch` (claimed in the cluster):
    /// durable before it serves.
    pub fn promote(&mut self, epoch: u64) -> Result<()> {
        let b = self
            .backend
            .as_mut()
            .ok_or_else(|| bad("a mirror without a pool cannot become primary"))?;
        b.raise_epoch(epoch);
        b.set_journal(true);
        self.role = Role::Primary;
        self.seq = 0;
        self.backlog.clear();
        self.backlog_bytes = 0;
        Ok(())
    }

    fn refuse(&self, frame: &[u8]) -> Vec<u8> {
        let (client, seq) = wire::decode_request(frame).map_or((0, 0), |r| (r.client, r.seq));
        wire::encode_response(&Response {
            status: Status::Stale,
            epoch: self.epoch(),
            client,
            seq,
            replies: vec![],
        })
    }

    /// Sends the batch of state-changing verbs the last frame ran to every
    /// mirror. Sync: waits for each acknowledgement and drops a mirror that
    /// fails. Async: hands it to each mirror's sender thread.
    fn replicate(&mut self, j: Vec<(Verb, Reply)>) {
        self.seq += 1;
        let m = Arc::new(batch_msg(self.epoch(), self.seq, j));
        let seq = self.seq;
        if let Some(b) = &self.backend {
            self.marks.push_back((seq, b.op_next()));
        }
        self.mirrors.retain_mut(|l| {
            let r = match (&mut l.stream, &l.tx) {
                (Some(st), _) => send(st, &m).and_then(|_| wait_ack(st, seq)).map_err(|e| e.to_string()),
                (None, Some(tx)) if !l.dead.load(Ordering::SeqCst) => {
                    tx.send((seq, m.clone())).map_err(|_| "sender gone".to_string())
                }
                _ => Err("sender failed".to_string()),
            };
            match r {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("nvstore backend: mirror {} dropped: {e}", l.peer);
                    false
                }
            }
        });
        self.backlog_bytes += m.len();
        self.backlog.push_back((seq, m.to_vec()));
        while self.backlog_bytes > BACKLOG_BYTES {
            let Some((_, old)) = self.backlog.pop_front() else {
                break;
            };
            self.backlog_bytes -= old.len();
        }
    }

    /// Async: operation logs below this are durable on every mirror.
    fn repl_mark(&mut self) -> Option<u64> {
        self.mirrors.retain(|l| !l.dead.load(Ordering::SeqCst));
        let low = self.mirrors.iter().map(|l| l.acked.load(Ordering::SeqCst)).min()?;
        while self.marks.len() > 1 && self.marks[1].0 <= low {
            self.marks.pop_front();
        }
        match self.marks.front() {
            Some(&(b, op_next)) if b <= low => Some(op_next),
            _ => Some(0),
        }
    }

    /// A mirror subscribed on `stream`: brings it up to date (backlog
    /// resend or full copy) and adds it to the group.
    fn attach(&mut self, sub: &[u8], mut stream: TcpStream) -> Result<()> {
        let Some(b) = self
            .backend
            .as_ref()
            .filter(|_| self.role == Role::Primary && self.lease.holds())
        else {
            return Err(bad("not a primary"));
        };
        let epoch = b.epoch();
        let (source, applied) = (word(sub, 4), word(sub, 12));
        let peer = stream.peer_addr()?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(ACK_TIMEOUT))?;
        send(&mut stream, &msg(T_HELLO, &[epoch, self.seq], &[]))?;
        let first = self.backlog.front().map_or(self.seq + 1, |(s, _)| *s);
        if source == epoch && applied & DIRTY == 0 && applied <= self.seq && applied + 1 >= first {
            for (s, m) in self.backlog.iter().filter(|(s, _)| *s > applied) {
                send(&mut stream, m)?;
                wait_ack(&mut stream, *s)?;
            }
            eprintln!(
                "nvstore backend: mirror {peer} resumed after batch {applied} ({} resent)",
                self.seq - applied
            );
        } else {
            let size = b.space().size();
            send(&mut stream, &msg(T_COPY_BEGIN, &[epoch, self.seq, size], &[]))?;
            let mut off = 0;
            let mut buf = vec![0u8; CHUNK as usize];
            while off < size {
                let n = CHUNK.min(size - off) as usize;
                b.space().read(off, &mut buf[..n]);
                send(&mut stream, &msg(T_CHUNK, &[off], &buf[..n]))?;
                off += n as u64;
            }
            send(&mut stream, &msg(T_COPY_END, &[], &[]))?;
            wait_ack(&mut stream, self.seq)?;
            eprintln!(
                "nvstore backend: mirror {peer} copied ({size} bytes, batch {})",
                self.seq
            );
        }
        let acked = Arc::new(AtomicU64::new(self.seq));
        let dead = Arc::new(AtomicBool::new(false));
        if self.marks.back().is_none_or(|m| m.0 < self.seq) {
            self.marks.push_back((self.seq, b.op_next()));
        }
        let (stream, tx) = match self.mode {
            Replication::Sync => (Some(stream), None),
            Replication::Async => {
                let (tx, rx) = mpsc::channel::<(u64, Arc<Vec<u8>>)>();
                let (a2, d2) = (acked.clone(), dead.clone());
                std::thread::spawn(move || {
                    for (seq, m) in rx {
                        if let Err(e) = send(&mut stream, &m).and_then(|_| wait_ack(&mut stream, seq)) {
                            eprintln!("nvstore backend: mirror {peer} dropped: {e}");
                            d2.store(true, Ordering::SeqCst);
                            return;
                        }
                        a2.store(seq, Ordering::SeqCst);
                    }
                });
                (None, Some(tx))
            }
        };
        self.mirrors.push(Link {
            peer,
            stream,
            tx,
            acked,
            dead,
        });
        Ok(())
    }
}

fn wait_ack(s: &mut TcpStream, seq: u64) -> io::Result<()> {
    let m = recv(s)?;
    if m.len() == 9 && m[0] == T_ACK && word(&m, 1) == seq {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidData, "bad acknowledgement"))
    }
}

impl FrameHandler for Node {
    fn handle_frame(&mut self, frame: &[u8]) -> Vec<u8> {
        if self.role != Role::Primary || !self.lease.holds() {
            return self.refuse(frame);
        }
        let mark = match self.mode {
            Replication::Sync => None,
            Replication::Async => self.repl_mark(),
        };
        let Some(b) = self.backend.as_mut() else {
            return self.refuse(frame);
        };
        b.set_repl_mark(mark);
        let resp = b.handle_frame(frame);
        let j = b.take_journal();
        if !j.is_empty() {
            self.replicate(j);
        }
        resp
    }

    fn attach_mirror(&mut self, subscribe: &[u8], stream: TcpStream) {
        let peer = stream.peer_addr().ok();
        if let Err(e) = self.attach(subscribe, stream) {
            eprintln!("nvstore backend: mirror {peer:?} refused: {e}");
        }
    }
}

/// Why [`follow`] returned.
#[derive(Debug)]
pub enum Stop {
    /// The node was promoted: it serves now.
    Promoted,
    /// The primary is gone or refused: `follow` may be called again.
    Lost(Error),
    /// The caller's stop flag was set.
    Stopped,
}

/// Mirror side: subscribes to the primary at `addr` and applies its
/// batches until the connection ends or the node is promoted. `on_sync` is
/// called once the pool is a clean copy (after the copy or the resend).
/// Setting `stop` ends it within 200 ms (the connection closes, and the
/// primary drops the mirror at its next batch).
pub fn follow(node: &Arc<Mutex<Node>>, addr: SocketAddr, stop: &AtomicBool, mut on_sync: impl FnMut(&Node)) -> Stop {
    match follow_inner(node, addr, stop, &mut on_sync) {
        Ok(true) => Stop::Promoted,
        Ok(false) => Stop::Stopped,
        Err(e) => Stop::Lost(e),
    }
}

fn follow_inner(
    node: &Arc<Mutex<Node>>,
    addr: SocketAddr,
    stop: &AtomicBool,
    on_sync: &mut dyn FnMut(&Node),
) -> Result<bool> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    let (source, seq) = node.lock().applied();
    send(&mut s, &subscribe_frame(source, seq))?;
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut copying: Option<(FileSpace, u64, u64)> = None;
    let mut announced = false;
    // The primary's epoch and last batch when it answered.
    let mut target: Option<(u64, u64)> = None;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let m = match recv(&mut s) {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if node.lock().role == Role::Primary {
                    return Ok(true);
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut n = node.lock();
        if n.role == Role::Primary {
            return Ok(true);
        }
        match m.first().copied() {
            Some(T_HELLO) if m.len() == 17 => {
                let epoch = word(&m, 1);
                // Fencing: never follow a primary older than the one copied.
                if epoch < n.source {
                    return Err(bad(&format!("primary epoch {epoch} is older than {}", n.source)));
                }
                target = Some((epoch, word(&m, 9)));
            }
            Some(T_COPY_BEGIN) if m.len() == 25 => {
                let (epoch, seq, size) = (word(&m, 1), word(&m, 9), word(&m, 17));
                let space = match n.backend.take() {
                    Some(b) if b.space().size() == size => b.into_space(),
                    other => {
                        drop(other);
                        let _ = std::fs::remove_file(&n.path);
                        open_pool(&n.path, Some(size))?
                    }
                };
                copy_begin(&space);
                n.source = 0;
                copying = Some((space, epoch, seq));
            }
            Some(T_CHUNK) if m.len() >= 9 => {
                let Some((space, ..)) = copying.as_ref() else {
                    return Err(bad("chunk outside a copy"));
                };
                copy_chunk(space, word(&m, 1), &m[9..])?;
            }
            Some(T_COPY_END) => {
                let Some((space, epoch, seq)) = copying.take() else {
                    return Err(bad("copy end outside a copy"));
                };
                copy_end(&space, epoch, seq);
                let b = Backend::open(space)?;
                n.backend = Some(b);
                n.source = epoch;
                n.seq = seq;
                n.copies += 1;
                send(&mut s, &msg(T_ACK, &[seq], &[]))?;
            }
            Some(T_BATCH) if m.len() >= 17 => {
                let seq = word(&m, 1);
                let rl = word(&m, 9) as usize;
                if m.len() < 17 + rl {
                    return Err(bad("short batch"));
                }
                let req = wire::decode_request(&m[17..17 + rl])?;
                let resp = wire::decode_response(&m[17 + rl..])?;
                if seq != n.seq + 1 || req.epoch != n.source || req.verbs.len() != resp.replies.len() {
                    return Err(bad(&format!("batch {seq} out of order after {}", n.seq)));
                }
                let source = n.source;
                let b = n.backend.as_mut().ok_or_else(|| bad("batch before a copy"))?;
                apply_batch(b, source, seq, &req.verbs, &resp.replies)?;
                n.seq = seq;
                send(&mut s, &msg(T_ACK, &[seq], &[]))?;
            }
            _ => return Err(bad("unexpected message")),
        }
        if !announced && n.backend.is_some() && target.is_some_and(|(e, t)| n.source == e && n.seq >= t) {
            announced = true;
            on_sync(&n);
        }
    }
}

/// Applies batch `seq` of the primary at epoch `source` to a mirror's
/// back-end: the applied-batch word is marked dirty (durably) first and
/// names `seq` (durably) once every verb is applied and durable, so a
/// crash leaves either a clean word whose batch is fully applied, or a dirty
/// one (the mirror then asks for a full copy).
pub fn apply_batch<S: Space>(
    b: &mut Backend<S>,
    source: u64,
    seq: u64,
    verbs: &[Verb],
    replies: &[Reply],
) -> Result<()> {
    if verbs.len() != replies.len() {
        return Err(bad("a batch needs one reply per verb"));
    }
    b.set_repl_words(source, seq | DIRTY);
    for (v, r) in verbs.iter().zip(replies) {
        b.apply_replicated(v, r)?;
    }
    b.set_repl_words(source, seq);
    Ok(())
}

/// Starts a full copy into `space`: dirty until [`copy_end`].
pub fn copy_begin<S: Space>(space: &S) {
    set_repl_words(space, space.load(REPL_SOURCE_OFF), DIRTY);
}

/// Writes one chunk of the primary's pool at `off` (the node's own
/// replication words excepted) and flushes it.
pub fn copy_chunk<S: Space>(space: &S, off: u64, data: &[u8]) -> Result<()> {
    if off.checked_add(data.len() as u64).is_none_or(|e| e > space.size()) {
        return Err(bad("chunk past the pool"));
    }
    for (a, b) in skip_range(off, data.len() as u64, REPL_SOURCE_OFF, REPL_SEQ_OFF + 8) {
        space.write(a, &data[(a - off) as usize..(b - off) as usize]);
        space.flush(a, b - a, P::MIRROR_COPY_FLUSH);
    }
    Ok(())
}

/// Ends a full copy of the primary at `epoch` as of batch `seq`: the copy
/// is durable before the words that make it clean.
pub fn copy_end<S: Space>(space: &S, epoch: u64, seq: u64) {
    space.fence(P::MIRROR_COPY_FENCE);
    set_repl_words(space, epoch, seq);
}

/// The pieces of `[off, off + len)` outside `[a, b)`.
fn skip_range(off: u64, len: u64, a: u64, b: u64) -> Vec<(u64, u64)> {
    let end = off + len;
    let mut out = Vec::new();
    if off < a.min(end) {
        out.push((off, a.min(end)));
    }
    if end > b.max(off) {
        out.push((b.max(off), end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::skip_range;

    #[test]
    fn skip_range_cuts_out_the_replication_words() {
        assert_eq!(skip_range(0, 100, 136, 152), vec![(0, 100)]);
        assert_eq!(skip_range(0, 200, 136, 152), vec![(0, 136), (152, 200)]);
        assert_eq!(skip_range(140, 8, 136, 152), vec![]);
        assert_eq!(skip_range(200, 8, 136, 152), vec![(200, 208)]);
    }
}
