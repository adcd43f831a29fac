//! Micro-benchmarks (NV-Tree §6.2–6.4, Isle-Tree §V): one
//! operation type over N random 8-byte keys, on every engine, with flushes
//! and fences per operation counted on the same pmem layer.
//!
//! Procedure (the papers'): `insert` inserts N random unique keys with 8-byte
//! values into an empty index (measured). `update`, `search` and `delete`
//! first load N keys (not measured), then touch each key once in random
//! order (measured). `scan` loads N keys, then runs N / scan-len range scans
//! of scan-len pairs from random loaded keys. `mixed` loads N keys, then runs
//! N operations on random loaded keys, each a search with probability
//! `--read-ratio` and an update otherwise (NV-Tree §6.4.1).
//!
//! `--locality PCT` (NV-Tree §6.4.2, Fig. 14-15) confines the measured
//! operations to a hot zone: a contiguous PCT% of the loaded keys in key
//! order. Then update/search/mixed run N operations on random hot keys,
//! delete deletes each hot key once, and insert first loads N keys (not
//! measured) and measures N inserts of new random keys inside the hot zone's
//! key range. 100 (the default) is the uniform workload above.
//!
//! Every operation is timed with `Instant` and recorded in an HDR histogram;
//! flushes and fences are each worker thread's own counter deltas. Pools are
//! files in `--pool-dir` (default /dev/shm), unlinked as soon as they are
//! mapped. Engines that serialise on one lock (every baseline) run on one
//! thread whatever `--threads` says; the result reports the threads used.
//! Unless `--lazy-pages` ([`EngineConfig::populate`]), every page of a pool
//! is mapped when it is created and each measuring thread warms its heap
//! ([`warm_heap`], [`heap_warm_for`] of the threads that run), both before
//! the clock.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::args::{parse_count, parse_size};
use crate::engine::{BenchIndex, KeyKind};
use crate::keys::{key_at, mix, value_of};
use crate::output::{fmt_ops, print_and_save};
use crate::registry::{open_engine, parse_engines, pool_size_for, EngineConfig};
use nvstore::pmem::ThreadCounters;
use nvstore::{Error, LeafKind, Result};

/// The measured operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Insert,
    Update,
    Delete,
    Search,
    Scan,
    Mixed,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Search => "search",
            Op::Scan => "scan",
            Op::Mixed => "mixed",
        }
    }
}

/// `nvstore bench micro` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct MicroArgs {
    /// Engine: tree, hash, volatile, lcb, cdds, fptree, fastfair, wbtree (and lmdb,
    /// lmdb-batch with the `lmdb` feature; rocksdb, rocksdb-batch with the
    /// `rocksdb` feature); a comma list; or all.
    #[arg(long, default_value = "tree")]
    pub engine: String,
    /// Leaf format of the tree engine (baselines have their own).
    #[arg(long, default_value = "nv")]
    pub leaf: String,
    #[arg(long, value_enum, default_value = "insert")]
    pub op: Op,
    /// Number of keys N (k/M suffixes allowed: 1M).
    #[arg(long, value_parser = parse_count, default_value = "1M")]
    pub keys: u64,
    /// Node size in bytes (K suffix allowed: 4K).
    #[arg(long, value_parser = parse_size, default_value = "1024")]
    pub node_size: u64,
    /// Emulated write latency per flushed cache line, in nanoseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Worker threads (engines that serialise on one lock use one).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Fraction of searches in `--op mixed` (the rest are updates).
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Percentage of the keys (a contiguous hot zone) the measured operations touch.
    #[arg(long, default_value_t = 100.0)]
    pub locality: f64,
    #[arg(long, value_enum, default_value = "u64")]
    pub key_kind: KeyKind,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the results as JSON lines into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of keys, values and operation order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Pairs per range scan in `--op scan`.
    #[arg(long, default_value_t = 100)]
    pub scan_len: usize,
    /// Map the pools' pages as they are first touched, during the
    /// measured operations, instead of all at creation (the default: a
    /// first touch costs a page fault and the page's zeroing on tmpfs, an
    /// artefact of emulating NVM in DRAM that a real NVM mapping does not
    /// have, and the engines that allocate the most fresh pages pay it
    /// most). Also leaves each measuring thread's heap cold: by default it
    /// is warmed before the clock ([`warm_heap`]).
    #[arg(long)]
    pub lazy_pages: bool,
    /// Directory of the pool files (tmpfs keeps them in DRAM).
    #[arg(long, default_value = "/dev/shm")]
    pub pool_dir: PathBuf,
}

