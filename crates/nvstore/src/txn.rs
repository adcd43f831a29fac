//! Snapshots, snapshot-isolation transactions and write batches (NV-Tree §6.1.1).
//!
//! - Every element carries its commit timestamp. A [`Snapshot`] reads, per
//!   key, the newest element no newer than its timestamp; later writes never
//!   disturb it, and leaf rewrites keep the versions it reads until it is
//!   dropped.
//! - A [`Txn`] reads at its start snapshot (and its own writes), buffers its
//!   writes in DRAM and commits them all at once: first committer wins, so
//!   a write to a key that someone else committed after the start fails
//!   the commit with [`Error::Conflict`] and nothing is written. Write skew
//!   stays possible, as snapshot isolation allows.
//! - The commit is atomic across crashes: writes landing in one leaf are
//!   published by that leaf's one count store; writes spanning several
//!   leaves are flagged and count only once one commit record is durable
//!   (see [`crate::tree::Tree::commit`]).
//! - A [`WriteBatch`] is a blind multi-key write with the same atomicity.
//!
//! Plain `Db::get/put/delete` take no part in this beyond stamping each
//! write with a timestamp: they read the latest state and commit at once.

use std::collections::BTreeMap;
use std::ops::{Bound as RB, ControlFlow, RangeBounds};
use std::sync::Arc;

use crate::db::{owned, prefix_bounds, Db};
use crate::error::{Error, Result};
use crate::pmem::Space;
pub use crate::tree::commit::OneWrite;
use crate::tree::nv::Nv;
use crate::tree::{check_key, in_range, no_keys_between, RangeIter, SnapshotPin};

/// A stable read view of the store.
pub struct Snapshot<'a, S: Space> {
    db: &'a Db<S>,
    pin: Arc<SnapshotPin<S, Nv>>,
}

impl<'a, S: Space> Snapshot<'a, S> {
    pub(crate) fn new(db: &'a Db<S>) -> Result<Self> {
        Ok(Snapshot {
            pin: db.nv_tree()?.pin_snapshot(),
            db,
        })
    }

    /// The commit timestamp this snapshot reads at: it sees every commit
    /// with this timestamp or an older one, and none newer.
    pub fn ts(&self) -> u64 {
        self.pin.ts
    }

    /// The value `key` had at the snapshot.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.db.named(self.db.tree().get_at(key, self.pin.ts))
    }

    /// [`Db::get_with`] at the snapshot: `f` reads the value in place.
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        check_key(key)?;
        self.db.named(self.db.tree().get_with_at(key, self.pin.ts, f))
    }

    /// [`Db::range_with`] at the snapshot.
    pub fn range_with<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        self.db.named(self.db.tree().scan_with(lo, hi, false, self.pin.ts, f))
    }

    /// Pairs in `range` at the snapshot, in key order.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> RangeIter<S, Nv> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        self.db
            .tree()
            .range_at(lo, hi, false, Some(self.pin.clone()))
            .named(&self.db.path)
    }

    /// Pairs in `range` at the snapshot, in reverse key order.
    pub fn range_rev<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> RangeIter<S, Nv> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        self.db
            .tree()
            .range_at(lo, hi, true, Some(self.pin.clone()))
            .named(&self.db.path)
    }

    /// Every pair at the snapshot.
    pub fn iter(&self) -> RangeIter<S, Nv> {
        self.db
            .tree()
            .range_at(RB::Unbounded, RB::Unbounded, false, Some(self.pin.clone()))
            .named(&self.db.path)
    }

    /// Pairs whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> RangeIter<S, Nv> {
        let (lo, hi) = prefix_bounds(prefix);
        self.db
            .tree()
            .range_at(lo, hi, false, Some(self.pin.clone()))
            .named(&self.db.path)
    }

    /// Pairs whose key starts with `prefix`, in reverse key order.
    pub fn prefix_rev(&self, prefix: &[u8]) -> RangeIter<S, Nv> {
        let (lo, hi) = prefix_bounds(prefix);
        self.db
            .tree()
            .range_at(lo, hi, true, Some(self.pin.clone()))
            .named(&self.db.path)
    }
}

/// A snapshot-isolation transaction. Dropping it without [`Txn::commit`]
/// aborts it (nothing was written).
pub struct Txn<'a, S: Space> {
    snap: Snapshot<'a, S>,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    watches: Vec<(Vec<u8>, u64)>,
}

