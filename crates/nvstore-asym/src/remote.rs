//! The front-end: `Remote` runs data structures on a back-end's memory.
//!
//! Structures read and write remote addresses through it, wrapped in
//! operations (`begin` … `commit`). How the writes reach the back-end is the
//! [`Mode`] (AsymNVM Table 3):
//!
//! - **naive**: every read and every write is its own round trip (plain
//!   remote reads and writes, no log, no cache). A crash can leave an
//!   operation half done: it is the paper's unoptimised baseline.
//! - **r**: the writes of one operation are memory logs committed by one
//!   `tx_write` (atomic, durable, replayed by the back-end): one round trip
//!   per write operation, plus reads.
//! - **rc**: r, with the front-end cache serving reads.
//! - **rcb**: each write operation appends one operation log (one round
//!   trip, acknowledged when durable) and its memory logs join a batch,
//!   coalesced by address and sent with `tx_write` when `batch` operations
//!   have gathered or the batch is older than `flush_after`, in the same
//!   round trip as the next operation log, or by a [`FlushTimer`] when no
//!   operation follows. After a crash the operation logs
//!   the last transaction does not cover are executed again, exactly once
//!   (AsymNVM §4.3, §7 case 2).
//!
//! Reads see the front-end's own writes: pending memory logs overlay what
//! the back-end returns, and cached objects are updated in place.
//!
//! A front-end opened with [`Remote::open_reader`] is a reader: it takes no
//! lock, caches nothing and cannot write. Readers of structures updated in
//! place run their reads in [`Remote::read_locked`], the sequence-number
//! reader lock of AsymNVM §6.3 (Algorithm 2): every read round trip carries
//! a `seq_read` before and after its reads, so the check costs no extra
//! round trip; the section is run again if the number was odd or changed.
//! Readers of the multi-version structures run theirs in
//! [`Remote::read_versioned`] instead: no lock, but the section must end
//! within the reclamation delay (AsymNVM §6.2, "NVM Reclamation"): the
//! writer puts a block it replaced back into use only `reclaim_after` after
//! the version that dropped it reached the back-end.
//!
//! The front-end half of the two-tier allocator (AsymNVM §5.2) carves
//! back-end slabs into blocks of one size class each, with free lists in
//! DRAM (blocks up to half a slab from one slab, blocks up to four slabs
//! from a run of sixteen); larger blocks come from the back-end directly and are
//! freed by a memory log, atomically with the operation that frees them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cache::Cache;
use crate::transport::{Client, Counters, Transport};
use crate::wire::{Code, HelloInfo, MemLog, Reply, Verb};
use crate::{Error, Result};

/// How writes and reads reach the back-end (AsymNVM Table 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Naive,
    R,
    Rc,
    Rcb,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "naive" => Mode::Naive,
            "r" => Mode::R,
            "rc" => Mode::Rc,
            "rcb" => Mode::Rcb,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Naive => "naive",
            Mode::R => "r",
            Mode::Rc => "rc",
            Mode::Rcb => "rcb",
        }
    }

    fn caches(self) -> bool {
        matches!(self, Mode::Rc | Mode::Rcb)
    }
}

/// Front-end settings.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    pub mode: Mode,
    /// Operations per `tx_write` in rcb mode.
    pub batch: usize,
    /// A batch older than this is sent with the next operation (or by `flush`, or a [`FlushTimer`]).
    pub flush_after: Duration,
    /// Cache capacity in bytes (rc, rcb).
    pub cache_bytes: usize,
    /// Writer identity for the writer lock; a restarted writer uses the same one.
    pub owner: u64,
    /// Name of the writer lock in the naming space.
    pub lock: String,
    /// How long a block replaced by a multi-version structure stays out of
    /// use after its version was published; a versioned read section that
    /// lasts longer runs again (AsymNVM §6.2, `n` µs).
    pub reclaim_after: Duration,
    /// Attempts of a read section before it gives up with [`Error::Contended`].
    pub read_attempts: u32,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            mode: Mode::Rcb,
            batch: 1024,
            flush_after: Duration::from_millis(10),
            cache_bytes: 16 << 20,
            owner: 1,
            lock: "writer".into(),
            reclaim_after: Duration::from_millis(4),
            read_attempts: 10_000,
        }
    }
}

