//! The `nvstore serve` command line (the CLI embeds [`ServeArgs`]).

use std::path::PathBuf;

use crate::{Config, Limits};

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
            limits: Limits {
                max_bulk: usize::try_from(self.max_bulk).unwrap_or(usize::MAX),
                ..d.limits
            },
        }
    }
}

/// `123`, `64KiB`, `512MiB`, `1GiB`, `2TiB` (also `K`/`M`/`G`/`T`, `KB`...).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size (e.g. 64MiB)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{s}': unknown size unit '{unit}' (use KiB, MiB, GiB or TiB)")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(super::parse_size("7"), Ok(7));
        assert!(super::parse_size("1XB").is_err());
        assert!(super::parse_size("").is_err());
    }
}
