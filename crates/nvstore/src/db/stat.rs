//! What a pool reports about itself: [`Stat`] for `nvstore stat` and the
//! leaves the index routes to.

use super::{Db, Engine};
use crate::format::header::EngineKind;
use crate::hash::engine::HashEngine;
use crate::pmem::Space;
use crate::recovery::Recovery;
use crate::tree::Tree;

/// A leaf as [`Db::leaves`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeafInfo {
    /// Offset of the leaf in the pool.
    pub offset: u64,
    /// Its node size in bytes.
    pub size_bytes: u64,
    /// Elements appended to it (live, superseded and deletion markers).
    pub elements: u64,
}

/// What `nvstore stat` reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Stat {
    pub path: String,
    pub format_version: u32,
    pub uuid: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub mapping: &'static str,
    pub flush: &'static str,
    /// Whether the pool was cleanly shut down when this open found it.
    pub clean_shutdown: bool,
    /// "tree" or "hash".
    pub engine: &'static str,
    /// Tree pools: "nv" or "isle"; hash pools: "none".
    pub leaf_format: &'static str,
    /// Tree pools: the leaf size of new leaves; hash pools: 0.
    pub node_size: u32,
    pub keys: u64,
    pub leaves: u64,
    /// Hash pools: the global depth of the table's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_depth: Option<u32>,
    /// Hash pools: the hash the table places its keys by, "xxh3" (pools
    /// created now) or "fnv1a" (pools created before it replaced FNV-1a).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<&'static str>,
    pub last_recovery: Recovery,
    pub splits: u64,
    pub replaces: u64,
    pub merges: u64,
    pub rebuilds: u64,
    pub rebuild_ms: f64,
    /// Adaptivity: leaves rewritten larger / smaller than the leaf they
    /// replaced, and parent-of-leaf nodes given a larger limit at rebuild.
    pub leaves_enlarged: u64,
    pub leaves_shrunk: u64,
    pub hot_plns: u64,
    /// Largest and mean leaf size in bytes (adaptivity changes them).
    pub largest_leaf_bytes: u64,
    pub mean_leaf_bytes: f64,
    /// Newest commit timestamp visible now.
    pub last_commit_ts: u64,
    /// Timestamp of the oldest live snapshot (or transaction), if any:
    /// leaf rewrites keep the versions it reads.
    pub oldest_snapshot: Option<u64>,
    /// Live snapshots and transactions.
    pub snapshots: u64,
    /// Transactions and write batches committed since open, those that
    /// spanned several leaves, and commits refused for a conflict.
    pub commits: u64,
    pub multi_leaf_commits: u64,
    pub conflicts: u64,
}

impl<S: Space> Db<S> {
    /// Pool facts and engine counters.
    pub fn stat(&self) -> Stat {
        with_tree!(self, t => self.stat_of(t), h => self.stat_of_hash(h))
    }

    fn stat_of_hash(&self, h: &HashEngine<S>) -> Stat {
        Stat {
            path: self.path.display().to_string(),
            format_version: self.header.version,
            uuid: self.uuid(),
            size_bytes: self.pool_size(),
            used_bytes: self.used_bytes(),
            mapping: self.space().mapping().as_str(),
            flush: self.space().flush_kind().as_str(),
            clean_shutdown: self.was_clean,
            engine: EngineKind::Hash.as_str(),
            leaf_format: "none",
            node_size: 0,
            keys: self.len(),
            leaves: 0,
            hash_depth: Some(h.table.depth()),
            key_hash: Some(h.table.key_hash().name()),
            last_recovery: self.recovery,
            // Segment splits of the table since open.
            splits: h.table.splits(),
            replaces: 0,
            merges: 0,
            rebuilds: 0,
            rebuild_ms: 0.0,
            leaves_enlarged: 0,
            leaves_shrunk: 0,
            hot_plns: 0,
            largest_leaf_bytes: 0,
            mean_leaf_bytes: 0.0,
            last_commit_ts: 0,
            oldest_snapshot: None,
            snapshots: 0,
            commits: 0,
            multi_leaf_commits: 0,
            conflicts: 0,
        }
    }

    fn uuid(&self) -> String {
        self.header.uuid.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn stat_of<L: crate::tree::leaf::LeafFormat>(&self, tree: &Tree<S, L>) -> Stat {
        use std::sync::atomic::Ordering::Relaxed;
        let st = &tree.stats;
        let ad = &tree.adaptive;
        let sizes: Vec<u64> = (tree.index.load().entries().iter())
            .filter(|e| e.leaf.off != 0)
            .map(|e| e.leaf.size)
            .collect();
        Stat {
            path: self.path.display().to_string(),
            format_version: self.header.version,
            uuid: self.uuid(),
            size_bytes: self.pool_size(),
            used_bytes: self.used_bytes(),
            mapping: self.space().mapping().as_str(),
            flush: self.space().flush_kind().as_str(),
            clean_shutdown: self.was_clean,
            engine: EngineKind::Tree.as_str(),
            leaf_format: self.header.leaf_format.as_str(),
            node_size: self.header.node_size,
            keys: self.len(),
            leaves: sizes.len() as u64,
            hash_depth: None,
            key_hash: None,
            last_recovery: self.recovery,
            splits: st.splits.load(Relaxed),
            replaces: st.replaces.load(Relaxed),
            merges: st.merges.load(Relaxed),
            rebuilds: st.rebuilds.load(Relaxed),
            rebuild_ms: st.rebuild_ns.load(Relaxed) as f64 / 1e6,
            leaves_enlarged: ad.enlarged.load(Relaxed),
            leaves_shrunk: ad.shrunk.load(Relaxed),
            hot_plns: ad.hot_plns.load(Relaxed),
            largest_leaf_bytes: sizes.iter().copied().max().unwrap_or(0),
            mean_leaf_bytes: sizes.iter().sum::<u64>() as f64 / sizes.len().max(1) as f64,
            last_commit_ts: tree.clock.last(),
            oldest_snapshot: tree.clock.oldest_snapshot(),
            snapshots: tree.clock.snapshots() as u64,
            commits: st.commits.load(Relaxed),
            multi_leaf_commits: st.multi_leaf_commits.load(Relaxed),
            conflicts: st.conflicts.load(Relaxed),
        }
    }

    /// Every leaf the inner index routes to, in key order.
    pub fn leaves(&self) -> Vec<LeafInfo> {
        self.index_leaves()
            .into_iter()
            .filter(|&(off, _, _)| off != 0)
            .map(|(offset, size_bytes, elements)| LeafInfo {
                offset,
                size_bytes,
                elements,
            })
            .collect()
    }
}
