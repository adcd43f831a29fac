//! Every engine access of the server goes through this module.
//!
//! It offers the engine's transaction API (DESIGN §11) with exactly the
//! shape nvstore's `Db` is getting: `snapshot`, `begin`, `transaction`,
//! `write_batch`, `last_commit_ts`, and `Snapshot` / `Txn` / `WriteBatch`
//! with `get`, `put`, `delete`, `range`, `prefix`, `watch`, `commit`.
//! The rest of the server sees only these and the [`Kv`] trait.
//!
//! TEMPORARY until nvstore's Txn lands: the types below are a shim over
//! the plain `Db` API. When the engine's `Db::begin`/`snapshot`/`write_batch`
//! exist, this module delegates to them and the shim (everything marked
//! `SHIM`) is deleted; nothing outside this file changes.
//!
//! How the shim keeps the promises it can:
//! - isolation: one process-wide mutex is held by every transaction from
//!   `begin` to `commit`/`abort`, so transactions run one at a time
//!   (serializable; no write-write conflicts can arise);
//! - WATCH: every commit stamps the keys it wrote into a table of hashed
//!   buckets with its commit timestamp; `watch(k, since)` fails the commit
//!   with [`Error::Conflict`] if `k`'s bucket is newer than `since` (a hash
//!   collision gives a false conflict, never a missed one);
//! - atomicity across crashes: a commit of more than one write first stores
//!   all of them as one value under [`INTENT_KEY`] (one engine put, atomic),
//!   then applies them and deletes the intent. Opening the store re-applies a
//!   leftover intent, so after a crash either none or all of a commit's
//!   writes are visible;
//! - snapshots: a shim `Snapshot` reads the live tree (not a stable view).
//!   Single-key reads are unaffected; a multi-key read may see a commit that
//!   finished meanwhile, as with Redis' own non-transactional reads.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nvstore::{Db, Options};
use parking_lot::{Mutex, MutexGuard};

/// Engine errors plus the transaction outcomes.
#[derive(Debug)]
pub enum Error {
    Engine(nvstore::Error),
    /// A watched key changed (or a write-write conflict): retry or give up.
    Conflict,
    /// The shim's intent record would exceed the engine's value limit.
    TooLarge {
        bytes: usize,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Engine(e) => write!(f, "{e}"),
            Error::Conflict => write!(f, "transaction conflict"),
            Error::TooLarge { bytes } => write!(
                f,
                "transaction too large: its writes take {bytes} bytes, the limit for one atomic commit is {} bytes",
                MAX_INTENT
            ),
        }
    }
}

