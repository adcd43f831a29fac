//! The NV-Tree over remote memory: [`RemoteSpace`] is an
//! [`nvstore::pmem::Space`] over a back-end's data area, so the unchanged
//! engine (`nvstore::Db`) runs on a back-end (AsymNVM §4–5; the NV-Tree
//! already keeps its inner nodes in DRAM, which is AsymNVM's "cache the
//! upper levels", so a warm lookup reads at most one leaf).
//!
//! - **Reads** are served from a page cache of [`SpaceOptions::page`]-byte
//!   pages (rc, rcb; a miss is one `read` round trip for every page a read
//!   lacks) or read from the back-end every time (naive, r). Reads see the
//!   front-end's own stores, sent or not.
//! - **Stores** go to the cache and to a dirty overlay of bytes stored but
//!   not yet sent; `flush` marks lines; `fence` moves the flushed dirty
//!   bytes into the front-end's memory logs ([`Remote::write`]). When those
//!   are sent is the mode:
//!   - **naive**: every fence sends them as one `tx_write` (atomic and
//!     durable). Batches are applied in order, so the back-end's pool is
//!     always the image after some fence with every line flushed before it
//!     persisted: a crash state the local crash simulator allows too.
//!   - **r**, **rc**: one `tx_write` per `Db` write operation, at its end
//!     (the state after the operation; the engine's fences inside it have
//!     nothing to order against a crash that keeps all or nothing).
//!   - **rcb**: each `Db` write operation appends its operation log (put or
//!     delete with its key and value: one round trip, durable when
//!     answered) and its memory logs join the batch that
//!     [`Remote::commit`] sends by count or age. After a front-end crash
//!     [`open_db`] re-executes the logged operations the last transaction
//!     does not cover, exactly once (AsymNVM §7, case 2): the pool holds
//!     the state after the last batched operation, and puts and deletes are
//!     functions of their arguments and the state before them.
//!
//!   A fence outside a logged operation (recovery's writes, clean close,
//!   write batches and transactions, which are not logged) sends at once.
//! - The pool is claimed at creation with one `malloc` of whole slabs (all
//!   of the data area unless [`SpaceOptions::size`] says less) and named
//!   [`SpaceOptions::name`]. It cannot grow.
//!
//! The `Space` interface reports no errors from loads and stores. A lost
//! back-end is reported by the operation's `Db` call where it can be (a
//! fence or the operation log), and the space refuses writes from then on
//! (a front-end that lost its back-end opens a new one and recovers); a
//! read that misses the cache then has no bytes to return and panics.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::ThreadId;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use nvstore::pmem::{FlushKind, MappingKind, Operation, Point, Space, LINE};
use nvstore::Db;

use crate::transport::{Counters, Transport};
use crate::{Error, Mode, Remote, RemoteOptions, Result};

/// How a front-end runs a `Db` on a back-end.
#[derive(Clone, Debug)]
pub struct SpaceOptions {
    /// Front-end settings: `mode`, `batch`, `flush_after`, `owner`, `lock`;
    /// `cache_bytes` is the page cache's capacity (rc, rcb).
    pub remote: RemoteOptions,
    /// Page size of the cache, a power of two, at least a line.
    pub page: u64,
    /// Name of the pool in the back-end's naming space (its start; its
    /// size is under `NAME.size`).
    pub name: String,
    /// Bytes of the data area a new pool claims (0: all of it), rounded up
    /// to whole slabs. An existing pool keeps its size.
    pub size: u64,
}

impl Default for SpaceOptions {
    fn default() -> Self {
        SpaceOptions {
            remote: RemoteOptions::default(),
            page: 4096,
            name: "nvtree".into(),
            size: 0,
        }
    }
}

/// Opcodes of the operation log of a remote `Db`.
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_UPDATE: u8 = 3;

/// The operation log of `op`: opcode, key length (u32), key, value.
pub fn encode_op(op: Operation<'_>) -> Vec<u8> {
    let (code, key, value): (u8, &[u8], &[u8]) = match op {
        Operation::Put { key, value } => (OP_PUT, key, value),
        Operation::Delete { key } => (OP_DELETE, key, &[]),
        Operation::Update { key, value } => (OP_UPDATE, key, value),
    };
    let mut o = Vec::with_capacity(5 + key.len() + value.len());
    o.push(code);
    o.extend_from_slice(&(key.len() as u32).to_le_bytes());
    o.extend_from_slice(key);
    o.extend_from_slice(value);
    o
}

