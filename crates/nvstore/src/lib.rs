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
pub mod check;
pub mod crashtest;
pub mod db;
pub mod error;
pub mod format;
mod hash;
pub mod pmem;
pub mod recovery;
pub mod salvage;
pub mod tree;
pub mod txn;
pub mod units;

/// The README's examples compile and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use check::CheckReport;
pub use db::{Db, Options, Stat};
pub use error::{Error, Result};
pub use format::header::LeafKind;
pub use recovery::{Recovery, RecoveryKind};
pub use tree::adaptive::Strategy as Adaptive;
pub use txn::{Snapshot, Txn, WriteBatch};