impl From<nvstore::Error> for Error {
    fn from(e: nvstore::Error) -> Self {
        Error::Engine(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Server-internal keys live under the `0x00` namespace byte (see
/// `keys.rs`); this one holds a commit's writes while it is being applied.
pub const INTENT_KEY: &[u8] = b"\x00intent";
/// The engine's largest value (16 MiB) less room for framing.
const MAX_INTENT: usize = (16 << 20) - 64;

type Owned = (Bound<Vec<u8>>, Bound<Vec<u8>>);

fn owned<K: AsRef<[u8]>, R: RangeBounds<K>>(r: &R) -> Owned {
    fn one<K: AsRef<[u8]>>(b: Bound<&K>) -> Bound<Vec<u8>> {
        match b {
            Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        }
    }
    (one(r.start_bound()), one(r.end_bound()))
}

/// SHIM: number of WATCH buckets.
const BUCKETS: usize = 1 << 14;

/// SHIM: state guarded by the one transaction mutex.
struct ShimState {
    /// An intent record is in the pool but not fully applied (an apply
    /// failed, e.g. the pool filled up); it is retried before the next commit.
    intent_pending: bool,
}

/// The server's handle on an open pool.
pub struct Store {
    db: Db,
    /// SHIM: held by every transaction for its whole life.
    lock: Mutex<ShimState>,
    /// SHIM: last commit timestamp.
    ts: AtomicU64,
    /// SHIM: per-bucket newest commit timestamp, for WATCH.
    buckets: Box<[AtomicU64]>,
}

fn bucket(k: &[u8]) -> usize {
    // FNV-1a: stable and cheap; collisions only cause false conflicts.
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in k {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    (h as usize) & (BUCKETS - 1)
}

impl Store {
    /// Opens (creating if missing) the pool and finishes any commit a crash
    /// interrupted.
    pub fn open(path: &Path, opts: Options) -> Result<Store> {
        let db = Db::open(path, opts)?;
        let store = Store {
            db,
            lock: Mutex::new(ShimState { intent_pending: true }),
            ts: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        };
        store.apply_pending(&mut store.lock.lock())?;
        Ok(store)
    }

    /// The engine, for statistics and non-transactional facts.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Closes the pool cleanly (the next open is instant).
    pub fn close(self) -> Result<()> {
        Ok(self.db.close()?)
    }

    /// A read view.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            store: self,
            ts: self.last_commit_ts(),
        }
    }

    /// Starts a transaction.
    pub fn begin(&self) -> Txn<'_> {
        let guard = self.lock.lock();
        Txn {
            store: self,
            guard,
            start_ts: self.last_commit_ts(),
            writes: BTreeMap::new(),
            watches: Vec::new(),
        }
    }

    /// Runs `f` in a transaction and commits it, retrying on conflict.
    pub fn transaction<T>(&self, mut f: impl FnMut(&mut Txn<'_>) -> Result<T>) -> Result<T> {
        loop {
            let mut t = self.begin();
            let out = f(&mut t)?;
            match t.commit() {
                Ok(_) => return Ok(out),
                Err(Error::Conflict) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Applies blind writes atomically; returns the commit timestamp.
    pub fn write_batch(&self, batch: WriteBatch) -> Result<u64> {
        let mut t = self.begin();
        t.writes = batch.ops;
        t.commit()
    }

    /// Newest commit timestamp.
    pub fn last_commit_ts(&self) -> u64 {
        self.ts.load(Ordering::Acquire)
    }

    /// SHIM: re-applies an intent record left by a crash or a failed apply.
    fn apply_pending(&self, st: &mut MutexGuard<'_, ShimState>) -> Result<()> {
        if !st.intent_pending {
            return Ok(());
        }
        if let Some(rec) = self.db.get(INTENT_KEY)? {
            let ops = decode_intent(&rec).ok_or_else(|| {
                Error::Engine(nvstore::Error::Corrupt {
                    path: self.db.stat().path.into(),
                    what: "the server's commit intent record is malformed".into(),
                })
            })?;
            for (k, v) in &ops {
                match v {
                    Some(v) => self.db.put(k, v)?,
                    None => {
                        self.db.delete(k)?;
                    }
                }
            }
            self.db.delete(INTENT_KEY)?;
        }
        st.intent_pending = false;
        Ok(())
    }
}

/// Read operations the commands need, over a snapshot or a transaction.
pub trait Kv {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>>;
    fn put(&mut self, k: &[u8], v: &[u8]) -> Result<()>;
    fn delete(&mut self, k: &[u8]) -> Result<()>;
    /// Pairs with keys in `(lo, hi)`, ascending or (`rev`) descending.
    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's>;
}

/// A read view (SHIM: of the live tree).
pub struct Snapshot<'a> {
    store: &'a Store,
    ts: u64,
}

impl Snapshot<'_> {
    pub fn ts(&self) -> u64 {
        self.ts
    }

    pub fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.store.db.get(k)?)
    }

    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, r: R) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
        self.store.db.range(owned(&r))
    }

    pub fn range_rev<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, r: R) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
        self.store.db.range_rev(owned(&r))
    }
}

