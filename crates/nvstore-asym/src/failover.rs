//! Failover through etcd (AsymNVM §7 cases 4 and 5).
//!
//! The primary of partition `n` of cluster `c` holds the key
//! `/nvstore/<c>/partition/<n>/primary` under an etcd lease it keeps alive;
//! the value is `ADDR EPOCH`. The key `/nvstore/<c>/partition/<n>/epoch`
//! (no lease) keeps the highest epoch ever claimed. A node claims the
//! partition in one etcd transaction: the primary key must be absent and the
//! epoch key unchanged since it was read; it writes both, the epoch one
//! higher than any before. So each claim has a new, higher epoch.
//!
//! - A mirror polls the primary key (every 50 ms); when it is gone (the
//!   primary's lease expired) and the mirror is a clean copy, it claims it,
//!   raises its pool's epoch to the claimed one (durably) and serves.
//! - A front-end ([`ClusterWriter`]) resolves the primary through etcd, and
//!   when its connection fails watches the primary key and reconnects as it
//!   changes (see [`open_on_primary`]), recovers the
//!   structure (the operation logs the new primary holds are re-executed
//!   exactly once) and sends again the one operation it had no answer for,
//!   unless the new primary's operation-log sequence shows it was logged.
//!   With asynchronous mirrors it first runs again the acknowledged
//!   operations it kept (above the "replicated up to" mark) that the new
//!   primary lacks.
//! - Fencing: a front-end refuses a primary whose epoch is lower than the
//!   one etcd names; a mirror refuses a primary older than the one it
//!   copies; a primary stops serving as soon as its lease may have expired
//!   (it renews it every 200 ms and counts it valid for its TTL less 100 ms
//!   from the renewal's start), and a restarted, deposed primary finds the
//!   key held and refuses to start.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};

use crate::mirror::Lease;
use crate::remote::{Remote, RemoteOptions};
use crate::structures::{self, Replay};
use crate::transport::TcpTransport;
use crate::{Error, Result};

/// Lease time-to-live in seconds (etcd's minimum is about one second).
pub const LEASE_TTL: i64 = 1;
/// How often the primary renews its lease.
const RENEW_EVERY: Duration = Duration::from_millis(200);
/// Safety margin: a lease counts as held until TTL less this after a renewal was sent.
const LEASE_MARGIN: Duration = Duration::from_millis(100);
/// How often mirrors look at the primary key, and how soon a front-end
/// tries a registered primary that did not answer again.
pub const POLL: Duration = Duration::from_millis(50);
/// Longest a front-end watching for a primary to register waits before it
/// reads the key again (a watch that saw no change).
pub const NO_PRIMARY_WAIT: Duration = Duration::from_secs(1);

fn cluster_err(e: etcd_client::Error) -> Error {
    Error::Cluster(e.to_string())
}

/// The etcd keys of one partition.
#[derive(Clone, Debug)]
pub struct Partition {
    pub cluster: String,
    pub partition: u64,
}

impl Partition {
    pub fn new(cluster: &str, partition: u64) -> Partition {
        Partition {
            cluster: cluster.to_string(),
            partition,
        }
    }

    pub fn primary_key(&self) -> String {
        format!("/nvstore/{}/partition/{}/primary", self.cluster, self.partition)
    }

    pub fn epoch_key(&self) -> String {
        format!("/nvstore/{}/partition/{}/epoch", self.cluster, self.partition)
    }
}

/// Outcome of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This node is primary at `epoch` under lease `lease`.
    Won { epoch: u64, lease: i64 },
    /// Another node holds the partition (or won the race).
    Held(Option<(SocketAddr, u64)>),
}

/// A blocking etcd client (its own small runtime).
pub struct Cluster {
    rt: tokio::runtime::Runtime,
    client: etcd_client::Client,
    pub part: Partition,
}

fn parse_primary(v: &[u8]) -> Option<(SocketAddr, u64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (a, e) = s.split_once(' ')?;
    Some((a.parse().ok()?, e.parse().ok()?))
}

