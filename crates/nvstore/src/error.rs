//! Typed errors. Every error names the problem and, where there is one, the
//! pool file; none of them is raised after a partial change to the pool.
//! Engine code builds them without the pool file's path; [`crate::Db`]
//! attaches it once, at open and in its public methods ([`Error::at`]).

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: not an nvstore pool (bad magic number)")]
    NotAPool { path: PathBuf },

    #[error("{path}: pool format version {found} is not supported: this build reads versions 1 to {supported}; {}", if *found > *supported { "open it with a newer nvstore" } else { "it was not written by nvstore" })]
    WrongVersion { path: PathBuf, found: u32, supported: u32 },

    #[error("{path}: pool header checksum mismatch (the header is corrupt)")]
    BadChecksum { path: PathBuf },

    #[error("{path}: pool is truncated: header says {expected} bytes, file has {actual}")]
    Truncated { path: PathBuf, expected: u64, actual: u64 },

    #[error("{path}: pool is full ({size} bytes, limit {limit}); nothing was changed by the failed write")]
    PoolFull { path: PathBuf, size: u64, limit: u64 },

    #[error("{path}: no space left on the device while growing the pool; nothing was changed by the failed write")]
    DiskFull { path: PathBuf },

    #[error("{path}: pool is already open in another process")]
    Locked { path: PathBuf },

    #[error("{path}: permission denied")]
    PermissionDenied { path: PathBuf },

    #[error("{path}: no such pool file")]
    NotFound { path: PathBuf },

    #[error("{path}: a file already exists there")]
    AlreadyExists { path: PathBuf },

    /// Damaged media: a structure read from the pool breaks its format's
    /// rules. `off` is the pool offset of the damaged leaf, element or blob
    /// where one is known.
    #[error("{path}: {what}")]
    Corrupt {
        path: PathBuf,
        off: Option<u64>,
        what: String,
    },

    #[error("key is {len} bytes; the limit is {limit}")]
    KeyTooLarge { len: usize, limit: usize },

    #[error("value is {len} bytes; the limit is {limit}")]
    ValueTooLarge { len: usize, limit: usize },

    #[error("invalid option: {0}")]
    InvalidOption(String),

    #[error("pool is open read-only")]
    ReadOnly,

    /// The pool's commit clock has reached the limit of the 48-bit version
    /// field. No workload gets there (2^48 writes); a damaged version word
    /// does. Reads still work; nothing was written.
    #[error("{path}: commit timestamps are exhausted (last {last}, limit {limit}): a damaged version word or a pool past 2^48 writes; writes are refused, `nvstore salvage` copies the records into a fresh pool")]
    ClockExhausted { path: PathBuf, last: u64, limit: u64 },

    /// The pool's leaf format does not offer this operation.
    #[error("{0}")]
    Unsupported(String),

    /// A transaction lost a write-write race (first committer wins) or a
    /// watched key changed; nothing of it was written. Retry it.
    #[error("transaction conflict: a key it writes or watches was changed by a newer commit; nothing was written")]
    Conflict,

    /// An [`crate::AsyncDb`] request that was never run because the store
    /// shut down first; nothing of it was written.
    #[error("the async store is shut down: the request was not run, nothing of it was written")]
    Closed,

    /// An [`crate::AsyncDb`] request panicked on its worker (the worker
    /// lives on). A transaction that panicked wrote nothing.
    #[error("a request panicked on an async worker: {0}")]
    WorkerPanic(String),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Damage found in the pool where no offset is known. Engine code
    /// builds errors without the pool's path: the [`crate::Db`] that met
    /// it attaches the path once ([`Error::at`]).
    pub(crate) fn corrupt(what: impl Into<String>) -> Error {
        Error::Corrupt {
            path: PathBuf::new(),
            off: None,
            what: what.into(),
        }
    }

    /// Damage found at pool offset `off` (of a leaf, an element or a
    /// blob), without the pool's path (see [`Error::corrupt`]).
    pub(crate) fn corrupt_at(off: u64, what: impl Into<String>) -> Error {
        Error::Corrupt {
            path: PathBuf::new(),
            off: Some(off),
            what: what.into(),
        }
    }

    /// This error naming the pool file `pool`, where it names a pool file
    /// and does not name one yet. The engine reports errors without the
    /// path; [`crate::Db`] (at open and in its public methods) attaches it.
    pub fn at(mut self, pool: &Path) -> Error {
        use Error::*;
        match &mut self {
            NotAPool { path }
            | WrongVersion { path, .. }
            | BadChecksum { path }
            | Truncated { path, .. }
            | PoolFull { path, .. }
            | DiskFull { path }
            | Locked { path }
            | PermissionDenied { path }
            | NotFound { path }
            | AlreadyExists { path }
            | Corrupt { path, .. }
            | ClockExhausted { path, .. }
            | Io { path, .. } => {
                if path.as_os_str().is_empty() {
                    *path = pool.to_path_buf();
                }
            }
            KeyTooLarge { .. }
            | ValueTooLarge { .. }
            | InvalidOption(_)
            | ReadOnly
            | Unsupported(_)
            | Conflict
            | Closed
            | WorkerPanic(_) => {}
        }
        self
    }

    /// Whether this error reports damaged media.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }

    /// Maps an I/O error on `path` to the matching typed error.
    pub fn io(path: impl Into<PathBuf>, e: std::io::Error) -> Error {
        let path = path.into();
        match e.kind() {
            std::io::ErrorKind::PermissionDenied => Error::PermissionDenied { path },
            std::io::ErrorKind::NotFound => Error::NotFound { path },
            std::io::ErrorKind::AlreadyExists => Error::AlreadyExists { path },
            _ if e.raw_os_error() == Some(libc::ENOSPC) => Error::DiskFull { path },
            _ => Error::Io { path, source: e },
        }
    }
}
