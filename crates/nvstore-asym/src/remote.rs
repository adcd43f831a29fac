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
//!   round trip as the next operation log. After a crash the operation logs
//!   the last transaction does not cover are executed again, exactly once
//!   (AsymNVM §4.3, §7 case 2).
//!
//! Reads see the front-end's own writes: pending memory logs overlay what
//! the back-end returns, and cached objects are updated in place.
//!
//! The front-end half of the two-tier allocator (AsymNVM §5.2) carves
//! back-end slabs into blocks of one size class each, with free lists in
//! DRAM; blocks of a slab or more come from the back-end directly and are
//! freed by a memory log, atomically with the operation that frees them.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

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
    /// A batch older than this is sent with the next operation (or by `flush`).
    pub flush_after: Duration,
    /// Cache capacity in bytes (rc, rcb).
    pub cache_bytes: usize,
    /// Writer identity for the writer lock; a restarted writer uses the same one.
    pub owner: u64,
    /// Name of the writer lock in the naming space.
    pub lock: String,
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
    /// Sequence number the next operation log gets.
    op_next: u64,
    /// Last operation whose memory logs are pending or sent.
    op_covered: u64,
    /// Re-executing logged operation `seq` (recovery): no new log.
    replaying: Option<u64>,
    // Allocator: size class -> free blocks, and the slab being carved.
    free: HashMap<u64, Vec<u64>>,
    carving: HashMap<u64, (u64, u64)>,
}

/// Size classes are multiples of this.
const GRAIN: u64 = 16;

