//! Commits (NV-Tree §6.1.1): a transaction's or write batch's writes,
//! appended to every leaf they touch at one timestamp, atomically.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_epoch as epoch;

use super::leaf::{LeafFormat, Removed, ValueRef};
use super::split::Goal;
use super::{check_key, check_sizes, Leaf, Tree};
use crate::error::{Error, Result};
use crate::format::{element, header};
use crate::pmem::Space;

impl<S: Space, L: LeafFormat> Tree<S, L> {
    /// One leaf's part of a commit: checks its keys for conflicts and lists,
    /// per written key, the live element it replaces (if any).
    fn plan_leaf(
        &self,
        leaf: &Leaf<L>,
        n: u64,
        ks: &[usize],
        keys: &[(&[u8], Role)],
        values: &[&Option<Vec<u8>>],
        start: u64,
    ) -> LeafPlan {
        let mut p = LeafPlan::default();
        for &i in ks {
            let (k, role) = &keys[i];
            let newest = L::newest(&*self.space, leaf, n, k, u64::MAX);
            let limit = match role {
                Role::Write(_) => start,
                Role::Watch(since) => *since,
            };
            if newest.is_some_and(|e| e.version > limit) {
                p.conflict = true;
            }
            let Role::Write(w) = role else { continue };
            let old = newest
                .filter(|e| !e.negative)
                .map(|e| L::element(&*self.space, leaf.off, e.index));
            let k_need = values[*w].is_some() as u64 + old.is_some() as u64;
            p.delta += values[*w].is_some() as i64 - old.is_some() as i64;
            if k_need > 0 {
                p.needy.push(k.to_vec());
            }
            p.need += k_need;
            p.plan.push((*w, old.map(|o| o.words)));
        }
        p
    }

    /// The elements a leaf's plan appends, stamped with `ts`.
    fn elements(
        &self,
        plan: &[(usize, Option<[u64; 4]>)],
        wkeys: &[&Vec<u8>],
        values: &[&Option<Vec<u8>>],
        blobs: &[u64],
        ts: u64,
        txn: bool,
    ) -> Vec<[u64; 4]> {
        let mut elems = Vec::with_capacity(plan.len() * 2);
        for (i, old) in plan {
            if let Some(o) = old {
                elems.push(element::negate(*o, ts, txn));
            }
            if let Some(v) = values[*i] {
                elems.push(element::encode(wkeys[*i], v, blobs[*i], ts, txn));
            }
        }
        elems
    }

