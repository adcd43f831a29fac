//! Engines a user would pick instead of nvstore (NV-Tree §6, Isle-Tree §V), outside the
//! `pmem` layer: their flushes are not counted.
//!
//! - [`lmdb`] (cargo feature `lmdb`, off by default: it compiles LMDB's C
//!   source): `--engine lmdb` and `--engine lmdb-batch` in `bench micro` and
//!   `bench compare`;
//! - [`rocksdb`] (cargo feature `rocksdb`, off by default: it links the
//!   system's `librocksdb`, Debian `librocksdb-dev`): `--engine rocksdb` and
//!   `--engine rocksdb-batch`;
//! - [`redis_server`]: a `redis-server` started by the benchmark for `bench
//!   ycsb --target redis` (needs no build dependency, only the binary).

#[cfg(feature = "lmdb")]
pub mod lmdb;
pub mod redis_server;
#[cfg(feature = "rocksdb")]
pub mod rocksdb;

/// What the external engines' [`BenchIndex`](crate::engine::BenchIndex)
/// impls are built on: one write (a value, or `None` to delete) and one
/// lookup, both seeing the writes a batch still buffers. Update and delete
/// of a present key follow from these two the same way for every engine.
#[cfg(any(feature = "lmdb", feature = "rocksdb"))]
pub(crate) trait ExternalKv {
    /// Stores `value` for `key`, or deletes `key` if `None`.
    fn write(&self, key: u64, value: Option<u64>);
    /// The value of `key`, if present.
    fn lookup(&self, key: u64) -> Option<u64>;
    /// Replaces the value of a present key; false if absent.
    fn update_existing(&self, key: u64, value: u64) -> bool {
        if self.lookup(key).is_none() {
            return false;
        }
        self.write(key, Some(value));
        true
    }
    /// Removes a present key; false if absent.
    fn delete_existing(&self, key: u64) -> bool {
        if self.lookup(key).is_none() {
            return false;
        }
        self.write(key, None);
        true
    }
}