/// A front-end attached to one back-end as its single writer.
pub struct Remote {
    client: Client,
    hello: HelloInfo,
    opts: RemoteOptions,
    cache: Cache,
    /// Pending memory logs, non-overlapping, keyed by address.
    pending: BTreeMap<u64, Vec<u8>>,
    max_pending: u64,
    pending_bytes: usize,
    /// Large blocks freed by pending operations.
    pending_frees: Vec<(u64, u32)>,
    batch_ops: usize,
    batch_since: Option<Instant>,
    /// Operation log of the operation in progress (rcb).
    op: Option<Vec<u8>>,
    /// The operation in progress appended its log already, with this
    /// sequence number: it rode on the operation's first round trip.
    op_sent: Option<u64>,
    /// The operation in progress has written (memory logs or frees), so
    /// its log can no longer ride ahead of its writes.
    op_dirty: bool,
    /// A full batch `(op_applied, logs)` closed by an operation whose log
    /// was already sent: it rides first on the next round trip, whatever
    /// that carries.
    ready: Option<(u64, Vec<MemLog>)>,
    /// Operation logs that rode ahead on another verb's round trip.
    logs_ahead: u64,
    /// Round trips that carried a malloc and no operation log.
    alloc_trips: u64,
    /// Sequence number the next operation log gets.
    op_next: u64,
    /// Last operation whose memory logs are pending or sent.
    op_covered: u64,
    /// Re-executing logged operation `seq` (recovery): no new log.
    replaying: Option<u64>,
    // Allocator: size class -> free blocks, and the slab being carved.
    free: HashMap<u64, Vec<u64>>,
    carving: HashMap<u64, (u64, u64)>,
    /// Blocks allocated since the last transaction reached the back-end:
    /// no reader can see them yet, so they may be changed in place.
    fresh: HashSet<u64>,
    /// Blocks replaced by the operations not yet sent, and blocks replaced
    /// by sent versions with the time they were sent (oldest first).
    retire_pending: Vec<(u64, u64)>,
    retired: VecDeque<(Instant, u64, u64)>,
    reclaimed: u64,
    /// A reader: no lock, no cache, no writes.
    reader: bool,
    section: Option<Section>,
    read_retries: u64,
    /// Keep each operation log until the back-end's "replicated up to" mark
    /// passes it (a primary with asynchronous mirrors): `Some(logs)`.
    retained: Option<VecDeque<(u64, Vec<u8>)>>,
}

/// The read section in progress.
#[derive(Clone, Copy, Debug)]
enum Section {
    /// Sequence-number lock: the number the section's first read saw.
    Seq(Option<u64>),
    /// Versioned read: started then.
    Timed(Instant),
}

/// Size classes are multiples of this.
const GRAIN: u64 = 16;
/// Blocks of up to this many slabs are carved by the front-end (and freed
/// into its free lists); larger ones are the back-end's, one malloc each.
const CARVED_SLABS: u64 = 4;
/// Slabs a front-end takes at once to carve blocks larger than half a slab.
const CHUNK_SLABS: u64 = 16;

impl Remote {
    /// Connects over `t`, takes the writer lock (one round trip each).
    pub fn open(t: impl Transport + 'static, opts: RemoteOptions) -> Result<Remote> {
        let mut r = Self::connect(t, opts, false)?;
        let name = r.opts.lock.clone();
        let owner = r.opts.owner;
        match r.one(Verb::WriterLock { name, owner }, "writer_lock")? {
            Reply::Word(h) if h == owner => {}
            Reply::Word(h) => {
                return Err(Error::Verb {
                    verb: "writer_lock",
                    code: Code::Locked,
                    msg: format!("held by {h}"),
                })
            }
            o => return Err(Error::Protocol(format!("writer_lock answered {o:?}"))),
        }
        Ok(r)
    }

    /// Connects over `t` as a reader (one round trip): no writer lock, no
    /// cache (the writer changes what it would hold), no writes.
    pub fn open_reader(t: impl Transport + 'static, mut opts: RemoteOptions) -> Result<Remote> {
        opts.cache_bytes = 0;
        Self::connect(t, opts, true)
    }

    fn connect(t: impl Transport + 'static, opts: RemoteOptions, reader: bool) -> Result<Remote> {
        let (client, hello) = Client::connect(t)?;
        let cache = Cache::new(if opts.mode.caches() { opts.cache_bytes } else { 0 }, 8);
        Ok(Remote {
            client,
            op_next: hello.op_next,
            op_covered: hello.op_applied,
            hello,
            opts,
            cache,
            pending: BTreeMap::new(),
            max_pending: 0,
            pending_bytes: 0,
            pending_frees: Vec::new(),
            batch_ops: 0,
            batch_since: None,
            op: None,
            op_sent: None,
            op_dirty: false,
            ready: None,
            logs_ahead: 0,
            alloc_trips: 0,
            replaying: None,
            free: HashMap::new(),
            carving: HashMap::new(),
            fresh: HashSet::new(),
            retire_pending: Vec::new(),
            retired: VecDeque::new(),
            reclaimed: 0,
            reader,
            section: None,
            read_retries: 0,
            retained: None,
        })
    }

    /// Whether this front-end is a reader ([`Remote::open_reader`]).
    pub fn is_reader(&self) -> bool {
        self.reader
    }

    /// Operation logs that rode ahead on the round trip of one of their
    /// operation's reads or mallocs (rcb), instead of a round trip of their own.
    pub fn logs_ahead(&self) -> u64 {
        self.logs_ahead
    }

    /// Round trips spent on allocation alone: a malloc that carried no
    /// operation log (one that did costs its operation nothing more).
    pub fn alloc_trips(&self) -> u64 {
        self.alloc_trips
    }

    /// Read sections run again because a write overtook them.
    pub fn read_retries(&self) -> u64 {
        self.read_retries
    }