impl Kv for Snapshot<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        Snapshot::get(self, k)
    }

    fn put(&mut self, _: &[u8], _: &[u8]) -> Result<()> {
        Err(Error::Engine(nvstore::Error::ReadOnly))
    }

    fn delete(&mut self, _: &[u8]) -> Result<()> {
        Err(Error::Engine(nvstore::Error::ReadOnly))
    }

    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's> {
        if rev {
            Box::new(self.range_rev((lo, hi)))
        } else {
            Box::new(self.range((lo, hi)))
        }
    }
}

/// A transaction: buffered writes, read-your-writes, WATCH, atomic commit.
pub struct Txn<'a> {
    store: &'a Store,
    /// SHIM: the one transaction mutex, held until commit/abort.
    #[allow(dead_code)]
    guard: MutexGuard<'a, ShimState>,
    start_ts: u64,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    watches: Vec<(Vec<u8>, u64)>,
}

impl<'a> Txn<'a> {
    pub fn start_ts(&self) -> u64 {
        self.start_ts
    }

    /// The value of `k`, own writes first.
    pub fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.writes.get(k) {
            Some(v) => Ok(v.clone()),
            None => Ok(self.store.db.get(k)?),
        }
    }

    pub fn put(&mut self, k: &[u8], v: &[u8]) -> Result<()> {
        self.writes.insert(k.to_vec(), Some(v.to_vec()));
        Ok(())
    }

    pub fn delete(&mut self, k: &[u8]) -> Result<()> {
        self.writes.insert(k.to_vec(), None);
        Ok(())
    }

    /// Pairs in `r`, merged with own writes, ascending.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, r: R) -> Vec<(Vec<u8>, Vec<u8>)> {
        let b = owned(&r);
        let mut m: BTreeMap<Vec<u8>, Vec<u8>> = self.store.db.range(b.clone()).collect();
        for (k, v) in self.writes.range::<Vec<u8>, _>(b) {
            match v {
                Some(v) => m.insert(k.clone(), v.clone()),
                None => m.remove(k),
            };
        }
        m.into_iter().collect()
    }

    /// Pairs whose key starts with `p`, merged with own writes.
    pub fn prefix(&self, p: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.range(nvstore::db::prefix_bounds(p))
    }

    /// Commit fails with [`Error::Conflict`] if `k` got a commit after `since_ts`.
    pub fn watch(&mut self, k: &[u8], since_ts: u64) {
        self.watches.push((k.to_vec(), since_ts));
    }

    /// Makes every write durable and visible at once; returns the commit ts.
    pub fn commit(mut self) -> Result<u64> {
        let s = self.store;
        for (k, since) in &self.watches {
            if s.buckets[bucket(k)].load(Ordering::Acquire) > *since {
                return Err(Error::Conflict);
            }
        }
        if self.writes.is_empty() {
            return Ok(s.last_commit_ts());
        }
        s.apply_pending(&mut self.guard)?;
        let writes = std::mem::take(&mut self.writes);
        if writes.len() == 1 {
            let (k, v) = writes.iter().next().unwrap();
            match v {
                Some(v) => s.db.put(k, v)?,
                None => {
                    s.db.delete(k)?;
                }
            }
        } else {
            let rec = encode_intent(&writes);
            if rec.len() > MAX_INTENT {
                return Err(Error::TooLarge { bytes: rec.len() });
            }
            s.db.put(INTENT_KEY, &rec)?;
            // From here the commit is decided: a crash re-applies it on open.
            self.guard.intent_pending = true;
            for (k, v) in &writes {
                match v {
                    Some(v) => s.db.put(k, v)?,
                    None => {
                        s.db.delete(k)?;
                    }
                }
            }
            s.db.delete(INTENT_KEY)?;
            self.guard.intent_pending = false;
        }
        let ts = s.ts.load(Ordering::Relaxed) + 1;
        for k in writes.keys() {
            s.buckets[bucket(k)].store(ts, Ordering::Release);
        }
        s.ts.store(ts, Ordering::Release);
        Ok(ts)
    }

    pub fn abort(self) {}
}