/// The operation an [`encode_op`] log describes.
pub fn decode_op(b: &[u8]) -> Option<Operation<'_>> {
    let (&code, rest) = b.split_first()?;
    let klen = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let key = rest.get(4..4 + klen)?;
    let value = &rest[4 + klen..];
    match code {
        OP_PUT => Some(Operation::Put { key, value }),
        OP_DELETE if value.is_empty() => Some(Operation::Delete { key }),
        OP_UPDATE => Some(Operation::Update { key, value }),
        _ => None,
    }
}

/// Bytes stored in one line and not yet sent: `mask` bit `i` says byte `i` is.
#[derive(Clone, Copy)]
struct Dirty {
    data: [u8; LINE as usize],
    mask: u64,
}

/// Pages of the data area, replaced like the object cache (a random sample
/// of 32, the least recently used goes).
struct Pages {
    cap: usize,
    map: HashMap<u64, (Box<[u8]>, u64)>,
    keys: Vec<u64>,
    pos: HashMap<u64, usize>,
    tick: u64,
    rng: StdRng,
    hits: u64,
    misses: u64,
}

impl Pages {
    fn new(cap: usize) -> Pages {
        Pages {
            cap,
            map: HashMap::new(),
            keys: Vec::new(),
            pos: HashMap::new(),
            tick: 0,
            rng: StdRng::seed_from_u64(0x5eed),
            hits: 0,
            misses: 0,
        }
    }