impl Default for MicroArgs {
    fn default() -> Self {
        MicroArgs {
            engine: "tree".into(),
            leaf: "nv".into(),
            op: Op::Insert,
            keys: 1_000_000,
            node_size: 1024,
            latency_ns: 0,
            threads: 1,
            read_ratio: 0.5,
            locality: 100.0,
            key_kind: KeyKind::U64,
            json: false,
            out: None,
            seed: 1,
            scan_len: 100,
            lazy_pages: false,
            pool_dir: "/dev/shm".into(),
        }
    }
}

/// `nvstore bench compare` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CompareArgs {
    #[arg(long, value_enum, default_value = "insert")]
    pub op: Op,
    /// Number of keys N (k/M suffixes allowed).
    #[arg(long, value_parser = parse_count, default_value = "1M")]
    pub keys: u64,
    /// Emulated write latency per flushed cache line, in nanoseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Node size in bytes (K suffix allowed).
    #[arg(long, value_parser = parse_size, default_value = "1024")]
    pub node_size: u64,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the results as JSON lines into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Repetitions; engines are interleaved, their order rotated each time.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Engines to compare (comma list); tree is always included.
    #[arg(long, default_value = "all")]
    pub engines: String,
    /// Fraction of searches in `--op mixed`.
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Pairs per range scan in `--op scan`.
    #[arg(long, default_value_t = 100)]
    pub scan_len: usize,
    /// Map the pools' pages as they are first touched, during the
    /// measured operations, instead of all at creation (the default: a
    /// first touch costs a page fault and the page's zeroing on tmpfs, an
    /// artefact of emulating NVM in DRAM that a real NVM mapping does not
    /// have, and the engines that allocate the most fresh pages pay it
    /// most). Also leaves each measuring thread's heap cold: by default it
    /// is warmed before the clock ([`warm_heap`]).
    #[arg(long)]
    pub lazy_pages: bool,
    /// Directory of the pool files.
    #[arg(long, default_value = "/dev/shm")]
    pub pool_dir: PathBuf,
}

impl Default for CompareArgs {
    fn default() -> Self {
        CompareArgs {
            op: Op::Insert,
            keys: 1_000_000,
            latency_ns: 0,
            node_size: 1024,
            json: false,
            out: None,
            reps: 3,
            engines: "all".into(),
            read_ratio: 0.5,
            seed: 1,
            scan_len: 100,
            lazy_pages: false,
            pool_dir: "/dev/shm".into(),
        }
    }
}

/// One measured run.
#[derive(Clone, Debug)]
pub struct Workload {
    pub op: Op,
    pub keys: u64,
    pub threads: usize,
    pub read_ratio: f64,
    pub locality: f64,
    pub seed: u64,
    pub scan_len: usize,
}

impl Workload {
    pub fn new(op: Op, keys: u64) -> Workload {
        Workload {
            op,
            keys,
            threads: 1,
            read_ratio: 0.5,
            locality: 100.0,
            seed: 1,
            scan_len: 100,
        }
    }
}

