//! `nvstore check`: verifies every invariant of an open pool without
//! writing (DESIGN §12), and is the structural half of the crash checker.
//!
//! Invariants:
//! 1. the persistent leaf chain equals the leaves of the inner index, in order;
//! 2. every leaf's size is valid and its count within capacity;
//! 3. every published element has valid metadata and, where it needs one, a
//!    blob that is an allocated block with consistent lengths;
//! 4. a NEGATIVE element always follows a positive one for its key (§4.3);
//! 5. every key lies within its leaf's bounds `(previous max, max]`, and the
//!    bounds never decrease along the chain;
//! 6. the durable count a reader uses equals the persistent count;
//! 7. allocator coverage: reachable and free blocks are disjoint and cover
//!    every block (no leak, no double use);
//! 8. the key count equals the number of valid keys;
//! 9. a key's versions never decrease in append order, none is newer than
//!    the clock, and no element of a transaction without a commit record is
//!    published (a read-only open reads below them instead);
//! 10. a leaf's compact prefix lies within its count and is in strictly
//!     increasing key order (search stops at the first larger key).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use crate::format::header::{self, Header};
use crate::format::leaf_nv::{Layout, Meta};
use crate::pmem::Space;
use crate::recovery;
use crate::tree::index::Bound;
use crate::tree::leaf::LeafFormat;
use crate::tree::Tree;

/// What `check` found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub ok: bool,
    pub leaves: u64,
    pub elements: u64,
    pub keys: u64,
    pub blobs: u64,
    pub reachable_blocks: u64,
    pub used_bytes: u64,
    pub problems: Vec<String>,
}

pub fn check<S: Space, L: LeafFormat>(tree: &Tree<S, L>, h: &Header) -> CheckReport {
    let s = &*tree.space;
    let mut r = CheckReport::default();
    let mut problems = Vec::new();
    let pool = header::pool_size(s);
    let committed = s.load(header::TXN_COMMIT_OFF);
    let last_ts = tree.clock.last();
    let chain = match recovery::walk_chain::<S, L>(s, h, &tree.path) {
        Ok(c) => c,
        Err(e) => {
            r.problems.push(e.to_string());
            return r;
        }
    };
    let entries = tree.index.load().entries();
    let index_offs: Vec<u64> = entries.iter().map(|e| e.leaf.off).filter(|&o| o != 0).collect();
    if chain != index_offs {
        problems.push(format!(
            "leaf chain ({} leaves) differs from the inner index ({} leaves)",
            chain.len(),
            index_offs.len()
        ));
    }
    let mut reachable = BTreeSet::new();
    let mut prev = Bound::NegInf;
    let mut keys = 0u64;
    for e in entries.iter().filter(|e| e.leaf.off != 0) {
        let off = e.leaf.off;
        r.leaves += 1;
        reachable.insert(off);
        if e.max < prev {
            problems.push(format!("leaf {off}: bound decreases along the chain"));
        }
        let size = L::size(s, off);
        if size != e.leaf.size || size % 64 != 0 || size > pool.saturating_sub(off) {
            problems.push(format!("leaf {off}: invalid size {size}"));
            continue;
        }
        let persistent = L::count(s, off);
        if persistent > L::capacity(size) {
            problems.push(format!(
                "leaf {off}: count {persistent} exceeds capacity {}",
                L::capacity(size)
            ));
            continue;
        }
        let layout = Layout::read(s, off);
        if !L::layout_ok(s, off, size, persistent) {
            problems.push(format!(
                "leaf {off}: compact prefix of {} entries with {persistent} elements",
                layout.compact
            ));
            continue;
        }
        if (1..layout.compact).any(|i| layout.key_word(s, i - 1) >= layout.key_word(s, i)) {
            problems.push(format!("leaf {off}: compact prefix out of key order"));
        }
        let n = e.leaf.durable.load(Ordering::Acquire);
        // A read-only open cannot undo an uncommitted transaction's
        // elements; it only stops reading before them.
        let undone = !s.writable()
            && n < persistent
            && (n..persistent).all(|i| {
                let m = Meta::decode(layout.words(s, i)[3]);
                m.is_some_and(|m| m.txn && m.version > committed)
            });
        if n != persistent && !undone {
            problems.push(format!(
                "leaf {off}: durable count {n} differs from persistent count {persistent}"
            ));
        }
        let mut newest: HashMap<Vec<u8>, bool> = HashMap::new();
        let mut versions: HashMap<Vec<u8>, u64> = HashMap::new();
        for i in 0..n {
            let el = {
                let words = layout.words(s, i);
                let meta_w = words[3];
                if Meta::decode(meta_w).is_none() {
                    problems.push(format!("leaf {off} element {i}: invalid metadata {meta_w:#x}"));
                    continue;
                }
                if let Err(w) = recovery::leaf_blob_ok(s, &words, pool) {
                    problems.push(format!("leaf {off} element {i}: {w}"));
                    continue;
                }
                L::element(s, off, i)
            };
            r.elements += 1;
            if el.blob() != 0 {
                reachable.insert(el.blob());
            }
            if prev.covers(&el.key) || !e.max.covers(&el.key) {
                problems.push(format!(
                    "leaf {off} element {i}: key {} outside the leaf's bounds",
                    show(&el.key)
                ));
            }
            let meta = el.meta();
            if meta.txn && meta.version > committed {
                problems.push(format!(
                    "leaf {off} element {i}: part of transaction {} that has no commit record",
                    meta.version
                ));
            }
            if meta.version > last_ts {
                problems.push(format!(
                    "leaf {off} element {i}: version {} is newer than the clock ({last_ts})",
                    meta.version
                ));
            }
            if versions
                .insert(el.key.clone(), meta.version)
                .is_some_and(|v| v > meta.version)
            {
                problems.push(format!(
                    "leaf {off} element {i}: versions of key {} go backwards",
                    show(&el.key)
                ));
            }
            let neg = el.negative();
            if neg && newest.get(&el.key) != Some(&true) {
                problems.push(format!(
                    "leaf {off} element {i}: NEGATIVE element without a live positive one"
                ));
            }
            newest.insert(el.key, !neg);
        }
        keys += newest.values().filter(|v| **v).count() as u64;
        prev = e.max.clone();
    }
    r.keys = keys;
    if keys != tree.len() {
        problems.push(format!("key count {} differs from the {keys} valid keys", tree.len()));
    }
    r.blobs = reachable.len() as u64 - r.leaves;
    r.reachable_blocks = reachable.len() as u64;
    problems.extend(tree.alloc.verify(s, &reachable));
    r.used_bytes = tree.alloc.used_bytes() + h.data_start;
    r.ok = problems.is_empty();
    r.problems = problems;
    r
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}
