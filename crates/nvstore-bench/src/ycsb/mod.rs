//! `nvstore bench ycsb`: YCSB's core workloads A-F (B. F. Cooper et al.,
//! "Benchmarking Cloud Serving Systems with YCSB", SoCC 2010), as YCSB's
//! `CoreWorkload` and its `workloads/workload[a-f]` files define them:
//!
//! | workload | read | update | insert | scan | read-modify-write | requests |
//! |----------|------|--------|--------|------|-------------------|----------|
//! | a        | 0.50 | 0.50   |        |      |                   | zipfian  |
//! | b        | 0.95 | 0.05   |        |      |                   | zipfian  |
//! | c        | 1.00 |        |        |      |                   | zipfian  |
//! | d        | 0.95 |        | 0.05   |      |                   | latest   |
//! | e        |      |        | 0.05   | 0.95 |                   | zipfian  |
//! | f        | 0.50 |        |        |      | 0.50              | zipfian  |
//!
//! Records have `fieldcount = 10` fields `field0..field9` of `fieldlength =
//! 100` random printable bytes; keys are `"user" + fnvhash64(keynum)`
//! (`insertorder = hashed`); reads read all fields (`readallfields = true`),
//! updates write one random field (`writeallfields = false`); scans (E) have
//! a length uniform in 1..=100. The zipfian key chooser is a scrambled
//! zipfian over `[0, records + 2 * ops * insertproportion]` (YCSB's
//! `expectednewkeys` fudge); any key number not yet acknowledged is redrawn.
//! Inserts take the next number of the shared acknowledged counter.
//!
//! The load phase inserts `records` records (numbers 0..records, spread over
//! the threads); the run phase executes `ops` operations split evenly over
//! `threads` client threads, each with its own connection (or handle), RNG
//! and generators. Each operation is timed into an HDR histogram per type.
//!
//! Targets (see [`target`]): `embedded` is an nvstore pool in this process,
//! one serialized value per record; `resp://HOST:PORT` is any server of the
//! Redis protocol with the record layout of YCSB's redis binding; `redis`
//! is that layout on a durable redis-server the benchmark starts.

pub mod gen;
pub mod resp;
pub mod target;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::args::{parse_count, parse_size};
use gen::{fnvhash64, AckCounter, Discrete, ScrambledZipfian, SkewedLatest, Uniform};
use nvstore::{EngineKind, Error, Result};
use target::Client;

/// YCSB's `fieldcount` default.
pub const FIELD_COUNT: usize = 10;
/// YCSB's `fieldlength` default.
pub const FIELD_LENGTH: usize = 100;

/// The core workload files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadName {
    A,
    B,
    C,
    D,
    E,
    F,
}

impl WorkloadName {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadName::A => "a",
            WorkloadName::B => "b",
            WorkloadName::C => "c",
            WorkloadName::D => "d",
            WorkloadName::E => "e",
            WorkloadName::F => "f",
        }
    }

    pub const ALL: [WorkloadName; 6] = [
        WorkloadName::A,
        WorkloadName::B,
        WorkloadName::C,
        WorkloadName::D,
        WorkloadName::E,
        WorkloadName::F,
    ];

    /// The properties of `workloads/workload<x>` (over CoreWorkload's defaults).
    pub fn spec(self) -> CoreWorkload {
        let base = CoreWorkload {
            read: 0.0,
            update: 0.0,
            insert: 0.0,
            scan: 0.0,
            read_modify_write: 0.0,
            distribution: RequestDistribution::Zipfian,
            min_scan_length: 1,
            max_scan_length: 1000,
            field_count: FIELD_COUNT,
            field_length: FIELD_LENGTH,
        };
        match self {
            WorkloadName::A => CoreWorkload {
                read: 0.5,
                update: 0.5,
                ..base
            },
            WorkloadName::B => CoreWorkload {
                read: 0.95,
                update: 0.05,
                ..base
            },
            WorkloadName::C => CoreWorkload { read: 1.0, ..base },
            WorkloadName::D => CoreWorkload {
                read: 0.95,
                insert: 0.05,
                distribution: RequestDistribution::Latest,
                ..base
            },
            WorkloadName::E => CoreWorkload {
                scan: 0.95,
                insert: 0.05,
                max_scan_length: 100,
                ..base
            },
            WorkloadName::F => CoreWorkload {
                read: 0.5,
                read_modify_write: 0.5,
                ..base
            },
        }
    }
}

/// `requestdistribution`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestDistribution {
    Uniform,
    Zipfian,
    Latest,
}

/// The CoreWorkload properties the core workloads set.
#[derive(Clone, Copy, Debug)]
pub struct CoreWorkload {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
    pub distribution: RequestDistribution,
    pub min_scan_length: u64,
    pub max_scan_length: u64,
    pub field_count: usize,
    pub field_length: usize,
}

