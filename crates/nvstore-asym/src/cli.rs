//! `nvstore backend`: runs a back-end process on a pool file.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use crate::backend::{Backend, Layout};
use crate::{server, transport};

/// Arguments of `nvstore backend`.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// Pool file; created (with --size) if it does not exist.
    #[arg(long)]
    pub pool: PathBuf,
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// TCP port (0: any free port; the readiness line names it).
    #[arg(long, default_value_t = 7070)]
    pub port: u16,
    /// Size of a new pool, e.g. 256M.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub size: u64,
}

fn parse_size(s: &str) -> Result<u64, String> {
    nvstore::units::parse_size(s)
}

/// Opens (recovering) or creates the pool, listens, prints
/// `nvstore backend: ready on ADDR (epoch E, ...)` on stderr, and serves
/// until the process ends.
pub fn run(a: &BackendArgs) -> Result<(), String> {
    let b = Backend::open_file(&a.pool, a.size, Layout::default_for(a.size)).map_err(|e| e.to_string())?;
    let rep = b.open_report().clone();
    let (listener, addr) =
        server::bind(SocketAddr::new(a.bind, a.port)).map_err(|e| format!("bind {}:{}: {e}", a.bind, a.port))?;
    eprintln!(
        "nvstore backend: ready on {addr} (pool {}, epoch {}, {}, {} free slabs of {} bytes, {} live op logs{})",
        a.pool.display(),
        rep.epoch,
        if rep.created { "created" } else { "recovered" },
        b.free_slabs(),
        b.geometry().slab,
        rep.live_ops,
        if rep.replayed_tx {
            ", replayed the last transaction"
        } else {
            ""
        },
    );
    server::serve(listener, transport::share(b)).map_err(|e| e.to_string())
}
