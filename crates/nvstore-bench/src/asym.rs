//! `nvstore bench asym`: AsymNVM Table 3 on this machine. One front-end
//! runs a data structure on a back-end over loopback TCP; 100% writes
//! (enqueue, push, or a put of a uniform random key into the B+-tree, BST,
//! hash table, skiplist, or the multi-version BST and B+-tree, or a put into
//! the engine's NV-Tree run through `RemoteSpace`), every operation
//! acknowledged when durable.
//!
//! With `--app smallbank|tatp` it runs a transaction benchmark instead
//! (AsymNVM §9.3): SmallBank over the hash table or TATP over the B+-tree,
//! loaded first by a separate front-end (rcb, not timed), then `--ops`
//! transactions of the standard mix by a fresh front-end in `--mode`.
//!
//! The back-end runs in this process on its own threads (a pool file on
//! /dev/shm, removed afterwards), or elsewhere with `--connect ADDR`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nvstore_asym::apps::{smallbank, tatp, Outcome, SmallBank, Tatp};
use nvstore_asym::structures::{BpTree, Bst, HashTable, MvBpTree, MvBst, Queue, SkipList, Stack};
use nvstore_asym::transport::Counters;
use nvstore_asym::{
    open_db, Backend, Fault, FaultyTransport, Layout, Mode, Remote, RemoteOptions, SpaceOptions, TcpTransport,
    Transport,
};
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// `nvstore bench asym` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct AsymArgs {
    /// Data structure: queue, stack (enqueue / push), bptree, bst, hash, skiplist, mvbst, mvbpt or nvtree (puts of uniform random keys;
    /// nvtree is the engine's `Db` on the back-end through `RemoteSpace`).
    #[arg(long, default_value = "queue")]
    pub structure: String,
    /// A transaction benchmark instead of a structure: smallbank (over the
    /// hash table) or tatp (over the B+-tree).
    #[arg(long)]
    pub app: Option<String>,
    /// Accounts (smallbank) or subscribers (tatp) loaded before timing.
    #[arg(long, default_value_t = 10_000)]
    pub scale: u64,
    /// naive, r, rc or rcb (AsymNVM Table 3).
    #[arg(long, default_value = "rcb")]
    pub mode: String,
    /// Write operations (or transactions, with --app) to time.
    #[arg(long, default_value_t = 20_000)]
    pub ops: u64,
    /// Operations per tx_write (rcb).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Front-end cache as a percentage of the structure's size (rc, rcb).
    #[arg(long, default_value_t = 10)]
    pub cache_pct: u64,
    /// Extra delay per round trip, in microseconds (an emulated slower network).
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Use the back-end at this address instead of starting one.
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Spread the structure over this many back-ends, one writer
    /// front-end per partition in parallel threads (AsymNVM Fig. 10):
    /// bptree, bst, skiplist (key ranges), hash, queue (key hashing).
    #[arg(long)]
    pub partitions: Option<usize>,
}

/// The result, as printed with `--json`.
#[derive(Serialize, Clone, Debug)]
pub struct AsymResult {
    /// smallbank or tatp, for a transaction benchmark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    pub structure: String,
    pub mode: String,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub round_trips_per_op: f64,
    pub bytes_per_op: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// The tail: 99.9th percentile, slowest operation, mean, and the share
    /// of the timed run spent in operations slower than ten times the
    /// median (what decides `ops_per_sec` when a few operations stall).
    pub p999_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
    pub slow_time_share: f64,
    /// `--batch` and `--cache-pct` of the run (for `bench plot`).
    pub batch: usize,
    pub cache_pct: u64,
    /// Transactions whose condition failed (nothing written), with --app.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<u64>,
    /// Back-ends the structure was spread over (1 without --partitions).
    pub partitions: usize,
    /// Each partition's figures, with --partitions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_partition: Option<Vec<crate::asym_part::PartResult>>,
}