    /// Commits a transaction's buffered writes (`None`: delete) atomically,
    /// durable when it returns: first-committer-wins against every write
    /// newer than `start` to a written key, and against every write newer
    /// than its `since` to a watched key. `start == u64::MAX` (a blind
    /// write batch) checks nothing. Returns the commit timestamp.
    ///
    /// Under the commit lock and the structure lock, the leaves of all keys
    /// are locked in chain order; leaves without room are split first
    /// (before any append, so a full pool fails cleanly). Then one
    /// timestamp is taken and each leaf gets one append. Writes to a single
    /// leaf are published by its one count store; across leaves, elements
    /// carry the TXN flag and count only once the header's commit record
    /// (`txn_commit = ts`) is durable. Readers see none of it before then:
    /// the leaves' DRAM counts are raised last.
    pub fn commit(
        &self,
        writes: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        watches: &[(Vec<u8>, u64)],
        start: u64,
    ) -> Result<u64> {
        if !L::VERSIONED {
            return Err(Error::Unsupported(format!(
                "{} leaves keep no versions: transactions and write batches need an nv pool",
                L::NAME
            )));
        }
        for (k, v) in writes {
            check_sizes(k, v.as_deref().unwrap_or_default())?;
        }
        self.writable_tree()?;
        {
            // Every leaf the commit reads or writes is sound (checked once).
            let _guard = epoch::pin();
            let idx = self.index.load();
            for k in writes.keys().chain(watches.iter().map(|(k, _)| k)) {
                self.sound(&idx.find_leaf(k))?;
            }
        }
        // Blobs first, outside every lock.
        let mut blobs: Vec<u64> = Vec::with_capacity(writes.len());
        let free_blobs = |blobs: &[u64]| {
            for &b in blobs.iter().filter(|&&b| b != 0) {
                self.alloc.free(b);
            }
        };
        for (k, v) in writes {
            let b = match v.as_deref().and_then(|v| element::blob_size(k, v).map(|sz| (v, sz))) {
                Some((v, sz)) => match self.alloc.alloc(&*self.space, sz) {
                    Ok(off) => {
                        element::write_blob(&*self.space, off, k, v);
                        off
                    }
                    Err(e) => {
                        free_blobs(&blobs);
                        return Err(e);
                    }
                },
                None => 0,
            };
            blobs.push(b);
        }
        // Every key the commit looks at, in key order: written ones carry
        // their index in `writes`, watched ones their `since`.
        let mut keys: Vec<(&[u8], Role)> = writes
            .keys()
            .enumerate()
            .map(|(i, k)| (k.as_slice(), Role::Write(i)))
            .chain(watches.iter().map(|(k, since)| (k.as_slice(), Role::Watch(*since))))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        let values: Vec<&Option<Vec<u8>>> = writes.values().collect();
        let wkeys: Vec<&Vec<u8>> = writes.keys().collect();

        if keys.is_empty() {
            return Ok(self.clock.visible());
        }

        // Fast path: every key in one leaf with room for the elements. The
        // leaf lock alone orders this commit against every other writer of
        // its keys (plain writes and commits lock it too) and one count
        // store publishes it: no commit lock, no structure lock.
        {
            let _guard = epoch::pin();
            let idx = self.index.load();
            let leaf = idx.find(keys[0].0).leaf;
            // Keys are sorted: if the first and last route to one leaf, all do.
            if Arc::ptr_eq(&leaf, &idx.find(keys[keys.len() - 1].0).leaf) {
                drop(idx);
                let lk = leaf.lock.lock();
                let n = leaf.durable.load(Ordering::Relaxed);
                let all: Vec<usize> = (0..keys.len()).collect();
                let p = self.plan_leaf(&leaf, n, &all, &keys, &values, start);
                if !leaf.dead.load(Ordering::Acquire) {
                    if p.conflict {
                        drop(lk);
                        free_blobs(&blobs);
                        self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::Conflict);
                    }
                    if n + p.need <= L::room(&*self.space, &leaf) {
                        let w = self.clock.begin_write();
                        let elems = self.elements(&p.plan, &wkeys, &values, &blobs, w.ts, false);
                        if !elems.is_empty() {
                            L::append(&*self.space, &leaf, n, &elems);
                        }
                        leaf.durable.store(n + elems.len() as u64, Ordering::Release);
                        self.adaptive
                            .wrote(&leaf.counters, elems.len() as u64, keys.len() as u64);
                        self.keys.add(p.delta);
                        let ts = w.ts;
                        drop(w);
                        drop(lk);
                        self.stats.commits.fetch_add(1, Ordering::Relaxed);
                        self.space.op_boundary();
                        return Ok(ts);
                    }
                }
            }
        }

