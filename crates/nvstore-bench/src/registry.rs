//! The engines the benchmarks can run, by name, and how each is built: on a
//! given space ([`engine_in`]) or on a fresh pool file ([`open_engine`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::baselines::{Cdds, FastFair, FpTree, Lcb, TreeEngine, Volatile, WbTree};
use crate::engine::{BenchIndex, KeyKind};
use nvstore::pmem::file::FileOptions;
use nvstore::pmem::{FileSpace, OpenMode, Space};
use nvstore::{Error, LeafKind, Result};

/// Every engine, in report order; `tree` is nvstore itself, `hash` its
/// hash engine (through `Db` like the tree); LMDB and RocksDB with their
/// cargo features.
pub const ENGINES: &[&str] = &[
    "tree",
    "hash",
    "volatile",
    "lcb",
    "cdds",
    "fptree",
    "fastfair",
    "wbtree",
    #[cfg(feature = "lmdb")]
    "lmdb",
    #[cfg(feature = "lmdb")]
    "lmdb-batch",
    #[cfg(feature = "rocksdb")]
    "rocksdb",
    #[cfg(feature = "rocksdb")]
    "rocksdb-batch",
];

/// LMDB's map size: address space only; the file grows as pages are used.
#[cfg(feature = "lmdb")]
const LMDB_MAP_SIZE: usize = 16 << 30;

/// How to build an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub node_size: u64,
    pub latency_ns: u64,
    pub leaf: LeafKind,
    pub key_kind: KeyKind,
    pub pool_dir: PathBuf,
    /// Initial pool size (pools grow on demand).
    pub pool_size: u64,
    /// Map every page of the pool when it is created and when it grows
    /// ([`FileOptions::populate`]), and warm each measuring thread's heap
    /// before the clock ([`crate::micro::warm_heap`]), so no engine's
    /// measured operations pay the first touch of a page.
    pub populate: bool,
}

impl EngineConfig {
    pub fn new(node_size: u64) -> EngineConfig {
        EngineConfig {
            node_size,
            latency_ns: 0,
            leaf: LeafKind::Nv,
            key_kind: KeyKind::U64,
            pool_dir: "/dev/shm".into(),
            pool_size: 64 << 20,
            populate: false,
        }
    }
}

/// Initial pool size for N keys (pools grow on demand; this avoids growing
/// during most runs without reserving much more than needed).
pub fn pool_size_for(keys: u64) -> u64 {
    (keys * 48).max(64 << 20).next_multiple_of(2 << 20)
}

/// Builds engine `name` over `space` (`path` names the pool in messages).
pub fn engine_in<S: Space>(name: &str, space: S, path: &Path, cfg: &EngineConfig) -> Result<Box<dyn BenchIndex>> {
    if cfg.key_kind == KeyKind::String && name != "tree" && name != "hash" {
        return Err(Error::InvalidOption(format!(
            "engine {name} stores 8-byte keys only; --key-kind string needs --engine tree or hash"
        )));
    }
    let ns = cfg.node_size;
    Ok(match name {
        "tree" => {
            let ns32 = u32::try_from(ns).map_err(|_| Error::InvalidOption(format!("node size {ns} is too large")))?;
            Box::new(TreeEngine::create(space, path, ns32, cfg.leaf, cfg.key_kind)?)
        }
        "hash" => Box::new(TreeEngine::create_hash(space, path, cfg.key_kind)?),
        "volatile" => Box::new(Volatile::new(ns)),
        "lcb" => Box::new(Lcb::new(Arc::new(space), ns)?),
        "cdds" => Box::new(Cdds::new(Arc::new(space), ns)?),
        "fptree" => Box::new(FpTree::new(Arc::new(space), ns)?),
        "fastfair" => Box::new(FastFair::new(Arc::new(space), ns)?),
        "wbtree" => Box::new(WbTree::new(Arc::new(space), ns)?),
        #[cfg(feature = "lmdb")]
        "lmdb" | "lmdb-batch" => Box::new(crate::external::lmdb::Lmdb::create(
            &cfg.pool_dir,
            LMDB_MAP_SIZE,
            name == "lmdb-batch",
        )?),
        #[cfg(feature = "rocksdb")]
        "rocksdb" | "rocksdb-batch" => Box::new(crate::external::rocksdb::RocksDb::create(
            &cfg.pool_dir,
            name == "rocksdb-batch",
        )?),
        _ => return Err(unknown_engine(name)),
    })
}

fn unknown_engine(name: &str) -> Error {
    Error::InvalidOption(format!(
        "unknown engine '{name}' (expected one of {} or all)",
        ENGINES.join(", ")
    ))
}

static POOL_SEQ: AtomicU64 = AtomicU64::new(0);

/// Builds engine `name` on a fresh pool file in `cfg.pool_dir` (the volatile
/// engine uses none). The file is unlinked as soon as it is mapped.
pub fn open_engine(name: &str, cfg: &EngineConfig) -> Result<Box<dyn BenchIndex>> {
    if !ENGINES.contains(&name) {
        return Err(unknown_engine(name));
    }
    #[cfg(feature = "lmdb")]
    if name.starts_with("lmdb") {
        if cfg.key_kind == KeyKind::String {
            return Err(Error::InvalidOption(format!(
                "engine {name} stores 8-byte keys only; --key-kind string needs --engine tree or hash"
            )));
        }
        return Ok(Box::new(crate::external::lmdb::Lmdb::create(
            &cfg.pool_dir,
            LMDB_MAP_SIZE,
            name == "lmdb-batch",
        )?));
    }
    #[cfg(feature = "rocksdb")]
    if name.starts_with("rocksdb") {
        if cfg.key_kind == KeyKind::String {
            return Err(Error::InvalidOption(format!(
                "engine {name} stores 8-byte keys only; --key-kind string needs --engine tree or hash"
            )));
        }
        return Ok(Box::new(crate::external::rocksdb::RocksDb::create(
            &cfg.pool_dir,
            name == "rocksdb-batch",
        )?));
    }
    if name == "volatile" {
        if cfg.key_kind == KeyKind::String {
            return Err(Error::InvalidOption(
                "engine volatile stores 8-byte keys only; --key-kind string needs --engine tree or hash".into(),
            ));
        }
        return Ok(Box::new(Volatile::new(cfg.node_size)));
    }
    let path = cfg.pool_dir.join(format!(
        "nvstore-bench-{}-{}-{}.pool",
        std::process::id(),
        name,
        POOL_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let fo = FileOptions {
        mode: OpenMode::Create { size: cfg.pool_size },
        latency_ns: cfg.latency_ns,
        populate: cfg.populate,
        ..FileOptions::default()
    };
    let space = FileSpace::open(&path, &fo)?;
    // The mapping keeps the pages; nothing is left behind if we crash.
    let _ = std::fs::remove_file(&path);
    engine_in(name, space, &path, cfg)
}

/// Engine names from `all` or a comma list.
pub fn parse_engines(s: &str) -> Result<Vec<&'static str>> {
    if s.trim() == "all" {
        return Ok(ENGINES.to_vec());
    }
    s.split(',')
        .map(|e| {
            let e = e.trim();
            ENGINES
                .iter()
                .copied()
                .find(|&x| x == e)
                .ok_or_else(|| unknown_engine(e))
        })
        .collect()
}