impl AsymResult {
    /// The figures of `ops` timed operations that took `secs` in all, used
    /// the round trips and bytes in `d` and had the latencies in `hist`.
    pub(crate) fn measured(
        structure: &str,
        mode: Mode,
        ops: u64,
        secs: f64,
        d: &Counters,
        hist: &Histogram<u64>,
    ) -> AsymResult {
        let per = ops.max(1) as f64;
        AsymResult {
            app: None,
            structure: structure.into(),
            mode: mode.as_str().into(),
            ops,
            ops_per_sec: ops as f64 / secs,
            round_trips_per_op: d.round_trips as f64 / per,
            bytes_per_op: d.bytes() as f64 / per,
            p50_ns: hist.value_at_quantile(0.5),
            p99_ns: hist.value_at_quantile(0.99),
            p999_ns: hist.value_at_quantile(0.999),
            max_ns: hist.max(),
            mean_ns: hist.mean() as u64,
            slow_time_share: slow_time_share(hist, 10),
            batch: 0,
            cache_pct: 0,
            aborted: None,
            partitions: 1,
            per_partition: None,
        }
    }
}

/// The share of all recorded time that operations slower than `times`
/// the median took.
pub(crate) fn slow_time_share(hist: &Histogram<u64>, times: u64) -> f64 {
    let bound = hist.value_at_quantile(0.5).saturating_mul(times);
    let (mut slow, mut all) = (0f64, 0f64);
    for v in hist.iter_recorded() {
        let t = hist.median_equivalent(v.value_iterated_to()) as f64 * v.count_at_value() as f64;
        all += t;
        if v.value_iterated_to() > bound {
            slow += t;
        }
    }
    if all > 0.0 {
        slow / all
    } else {
        0.0
    }
}

/// Node bytes per item (for the cache percentage): list nodes are 80
/// bytes; B+-tree leaves hold 64-byte values about 3/4 full.
pub(crate) fn item_bytes(structure: &str) -> u64 {
    match structure {
        "bptree" | "mvbpt" => 100,
        // Node plus a bucket word (buckets are 16 bytes now: this is a
        // little under the table's size, so the cache is if anything smaller
        // than --cache-pct says).
        "hash" => 88,
        // Skiplist nodes average 1 1/3 links (91 bytes), and 15 in 16 of
        // them have a 16-byte entry in their run's directory.
        "skiplist" => 106,
        // 88-byte nodes in 96-byte blocks.
        "bst" | "mvbst" => 96,
        // 8-byte key and 64-byte value in an element, leaves about 2/3 full.
        "nvtree" => 144,
        _ => 80,
    }
}

pub(crate) fn start_backend() -> Result<(SocketAddr, PathBuf), String> {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!(
        "nvstore-bench-asym-{}-{}.pool",
        std::process::id(),
        rand::random::<u32>()
    ));
    let size = 256 << 20;
    let b = Backend::open_file(&path, size, Layout::default_for(size)).map_err(|e| e.to_string())?;
    let (l, addr) = nvstore_asym::server::bind("127.0.0.1:0".parse().unwrap()).map_err(|e| e.to_string())?;
    let shared = nvstore_asym::transport::share(b);
    std::thread::spawn(move || nvstore_asym::server::serve(l, shared));
    Ok((addr, path))
}

