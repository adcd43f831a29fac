//! Structural rewrites (NV-Tree §4.4): split, replace, merge and cut of
//! a full (or underfull) leaf, under the structure lock.

use std::collections::BTreeSet;
use std::ops::Bound as RB;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_epoch as epoch;

use super::adaptive::{LeafProfile, Strategy};
use super::collate::Keep;
use super::collate::Slot;
use super::index::{Bound, Entry, Found, Index, Pln};
use super::leaf::LeafFormat;
use super::{Leaf, Tree};
use crate::error::{Error, Result};
use crate::format::header;
use crate::pmem::{points, Space};

impl<S: Space, L: LeafFormat> Tree<S, L> {
    /// Makes room in the full leaf that `key` routes to: split, replace or
    /// merge with the right sibling (NV-Tree §4.4).
    pub(super) fn split(&self, key: &[u8]) -> Result<()> {
        let structure = self.structure.lock();
        let changed = self.rewrite(key, Goal::Room(2))?;
        drop(structure);
        if changed {
            let hook = self.split_hook.lock().clone();
            if let Some(h) = hook {
                h();
            }
        }
        self.space.op_boundary();
        Ok(())
    }

    /// The body of a split; the caller holds the structure lock. Rewrites
    /// the leaf `key` routes to as `goal` asks: [`plan`] decides how from
    /// its collated elements, [`Tree::apply`] does it. Returns whether
    /// anything changed.
    pub(super) fn rewrite(&self, key: &[u8], goal: Goal<'_>) -> Result<bool> {
        // The adaptive model learns what a split costs (Model::split_fixed_ns).
        let started = self.adaptive.on().then(std::time::Instant::now);
        let guard = epoch::pin();
        let idx = self.index.load();
        let f = idx.find(key);
        let leaf = f.leaf.clone();
        let lk = leaf.lock.lock();
        if leaf.dead.load(Ordering::Acquire) {
            return Ok(false); // someone else rewrote it
        }
        match goal {
            Goal::Room(need) if L::has_room(&*self.space, &leaf, need) => return Ok(false),
            Goal::Merge if leaf.durable.load(Ordering::Relaxed) >= L::capacity(leaf.size) / 4 => return Ok(false),
            _ => {}
        }
        // Keep every version a live (or future) snapshot can read. A merge
        // collates its right sibling with the same mark: a later one could
        // settle an element there newer than one left unsettled here, and
        // the merged leaf's compact version (the largest settled one) would
        // then exceed a full element of a key of this leaf.
        let oldest = self.clock.oldest();
        let c = L::collate_leaf(&*self.space, &leaf, Keep::Since(oldest), &RB::Unbounded, &RB::Unbounded);
        self.sound_to_rewrite(&leaf, &c.valid, &f.low, &f.high)?;
        // The minimal fill factor is half of this leaf's own capacity
        // (NV-Tree §4.4), whatever size adaptivity gave it.
        let min_fill = L::capacity(leaf.size) / 2;
        // Right sibling in the same PLN, for a merge: looked up only for a
        // leaf below its minimal fill (a split of a full leaf does not
        // touch its sibling's handle).
        let underfull = (c.valid.len() as u64) < min_fill;
        let right = underfull
            .then(|| idx.successor(f.pln, f.pos).filter(|(p, _, _)| *p == f.pln))
            .flatten();
        let merge_ok = right.as_ref().is_some_and(|(_, _, r)| {
            // A damaged sibling is left alone (and reported when reached).
            self.sound(&r.leaf).is_ok() && r.leaf.durable.load(Ordering::Acquire) < L::capacity(r.leaf.size) / 2
        });
        let Some(rewrite) = plan(goal, &c.valid, min_fill, merge_ok, L::SPLITS_IN_PLACE) else {
            return Ok(false);
        };
        let site = Site {
            idx: &idx,
            f: &f,
            right: right.map(|(_, _, r)| r),
            goal,
            started,
            guard: &guard,
            oldest,
        };
        self.apply(rewrite, site, c.valid, c.dropped_blobs, lk)
    }