/// One YCSB operation type (YCSB's measurement names in lowercase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl OpKind {
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::Scan,
        OpKind::ReadModifyWrite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::Scan => "scan",
            OpKind::ReadModifyWrite => "read_modify_write",
        }
    }
}

impl CoreWorkload {
    /// YCSB's `operationchooser`.
    pub fn op_chooser(&self) -> Discrete<OpKind> {
        Discrete::new(vec![
            (self.read, OpKind::Read),
            (self.update, OpKind::Update),
            (self.insert, OpKind::Insert),
            (self.scan, OpKind::Scan),
            (self.read_modify_write, OpKind::ReadModifyWrite),
        ])
    }
}

/// YCSB's `keychooser`, one per client thread.
pub enum KeyChooser {
    Uniform(Uniform),
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
}

impl KeyChooser {
    /// As `CoreWorkload.init` builds it for `records` loaded records and
    /// `ops` operations.
    pub fn new(w: &CoreWorkload, records: u64, ops: u64, inserts: &AckCounter) -> KeyChooser {
        match w.distribution {
            RequestDistribution::Uniform => KeyChooser::Uniform(Uniform::new(0, records - 1)),
            RequestDistribution::Zipfian => {
                let expected_new_keys = (ops as f64 * w.insert * 2.0) as u64;
                KeyChooser::Zipfian(ScrambledZipfian::new(0, records + expected_new_keys))
            }
            RequestDistribution::Latest => KeyChooser::Latest(SkewedLatest::new(inserts.last_value())),
        }
    }

    /// `CoreWorkload.nextKeynum`: redraws numbers not yet acknowledged.
    pub fn next_keynum<R: Rng>(&mut self, inserts: &AckCounter, rng: &mut R) -> u64 {
        loop {
            let last = inserts.last_value();
            let k = match self {
                KeyChooser::Uniform(g) => g.next(rng),
                KeyChooser::Zipfian(g) => g.next(rng),
                KeyChooser::Latest(g) => g.next(last, rng),
            };
            if k <= last {
                return k;
            }
        }
    }
}

/// `CoreWorkload.buildKeyName` with `insertorder = hashed`, `zeropadding = 1`.
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnvhash64(keynum))
}

/// Fills `buf` with random printable ASCII (YCSB's `RandomByteIterator`).
pub fn random_field<R: Rng>(rng: &mut R, buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        let r: u64 = rng.gen();
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = b' ' + ((r >> (8 * i)) as u8 % 95);
        }
    }
}

fn random_record<R: Rng>(rng: &mut R, w: &CoreWorkload) -> Vec<Vec<u8>> {
    (0..w.field_count)
        .map(|_| {
            let mut f = vec![0u8; w.field_length];
            random_field(rng, &mut f);
            f
        })
        .collect()
}

/// `nvstore bench ycsb` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct YcsbArgs {
    #[arg(long, value_enum, default_value = "a")]
    pub workload: WorkloadName,
    /// Records loaded before the run phase (k/M suffixes allowed).
    #[arg(long, value_parser = parse_count, default_value = "100k")]
    pub records: u64,
    /// Operations of the run phase (k/M suffixes allowed).
    #[arg(long, value_parser = parse_count, default_value = "100k")]
    pub ops: u64,
    /// Client threads (each with its own connection).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// `embedded` (an nvstore pool in this process), `redis` (a redis-server
    /// started here with appendfsync always, files on /dev/shm) or
    /// `resp://HOST:PORT` (any Redis-protocol server).
    #[arg(long, default_value = "embedded")]
    pub target: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Embedded target: the pool file to create (default: a temporary file
    /// in /dev/shm, removed when the run ends).
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Embedded target: leaf node size in bytes.
    #[arg(long, value_parser = parse_size, default_value = "4096")]
    pub node_size: u64,
    /// Embedded target: the engine the pool is created with, `tree` or
    /// `hash` (its ordered index answers workload E's scans).
    #[arg(long, default_value = "tree")]
    pub engine: EngineKind,
    /// Also write the result as JSON into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl Default for YcsbArgs {
    fn default() -> Self {
        YcsbArgs {
            workload: WorkloadName::A,
            records: 100_000,
            ops: 100_000,
            threads: 1,
            target: "embedded".into(),
            json: false,
            pool: None,
            node_size: 4096,
            engine: EngineKind::Tree,
            out: None,
            seed: 1,
        }
    }
}

/// Throughput and latency of one operation type.
#[derive(Clone, Debug, Serialize)]
pub struct OpStats {
    pub count: u64,
    /// Operations of this type per second of the run phase.
    pub ops_per_sec: f64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// Reads (and the read of a read-modify-write) that found no record.
    pub not_found: u64,
}