impl<'a, S: Space> Txn<'a, S> {
    pub(crate) fn new(db: &'a Db<S>) -> Result<Self> {
        Ok(Txn {
            snap: Snapshot::new(db)?,
            writes: BTreeMap::new(),
            watches: Vec::new(),
        })
    }

    /// The snapshot timestamp the transaction reads at.
    pub fn start_ts(&self) -> u64 {
        self.snap.ts()
    }

    /// `key`'s value: this transaction's own write if any, else the snapshot's.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.snap.get(key),
        }
    }

    /// [`Txn::get`] lending the value to `f`: this transaction's own write
    /// from its buffer, else the snapshot's from the pool.
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        match self.writes.get(key) {
            Some(v) => Ok(v.as_deref().map(f)),
            None => self.snap.get_with(key, f),
        }
    }

    /// [`Txn::range`] lending each pair to `f` in key order (until it
    /// breaks): the snapshot's pairs merged with this transaction's own
    /// writes, which win over the snapshot's for the same key.
    pub fn range_with<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        mut f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        if no_keys_between(&lo, &hi) {
            return Ok(()); // (`BTreeMap::range` panics on such bounds)
        }
        let mut own = self.writes.range::<Vec<u8>, _>((lo.clone(), hi.clone())).peekable();
        let mut stopped = false;
        self.snap.range_with((lo, hi), |k, v| {
            // Own writes below `k` come first; one at `k` replaces the snapshot's.
            while let Some((ok, ov)) = own.next_if(|(ok, _)| ok.as_slice() <= k) {
                let same = ok.as_slice() == k;
                if let Some(ov) = ov {
                    if f(ok, ov).is_break() {
                        stopped = true;
                        return ControlFlow::Break(());
                    }
                }
                if same {
                    return ControlFlow::Continue(());
                }
            }
            let flow = f(k, v);
            stopped = flow.is_break();
            flow
        })?;
        if !stopped {
            for (ok, ov) in own {
                if let Some(ov) = ov {
                    if f(ok, ov).is_break() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Buffers a write; it becomes visible to others at commit.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        crate::tree::check_sizes(key, value)?;
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    /// Buffers a delete.
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.writes.insert(key.to_vec(), None);
        Ok(())
    }

    /// Pairs in `range` as this transaction sees them: the snapshot merged
    /// with its own writes, in key order.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Vec<(Vec<u8>, Vec<u8>)> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        self.merged(lo, hi)
    }

    /// Pairs whose key starts with `prefix`, as this transaction sees them.
    pub fn prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let (lo, hi) = prefix_bounds(prefix);
        self.merged(lo, hi)
    }

    fn merged(&self, lo: RB<Vec<u8>>, hi: RB<Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out: BTreeMap<Vec<u8>, Vec<u8>> = self
            .snap
            .db
            .tree()
            .range_at(lo.clone(), hi.clone(), false, Some(self.snap.pin.clone()))
            .named(&self.snap.db.path)
            .collect();
        for (k, v) in self.writes.iter().filter(|(k, _)| in_range(k, &lo, &hi)) {
            match v {
                Some(v) => out.insert(k.clone(), v.clone()),
                None => out.remove(k),
            };
        }
        out.into_iter().collect()
    }

    /// Makes the commit fail with [`Error::Conflict`] if `key` gets a
    /// commit newer than `since_ts` before this transaction commits (what
    /// Redis's WATCH promises; `since_ts` is typically
    /// [`Db::last_commit_ts`] read when the client watched).
    pub fn watch(&mut self, key: &[u8], since_ts: u64) {
        self.watches.push((key.to_vec(), since_ts));
    }

    /// Writes buffered so far.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Commits: all writes or none, durable when it returns. Returns the
    /// commit timestamp ([`Txn::start_ts`] for a transaction that wrote nothing).
    pub fn commit(self) -> Result<u64> {
        if self.writes.is_empty() && self.watches.is_empty() {
            return Ok(self.start_ts());
        }
        let db = self.snap.db;
        db.writable()?;
        if self.writes.is_empty() {
            // Read-only with watches: validate only.
            let tree = db.tree();
            let now = tree.clock.visible();
            for (k, since) in &self.watches {
                let snap_changed = db.named(tree.newest_version(k))?.is_some_and(|v| v > *since);
                if snap_changed {
                    tree.stats.conflicts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Err(Error::Conflict);
                }
            }
            return Ok(now.max(self.start_ts()));
        }
        db.named(db.tree().commit(&self.writes, &self.watches, self.start_ts()))
    }

    /// Drops the transaction's writes.
    pub fn abort(self) {}
}

