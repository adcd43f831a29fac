//! The back-end: owns one pool through `pmem::Space`, knows no data
//! structure, and executes the verbs of AsymNVM Table 1.
//!
//! # Persistent layout (docs/asym-protocol.md, "Back-end pool")
//!
//! | offset | what |
//! |---|---|
//! | 0 | header (2 lines): magic, version, area offsets and sizes, CRC-32C |
//! | 128 | epoch word (bumped at every start) |
//! | 192, 256 | log state, two alternating copies `{gen, next_txid, op_applied, op_head_seq, op_head_pos, crc}` |
//! | `naming_off` | naming table: 64-byte entries `{value, name_len, name[39], crc}` |
//! | `bitmap_off` | allocator bitmap, one bit per slab |
//! | `op_off` | operation-log ring: entries `{seq, len, crc, payload}` aligned to 16 |
//! | `mem_off` | memory-log area: the latest transaction `{txid, len, crc, body}` |
//! | `data_off` | data area: `slabs` slabs of `slab` bytes |
//!
//! A `tx_write` is validated, written to the memory-log area and persisted
//! (from here it is durable and atomic: recovery replays a complete record,
//! ignores a torn one), then replayed into the data area and bitmap, then the
//! log state names the next transaction id and the operations it completes.
//! Replay is idempotent, so a crash anywhere in it replays again.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use nvstore::pmem::{FileSpace, OpenMode, Space};

use crate::points as P;
use crate::wire::{self, Code, HelloInfo, MemLog, Reply, Request, Response, Status, Verb};
use crate::{Error, Result};

const MAGIC: u64 = u64::from_le_bytes(*b"ASYMNVM1");
const LAYOUT_VERSION: u64 = 1;
const EPOCH_OFF: u64 = 128;
const STATE_OFF: [u64; 2] = [192, 256];
const NAMING_OFF: u64 = 320;
const ENTRY: u64 = 64;
const OP_HDR: u64 = 16;
const OP_WRAP: u32 = u32::MAX;
const TX_HDR: u64 = 24;
/// Replication words (not replicated: each node keeps its own). The epoch of
/// the primary a mirror copies, and the last replication batch it applied
/// (with [`DIRTY`] set while a batch or a full copy is being applied).
pub const REPL_SOURCE_OFF: u64 = 136;
pub const REPL_SEQ_OFF: u64 = 144;
/// Set in the applied-batch word while a batch or copy is half applied.
pub const DIRTY: u64 = 1 << 63;

/// Sizes of the back-end's areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Naming-table entries.
    pub naming_slots: u64,
    /// Operation-log ring bytes (multiple of 16).
    pub op_ring: u64,
    /// Memory-log area bytes (the largest transaction record).
    pub mem_area: u64,
    /// Slab bytes (multiple of 64).
    pub slab: u64,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            naming_slots: 256,
            op_ring: 4 << 20,
            mem_area: 8 << 20,
            slab: 4096,
        }
    }
}

impl Layout {
    /// The default layout with areas shrunk to fit a pool of `size` bytes
    /// (each log area at most an eighth of it).
    pub fn default_for(size: u64) -> Layout {
        let d = Layout::default();
        Layout {
            op_ring: d.op_ring.min(size / 8 / 16 * 16),
            mem_area: d.mem_area.min(size / 8),
            ..d
        }
    }

    /// A small layout for tests and the crash simulator.
    pub fn small() -> Layout {
        Layout {
            naming_slots: 16,
            op_ring: 2048,
            mem_area: 4096,
            slab: 256,
        }
    }
}

/// Where everything is, as read from (or written to) the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub naming_off: u64,
    pub naming_slots: u64,
    pub bitmap_off: u64,
    pub op_off: u64,
    pub op_len: u64,
    pub mem_off: u64,
    pub mem_len: u64,
    pub data_off: u64,
    pub slab: u64,
    pub slabs: u64,
}

const fn up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Geometry {
    fn plan(size: u64, l: Layout) -> Result<Geometry> {
        if !l.op_ring.is_multiple_of(OP_HDR)
            || !l.slab.is_multiple_of(64)
            || l.slab == 0
            || l.mem_area < 64
            || l.naming_slots == 0
        {
            return Err(Error::NotAPool(
                "layout: op ring must be a multiple of 16, slab of 64".into(),
            ));
        }
        let naming_off = NAMING_OFF;
        let bitmap_off = up(naming_off + l.naming_slots * ENTRY, 64);
        // Bitmap size depends on the slab count: plan with an upper bound.
        let max_slabs = size / l.slab;
        let op_off = up(bitmap_off + up(max_slabs.div_ceil(8), 8), 64);
        let mem_off = up(op_off + l.op_ring, 64);
        let data_off = up(mem_off + l.mem_area, 64);
        if data_off + l.slab > size {
            return Err(Error::NotAPool(format!(
                "pool of {size} bytes is too small for this layout"
            )));
        }
        Ok(Geometry {
            naming_off,
            naming_slots: l.naming_slots,
            bitmap_off,
            op_off,
            op_len: l.op_ring,
            mem_off,
            mem_len: l.mem_area,
            data_off,
            slab: l.slab,
            slabs: (size - data_off) / l.slab,
        })
    }

    fn words(&self) -> [u64; 10] {
        [
            self.naming_off,
            self.naming_slots,
            self.bitmap_off,
            self.op_off,
            self.op_len,
            self.mem_off,
            self.mem_len,
            self.data_off,
            self.slab,
            self.slabs,
        ]
    }

    /// One past the data area.
    pub fn data_end(&self) -> u64 {
        self.data_off + self.slabs * self.slab
    }
}