        let _commit = self.commit_lock.lock();
        let structure = self.structure.lock();
        let ts = loop {
            let _guard = epoch::pin();
            let idx = self.index.load();
            // Group the keys by leaf; leaves come in chain order.
            let mut groups: Vec<(Arc<Leaf<L>>, Vec<usize>)> = Vec::new();
            for (i, (k, _)) in keys.iter().enumerate() {
                let leaf = idx.find(k).leaf;
                match groups.last_mut() {
                    Some((l, ks)) if Arc::ptr_eq(l, &leaf) => ks.push(i),
                    _ => groups.push((leaf, vec![i])),
                }
            }
            let locks: Vec<_> = groups.iter().map(|(l, _)| l.lock.lock()).collect();
            // Validate, and gather each leaf's elements (version filled in below).
            let mut plans: Vec<Vec<(usize, Option<[u64; 4]>)>> = Vec::with_capacity(groups.len());
            let mut room: Option<(Vec<u8>, u64, Option<Vec<u8>>)> = None;
            let mut conflict = false;
            let mut delta = 0i64;
            for (leaf, ks) in &groups {
                let n = leaf.durable.load(Ordering::Relaxed);
                let LeafPlan {
                    plan,
                    need,
                    needy,
                    conflict: c,
                    delta: d,
                } = self.plan_leaf(leaf, n, ks, &keys, &values, start);
                conflict |= c;
                delta += d;
                if n + need > L::room(&*self.space, leaf) && room.is_none() {
                    let cut = (need > L::capacity(leaf.size) / 2 && needy.len() > 1)
                        .then(|| needy[needy.len() / 2 - 1].to_vec());
                    room = Some((needy[0].to_vec(), need, cut));
                }
                plans.push(plan);
            }
            if conflict {
                drop(locks);
                drop(structure);
                free_blobs(&blobs);
                self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Conflict);
            }
            if let Some((key, need, cut)) = room {
                drop(locks);
                if let Err(e) = self.rewrite(
                    &key,
                    cut.as_deref()
                        .map_or(Goal::Room(need), |after| Goal::Cut { after, need }),
                ) {
                    drop(structure);
                    free_blobs(&blobs);
                    return Err(e);
                }
                continue;
            }
            // Everything fits: take the timestamp and append, leaf by leaf.
            let w = self.clock.begin_write();
            let multi = plans
                .iter()
                .filter(|p| p.iter().any(|(i, old)| old.is_some() || values[*i].is_some()))
                .count()
                > 1;
            let mut counts = Vec::with_capacity(groups.len());
            for ((leaf, _), plan) in groups.iter().zip(&plans) {
                let n = leaf.durable.load(Ordering::Relaxed);
                let elems = self.elements(plan, &wkeys, &values, &blobs, w.ts, multi);
                if !elems.is_empty() {
                    L::append(&*self.space, leaf, n, &elems);
                }
                counts.push((n + elems.len() as u64, plan.len() as u64));
            }
            if multi {
                header::set_txn_committed(&*self.space, w.ts);
                self.stats.multi_leaf_commits.fetch_add(1, Ordering::Relaxed);
            }
            for ((leaf, _), (n, lookups)) in groups.iter().zip(counts) {
                let before = leaf.durable.swap(n, Ordering::Release);
                self.adaptive.wrote(&leaf.counters, n - before, lookups);
            }
            self.keys.add(delta);
            let ts = w.ts;
            drop(w);
            drop(locks);
            break ts;
        };
        drop(structure);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.space.op_boundary();
        Ok(ts)
    }
}

/// What [`Tree::write_one`]'s function decides for its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OneWrite {
    /// Write nothing.
    Keep,
    /// Store this value.
    Put(Vec<u8>),
    /// Delete the key (nothing is written if it is absent).
    Delete,
}

/// A step of [`Tree::write_one`].
enum OneStep<R> {
    Full,
    Again,
    Done(R, bool),
}