    fn refuse_reader(&self, what: &str) -> Result<()> {
        if self.reader {
            return Err(Error::Protocol(format!("a reader cannot {what}")));
        }
        Ok(())
    }

    pub fn mode(&self) -> Mode {
        self.opts.mode
    }

    /// Sequence number the next operation log gets: after a failover, an
    /// operation whose log would have had number `n` was logged if the new
    /// back-end's `op_next` is past `n`.
    pub fn op_next(&self) -> u64 {
        self.op_next
    }

    /// Keeps every operation log (rcb) until the back-end's "replicated up
    /// to" mark passes it: each operation-log frame also asks for the mark
    /// (`repl_mark`, no extra round trip). After a failover to a mirror that
    /// had not received them, [`Remote::retained_ops`] are run again.
    pub fn retain_ops(&mut self, on: bool) {
        self.retained = on.then(VecDeque::new);
    }

    /// Operation logs `(seq, payload)` not yet known to be on every mirror, oldest first.
    pub fn retained_ops(&self) -> Vec<(u64, Vec<u8>)> {
        self.retained.iter().flatten().cloned().collect()
    }

    pub fn hello(&self) -> &HelloInfo {
        &self.hello
    }

    pub fn counters(&self) -> &Counters {
        self.client.counters()
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Releases the writer lock after flushing (one or two round trips).
    pub fn close(mut self) -> Result<()> {
        if self.reader {
            return Ok(());
        }
        self.flush()?;
        let (name, owner) = (self.opts.lock.clone(), self.opts.owner);
        self.one(Verb::WriterUnlock { name, owner }, "writer_unlock")
            .map(|_| ())
    }

    fn one(&mut self, v: Verb, what: &'static str) -> Result<Reply> {
        let r = self
            .post(vec![v])?
            .pop()
            .ok_or_else(|| Error::Protocol("no reply".into()))?;
        check(r, what)
    }

    /// One round trip carrying `verbs`, preceded by what rides along
    /// (rcb): a batch that is ready ([`Remote::commit`]), then the current
    /// operation's log if it has not been sent and the operation has not
    /// written yet. So an operation's first round trip (typically the read
    /// of the leaf its cached upper levels led to) also makes it durable,
    /// and a write whose reads miss once costs one round trip in all
    /// (AsymNVM §4.3: the operation log first, before any memory log).
    /// Answers the replies to `verbs` only.
    fn post(&mut self, verbs: Vec<Verb>) -> Result<Vec<Reply>> {
        let ready = self.ready.take();
        let early = self.early_log();
        if ready.is_none() && early.is_none() {
            return self.client.post(&verbs);
        }
        let mut all = Vec::with_capacity(verbs.len() + 3);
        let had_ready = ready.is_some();
        if let Some((op_applied, logs)) = ready {
            all.push(Verb::TxWrite { op_applied, logs });
        }
        if let Some(payload) = &early {
            all.push(Verb::OpLog {
                payload: payload.clone(),
            });
            if self.retained.is_some() {
                all.push(Verb::ReplMark);
            }
        }
        let pre = all.len();
        all.extend(verbs);
        let mut replies = self.client.post(&all)?;
        if replies.len() != all.len() {
            return Err(Error::Protocol(format!(
                "{} replies to {} verbs",
                replies.len(),
                all.len()
            )));
        }
        let rest = replies.split_off(pre);
        let mut head = replies.into_iter();
        if had_ready {
            check(head.next().unwrap(), "tx_write")?;
            self.published();
        }
        if let Some(payload) = early {
            let seq = self.op_next;
            let answer = head.next().unwrap();
            if let Some(r) = self.retained.as_mut() {
                r.push_back((seq, payload.clone()));
                if let Some(Reply::Word(mark)) = head.next() {
                    while r.front().is_some_and(|(s, _)| *s < mark) {
                        r.pop_front();
                    }
                }
            }
            match answer {
                Reply::Word(s) if s == seq => {}
                Reply::Err(Code::LogFull, _) => {
                    // Ring full: commit the batch to free it, then log
                    // again (two more round trips). The operation has not
                    // written, so the batch holds earlier operations only.
                    let logs = self.take_logs();
                    let op_applied = self.op_covered;
                    let r = self.client.post(&[Verb::TxWrite { op_applied, logs }])?;
                    check(r.into_iter().next().unwrap_or(Reply::Ok), "tx_write")?;
                    self.published();
                    match self.client.post(&[Verb::OpLog { payload }])?.pop() {
                        Some(Reply::Word(s)) if s == seq => {}
                        o => return Err(Error::Protocol(format!("op_log answered {o:?}, expected {seq}"))),
                    }
                }
                o => return Err(Error::Protocol(format!("op_log answered {o:?}, expected {seq}"))),
            }
            self.op_sent = Some(seq);
            self.logs_ahead += 1;
        }
        Ok(rest)
    }

    /// The current operation's log, if it may ride on the next round trip.
    fn early_log(&self) -> Option<Vec<u8>> {
        if self.opts.mode != Mode::Rcb || self.op_sent.is_some() || self.op_dirty || self.replaying.is_some() {
            return None;
        }
        self.op.clone()
    }

    // ------------------------------------------------------------ naming

    /// A name's value in the naming space (one round trip).
    pub fn name_get(&mut self, name: &str) -> Result<Option<u64>> {
        match self.post(vec![Verb::NameGet { name: name.into() }])?.pop() {
            Some(Reply::Word(w)) => Ok(Some(w)),
            Some(Reply::Err(Code::NotFound, _)) => Ok(None),
            o => Err(Error::Protocol(format!("name_get answered {o:?}"))),
        }
    }

    /// Sets a name's value (one round trip, durable).
    pub fn name_set(&mut self, name: &str, value: u64) -> Result<()> {
        self.flush()?;
        self.one(
            Verb::NameSet {
                name: name.into(),
                value,
            },
            "name_set",
        )
        .map(|_| ())
    }

    // ------------------------------------------------------------ reads

    /// Reads `len` bytes at `addr`; `depth` is the object's level (0 = root)
    /// for level-aware caching. One round trip on a cache miss.
    pub fn read(&mut self, addr: u64, len: usize, depth: u32) -> Result<Vec<u8>> {
        Ok(self.read_many(&[(addr, len, depth)])?.pop().unwrap())
    }

    /// Runs `f` on the `len` bytes at `addr` (as [`Remote::read`]), on the
    /// cached copy itself when the cache holds them: a lookup that only
    /// routes through a node copies nothing.
    pub fn read_with<T>(&mut self, addr: u64, len: usize, depth: u32, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        if self.opts.mode.caches() {
            if let Some(b) = self.cache.get_ref(addr, len) {
                return Ok(f(b));
            }
        }
        // A miss: `read` looks the cache up again, which counts it once more
        // for the level limit's window, so take the read path without it.
        Ok(f(&self.read_uncached(addr, len, depth)?))
    }

    /// Reads several objects; all cache misses share one round trip.
    pub fn read_many(&mut self, objs: &[(u64, usize, u32)]) -> Result<Vec<Vec<u8>>> {
        self.read_objs(objs, true)
    }

    /// [`Remote::read`] after the cache was looked up and missed.
    fn read_uncached(&mut self, addr: u64, len: usize, depth: u32) -> Result<Vec<u8>> {
        Ok(self.read_objs(&[(addr, len, depth)], false)?.pop().unwrap())
    }

    /// Reads `objs`, looking them up in the cache first if `lookup`.
    fn read_objs(&mut self, objs: &[(u64, usize, u32)], lookup: bool) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(objs.len());
        let mut verbs = Vec::new();
        for &(addr, len, _) in objs {
            let hit = if lookup && self.opts.mode.caches() {
                self.cache.get(addr, len)
            } else {
                None
            };
            if hit.is_none() {
                verbs.push(Verb::Read { addr, len: len as u32 });
            }
            out.push(hit);
        }
        if !verbs.is_empty() {
            let guarded = matches!(self.section, Some(Section::Seq(_)));
            if let Some(Section::Timed(t0)) = self.section {
                if t0.elapsed() >= self.opts.reclaim_after {
                    return Err(Error::Retry);
                }
            }
            if guarded {
                verbs.insert(0, Verb::SeqRead);
                verbs.push(Verb::SeqRead);
            }
            let mut replies = self.post(verbs)?.into_iter();
            if guarded {
                let before = match replies.next() {
                    Some(Reply::Word(w)) => w,
                    o => return Err(Error::Protocol(format!("seq_read answered {o:?}"))),
                };
                let after = match replies.next_back() {
                    Some(Reply::Word(w)) => w,
                    o => return Err(Error::Protocol(format!("seq_read answered {o:?}"))),
                };
                let Some(Section::Seq(start)) = &mut self.section else {
                    unreachable!()
                };
                let start = *start.get_or_insert(before);
                // Odd: a replay is running; changed: one ran since the section began.
                if before % 2 == 1 || before != after || before != start {
                    return Err(Error::Retry);
                }
            }
            for (i, &(addr, len, depth)) in objs.iter().enumerate() {
                if out[i].is_some() {
                    continue;
                }
                let mut data = match check(replies.next().unwrap(), "read")? {
                    Reply::Data(d) if d.len() == len => d,
                    o => return Err(Error::Protocol(format!("read answered {o:?}"))),
                };
                self.overlay(addr, &mut data);
                if self.opts.mode.caches() {
                    self.cache.insert(addr, data.clone(), depth);
                }
                out[i] = Some(data);
            }
        }
        Ok(out.into_iter().map(Option::unwrap).collect())
    }