fn crc_words(words: &[u64]) -> u64 {
    let mut b = Vec::with_capacity(words.len() * 8);
    for w in words {
        b.extend_from_slice(&w.to_le_bytes());
    }
    crc32c::crc32c(&b) as u64 | 1 << 40
}

/// The log state record: which transaction comes next and how far the
/// operation log is covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct LogState {
    gen: u64,
    next_txid: u64,
    op_applied: u64,
    op_head_seq: u64,
    op_head_pos: u64,
}

impl LogState {
    fn words(&self) -> [u64; 5] {
        [
            self.gen,
            self.next_txid,
            self.op_applied,
            self.op_head_seq,
            self.op_head_pos,
        ]
    }
}

/// A live (not yet covered) operation log in the ring.
#[derive(Clone, Copy, Debug)]
struct OpEntry {
    seq: u64,
    pos: u64,
}

struct Session {
    last_seq: u64,
    last_response: Vec<u8>,
}

/// What recovery found when the back-end opened its pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// The pool was created now.
    pub created: bool,
    /// A complete transaction record was found unreplayed and replayed.
    pub replayed_tx: bool,
    /// Live operation logs (not covered by a replayed transaction).
    pub live_ops: u64,
    pub epoch: u64,
}

/// The back-end: a pool and the volatile indexes rebuilt from it at open.
pub struct Backend<S: Space> {
    space: S,
    geo: Geometry,
    epoch: u64,
    state: LogState,
    /// Live operation logs, oldest first.
    ops: VecDeque<OpEntry>,
    op_tail: u64,
    op_next: u64,
    names: HashMap<String, u64>,
    free_slots: Vec<u64>,
    /// Replay sequence number (AsymNVM §6.3): odd during a replay.
    sn: u64,
    alloc_hint: u64,
    free_slabs: u64,
    sessions: HashMap<u64, Session>,
    report: OpenReport,
    /// Successful state-changing verbs and their replies since the last
    /// [`Backend::take_journal`], when journaling (a primary with mirrors).
    journal: Option<Vec<(Verb, Reply)>>,
    /// The "replicated up to" mark a primary with asynchronous mirrors
    /// answers `repl_mark` with; `None`: every logged operation counts.
    repl_mark: Option<u64>,
}

impl Backend<FileSpace> {
    /// Opens the pool file at `path`, creating it with `size` bytes and
    /// `layout` when it does not exist.
    pub fn open_file(path: &Path, size: u64, layout: Layout) -> Result<Backend<FileSpace>> {
        let exists = path.exists();
        let mode = if exists {
            OpenMode::Open
        } else {
            OpenMode::Create { size }
        };
        let opts = nvstore::pmem::file::FileOptions {
            mode,
            ..Default::default()
        };
        let space = FileSpace::open(path, &opts)?;
        if exists {
            Backend::open(space)
        } else {
            Backend::create(space, layout)
        }
    }
}

impl<S: Space> Backend<S> {
    /// Formats `space` as an empty back-end pool and opens it.
    pub fn create(space: S, layout: Layout) -> Result<Backend<S>> {
        let geo = Geometry::plan(space.size(), layout)?;
        space.zero(0, geo.data_off);
        let mut words = vec![MAGIC, LAYOUT_VERSION];
        words.extend_from_slice(&geo.words());
        let crc = crc_words(&words);
        words.push(crc);
        for (i, w) in words.iter().enumerate() {
            space.store(i as u64 * 8, *w);
        }
        // Both log-state copies start valid at generation 0 and 1.
        let st = LogState {
            gen: 1,
            next_txid: 1,
            op_applied: 0,
            op_head_seq: 1,
            op_head_pos: 0,
        };
        write_state(&space, &st);
        space.persist(0, EPOCH_OFF, P::HEADER_FLUSH, P::HEADER_FENCE);
        space.flush(STATE_OFF[0], 128, P::HEADER_FLUSH);
        space.fence(P::HEADER_FENCE);
        // The epoch word makes it a pool: nothing is a pool before it is durable.
        space.publish(EPOCH_OFF, 1, P::EPOCH_FLUSH, P::EPOCH_FENCE);
        space.op_boundary();
        let mut b = Backend::open(space)?;
        b.report.created = true;
        Ok(b)
    }