impl Cluster {
    /// Connects to the etcd at `url` (fails after 2 s).
    pub fn connect(url: &str, part: Partition) -> Result<Cluster> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(2));
        let client = rt
            .block_on(etcd_client::Client::connect([url], Some(opts)))
            .map_err(cluster_err)?;
        Ok(Cluster { rt, client, part })
    }

    /// The primary etcd names now: address and epoch.
    pub fn primary(&mut self) -> Result<Option<(SocketAddr, u64)>> {
        Ok(self.primary_at()?.0)
    }

    /// [`Cluster::primary`], with the etcd revision the answer is as of.
    pub fn primary_at(&mut self) -> Result<(Option<(SocketAddr, u64)>, i64)> {
        let key = self.part.primary_key();
        let r = self.rt.block_on(self.client.get(key, None)).map_err(cluster_err)?;
        let rev = r.header().map_or(0, |h| h.revision());
        Ok((r.kvs().first().and_then(|kv| parse_primary(kv.value())), rev))
    }

    /// Watches the primary key from the revision after `revision` (an
    /// answer of [`Cluster::primary_at`]) until it changes (true) or
    /// `timeout` passes (false). A change made between that answer and
    /// the watch's start is reported too: the watch starts in the past.
    pub fn wait_primary_change(&mut self, revision: i64, timeout: Duration) -> Result<bool> {
        let key = self.part.primary_key();
        let mut client = self.client.clone();
        self.rt.block_on(async move {
            let opts = WatchOptions::new().with_start_revision(revision + 1);
            let changed = async {
                let mut stream = client.watch(key, Some(opts)).await.map_err(cluster_err)?;
                // The first answer confirms the watch; events follow.
                while let Some(r) = stream.message().await.map_err(cluster_err)? {
                    if r.canceled() {
                        return Err(Error::Cluster(format!(
                            "etcd canceled the watch: {}",
                            r.cancel_reason()
                        )));
                    }
                    if !r.events().is_empty() {
                        return Ok(true);
                    }
                }
                Ok(false)
            };
            tokio::time::timeout(timeout, changed).await.unwrap_or(Ok(false))
        })
    }

    /// The highest epoch ever claimed for the partition (0: none).
    pub fn epoch(&mut self) -> Result<u64> {
        Ok(self.epoch_rev()?.0)
    }

    fn epoch_rev(&mut self) -> Result<(u64, i64)> {
        let key = self.part.epoch_key();
        let r = self.rt.block_on(self.client.get(key, None)).map_err(cluster_err)?;
        Ok(r.kvs().first().map_or((0, 0), |kv| {
            let e = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            (e, kv.mod_revision())
        }))
    }

    /// Claims the partition for `addr` with an epoch of at least
    /// `min_epoch` and higher than any claimed before, if no one holds it.
    pub fn claim(&mut self, addr: SocketAddr, min_epoch: u64) -> Result<Claim> {
        let (last, rev) = self.epoch_rev()?;
        let epoch = min_epoch.max(last + 1);
        let (pk, ek) = (self.part.primary_key(), self.part.epoch_key());
        let c = &mut self.client;
        let won = self.rt.block_on(async {
            let lease = c.lease_grant(LEASE_TTL, None).await?.id();
            let txn = Txn::new()
                .when([
                    Compare::version(pk.clone(), CompareOp::Equal, 0),
                    Compare::mod_revision(ek.clone(), CompareOp::Equal, rev),
                ])
                .and_then([
                    TxnOp::put(
                        pk.clone(),
                        format!("{addr} {epoch}"),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::put(ek, epoch.to_string(), None),
                ])
                .or_else([TxnOp::get(pk, None)]);
            let r = c.txn(txn).await?;
            if r.succeeded() {
                return Ok::<_, etcd_client::Error>(Claim::Won { epoch, lease });
            }
            c.lease_revoke(lease).await?;
            let holder = r.op_responses().into_iter().find_map(|o| match o {
                TxnOpResponse::Get(g) => g.kvs().first().and_then(|kv| parse_primary(kv.value())),
                _ => None,
            });
            Ok(Claim::Held(holder))
        });
        won.map_err(cluster_err)
    }

    /// Keeps `lease` alive in the background, recording each renewal in
    /// `node_lease`; fences it when a renewal fails or etcd says the lease
    /// is gone. Runs until the process ends (or the lease is lost).
    pub fn keep_alive(&self, lease: i64, node_lease: Arc<Lease>, started: Instant) {
        node_lease.renewed_until(started + Duration::from_secs(LEASE_TTL as u64) - LEASE_MARGIN);
        let mut c = self.client.clone();
        self.rt.spawn(async move {
            let Ok((mut keeper, mut stream)) = c.lease_keep_alive(lease).await else {
                node_lease.fence();
                return;
            };
            loop {
                let sent = Instant::now();
                let ok = match keeper.keep_alive().await {
                    Ok(()) => matches!(
                        tokio::time::timeout(Duration::from_secs(1), stream.message()).await,
                        Ok(Ok(Some(r))) if r.ttl() > 0
                    ),
                    Err(_) => false,
                };
                if !ok {
                    eprintln!("nvstore: lease {lease:x} lost: no longer primary");
                    node_lease.fence();
                    return;
                }
                node_lease.renewed_until(sent + Duration::from_secs(LEASE_TTL as u64) - LEASE_MARGIN);
                tokio::time::sleep(RENEW_EVERY).await;
            }
        });
    }
}

