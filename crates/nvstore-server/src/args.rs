//! The `nvstore serve` command line (the CLI embeds [`ServeArgs`]).

use std::path::PathBuf;

use crate::config::{Config, RemotePool};
use crate::keys::CompactLimits;
use crate::resp::Limits;
use nvstore::units::parse_size;

/// `nvstore serve`: see the README's "Server" section and docs/server.md.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Pool file (created if missing).
    #[arg(long, default_value = "./nvstore.nvs")]
    pub pool: PathBuf,
    /// Serve the pool on the AsymNVM back-end at this address (`nvstore
    /// backend`) instead of a file; created there if missing, with --size
    /// bytes of its data area (a remote pool does not grow).
    #[arg(long)]
    pub remote: Option<std::net::SocketAddr>,
    /// The pool's name on the back-end.
    #[arg(long, default_value = "nvtree")]
    pub remote_name: String,
    /// How the front-end reaches the back-end: naive, r, rc or rcb.
    #[arg(long, default_value = "rcb")]
    pub remote_mode: String,
    /// Page cache of the front-end (rc, rcb).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub remote_cache: u64,
    /// Write operations per tx_write (rcb).
    #[arg(long, default_value_t = 1024)]
    pub remote_batch: usize,
    /// Initial size of a new pool (it grows on demand): bytes or with a KiB/MiB/GiB/TiB suffix.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub size: u64,
    /// Largest size the pool may grow to; writes past it answer `-OOM ...` while reads go on.
    #[arg(long, default_value = "1TiB", value_parser = parse_size)]
    pub max_size: u64,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// TCP port (0 picks a free one; the readiness line names it).
    #[arg(long, default_value_t = 6380)]
    pub port: u16,
    /// Network threads, which also run the commands (default: half the
    /// CPUs, at least 1); 1 runs one event loop on a current-thread runtime,
    /// as Redis does.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Require AUTH with this password (user `default`).
    #[arg(long)]
    pub requirepass: Option<String>,
    /// Most simultaneous clients; one more is answered an error and closed.
    #[arg(long, default_value_t = 10_000)]
    pub maxclients: usize,
    /// Largest bulk argument accepted in a request (Redis' proto-max-bulk-len).
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub max_bulk: u64,
    /// Workload-adaptive node sizing: off, conservative, aggressive or balanced.
    #[arg(long, default_value_t = nvstore::db::DEFAULT_ADAPTIVE)]
    pub adaptive: nvstore::Adaptive,
    /// Hashes with at most this many fields are stored whole in one value
    /// (Redis' hash-max-listpack-entries); 0 stores every hash one key per field.
    #[arg(long, default_value_t = CompactLimits::default().entries)]
    pub hash_max_listpack_entries: usize,
    /// ... and with every field and value at most this many bytes
    /// (Redis' hash-max-listpack-value; Redis defaults to 64).
    #[arg(long, default_value_t = CompactLimits::default().value)]
    pub hash_max_listpack_value: usize,
    /// ... and at most this many bytes in all (each write rewrites the whole value).
    #[arg(long, default_value_t = CompactLimits::default().bytes)]
    pub hash_max_listpack_bytes: usize,
    /// Sorted sets with at most this many members are stored whole in one
    /// value (Redis' zset-max-listpack-entries); 0 stores every sorted set
    /// one key pair per member.
    #[arg(long, default_value_t = CompactLimits::default().entries)]
    pub zset_max_listpack_entries: usize,
    /// ... and with every member at most this many bytes (Redis'
    /// zset-max-listpack-value; Redis defaults to 64).
    #[arg(long, default_value_t = CompactLimits::default().value)]
    pub zset_max_listpack_value: usize,
    /// ... and at most this many bytes in all (each write rewrites the whole value).
    #[arg(long, default_value_t = CompactLimits::default().bytes)]
    pub zset_max_listpack_bytes: usize,
}

impl ServeArgs {
    pub fn into_config(self) -> Result<Config, String> {
        let d = Config::default();
        let remote = match self.remote {
            None => None,
            Some(addr) => Some(RemotePool {
                addr,
                name: self.remote_name,
                mode: nvstore_asym::Mode::parse(&self.remote_mode)
                    .ok_or_else(|| format!("unknown --remote-mode {:?}: naive, r, rc or rcb", self.remote_mode))?,
                cache: self.remote_cache,
                batch: self.remote_batch.max(1),
            }),
        };
        Ok(Config {
            remote,
            pool: self.pool,
            size: self.size,
            max_size: self.max_size,
            bind: self.bind,
            port: self.port,
            threads: self.threads.unwrap_or(d.threads),
            requirepass: self.requirepass,
            maxclients: self.maxclients,
            adaptive: self.adaptive,
            compact: CompactLimits {
                entries: self.hash_max_listpack_entries,
                value: self.hash_max_listpack_value,
                bytes: self.hash_max_listpack_bytes,
            },
            zcompact: CompactLimits {
                entries: self.zset_max_listpack_entries,
                value: self.zset_max_listpack_value,
                bytes: self.zset_max_listpack_bytes,
            },
            limits: Limits {
                max_bulk: usize::try_from(self.max_bulk).unwrap_or(usize::MAX),
                ..d.limits
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use nvstore::units::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("7"), Ok(7));
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("").is_err());
    }
}
