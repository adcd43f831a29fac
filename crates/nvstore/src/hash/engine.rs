//! The hash engine as `Db` sees it: the persistent table for point
//! operations plus the ordered DRAM index for range and prefix queries
//! (KVS B+Tree index §2), on one pool.
//!
//! - Point gets go straight to the table; the index is not consulted.
//! - Writes go to the table first (durable when it returns), then to the
//!   index. One mutex serialises writers across both, so the index always
//!   names exactly the table's keys once a write returns (the table and the
//!   index each serialise their own writers already; the mutex only makes
//!   the pair of updates one step).
//! - A range walks one snapshot of the index and reads each key's value
//!   from the table; a key deleted meanwhile is skipped, so a range sees
//!   every key that was present throughout it and none that never was.
//! - Open always scans the table: it validates every published slot, lists
//!   the blocks the allocator rebuild needs, and rebuilds the index. The
//!   header's clean word only records that the last close was clean.

use std::ops::Bound as RB;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::index::{self, Index};
use super::table::HashTable;
use crate::alloc::Allocator;
use crate::check::CheckReport;
use crate::error::{Error, Result};
use crate::format::header::{self, Header};
use crate::pmem::Space;
use crate::recovery::{Recovery, RecoveryKind};
use crate::tree::mvcc::Clock;
use crate::tree::TreeStats;

/// The value of the header's clean word after a clean close of a hash
/// pool (nothing is saved: the next open rebuilds the index anyway).
pub const CLEAN_MARK: u64 = 1;

/// A hash pool opened by `Db`.
pub struct HashEngine<S: Space> {
    pub space: Arc<S>,
    pub alloc: Arc<Allocator>,
    pub table: HashTable<S>,
    pub index: Index<()>,
    writer: Mutex<()>,
    /// Hash pools keep no versions: this clock never advances (it is there
    /// so `Db::clock` answers on every engine).
    pub clock: Clock,
    /// Tree counters, all zero on a hash pool (`Db::tree_stats`).
    pub stats: TreeStats,
}

impl<S: Space> HashEngine<S> {
    /// An empty table published at the header's hash root word. Called
    /// before the header is written, so a pool whose creation crashed is
    /// either "not a pool" or a pool with a whole, empty table.
    pub fn create(space: Arc<S>, alloc: Arc<Allocator>) -> Result<HashEngine<S>> {
        let table = HashTable::create(space.clone(), alloc.clone(), header::hash_root_word())?;
        Ok(HashEngine {
            space,
            alloc,
            table,
            index: Index::new(index::ORDER),
            writer: Mutex::new(()),
            clock: Clock::new(0),
            stats: TreeStats::default(),
        })
    }

    /// Opens the table of a pool whose header has been validated: scan and
    /// validate it, rebuild the allocator by reachability, rebuild the
    /// index. On a writable open the clean word is cleared first (before
    /// any other write), as on tree pools.
    pub fn open(space: Arc<S>, h: &Header) -> Result<(HashEngine<S>, Recovery)> {
        let t = Instant::now();
        let s = &*space;
        let scan = HashTable::recover(s, header::hash_root_word())?;
        let alloc = Arc::new(Allocator::rebuild(s, h.chunk_size, h.data_start, &scan.reachable)?);
        if s.writable() && header::clean_state(s) != 0 {
            header::set_clean_state(s, 0);
        }
        let table = HashTable::open(space.clone(), alloc.clone(), header::hash_root_word(), scan);
        let index = Index::rebuild(&table, index::ORDER, |_, _| ());
        let engine = HashEngine {
            space,
            alloc,
            table,
            index,
            writer: Mutex::new(()),
            clock: Clock::new(0),
            stats: TreeStats::default(),
        };
        let recovery = Recovery {
            kind: RecoveryKind::Rebuild,
            millis: t.elapsed().as_secs_f64() * 1e3,
        };
        Ok((engine, recovery))
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        crate::tree::check_key(key)?;
        Ok(self.table.get(key))
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        crate::tree::check_sizes(key, value)?;
        let _w = self.writer.lock();
        self.table.put(key, value)?;
        self.index.insert(key, ());
        Ok(())
    }

