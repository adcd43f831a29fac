//! The adapter for nvstore itself: the NV-Tree of Yang et al. (NV-Tree: A
//! Consistent and Workload-adaptive Tree Structure for NVM; FAST'15) as built
//! in `crates/nvstore`, behind the same [`BenchIndex`] interface.
//!
//! Layout: see `crates/nvstore/src/format/leaf_nv.rs` (unsorted append-only
//! leaves of 32-byte elements published by one count word; DRAM inner
//! nodes). Keys are 8-byte big-endian (so byte order is key order) or, with
//! `KeyKind::String`, `user` + 20 zero-padded decimal digits; values are the
//! 8 bytes of the u64, little-endian.
//!
//! The same adapter runs the hash engine (`--engine hash`: a persistent
//! CCEH-style table with an ordered DRAM index, `crates/nvstore/src/hash/`)
//! through the same `Db` calls, so the two engines pay the same API costs.
//!
//! `update` is a `get` followed by a `put`: `Db` has no "replace if present"
//! call, so the tree pays one extra DRAM lookup per update (no extra flush).

use std::ops::ControlFlow;
use std::path::Path;

use crate::engine::{BenchIndex, EngineStats, KeyKind};
use nvstore::pmem::Space;
use nvstore::{Db, EngineKind, LeafKind, Options, Result};

/// nvstore's `Db` as a benchmark engine: the tree, or the hash engine.
pub struct TreeEngine<S: Space> {
    db: Db<S>,
    kind: KeyKind,
    name: &'static str,
    leaf: &'static str,
}

/// Encoded key: up to 24 bytes on the stack.
struct Key {
    buf: [u8; 24],
    len: usize,
}

impl Key {
    #[inline]
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<S: Space> TreeEngine<S> {
    /// Writes a fresh pool into the zeroed `space` (`path` names it in messages).
    pub fn create(space: S, path: &Path, node_size: u32, leaf: LeafKind, kind: KeyKind) -> Result<TreeEngine<S>> {
        // Fixed node sizes: these runs compare engines at a node size (NV-Tree
        // Fig. 5-11); `bench adaptive` measures adaptivity.
        let opts = Options {
            node_size,
            leaf,
            adaptive: nvstore::Adaptive::Off,
            ..Options::default()
        };
        let db = Db::create_in(space, path, &opts)?;
        Ok(TreeEngine {
            db,
            kind,
            name: "tree",
            leaf: leaf.as_str(),
        })
    }

    /// A fresh pool of the hash engine in the zeroed `space` (no leaves, so
    /// no node size or leaf format).
    pub fn create_hash(space: S, path: &Path, kind: KeyKind) -> Result<TreeEngine<S>> {
        let opts = Options {
            engine: EngineKind::Hash,
            ..Options::default()
        };
        let db = Db::create_in(space, path, &opts)?;
        Ok(TreeEngine {
            db,
            kind,
            name: "hash",
            leaf: "-",
        })
    }

    pub fn db(&self) -> &Db<S> {
        &self.db
    }

    #[inline]
    fn key(&self, k: u64) -> Key {
        let mut buf = [0u8; 24];
        match self.kind {
            KeyKind::U64 => {
                buf[..8].copy_from_slice(&k.to_be_bytes());
                Key { buf, len: 8 }
            }
            KeyKind::String => {
                buf[..4].copy_from_slice(b"user");
                let mut x = k;
                for i in (4..24).rev() {
                    buf[i] = b'0' + (x % 10) as u8;
                    x /= 10;
                }
                Key { buf, len: 24 }
            }
        }
    }

    fn decode_key(&self, b: &[u8]) -> u64 {
        match self.kind {
            KeyKind::U64 => u64::from_be_bytes(b.try_into().expect("8-byte key")),
            KeyKind::String => b[4..].iter().fold(0u64, |acc, d| acc * 10 + (d - b'0') as u64),
        }
    }
}

fn decode_value(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    u64::from_le_bytes(v)
}

impl<S: Space> BenchIndex for TreeEngine<S> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn insert(&self, key: u64, value: u64) {
        let k = self.key(key);
        self.db
            .put(k.bytes(), &value.to_le_bytes())
            .unwrap_or_else(|e| panic!("{}: put failed: {e}", self.name));
    }
    fn update(&self, key: u64, value: u64) -> bool {
        let k = self.key(key);
        self.db
            .update(k.bytes(), &value.to_le_bytes())
            .unwrap_or_else(|e| panic!("{}: update failed: {e}", self.name))
    }
    fn delete(&self, key: u64) -> bool {
        let k = self.key(key);
        self.db
            .delete(k.bytes())
            .unwrap_or_else(|e| panic!("{}: delete failed: {e}", self.name))
    }
    fn search(&self, key: u64) -> Option<u64> {
        let k = self.key(key);
        self.db.get_with(k.bytes(), decode_value).expect("key size is valid")
    }
    fn scan(&self, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        if n == 0 {
            return;
        }
        let k = self.key(start);
        let want = out.len() + n;
        self.db
            .range_with(k.bytes().., |kb, vb| {
                out.push((self.decode_key(kb), decode_value(vb)));
                if out.len() < want {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(())
                }
            })
            .expect("pool is sound");
    }
    fn stats(&self) -> EngineStats {
        let s = self.db.stat();
        EngineStats {
            splits: s.splits,
            rebuilds: s.rebuilds,
            rebuild_ms: s.rebuild_ms,
        }
    }
    fn concurrent(&self) -> bool {
        true
    }
    fn leaf(&self) -> &'static str {
        self.leaf
    }
}
