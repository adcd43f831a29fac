//! What `nvstore serve` was asked to do, and its defaults.

use std::path::PathBuf;

use crate::resp::Limits;

/// What `nvstore serve` was asked to do.
#[derive(Clone, Debug)]
pub struct Config {
    /// Pool file (created if missing).
    pub pool: PathBuf,
    /// Initial size of a new pool.
    pub size: u64,
    /// Largest size the pool may grow to.
    pub max_size: u64,
    pub bind: String,
    /// TCP port; 0 picks a free one (the readiness line names it).
    pub port: u16,
    /// Threads that run engine calls (and as many reactor threads).
    pub threads: usize,
    pub requirepass: Option<String>,
    pub maxclients: usize,
    pub limits: Limits,
    /// Workload-adaptive node sizing strategy (NV-Tree §5).
    pub adaptive: nvstore::Adaptive,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pool: PathBuf::from("./nvstore.nvs"),
            size: 64 << 20,
            max_size: 1 << 40,
            bind: "127.0.0.1".into(),
            port: 6380,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            requirepass: None,
            maxclients: 10_000,
            limits: Limits::default(),
            adaptive: nvstore::db::DEFAULT_ADAPTIVE,
        }
    }
}