    fn get(&mut self, p: u64) -> Option<&[u8]> {
        self.tick += 1;
        let tick = self.tick;
        match self.map.get_mut(&p) {
            Some((d, last)) => {
                *last = tick;
                self.hits += 1;
                Some(d)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    fn insert(&mut self, p: u64, data: Box<[u8]>) {
        if self.cap == 0 || self.map.contains_key(&p) {
            return;
        }
        while self.map.len() >= self.cap {
            let n = self.keys.len();
            let mut victim = self.keys[self.rng.gen_range(0..n)];
            for _ in 1..32.min(n) {
                let k = self.keys[self.rng.gen_range(0..n)];
                if self.map[&k].1 < self.map[&victim].1 {
                    victim = k;
                }
            }
            self.map.remove(&victim);
            let i = self.pos.remove(&victim).expect("indexed");
            self.keys.swap_remove(i);
            if i < self.keys.len() {
                self.pos.insert(self.keys[i], i);
            }
        }
        self.tick += 1;
        self.pos.insert(p, self.keys.len());
        self.keys.push(p);
        self.map.insert(p, (data, self.tick));
    }
}

struct State {
    remote: Option<Remote>,
    pages: Pages,
    dirty: BTreeMap<u64, Dirty>,
    /// Line ranges `[first, last]` flushed since the last fence.
    flushed: Vec<(u64, u64)>,
    /// Memory logs handed to the front-end and not yet sent.
    unsent: bool,
    /// The thread running a logged operation, if any.
    op_thread: Option<ThreadId>,
    /// Re-executing logged operation `seq`: the next logged operation is it.
    replay: Option<u64>,
    /// Why the space stopped (the back-end was lost).
    failed: Option<String>,
    /// Round trips that read (cache misses, or every read without a cache).
    read_trips: u64,
}

struct Inner {
    base: u64,
    len: u64,
    mode: Mode,
    page: u64,
    caches: bool,
    path: PathBuf,
    /// Serialises logged operations: one operation's memory logs at a time.
    ops: Mutex<()>,
    state: Mutex<State>,
}

/// A `Space` over an AsymNVM back-end's data area (module docs). Clones
/// share the same front-end.
#[derive(Clone)]
pub struct RemoteSpace {
    inner: Arc<Inner>,
}

/// What a remote space has done so far.
#[derive(Clone, Debug, Default)]
pub struct SpaceStats {
    pub counters: Counters,
    pub page_hits: u64,
    pub page_misses: u64,
    pub cached_pages: usize,
    /// Round trips spent reading (the rest carry writes and operation logs).
    pub read_trips: u64,
    /// Operation logs that rode on a read's round trip instead of their own.
    pub logs_ahead: u64,
}

impl State {
    fn remote(&mut self) -> &mut Remote {
        self.remote.as_mut().expect("remote space used after close")
    }

    fn fail(&mut self, e: &Error) -> nvstore::Error {
        let msg = format!("remote pool: back-end lost: {e}");
        self.failed.get_or_insert(msg.clone());
        self.dirty.clear();
        self.flushed.clear();
        nvstore::Error::Io {
            path: PathBuf::from("asym"),
            source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, msg),
        }
    }

    fn failed_error(&self) -> Option<nvstore::Error> {
        self.failed.as_ref().map(|m| nvstore::Error::Io {
            path: PathBuf::from("asym"),
            source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, m.clone()),
        })
    }
}

impl Inner {
    /// Copies `buf.len()` bytes at `off` (pool offset), as this front-end sees them.
    fn read_into(&self, s: &mut State, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        assert!(end <= self.len, "remote space: read [{off}, {end}) beyond {}", self.len);
        if buf.is_empty() {
            return;
        }
        if !self.caches {
            s.read_trips += 1;
            let got = match s.remote().read(self.base + off, buf.len(), 0) {
                Ok(d) => d,
                Err(e) => {
                    let e = s.fail(&e);
                    panic!("{e}");
                }
            };
            buf.copy_from_slice(&got);
            overlay(&s.dirty, off, buf);
            return;
        }
        let (first, last) = (off / self.page, (end - 1) / self.page);
        let mut missing = Vec::new();
        for p in first..=last {
            match s.pages.get(p) {
                Some(d) => copy_page(p * self.page, d, off, buf),
                None => missing.push(p),
            }
        }
        if missing.is_empty() {
            return;
        }
        s.read_trips += 1;
        let objs: Vec<(u64, usize, u32)> = missing
            .iter()
            .map(|p| {
                (
                    self.base + p * self.page,
                    self.page.min(self.len - p * self.page) as usize,
                    0,
                )
            })
            .collect();
        let got = match s.remote().read_many(&objs) {
            Ok(d) => d,
            Err(e) => {
                let e = s.fail(&e);
                panic!("{e}");
            }
        };
        for (p, mut d) in missing.into_iter().zip(got) {
            overlay(&s.dirty, p * self.page, &mut d);
            copy_page(p * self.page, &d, off, buf);
            s.pages.insert(p, d.into_boxed_slice());
        }
    }

    fn write_bytes(&self, s: &mut State, off: u64, data: &[u8]) {
        let end = off + data.len() as u64;
        assert!(
            end <= self.len,
            "remote space: write [{off}, {end}) beyond {}",
            self.len
        );
        if s.failed.is_some() || data.is_empty() {
            return;
        }
        if self.caches {
            for p in off / self.page..=(end - 1) / self.page {
                if let Some((d, _)) = s.pages.map.get_mut(&p) {
                    let po = p * self.page;
                    let (lo, hi) = (off.max(po), end.min(po + d.len() as u64));
                    d[(lo - po) as usize..(hi - po) as usize]
                        .copy_from_slice(&data[(lo - off) as usize..(hi - off) as usize]);
                }
            }
        }
        for l in off / LINE..=(end - 1) / LINE {
            let lo = (l * LINE).max(off);
            let hi = ((l + 1) * LINE).min(end);
            let e = s.dirty.entry(l).or_insert(Dirty {
                data: [0; LINE as usize],
                mask: 0,
            });
            let b = (lo - l * LINE) as usize;
            let n = (hi - lo) as usize;
            e.data[b..b + n].copy_from_slice(&data[(lo - off) as usize..(hi - off) as usize]);
            e.mask |= if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << b };
        }
    }

    fn hand_over(&self, s: &mut State, all: bool) {
        hand_over(self.base, s, all)
    }