    /// Carries out a planned rewrite of the leaf `site.f` routes to, whose
    /// lock `lk` the caller holds and whose kept elements are `valid`.
    fn apply(
        &self,
        rewrite: Rewrite,
        site: Site<'_, L::State>,
        mut valid: Vec<Slot>,
        mut dropped_blobs: Vec<u64>,
        lk: super::sync::LeafGuard<'_>,
    ) -> Result<bool> {
        let Site {
            idx,
            f,
            right,
            goal,
            started,
            guard,
            oldest,
        } = site;
        let leaf = &f.leaf;
        let old_next = L::next(&*self.space, leaf.off);
        let mut merged: Option<(Entry<L::State>, super::sync::LeafGuard<'_>)> = None;
        let mut new_entries: Vec<(Bound, u64, Vec<Slot>)> = Vec::new();
        let mut to_free = vec![leaf.off];
        let need = match goal {
            Goal::Room(need) | Goal::Cut { need, .. } => need,
            Goal::Merge => 0,
        };
        match rewrite {
            Rewrite::SplitInPlace { at } => {
                let right = valid.split_off(at);
                let size = self.split_in_place(idx, f, &valid, right, old_next)?;
                guard.flush();
                if let Some(t) = started {
                    self.adaptive
                        .record_split(leaf.size, &[size], t.elapsed().as_nanos() as f64);
                }
                return Ok(true);
            }
            Rewrite::Cut { at } => {
                // Cut: keys up to the cut left, the rest right (either may be empty).
                let Goal::Cut { after, .. } = goal else {
                    unreachable!("a cut is planned only for a cut")
                };
                let right_half = valid.split_off(at);
                new_entries.push((Bound::Key(after.into()), 0, valid));
                new_entries.push((f.high.clone(), old_next, right_half));
                self.stats.splits.fetch_add(1, Ordering::Relaxed);
            }
            Rewrite::Split { at } => {
                // Split: halves (already in key order, a key's versions never
                // parted) to two new leaves.
                let right_half = valid.split_off(at);
                let sep = Bound::Key(valid.last().expect("non-empty left half").key().into());
                new_entries.push((sep, 0, valid));
                new_entries.push((f.high.clone(), old_next, right_half));
                self.stats.splits.fetch_add(1, Ordering::Relaxed);
            }
            Rewrite::Merge => {
                // Merge with the right sibling into one leaf.
                let r = right.as_ref().expect("a merge is planned only with a right sibling");
                let rl = r.leaf.lock.lock();
                let rc = L::collate_leaf(
                    &*self.space,
                    &r.leaf,
                    Keep::Since(oldest),
                    &RB::Unbounded,
                    &RB::Unbounded,
                );
                self.sound_to_rewrite(&r.leaf, &rc.valid, &f.high, &r.max)?;
                valid.extend(rc.valid); // every key of the right sibling is above the left's
                dropped_blobs.extend(rc.dropped_blobs);
                let r_next = L::next(&*self.space, r.leaf.off);
                new_entries.push((r.max.clone(), r_next, valid));
                to_free.push(r.leaf.off);
                merged = Some((r.clone(), rl));
                self.stats.merges.fetch_add(1, Ordering::Relaxed);
            }
            Rewrite::Replace => {
                // Replace: the kept elements alone in a new leaf (a larger one
                // when versions of one key that snapshots still read fill it).
                new_entries.push((f.high.clone(), old_next, valid));
                self.stats.replaces.fetch_add(1, Ordering::Relaxed);
            }
        }

        // Profile of the new leaves (NV-Tree Table 3): halves of the old
        // leaf's counters after a split, all of them after a replace, the
        // sum of both after a merge.
        let mut profile = leaf.counters.get();
        if let Some((m, _)) = &merged {
            profile = profile.plus(m.leaf.counters.get());
        }
        let parts = new_entries.len() as u64;
        let target = self.new_leaf_size(leaf.size, profile);
        // Allocate every new leaf first, so a full pool fails before any change.
        let replaced = new_entries.len() == 1 && merged.is_none();
        let sizes: Vec<u64> = new_entries
            .iter()
            // A replace or a transaction's cut must leave room for the
            // elements the caller is about to add (with adaptivity, `target`
            // may be smaller than what they need).
            .map(|(_, _, es)| {
                self.leaf_size_for(
                    es,
                    if replaced || matches!(goal, Goal::Cut { .. }) {
                        need
                    } else {
                        0
                    },
                    target,
                )
            })
            .collect();
        let mut offs = Vec::with_capacity(new_entries.len());
        for &size in &sizes {
            match self.alloc.alloc(&*self.space, size) {
                Ok(o) => offs.push(o),
                Err(e) => {
                    for o in offs {
                        self.alloc.free(o);
                    }
                    return Err(e);
                }
            }
        }
        // Chain the new leaves: each one's next is the following new leaf.
        // The first inherits the old leaf's low bound.
        for i in 0..new_entries.len() {
            if i + 1 < new_entries.len() {
                new_entries[i].1 = offs[i + 1];
            }
            let low = match i {
                0 => L::low(&*self.space, leaf.off),
                _ => new_entries[i].2.first().map_or(0, |e| e.words[0]),
            };
            L::build_with_low(
                &*self.space,
                offs[i],
                sizes[i],
                new_entries[i].1,
                &new_entries[i].2,
                low,
            );
        }
        self.space.fence(points::NV_NEWLEAF_FENCE);
        #[cfg(debug_assertions)]
        {
            let mut low = idx.predecessor(f.pln, f.pos).map_or(Bound::NegInf, |p| p.max);
            for (i, (high, _, elems)) in new_entries.iter().enumerate() {
                let built = Leaf::<L>::with(offs[i], sizes[i], elems.len() as u64);
                self.audit_rewritten(&built, &low, high, rewrite);
                low = high.clone();
            }
        }
        // One atomic store swaps them in.
        let link = match idx.predecessor_off(f.pln, f.pos) {
            Some(off) => L::next_word(off),
            None => header::leaf_head_word(),
        };
        let linked = if link == header::leaf_head_word() {
            offs[0]
        } else {
            L::relink(self.space.load(link), offs[0])
        };
        self.space.store(link, linked);
        self.space.flush(link, 8, points::NV_LINK_FLUSH);
        self.space.fence(points::NV_LINK_FENCE);

        // DRAM: new PLN (or a rebuilt index), then retire the old leaves.
        let fresh: Vec<Entry<L::State>> = new_entries
            .iter()
            .zip(offs.iter().zip(&sizes))
            .map(|((max, _, elems), (&off, &size))| {
                let l = L::handle(&*self.space, off, size, elems);
                l.counters.set(profile.share(parts));
                Entry {
                    max: max.clone(),
                    leaf: Arc::new(l),
                }
            })
            .collect();
        let pln = idx.plns[f.pln].load();
        let remove = if merged.is_some() { 2 } else { 1 };
        self.replace_pln(idx, f.pln, &pln, pln.spliced(f.pos, remove, fresh));
        leaf.dead.store(true, Ordering::Release);
        if let Some((r, _)) = &merged {
            r.leaf.dead.store(true, Ordering::Release);
        }
        drop(lk);
        drop(merged);
        // Readers pinned before this point may still scan the old blocks.
        to_free.extend(dropped_blobs);
        debug_assert!(
            {
                let set: BTreeSet<u64> = to_free.iter().copied().collect();
                let kept: BTreeSet<u64> = new_entries
                    .iter()
                    .flat_map(|(_, _, es)| es.iter().map(|e| e.blob()))
                    .collect();
                set.len() == to_free.len() && set.is_disjoint(&kept)
            },
            "split frees a block twice or one still referenced: {to_free:?}"
        );
        self.alloc.retire(&to_free);
        let alloc = self.alloc.clone();
        guard.defer(move || alloc.release(&to_free));
        guard.flush();
        if let Some(t) = started {
            self.adaptive
                .record_split(leaf.size, &sizes, t.elapsed().as_nanos() as f64);
        }
        Ok(true)
    }

    /// Split in place (formats with [`LeafFormat::SPLITS_IN_PLACE`]): the
    /// upper part `right` of the leaf `f` routes to goes to one new leaf,
    /// the rest stays. The caller holds the structure lock and the leaf's.
    /// Returns the new leaf's size.
    fn split_in_place(
        &self,
        idx: &Arc<Index<L::State>>,
        f: &Found<L::State>,
        left: &[Slot],
        right: Vec<Slot>,
        old_next: u64,
    ) -> Result<u64> {
        let size = self.leaf_size_for(&right, 0, self.node_size.max(f.leaf.size));
        let off = self.alloc.alloc(&*self.space, size)?;
        let low = right[0].words[0];
        L::build_with_low(&*self.space, off, size, old_next, &right, low);
        self.space.fence(points::NV_NEWLEAF_FENCE);
        #[cfg(debug_assertions)]
        {
            let sep = Bound::Key(left.last().expect("a non-empty left part").key().into());
            let built = Leaf::<L>::with(off, size, right.len() as u64);
            self.audit_rewritten(&built, &sep, &f.high, Rewrite::SplitInPlace { at: left.len() });
        }
        // Writers and readers that routed here with the old index route again.
        f.leaf.high.store(low, Ordering::Release);
        L::split_in_place(&*self.space, &f.leaf, off, &right);
        let sep = Bound::Key(left.last().expect("a non-empty left part").key().into());
        let fresh = vec![
            Entry {
                max: sep,
                leaf: f.leaf.clone(),
            },
            Entry {
                max: f.high.clone(),
                leaf: Arc::new(Leaf::<L>::built(off, size, right.len() as u64)),
            },
        ];
        let pln = idx.plns[f.pln].load();
        self.replace_pln(idx, f.pln, &pln, pln.spliced(f.pos, 1, fresh));
        self.stats.splits.fetch_add(1, Ordering::Relaxed);
        Ok(size)
    }

    /// The collated (key-ordered) elements of `leaf` lie above `low` and up
    /// to `high`, and no version among them is newer than the clock. A
    /// leaf's own checks know neither, so a damaged key word that left the
    /// bounds, or a damaged version word, is caught here, before a rewrite
    /// carries it into a leaf where no lookup would find it or where later
    /// writes would sort below it: the tree refuses writes from then on, as
    /// for any damaged leaf.
    fn sound_to_rewrite(&self, leaf: &Leaf<L>, valid: &[Slot], low: &Bound, high: &Bound) -> Result<()> {
        let outside = |e: &Slot| e.with_key(|k| low.covers(k) || !high.covers(k));
        let clock = self.clock.last();
        let problem = if let Some(e) = valid.iter().take(1).chain(valid.last()).find(|e| outside(e)) {
            format!(
                "leaf at offset {} holds key {:?} outside its key range",
                leaf.off,
                String::from_utf8_lossy(&e.key())
            )
        } else if let Some(e) = valid.iter().find(|e| e.version() > clock) {
            format!(
                "leaf at offset {} holds key {:?} at version {}, newer than the clock ({clock})",
                leaf.off,
                String::from_utf8_lossy(&e.key()),
                e.version()
            )
        } else {
            return Ok(());
        };
        self.damaged.store(true, Ordering::Relaxed);
        Err(Error::corrupt_at(leaf.off, problem))
    }

    /// Test and debug builds: every invariant `check` audits holds for a
    /// leaf a rewrite has just built (before it is linked in), its keys
    /// above `low` and up to `high`. A violation panics here, at the
    /// rewrite that caused it, instead of at a later `check`.
    #[cfg(debug_assertions)]
    fn audit_rewritten(&self, built: &Leaf<L>, low: &Bound, high: &Bound, rewrite: Rewrite) {
        let s = &*self.space;
        let in_bounds = |k: &[u8]| !low.covers(k) && high.covers(k);
        let ctx = super::leaf::AuditCtx {
            pool: header::pool_size(s),
            committed: header::txn_committed(s),
            last_ts: self.clock.last(),
            in_bounds: &in_bounds,
        };
        let a = L::audit(s, built, &ctx);
        assert!(
            a.problems.is_empty(),
            "{rewrite:?} built leaf {} breaking invariants: {:?}",
            built.off,
            a.problems
        );
    }

    /// Size of a new leaf for `elems` and `extra` more: `target`, or
    /// larger when they would leave it without room for one more update.
    fn leaf_size_for(&self, elems: &[Slot], extra: u64, target: u64) -> u64 {
        let mut size = target;
        while !L::fits(size, elems, extra + 2) {
            size *= 2;
        }
        size
    }

    /// The size for the leaves that replace a full leaf of `size` bytes
    /// with `profile`: the node size when adaptivity is off, else
    /// Algorithm 3 bounded by the model (NV-Tree §5.3–5.4).
    fn new_leaf_size(&self, size: u64, profile: LeafProfile) -> u64 {
        let s = self.adaptive.strategy();
        if s == Strategy::Off {
            return self.node_size;
        }
        let c = self.adaptive.counts(profile);
        let new = self.adaptive.model().new_size(s, size, &c);
        match new.cmp(&size) {
            std::cmp::Ordering::Greater => self.adaptive.enlarged.fetch_add(1, Ordering::Relaxed),
            std::cmp::Ordering::Less => self.adaptive.shrunk.fetch_add(1, Ordering::Relaxed),
            std::cmp::Ordering::Equal => 0,
        };
        new
    }

    /// Puts `entries` in place of PLN `p`'s (`pln`, its current value),
    /// and counts the leaves gained or lost (the profile's `N_LN`); rebuilds
    /// the index instead when they overflow the PLN's limit or the tree has
    /// outgrown the index ([`Index::outgrown`]). Every rewrite's leaves
    /// reach the index here, under the structure lock, so the count is
    /// exact.
    fn replace_pln(&self, idx: &Index<L::State>, p: usize, old: &Pln<L::State>, new: Pln<L::State>) {
        let leaves = self.adaptive.leaves.load(Ordering::Relaxed) + new.len() as u64 - old.len() as u64;
        self.adaptive.leaves.store(leaves, Ordering::Relaxed);
        if new.len() <= old.limit && !idx.outgrown(leaves) {
            idx.plns[p].store(Arc::new(new));
        } else {
            self.rebuild_from_plns(idx, p, new, leaves as usize);
        }
    }

    /// Rebuild-from-PLN (NV-Tree §4.5): a PLN overflowed, or the tree
    /// outgrew the index; lay every entry out in a new index. Searches
    /// keep using the old one until the swap. `leaves` is how many entries
    /// the PLNs hold with PLN `changed` replaced by `new`.
    fn rebuild_from_plns(&self, idx: &Index<L::State>, changed: usize, new: Pln<L::State>, leaves: usize) {
        let t = Instant::now();
        let mut all = Vec::with_capacity(leaves);
        // What the slots learned (`Index::with_leaf_guided`) carries over.
        let mut guides = Vec::with_capacity(leaves);
        for (p, pln) in idx.plns[..idx.used_plns].iter().enumerate() {
            let pln = pln.load();
            let pln = if p == changed { &new } else { &*pln };
            guides.extend(pln.guides());
            all.extend(pln.entries());
        }
        let new = Index::build_adaptive(all, idx.generation + 1, self.adaptive.on());
        new.seed_guides(guides.into_iter());
        self.adaptive.hot_plns.fetch_add(new.hot_plns as u64, Ordering::Relaxed);
        self.index.store(Arc::new(new));
        self.stats.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.stats
            .rebuild_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// What a caller of [`Tree::rewrite`] wants of the leaf its key routes to.
#[derive(Clone, Copy, Debug)]
pub(super) enum Goal<'a> {
    /// Room for this many more elements (a full leaf).
    Room(u64),
    /// A cut after the key `after` whatever the leaf's fill, with room for
    /// `need` more elements (a transaction with more new keys for one leaf
    /// than a leaf holds).
    Cut { after: &'a [u8], need: u64 },
    /// Only a merge of an underfull leaf with its right sibling (formats
    /// whose deletes free room, like isle, ask for it when a leaf falls
    /// below a quarter full).
    Merge,
}

/// How a leaf is rewritten (NV-Tree §4.4), as [`plan`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rewrite {
    /// The elements from index `at` on move to one new leaf; the rest stay
    /// in place (formats with [`LeafFormat::SPLITS_IN_PLACE`]).
    SplitInPlace { at: usize },
    /// Two new leaves: the elements before index `at`, and the rest.
    Split { at: usize },
    /// Two new leaves, parted at index `at` (after the cut key).
    Cut { at: usize },
    /// One new leaf with the elements of the leaf and its right sibling.
    Merge,
    /// One new leaf with the kept elements.
    Replace,
}

/// Where a planned rewrite happens, for [`Tree::apply`].
struct Site<'a, St> {
    idx: &'a Arc<Index<St>>,
    f: &'a Found<St>,
    /// The right sibling in the same PLN, if any.
    right: Option<Entry<St>>,
    goal: Goal<'a>,
    started: Option<Instant>,
    guard: &'a epoch::Guard,
    /// The oldest-snapshot mark the leaf was collated with.
    oldest: u64,
}

/// Decides how to rewrite a leaf whose kept elements are `valid` (key
/// ordered, a key's versions adjacent), with a minimal fill of `min_fill`
/// elements; `merge_ok` says whether a right sibling can take them in.
/// `None`: nothing to do (a merge was asked for and none is possible).
pub(super) fn plan(goal: Goal<'_>, valid: &[Slot], min_fill: u64, merge_ok: bool, in_place: bool) -> Option<Rewrite> {
    let filled = valid.len() as u64 >= min_fill;
    if in_place && filled && matches!(goal, Goal::Room(_)) {
        if let Some(at) = word_split_point(valid) {
            return Some(Rewrite::SplitInPlace { at });
        }
    }
    Some(match goal {
        Goal::Merge if !merge_ok => return None,
        Goal::Merge => Rewrite::Merge,
        Goal::Cut { after, .. } => Rewrite::Cut {
            at: valid.partition_point(|e| e.cmp_bytes(after).is_le()),
        },
        Goal::Room(_) => match split_point(valid) {
            Some(at) if filled => Rewrite::Split { at },
            _ if merge_ok => Rewrite::Merge,
            _ => Rewrite::Replace,
        },
    })
}

/// The index nearest the middle of `valid` (key-ordered, a key's versions
/// adjacent) where a new key starts, so a split never parts a key's
/// versions; `None` when one key holds them all.
fn split_point(valid: &[Slot]) -> Option<usize> {
    let len = valid.len();
    let mid = len / 2;
    let starts_key = |i: usize| i > 0 && i < len && valid[i - 1].key_cmp(&valid[i]).is_ne();
    (0..=len).find_map(|d| {
        [mid + d, mid.wrapping_sub(d)]
            .into_iter()
            .find(|&i| i <= len && starts_key(i))
    })
}

/// The index nearest the middle of `valid` (key-ordered) where the key
/// word grows, so every key word left of it is below every one right of
/// it; `None` when one word covers them all.
fn word_split_point(valid: &[Slot]) -> Option<usize> {
    let len = valid.len();
    let mid = len / 2;
    // u64::MAX is the "no bound" value of a leaf's `high`.
    let starts =
        |i: usize| i > 0 && i < len && valid[i - 1].words[0] < valid[i].words[0] && valid[i].words[0] < u64::MAX;
    (0..=len).find_map(|d| {
        [mid + d, mid.wrapping_sub(d)]
            .into_iter()
            .find(|&i| i <= len && starts(i))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::element::encode;

    /// Key-ordered slots: `versions` versions of each key.
    fn slots(keys: &[&[u8]], versions: u64) -> Vec<Slot> {
        keys.iter()
            .flat_map(|k| {
                (0..versions).map(move |v| Slot {
                    words: encode(k, b"v", 0, v + 1, false),
                    long_key: None,
                    settled: false,
                })
            })
            .collect()
    }

    const KEYS: [&[u8]; 6] = [b"a", b"b", b"c", b"d", b"e", b"f"];

    #[test]
    fn a_full_leaf_splits_between_keys() {
        let v = slots(&KEYS, 2);
        assert_eq!(plan(Goal::Room(2), &v, 6, false, false), Some(Rewrite::Split { at: 6 }));
        // A split in place parts key words.
        assert_eq!(
            plan(Goal::Room(2), &v, 6, false, true),
            Some(Rewrite::SplitInPlace { at: 6 })
        );
    }

    #[test]
    fn an_underfull_leaf_merges_or_is_replaced() {
        let v = slots(&KEYS[..2], 1);
        assert_eq!(plan(Goal::Room(2), &v, 6, true, false), Some(Rewrite::Merge));
        assert_eq!(plan(Goal::Room(2), &v, 6, false, false), Some(Rewrite::Replace));
        assert_eq!(plan(Goal::Room(2), &v, 6, false, true), Some(Rewrite::Replace));
    }

    #[test]
    fn versions_of_one_key_are_never_parted() {
        let v = slots(&KEYS[..1], 12);
        assert_eq!(plan(Goal::Room(2), &v, 6, false, false), Some(Rewrite::Replace));
        assert_eq!(plan(Goal::Room(2), &v, 6, false, true), Some(Rewrite::Replace));
    }

    #[test]
    fn a_merge_is_planned_only_when_possible() {
        let v = slots(&KEYS[..2], 1);
        assert_eq!(plan(Goal::Merge, &v, 6, false, false), None);
        assert_eq!(plan(Goal::Merge, &v, 6, true, true), Some(Rewrite::Merge));
    }

    #[test]
    fn a_cut_parts_after_its_key_whatever_the_fill() {
        let v = slots(&KEYS, 1);
        for (after, at) in [(&b"c"[..], 3), (b"cc", 3), (b"0", 0), (b"z", 6)] {
            let goal = Goal::Cut { after, need: 4 };
            assert_eq!(plan(goal, &v, 100, true, true), Some(Rewrite::Cut { at }), "{after:?}");
        }
    }
}