/// One engine's result (one JSON object per line with `--json`).
#[derive(Clone, Debug, Serialize)]
pub struct MicroResult {
    pub engine: String,
    pub leaf: String,
    pub op: Op,
    pub keys: u64,
    pub threads: usize,
    pub node_size: u64,
    /// Emulated write latency per flushed line (the `--latency-ns` setting).
    pub latency_ns: u64,
    pub ops_per_sec: f64,
    pub flushes_per_op: f64,
    pub fences_per_op: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    /// Leaf splits during the measured phase.
    pub splits: u64,
    pub rebuilds: u64,
    pub rebuild_ms: f64,
}

/// What measured operation `j` does: the workload's op, or for `mixed` a
/// search with probability `read_ratio` and an update otherwise.
#[inline]
fn kind_of(w: &Workload, j: u64) -> Op {
    match w.op {
        Op::Mixed => {
            let u = (mix(j ^ w.seed.rotate_left(29) ^ 0x1234_5678) >> 11) as f64 / (1u64 << 53) as f64;
            if u < w.read_ratio {
                Op::Search
            } else {
                Op::Update
            }
        }
        op => op,
    }
}

/// Loads the first `n` keys (not measured).
fn load(engine: &dyn BenchIndex, seed: u64, n: u64) {
    for i in 0..n {
        let k = key_at(seed, i);
        engine.insert(k, value_of(seed, k, 0));
    }
}

