//! `nvstore bench failover`: etcd, a primary and a mirror as processes, a
//! front-end enqueueing under write load; the primary is SIGKILLed, the
//! mirror takes over, the front-end fails over; at the end every
//! acknowledged write must be in the queue exactly once.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::failover::{node_args, ClusterWriter, EtcdProc, NodeProc, Partition, TempDir};
use crate::mirror::Replication;
use crate::remote::{Mode, RemoteOptions};
use crate::structures::Queue;
use crate::{Error, Result};

/// Arguments of `nvstore bench failover`.
#[derive(clap::Args, Debug, Clone)]
pub struct FailoverArgs {
    /// One JSON object: acked_writes, lost_writes, duplicate_writes, failover_ms.
    #[arg(long)]
    pub json: bool,
    /// SIGKILL the primary this long after the write load starts.
    #[arg(long, default_value_t = 300)]
    pub kill_after_ms: u64,
    /// Keep writing this long after the first write the new primary acknowledges.
    #[arg(long, default_value_t = 200)]
    pub write_after_ms: u64,
    /// How the primary waits for its mirror.
    #[arg(long, value_enum, default_value = "sync")]
    pub replication: Replication,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverReport {
    pub acked_writes: u64,
    pub lost_writes: u64,
    pub duplicate_writes: u64,
    /// From the kill to the first write acknowledged by the new primary.
    pub failover_ms: u64,
    /// Unacknowledged writes (in flight at the kill) found in the queue.
    pub unacked_present: u64,
    /// Acknowledged writes the new primary lacked, run again from the front-end's log (async).
    pub resent: u64,
}

const QUEUE: &str = "bench";
/// The longest a run may take before it fails.
const RUN_LIMIT: Duration = Duration::from_secs(60);

fn value(k: u64) -> Vec<u8> {
    (0..64).map(|i| (k as u8).wrapping_mul(31).wrapping_add(i)).collect()
}

/// Runs the experiment with `exe` as the `nvstore` binary.
pub fn run(a: &FailoverArgs, exe: &Path) -> Result<FailoverReport> {
    let dir = TempDir::new("failover")?;
    let etcd = EtcdProc::start(&dir.0)?;
    let (cluster, partition) = ("bench", 0);
    let mut pargs = node_args("backend", &dir.0.join("primary.pool"), &etcd.url, cluster, partition);
    pargs.extend(["--size".to_string(), "16M".to_string()]);
    if a.replication == Replication::Async {
        pargs.extend(["--replication".to_string(), "async".to_string()]);
    }
    let primary = NodeProc::spawn(exe, &pargs)?;
    primary.ready_addr(Duration::from_secs(15))?;
    let margs = node_args("mirror", &dir.0.join("mirror.pool"), &etcd.url, cluster, partition);
    let mirror = NodeProc::spawn(exe, &margs)?;
    mirror.wait_for("in sync", Duration::from_secs(15))?;

    let opts = RemoteOptions {
        mode: Mode::Rcb,
        batch: 8,
        flush_after: Duration::from_millis(5),
        ..RemoteOptions::default()
    };
    let part = Partition::new(cluster, partition);
    let mut w = ClusterWriter::connect(&etcd.url, part, opts, Duration::from_secs(20))?;
    let mut q = Queue::open(w.remote(), QUEUE)?;
    let start = Instant::now();
    // The kill comes from another thread, so it lands at any point of an
    // operation, in flight or not.
    let mut guard = primary.guard;
    let kill_after = Duration::from_millis(a.kill_after_ms);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(kill_after);
        guard.kill();
        Instant::now()
    });
    let mut killer = Some(killer);
    let mut acked = Vec::new();
    let mut killed: Option<Instant> = None;
    let mut failed_over: Option<Instant> = None;
    let mut failover_ms = 0;
    for key in 1..u64::MAX {
        if start.elapsed() > RUN_LIMIT {
            return Err(Error::Protocol(format!(
                "no failover within {RUN_LIMIT:?}; mirror stderr: {:?}",
                mirror.log.lock()
            )));
        }
        if killer.as_ref().is_some_and(|k| k.is_finished()) {
            killed = killer.take().and_then(|k| k.join().ok());
        }
        w.run(&mut q, |r| Queue::open(r, QUEUE), |q, r| q.enqueue(r, key, &value(key)))?;
        acked.push(key);
        if let (Some(k), None) = (killed, failed_over) {
            if w.failovers() > 0 {
                failover_ms = k.elapsed().as_millis() as u64;
                failed_over = Some(Instant::now());
            }
        }
        if failed_over.is_some_and(|t| t.elapsed() >= Duration::from_millis(a.write_after_ms)) {
            break;
        }
    }
    mirror.wait_for("promoted", Duration::from_secs(1))?;
    let resent = w.resent();
    let r = w.remote();
    r.flush()?;
    let mut count: HashMap<u64, u64> = HashMap::new();
    for (k, v) in q.items(r)? {
        if v != value(k) {
            return Err(Error::Protocol(format!("item {k} holds a wrong value")));
        }
        *count.entry(k).or_default() += 1;
    }
    let lost = acked.iter().filter(|k| !count.contains_key(k)).count() as u64;
    let duplicate = count.values().map(|c| c - 1).sum();
    let acked_set: std::collections::HashSet<u64> = acked.iter().copied().collect();
    let unacked_present = count.keys().filter(|k| !acked_set.contains(k)).count() as u64;
    drop(etcd);
    Ok(FailoverReport {
        acked_writes: acked.len() as u64,
        lost_writes: lost,
        duplicate_writes: duplicate,
        failover_ms,
        unacked_present,
        resent,
    })
}

/// `nvstore bench failover`: runs, prints, and fails when a write was lost
/// or duplicated or none was acknowledged.
pub fn main(a: &FailoverArgs, exe: &Path, out: &mut dyn Write) -> std::result::Result<FailoverReport, String> {
    let r = run(a, exe).map_err(|e| e.to_string())?;
    let w = |out: &mut dyn Write, s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    if a.json {
        w(
            out,
            format!(
                "{{\"acked_writes\": {}, \"lost_writes\": {}, \"duplicate_writes\": {}, \"failover_ms\": {}}}",
                r.acked_writes, r.lost_writes, r.duplicate_writes, r.failover_ms
            ),
        )?;
    } else {
        w(
            out,
            format!(
                "failover ({:?}): primary killed after {} ms; {} writes acknowledged, {} lost, {} duplicated; \
                 failover took {} ms; {} unacknowledged writes landed; {} acknowledged writes resent from the front-end's log",
                a.replication,
                a.kill_after_ms,
                r.acked_writes,
                r.lost_writes,
                r.duplicate_writes,
                r.failover_ms,
                r.unacked_present,
                r.resent
            ),
        )?;
    }
    if r.lost_writes > 0 || r.duplicate_writes > 0 || r.acked_writes == 0 {
        return Err(format!(
            "failover lost {} and duplicated {} of {} acknowledged writes",
            r.lost_writes, r.duplicate_writes, r.acked_writes
        ));
    }
    Ok(r)
}