/// A blind multi-key write applied atomically by [`Db::write_batch`].
#[derive(Clone, Debug, Default)]
pub struct WriteBatch {
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl WriteBatch {
    pub fn new() -> Self {
        WriteBatch::default()
    }
    /// Stores `value` under `key` (a later write to the same key wins).
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
    }
    /// Removes `key`.
    pub fn delete(&mut self, key: &[u8]) {
        self.writes.insert(key.to_vec(), None);
    }
    pub fn len(&self) -> usize {
        self.writes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

/// Attempts [`Db::transaction`] makes before giving up with the conflict.
pub const MAX_TXN_ATTEMPTS: u32 = 1000;

impl<S: Space> Db<S> {
    /// A stable read view at the newest committed state; an error on a
    /// pool whose leaves keep no versions (isle).
    pub fn snapshot(&self) -> Result<Snapshot<'_, S>> {
        Snapshot::new(self)
    }

    /// Starts a transaction reading at the newest committed state.
    pub fn begin(&self) -> Result<Txn<'_, S>> {
        Txn::new(self)
    }

    /// Runs `f` in a transaction and commits it, retrying from a fresh
    /// snapshot when the commit (or `f`) fails with [`Error::Conflict`],
    /// with a short randomised back-off, up to [`MAX_TXN_ATTEMPTS`] times.
    /// Any other error from `f` aborts and is returned.
    pub fn transaction<T>(&self, mut f: impl FnMut(&mut Txn<'_, S>) -> Result<T>) -> Result<T> {
        let mut attempt = 0;
        loop {
            let mut tx = self.begin()?;
            let r = f(&mut tx).and_then(|v| tx.commit().map(|_| v));
            match r {
                Err(Error::Conflict) if attempt + 1 < MAX_TXN_ATTEMPTS => {
                    attempt += 1;
                    let spins = rand::random::<u32>() % (1 << attempt.min(10));
                    for _ in 0..spins {
                        std::hint::spin_loop();
                    }
                    if attempt > 4 {
                        std::thread::yield_now();
                    }
                }
                r => return r,
            }
        }
    }

    /// Applies every write of `batch` atomically (all or none, also across
    /// crashes); durable when it returns. Returns the commit timestamp.
    pub fn write_batch(&self, batch: WriteBatch) -> Result<u64> {
        self.writable()?;
        if batch.is_empty() {
            return Ok(self.last_commit_ts());
        }
        self.named(self.nv_tree()?.commit(&batch.writes, &[], u64::MAX))
    }

    /// A one-key transaction without the transaction machinery: `f` gets
    /// `key`'s newest value (`None`: absent) and decides what to write
    /// ([`OneWrite`]); the write commits as a transaction of that one key
    /// would (atomic across crashes, durable when this returns, visible to
    /// snapshots from its commit timestamp on), but nothing can commit to
    /// `key` between the read and the write, so it never conflicts, and no
    /// snapshot is registered. `f` runs while the key's leaf is locked:
    /// keep it short and do not touch the store from it. It may run more
    /// than once (after a leaf split); the last run's decision and result
    /// count. An error on pools without versions (isle, hash).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = nvstore::Db::open(dir.path().join("p.nvs"), nvstore::Options::default())?;
    /// use nvstore::OneWrite;
    /// let incr = |v: Option<&[u8]>| {
    ///     let n = v.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap())) + 1;
    ///     (OneWrite::Put(n.to_le_bytes().to_vec()), n)
    /// };
    /// assert_eq!(db.write_one(b"hits", incr)?, 1);
    /// assert_eq!(db.write_one(b"hits", incr)?, 2);
    /// # Ok::<(), nvstore::Error>(())
    /// ```
    pub fn write_one<R>(&self, key: &[u8], f: impl FnMut(Option<&[u8]>) -> (OneWrite, R)) -> Result<R> {
        self.writable()?;
        self.named(self.nv_tree()?.write_one(key, f))
    }

    /// The newest commit timestamp whose writes (and all older ones) are
    /// visible now.
    pub fn last_commit_ts(&self) -> u64 {
        self.clock().visible()
    }
}