    /// Sends the memory logs handed over so far as one `tx_write`.
    fn send(&self, s: &mut State) -> nvstore::Result<()> {
        if !s.unsent {
            return Ok(());
        }
        s.unsent = false;
        let r = match self.mode {
            Mode::Rcb => s.remote().flush(),
            _ => s.remote().commit(),
        };
        r.map_err(|e| s.fail(&e))
    }
}

/// Moves the dirty bytes of every flushed line (or of every line, `all`)
/// into the front-end's memory logs, contiguous bytes as one log.
fn hand_over(base: u64, s: &mut State, all: bool) {
    let lines: Vec<(u64, Dirty)> = if all {
        s.flushed.clear();
        std::mem::take(&mut s.dirty).into_iter().collect()
    } else {
        let mut v = Vec::new();
        let ranges = std::mem::take(&mut s.flushed);
        for (a, b) in ranges {
            let keys: Vec<u64> = s.dirty.range(a..=b).map(|(k, _)| *k).collect();
            for k in keys {
                v.push((k, s.dirty.remove(&k).unwrap()));
            }
        }
        v.sort_by_key(|(k, _)| *k);
        v
    };
    if lines.is_empty() {
        return;
    }
    let mut run: Option<(u64, Vec<u8>)> = None;
    let mut runs = Vec::new();
    for (l, d) in lines {
        for i in 0..LINE as usize {
            let addr = l * LINE + i as u64;
            if d.mask & (1 << i) == 0 {
                if let Some(r) = run.take() {
                    runs.push(r);
                }
                continue;
            }
            match &mut run {
                Some((start, bytes)) if *start + bytes.len() as u64 == addr => bytes.push(d.data[i]),
                _ => {
                    if let Some(r) = run.take() {
                        runs.push(r);
                    }
                    run = Some((addr, vec![d.data[i]]));
                }
            }
        }
    }
    runs.extend(run);
    for (addr, bytes) in runs {
        // Not naive mode: the write joins the pending memory logs, no round trip.
        s.remote()
            .write(base + addr, &bytes)
            .expect("a writer's memory log is local");
    }
    s.unsent = true;
}

/// Applies the dirty bytes overlapping `[off, off + buf.len())` to `buf`.
fn overlay(dirty: &BTreeMap<u64, Dirty>, off: u64, buf: &mut [u8]) {
    if dirty.is_empty() || buf.is_empty() {
        return;
    }
    let end = off + buf.len() as u64;
    for (&l, d) in dirty.range(off / LINE..=(end - 1) / LINE) {
        for i in 0..LINE {
            let a = l * LINE + i;
            if d.mask & (1 << i) != 0 && a >= off && a < end {
                buf[(a - off) as usize] = d.data[i as usize];
            }
        }
    }
}

/// Copies the part of page `data` (at `po`) that overlaps `[off, off + buf.len())`.
fn copy_page(po: u64, data: &[u8], off: u64, buf: &mut [u8]) {
    let end = off + buf.len() as u64;
    let (lo, hi) = (off.max(po), end.min(po + data.len() as u64));
    if lo < hi {
        buf[(lo - off) as usize..(hi - off) as usize].copy_from_slice(&data[(lo - po) as usize..(hi - po) as usize]);
    }
}

impl RemoteSpace {
    fn new(remote: Remote, base: u64, len: u64, opts: &SpaceOptions) -> RemoteSpace {
        let mode = opts.remote.mode;
        let caches = matches!(mode, Mode::Rc | Mode::Rcb);
        let page = opts.page.max(LINE).next_power_of_two();
        let pages = if caches {
            (opts.remote.cache_bytes as u64 / page).max(1) as usize
        } else {
            0
        };
        RemoteSpace {
            inner: Arc::new(Inner {
                base,
                len,
                mode,
                page,
                caches,
                path: PathBuf::from(format!("asym:{}", opts.name)),
                ops: Mutex::new(()),
                state: Mutex::new(State {
                    remote: Some(remote),
                    pages: Pages::new(pages),
                    dirty: BTreeMap::new(),
                    flushed: Vec::new(),
                    unsent: false,
                    op_thread: None,
                    replay: None,
                    failed: None,
                    read_trips: 0,
                }),
            }),
        }
    }