/// How many keys to load first, and the key of each measured operation (8
/// bytes per operation, so 100M-key runs fit).
fn plan(w: &Workload) -> (u64, Vec<u64>) {
    let n = w.keys;
    let mut rng = StdRng::seed_from_u64(w.seed ^ 0x0bad_cafe);
    let uniform = w.locality >= 100.0;
    // The hot zone: indices of a contiguous run of the loaded keys in key order.
    let hot: Vec<u64> = if uniform || n == 0 {
        Vec::new()
    } else {
        let mut idx: Vec<u64> = (0..n).collect();
        idx.sort_unstable_by_key(|&i| key_at(w.seed, i));
        let h = ((n as f64 * w.locality / 100.0).ceil() as u64).clamp(1, n);
        let start = rng.gen_range(0..=n - h) as usize;
        idx.truncate(start + h as usize);
        idx.drain(..start);
        idx
    };
    let each_once = |rng: &mut StdRng| -> Vec<u64> {
        let mut v: Vec<u64> = if uniform {
            (0..n).map(|i| key_at(w.seed, i)).collect()
        } else {
            hot.iter().map(|&i| key_at(w.seed, i)).collect()
        };
        v.shuffle(rng);
        v
    };
    let random_loaded = |rng: &mut StdRng, count: u64| -> Vec<u64> {
        (0..count)
            .map(|_| {
                let i = if uniform {
                    rng.gen_range(0..n)
                } else {
                    hot[rng.gen_range(0..hot.len())]
                };
                key_at(w.seed, i)
            })
            .collect()
    };
    match w.op {
        Op::Insert if uniform => (0, (0..n).map(|i| key_at(w.seed, i)).collect()),
        Op::Insert => {
            let lo = hot.iter().map(|&i| key_at(w.seed, i)).min().unwrap_or(0);
            let hi = hot.iter().map(|&i| key_at(w.seed, i)).max().unwrap_or(u64::MAX);
            (n, (0..n).map(|_| rng.gen_range(lo..=hi)).collect())
        }
        Op::Update | Op::Search if uniform => (n, each_once(&mut rng)),
        Op::Delete => (n, each_once(&mut rng)),
        Op::Update | Op::Search | Op::Mixed => (n, random_loaded(&mut rng, n)),
        Op::Scan => {
            let scans = (n / w.scan_len.max(1) as u64).max(1);
            (n, random_loaded(&mut rng, scans))
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Runs workload `w` on a freshly built `engine` and measures it.
pub fn measure(engine: &dyn BenchIndex, w: &Workload, cfg: &EngineConfig) -> MicroResult {
    let (preload, steps) = plan(w);
    load(engine, w.seed, preload);
    let threads = if engine.concurrent() { w.threads.max(1) } else { 1 };
    let warm = heap_warm_for(!cfg.populate, w.keys, threads);
    let before = engine.stats();
    let scan_len = w.scan_len;
    let chunk = steps.len().div_ceil(threads).max(1);
    let barrier = Barrier::new(threads + 1);
    let (wall, per_thread) = std::thread::scope(|s| {
        let handles: Vec<_> = steps
            .chunks(chunk)
            .enumerate()
            .map(|(c, part)| {
                let barrier = &barrier;
                let base = c * chunk;
                s.spawn(move || {
                    let mut h = new_histogram();
                    let mut out = Vec::with_capacity(scan_len);
                    let mut misses = 0u64;
                    warm_heap(warm);
                    let c0 = ThreadCounters::get();
                    barrier.wait();
                    for (j, &k) in part.iter().enumerate() {
                        let j = (base + j) as u64;
                        let t = Instant::now();
                        match kind_of(w, j) {
                            Op::Insert => engine.insert(k, value_of(w.seed, k, 0)),
                            Op::Update => {
                                if !engine.update(k, value_of(w.seed, k, 1 + j)) {
                                    misses += 1;
                                }
                            }
                            Op::Delete => {
                                if !engine.delete(k) {
                                    misses += 1;
                                }
                            }
                            Op::Search => {
                                if std::hint::black_box(engine.search(k)).is_none() {
                                    misses += 1;
                                }
                            }
                            Op::Scan => {
                                out.clear();
                                engine.scan(k, scan_len, &mut out);
                                std::hint::black_box(&out);
                            }
                            Op::Mixed => unreachable!("kind_of resolves mixed"),
                        }
                        h.saturating_record(t.elapsed().as_nanos().max(1) as u64);
                    }
                    (h, ThreadCounters::get().since(c0), misses)
                })
            })
            .collect();
        // Threads beyond the number of chunks never start; release the barrier anyway.
        for _ in handles.len()..threads {
            s.spawn(|| barrier.wait());
        }
        barrier.wait();
        let t0 = Instant::now();
        let per: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect();
        (t0.elapsed(), per)
    });
    let mut hist = new_histogram();
    let (mut flushes, mut fences, mut misses) = (0u64, 0u64, 0u64);
    for (h, c, m) in &per_thread {
        hist.add(h).expect("same histogram bounds");
        flushes += c.flushes;
        fences += c.fences;
        misses += m;
    }
    // Every measured update, delete and search targets a loaded key.
    assert_eq!(
        misses,
        0,
        "{}: {} of {} {} operations missed a loaded key",
        engine.name(),
        misses,
        steps.len(),
        w.op.as_str()
    );
    let after = engine.stats();
    let ops = steps.len().max(1) as f64;
    MicroResult {
        engine: engine.name().to_string(),
        leaf: engine.leaf().to_string(),
        op: w.op,
        keys: w.keys,
        threads,
        node_size: cfg.node_size,
        latency_ns: cfg.latency_ns,
        ops_per_sec: steps.len() as f64 / wall.as_secs_f64().max(1e-9),
        flushes_per_op: flushes as f64 / ops,
        fences_per_op: fences as f64 / ops,
        p50_ns: hist.value_at_quantile(0.50),
        p99_ns: hist.value_at_quantile(0.99),
        p999_ns: hist.value_at_quantile(0.999),
        splits: after.splits - before.splits,
        rebuilds: after.rebuilds - before.rebuilds,
        rebuild_ms: after.rebuild_ms - before.rebuild_ms,
    }
}

/// Heap bytes warmed per measuring thread for a run of `keys` keys on
/// `threads` threads: 128 per key (tree/nv's DRAM index grows by about 40
/// bytes per key inserted, with its rebuilds' new copies on top), at least
/// 16 MiB and at most 1 GiB; none with `--lazy-pages`.
pub fn heap_warm_for(lazy_pages: bool, keys: u64, threads: usize) -> u64 {
    if lazy_pages {
        return 0;
    }
    (keys.saturating_mul(128) / threads.max(1) as u64).clamp(16 << 20, 1 << 30)
}

/// Allocates `bytes` of heap in small blocks, writes every page of them,
/// and frees them again, on the calling thread, so the allocator hands the
/// memory out again while it is still mapped.
///
/// What it takes out of the measured phase: the first touch of heap memory
/// the process has not used before is a page fault and the zeroing of the
/// page (with transparent huge pages, of 2 MiB at once). On the VMs these
/// benchmarks run on that cost up to about 6 ms per MiB, some fifty times
/// what zeroing takes on bare metal, and it fell on whichever engine grew
/// its DRAM state while measured: tree/nv's index rebuilds during 1M
/// inserts took 16-250 ms from run to run with a cold heap, 13-54 ms with
/// a warm one (BENCHMARKS.md, "The heap warmed before the clock"). The pool's
/// pages are mapped before the clock for the same reason
/// ([`EngineConfig::populate`]).
pub fn warm_heap(bytes: u64) {
    /// Block size: the order of the DRAM index's own allocations (leaf
    /// handles, PLNs), so the allocator's small-object pages are the ones
    /// warmed.
    const BLOCK: usize = 256;
    warm_blocks(bytes as usize / BLOCK, &[BLOCK]);
}

/// Allocates `count` groups of blocks of `sizes` bytes each, writes every
/// byte, then frees them all: memory the allocator then hands out again
/// already mapped (see [`warm_heap`]).
pub fn warm_blocks(count: usize, sizes: &[usize]) {
    let blocks: Vec<Box<[u8]>> = (0..count)
        .flat_map(|_| sizes.iter().map(|&n| vec![1u8; n].into_boxed_slice()))
        .collect();
    std::hint::black_box(&blocks);
}

/// Builds an engine with `make` and measures workload `w` on it.
pub fn run_with<F>(make: F, w: &Workload, cfg: &EngineConfig) -> Result<MicroResult>
where
    F: FnOnce() -> Result<Box<dyn BenchIndex>>,
{
    let engine = make()?;
    let r = measure(&*engine, w, cfg);
    drop(engine);
    Ok(r)
}

fn check_common(keys: u64, read_ratio: f64, scan_len: usize) -> Result<()> {
    if keys == 0 {
        return Err(Error::InvalidOption("--keys must be at least 1".into()));
    }
    if !(0.0..=1.0).contains(&read_ratio) {
        return Err(Error::InvalidOption(format!(
            "--read-ratio {read_ratio} must be between 0 and 1"
        )));
    }
    if scan_len == 0 {
        return Err(Error::InvalidOption("--scan-len must be at least 1".into()));
    }
    Ok(())
}

/// `nvstore bench micro`: one result per engine.
pub fn run_micro(args: &MicroArgs) -> Result<Vec<MicroResult>> {
    check_common(args.keys, args.read_ratio, args.scan_len)?;
    if !(args.locality > 0.0 && args.locality <= 100.0) {
        return Err(Error::InvalidOption(format!(
            "--locality {} must be in (0, 100]",
            args.locality
        )));
    }
    let leaf: LeafKind = args.leaf.parse().map_err(Error::InvalidOption)?;
    let engines = parse_engines(&args.engine)?;
    let cfg = EngineConfig {
        node_size: args.node_size,
        latency_ns: args.latency_ns,
        leaf,
        key_kind: args.key_kind,
        pool_dir: args.pool_dir.clone(),
        pool_size: pool_size_for(args.keys),
        populate: !args.lazy_pages,
    };
    let w = Workload {
        op: args.op,
        keys: args.keys,
        threads: args.threads.max(1),
        read_ratio: args.read_ratio,
        locality: args.locality,
        seed: args.seed,
        scan_len: args.scan_len,
    };
    engines
        .into_iter()
        .map(|e| run_with(|| open_engine(e, &cfg), &w, &cfg))
        .collect()
}

/// One engine's line of `nvstore bench compare`.
#[derive(Clone, Debug, Serialize)]
pub struct CompareResult {
    pub engine: String,
    pub leaf: String,
    pub op: Op,
    pub keys: u64,
    pub node_size: u64,
    pub latency_ns: u64,
    pub reps: usize,
    /// Medians over the repetitions.
    pub ops_per_sec: f64,
    pub flushes_per_op: f64,
    pub fences_per_op: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub splits: u64,
    /// Median over repetitions of (this engine's ops/s) / (tree's ops/s in the same repetition).
    pub ratio_vs_nv: f64,
    /// Every repetition's ops/s, in repetition order.
    pub ops_per_sec_reps: Vec<f64>,
}

fn median_f(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_u(v: Vec<u64>) -> u64 {
    median_f(v.into_iter().map(|x| x as f64).collect()).round() as u64
}

/// `nvstore bench compare`: every engine, repetitions interleaved with the
/// engine order rotated, each engine's ratio to the tree paired per repetition.
pub fn run_compare(args: &CompareArgs) -> Result<Vec<CompareResult>> {
    check_common(args.keys, args.read_ratio, args.scan_len)?;
    let mut engines = parse_engines(&args.engines)?;
    if !engines.contains(&"tree") {
        engines.insert(0, "tree");
    }
    let reps = args.reps.max(1);
    let cfg = EngineConfig {
        node_size: args.node_size,
        latency_ns: args.latency_ns,
        leaf: LeafKind::Nv,
        key_kind: KeyKind::U64,
        pool_dir: args.pool_dir.clone(),
        pool_size: pool_size_for(args.keys),
        populate: !args.lazy_pages,
    };
    let w = Workload {
        op: args.op,
        keys: args.keys,
        threads: 1,
        read_ratio: args.read_ratio,
        locality: 100.0,
        seed: args.seed,
        scan_len: args.scan_len,
    };
    // The tree runs once per leaf format; the rest have one layout each.
    let engines: Vec<(&str, LeafKind)> = engines
        .iter()
        .flat_map(|&e| match e {
            "tree" => vec![("tree", LeafKind::Nv), ("tree", LeafKind::Isle)],
            _ => vec![(e, LeafKind::Nv)],
        })
        .collect();
    // runs[engine][rep]; repetition `rep` starts with engine `rep % engines`.
    let mut runs: Vec<Vec<MicroResult>> = vec![Vec::with_capacity(reps); engines.len()];
    for rep in 0..reps {
        for j in 0..engines.len() {
            let e = (j + rep) % engines.len();
            let (name, leaf) = engines[e];
            let cfg = EngineConfig { leaf, ..cfg.clone() };
            let r = run_with(|| open_engine(name, &cfg), &w, &cfg)?;
            runs[e].push(r);
        }
    }
    let tree_i = engines
        .iter()
        .position(|&e| e == ("tree", LeafKind::Nv))
        .expect("tree is included");
    let tree_ops: Vec<f64> = runs[tree_i].iter().map(|r| r.ops_per_sec).collect();
    Ok(engines
        .iter()
        .zip(&runs)
        .map(|(_, rs)| {
            let first = &rs[0];
            let ratios: Vec<f64> = rs.iter().zip(&tree_ops).map(|(r, t)| r.ops_per_sec / t).collect();
            CompareResult {
                engine: first.engine.clone(),
                leaf: first.leaf.clone(),
                op: first.op,
                keys: first.keys,
                node_size: first.node_size,
                latency_ns: first.latency_ns,
                reps,
                ops_per_sec: median_f(rs.iter().map(|r| r.ops_per_sec).collect()),
                flushes_per_op: median_f(rs.iter().map(|r| r.flushes_per_op).collect()),
                fences_per_op: median_f(rs.iter().map(|r| r.fences_per_op).collect()),
                p50_ns: median_u(rs.iter().map(|r| r.p50_ns).collect()),
                p99_ns: median_u(rs.iter().map(|r| r.p99_ns).collect()),
                p999_ns: median_u(rs.iter().map(|r| r.p999_ns).collect()),
                splits: median_u(rs.iter().map(|r| r.splits).collect()),
                ratio_vs_nv: median_f(ratios),
                ops_per_sec_reps: rs.iter().map(|r| r.ops_per_sec).collect(),
            }
        })
        .collect())
}

/// A table of micro results.
pub fn print_micro_table(rs: &[MicroResult], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<9} {:<12} {:<7} {:>9} {:>3} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>4} {:>9}",
        "engine",
        "leaf",
        "op",
        "keys",
        "thr",
        "node",
        "lat",
        "ops/s",
        "flush/op",
        "fence/op",
        "p50",
        "p99",
        "p99.9",
        "splits",
        "rbld",
        "rbld_ms"
    )?;
    for r in rs {
        writeln!(
            out,
            "{:<9} {:<12} {:<7} {:>9} {:>3} {:>6} {:>6} {:>9} {:>8.2} {:>8.2} {:>8} {:>8} {:>9} {:>7} {:>4} {:>9.1}",
            r.engine,
            r.leaf,
            r.op.as_str(),
            r.keys,
            r.threads,
            r.node_size,
            r.latency_ns,
            fmt_ops(r.ops_per_sec),
            r.flushes_per_op,
            r.fences_per_op,
            r.p50_ns,
            r.p99_ns,
            r.p999_ns,
            r.splits,
            r.rebuilds,
            r.rebuild_ms
        )?;
    }
    Ok(())
}

/// A table of compare results.
pub fn print_compare_table(rs: &[CompareResult], out: &mut dyn Write) -> std::io::Result<()> {
    if let Some(r) = rs.first() {
        writeln!(
            out,
            "{} of {} keys, {} B nodes, {} ns/line, median of {} interleaved repetitions",
            r.op.as_str(),
            r.keys,
            r.node_size,
            r.latency_ns,
            r.reps
        )?;
    }
    writeln!(
        out,
        "{:<9} {:<12} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8}",
        "engine", "leaf", "ops/s", "flush/op", "fence/op", "p50", "p99", "p99.9", "splits", "vs tree"
    )?;
    for r in rs {
        writeln!(
            out,
            "{:<9} {:<12} {:>9} {:>8.2} {:>8.2} {:>8} {:>8} {:>9} {:>7} {:>7.2}x",
            r.engine,
            r.leaf,
            fmt_ops(r.ops_per_sec),
            r.flushes_per_op,
            r.fences_per_op,
            r.p50_ns,
            r.p99_ns,
            r.p999_ns,
            r.splits,
            r.ratio_vs_nv
        )?;
    }
    Ok(())
}

/// `nvstore bench micro`: runs, prints a table (or JSON lines with
/// `--json`) to `out`, and writes JSON lines into `--out DIR`.
pub fn micro_main(args: &MicroArgs, out: &mut dyn Write) -> Result<Vec<MicroResult>> {
    let rs = run_micro(args)?;
    print_and_save(&rs, args.json, print_micro_table, out, args.out.as_deref(), || {
        format!(
            "micro-{}-{}-{}-{}.jsonl",
            args.engine.replace(',', "+"),
            args.op.as_str(),
            args.keys,
            args.node_size
        )
    })?;
    Ok(rs)
}

/// `nvstore bench compare`: runs, prints a table (or JSON lines), and writes
/// JSON lines into `--out DIR`.
pub fn compare_main(args: &CompareArgs, out: &mut dyn Write) -> Result<Vec<CompareResult>> {
    let rs = run_compare(args)?;
    print_and_save(&rs, args.json, print_compare_table, out, args.out.as_deref(), || {
        format!("compare-{}-{}-{}.jsonl", args.op.as_str(), args.keys, args.node_size)
    })?;
    Ok(rs)
}