    /// Runs `f`, a sequence of reads, under the sequence-number reader lock
    /// (AsymNVM §6.3, Algorithm 2): `f` only ever sees data no replay changed
    /// between its first and last read, and runs again otherwise (at most
    /// `read_attempts` times). The check rides on `f`'s own round trips.
    pub fn read_locked<T>(&mut self, f: impl FnMut(&mut Remote) -> Result<T>) -> Result<T> {
        self.section_loop(|| Section::Seq(None), f)
    }

    /// Runs `f`, a sequence of reads of a multi-version structure, without a
    /// lock: it runs again if it lasted `reclaim_after` or longer, since the
    /// blocks of the version it started from may then be reused.
    pub fn read_versioned<T>(&mut self, f: impl FnMut(&mut Remote) -> Result<T>) -> Result<T> {
        self.section_loop(|| Section::Timed(Instant::now()), f)
    }

    fn section_loop<T>(
        &mut self,
        start: impl Fn() -> Section,
        mut f: impl FnMut(&mut Remote) -> Result<T>,
    ) -> Result<T> {
        let attempts = self.opts.read_attempts.max(1);
        for _ in 0..attempts {
            self.section = Some(start());
            let r = f(self);
            let s = self.section.take();
            let late = matches!(s, Some(Section::Timed(t0)) if t0.elapsed() >= self.opts.reclaim_after);
            match r {
                Err(Error::Retry) => {}
                // What a late versioned read saw may have been reused: whatever it found is discarded.
                _ if late => {}
                r => return r,
            }
            self.read_retries += 1;
            std::thread::yield_now();
        }
        Err(Error::Contended { attempts })
    }