impl Kv for Txn<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        Txn::get(self, k)
    }

    fn put(&mut self, k: &[u8], v: &[u8]) -> Result<()> {
        Txn::put(self, k, v)
    }

    fn delete(&mut self, k: &[u8]) -> Result<()> {
        Txn::delete(self, k)
    }

    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's> {
        let v = self.range((lo, hi));
        if rev {
            Box::new(v.into_iter().rev())
        } else {
            Box::new(v.into_iter())
        }
    }
}

/// Blind writes applied atomically by [`Store::write_batch`].
#[derive(Default)]
pub struct WriteBatch {
    ops: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl WriteBatch {
    pub fn new() -> Self {
        WriteBatch::default()
    }

    pub fn put(&mut self, k: &[u8], v: &[u8]) {
        self.ops.insert(k.to_vec(), Some(v.to_vec()));
    }

    pub fn delete(&mut self, k: &[u8]) {
        self.ops.insert(k.to_vec(), None);
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// SHIM: intent record `{ u32 n | n × (u8 op | u32 klen | key | [u32 vlen | value]) }`,
/// little-endian; op 1 = put, 0 = delete.
fn encode_intent(ops: &BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (k, v) in ops {
        out.push(v.is_some() as u8);
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        if let Some(v) = v {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

type Ops = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn decode_intent(mut b: &[u8]) -> Option<Ops> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Some(h)
    }
    fn u32_(b: &mut &[u8]) -> Option<usize> {
        Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize)
    }
    let n = u32_(&mut b)?;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let op = take(&mut b, 1)?[0];
        let kl = u32_(&mut b)?;
        let k = take(&mut b, kl)?.to_vec();
        let v = if op == 1 {
            let vl = u32_(&mut b)?;
            Some(take(&mut b, vl)?.to_vec())
        } else {
            None
        };
        out.push((k, v));
    }
    b.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &tempfile::TempDir) -> Store {
        Store::open(&dir.path().join("p.nvs"), Options::default()).unwrap()
    }

    #[test]
    fn txn_reads_own_writes_and_commits_all() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        let mut t = s.begin();
        t.put(b"a", b"1").unwrap();
        t.put(b"b", b"2").unwrap();
        t.delete(b"a").unwrap();
        assert_eq!(t.get(b"a").unwrap(), None);
        assert_eq!(t.range(&b"a"[..]..).len(), 1);
        t.commit().unwrap();
        assert_eq!(s.db().get(b"b").unwrap(), Some(b"2".to_vec()));
        assert_eq!(s.db().get(INTENT_KEY).unwrap(), None);
    }

    #[test]
    fn watch_conflicts_after_a_newer_commit() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        let since = s.last_commit_ts();
        let mut b = WriteBatch::new();
        b.put(b"k", b"v");
        s.write_batch(b).unwrap();
        let mut t = s.begin();
        t.watch(b"k", since);
        t.put(b"x", b"y").unwrap();
        assert!(matches!(t.commit(), Err(Error::Conflict)));
        let mut t = s.begin();
        t.watch(b"k", s.last_commit_ts());
        t.put(b"x", b"y").unwrap();
        assert!(t.commit().is_ok());
    }

    #[test]
    fn leftover_intent_is_applied_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.nvs");
        {
            let db = Db::open(&path, Options::default()).unwrap();
            db.put(b"gone", b"x").unwrap();
            let mut ops = BTreeMap::new();
            ops.insert(b"a".to_vec(), Some(b"1".to_vec()));
            ops.insert(b"gone".to_vec(), None);
            db.put(INTENT_KEY, &encode_intent(&ops)).unwrap();
            db.close().unwrap();
        }
        let s = Store::open(&path, Options::default()).unwrap();
        assert_eq!(s.db().get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(s.db().get(b"gone").unwrap(), None);
        assert_eq!(s.db().get(INTENT_KEY).unwrap(), None);
    }
}