/// Runs the benchmark and returns its result.
pub fn run_asym(a: &AsymArgs) -> Result<AsymResult, String> {
    let mode = Mode::parse(&a.mode).ok_or_else(|| format!("unknown mode {:?}: naive, r, rc or rcb", a.mode))?;
    if let Some(n) = a.partitions {
        return crate::asym_part::run_partitioned(a, mode, n);
    }
    if let Some(app) = &a.app {
        if !matches!(app.as_str(), "smallbank" | "tatp") {
            return Err(format!("unknown app {app:?}: smallbank or tatp"));
        }
    } else if !matches!(
        a.structure.as_str(),
        "queue" | "stack" | "bptree" | "bst" | "hash" | "skiplist" | "mvbst" | "mvbpt" | "nvtree"
    ) {
        return Err(format!(
            "structure {:?} is not implemented yet: queue, stack, bptree, bst, hash, skiplist, mvbst, mvbpt or nvtree",
            a.structure
        ));
    }
    let (addr, pool) = match a.connect {
        Some(addr) => (addr, None),
        None => {
            let (addr, p) = start_backend()?;
            (addr, Some(p))
        }
    };
    let r = run_on(a, mode, addr).map(|r| AsymResult {
        batch: a.batch.max(1),
        cache_pct: a.cache_pct,
        ..r
    });
    if let Some(p) = pool {
        let _ = std::fs::remove_file(p);
    }
    r
}

