//! `nvstore check`: verifies every invariant of an open pool without
//! writing (NV-Tree §4.6), and is the structural half of the crash checker.
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
//! 10. an nv leaf's compact prefix lies within its count and is in strictly
//!     increasing key order (search stops at the first larger key); an isle
//!     leaf's lines are each in strictly increasing key order, with valid codes.

use std::collections::BTreeSet;
use std::path::Path;

use crate::format::header::{self, Header};
use crate::pmem::Space;
use crate::recovery;
use crate::tree::index::Bound;
use crate::tree::leaf::{AuditCtx, LeafFormat};
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

/// `path` names the pool file in problems reported as errors.
pub fn check<S: Space, L: LeafFormat>(tree: &Tree<S, L>, h: &Header, path: &Path) -> CheckReport {
    let s = &*tree.space;
    let mut r = CheckReport::default();
    let mut problems = Vec::new();
    let pool = header::pool_size(s);
    let mut committed = header::txn_committed(s);
    // A read-only open leaves a clean pool's words as they are: a commit
    // record below the one its clean close sealed is damage to that word,
    // reported as such (the elements it would disown are committed).
    if let Some(sealed) = recovery::sealed::<S, L>(s, h).and_then(|x| x.commit) {
        if sealed > committed {
            problems.push(format!(
                "header word txn_commit ({committed}) is below the commit record the clean close sealed \
                 ({sealed}); a writable open restores it"
            ));
            committed = sealed;
        }
    }
    let last_ts = tree.clock.last();
    let chain = match recovery::walk_chain::<S, L>(s, h) {
        Ok(c) => c,
        Err(e) => {
            r.problems.push(e.at(path).to_string());
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
        let low = prev.clone();
        let in_bounds = |k: &[u8]| !low.covers(k) && e.max.covers(k);
        let ctx = AuditCtx {
            pool,
            committed,
            last_ts,
            in_bounds: &in_bounds,
        };
        let a = L::audit(s, &e.leaf, &ctx);
        r.elements += a.elements;
        reachable.extend(a.blobs);
        keys += a.live;
        problems.extend(a.problems);
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