/// A front-end writer that follows the partition's primary through etcd.
pub struct ClusterWriter {
    cluster: Cluster,
    opts: RemoteOptions,
    remote: Remote,
    /// Longest a failover may take before an operation fails.
    pub failover_timeout: Duration,
    failovers: u64,
    resent: u64,
}

impl ClusterWriter {
    /// Resolves the primary and opens a writer on it (waits up to `timeout`
    /// for a primary to appear).
    pub fn connect(url: &str, part: Partition, opts: RemoteOptions, timeout: Duration) -> Result<ClusterWriter> {
        let mut cluster = Cluster::connect(url, part)?;
        let mut remote = open_on_primary(&mut cluster, &opts, Instant::now() + timeout)?;
        remote.retain_ops(true);
        Ok(ClusterWriter {
            cluster,
            opts,
            remote,
            failover_timeout: timeout,
            failovers: 0,
            resent: 0,
        })
    }

    pub fn remote(&mut self) -> &mut Remote {
        &mut self.remote
    }

    /// Acknowledged operations run again after a failover because the new
    /// primary had not received them (asynchronous mirrors).
    pub fn resent(&self) -> u64 {
        self.resent
    }

    /// Failovers this writer went through.
    pub fn failovers(&self) -> u64 {
        self.failovers
    }

