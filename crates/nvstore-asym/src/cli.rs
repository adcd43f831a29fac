//! `nvstore backend`: runs a back-end process on a pool file.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::{Backend, Layout};
use crate::mirror::{self, Node, Stop};
use crate::server;
use crate::transport::SharedBackend;

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
    let node: SharedBackend = Arc::new(Mutex::new(Node::primary(&a.pool, b)));
    server::serve(listener, node).map_err(|e| e.to_string())
}

/// Arguments of `nvstore mirror`.
#[derive(clap::Args, Debug, Clone)]
pub struct MirrorArgs {
    /// The mirror's own pool file (created, or replaced, by a full copy when needed).
    #[arg(long)]
    pub pool: PathBuf,
    /// The primary back-end to follow.
    #[arg(long)]
    pub primary: SocketAddr,
    /// Address to listen on (loopback by default): front-ends are refused until the mirror is promoted.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// TCP port (0: any free port; the readiness line names it).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// Consecutive failed attempts to reach the primary before a mirror gives up.
const MIRROR_ATTEMPTS: u32 = 600;

/// Runs a mirror: listens (refusing front-ends), follows the primary,
/// prints `nvstore mirror: ready on ADDR ...` and, once caught up,
/// `nvstore mirror: in sync with PRIMARY ...` on stderr. Reconnects when
/// the connection ends (100 ms apart, at most 600 attempts in a row).
pub fn run_mirror(a: &MirrorArgs) -> Result<(), String> {
    let node = Arc::new(Mutex::new(Node::mirror(&a.pool)));
    let (listener, addr) =
        server::bind(SocketAddr::new(a.bind, a.port)).map_err(|e| format!("bind {}:{}: {e}", a.bind, a.port))?;
    let shared: SharedBackend = node.clone();
    std::thread::spawn(move || server::serve(listener, shared));
    eprintln!(
        "nvstore mirror: ready on {addr} (pool {}, following {})",
        a.pool.display(),
        a.primary
    );
    let stop = AtomicBool::new(false);
    let mut failures = 0;
    loop {
        let r = mirror::follow(&node, a.primary, &stop, |n| {
            failures = 0;
            let (source, seq) = n.applied();
            eprintln!(
                "nvstore mirror: in sync with {} (primary epoch {source}, batch {seq}, {} full copies)",
                a.primary,
                n.copies()
            );
        });
        match r {
            Stop::Promoted | Stop::Stopped => return Ok(()),
            Stop::Lost(e) => {
                failures += 1;
                if failures >= MIRROR_ATTEMPTS {
                    return Err(format!("primary {} unreachable: {e}", a.primary));
                }
                if failures == 1 {
                    eprintln!("nvstore mirror: lost {}: {e}; reconnecting", a.primary);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