impl<S: Space, L: LeafFormat> Tree<S, L> {
    /// A one-key read-modify-write committed without the transaction
    /// machinery: under the lock of the key's leaf, `f` gets the key's
    /// newest value and decides the write, which is appended and published
    /// as a plain put or delete is (one timestamp, one element without the
    /// TXN flag, one count store), durable when this returns.
    /// Every writer of the key locks that leaf, so nothing can commit
    /// between the read and the write: no snapshot is registered, no
    /// conflict is possible, and the key is looked up once.
    ///
    /// `f` runs with the leaf locked, so keep it short; it may run more
    /// than once (when the leaf has no room, it is split and `f` runs
    /// again on the same value), and only the last run's decision counts.
    pub fn write_one<R>(&self, key: &[u8], mut f: impl FnMut(Option<&[u8]>) -> (OneWrite, R)) -> Result<R> {
        if !L::VERSIONED {
            return Err(Error::Unsupported(format!(
                "{} leaves keep no versions: one-key transactions need an nv pool",
                L::NAME
            )));
        }
        check_key(key)?;
        self.writable_tree()?;
        loop {
            let guard = epoch::pin();
            let step = self.with_sound_leaf(&guard, key, true, |leaf| -> Result<OneStep<R>> {
                let lk = leaf.lock.lock();
                if leaf.dead.load(Ordering::Acquire) {
                    return Ok(OneStep::Again);
                }
                let sp = &*self.space;
                let n = leaf.durable.load(Ordering::Relaxed);
                let old = L::newest(sp, leaf, n, key, u64::MAX)
                    .filter(|e| !e.negative)
                    .map(|e| L::element(sp, leaf.off, e.index).words);
                let (w, r) = match &old {
                    Some(words) => ValueRef::of(sp, words).with(sp, |v| f(Some(v))),
                    None => f(None),
                };
                let value = match w {
                    OneWrite::Keep => return Ok(OneStep::Done(r, false)),
                    OneWrite::Delete if old.is_none() => return Ok(OneStep::Done(r, false)),
                    // A delete as a plain delete does it: in place when it
                    // can be (`LeafFormat::remove`), else one NEGATIVE
                    // element.
                    OneWrite::Delete => {
                        return Ok(match L::remove(sp, leaf, key, &self.clock) {
                            Removed::Full => OneStep::Full,
                            Removed::Moved => OneStep::Again,
                            Removed::Done { existed, freed } => {
                                debug_assert!(existed && freed.is_none(), "a versioned leaf frees no blob on delete");
                                self.adaptive.wrote(&leaf.counters, 1, 1);
                                self.keys.add(-1);
                                drop(lk);
                                OneStep::Done(r, true)
                            }
                        });
                    }
                    OneWrite::Put(v) => {
                        check_sizes(key, &v)?;
                        v
                    }
                };
                // An update appends only the new element, as a plain put
                // does (the newest element at or below a reader's timestamp
                // decides, so the old one needs no NEGATIVE twin): the leaf
                // fills half as fast.
                let need = 1;
                if n + need > L::room(sp, leaf) {
                    return Ok(OneStep::Full);
                }
                let blob = match element::blob_size(key, &value) {
                    Some(sz) => {
                        let off = self.alloc.alloc(sp, sz)?;
                        element::write_blob(sp, off, key, &value);
                        off
                    }
                    None => 0,
                };
                let w = self.clock.begin_write();
                L::append(sp, leaf, n, &[element::encode(key, &value, blob, w.ts, false)]);
                leaf.durable.store(n + 1, Ordering::Release);
                self.adaptive.wrote(&leaf.counters, 1, 1);
                if old.is_none() {
                    self.keys.add(1);
                }
                drop(w);
                drop(lk);
                Ok(OneStep::Done(r, true))
            })?;
            match step {
                OneStep::Full => {
                    drop(guard);
                    self.split(key)?;
                }
                OneStep::Again => {}
                OneStep::Done(r, wrote) => {
                    if wrote {
                        self.stats.commits.fetch_add(1, Ordering::Relaxed);
                        self.space.op_boundary();
                    }
                    return Ok(r);
                }
            }
        }
    }
}

/// What a commit does with one key: write it (index into the writes) or
/// only check it has no commit newer than `since` (a watch).
enum Role {
    Write(usize),
    Watch(u64),
}

/// One leaf's part of a commit ([`Tree::plan_leaf`]).
#[derive(Default)]
struct LeafPlan {
    /// Per written key: its index and the words of the live element it replaces.
    plan: Vec<(usize, Option<[u64; 4]>)>,
    /// Elements to append.
    need: u64,
    /// Written keys that append something, in key order.
    needy: Vec<Vec<u8>>,
    conflict: bool,
    /// Change in the number of live keys.
    delta: i64,
}