    /// Opens a formatted pool and recovers it (AsymNVM §7, case 3): bumps
    /// the epoch, replays a complete unreplayed transaction, and rebuilds
    /// the operation-log tail, the naming index and the free-slab count.
    pub fn open(space: S) -> Result<Backend<S>> {
        if space.size() < NAMING_OFF {
            return Err(Error::NotAPool("pool too small".into()));
        }
        let words: Vec<u64> = (0..13).map(|i| space.load(i * 8)).collect();
        let epoch = space.load(EPOCH_OFF);
        if words[0] != MAGIC || epoch == 0 {
            return Err(Error::NotAPool(
                "not an AsymNVM back-end pool (bad magic or never completed)".into(),
            ));
        }
        if crc_words(&words[..12]) != words[12] || words[1] != LAYOUT_VERSION {
            return Err(Error::NotAPool("back-end pool header is corrupt".into()));
        }
        let w = &words[2..12];
        let geo = Geometry {
            naming_off: w[0],
            naming_slots: w[1],
            bitmap_off: w[2],
            op_off: w[3],
            op_len: w[4],
            mem_off: w[5],
            mem_len: w[6],
            data_off: w[7],
            slab: w[8],
            slabs: w[9],
        };
        if geo.data_end() > space.size() {
            return Err(Error::NotAPool("back-end pool is truncated".into()));
        }
        let state = read_state(&space).ok_or_else(|| Error::NotAPool("both log-state copies are corrupt".into()))?;
        let epoch = epoch + 1;
        space.publish(EPOCH_OFF, epoch, P::EPOCH_FLUSH, P::EPOCH_FENCE);
        let mut b = Backend {
            space,
            geo,
            epoch,
            state,
            ops: VecDeque::new(),
            op_tail: state.op_head_pos,
            op_next: state.op_head_seq,
            names: HashMap::new(),
            free_slots: Vec::new(),
            sn: 0,
            alloc_hint: 0,
            free_slabs: 0,
            sessions: HashMap::new(),
            report: OpenReport {
                epoch,
                ..Default::default()
            },
            journal: None,
            repl_mark: None,
        };
        b.scan_ops();
        if let Some((op_applied, logs)) = b.read_tx(state.next_txid) {
            b.replay(&logs);
            b.finish_tx(op_applied);
            b.report.replayed_tx = true;
        }
        b.report.live_ops = b.ops.len() as u64;
        b.load_names();
        b.free_slabs = (0..b.geo.slabs).filter(|&i| !b.bit(i)).count() as u64;
        b.space.op_boundary();
        Ok(b)
    }

