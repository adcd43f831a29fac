//! AsymNVM over TCP: the disaggregated framework of AsymNVM §3–5.
//!
//! A *back-end* ([`backend::Backend`]) owns one persistent pool through the
//! engine's `pmem` layer and knows no data structure: it offers only the fixed
//! API of AsymNVM Table 1 ([`wire::Verb`]): read, write, operation-log append,
//! `tx_write` (a batch of memory logs, atomic and durable, then replayed into
//! the data area), malloc and free (the back-end half of the two-tier slab
//! allocator), a naming space (roots, lock words), the SWMR writer lock and
//! the sequence-number reader lock.
//!
//! *Front-ends* ([`remote::Remote`]) run the data structures
//! ([`structures`]) and reach a back-end through a [`transport::Transport`]:
//! one `post` of a list of verbs is one round trip. The front-end keeps the
//! operation log on the critical path, batches memory logs, caches remote
//! data and carves slabs into small blocks (AsymNVM §4.3–4.4, §5.2).
//!
//! docs/asym-protocol.md describes the wire format and the back-end's
//! persistent layout.

#![deny(unsafe_code)]

pub mod apps;
pub mod backend;
pub mod cache;
pub mod cli;
pub mod failbench;
pub mod failover;
pub mod mirror;
pub mod partition;

pub mod points;
pub mod remote;

pub mod server;
pub mod space;
pub mod structures;

pub mod transport;
pub mod wire;

pub use backend::{Backend, Layout};
pub use partition::{PartitionMap, Partitioned};
pub use remote::{FlushTimer, Mode, Remote, RemoteOptions};
pub use space::{open_db, open_db_as, RemoteDb, RemoteSpace, SpaceOptions};

pub use transport::{Client, Counters, Fault, FaultyTransport, LocalTransport, TcpTransport, Transport};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the back-end, the transports and the front-end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A frame failed its checksum or could not be parsed.
    #[error("torn or malformed frame")]
    Torn,
    /// The back-end rejected a whole request frame.
    #[error("request rejected by the back-end: {0:?}")]
    Rejected(wire::Status),
    /// The back-end answered a verb with an error.
    #[error("back-end refused {verb}: {code:?}: {msg}")]
    Verb {
        verb: &'static str,
        code: wire::Code,
        msg: String,
    },
    /// The pool is not an AsymNVM back-end pool.
    #[error("{0}")]
    NotAPool(String),
    /// The engine's pool layer failed.
    #[error(transparent)]
    Pool(#[from] nvstore::Error),
    /// The connection failed (the back-end died, a fault was injected).
    #[error("transport: {0}")]
    Io(#[from] std::io::Error),
    /// The back-end answered something the protocol does not allow here.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A reader's view was overtaken by the writer (a replay ran between its
    /// reads, or its versioned read outlasted the reclamation delay); the
    /// read section runs again. Never returned by a read section.
    #[error("read overtaken by a concurrent write")]
    Retry,
    /// A read section was overtaken `attempts` times in a row and gave up.
    #[error("read gave up after {attempts} attempts overtaken by writes")]
    Contended { attempts: u32 },
    /// The cluster service (etcd) failed or refused.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A key or back-end that does not fit the partition map.
    #[error("partition: {0}")]
    Partition(String),
}

impl Error {
    /// Whether the failure lost the connection or the session (so a new
    /// session and recovery are needed), rather than a refused request.
    pub fn is_disconnect(&self) -> bool {
        matches!(self, Error::Io(_) | Error::Rejected(_) | Error::Torn)
    }
}
