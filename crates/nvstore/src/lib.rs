//! nvstore: a crash-consistent key-value store for persistent memory.
//!
//! The engine is the NV-Tree of Yang et al.: leaves live in the pool and are
//! always consistent (unsorted, append-only, published by one atomic count);
//! inner nodes live in DRAM and are rebuilt from the leaves after a crash.
//!
//! ```
//! use nvstore::{Db, Options};
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("example.nvs");
//! let db = Db::open(&path, Options::default())?;
//! db.put(b"apple", b"red")?;
//! db.put(b"banana", b"yellow")?;
//! assert_eq!(db.get(b"apple")?, Some(b"red".to_vec()));
//! let fruits: Vec<_> = db.prefix(b"b").map(|(k, _)| k).collect();
//! assert_eq!(fruits, vec![b"banana".to_vec()]);
//! db.close()?; // clean shutdown: the next open is instant
//! # Ok::<(), nvstore::Error>(())
//! ```
//!
//! See `README.md` for the user's view and `docs/` for the design as built.

#![deny(unsafe_code)]

pub mod alloc;
pub mod asyncdb;
pub mod check;
pub mod crashtest;
pub mod db;
pub mod error;
mod hash;
pub mod pmem;
pub mod salvage;
pub mod txn;
pub mod units;

// The engine's rooms: crate-private. The `testing` feature opens them to
// this crate's own integration tests, which poke pool bytes and tree
// internals; nothing else may depend on them.
#[cfg(feature = "testing")]
pub mod format;
#[cfg(not(feature = "testing"))]
pub(crate) mod format;
#[cfg(feature = "testing")]
pub mod recovery;
#[cfg(not(feature = "testing"))]
pub(crate) mod recovery;
#[cfg(feature = "testing")]
pub mod tree;
#[cfg(not(feature = "testing"))]
pub(crate) mod tree;

/// The README's examples compile and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use asyncdb::{AsyncDb, DbFuture};
pub use check::CheckReport;
pub use db::{Db, LeafInfo, Options, Stat};
pub use error::{Error, Result};
pub use format::header::{EngineKind, LeafKind};
pub use recovery::{Recovery, RecoveryKind};
pub use tree::adaptive::{Model as AdaptiveModel, Strategy as Adaptive};
pub use txn::{OneWrite, Snapshot, Txn, WriteBatch};
