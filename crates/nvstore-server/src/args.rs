//! The `nvstore serve` command line (the CLI embeds [`ServeArgs`]).

use std::path::PathBuf;

use crate::config::Config;
use crate::resp::Limits;
use nvstore::units::parse_size;

/// `nvstore serve`: see the README's "Server" section and docs/server.md.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Pool file (created if missing).
    #[arg(long, default_value = "./nvstore.nvs")]
    pub pool: PathBuf,
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
    /// Threads that run engine calls, and as many network threads (default: the number of CPUs).
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
}

impl ServeArgs {
    pub fn into_config(self) -> Config {
        let d = Config::default();
        Config {
            pool: self.pool,
            size: self.size,
            max_size: self.max_size,
            bind: self.bind,
            port: self.port,
            threads: self.threads.unwrap_or(d.threads),
            requirepass: self.requirepass,
            maxclients: self.maxclients,
            adaptive: self.adaptive,
            limits: Limits {
                max_bulk: usize::try_from(self.max_bulk).unwrap_or(usize::MAX),
                ..d.limits
            },
        }
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