    /// Where the pool starts in the back-end's data area.
    pub fn base(&self) -> u64 {
        self.inner.base
    }

    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The name messages give the pool.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Round trips and cache figures so far.
    pub fn stats(&self) -> SpaceStats {
        let s = self.inner.state.lock();
        let counters = s.remote.as_ref().map(|r| r.counters().clone()).unwrap_or_default();
        let logs_ahead = s.remote.as_ref().map_or(0, |r| r.logs_ahead());
        SpaceStats {
            counters,
            page_hits: s.pages.hits,
            page_misses: s.pages.misses,
            cached_pages: s.pages.map.len(),
            read_trips: s.read_trips,
            logs_ahead,
        }
    }

    /// Why the space stopped, if it did (the back-end was lost).
    pub fn failure(&self) -> Option<String> {
        self.inner.state.lock().failed.clone()
    }

    /// Sends every byte stored so far, flushed or not, and every pending
    /// memory log (one round trip if there is any).
    pub fn send_all(&self) -> nvstore::Result<()> {
        let mut s = self.inner.state.lock();
        if let Some(e) = s.failed_error() {
            return Err(e);
        }
        self.inner.hand_over(&mut s, true);
        s.unsent = true;
        let r = s.remote().flush();
        s.unsent = false;
        r.map_err(|e| s.fail(&e))
    }

    /// Sends everything and releases the writer lock; the space is unusable
    /// afterwards. Called when the last `Db` using it has closed.
    pub fn close(&self) -> Result<()> {
        let mut s = self.inner.state.lock();
        if s.failed.is_some() {
            s.remote = None;
            return Ok(());
        }
        self.inner.hand_over(&mut s, true);
        match s.remote.take() {
            Some(r) => r.close(),
            None => Ok(()),
        }
    }

    /// Re-executes the logged operations the back-end's last transaction
    /// does not cover on `db` (which runs on this space), exactly once each,
    /// then sends them in one transaction that covers them. Answers how many.
    pub fn recover<S: Space>(&self, db: &Db<S>) -> Result<u64> {
        if self.inner.mode != Mode::Rcb {
            return Ok(0);
        }
        let ops = self.inner.state.lock().remote().unapplied_ops()?;
        for (seq, payload) in &ops {
            let op = decode_op(payload)
                .ok_or_else(|| Error::Protocol(format!("operation log {seq} is not a put, an update or a delete")))?;
            self.inner.state.lock().replay = Some(*seq);
            let done = match op {
                Operation::Put { key, value } => db.put(key, value),
                Operation::Update { key, value } => db.update(key, value).map(|_| ()),
                Operation::Delete { key } => db.delete(key).map(|_| ()),
            };
            // An operation's log rides on its first read, so an operation
            // that then failed (and was never acknowledged) may be logged:
            // it fails again here and is skipped, counted as applied. A
            // lost back-end fails the recovery.
            if let Err(e) = done {
                if self.failure().is_some() {
                    return Err(e.into());
                }
            }
        }
        self.send_all()?;
        Ok(ops.len() as u64)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let base = self.base;
        let s = self.state.get_mut();
        if s.failed.is_some() {
            return;
        }
        // Best effort: a front-end that goes away sends what it stored and
        // releases its writer lock (nothing waits on this for durability).
        hand_over(base, s, true);
        if let Some(r) = s.remote.take() {
            let _ = r.close();
        }
    }
}

impl Space for RemoteSpace {
    fn size(&self) -> u64 {
        self.inner.len
    }

    fn load(&self, off: u64) -> u64 {
        debug_assert!(off.is_multiple_of(8));
        let mut b = [0u8; 8];
        let mut s = self.inner.state.lock();
        self.inner.read_into(&mut s, off, &mut b);
        u64::from_le_bytes(b)
    }

    fn store(&self, off: u64, val: u64) {
        debug_assert!(off.is_multiple_of(8));
        let mut s = self.inner.state.lock();
        self.inner.write_bytes(&mut s, off, &val.to_le_bytes());
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        let mut s = self.inner.state.lock();
        self.inner.read_into(&mut s, off, buf);
    }