    /// Writes only over a key that exists (the ordered index already holds it).
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        crate::tree::check_sizes(key, value)?;
        let _w = self.writer.lock();
        if self.table.get(key).is_none() {
            return Ok(false);
        }
        self.table.put(key, value)?;
        Ok(true)
    }

    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        crate::tree::check_key(key)?;
        let _w = self.writer.lock();
        let removed = self.table.delete(key);
        if removed {
            self.index.remove(key);
        }
        Ok(removed)
    }

    pub fn len(&self) -> u64 {
        self.table.len()
    }

    /// Reads the table back and validates it without writing.
    pub fn validate(&self) -> Result<()> {
        let _w = self.writer.lock();
        self.table.scan().map(|_| ())
    }

    /// `nvstore check` on a hash pool: the table reads back valid, the
    /// index holds exactly the table's keys and keeps its B+-tree
    /// invariants, the key count matches, and every block is either
    /// reachable from the table or free (no leak, no double use).
    pub fn check(&self, h: &Header, path: &std::path::Path) -> CheckReport {
        let _w = self.writer.lock();
        let mut r = CheckReport::default();
        let mut problems = Vec::new();
        let scan = match self.table.scan() {
            Ok(scan) => scan,
            Err(e) => {
                r.problems.push(e.at(path).to_string());
                return r;
            }
        };
        let mut table_keys = Vec::new();
        self.table.for_each(|k, _| table_keys.push(k.to_vec()));
        table_keys.sort_unstable();
        if table_keys.windows(2).any(|w| w[0] == w[1]) {
            problems.push("the table lists a key twice".into());
        }
        let index_keys: Vec<Vec<u8>> = self.index.range(RB::Unbounded, RB::Unbounded).map(|(k, _)| k).collect();
        if index_keys != table_keys {
            let first = index_keys.iter().zip(&table_keys).position(|(a, b)| a != b);
            problems.push(format!(
                "the ordered index ({} keys) differs from the table ({} keys), first at position {:?}",
                index_keys.len(),
                table_keys.len(),
                first
            ));
        }
        if let Err(e) = self.index.check() {
            problems.push(format!("ordered index: {e}"));
        }
        r.keys = table_keys.len() as u64;
        r.elements = r.keys;
        if scan.len() != self.table.len() || scan.len() != r.keys {
            problems.push(format!(
                "key count {} differs from the {} keys the table holds ({} listed)",
                self.table.len(),
                scan.len(),
                r.keys
            ));
        }
        r.blobs = scan.blobs;
        r.reachable_blocks = scan.reachable.len() as u64;
        problems.extend(self.alloc.verify(&*self.space, &scan.reachable));
        r.used_bytes = self.alloc.used_bytes() + h.data_start;
        r.ok = problems.is_empty();
        r.problems = problems;
        r
    }

    /// Marks the pool cleanly closed (one root store) and syncs.
    pub fn close_clean(&self) -> Result<()> {
        let _w = self.writer.lock();
        header::set_clean_state(&*self.space, CLEAN_MARK);
        self.space.sync()
    }

    /// Pairs with keys between `lo` and `hi`, in key order or reversed.
    pub fn range(self: &Arc<Self>, lo: RB<Vec<u8>>, hi: RB<Vec<u8>>, reverse: bool) -> HashIter<S> {
        fn b(x: &RB<Vec<u8>>) -> RB<&[u8]> {
            x.as_ref().map(Vec::as_slice)
        }
        let keys = if reverse {
            self.index.range_rev(b(&lo), b(&hi))
        } else {
            self.index.range(b(&lo), b(&hi))
        };
        HashIter {
            engine: self.clone(),
            keys,
        }
    }
}

impl<S: Space> HashEngine<S> {
    /// Calls `f` on each pair between `lo` and `hi` (as [`HashEngine::range`]
    /// yields them) until it breaks.
    pub fn scan_with(
        self: &Arc<Self>,
        lo: RB<Vec<u8>>,
        hi: RB<Vec<u8>>,
        reverse: bool,
        mut f: impl FnMut(&[u8], &[u8]) -> std::ops::ControlFlow<()>,
    ) -> Result<()> {
        for (k, v) in self.range(lo, hi, reverse) {
            if f(&k, &v).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// A range over a hash pool: keys from one snapshot of the index, values
/// from the table.
pub struct HashIter<S: Space> {
    engine: Arc<HashEngine<S>>,
    keys: index::Iter<()>,
}

impl<S: Space> Iterator for HashIter<S> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<Self::Item> {
        for (k, ()) in self.keys.by_ref() {
            if let Some(v) = self.engine.table.get(&k) {
                return Some((k, v));
            }
        }
        None
    }
}

/// The error tree-only features give on a hash pool.
pub fn unsupported(what: &str) -> Error {
    Error::Unsupported(format!(
        "{what} need an nv tree pool: a hash pool keeps one version of each key and has no \
         multi-key commit (nvstore create POOL --engine tree --leaf nv)"
    ))
}