/// One YCSB run.
#[derive(Clone, Debug, Serialize)]
pub struct YcsbResult {
    /// Always "ycsb" (tells the plotter what it reads).
    pub bench: String,
    pub workload: WorkloadName,
    pub records: u64,
    pub ops: u64,
    pub threads: usize,
    pub target: String,
    /// Embedded target: the pool's engine (`tree` or `hash`); `-` for
    /// Redis-protocol targets.
    pub engine: String,
    /// How records are stored.
    pub layout: String,
    pub seed: u64,
    pub load_secs: f64,
    pub load_ops_per_sec: f64,
    pub run_secs: f64,
    /// Operations of the run phase per second, all types.
    pub ops_per_sec: f64,
    /// Per operation type, only the types the workload issues.
    pub operations: BTreeMap<String, OpStats>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

struct ThreadStats {
    hist: BTreeMap<OpKind, Histogram<u64>>,
    not_found: BTreeMap<OpKind, u64>,
}

/// Runs one operation; returns whether a read found its record.
fn do_op<R: Rng>(
    c: &mut dyn Client,
    kind: OpKind,
    w: &CoreWorkload,
    keys: &mut KeyChooser,
    inserts: &AckCounter,
    rng: &mut R,
    field: &mut [u8],
) -> Result<bool> {
    match kind {
        OpKind::Read => {
            let k = key_name(keys.next_keynum(inserts, rng));
            c.read(&k)
        }
        OpKind::Update => {
            let k = key_name(keys.next_keynum(inserts, rng));
            let f = rng.gen_range(0..w.field_count);
            random_field(rng, field);
            c.update(&k, f, field)?;
            Ok(true)
        }
        OpKind::Insert => {
            let n = inserts.next_value();
            let rec = random_record(rng, w);
            c.insert(&key_name(n), &rec)?;
            inserts.acknowledge(n);
            Ok(true)
        }
        OpKind::Scan => {
            let k = key_name(keys.next_keynum(inserts, rng));
            let len = Uniform::new(w.min_scan_length, w.max_scan_length).next(rng);
            c.scan(&k, len as usize)?;
            Ok(true)
        }
        OpKind::ReadModifyWrite => {
            let k = key_name(keys.next_keynum(inserts, rng));
            let found = c.read(&k)?;
            let f = rng.gen_range(0..w.field_count);
            random_field(rng, field);
            c.update(&k, f, field)?;
            Ok(found)
        }
    }
}

/// Load then run; returns the measurements.
pub fn run_ycsb(args: &YcsbArgs) -> Result<YcsbResult> {
    if args.records == 0 || args.threads == 0 {
        return Err(Error::InvalidOption(
            "--records and --threads must be at least 1".into(),
        ));
    }
    let w = args.workload.spec();
    let target = target::open(args, &w)?;
    let threads = args.threads;

    // Load phase: key numbers 0..records, handed out by a shared counter.
    let next = AtomicU64::new(0);
    let barrier = Barrier::new(threads + 1);
    let load_secs = std::thread::scope(|s| -> Result<f64> {
        let mut hs = Vec::new();
        for t in 0..threads {
            let (next, barrier, target, w) = (&next, &barrier, &*target, &w);
            hs.push(s.spawn(move || -> Result<()> {
                let c = target.client();
                let mut rng = StdRng::seed_from_u64(args.seed ^ (0x10ad << 16) ^ t as u64);
                barrier.wait();
                let mut c = c?;
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= args.records {
                        return Ok(());
                    }
                    let rec = random_record(&mut rng, w);
                    c.insert(&key_name(n), &rec)?;
                }
            }));
        }
        barrier.wait();
        let t0 = Instant::now();
        for h in hs {
            h.join().expect("load thread panicked")?;
        }
        Ok(t0.elapsed().as_secs_f64())
    })?;