    fn write(&self, off: u64, data: &[u8]) {
        let mut s = self.inner.state.lock();
        self.inner.write_bytes(&mut s, off, data);
    }

    fn zero(&self, off: u64, len: u64) {
        let mut s = self.inner.state.lock();
        let z = [0u8; 4096];
        let mut at = off;
        while at < off + len {
            let n = (off + len - at).min(z.len() as u64);
            self.inner.write_bytes(&mut s, at, &z[..n as usize]);
            at += n;
        }
    }

    fn flush(&self, off: u64, len: u64, _point: Point) {
        if len == 0 {
            return;
        }
        let (a, b) = (off / LINE, (off + len - 1) / LINE);
        let mut s = self.inner.state.lock();
        match s.flushed.last_mut() {
            Some((x, y)) if a <= *y + 1 && b + 1 >= *x => {
                *x = (*x).min(a);
                *y = (*y).max(b);
            }
            _ => s.flushed.push((a, b)),
        }
    }

    fn fence(&self, _point: Point) {
        let mut s = self.inner.state.lock();
        if s.failed.is_some() {
            return;
        }
        self.inner.hand_over(&mut s, false);
        let in_op = s.op_thread == Some(std::thread::current().id());
        if self.inner.mode == Mode::Naive || !in_op {
            // The error, if any, is reported by the operation or by `writable`.
            let _ = self.inner.send(&mut s);
        }
    }

    fn grow(&self, new_size: u64) -> nvstore::Result<()> {
        if new_size <= self.inner.len {
            return Ok(());
        }
        Err(nvstore::Error::PoolFull {
            path: self.inner.path.clone(),
            size: self.inner.len,
            limit: self.inner.len,
        })
    }

    fn logged<R>(&self, op: Operation<'_>, f: impl FnOnce() -> nvstore::Result<R>) -> nvstore::Result<R> {
        let _serial = self.inner.ops.lock();
        let replay = {
            let mut s = self.inner.state.lock();
            if let Some(e) = s.failed_error() {
                return Err(e);
            }
            s.op_thread = Some(std::thread::current().id());
            let replay = s.replay.take();
            match replay {
                Some(seq) => s.remote().begin_replay(seq),
                None => s.remote().begin(&encode_op(op)),
            }
            replay
        };
        let out = f();
        let mut s = self.inner.state.lock();
        s.op_thread = None;
        if let Some(e) = s.failed_error() {
            return Err(e);
        }
        self.inner.hand_over(&mut s, false);
        if out.is_err() && replay.is_none() {
            // Not logged, or logged ahead (its log rode on one of its
            // reads) and now counted as applied: what the failed operation
            // persisted is sent like any write outside an operation, in a
            // transaction that covers its log.
            if s.remote().abandon() {
                s.unsent = true;
            }
            self.inner.send(&mut s)?;
            return out;
        }
        match self.inner.mode {
            Mode::Naive | Mode::R | Mode::Rc => self.inner.send(&mut s)?,
            Mode::Rcb => {
                // The operation log (and, when the batch is due, the batch).
                s.unsent = false;
                if let Err(e) = s.remote().commit() {
                    return Err(s.fail(&e));
                }
            }
        }
        out
    }

    fn writable(&self) -> bool {
        let s = self.inner.state.lock();
        s.failed.is_none() && s.remote.is_some()
    }

    fn flush_kind(&self) -> FlushKind {
        FlushKind::None
    }

    fn mapping(&self) -> MappingKind {
        MappingKind::Remote
    }

    fn sync(&self) -> nvstore::Result<()> {
        self.send_all()
    }
}

/// A `Db` on a back-end, with the space it runs on.
pub struct RemoteDb {
    db: Option<Db<RemoteSpace>>,
    space: RemoteSpace,
    /// Operations re-executed when it opened (rcb).
    pub replayed: u64,
    /// Whether this open created the pool.
    pub created: bool,
}

impl std::ops::Deref for RemoteDb {
    type Target = Db<RemoteSpace>;
    fn deref(&self) -> &Db<RemoteSpace> {
        self.db.as_ref().expect("open")
    }
}

impl RemoteDb {
    pub fn space(&self) -> &RemoteSpace {
        &self.space
    }