impl Remote {
    /// Connects over `t`, takes the writer lock (one round trip each).
    pub fn open(t: impl Transport + 'static, opts: RemoteOptions) -> Result<Remote> {
        let (client, hello) = Client::connect(t)?;
        let cache = Cache::new(if opts.mode.caches() { opts.cache_bytes } else { 0 }, 8);
        let mut r = Remote {
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
            replaying: None,
            free: HashMap::new(),
            carving: HashMap::new(),
        };
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

    pub fn mode(&self) -> Mode {
        self.opts.mode
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
        self.flush()?;
        let (name, owner) = (self.opts.lock.clone(), self.opts.owner);
        self.one(Verb::WriterUnlock { name, owner }, "writer_unlock")
            .map(|_| ())
    }

    fn one(&mut self, v: Verb, what: &'static str) -> Result<Reply> {
        let r = self
            .client
            .post(&[v])?
            .pop()
            .ok_or_else(|| Error::Protocol("no reply".into()))?;
        check(r, what)
    }

    // ------------------------------------------------------------ naming

    /// A name's value in the naming space (one round trip).
    pub fn name_get(&mut self, name: &str) -> Result<Option<u64>> {
        match self.client.post(&[Verb::NameGet { name: name.into() }])?.pop() {
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

    /// Reads several objects; all cache misses share one round trip.
    pub fn read_many(&mut self, objs: &[(u64, usize, u32)]) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(objs.len());
        let mut verbs = Vec::new();
        for &(addr, len, _) in objs {
            let hit = if self.opts.mode.caches() {
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
            let mut replies = self.client.post(&verbs)?.into_iter();
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
    pub fn begin(&mut self, op_log: &[u8]) {
        self.op = Some(op_log.to_vec());
    }

    /// Starts re-executing logged operation `seq` (recovery).
    pub fn begin_replay(&mut self, seq: u64) {
        self.op = None;
        self.replaying = Some(seq);
    }

    /// Writes `data` at `addr` as part of the current operation.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<()> {
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
        let op = self.op.take();
        match self.opts.mode {
            Mode::Naive => Ok(()),
            Mode::R | Mode::Rc => {
                if self.pending.is_empty() && self.pending_frees.is_empty() {
                    return Ok(());
                }
                let logs = self.take_logs();
                self.one(Verb::TxWrite { op_applied: 0, logs }, "tx_write").map(|_| ())
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
                let seq = self.op_next;
                let full = self.batch_ops >= self.opts.batch
                    || self.batch_since.is_some_and(|t| t.elapsed() >= self.opts.flush_after)
                    || self.pending_bytes as u64 * 2 > self.hello.data_len.min(4 << 20);
                let mut verbs = vec![Verb::OpLog {
                    payload: payload.clone(),
                }];
                if full {
                    verbs.push(Verb::TxWrite {
                        op_applied: seq,
                        logs: self.take_logs(),
                    });
                }
                let replies = self.client.post(&verbs)?;
                match &replies[0] {
                    Reply::Word(s) if *s == seq => {}
                    Reply::Err(Code::LogFull, _) if !full => {
                        // Ring full: commit the batch, then log again (two round trips).
                        self.op_covered = seq - 1;
                        self.flush_batch(seq - 1)?;
                        match self.one(Verb::OpLog { payload }, "op_log")? {
                            Reply::Word(s) if s == seq => {}
                            o => return Err(Error::Protocol(format!("op_log answered {o:?}, expected {seq}"))),
                        }
                        self.batch_ops = 1;
                        self.batch_since = Some(Instant::now());
                    }
                    o => return Err(Error::Protocol(format!("op_log answered {o:?}, expected {seq}"))),
                }
                if full {
                    check(replies[1].clone(), "tx_write")?;
                }
                self.op_next = seq + 1;
                self.op_covered = seq;
                Ok(())
            }
        }
    }

    fn flush_batch(&mut self, op_applied: u64) -> Result<()> {
        let logs = self.take_logs();
        self.one(Verb::TxWrite { op_applied, logs }, "tx_write").map(|_| ())
    }

    /// Sends pending memory logs now (rcb), one round trip if any.
    pub fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() && self.pending_frees.is_empty() && self.batch_ops == 0 {
            return Ok(());
        }
        let covered = if self.opts.mode == Mode::Rcb {
            self.op_covered
        } else {
            0
        };
        self.flush_batch(covered)
    }

    /// Operation logs not covered by a replayed transaction: a restarted
    /// writer re-executes them with `begin_replay` (AsymNVM §7, case 2).
    pub fn unapplied_ops(&mut self) -> Result<Vec<(u64, Vec<u8>)>> {
        let from = self.hello.op_applied + 1;
        match self.one(Verb::OpLogRead { from, max: u32::MAX }, "op_log_read")? {
            Reply::OpLogs(v) => Ok(v),
            o => Err(Error::Protocol(format!("op_log_read answered {o:?}"))),
        }
    }

    // ------------------------------------------------------------ allocator

    /// Allocates `len` bytes of remote memory.
    pub fn alloc(&mut self, len: u64) -> Result<u64> {
        let slab = self.hello.slab;
        if len > slab / 2 {
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
        let s = self.malloc(1)?;
        self.carving.insert(class, (s + class, s + slab));
        Ok(s)
    }

    fn malloc(&mut self, slabs: u32) -> Result<u64> {
        match self.one(Verb::Malloc { slabs }, "malloc")? {
            Reply::Word(a) => Ok(a),
            o => Err(Error::Protocol(format!("malloc answered {o:?}"))),
        }
    }

    /// Frees a block from [`Remote::alloc`] as part of the current operation.
    pub fn free(&mut self, addr: u64, len: u64) -> Result<()> {
        self.cache.remove(addr);
        let slab = self.hello.slab;
        if len > slab / 2 {
            let n = len.div_ceil(slab) as u32;
            if self.opts.mode == Mode::Naive {
                return self.one(Verb::Free { addr, slabs: n }, "free").map(|_| ());
            }
            self.pending_frees.push((addr, n));
            return Ok(());
        }
        let class = len.div_ceil(GRAIN).max(1) * GRAIN;
        self.free.entry(class).or_default().push(addr);
        Ok(())
    }
}

fn check(r: Reply, what: &'static str) -> Result<Reply> {
    match r {
        Reply::Err(code, msg) => Err(Error::Verb { verb: what, code, msg }),
        r => Ok(r),
    }
}
