//! What `nvstore serve` was asked to do, and its defaults.

use std::path::PathBuf;

use crate::keys::CompactLimits;
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
    /// Reactor threads, which also run the commands (1: a current-thread runtime).
    pub threads: usize,
    pub requirepass: Option<String>,
    pub maxclients: usize,
    pub limits: Limits,
    /// Workload-adaptive node sizing strategy (NV-Tree §5).
    pub adaptive: nvstore::Adaptive,
    /// When a hash is stored whole in its metadata value.
    pub compact: CompactLimits,
    /// When a sorted set is stored whole in its metadata value.
    pub zcompact: CompactLimits,
    /// Serve a pool on an AsymNVM back-end instead of `pool`.
    pub remote: Option<RemotePool>,
}

/// A pool on an AsymNVM back-end (`nvstore serve --remote ADDR`).
#[derive(Clone, Debug)]
pub struct RemotePool {
    pub addr: std::net::SocketAddr,
    /// The pool's name in the back-end's naming space.
    pub name: String,
    /// naive, r, rc or rcb (docs/asym-protocol.md).
    pub mode: nvstore_asym::Mode,
    /// Page cache of the front-end, bytes.
    pub cache: u64,
    /// Write operations per `tx_write` (rcb).
    pub batch: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pool: PathBuf::from("./nvstore.nvs"),
            size: 64 << 20,
            max_size: 1 << 40,
            bind: "127.0.0.1".into(),
            port: 6380,
            threads: default_threads(std::thread::available_parallelism().map_or(1, |n| n.get())),
            requirepass: None,
            maxclients: 10_000,
            limits: Limits::default(),
            adaptive: nvstore::db::DEFAULT_ADAPTIVE,
            compact: CompactLimits::default(),
            zcompact: CompactLimits::default(),
            remote: None,
        }
    }
}

/// Reactor threads by default: half the CPUs, at least one. Most of a
/// request's server time is the kernel's (the loopback send, waking the
/// client), and that runs on whichever core the peer wakes on; a second
/// reactor on a 2-CPU machine only adds wake-ups between the two workers
/// (futex, work stealing) and write conflicts between connections, and
/// measured more CPU per command than one (BENCHMARKS.md, "`nvstore serve`
/// against `redis-server`", 2026-11-27).
pub fn default_threads(cpus: usize) -> usize {
    (cpus / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_threads_are_half_the_cpus_and_at_least_one() {
        assert_eq!(default_threads(1), 1);
        assert_eq!(default_threads(2), 1);
        assert_eq!(default_threads(3), 1);
        assert_eq!(default_threads(8), 4);
        assert_eq!(
            Config::default().threads,
            default_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
        );
    }
}