    /// Closes cleanly: the `Db` saves its index (so the next open reads no
    /// leaf chain), everything is sent, the writer lock is released.
    pub fn close(mut self) -> nvstore::Result<()> {
        let db = self.db.take().expect("open");
        db.close()?;
        self.space.close().map_err(|e| nvstore::Error::Io {
            path: self.space.path().into(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// The `Db` and its space (the space closes when the `Db` is dropped
    /// and no clone of it is left).
    pub fn into_parts(mut self) -> (Db<RemoteSpace>, RemoteSpace) {
        (self.db.take().expect("open"), self.space.clone())
    }
}

impl Drop for RemoteDb {
    fn drop(&mut self) {
        if let Some(db) = self.db.take() {
            let _ = db.close();
            let _ = self.space.close();
        }
    }
}

/// Opens the `Db` named `opts.name` on the back-end behind `t`, creating it
/// (with `db_opts`) if the back-end has none: create-or-open, like
/// `Db::open`. Takes the writer lock; in rcb mode re-executes the operations
/// a crashed writer had logged but not yet sent (AsymNVM §7, case 2).
pub fn open_db(t: impl Transport + 'static, opts: &SpaceOptions, db_opts: &nvstore::Options) -> Result<RemoteDb> {
    let o = open_db_as(t, opts, db_opts, |s| s)?;
    Ok(RemoteDb {
        db: Some(o.db),
        space: o.space,
        replayed: o.replayed,
        created: o.created,
    })
}

/// What [`open_db_as`] opened.
pub struct Opened<S: Space> {
    pub db: Db<S>,
    /// The space under `db` (`wrap` wrapped a clone of it).
    pub space: RemoteSpace,
    /// Operations re-executed (rcb).
    pub replayed: u64,
    /// Whether this open created the pool.
    pub created: bool,
}

/// [`open_db`] for a `Db` on a space that wraps the remote one (a server
/// that runs on files or on back-ends through one space type).
pub fn open_db_as<S: Space>(
    t: impl Transport + 'static,
    opts: &SpaceOptions,
    db_opts: &nvstore::Options,
    wrap: impl Fn(RemoteSpace) -> S,
) -> Result<Opened<S>> {
    let mut ropts = opts.remote.clone();
    let page_cache = ropts.cache_bytes;
    // The space keeps its own page cache; the front-end's object cache stays empty.
    ropts.cache_bytes = 0;
    ropts.mode = match opts.remote.mode {
        Mode::Naive | Mode::R | Mode::Rc => Mode::R,
        Mode::Rcb => Mode::Rcb,
    };
    let mut remote = Remote::open(t, ropts)?;
    let hello = remote.hello().clone();
    let size_name = format!("{}.size", opts.name);
    let (base, len, created) = match remote.name_get(&opts.name)? {
        Some(b) => {
            let len = remote
                .name_get(&size_name)?
                .ok_or_else(|| Error::Protocol(format!("pool {:?} has no size", opts.name)))?;
            (b, len, false)
        }
        None => {
            // Claim the area in whole slabs: the engine allocates inside it.
            // The size is named before the start, which publishes the pool.
            let want = if opts.size == 0 { hello.data_len } else { opts.size };
            let len = want.div_ceil(hello.slab) * hello.slab;
            let b = remote.alloc(len)?;
            remote.name_set(&size_name, len)?;
            remote.name_set(&opts.name, b)?;
            (b, len, true)
        }
    };
    let mut sopts = opts.clone();
    sopts.remote.cache_bytes = page_cache;
    let space = RemoteSpace::new(remote, base, len, &sopts);
    let path = space.path().to_path_buf();
    // A pool whose creation never wrote its header (the writer died after
    // naming it) is created again.
    let fresh = created || space.load(0) == 0;
    let db = if fresh {
        Db::create_in(wrap(space.clone()), &path, db_opts)?
    } else {
        let db = Db::open_space(wrap(space.clone()), &path)?;
        db.set_adaptive(db_opts.adaptive);
        db
    };
    let replayed = space.recover(&db)?;
    Ok(Opened {
        db,
        space,
        replayed,
        created: fresh,
    })
}