    /// Patches `data` (read at `addr`) with pending memory logs.
    fn overlay(&self, addr: u64, data: &mut [u8]) {
        let end = addr + data.len() as u64;
        for (&k, v) in self.pending.range(addr.saturating_sub(self.max_pending)..end) {
            let kend = k + v.len() as u64;
            if kend <= addr {
                continue;
            }
            let (lo, hi) = (addr.max(k), end.min(kend));
            data[(lo - addr) as usize..(hi - addr) as usize].copy_from_slice(&v[(lo - k) as usize..(hi - k) as usize]);
        }
    }

    // ------------------------------------------------------------ operations

    /// Starts a write operation described by `op_log` (its operation log in rcb mode).
    /// An operation log is never empty: empty logs mark operations already
    /// applied (a full ring, [`Remote::commit`]).
    pub fn begin(&mut self, op_log: &[u8]) {
        debug_assert!(!op_log.is_empty(), "an operation log needs at least its opcode");
        let _ = self.abandon();
        self.op = Some(op_log.to_vec());
    }

    /// Starts re-executing logged operation `seq` (recovery).
    pub fn begin_replay(&mut self, seq: u64) {
        let _ = self.abandon();
        self.replaying = Some(seq);
    }

    /// Ends the operation in progress without committing it (it failed).
    /// If its log rode ahead on one of its reads, the log is durable: it
    /// counts as applied, so the next transaction covers it and it is never
    /// executed again; what the operation wrote so far stays pending, like
    /// the writes of a failed operation whose log was never sent.
    /// Answers whether its log had been sent (then [`Remote::flush`] sends
    /// the transaction that covers it).
    pub fn abandon(&mut self) -> bool {
        self.op = None;
        self.op_dirty = false;
        let Some(seq) = self.op_sent.take() else {
            return false;
        };
        self.op_next = seq + 1;
        self.op_covered = seq;
        self.batch_ops += 1;
        self.batch_since.get_or_insert_with(Instant::now);
        true
    }