    // Run phase.
    let inserts = AckCounter::new(args.records);
    let chooser = w.op_chooser();
    let barrier = Barrier::new(threads + 1);
    let (run_secs, stats) = std::thread::scope(|s| -> Result<(f64, Vec<ThreadStats>)> {
        let mut hs = Vec::new();
        for t in 0..threads {
            let my_ops = args.ops / threads as u64 + u64::from((t as u64) < args.ops % threads as u64);
            let (barrier, target, w, inserts, chooser) = (&barrier, &*target, &w, &inserts, &chooser);
            hs.push(s.spawn(move || -> Result<ThreadStats> {
                let c = target.client();
                let mut rng = StdRng::seed_from_u64(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ t as u64);
                let mut keys = KeyChooser::new(w, args.records, args.ops, inserts);
                let mut st = ThreadStats {
                    hist: OpKind::ALL.iter().map(|&k| (k, new_histogram())).collect(),
                    not_found: BTreeMap::new(),
                };
                let mut field = vec![0u8; w.field_length];
                barrier.wait();
                let mut c = c?;
                for _ in 0..my_ops {
                    let kind = chooser.next(&mut rng);
                    let t0 = Instant::now();
                    let found = do_op(&mut *c, kind, w, &mut keys, inserts, &mut rng, &mut field)?;
                    let ns = t0.elapsed().as_nanos() as u64;
                    st.hist.get_mut(&kind).expect("every kind").saturating_record(ns.max(1));
                    if !found {
                        *st.not_found.entry(kind).or_default() += 1;
                    }
                }
                Ok(st)
            }));
        }
        barrier.wait();
        let t0 = Instant::now();
        let mut out = Vec::new();
        let mut err = None;
        for h in hs {
            match h.join().expect("run thread panicked") {
                Ok(st) => out.push(st),
                Err(e) => err = Some(e),
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        Ok((t0.elapsed().as_secs_f64(), out))
    })?;

    let mut operations = BTreeMap::new();
    for kind in OpKind::ALL {
        let mut h = new_histogram();
        let mut nf = 0;
        for st in &stats {
            h.add(&st.hist[&kind]).expect("same bounds");
            nf += st.not_found.get(&kind).copied().unwrap_or(0);
        }
        if h.is_empty() {
            continue;
        }
        operations.insert(
            kind.as_str().to_string(),
            OpStats {
                count: h.len(),
                ops_per_sec: h.len() as f64 / run_secs,
                mean_ns: h.mean(),
                p50_ns: h.value_at_quantile(0.50),
                p99_ns: h.value_at_quantile(0.99),
                p999_ns: h.value_at_quantile(0.999),
                max_ns: h.max(),
                not_found: nf,
            },
        );
    }
    Ok(YcsbResult {
        bench: "ycsb".into(),
        workload: args.workload,
        records: args.records,
        ops: args.ops,
        threads,
        target: target.name(),
        engine: target.engine().into(),
        layout: target.layout().into(),
        seed: args.seed,
        load_secs,
        load_ops_per_sec: args.records as f64 / load_secs,
        run_secs,
        ops_per_sec: args.ops as f64 / run_secs,
        operations,
    })
}

fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{:.1}ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else {
        format!("{ns}ns")
    }
}

/// The human-readable report.
pub fn print_ycsb_table(r: &YcsbResult, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "ycsb workload {}  target {}  engine {}  records {}  ops {}  threads {}  ({})",
        r.workload.as_str(),
        r.target,
        r.engine,
        r.records,
        r.ops,
        r.threads,
        r.layout
    )?;
    writeln!(
        out,
        "load: {:.0} records/s ({:.2} s)   run: {:.0} ops/s ({:.2} s)",
        r.load_ops_per_sec, r.load_secs, r.ops_per_sec, r.run_secs
    )?;
    writeln!(
        out,
        "{:<18} {:>10} {:>12} {:>10} {:>10} {:>10}",
        "operation", "count", "ops/s", "p50", "p99", "p99.9"
    )?;
    for (name, s) in &r.operations {
        writeln!(
            out,
            "{:<18} {:>10} {:>12.0} {:>10} {:>10} {:>10}",
            name,
            s.count,
            s.ops_per_sec,
            fmt_ns(s.p50_ns),
            fmt_ns(s.p99_ns),
            fmt_ns(s.p999_ns)
        )?;
    }
    Ok(())
}

/// `nvstore bench ycsb`: runs, prints a table (or one JSON line with
/// `--json`), and writes the JSON into `--out DIR`.
pub fn ycsb_main(args: &YcsbArgs, out: &mut dyn Write) -> Result<YcsbResult> {
    let r = run_ycsb(args)?;
    let stdout_err = |e| Error::io("<stdout>", e);
    if args.json {
        crate::output::print_json_lines(std::slice::from_ref(&r), out).map_err(stdout_err)?;
    } else {
        print_ycsb_table(&r, out).map_err(stdout_err)?;
    }
    if let Some(dir) = &args.out {
        let kind = match (r.target.as_str(), r.engine.as_str()) {
            ("embedded", "hash") => "embedded-hash",
            ("embedded" | "redis", _) => r.target.as_str(),
            _ => "resp",
        };
        let name = format!(
            "ycsb-{}-{}-{}-{}-{}.jsonl",
            r.workload.as_str(),
            kind,
            r.records,
            r.ops,
            r.threads
        );
        crate::output::write_out(dir, &name, std::slice::from_ref(&r))?;
    }
    Ok(r)
}