fn run_on(a: &AsymArgs, mode: Mode, addr: SocketAddr) -> Result<AsymResult, String> {
    if let Some(app) = &a.app {
        return run_app(a, app, mode, addr);
    }
    if a.structure == "nvtree" {
        return run_nvtree(a, mode, addr);
    }
    let t = transport(a, addr)?;
    let opts = RemoteOptions {
        mode,
        batch: a.batch.max(1),
        cache_bytes: ((a.ops * item_bytes(&a.structure) * a.cache_pct / 100) as usize).max(4096),
        owner: rand::random::<u64>() | 1,
        lock: format!("bench-{}", rand::random::<u32>()),
        ..RemoteOptions::default()
    };
    let e = |e: nvstore_asym::Error| e.to_string();
    let mut r = Remote::open(t, opts).map_err(e)?;
    let name = format!("{}-{}", a.structure, rand::random::<u32>());
    let value = [0x42u8; 64];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    let (mut q, mut s, mut tree, mut hash, mut skip, mut bst) = (None, None, None, None, None, None);
    let (mut mvbst, mut mvbpt) = (None, None);
    match a.structure.as_str() {
        "queue" => q = Some(Queue::open(&mut r, &name).map_err(e)?),
        "stack" => s = Some(Stack::open(&mut r, &name).map_err(e)?),
        // About one bucket per key inserted.
        "hash" => hash = Some(HashTable::open(&mut r, &name, a.ops.max(1)).map_err(e)?),
        "skiplist" => skip = Some(SkipList::open(&mut r, &name).map_err(e)?),
        "bst" => bst = Some(Bst::open(&mut r, &name).map_err(e)?),
        "mvbst" => mvbst = Some(MvBst::open(&mut r, &name).map_err(e)?),
        "mvbpt" => mvbpt = Some(MvBpTree::open(&mut r, &name).map_err(e)?),
        _ => tree = Some(BpTree::open(&mut r, &name).map_err(e)?),
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let start_counters = r.counters().clone();
    let t0 = Instant::now();
    for i in 0..a.ops {
        let t = Instant::now();
        let key = rng.gen_range(0..a.ops.saturating_mul(4).max(1));
        if let Some(q) = &mut q {
            q.enqueue(&mut r, i, &value)
        } else if let Some(s) = &mut s {
            s.push(&mut r, i, &value)
        } else if let Some(h) = &mut hash {
            h.put(&mut r, key, &value)
        } else if let Some(sl) = &mut skip {
            sl.put(&mut r, key, &value)
        } else if let Some(b) = &mut bst {
            b.put(&mut r, key, &value)
        } else if let Some(b) = &mut mvbst {
            b.put(&mut r, key, &value)
        } else if let Some(b) = &mut mvbpt {
            b.put(&mut r, key, &value)
        } else if let Some(tr) = &mut tree {
            tr.put(&mut r, key, &value)
        } else {
            unreachable!()
        }
        .map_err(e)?;
        hist.record(t.elapsed().as_nanos().max(1) as u64).expect("in bounds");
    }
    let secs = t0.elapsed().as_secs_f64();
    let d = r.counters().since(&start_counters);
    r.close().map_err(e)?;
    Ok(AsymResult::measured(&a.structure, mode, a.ops, secs, &d, &hist))
}

/// `--structure nvtree`: the engine's NV-Tree (`nvstore::Db`) on the
/// back-end through `RemoteSpace`, `--ops` puts of uniform random 8-byte
/// keys with 64-byte values. The pool claims what the puts need, about
/// four times their bytes; the page cache is `--cache-pct` of their bytes.
fn run_nvtree(a: &AsymArgs, mode: Mode, addr: SocketAddr) -> Result<AsymResult, String> {
    let item = item_bytes("nvtree");
    let opts = SpaceOptions {
        remote: RemoteOptions {
            mode,
            batch: a.batch.max(1),
            cache_bytes: ((a.ops * item * a.cache_pct / 100) as usize).max(4096),
            owner: rand::random::<u64>() | 1,
            lock: format!("bench-{}", rand::random::<u32>()),
            ..RemoteOptions::default()
        },
        name: format!("nvtree-{}", rand::random::<u32>()),
        size: (a.ops * item * 4).max(8 << 20),
        ..SpaceOptions::default()
    };
    let db_opts = nvstore::Options {
        adaptive: nvstore::Adaptive::Off,
        ..nvstore::Options::default()
    };
    let db = open_db(transport(a, addr)?, &opts, &db_opts).map_err(|e| e.to_string())?;
    let value = [0x42u8; 64];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let start = db.space().stats().counters;
    let t0 = Instant::now();
    for _ in 0..a.ops {
        let t = Instant::now();
        let key = rng.gen_range(0..a.ops.saturating_mul(4).max(1));
        db.put(&key.to_be_bytes(), &value).map_err(|e| e.to_string())?;
        hist.record(t.elapsed().as_nanos().max(1) as u64).expect("in bounds");
    }
    let secs = t0.elapsed().as_secs_f64();
    let d = db.space().stats().counters.since(&start);
    db.close().map_err(|e| e.to_string())?;
    Ok(AsymResult::measured("nvtree", mode, a.ops, secs, &d, &hist))
}

/// A front-end over TCP, with `--delay-us` if asked.
pub(crate) fn transport(a: &AsymArgs, addr: SocketAddr) -> Result<Box<dyn Transport>, String> {
    let tcp = TcpTransport::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    Ok(if a.delay_us > 0 {
        Box::new(FaultyTransport::new(
            tcp,
            Fault {
                delay: Duration::from_micros(a.delay_us),
                ..Fault::default()
            },
        ))
    } else {
        Box::new(tcp)
    })
}

/// One of the apps behind one interface.
enum App {
    Bank(SmallBank),
    Tatp(Tatp),
}

impl App {
    fn open(r: &mut Remote, app: &str, name: &str, scale: u64) -> nvstore_asym::Result<App> {
        Ok(match app {
            "smallbank" => App::Bank(SmallBank::open(r, name, scale)?),
            _ => App::Tatp(Tatp::open(r, name, scale)?),
        })
    }
}

/// `--app`: loads with a separate rcb front-end (not timed), then runs
/// `--ops` transactions of the app's mix in `mode` on a fresh front-end.
fn run_app(a: &AsymArgs, app: &str, mode: Mode, addr: SocketAddr) -> Result<AsymResult, String> {
    let e = |e: nvstore_asym::Error| e.to_string();
    let scale = a.scale.max(1);
    // Bytes per account (two hash rows) or per subscriber (about 11 rows in B+-tree leaves).
    let item = if app == "smallbank" { 2 * 88 } else { 11 * 100 };
    let name = format!("{app}-{}", rand::random::<u32>());
    let lock = format!("bench-{}", rand::random::<u32>());
    let owner = rand::random::<u64>() | 1;
    let loader = RemoteOptions {
        mode: Mode::Rcb,
        batch: 1024,
        cache_bytes: (scale * item * 2) as usize,
        owner,
        lock: lock.clone(),
        ..RemoteOptions::default()
    };
    let mut r = Remote::open(transport(a, addr)?, loader).map_err(e)?;
    match App::open(&mut r, app, &name, scale).map_err(e)? {
        App::Bank(mut b) => b.load(&mut r),
        App::Tatp(mut t) => t.load(&mut r),
    }
    .map_err(e)?;
    r.close().map_err(e)?;
    let opts = RemoteOptions {
        mode,
        batch: a.batch.max(1),
        cache_bytes: ((scale * item * a.cache_pct / 100) as usize).max(4096),
        owner,
        lock,
        ..RemoteOptions::default()
    };
    let mut r = Remote::open(transport(a, addr)?, opts).map_err(e)?;
    let mut db = App::open(&mut r, app, &name, scale).map_err(e)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    let mut aborted = 0;
    let start_counters = r.counters().clone();
    let t0 = Instant::now();
    for _ in 0..a.ops {
        let t = Instant::now();
        let out = match &mut db {
            App::Bank(b) => b.execute(&mut r, &smallbank::Tx::random(&mut rng, scale)),
            App::Tatp(d) => d.execute(&mut r, &tatp::Tx::random(&mut rng, scale)),
        }
        .map_err(e)?;
        aborted += (out == Outcome::Aborted) as u64;
        hist.record(t.elapsed().as_nanos().max(1) as u64).expect("in bounds");
    }
    // The last batch is part of the work.
    r.flush().map_err(e)?;
    let secs = t0.elapsed().as_secs_f64();
    let d = r.counters().since(&start_counters);
    r.close().map_err(e)?;
    let structure = if app == "smallbank" { "hash" } else { "bptree" };
    Ok(AsymResult {
        app: Some(app.into()),
        aborted: Some(aborted),
        ..AsymResult::measured(structure, mode, a.ops, secs, &d, &hist)
    })
}

/// `nvstore bench asym`: runs and prints.
pub fn asym_main(a: &AsymArgs, out: &mut dyn Write) -> Result<AsymResult, String> {
    let r = run_asym(a)?;
    let w = |e: std::io::Error| e.to_string();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&r).map_err(|e| e.to_string())?).map_err(w)?;
    } else {
        writeln!(
            out,
            "asym {}{} mode {}: {} ops, {:.0} ops/s, {:.3} round trips/op, {:.0} bytes/op, p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns, mean {} ns, {:.1}% of the time in operations over 10x p50",
            r.app.as_ref().map_or(String::new(), |a| format!("{a} on ")),
            r.structure,
            r.mode,
            r.ops,
            r.ops_per_sec,
            r.round_trips_per_op,
            r.bytes_per_op,
            r.p50_ns,
            r.p99_ns,
            r.p999_ns,
            r.max_ns,
            r.mean_ns,
            r.slow_time_share * 100.0
        )
        .map_err(w)?;
        if let Some(parts) = &r.per_partition {
            writeln!(out, "  {} partitions (aggregate above):", r.partitions).map_err(w)?;
            for p in parts {
                writeln!(
                    out,
                    "  partition {}: {} ops, {:.0} ops/s, {:.3} round trips/op, p50 {} ns, p99 {} ns",
                    p.partition, p.ops, p.ops_per_sec, p.round_trips_per_op, p.p50_ns, p.p99_ns
                )
                .map_err(w)?;
            }
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_time_share_is_the_time_of_operations_past_ten_medians() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for _ in 0..99 {
            h.record(1_000).unwrap();
        }
        assert_eq!(slow_time_share(&h, 10), 0.0);
        h.record(1_000_000).unwrap();
        let share = slow_time_share(&h, 10);
        // 1 ms of 1.099 ms.
        assert!((share - 1.0 / 1.099).abs() < 0.01, "{share}");
    }
}