    /// Writes `data` at `addr` as part of the current operation.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<()> {
        self.refuse_reader("write")?;
        if self.opts.mode == Mode::Naive {
            return self
                .one(
                    Verb::Write {
                        addr,
                        data: data.to_vec(),
                    },
                    "write",
                )
                .map(|_| ());
        }
        self.cache.write(addr, data);
        self.add_pending(addr, data);
        self.op_dirty = true;
        Ok(())
    }

    /// Rewrites the object at `addr`, whose bytes were `old`, as `new`,
    /// sending only the 8-byte words that differ: runs of changed words
    /// (joined across gaps of under [`DIFF_GAP`] bytes) become one memory
    /// log each, so a batch carries what an operation changed, not whole
    /// nodes. Naive mode writes the one span from the first changed word to
    /// the last (one round trip, as the whole object was).
    pub fn write_changes(&mut self, addr: u64, old: &[u8], new: &[u8]) -> Result<()> {
        if old.len() != new.len() {
            return self.write(addr, new);
        }
        let spans = changed_spans(old, new);
        if self.opts.mode == Mode::Naive {
            if let (Some(&(lo, _)), Some(&(_, hi))) = (spans.first(), spans.last()) {
                return self.write(addr + lo as u64, &new[lo..hi]);
            }
            return Ok(());
        }
        for (lo, hi) in spans {
            self.write(addr + lo as u64, &new[lo..hi])?;
        }
        Ok(())
    }

    /// Writes a new object and caches it at `depth`.
    pub fn write_new(&mut self, addr: u64, data: &[u8], depth: u32) -> Result<()> {
        self.write(addr, data)?;
        if self.opts.mode.caches() {
            self.cache.insert(addr, data.to_vec(), depth);
        }
        Ok(())
    }

    fn add_pending(&mut self, addr: u64, data: &[u8]) {
        let end = addr + data.len() as u64;
        let overlapping: Vec<u64> = self
            .pending
            .range(addr.saturating_sub(self.max_pending)..end)
            .filter(|(k, v)| **k + v.len() as u64 > addr)
            .map(|(k, _)| *k)
            .collect();
        if overlapping.is_empty() {
            self.pending_bytes += data.len();
            self.pending.insert(addr, data.to_vec());
            self.max_pending = self.max_pending.max(data.len() as u64);
            return;
        }
        // Merge into one span: older logs first, this write on top.
        let mut lo = addr;
        let mut hi = end;
        let old: Vec<(u64, Vec<u8>)> = overlapping
            .iter()
            .map(|k| {
                let v = self.pending.remove(k).unwrap();
                self.pending_bytes -= v.len();
                (*k, v)
            })
            .collect();
        for (k, v) in &old {
            lo = lo.min(*k);
            hi = hi.max(k + v.len() as u64);
        }
        let mut span = vec![0u8; (hi - lo) as usize];
        for (k, v) in &old {
            span[(k - lo) as usize..(k - lo) as usize + v.len()].copy_from_slice(v);
        }
        span[(addr - lo) as usize..(end - lo) as usize].copy_from_slice(data);
        self.max_pending = self.max_pending.max(span.len() as u64);
        self.pending_bytes += span.len();
        self.pending.insert(lo, span);
    }

    fn take_logs(&mut self) -> Vec<MemLog> {
        let mut logs: Vec<MemLog> = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(addr, data)| MemLog::Write { addr, data })
            .collect();
        logs.extend(
            self.pending_frees
                .drain(..)
                .map(|(addr, slabs)| MemLog::Free { addr, slabs }),
        );
        self.max_pending = 0;
        self.pending_bytes = 0;
        self.batch_ops = 0;
        self.batch_since = None;
        logs
    }

    /// Ends the current operation: acknowledged (durable) when this returns.
    pub fn commit(&mut self) -> Result<()> {
        self.refuse_reader("commit")?;
        let op = self.op.take();
        self.op_dirty = false;
        match self.opts.mode {
            Mode::Naive => {
                self.published();
                Ok(())
            }
            Mode::R | Mode::Rc => {
                if self.pending.is_empty() && self.pending_frees.is_empty() {
                    self.published();
                    return Ok(());
                }
                let logs = self.take_logs();
                self.one(Verb::TxWrite { op_applied: 0, logs }, "tx_write")?;
                self.published();
                Ok(())
            }
            Mode::Rcb => {
                self.batch_ops += 1;
                self.batch_since.get_or_insert_with(Instant::now);
                if let Some(seq) = self.replaying.take() {
                    self.op_covered = seq;
                    return Ok(());
                }
                let Some(payload) = op else {
                    return Err(Error::Protocol("commit without begin".into()));
                };
                let full = self.batch_ops >= self.opts.batch
                    || self.batch_since.is_some_and(|t| t.elapsed() >= self.opts.flush_after)
                    || self.pending_bytes as u64 * 2 > self.hello.data_len.min(4 << 20);
                if let Some(seq) = self.op_sent.take() {
                    // The log rode on one of the operation's reads: it is
                    // durable, and nothing is left to send now. A batch
                    // this operation fills goes first on the next round trip.
                    self.op_next = seq + 1;
                    self.op_covered = seq;
                    if full {
                        if let Some((applied, logs)) = self.ready.take() {
                            // Not reached: every round trip takes the ready batch along.
                            self.one(
                                Verb::TxWrite {
                                    op_applied: applied,
                                    logs,
                                },
                                "tx_write",
                            )?;
                            self.published();
                        }
                        let logs = self.take_logs();
                        self.ready = Some((seq, logs));
                        // What the batch publishes is no longer private to
                        // this front-end: later operations copy, not change in place.
                        self.fresh.clear();
                    }
                    return Ok(());
                }
                let seq = self.op_next;
                let kept = self.retained.is_some().then(|| payload.clone());
                let mut verbs = vec![Verb::OpLog { payload }];
                if full {
                    verbs.push(Verb::TxWrite {
                        op_applied: seq,
                        logs: self.take_logs(),
                    });
                }
                if kept.is_some() {
                    verbs.push(Verb::ReplMark);
                }
                let replies = self.post(verbs)?;
                if let (Some(p), Some(r)) = (kept, self.retained.as_mut()) {
                    r.push_back((seq, p));
                    if let Some(Reply::Word(mark)) = replies.last() {
                        while r.front().is_some_and(|(s, _)| s < mark) {
                            r.pop_front();
                        }
                    }
                }
                match &replies[0] {
                    Reply::Word(s) if *s == seq => {}
                    Reply::Err(Code::LogFull, _) if !full => {
                        // Ring full: commit the batch to free the ring (two
                        // more round trips). The batch already holds this
                        // operation's writes, so once it is durable the
                        // operation is applied: what takes its sequence
                        // number in the log is an empty, already-applied
                        // marker, never its payload, or a writer that dies
                        // before the next tx_write would have it
                        // re-executed on top of its own effects.
                        self.op_covered = seq - 1;
                        self.flush_batch(seq - 1)?;
                        match self.one(Verb::OpLog { payload: Vec::new() }, "op_log")? {
                            Reply::Word(s) if s == seq => {}
                            o => return Err(Error::Protocol(format!("op_log answered {o:?}, expected {seq}"))),
                        }
                    }
                    o => return Err(Error::Protocol(format!("op_log answered {o:?}, expected {seq}"))),
                }
                if full {
                    check(replies[1].clone(), "tx_write")?;
                    self.published();
                }
                self.op_next = seq + 1;
                self.op_covered = seq;
                Ok(())
            }
        }
    }

    fn flush_batch(&mut self, op_applied: u64) -> Result<()> {
        let logs = self.take_logs();
        self.one(Verb::TxWrite { op_applied, logs }, "tx_write")?;
        self.published();
        Ok(())
    }

    /// Everything written so far has reached the back-end: new blocks are
    /// visible from now on, and the blocks they replaced start their delay.
    fn published(&mut self) {
        self.fresh.clear();
        if !self.retire_pending.is_empty() {
            let now = Instant::now();
            for (addr, len) in self.retire_pending.drain(..) {
                self.retired.push_back((now, addr, len));
            }
        }
    }

    /// Sends pending memory logs now (rcb), one round trip if any.
    pub fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() && self.pending_frees.is_empty() && self.batch_ops == 0 {
            if self.ready.is_some() {
                // Only the ready batch: it goes alone.
                self.post(Vec::new())?;
            }
            // Everything written so far is on the back-end already.
            self.published();
            return Ok(());
        }
        let covered = if self.opts.mode == Mode::Rcb {
            self.op_covered
        } else {
            0
        };
        self.flush_batch(covered)
    }

    /// Sends the batch if it is older than `flush_after` (rcb; one round
    /// trip then, none otherwise). Never inside an operation. Answers
    /// whether it sent one.
    pub fn flush_if_due(&mut self) -> Result<bool> {
        if self.opts.mode != Mode::Rcb || self.op.is_some() || self.replaying.is_some() {
            return Ok(false);
        }
        if self.ready.is_some() {
            self.flush()?;
            return Ok(true);
        }
        match self.batch_since {
            Some(t) if t.elapsed() >= self.opts.flush_after => {
                self.flush()?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Operation logs not covered by a replayed transaction: a restarted
    /// writer re-executes them with `begin_replay` (AsymNVM §7, case 2).
    /// Empty logs are markers of operations already applied (see
    /// [`Remote::commit`] on a full ring) and are left out.
    pub fn unapplied_ops(&mut self) -> Result<Vec<(u64, Vec<u8>)>> {
        let from = self.hello.op_applied + 1;
        match self.one(Verb::OpLogRead { from, max: u32::MAX }, "op_log_read")? {
            Reply::OpLogs(v) => Ok(v.into_iter().filter(|(_, op)| !op.is_empty()).collect()),
            o => Err(Error::Protocol(format!("op_log_read answered {o:?}"))),
        }
    }

    // ------------------------------------------------------------ allocator

    /// Allocates `len` bytes of remote memory.
    pub fn alloc(&mut self, len: u64) -> Result<u64> {
        self.refuse_reader("allocate")?;
        self.reclaim()?;
        let a = self.alloc_block(len)?;
        self.fresh.insert(a);
        Ok(a)
    }

    /// Whether the block at `addr` was allocated since the last transaction
    /// reached the back-end (so no reader can reach it yet).
    pub fn is_fresh(&self, addr: u64) -> bool {
        self.fresh.contains(&addr)
    }

    /// Gives up a block that a new version replaced, as part of the current
    /// operation: readers of older versions may still read it, so it is
    /// reused only `reclaim_after` after this operation reached the
    /// back-end (at once if no reader could ever see it).
    pub fn retire(&mut self, addr: u64, len: u64) -> Result<()> {
        if self.fresh.remove(&addr) {
            return self.free(addr, len);
        }
        self.cache.remove(addr);
        self.retire_pending.push((addr, len));
        Ok(())
    }

    /// Blocks retired and not yet reused, and blocks reused so far.
    pub fn retired(&self) -> (usize, u64) {
        (self.retire_pending.len() + self.retired.len(), self.reclaimed)
    }

    /// Frees retired blocks whose delay has passed.
    fn reclaim(&mut self) -> Result<()> {
        while let Some(&(t, addr, len)) = self.retired.front() {
            if t.elapsed() < self.opts.reclaim_after {
                break;
            }
            self.retired.pop_front();
            self.reclaimed += 1;
            self.free(addr, len)?;
        }
        Ok(())
    }

    fn alloc_block(&mut self, len: u64) -> Result<u64> {
        let slab = self.hello.slab;
        if len > CARVED_SLABS * slab {
            let n = len.div_ceil(slab) as u32;
            return self.malloc(n);
        }
        let class = len.div_ceil(GRAIN).max(1) * GRAIN;
        if let Some(a) = self.free.get_mut(&class).and_then(Vec::pop) {
            return Ok(a);
        }
        let (cur, end) = self.carving.get(&class).copied().unwrap_or((0, 0));
        if cur + class <= end {
            self.carving.insert(class, (cur + class, end));
            return Ok(cur);
        }
        // Blocks up to half a slab are carved from one slab; larger ones
        // (a B+-tree leaf) from a run of slabs, so a malloc serves many.
        let n = if class <= slab / 2 { 1 } else { CHUNK_SLABS };
        let s = self.malloc(n as u32)?;
        self.carving.insert(class, (s + class, s + n * slab));
        Ok(s)
    }

    fn malloc(&mut self, slabs: u32) -> Result<u64> {
        let ahead = self.logs_ahead;
        let r = self.one(Verb::Malloc { slabs }, "malloc")?;
        if self.logs_ahead == ahead {
            self.alloc_trips += 1;
        }
        match r {
            Reply::Word(a) => Ok(a),
            o => Err(Error::Protocol(format!("malloc answered {o:?}"))),
        }
    }

    /// Frees a block from [`Remote::alloc`] as part of the current operation.
    pub fn free(&mut self, addr: u64, len: u64) -> Result<()> {
        self.cache.remove(addr);
        self.fresh.remove(&addr);
        let slab = self.hello.slab;
        if len > CARVED_SLABS * slab {
            let n = len.div_ceil(slab) as u32;
            if self.opts.mode == Mode::Naive {
                return self.one(Verb::Free { addr, slabs: n }, "free").map(|_| ());
            }
            self.pending_frees.push((addr, n));
            self.op_dirty = true;
            return Ok(());
        }
        let class = len.div_ceil(GRAIN).max(1) * GRAIN;
        self.free.entry(class).or_default().push(addr);
        Ok(())
    }
}

/// Changed words closer than this are sent in one memory log (a log's
/// own header is about this size).
pub const DIFF_GAP: usize = 32;

/// Byte ranges `[lo, hi)` of the 8-byte words in which `old` and `new`
/// (of equal length) differ, runs closer than [`DIFF_GAP`] joined.
pub fn changed_spans(old: &[u8], new: &[u8]) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < new.len() {
        let end = (i + 8).min(new.len());
        // Whole words compare as integers (no call per word).
        let differs = if end - i == 8 {
            u64::from_ne_bytes(old[i..end].try_into().unwrap()) != u64::from_ne_bytes(new[i..end].try_into().unwrap())
        } else {
            old[i..end] != new[i..end]
        };
        if differs {
            match spans.last_mut() {
                Some(last) if i - last.1 < DIFF_GAP => last.1 = end,
                _ => spans.push((i, end)),
            }
        }
        i = end;
    }
    spans
}

fn check(r: Reply, what: &'static str) -> Result<Reply> {
    match r {
        Reply::Err(code, msg) => Err(Error::Verb { verb: what, code, msg }),
        r => Ok(r),
    }
}

/// The background half of "flushed by count or timer" (rcb): a thread that
/// sends a front-end's batch once it is `flush_after` old even when no
/// further operation comes to carry it, so readers see an idle writer's
/// last operations. Stops (and joins its thread) when dropped.
pub struct FlushTimer {
    stop: Arc<AtomicBool>,
    flushes: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl FlushTimer {
    /// Starts checking `r` every half `flush_after`. The front-end is
    /// shared through a mutex; operations hold it from begin to commit,
    /// so a timed flush never splits one.
    pub fn start(r: Arc<Mutex<Remote>>) -> FlushTimer {
        let period = (r.lock().opts.flush_after / 2).max(Duration::from_micros(100));
        let stop = Arc::new(AtomicBool::new(false));
        let flushes = Arc::new(AtomicU64::new(0));
        let (s, f) = (stop.clone(), flushes.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                std::thread::sleep(period);
                match r.lock().flush_if_due() {
                    Ok(true) => {
                        f.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(false) => {}
                    // The link is gone: the writer meets the error on its next operation.
                    Err(_) => break,
                }
            }
        });
        FlushTimer {
            stop,
            flushes,
            handle: Some(handle),
        }
    }

    /// Batches the timer has sent.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Acquire)
    }
}

impl Drop for FlushTimer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{changed_spans, DIFF_GAP};

    #[test]
    fn changed_spans_cover_every_changed_word_and_join_close_ones() {
        let old = vec![0u8; 256];
        let mut new = old.clone();
        assert!(changed_spans(&old, &new).is_empty());
        new[3] = 1; // word 0
        new[8 + DIFF_GAP - 8] = 1; // word 4 (gap 24 bytes < DIFF_GAP): joined
        new[200] = 1; // word 25: its own span
        new[255] = 1; // last word
        assert_eq!(changed_spans(&old, &new), vec![(0, 40), (200, 208), (248, 256)]);
        // Every changed byte is inside a span, and applying the spans gives `new`.
        let mut patched = old.clone();
        for (lo, hi) in changed_spans(&old, &new) {
            patched[lo..hi].copy_from_slice(&new[lo..hi]);
        }
        assert_eq!(patched, new);
        // A length that is not a multiple of 8.
        let (a, mut b) = (vec![7u8; 13], vec![7u8; 13]);
        b[12] = 0;
        assert_eq!(changed_spans(&a, &b), vec![(8, 13)]);
    }
}