    /// Runs one logged write operation `op` of structure `s` exactly once.
    /// On a lost connection: resolves the new primary, reopens the writer
    /// and the structure (`reopen`), re-executes the logged operations the
    /// new primary has ([`structures::recover`]), then runs `op` again only
    /// if its operation log never reached the new primary.
    pub fn run<S: Replay>(
        &mut self,
        s: &mut S,
        reopen: impl Fn(&mut Remote) -> Result<S>,
        mut op: impl FnMut(&mut S, &mut Remote) -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.failover_timeout;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let seq = self.remote.op_next();
            match op(s, &mut self.remote) {
                Ok(()) => return Ok(()),
                Err(e) if e.is_disconnect() && attempts <= 20 && Instant::now() < deadline => {
                    self.failover(s, &reopen, deadline)?;
                    if self.remote.hello().op_next > seq {
                        // Logged before the primary died: recovery ran it.
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn failover<S: Replay>(
        &mut self,
        s: &mut S,
        reopen: &impl Fn(&mut Remote) -> Result<S>,
        deadline: Instant,
    ) -> Result<()> {
        self.failovers += 1;
        let kept = self.remote.retained_ops();
        loop {
            let mut r = open_on_primary(&mut self.cluster, &self.opts, deadline)?;
            r.retain_ops(true);
            let done = reopen(&mut r).and_then(|mut ns| {
                structures::recover(&mut r, &mut ns)?;
                // Acknowledged operations the new primary never received
                // (asynchronous mirrors): run again, in order, as new ones.
                let n = resend_kept(&mut r, &mut ns, &kept)?;
                Ok((ns, n))
            });
            match done {
                Ok((ns, n)) => {
                    self.resent += n;
                    *s = ns;
                    self.remote = r;
                    return Ok(());
                }
                Err(e) if e.is_disconnect() && Instant::now() < deadline => std::thread::sleep(POLL),
                Err(e) => return Err(e),
            }
        }
    }
}

/// After a failover (and [`structures::recover`]): runs again, in order and
/// as new operations, the kept operation logs (`Remote::retained_ops` of the
/// old writer) the new primary never received: those at or above its
/// `op_next` (a mirror holds a prefix of the primary's batches). Returns how many.
pub fn resend_kept<S: Replay>(r: &mut Remote, s: &mut S, kept: &[(u64, Vec<u8>)]) -> Result<u64> {
    let from = r.hello().op_next;
    let mut n = 0;
    for (_, op) in kept.iter().filter(|(seq, op)| *seq >= from && !op.is_empty()) {
        r.begin(op);
        s.redo(r, op)?;
        r.commit()?;
        n += 1;
    }
    Ok(n)
}

/// Opens a writer on the primary etcd names, refusing one whose epoch is
/// lower than etcd's (a deposed primary), until `deadline`. Between
/// attempts it watches the primary key: with no primary registered only a
/// change of the key can help, so it waits for one (up to
/// [`NO_PRIMARY_WAIT`]); with one registered that did not answer, it tries
/// again at the next change or after [`POLL`], whichever comes first (the
/// key stays while a dead primary's lease runs out, and a new primary may
/// register just before it listens).
pub fn open_on_primary(cluster: &mut Cluster, opts: &RemoteOptions, deadline: Instant) -> Result<Remote> {
    let mut last = Error::Cluster("no primary registered".into());
    loop {
        let (named, revision) = match cluster.primary_at() {
            Ok((named, rev)) => (Ok(named), rev),
            Err(e) => (Err(e), 0),
        };
        let wait = if matches!(named, Ok(None)) {
            NO_PRIMARY_WAIT
        } else {
            POLL
        };
        match named {
            Ok(Some((addr, epoch))) => {
                match TcpTransport::connect(addr)
                    .map_err(Error::from)
                    .and_then(|t| Remote::open(t, opts.clone()))
                {
                    Ok(r) if r.hello().epoch >= epoch => return Ok(r),
                    Ok(r) => {
                        last = Error::Cluster(format!(
                            "{addr} serves epoch {} below the cluster's {epoch}: refused",
                            r.hello().epoch
                        ))
                    }
                    Err(e) => last = e,
                }
            }
            Ok(None) => {}
            Err(e) => last = e,
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(last);
        }
        let wait = wait.min(deadline - now);
        if revision == 0 || cluster.wait_primary_change(revision, wait).is_err() {
            // etcd did not answer: try again after a pause.
            std::thread::sleep(POLL.min(wait));
        }
    }
}

// ---------------------------------------------------------------- processes

/// Kills and reaps a child process when dropped.
pub struct ChildGuard {
    pub child: Child,
}

impl ChildGuard {
    /// SIGKILL now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A single-member etcd on free loopback ports with a data directory under
/// `dir`, fast elections (heartbeat 10 ms, election timeout 100 ms); killed
/// when dropped.
pub struct EtcdProc {
    guard: ChildGuard,
    pub url: String,
}

impl EtcdProc {
    /// Starts `etcd` (from `PATH`) and waits (up to 15 s) until it answers.
    pub fn start(dir: &Path) -> Result<EtcdProc> {
        let (cp, pp) = (free_port()?, free_port()?);
        let url = format!("http://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let child = Command::new("etcd")
            .args(["--name", "n0", "--data-dir"])
            .arg(dir.join("etcd.data"))
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("n0={peer}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| Error::Cluster(format!("cannot start etcd: {e}")))?;
        let p = EtcdProc {
            guard: ChildGuard { child },
            url,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(mut c) = Cluster::connect(&p.url, Partition::new("ready", 0)) {
                if c.epoch().is_ok() {
                    return Ok(p);
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Cluster("etcd did not become ready in 15 s".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.guard.child.id()
    }
}

/// A spawned `nvstore` node whose stderr lines arrive on a channel.
pub struct NodeProc {
    pub guard: ChildGuard,
    lines: mpsc::Receiver<String>,
    pub log: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl NodeProc {
    /// Spawns `exe args...` with stderr captured.
    pub fn spawn(exe: &Path, args: &[String]) -> Result<NodeProc> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                l2.lock().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Ok(NodeProc {
            guard: ChildGuard { child },
            lines: rx,
            log,
        })
    }

    /// Waits (up to `timeout`) for a stderr line containing `pat`.
    pub fn wait_for(&self, pat: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(pat) => return Ok(l),
                Ok(_) => {}
                Err(_) => {
                    return Err(Error::Protocol(format!(
                        "no line with {pat:?} within {timeout:?}; stderr: {:?}",
                        self.log.lock()
                    )))
                }
            }
        }
    }

    /// The address of a readiness line `... ready on ADDR ...`.
    pub fn ready_addr(&self, timeout: Duration) -> Result<SocketAddr> {
        let l = self.wait_for("ready on ", timeout)?;
        let a = l.split("ready on ").nth(1).and_then(|r| r.split_whitespace().next());
        a.and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::Protocol(format!("no address in {l:?}")))
    }
}

/// Arguments of a node's pool and cluster, as `nvstore` command-line words.
pub fn node_args(role: &str, pool: &Path, etcd: &str, cluster: &str, partition: u64) -> Vec<String> {
    let mut v: Vec<String> = vec![role.into(), "--pool".into(), pool.display().to_string()];
    v.extend(["--port", "0", "--etcd", etcd, "--cluster", cluster].map(String::from));
    v.extend(["--partition".to_string(), partition.to_string()]);
    v
}

/// A temporary directory for a bench run (removed at drop).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Result<TempDir> {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!(
            "nvstore-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d)?;
        Ok(TempDir(d))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
