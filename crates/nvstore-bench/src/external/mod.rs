//! Engines a user would pick instead of nvstore (DESIGN §14), outside the
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
