//! nvstore: a crash-consistent key-value store for persistent memory.
//!
//! See `README.md` for the user's view and `docs/` for the design as built.

#![deny(unsafe_code)]

pub mod error;
#[allow(unsafe_code)]
pub mod pmem;

pub use error::{Error, Result};
