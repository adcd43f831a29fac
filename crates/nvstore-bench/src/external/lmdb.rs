//! LMDB (Symas Lightning Memory-Mapped Database, via the `heed` crate) as a
//! benchmark engine: what a user would pick instead of a persistent-memory
//! tree. Built only with the `lmdb` cargo feature.
//!
//! Layout: one unnamed database, keys the 8 big-endian bytes of the u64 (so
//! LMDB's byte order is key order), values the 8 little-endian bytes. The
//! environment lives in a fresh directory under `--pool-dir` (/dev/shm by
//! default: DRAM-backed, so `fdatasync` is cheap), removed when the engine
//! is dropped.
//!
//! - `lmdb`: one durable write transaction per insert, update and delete
//!   (LMDB's default flags: the commit writes the pages and syncs the data
//!   file before returning), one read transaction per search and scan;
//! - `lmdb-batch`: writes are buffered and committed together every
//!   [`BATCH`] operations, so an operation is durable only once its batch
//!   commits (reads see buffered writes).
//!
//! LMDB writes through its own file I/O, not nvstore's `pmem` layer, so its
//! flushes and fences are not counted (reported as 0).

#![allow(
    unsafe_code,
    reason = "LMDB's environment open is an unsafe fn (one environment per file per process, which `create` ensures)"
)]

use std::collections::HashMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use heed::types::Bytes;
use heed::{Database, Env, EnvOpenOptions};
use parking_lot::Mutex;

use super::ExternalKv;
use crate::engine::BenchIndex;
use nvstore::{Error, Result};

/// Operations per commit of `lmdb-batch`.
pub const BATCH: usize = 64;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn lmdb_err(e: heed::Error) -> Error {
    Error::InvalidOption(format!("lmdb: {e}"))
}

/// An LMDB environment as a benchmark engine.
pub struct Lmdb {
    env: Env,
    db: Database<Bytes, Bytes>,
    dir: PathBuf,
    batched: bool,
    /// `lmdb-batch`: key -> Some(value) / None (deleted), not yet committed.
    pending: Mutex<HashMap<u64, Option<u64>>>,
}

impl Lmdb {
    /// A fresh environment in a new directory under `parent`, sized for
    /// `map_size` bytes.
    pub fn create(parent: &Path, map_size: usize, batched: bool) -> Result<Lmdb> {
        let dir = parent.join(format!(
            "nvstore-bench-lmdb-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // SAFETY: heed marks `open` unsafe because opening one environment
        // twice in a process, or one another process changes, is undefined
        // behaviour; this directory was just created for this engine alone.
        let env = unsafe { EnvOpenOptions::new().map_size(map_size).max_dbs(1).open(&dir) }.map_err(lmdb_err)?;
        let mut wtxn = env.write_txn().map_err(lmdb_err)?;
        let db: Database<Bytes, Bytes> = env.create_database(&mut wtxn, None).map_err(lmdb_err)?;
        wtxn.commit().map_err(lmdb_err)?;
        Ok(Lmdb {
            env,
            db,
            dir,
            batched,
            pending: Mutex::new(HashMap::new()),
        })
    }

    fn committed(&self, key: u64) -> Option<u64> {
        let rtxn = self.env.read_txn().expect("lmdb read txn");
        self.db
            .get(&rtxn, &key.to_be_bytes())
            .expect("lmdb get")
            .map(|v| u64::from_le_bytes(v.try_into().expect("8-byte value")))
    }
}

impl ExternalKv for Lmdb {
    /// One write: a durable transaction of its own, or into the batch.
    fn write(&self, key: u64, value: Option<u64>) {
        if !self.batched {
            let mut wtxn = self.env.write_txn().expect("lmdb write txn");
            match value {
                Some(v) => self.db.put(&mut wtxn, &key.to_be_bytes(), &v.to_le_bytes()),
                None => self.db.delete(&mut wtxn, &key.to_be_bytes()).map(|_| ()),
            }
            .expect("lmdb write");
            wtxn.commit().expect("lmdb commit");
            return;
        }
        let mut p = self.pending.lock();
        p.insert(key, value);
        if p.len() >= BATCH {
            let mut wtxn = self.env.write_txn().expect("lmdb write txn");
            for (k, v) in p.drain() {
                match v {
                    Some(v) => self.db.put(&mut wtxn, &k.to_be_bytes(), &v.to_le_bytes()),
                    None => self.db.delete(&mut wtxn, &k.to_be_bytes()).map(|_| ()),
                }
                .expect("lmdb write");
            }
            wtxn.commit().expect("lmdb commit");
        }
    }

    fn lookup(&self, key: u64) -> Option<u64> {
        if self.batched {
            if let Some(&v) = self.pending.lock().get(&key) {
                return v;
            }
        }
        self.committed(key)
    }
}

impl Drop for Lmdb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl BenchIndex for Lmdb {
    fn name(&self) -> &'static str {
        if self.batched {
            "lmdb-batch"
        } else {
            "lmdb"
        }
    }
    fn insert(&self, key: u64, value: u64) {
        self.write(key, Some(value));
    }
    fn update(&self, key: u64, value: u64) -> bool {
        self.update_existing(key, value)
    }
    fn delete(&self, key: u64) -> bool {
        self.delete_existing(key)
    }
    fn search(&self, key: u64) -> Option<u64> {
        self.lookup(key)
    }
    fn scan(&self, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        if n == 0 {
            return;
        }
        let from = start.to_be_bytes();
        let rtxn = self.env.read_txn().expect("lmdb read txn");
        let range = (Bound::Included(&from[..]), Bound::Unbounded);
        let iter = self.db.range(&rtxn, &range).expect("lmdb range");
        if !self.batched {
            for kv in iter.take(n) {
                let (k, v) = kv.expect("lmdb range item");
                out.push((
                    u64::from_be_bytes(k.try_into().expect("8-byte key")),
                    u64::from_le_bytes(v.try_into().expect("8-byte value")),
                ));
            }
            return;
        }
        // Merge the committed range with the batch: enough committed pairs
        // that buffered deletes cannot leave fewer than `n`, and buffered
        // keys only up to the last committed key read (unless none is left).
        let p = self.pending.lock();
        let want = n.saturating_add(p.len());
        let window: Vec<(u64, u64)> = iter
            .take(want)
            .map(|kv| {
                let (k, v) = kv.expect("lmdb range item");
                (
                    u64::from_be_bytes(k.try_into().expect("8-byte key")),
                    u64::from_le_bytes(v.try_into().expect("8-byte value")),
                )
            })
            .collect();
        let bound = if window.len() < want {
            u64::MAX
        } else {
            window.last().map_or(u64::MAX, |&(k, _)| k)
        };
        let mut merged: std::collections::BTreeMap<u64, Option<u64>> =
            window.into_iter().map(|(k, v)| (k, Some(v))).collect();
        for (&k, &v) in p.iter().filter(|(&k, _)| k >= start && k <= bound) {
            merged.insert(k, v);
        }
        out.extend(merged.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).take(n));
    }
    fn leaf(&self) -> &'static str {
        "b+tree/cow"
    }
}
