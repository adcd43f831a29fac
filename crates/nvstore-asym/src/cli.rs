//! `nvstore backend`: runs a back-end process on a pool file.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::{Backend, Layout};
use crate::failover::{Claim, Cluster, Partition, POLL};
use crate::mirror::{self, Node, Replication, Role, Stop};
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
    /// sync: answer a write once every mirror has it durable; async: answer
    /// at once (front-ends keep operation logs until the "replicated up to"
    /// mark passes them).
    #[arg(long, value_enum, default_value = "sync")]
    pub replication: Replication,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Where a node registers for failover.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// etcd endpoint (e.g. http://127.0.0.1:2379): the primary holds its
    /// partition's key under a lease, mirrors take over when it expires.
    #[arg(long)]
    pub etcd: Option<String>,
    /// Cluster name (etcd keys /nvstore/<cluster>/partition/<n>/...).
    #[arg(long, default_value = "nvstore")]
    pub cluster: String,
    /// Partition number.
    #[arg(long, default_value_t = 0)]
    pub partition: u64,
}

impl ClusterArgs {
    fn connect(&self) -> Result<Option<Cluster>, String> {
        self.etcd
            .as_deref()
            .map(|u| {
                Cluster::connect(u, Partition::new(&self.cluster, self.partition)).map_err(|e| format!("etcd {u}: {e}"))
            })
            .transpose()
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    nvstore::units::parse_size(s)
}

/// Opens (recovering) or creates the pool, listens, prints
/// `nvstore backend: ready on ADDR (epoch E, ...)` on stderr, and serves
/// until the process ends.
///
/// With `--etcd` it first claims its partition (a higher epoch than any
/// before, raised in the pool) and keeps the lease alive; a partition held
/// by another node means this one was deposed: it refuses to start.
pub fn run(a: &BackendArgs) -> Result<(), String> {
    let mut b = Backend::open_file(&a.pool, a.size, Layout::default_for(a.size)).map_err(|e| e.to_string())?;
    let (listener, addr) =
        server::bind(SocketAddr::new(a.bind, a.port)).map_err(|e| format!("bind {}:{}: {e}", a.bind, a.port))?;
    let mut cluster = a.cluster.connect()?;
    let mut lease = None;
    if let Some(c) = cluster.as_mut() {
        let started = Instant::now();
        match c_claim(c, addr, b.epoch())? {
            Claim::Won { epoch, lease: id } => {
                b.raise_epoch(epoch);
                lease = Some((id, started));
            }
            Claim::Held(h) => {
                return Err(format!(
                    "partition {} of cluster {:?} is held by {h:?}: this node was deposed and does not serve",
                    a.cluster.partition, a.cluster.cluster
                ))
            }
        }
    }
    let rep = b.open_report().clone();
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
    let node = Node::primary(&a.pool, b).with_replication(a.replication);
    if let (Some(c), Some((id, started))) = (&cluster, lease) {
        c.keep_alive(id, node.lease(), started);
    }
    let node: SharedBackend = Arc::new(Mutex::new(node));
    server::serve(listener, node).map_err(|e| e.to_string())
}

fn c_claim(c: &mut Cluster, addr: SocketAddr, min_epoch: u64) -> Result<Claim, String> {
    c.claim(addr, min_epoch)
        .map_err(|e| format!("claiming the partition: {e}"))
}

/// Arguments of `nvstore mirror`.
#[derive(clap::Args, Debug, Clone)]
pub struct MirrorArgs {
    /// The mirror's own pool file (created, or replaced, by a full copy when needed).
    #[arg(long)]
    pub pool: PathBuf,
    /// The primary back-end to follow (with --etcd: the one etcd names).
    #[arg(long, required_unless_present = "etcd")]
    pub primary: Option<SocketAddr>,
    /// Address to listen on (loopback by default): front-ends are refused until the mirror is promoted.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// TCP port (0: any free port; the readiness line names it).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Consecutive failed attempts to reach the primary before a mirror gives up.
const MIRROR_ATTEMPTS: u32 = 600;

/// Runs a mirror: listens (refusing front-ends), follows the primary,
/// prints `nvstore mirror: ready on ADDR ...` and, once caught up,
/// `nvstore mirror: in sync with PRIMARY ...` on stderr. Reconnects when
/// the connection ends (100 ms apart; without etcd at most 600 attempts in a
/// row). With `--etcd` it follows the primary etcd names and, when the
/// primary's key is gone and its pool is a clean copy, claims the partition
/// and serves (`nvstore mirror: promoted ...`).
pub fn run_mirror(a: &MirrorArgs) -> Result<(), String> {
    let node = Arc::new(Mutex::new(Node::mirror(&a.pool)));
    let (listener, addr) =
        server::bind(SocketAddr::new(a.bind, a.port)).map_err(|e| format!("bind {}:{}: {e}", a.bind, a.port))?;
    let shared: SharedBackend = node.clone();
    std::thread::spawn(move || server::serve(listener, shared));
    let cluster = a.cluster.connect()?;
    let target = Arc::new(Mutex::new(a.primary));
    eprintln!(
        "nvstore mirror: ready on {addr} (pool {}, following {})",
        a.pool.display(),
        a.primary
            .map_or("the primary etcd names".to_string(), |p| p.to_string())
    );
    let (n2, t2, bounded) = (node.clone(), target.clone(), cluster.is_none());
    let follower = std::thread::spawn(move || follow_loop(&n2, &t2, bounded));
    let Some(mut c) = cluster else {
        return follower.join().map_err(|_| "mirror thread panicked".to_string())?;
    };
    let mut complained = false;
    loop {
        match c.primary() {
            Ok(Some((p, _))) if p != addr => *target.lock() = Some(p),
            Ok(Some(_)) => {}
            Ok(None) if node.lock().in_sync() => {
                let started = Instant::now();
                let min = node.lock().epoch() + 1;
                if let Claim::Won { epoch, lease } = c_claim(&mut c, addr, min)? {
                    node.lock().promote(epoch).map_err(|e| e.to_string())?;
                    c.keep_alive(lease, node.lock().lease(), started);
                    eprintln!("nvstore mirror: promoted: primary on {addr} (epoch {epoch})");
                    break;
                }
            }
            Ok(None) => {}
            Err(e) if !complained => {
                complained = true;
                eprintln!("nvstore mirror: etcd: {e}");
            }
            Err(_) => {}
        }
        std::thread::sleep(POLL);
    }
    follower.join().map_err(|_| "mirror thread panicked".to_string())??;
    // Serve as primary until the process ends; keep the lease alive meanwhile.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
        let _ = &c;
    }
}

fn follow_loop(node: &Arc<Mutex<Node>>, target: &Arc<Mutex<Option<SocketAddr>>>, bounded: bool) -> Result<(), String> {
    let stop = AtomicBool::new(false);
    let mut failures = 0;
    loop {
        if node.lock().role() == Role::Primary {
            return Ok(());
        }
        let Some(primary) = *target.lock() else {
            std::thread::sleep(POLL);
            continue;
        };
        let r = mirror::follow(node, primary, &stop, |n| {
            failures = 0;
            let (source, seq) = n.applied();
            eprintln!(
                "nvstore mirror: in sync with {primary} (primary epoch {source}, batch {seq}, {} full copies)",
                n.copies()
            );
        });
        match r {
            Stop::Promoted | Stop::Stopped => return Ok(()),
            Stop::Lost(e) => {
                failures += 1;
                if bounded && failures >= MIRROR_ATTEMPTS {
                    return Err(format!("primary {primary} unreachable: {e}"));
                }
                if failures == 1 {
                    eprintln!("nvstore mirror: lost {primary}: {e}; reconnecting");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