    /// What recovery did at open.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    pub fn space(&self) -> &S {
        &self.space
    }

    pub fn into_space(self) -> S {
        self.space
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn free_slabs(&self) -> u64 {
        self.free_slabs
    }

    /// Last operation log covered by a replayed transaction.
    pub fn op_applied(&self) -> u64 {
        self.state.op_applied
    }

    /// Sequence number of the next operation log.
    pub fn op_next(&self) -> u64 {
        self.op_next
    }

    // ------------------------------------------------------------ frames

    /// Handles one request frame and returns the response frame: checks the
    /// checksum, the epoch and the session's sequence number, then runs the
    /// verbs in order. A retransmitted frame (the session's last sequence
    /// number) gets the same response again without running twice.
    pub fn handle_frame(&mut self, frame: &[u8]) -> Vec<u8> {
        let req = match wire::decode_request(frame) {
            Ok(r) => r,
            Err(_) => return self.status(Status::Torn, 0, 0),
        };
        let hello = matches!(req.verbs.first(), Some(Verb::Hello));
        let last = self.sessions.get(&req.client).map(|s| s.last_seq);
        if hello {
            if last.is_some_and(|l| req.seq <= l) {
                if last == Some(req.seq) {
                    return self.sessions[&req.client].last_response.clone();
                }
                return self.status(Status::Replayed, req.client, req.seq);
            }
        } else {
            if req.epoch != self.epoch {
                return self.status(Status::Stale, req.client, req.seq);
            }
            match last {
                None => return self.status(Status::NoSession, req.client, req.seq),
                Some(l) if req.seq == l => return self.sessions[&req.client].last_response.clone(),
                Some(l) if req.seq < l => return self.status(Status::Replayed, req.client, req.seq),
                Some(l) if req.seq > l + 1 => return self.status(Status::NoSession, req.client, req.seq),
                Some(_) => {}
            }
        }
        let resp = self.execute(&req);
        let bytes = wire::encode_response(&resp);
        self.sessions.insert(
            req.client,
            Session {
                last_seq: req.seq,
                last_response: bytes.clone(),
            },
        );
        bytes
    }

    fn status(&self, status: Status, client: u64, seq: u64) -> Vec<u8> {
        wire::encode_response(&Response {
            status,
            epoch: self.epoch,
            client,
            seq,
            replies: vec![],
        })
    }

    fn execute(&mut self, req: &Request) -> Response {
        let replies = req.verbs.iter().map(|v| self.verb(v)).collect();
        Response {
            status: Status::Ok,
            epoch: self.epoch,
            client: req.client,
            seq: req.seq,
            replies,
        }
    }

    /// Runs one verb.
    pub fn verb(&mut self, v: &Verb) -> Reply {
        let r = match v {
            Verb::Hello => Ok(Reply::Hello(HelloInfo {
                epoch: self.epoch,
                op_applied: self.state.op_applied,
                op_next: self.op_next,
                data_off: self.geo.data_off,
                data_len: self.geo.slabs * self.geo.slab,
                slab: self.geo.slab,
            })),
            Verb::Read { addr, len } => self.read(*addr, *len),
            Verb::Write { addr, data } => self.write(*addr, data),
            Verb::Cas { addr, old, new } => self.cas(*addr, *old, *new),
            Verb::OpLog { payload } => self.op_log(payload),
            Verb::OpLogRead { from, max } => Ok(self.op_log_read(*from, *max)),
            Verb::TxWrite { op_applied, logs } => self.tx_write(*op_applied, logs),
            Verb::Malloc { slabs } => self.malloc(*slabs),
            Verb::Free { addr, slabs } => self.free(*addr, *slabs),
            Verb::NameGet { name } => match self.names.get(name) {
                Some(&slot) => Ok(Reply::Word(self.space.load(slot))),
                None => Err((Code::NotFound, format!("no name {name:?}"))),
            },
            Verb::NameSet { name, value } => self.name_set(name, *value),
            Verb::NameCas { name, old, new } => self.name_cas(name, *old, *new),
            Verb::WriterLock { name, owner } => {
                if *owner == 0 {
                    return Reply::Err(Code::Invalid, "owner 0 is reserved for unlocked".into());
                }
                self.name_cas(name, 0, *owner).map(|r| match r {
                    Reply::Word(0) => Reply::Word(*owner),
                    Reply::Word(h) if h == *owner => Reply::Word(*owner),
                    Reply::Word(h) => Reply::Word(h),
                    other => other,
                })
            }
            Verb::WriterUnlock { name, owner } => match self.names.get(name) {
                Some(&slot) if self.space.load(slot) == *owner => {
                    self.space.publish(slot, 0, P::NAME_VALUE_FLUSH, P::NAME_VALUE_FENCE);
                    Ok(Reply::Ok)
                }
                _ => Err((Code::Locked, format!("{name:?} is not held by {owner}"))),
            },
            Verb::SeqRead => Ok(Reply::Word(self.sn)),
            Verb::ReplMark => Ok(Reply::Word(self.repl_mark.unwrap_or(self.op_next))),
        };
        self.space.op_boundary();
        let r = r.unwrap_or_else(|(c, m)| Reply::Err(c, m));
        if let Some(j) = self.journal.as_mut() {
            if changes_state(v) && !matches!(r, Reply::Err(..)) {
                j.push((v.clone(), r.clone()));
            }
        }
        r
    }

    // ------------------------------------------------------------ replication

    /// Sets the mark `repl_mark` answers (operation logs below it are on every mirror).
    pub fn set_repl_mark(&mut self, mark: Option<u64>) {
        self.repl_mark = mark;
    }

    /// Starts (or stops) recording state-changing verbs for mirrors.
    pub fn set_journal(&mut self, on: bool) {
        self.journal = on.then(Vec::new);
    }

    /// The state-changing verbs run since the last call, with their replies.
    pub fn take_journal(&mut self) -> Vec<(Verb, Reply)> {
        self.journal.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Applies a verb a primary ran (a mirror): the same verb on the same
    /// state gives the same reply, which is checked; `malloc` takes the
    /// primary's slabs rather than searching (its search hint is volatile).
    pub fn apply_replicated(&mut self, v: &Verb, expect: &Reply) -> Result<()> {
        let got = match (v, expect) {
            (Verb::Malloc { slabs }, Reply::Word(addr)) => self.malloc_at(*addr, *slabs),
            _ => self.verb(v),
        };
        if &got != expect {
            return Err(Error::Protocol(format!(
                "replica diverged: {v:?} answered {got:?}, the primary {expect:?}"
            )));
        }
        Ok(())
    }

    /// Marks the free slabs `first..first + n` allocated, durably (the
    /// bitmap's lines flushed and fenced), and moves the search hint past them.
    fn take_slabs(&mut self, first: u64, n: u64) {
        for j in first..first + n {
            self.set_bit(j, true);
        }
        self.flush_bits(first, n, P::BITMAP_FLUSH);
        self.space.fence(P::BITMAP_FENCE);
        self.free_slabs -= n;
        self.alloc_hint = first + n;
    }

    /// Takes `slabs` free slabs at `addr` (a mirror repeating a primary's malloc).
    fn malloc_at(&mut self, addr: u64, slabs: u32) -> Reply {
        let first = match self.slab_index(addr, slabs) {
            Ok(f) => f,
            Err((c, m)) => return Reply::Err(c, m),
        };
        let n = slabs as u64;
        if (first..first + n).any(|i| self.bit(i)) {
            return Reply::Err(Code::Invalid, format!("slabs at {addr} are already allocated"));
        }
        self.take_slabs(first, n);
        self.space.op_boundary();
        Reply::Word(addr)
    }

    /// Raises the epoch to `epoch` (a node that becomes primary takes the
    /// epoch it claimed in the cluster); durable when it returns. Every
    /// session of the lower epoch is then stale.
    pub fn raise_epoch(&mut self, epoch: u64) {
        if epoch > self.epoch {
            self.space.publish(EPOCH_OFF, epoch, P::EPOCH_FLUSH, P::EPOCH_FENCE);
            self.epoch = epoch;
            self.report.epoch = epoch;
            self.space.op_boundary();
        }
    }

    /// The replication words: the primary epoch this pool copies and the
    /// last batch applied (`DIRTY` set if one was left half applied).
    pub fn repl_words(&self) -> (u64, u64) {
        (self.space.load(REPL_SOURCE_OFF), self.space.load(REPL_SEQ_OFF))
    }

    /// Persists the replication words (a mirror, before and after each batch).
    pub fn set_repl_words(&self, source: u64, seq: u64) {
        set_repl_words(&self.space, source, seq);
    }

    // ------------------------------------------------------------ verbs

    fn in_data(&self, addr: u64, len: u64) -> Result<(), (Code, String)> {
        if addr < self.geo.data_off || addr.checked_add(len).is_none_or(|e| e > self.geo.data_end()) {
            return Err((Code::Bounds, format!("[{addr}, +{len}) is outside the data area")));
        }
        Ok(())
    }

    fn read(&self, addr: u64, len: u32) -> Result<Reply, (Code, String)> {
        self.in_data(addr, len as u64)?;
        let mut buf = vec![0; len as usize];
        self.space.read(addr, &mut buf);
        Ok(Reply::Data(buf))
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<Reply, (Code, String)> {
        self.in_data(addr, data.len() as u64)?;
        write_words(&self.space, addr, data);
        self.space
            .persist(addr, data.len() as u64, P::WRITE_FLUSH, P::WRITE_FENCE);
        Ok(Reply::Ok)
    }

    fn cas(&self, addr: u64, old: u64, new: u64) -> Result<Reply, (Code, String)> {
        self.in_data(addr, 8)?;
        if !addr.is_multiple_of(8) {
            return Err((Code::Invalid, "cas needs an 8-aligned address".into()));
        }
        let cur = self.space.load(addr);
        if cur == old {
            self.space.publish(addr, new, P::WRITE_FLUSH, P::WRITE_FENCE);
        }
        Ok(Reply::Word(cur))
    }

    /// Where an operation-log entry of `size` bytes goes, and whether a wrap
    /// marker is needed at the tail first; `None` when the ring is full.
    fn op_place(&self, size: u64) -> Option<(u64, bool)> {
        let len = self.geo.op_len;
        let t = self.op_tail;
        match self.ops.front().map(|e| e.pos) {
            None => {
                let t = if t == len { 0 } else { t };
                if t + size <= len {
                    Some((t, false))
                } else {
                    (size <= len).then_some((0, t != 0))
                }
            }
            // Live entries lie in [h, t): room after t, else from 0 up to h.
            Some(h) if h < t => {
                if t + size <= len {
                    Some((t, false))
                } else {
                    (size <= h).then_some((0, t < len))
                }
            }
            // Wrapped: live entries lie in [h, len) and [0, t).
            Some(h) => (t + size <= h).then_some((t, false)),
        }
    }

    fn op_log(&mut self, payload: &[u8]) -> Result<Reply, (Code, String)> {
        let size = up(OP_HDR + payload.len() as u64, OP_HDR);
        let Some((pos, wrap)) = self.op_place(size) else {
            return Err((
                Code::LogFull,
                "operation-log ring is full: commit a tx_write first".into(),
            ));
        };
        let seq = self.op_next;
        let base = self.geo.op_off;
        if wrap {
            let t = self.op_tail;
            self.space.write(base + t, &op_header(seq, OP_WRAP, &[]));
            self.space.flush(base + t, OP_HDR, P::OPLOG_FLUSH);
        }
        let mut rec = op_header(seq, payload.len() as u32, payload).to_vec();
        rec.extend_from_slice(payload);
        self.space.write(base + pos, &rec);
        self.space
            .persist(base + pos, rec.len() as u64, P::OPLOG_FLUSH, P::OPLOG_FENCE);
        self.ops.push_back(OpEntry { seq, pos });
        self.op_tail = pos + size;
        self.op_next += 1;
        Ok(Reply::Word(seq))
    }

    fn op_log_read(&self, from: u64, max: u32) -> Reply {
        let mut out = Vec::new();
        for e in self.ops.iter().filter(|e| e.seq >= from).take(max as usize) {
            let (_, _, payload) = self.op_at(e.pos).expect("live op entries stay valid");
            out.push((e.seq, payload));
        }
        Reply::OpLogs(out)
    }

    /// Reads the entry at ring position `pos`: `(seq, len, payload)` of a
    /// header whose checksum covers its payload; a wrap marker has len `OP_WRAP`.
    fn op_at(&self, pos: u64) -> Option<(u64, u32, Vec<u8>)> {
        if pos + OP_HDR > self.geo.op_len {
            return None;
        }
        let mut h = [0u8; OP_HDR as usize];
        self.space.read(self.geo.op_off + pos, &mut h);
        let seq = u64::from_le_bytes(h[..8].try_into().unwrap());
        let len = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let crc = u32::from_le_bytes(h[12..16].try_into().unwrap());
        let plen = if len == OP_WRAP { 0 } else { len as u64 };
        if pos + OP_HDR + plen > self.geo.op_len {
            return None;
        }
        let mut payload = vec![0; plen as usize];
        self.space.read(self.geo.op_off + pos + OP_HDR, &mut payload);
        if op_header(seq, len, &payload)[12..16] != crc.to_le_bytes() {
            return None;
        }
        Some((seq, len, payload))
    }

    /// Rebuilds the live operation logs from the ring, from the log state's head.
    fn scan_ops(&mut self) {
        let len = self.geo.op_len;
        let mut pos = self.state.op_head_pos;
        let mut seq = self.state.op_head_seq;
        let mut wrapped = false;
        loop {
            if pos == len {
                if wrapped {
                    break;
                }
                wrapped = true;
                pos = 0;
            }
            let Some((s, l, payload)) = self.op_at(pos) else { break };
            if s != seq {
                break;
            }
            if l == OP_WRAP {
                if wrapped {
                    break;
                }
                wrapped = true;
                pos = 0;
                continue;
            }
            let size = up(OP_HDR + payload.len() as u64, OP_HDR);
            self.ops.push_back(OpEntry { seq, pos });
            pos += size;
            seq += 1;
        }
        self.op_tail = pos;
        self.op_next = seq;
    }

    fn tx_write(&mut self, op_applied: u64, logs: &[MemLog]) -> Result<Reply, (Code, String)> {
        // Validate everything before anything becomes durable.
        let mut bits = HashMap::new();
        for l in logs {
            match l {
                MemLog::Write { addr, data } => self.in_data(*addr, data.len() as u64)?,
                MemLog::Free { addr, slabs } => {
                    let first = self.slab_index(*addr, *slabs)?;
                    for i in first..first + *slabs as u64 {
                        if !self.bit(i) || bits.insert(i, ()).is_some() {
                            return Err((Code::Invalid, format!("slab {i} is not allocated")));
                        }
                    }
                }
            }
        }
        if op_applied != 0 && (op_applied < self.state.op_applied || op_applied >= self.op_next) {
            return Err((
                Code::Invalid,
                format!(
                    "op_applied {op_applied} outside [{}, {})",
                    self.state.op_applied, self.op_next
                ),
            ));
        }
        // The record names the operations it covers (unchanged for 0).
        let op_applied = if op_applied == 0 {
            self.state.op_applied
        } else {
            op_applied
        };
        let body = encode_tx(op_applied, logs);
        if TX_HDR + body.len() as u64 > self.geo.mem_len {
            return Err((
                Code::LogFull,
                format!("transaction of {} bytes exceeds the memory-log area", body.len()),
            ));
        }
        let txid = self.state.next_txid;
        let mut rec = Vec::with_capacity(TX_HDR as usize + body.len());
        rec.extend_from_slice(&txid.to_le_bytes());
        rec.extend_from_slice(&(body.len() as u64).to_le_bytes());
        rec.extend_from_slice(&tx_crc(txid, &body).to_le_bytes());
        rec.extend_from_slice(&body);
        self.space.write(self.geo.mem_off, &rec);
        self.space
            .persist(self.geo.mem_off, rec.len() as u64, P::TXLOG_FLUSH, P::TXLOG_FENCE);
        // Durable and atomic from here; replay, then move the log state on.
        self.replay(logs);
        self.finish_tx(op_applied);
        Ok(Reply::Word(txid))
    }

    /// Applies memory logs to the data area and bitmap (idempotent).
    fn replay(&mut self, logs: &[MemLog]) {
        self.sn += 1;
        for l in logs {
            match l {
                MemLog::Write { addr, data } => {
                    write_words(&self.space, *addr, data);
                    self.space.flush(*addr, data.len() as u64, P::REPLAY_FLUSH);
                }
                MemLog::Free { addr, slabs } => {
                    let first = (addr - self.geo.data_off) / self.geo.slab;
                    for i in first..first + *slabs as u64 {
                        if self.bit(i) {
                            self.free_slabs += 1;
                        }
                        self.set_bit(i, false);
                    }
                    self.flush_bits(first, *slabs as u64, P::REPLAY_FLUSH);
                }
            }
        }
        self.space.fence(P::REPLAY_FENCE);
        self.sn += 1;
    }

    /// Records that transaction `next_txid` is replayed and operation logs up
    /// to `op_applied` are covered; frees their ring space.
    fn finish_tx(&mut self, op_applied: u64) {
        while self.ops.front().is_some_and(|e| e.seq <= op_applied) {
            self.ops.pop_front();
        }
        let (head_seq, head_pos) = match self.ops.front() {
            Some(e) => (e.seq, e.pos),
            None => (self.op_next, self.op_tail),
        };
        let st = LogState {
            gen: self.state.gen + 1,
            next_txid: self.state.next_txid + 1,
            op_applied,
            op_head_seq: head_seq,
            op_head_pos: head_pos,
        };
        write_state(&self.space, &st);
        self.space
            .persist(STATE_OFF[(st.gen % 2) as usize], 64, P::STATE_FLUSH, P::STATE_FENCE);
        self.state = st;
    }

    /// The unreplayed transaction `txid` in the memory-log area, if complete.
    fn read_tx(&self, txid: u64) -> Option<(u64, Vec<MemLog>)> {
        let m = self.geo.mem_off;
        if self.space.load(m) != txid {
            return None;
        }
        let len = self.space.load(m + 8);
        if len > self.geo.mem_len - TX_HDR {
            return None;
        }
        let mut body = vec![0; len as usize];
        self.space.read(m + TX_HDR, &mut body);
        if self.space.load(m + 16) != tx_crc(txid, &body) {
            return None;
        }
        decode_tx(&body)
    }

    fn slab_index(&self, addr: u64, slabs: u32) -> Result<u64, (Code, String)> {
        let g = &self.geo;
        if slabs == 0 || addr < g.data_off || !(addr - g.data_off).is_multiple_of(g.slab) {
            return Err((Code::Invalid, format!("{addr} is not a slab address")));
        }
        let first = (addr - g.data_off) / g.slab;
        if first + slabs as u64 > g.slabs {
            return Err((Code::Bounds, "slab range past the data area".into()));
        }
        Ok(first)
    }

    fn bit(&self, i: u64) -> bool {
        self.space.load(self.geo.bitmap_off + i / 64 * 8) >> (i % 64) & 1 == 1
    }

    fn set_bit(&self, i: u64, on: bool) {
        let off = self.geo.bitmap_off + i / 64 * 8;
        let w = self.space.load(off);
        let nw = if on { w | 1 << (i % 64) } else { w & !(1 << (i % 64)) };
        if nw != w {
            self.space.store(off, nw);
        }
    }

    fn flush_bits(&self, first: u64, n: u64, p: nvstore::pmem::Point) {
        let a = self.geo.bitmap_off + first / 64 * 8;
        let b = self.geo.bitmap_off + (first + n - 1) / 64 * 8 + 8;
        self.space.flush(a, b - a, p);
    }

    fn malloc(&mut self, slabs: u32) -> Result<Reply, (Code, String)> {
        let n = slabs as u64;
        if n == 0 || n > self.free_slabs {
            return Err((
                Code::NoSpace,
                format!("{slabs} slabs requested, {} free", self.free_slabs),
            ));
        }
        // First fit, starting at the hint and wrapping once.
        let total = self.geo.slabs;
        let mut start = None;
        let mut run = 0;
        let mut i = self.alloc_hint;
        let mut scanned = 0;
        while scanned < total + n {
            if i >= total {
                i = 0;
                run = 0;
            }
            if self.bit(i) {
                run = 0;
            } else {
                run += 1;
                if run == n {
                    start = Some(i + 1 - n);
                    break;
                }
            }
            i += 1;
            scanned += 1;
        }
        let Some(first) = start else {
            return Err((Code::NoSpace, format!("no run of {slabs} free slabs")));
        };
        self.take_slabs(first, n);
        Ok(Reply::Word(self.geo.data_off + first * self.geo.slab))
    }

    fn free(&mut self, addr: u64, slabs: u32) -> Result<Reply, (Code, String)> {
        let first = self.slab_index(addr, slabs)?;
        for i in first..first + slabs as u64 {
            if !self.bit(i) {
                return Err((Code::Invalid, format!("slab {i} is not allocated")));
            }
        }
        for i in first..first + slabs as u64 {
            self.set_bit(i, false);
        }
        self.flush_bits(first, slabs as u64, P::BITMAP_FLUSH);
        self.space.fence(P::BITMAP_FENCE);
        self.free_slabs += slabs as u64;
        Ok(Reply::Ok)
    }

    /// Whether slab `i` is allocated (for checks).
    pub fn slab_allocated(&self, i: u64) -> bool {
        self.bit(i)
    }

    // ------------------------------------------------------------ naming

    fn load_names(&mut self) {
        for i in 0..self.geo.naming_slots {
            let off = self.geo.naming_off + i * ENTRY;
            match read_entry_name(&self.space, off) {
                Some(name) => {
                    self.names.insert(name, off);
                }
                None => self.free_slots.push(off),
            }
        }
        self.free_slots.reverse();
    }

    /// Creates entry `name` holding `value`: the value is durable before the
    /// name that publishes the entry, so a new entry appears whole or not at all.
    fn name_create(&mut self, name: &str, value: u64) -> Result<u64, (Code, String)> {
        if name.is_empty() || name.len() > wire::MAX_NAME {
            return Err((Code::Invalid, format!("names are 1 to {} bytes", wire::MAX_NAME)));
        }
        let Some(off) = self.free_slots.pop() else {
            return Err((Code::NoSpace, "naming table is full".into()));
        };
        self.space.store(off, value);
        self.space.persist(off, 8, P::NAME_VALUE_FLUSH, P::NAME_VALUE_FENCE);
        let mut e = [0u8; 48];
        e[0] = name.len() as u8;
        e[1..1 + name.len()].copy_from_slice(name.as_bytes());
        self.space.write(off + 8, &e);
        self.space.store(off + 56, entry_crc(&e[..40]));
        self.space
            .persist(off + 8, 56, P::NAME_ENTRY_FLUSH, P::NAME_ENTRY_FENCE);
        self.names.insert(name.to_string(), off);
        Ok(off)
    }

    fn name_set(&mut self, name: &str, value: u64) -> Result<Reply, (Code, String)> {
        match self.names.get(name) {
            Some(&slot) => self
                .space
                .publish(slot, value, P::NAME_VALUE_FLUSH, P::NAME_VALUE_FENCE),
            None => {
                self.name_create(name, value)?;
            }
        }
        Ok(Reply::Ok)
    }

    /// Compare-and-swap on a name's value; a missing name reads as 0.
    fn name_cas(&mut self, name: &str, old: u64, new: u64) -> Result<Reply, (Code, String)> {
        let Some(&slot) = self.names.get(name) else {
            if old == 0 && new != 0 {
                self.name_create(name, new)?;
            }
            return Ok(Reply::Word(0));
        };
        let cur = self.space.load(slot);
        if cur == old && cur != new {
            self.space.publish(slot, new, P::NAME_VALUE_FLUSH, P::NAME_VALUE_FENCE);
        }
        Ok(Reply::Word(cur))
    }

    /// Every name and its value (for checks and `stat`).
    pub fn names(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .names
            .iter()
            .map(|(n, &s)| (n.clone(), self.space.load(s)))
            .collect();
        v.sort();
        v
    }

    /// Reads data-area bytes directly (for checks).
    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.space.read(addr, &mut b);
        b
    }

    /// Live operation logs `(seq, payload)`, oldest first (for checks).
    pub fn live_ops(&self) -> Vec<(u64, Vec<u8>)> {
        match self.op_log_read(0, u32::MAX) {
            Reply::OpLogs(v) => v,
            _ => unreachable!(),
        }
    }
}

/// Whether a verb can change the pool (what a mirror must repeat).
fn changes_state(v: &Verb) -> bool {
    !matches!(
        v,
        Verb::Hello
            | Verb::Read { .. }
            | Verb::OpLogRead { .. }
            | Verb::NameGet { .. }
            | Verb::SeqRead
            | Verb::ReplMark
    )
}

/// Persists a node's replication words: the source epoch first, then the
/// applied-batch word (one atomic 8-byte store).
pub fn set_repl_words<S: Space>(s: &S, source: u64, seq: u64) {
    if s.load(REPL_SOURCE_OFF) != source {
        s.publish(REPL_SOURCE_OFF, source, P::MIRROR_SEQ_FLUSH, P::MIRROR_SEQ_FENCE);
    }
    s.publish(REPL_SEQ_OFF, seq, P::MIRROR_SEQ_FLUSH, P::MIRROR_SEQ_FENCE);
}

/// Writes `data` at `addr` with aligned 8-byte words as atomic stores where
/// possible, so replaying an 8-byte memory log is failure-atomic.
fn write_words<S: Space>(s: &S, addr: u64, data: &[u8]) {
    if addr.is_multiple_of(8) && data.len().is_multiple_of(8) {
        for (i, c) in data.chunks_exact(8).enumerate() {
            s.store(addr + i as u64 * 8, u64::from_le_bytes(c.try_into().unwrap()));
        }
    } else {
        s.write(addr, data);
    }
}

fn op_header(seq: u64, len: u32, payload: &[u8]) -> [u8; OP_HDR as usize] {
    let mut h = [0u8; OP_HDR as usize];
    h[..8].copy_from_slice(&seq.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    let mut c = crc32c::crc32c(&h[..12]);
    c = crc32c::crc32c_append(c, payload);
    h[12..16].copy_from_slice(&c.to_le_bytes());
    h
}

fn tx_crc(txid: u64, body: &[u8]) -> u64 {
    let c = crc32c::crc32c_append(crc32c::crc32c(&txid.to_le_bytes()), &(body.len() as u64).to_le_bytes());
    crc32c::crc32c_append(c, body) as u64 | 1 << 33
}

fn encode_tx(op_applied: u64, logs: &[MemLog]) -> Vec<u8> {
    let req = Request {
        epoch: 0,
        client: 0,
        seq: 0,
        verbs: vec![Verb::TxWrite {
            op_applied,
            logs: logs.to_vec(),
        }],
    };
    wire::encode_request(&req)
}

fn decode_tx(body: &[u8]) -> Option<(u64, Vec<MemLog>)> {
    match wire::decode_request(body).ok()?.verbs.pop()? {
        Verb::TxWrite { op_applied, logs } => Some((op_applied, logs)),
        _ => None,
    }
}

fn entry_crc(name_part: &[u8]) -> u64 {
    crc32c::crc32c(name_part) as u64 | 1 << 32
}

fn read_entry_name<S: Space>(s: &S, off: u64) -> Option<String> {
    let mut e = [0u8; 48];
    s.read(off + 8, &mut e);
    let crc = s.load(off + 56);
    if crc != entry_crc(&e[..40]) || e[0] == 0 || e[0] as usize > wire::MAX_NAME {
        return None;
    }
    String::from_utf8(e[1..1 + e[0] as usize].to_vec()).ok()
}

fn write_state<S: Space>(s: &S, st: &LogState) {
    let off = STATE_OFF[(st.gen % 2) as usize];
    let w = st.words();
    for (i, v) in w.iter().enumerate() {
        s.store(off + i as u64 * 8, *v);
    }
    s.store(off + 40, crc_words(&w));
}

fn read_state<S: Space>(s: &S) -> Option<LogState> {
    let mut best: Option<LogState> = None;
    for off in STATE_OFF {
        let w: Vec<u64> = (0..6).map(|i| s.load(off + i * 8)).collect();
        if crc_words(&w[..5]) != w[5] || STATE_OFF[(w[0] % 2) as usize] != off {
            continue;
        }
        let st = LogState {
            gen: w[0],
            next_txid: w[1],
            op_applied: w[2],
            op_head_seq: w[3],
            op_head_pos: w[4],
        };
        if best.is_none_or(|b| st.gen > b.gen) {
            best = Some(st);
        }
    }
    best
}
