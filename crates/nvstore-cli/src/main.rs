//! `nvstore`: create, inspect, check and use nvstore pools from the shell.
//!
//! Exit status: 0 success; 1 a negative answer (key absent, `check` found
//! problems, `crashtest` found violations, `demo` verification failed);
//! 2 an error (bad arguments, a pool that cannot be opened, I/O). Errors
//! print exactly one line on stderr, `nvstore: <what went wrong>`, naming the
//! file involved.

#![deny(unsafe_code)]

mod demo;

/// mimalloc instead of the C library's allocator: see the README's
/// "Memory allocator" section.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use nvstore::units;
use nvstore_cli::escape;

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufReader, IsTerminal, Read, Write};
use std::ops::Bound;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use nvstore::pmem::FlushKind;
use nvstore::{Db, EngineKind, LeafKind, Options};

const EXIT_CODES: &str = "\
Exit status: 0 success; 1 a negative answer (key absent, check found problems,
crashtest found violations, demo verification failed); 2 an error (bad
arguments, a pool that cannot be opened, I/O), reported as one line on stderr.

Start with `nvstore demo`: it creates ./nvstore.nvs, writes, reads, scans,
deletes, checks, closes and reopens it, and reports what it measured.";

/// The nvstore command: create, inspect, check and use nvstore pools
/// (a crash-consistent key-value store for persistent memory).
#[derive(Parser, Debug)]
#[command(name = "nvstore", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a new, empty pool file (fails if the file exists).
    Create(CreateArgs),
    /// Show a pool's facts (format, size, mapping, keys, recovery); opens it read-only.
    Stat {
        /// Pool file.
        pool: PathBuf,
        /// Print one JSON object instead of a `name: value` listing.
        #[arg(long)]
        json: bool,
    },
    /// Store VALUE under KEY (both taken as the raw bytes of the argument); durable when it returns.
    Put {
        /// Pool file (must exist; see `create`).
        pool: PathBuf,
        /// Key bytes.
        #[arg(allow_hyphen_values = true)]
        key: OsString,
        /// Value bytes.
        #[arg(allow_hyphen_values = true)]
        value: OsString,
        /// Write even to a pool whose leaves fail validation.
        #[arg(long)]
        force: bool,
    },
    /// Print the value stored under KEY followed by a newline; exit 1, printing nothing, if absent.
    Get {
        /// Pool file (opened read-only).
        pool: PathBuf,
        /// Key bytes.
        #[arg(allow_hyphen_values = true)]
        key: OsString,
    },
    /// Delete KEY: exit 0 if it was deleted, exit 1 if it was absent (prints nothing either way).
    Del {
        /// Pool file (must exist).
        pool: PathBuf,
        /// Key bytes.
        #[arg(allow_hyphen_values = true)]
        key: OsString,
        /// Write even to a pool whose leaves fail validation.
        #[arg(long)]
        force: bool,
    },
    /// List pairs in key order as `key<TAB>value` lines (escaped as in `dump`); opens read-only.
    Scan(ScanArgs),
    /// Print every pair, one `key<TAB>value` line each, in key order (see `load` for the escaping).
    Dump {
        /// Pool file (opened read-only).
        pool: PathBuf,
    },
    /// Load `key<TAB>value` lines (the `dump` format) into a pool, creating it if missing.
    #[command(long_about = LOAD_HELP)]
    Load {
        /// Pool file (created with default options if missing).
        pool: PathBuf,
        /// Input file, or `-` for standard input.
        input: PathBuf,
        /// Write even to a pool whose leaves fail validation.
        #[arg(long)]
        force: bool,
    },
    /// Copy every readable record of a damaged pool into a new pool OUT; print what was skipped.
    #[command(long_about = SALVAGE_HELP)]
    Salvage {
        /// The damaged pool (opened read-only; nothing of it is written).
        damaged: PathBuf,
        /// The new pool to create (fails if the file exists).
        out: PathBuf,
    },
    /// Verify every invariant of a pool without writing; exit 1 if any is violated.
    Check {
        /// Pool file (opened read-only).
        pool: PathBuf,
        /// Print the report as one JSON object (it has "ok": true/false).
        #[arg(long)]
        json: bool,
    },
    /// Run a crash-consistency campaign on the crash simulator; exit 1 on any violation.
    Crashtest(CrashtestArgs),
    /// Try nvstore: insert, read back, scan, delete, check, close and reopen a pool, and report.
    Demo(demo::DemoArgs),
    /// Benchmarks: the papers' experiments against baseline trees (`micro`, `compare`, `ycsb`, `adaptive`, `plot`, `asym`, `kvindex`).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Serve a pool over the Redis protocol (RESP2/RESP3) until SIGINT, SIGTERM or SHUTDOWN.
    Serve(nvstore_server::ServeArgs),
    /// Run an AsymNVM back-end on a pool: front-ends reach it over TCP (README, "Disaggregated memory").
    Backend(nvstore_asym::cli::BackendArgs),
    /// Run an AsymNVM mirror: a replica of a back-end's pool, kept in sync by the back-end (AsymNVM §7).
    Mirror(nvstore_asym::cli::MirrorArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// One engine, one operation: ops/s, flushes and fences per op, latency percentiles.
    Micro(nvstore_bench::MicroArgs),
    /// Every engine in one process, repetitions interleaved, ratios to tree/nv.
    Compare(nvstore_bench::CompareArgs),
    /// YCSB core workloads A-F against the embedded engine or a Redis-protocol server.
    Ycsb(nvstore_bench::YcsbArgs),
    /// Workload-adaptive node sizing: throughput per interval for each strategy and off (NV-Tree Fig. 13-17).
    Adaptive(nvstore_bench::AdaptiveArgs),
    /// Draw the papers' figures (SVG and PNG) from the JSON results in a directory.
    Plot(nvstore_bench::PlotArgs),
    /// AsymNVM: a data structure on a back-end over loopback TCP, naive/r/rc/rcb (AsymNVM Table 3).
    Asym(nvstore_bench::AsymArgs),
    /// KVS B+Tree index §3: N inserts then N random gets of SHA-1 keys, values of 1..1024 sectors, sync against async, index overhead.
    Kvindex(nvstore_bench::KvIndexArgs),
    /// AsymNVM failover: etcd, a primary, a mirror and a writing front-end; the primary is killed; every acknowledged write must survive exactly once.
    Failover(nvstore_asym::failbench::FailoverArgs),
}

const LOAD_HELP: &str = "\
Load `key<TAB>value` lines (the `dump` format) into a pool, creating it if missing.

In keys and values a tab is written \\t, a newline \\n, a backslash \\\\, and
every byte outside printable ASCII (0x20..=0x7e) as \\xHH; so `dump` followed by
`load` reproduces any bytes. Raw bytes 0x80..=0xff are accepted as themselves;
raw control bytes (including the \\r of CRLF line endings) are errors.

Records are stored in order, one at a time, each durable before the next: a
load that is killed leaves exactly a prefix of the input in the pool. A
malformed line stops the load with an error naming the line; the records
before it stay loaded, nothing after it is. Prints the number of records
loaded.";

#[derive(Args, Debug)]
struct CreateArgs {
    /// Pool file to create.
    pool: PathBuf,
    /// Initial size (the pool grows on demand): bytes or with a KiB/MiB/GiB/TiB suffix.
    #[arg(long, default_value = "64MiB", value_parser = units::parse_size)]
    size: u64,
    /// Leaf node size in bytes (a multiple of 64).
    #[arg(long, default_value = "1024", value_parser = units::parse_size)]
    node_size: u64,
    /// Leaf format (tree pools).
    #[arg(long, default_value = "nv")]
    leaf: LeafKind,
    /// Engine: tree (the NV-Tree) or hash (a persistent hash table with an
    /// ordered index in DRAM: faster point operations, no snapshots or
    /// transactions).
    #[arg(long, default_value = "tree")]
    engine: EngineKind,
    /// Cache-line write-back instruction for this open (clwb, clflushopt, clflush, none);
    /// default: the best the CPU offers. Not stored in the pool.
    #[arg(long)]
    flush: Option<FlushKind>,
}

#[derive(Args, Debug)]
struct ScanArgs {
    /// Pool file (opened read-only).
    pool: PathBuf,
    /// Smallest key to list (inclusive).
    #[arg(long, allow_hyphen_values = true)]
    from: Option<OsString>,
    /// Largest key to list (inclusive).
    #[arg(long, allow_hyphen_values = true)]
    to: Option<OsString>,
    /// Only keys starting with these bytes (combines with --from/--to).
    #[arg(long, allow_hyphen_values = true)]
    prefix: Option<OsString>,
    /// List at most N pairs.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Descending key order.
    #[arg(long)]
    reverse: bool,
    /// Print only the number of pairs that would be listed.
    #[arg(long)]
    count: bool,
}

/// Default campaign length on the hash engine: about 20 000 distinct crash
/// states with the default seed.
const HASH_CRASHTEST_OPS: u64 = 3000;

#[derive(Args, Debug)]
struct CrashtestArgs {
    /// Engine to test: tree or hash.
    #[arg(long, default_value = "tree")]
    engine: EngineKind,
    /// Leaf format to test (tree pools): nv or isle.
    #[arg(long, default_value = "nv")]
    leaf: String,
    /// Leaf node size in bytes (default: 256 for nv, 640 for isle, whose
    /// line codes then span two header words).
    #[arg(long, value_parser = units::parse_size)]
    node_size: Option<u64>,
    /// Operations in the campaign (default: 2000; 3000 on the hash engine,
    /// whose operations each leave fewer distinct crash states).
    #[arg(long)]
    ops: Option<u64>,
    /// Random seed (a failure report names the seed that reproduces it).
    #[arg(long, default_value_t = nvstore::crashtest::Config::default().seed)]
    seed: u64,
    /// Worker threads.
    #[arg(long, default_value_t = nvstore::crashtest::Config::default().threads)]
    threads: usize,
    /// Drop this persistence point (checks that the checker catches it; see --list-points).
    #[arg(long, value_name = "POINT")]
    drop: Option<String>,
    /// Make one operation in four a write batch or transaction over several
    /// keys, which every crash image must show whole or not at all.
    #[arg(long)]
    txn: bool,
    /// Workload-adaptive node sizing on the main line (leaves of several sizes coexist).
    #[arg(long, default_value = "off")]
    adaptive: nvstore::Adaptive,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print the names of all persistence points, one per line, and exit.
    #[arg(long)]
    list_points: bool,
}

/// Why a command stopped: exit `code`, printing `msg` (if any) on stderr.
#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub msg: String,
}

impl Fail {
    /// An error: exit 2.
    pub fn error(msg: impl Into<String>) -> Fail {
        Fail {
            code: 2,
            msg: msg.into(),
        }
    }
    /// A negative answer: exit 1.
    pub fn negative(msg: impl Into<String>) -> Fail {
        Fail {
            code: 1,
            msg: msg.into(),
        }
    }
    /// Stop quietly with status 0 (the reader of our output went away).
    fn quiet() -> Fail {
        Fail {
            code: 0,
            msg: String::new(),
        }
    }
}

pub type CmdResult = Result<(), Fail>;

/// A library error as one line that names `path` (most errors already do).
pub fn lib_err(path: &Path) -> impl Fn(nvstore::Error) -> Fail + '_ {
    move |e| {
        let msg = e.to_string();
        let p = path.display().to_string();
        if msg.starts_with(&p) {
            Fail::error(msg)
        } else {
            Fail::error(format!("{p}: {msg}"))
        }
    }
}

/// An error writing our standard output.
pub fn out_err(e: io::Error) -> Fail {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Fail::quiet()
    } else {
        Fail::error(format!("standard output: {e}"))
    }
}

/// Options for opening an existing pool for writing.
pub fn rw_opts() -> Options {
    Options {
        create: false,
        ..Options::default()
    }
}

/// Options for opening an existing pool read-only.
pub fn ro_opts() -> Options {
    Options {
        create: false,
        read_only: true,
        ..Options::default()
    }
}

/// Parses the command line; argument errors become one `nvstore: ...` line
/// and exit 2 (help and version print as usual).
fn parse_args() -> Cli {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                let text = e.render().to_string();
                // The first paragraph, joined: "error: ... not provided:\n  <POOL>".
                let para: Vec<&str> = text
                    .lines()
                    .skip_while(|l| l.trim().is_empty())
                    .take_while(|l| !l.trim().is_empty())
                    .map(str::trim)
                    .collect();
                let msg = para.join(" ");
                let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
                eprintln!("nvstore: {msg} (see nvstore --help)");
                std::process::exit(2);
            }
        },
    }
}

fn main() {
    let cli = parse_args();
    let r = match cli.cmd {
        Cmd::Create(a) => create(a),
        Cmd::Stat { pool, json } => stat(&pool, json),
        Cmd::Put {
            pool,
            key,
            value,
            force,
        } => put(&pool, key.as_bytes(), value.as_bytes(), force),
        Cmd::Get { pool, key } => get(&pool, key.as_bytes()),
        Cmd::Del { pool, key, force } => del(&pool, key.as_bytes(), force),
        Cmd::Scan(a) => scan(a),
        Cmd::Dump { pool } => dump(&pool),
        Cmd::Load { pool, input, force } => load(&pool, &input, force),
        Cmd::Salvage { damaged, out } => salvage(&damaged, &out),
        Cmd::Check { pool, json } => check(&pool, json),
        Cmd::Crashtest(a) => crashtest(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(b) => bench(b),
        Cmd::Serve(a) => a.into_config().and_then(nvstore_server::serve).map_err(Fail::error),
        Cmd::Backend(a) => nvstore_asym::cli::run(&a).map_err(Fail::error),
        Cmd::Mirror(a) => nvstore_asym::cli::run_mirror(&a).map_err(Fail::error),
    };
    if let Err(f) = r {
        if !f.msg.is_empty() {
            let _ = io::stdout().flush();
            eprintln!("nvstore: {}", f.msg.replace('\n', " "));
        }
        std::process::exit(f.code);
    }
}

fn bench(b: BenchCmd) -> CmdResult {
    let mut out = io::stdout().lock();
    let r = match &b {
        BenchCmd::Micro(a) => nvstore_bench::micro_main(a, &mut out).map(|_| ()),
        BenchCmd::Compare(a) => nvstore_bench::compare_main(a, &mut out).map(|_| ()),
        BenchCmd::Ycsb(a) => nvstore_bench::ycsb_main(a, &mut out).map(|_| ()),
        BenchCmd::Adaptive(a) => nvstore_bench::adaptive_main(a, &mut out).map(|_| ()),
        BenchCmd::Plot(a) => nvstore_bench::plot_main(a, &mut out).map(|_| ()),
        BenchCmd::Kvindex(a) => nvstore_bench::kvindex_main(a, &mut out).map(|_| ()),
        BenchCmd::Asym(a) => return nvstore_bench::asym_main(a, &mut out).map(|_| ()).map_err(Fail::error),
        BenchCmd::Failover(a) => {
            let exe = std::env::current_exe().map_err(|e| Fail::error(e.to_string()))?;
            return nvstore_asym::failbench::main(a, &exe, &mut out)
                .map(|_| ())
                .map_err(Fail::error);
        }
    };
    r.map_err(|e| Fail::error(e.to_string()))
}

fn create(a: CreateArgs) -> CmdResult {
    let p = &a.pool;
    let node_size = u32::try_from(a.node_size)
        .map_err(|_| Fail::error(format!("{}: node size {} is too large", p.display(), a.node_size)))?;
    let defaults = Options::default();
    let opts = Options {
        create: true,
        size: a.size,
        max_size: defaults.max_size.max(a.size),
        node_size,
        leaf: a.leaf,
        engine: a.engine,
        flush: a.flush,
        ..defaults
    };
    let db = Db::create(p, opts).map_err(lib_err(p))?;
    let st = db.stat();
    db.close().map_err(lib_err(p))?;
    let layout = match a.engine {
        EngineKind::Tree => format!("leaf {}, node size {}", st.leaf_format, st.node_size),
        EngineKind::Hash => "engine hash".to_string(),
    };
    println!(
        "created {}: {} ({} bytes), {layout}, flush {}, mapping {}",
        p.display(),
        units::fmt_bytes(st.size_bytes),
        st.size_bytes,
        st.flush,
        st.mapping
    );
    Ok(())
}

/// The `stat` listing order; fields added to `Stat` later follow these.
const STAT_ORDER: &[&str] = &[
    "path",
    "format_version",
    "uuid",
    "size_bytes",
    "used_bytes",
    "mapping",
    "flush",
    "clean_shutdown",
    "engine",
    "leaf_format",
    "node_size",
    "keys",
    "leaves",
    "last_recovery",
    "splits",
    "replaces",
    "merges",
    "rebuilds",
    "rebuild_ms",
    "flushes",
    "fences",
];

fn show_json_value(name: &str, v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::String(s) => s.clone(),
        Value::Object(m) if name == "last_recovery" => {
            let kind = m.get("kind").and_then(Value::as_str).unwrap_or("?");
            match m.get("millis").and_then(Value::as_f64) {
                Some(ms) => format!("{kind} ({ms:.3} ms)"),
                None => kind.to_string(),
            }
        }
        other => other.to_string(),
    }
}

/// Aligned `name: value` lines for the fields of a JSON object, `order` first.
fn listing(obj: &serde_json::Map<String, serde_json::Value>, order: &[&str]) -> String {
    let mut names: Vec<&str> = order.iter().copied().filter(|n| obj.contains_key(*n)).collect();
    names.extend(obj.keys().map(String::as_str).filter(|k| !order.contains(k)));
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0) + 1;
    let mut s = String::new();
    for n in names {
        let label = format!("{n}:");
        s.push_str(&format!("{label:<width$} {}\n", show_json_value(n, &obj[n])));
    }
    s
}

fn stat(pool: &Path, json: bool) -> CmdResult {
    let db = Db::open(pool, ro_opts()).map_err(lib_err(pool))?;
    let st = db.stat();
    drop(db);
    let v = serde_json::to_value(&st).map_err(|e| Fail::error(format!("{}: {e}", pool.display())))?;
    let text = if json {
        format!("{v}\n")
    } else {
        listing(v.as_object().expect("Stat is a struct"), STAT_ORDER)
    };
    io::stdout().write_all(text.as_bytes()).map_err(out_err)
}

/// Before a write: a read-only validation of every leaf of an existing
/// pool (one pass over the leaves, no collation), so nothing is written to
/// a damaged pool unless the user forces it.
fn precheck(pool: &Path, force: bool) -> CmdResult {
    if force || !pool.exists() {
        return Ok(());
    }
    let db = Db::open(pool, ro_opts()).map_err(lib_err(pool))?;
    match db.validate() {
        Ok(()) => Ok(()),
        Err(e) => Err(Fail::error(format!(
            "{}; nothing was written (see `nvstore check`; `nvstore salvage` copies what is readable; --force writes anyway)",
            lib_err(pool)(e).msg
        ))),
    }
}

fn put(pool: &Path, key: &[u8], value: &[u8], force: bool) -> CmdResult {
    precheck(pool, force)?;
    let db = Db::open(pool, rw_opts()).map_err(lib_err(pool))?;
    db.put(key, value).map_err(lib_err(pool))?;
    db.close().map_err(lib_err(pool))
}

fn get(pool: &Path, key: &[u8]) -> CmdResult {
    let db = Db::open(pool, ro_opts()).map_err(lib_err(pool))?;
    match db.get(key).map_err(lib_err(pool))? {
        Some(mut v) => {
            v.push(b'\n');
            io::stdout().write_all(&v).map_err(out_err)
        }
        None => Err(Fail::negative("")),
    }
}

fn del(pool: &Path, key: &[u8], force: bool) -> CmdResult {
    precheck(pool, force)?;
    let db = Db::open(pool, rw_opts()).map_err(lib_err(pool))?;
    let existed = db.delete(key).map_err(lib_err(pool))?;
    db.close().map_err(lib_err(pool))?;
    if existed {
        Ok(())
    } else {
        Err(Fail::negative(""))
    }
}

type KeyBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// The tighter of two lower bounds.
fn max_lower(a: Bound<Vec<u8>>, b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    use Bound::*;
    match (a, b) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.max(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.max(y)),
        (Included(i), Excluded(e)) | (Excluded(e), Included(i)) => {
            if i > e {
                Included(i)
            } else {
                Excluded(e)
            }
        }
    }
}

/// The tighter of two upper bounds.
fn min_upper(a: Bound<Vec<u8>>, b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    use Bound::*;
    match (a, b) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.min(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.min(y)),
        (Included(i), Excluded(e)) | (Excluded(e), Included(i)) => {
            if i < e {
                Included(i)
            } else {
                Excluded(e)
            }
        }
    }
}

/// Key bounds of `scan`: `[from, to]` intersected with the prefix's range.
fn scan_bounds(from: Option<&[u8]>, to: Option<&[u8]>, prefix: Option<&[u8]>) -> KeyBounds {
    let mut lo = from.map_or(Bound::Unbounded, |k| Bound::Included(k.to_vec()));
    let mut hi = to.map_or(Bound::Unbounded, |k| Bound::Included(k.to_vec()));
    if let Some(p) = prefix {
        let (plo, phi) = nvstore::db::prefix_bounds(p);
        lo = max_lower(lo, plo);
        hi = min_upper(hi, phi);
    }
    (lo, hi)
}

fn scan(a: ScanArgs) -> CmdResult {
    let pool = &a.pool;
    let db = Db::open(pool, ro_opts()).map_err(lib_err(pool))?;
    let from = a.from.as_ref().map(|s| s.as_bytes());
    let to = a.to.as_ref().map(|s| s.as_bytes());
    let prefix = a.prefix.as_ref().map(|s| s.as_bytes());
    let bounds = scan_bounds(from, to, prefix);
    let iter = if a.reverse {
        db.range_rev(bounds)
    } else {
        db.range(bounds)
    };
    let limit = a.limit.unwrap_or(u64::MAX);
    let pairs = iter
        .checked()
        .filter(|r| {
            r.as_ref()
                .map_or(true, |(k, _)| prefix.is_none_or(|p| k.starts_with(p)))
        })
        .take(usize::try_from(limit).unwrap_or(usize::MAX));
    if a.count {
        let mut n = 0u64;
        for r in pairs {
            r.map_err(|e| damaged(pool, e, n))?;
            n += 1;
        }
        return writeln!(io::stdout(), "{n}").map_err(out_err);
    }
    write_records(pool, pairs)
}

/// Damage met while listing, after `listed` pairs.
fn damaged(pool: &Path, e: nvstore::Error, listed: u64) -> Fail {
    Fail::error(format!(
        "{} ({listed} pairs listed before it; `nvstore salvage` copies every readable record)",
        lib_err(pool)(e).msg
    ))
}

/// Writes pairs as escaped `key<TAB>value` lines on standard output; the
/// first error (damage) ends the listing with a message.
fn write_records(pool: &Path, pairs: impl Iterator<Item = nvstore::Result<(Vec<u8>, Vec<u8>)>>) -> CmdResult {
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut line = Vec::new();
    for (listed, r) in pairs.enumerate() {
        let (k, v) = match r {
            Ok(kv) => kv,
            Err(e) => {
                out.flush().map_err(out_err)?;
                return Err(damaged(pool, e, listed as u64));
            }
        };
        line.clear();
        escape::format_record(&mut line, &k, &v);
        out.write_all(&line).map_err(out_err)?;
    }
    out.flush().map_err(out_err)
}

fn dump(pool: &Path) -> CmdResult {
    let db = Db::open(pool, ro_opts()).map_err(lib_err(pool))?;
    write_records(pool, db.iter().checked())
}

const SALVAGE_HELP: &str = "\
Copy every readable record of a damaged pool into a new pool OUT, and print
what was skipped.

The damaged pool is opened read-only. Its leaves are found along the leaf
chain; where the chain is broken, the leaves it no longer reaches are found
by scanning the chunk headers (such a leaf may be one a split freed, so its
records can be older than what was lost; they fill in only keys the chain
did not hold, and the summary counts them). Each element is checked on its
own: a damaged element or blob is skipped and counted, the rest of its leaf
is copied. Per key the newest version wins; deleted keys stay deleted.

OUT gets the damaged pool's leaf format and node size. Exit 0 when records
were copied (even with some skipped), 2 when nothing was readable.";

fn salvage(damaged: &Path, out: &Path) -> CmdResult {
    if out.exists() {
        return Err(Fail::error(format!("{}: a file already exists there", out.display())));
    }
    let nvstore::salvage::Salvaged {
        leaf,
        node_size,
        records,
        report: rep,
    } = nvstore::salvage::read(damaged).map_err(lib_err(damaged))?;
    if records.is_empty() && (rep.skipped_elements > 0 || rep.skipped_leaves > 0 || !rep.chain_whole) {
        return Err(Fail::error(format!(
            "{}: nothing readable: {}",
            damaged.display(),
            rep.notes.first().map_or("no sound leaf", String::as_str)
        )));
    }
    let opts = Options {
        create: true,
        leaf,
        node_size,
        ..Options::default()
    };
    let db = Db::create(out, opts).map_err(lib_err(out))?;
    for (k, v) in &records {
        db.put(k, v).map_err(lib_err(out))?;
    }
    db.close().map_err(lib_err(out))?;
    let mut text = format!(
        "salvaged {} records from {} into {}: {} leaves on the chain{}, {} found by chunk scan ({} records from them); skipped {} damaged elements, {} leaves\n",
        rep.records,
        damaged.display(),
        out.display(),
        rep.chain_leaves,
        if rep.chain_whole { "" } else { " (broken)" },
        rep.scanned_leaves,
        rep.records_off_chain,
        rep.skipped_elements,
        rep.skipped_leaves,
    );
    for n in &rep.notes {
        text.push_str(&format!("skipped: {n}\n"));
    }
    io::stdout().write_all(text.as_bytes()).map_err(out_err)
}

/// Inputs at least this large get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 1 << 20;

fn progress_bar(total: Option<u64>) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let show = io::stderr().is_terminal() && total.is_none_or(|t| t >= PROGRESS_MIN_BYTES);
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let style = match total {
        Some(_) => ProgressStyle::with_template(
            "{spinner} loading [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta}) {msg}",
        ),
        None => ProgressStyle::with_template("{spinner} loading {bytes} ({bytes_per_sec}) {msg}"),
    };
    if let Ok(s) = style {
        pb.set_style(s.progress_chars("=> "));
    }
    pb
}

fn load(pool: &Path, input: &Path, force: bool) -> CmdResult {
    let stdin = input.as_os_str() == "-";
    let name = if stdin {
        "<stdin>".to_string()
    } else {
        input.display().to_string()
    };
    // Open the input first: a missing input must not create a pool.
    let (reader, total): (Box<dyn Read>, Option<u64>) = if stdin {
        (Box::new(io::stdin().lock()), None)
    } else {
        let f = File::open(input).map_err(|e| Fail::error(format!("{name}: {}", io_msg(&e))))?;
        let len = f.metadata().ok().map(|m| m.len());
        (Box::new(f), len)
    };
    let reader = BufReader::with_capacity(1 << 16, reader);
    precheck(pool, force)?;
    let db = Db::open(pool, Options::default()).map_err(lib_err(pool))?;
    let pb = progress_bar(total);
    let mut records = escape::Records::new(reader);
    let mut loaded = 0u64;
    let result = loop {
        let rec = match records.next_record() {
            Ok(Some(r)) => r,
            Ok(None) => break Ok(()),
            Err(escape::ReadError::Io(e)) => break Err(format!("{name}: {}", io_msg(&e))),
            Err(escape::ReadError::Parse(e)) => break Err(format!("{name}:{}: {e}", records.line())),
        };
        pb.inc(rec.len as u64);
        if let Err(e) = db.put(&rec.key, &rec.value) {
            break Err(format!("{name}:{}: {}", records.line(), lib_err(pool)(e).msg));
        }
        loaded += 1;
        if loaded.is_multiple_of(4096) {
            pb.set_message(format!("{loaded} records"));
        }
    };
    pb.finish_and_clear();
    let closed = db.close().map_err(lib_err(pool));
    if let Err(msg) = result {
        return Err(Fail::error(format!(
            "{msg} ({loaded} records before it were loaded into {})",
            pool.display()
        )));
    }
    closed?;
    writeln!(io::stdout(), "loaded {loaded} records into {}", pool.display()).map_err(out_err)
}

/// An I/O error's message without the "(os error N)" noise.
fn io_msg(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

const CHECK_ORDER: &[&str] = &[
    "ok",
    "leaves",
    "elements",
    "keys",
    "blobs",
    "reachable_blocks",
    "used_bytes",
];

fn check(pool: &Path, json: bool) -> CmdResult {
    let db = Db::open(pool, ro_opts()).map_err(lib_err(pool))?;
    let r = db.check();
    drop(db);
    let v = serde_json::to_value(&r).map_err(|e| Fail::error(format!("{}: {e}", pool.display())))?;
    let text = if json {
        format!("{v}\n")
    } else {
        let mut obj = v.as_object().expect("CheckReport is a struct").clone();
        obj.remove("problems");
        obj.insert("problems".into(), r.problems.len().into());
        let mut s = listing(&obj, CHECK_ORDER);
        for p in &r.problems {
            s.push_str(&format!("problem: {p}\n"));
        }
        s.push_str(if r.ok { "ok\n" } else { "FAILED\n" });
        s
    };
    io::stdout().write_all(text.as_bytes()).map_err(out_err)?;
    if r.ok {
        Ok(())
    } else {
        let first = r.problems.first().map(String::as_str).unwrap_or("unknown problem");
        let more = match r.problems.len() {
            0 | 1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        Err(Fail::negative(format!(
            "{}: check failed: {first}{more}",
            pool.display()
        )))
    }
}

fn crashtest(a: CrashtestArgs) -> CmdResult {
    use nvstore::crashtest;
    let points = crashtest::list_points();
    if a.list_points {
        let mut s = String::new();
        for p in &points {
            s.push_str(p);
            s.push('\n');
        }
        return io::stdout().write_all(s.as_bytes()).map_err(out_err);
    }
    let leaf: nvstore::LeafKind = a.leaf.parse().map_err(Fail::error)?;
    if a.txn && a.engine == EngineKind::Hash {
        return Err(Fail::error(
            "--txn needs a tree pool: a hash pool has no multi-key commit, so it takes no transactions",
        ));
    }
    if a.txn && leaf != nvstore::LeafKind::Nv {
        return Err(Fail::error(format!(
            "--txn needs --leaf nv: {} leaves keep no versions, so they take no transactions",
            a.leaf
        )));
    }
    if let Some(d) = &a.drop {
        if !points.contains(&d.as_str()) {
            return Err(Fail::error(format!(
                "unknown persistence point '{d}' (nvstore crashtest --list-points lists them)"
            )));
        }
    }
    if a.threads == 0 {
        return Err(Fail::error("--threads must be at least 1"));
    }
    let cfg = crashtest::Config {
        ops: a.ops.unwrap_or(match a.engine {
            EngineKind::Hash => HASH_CRASHTEST_OPS,
            EngineKind::Tree => crashtest::Config::default().ops,
        }),
        seed: a.seed,
        threads: a.threads,
        drop: a.drop.clone(),
        txn: a.txn,
        adaptive: a.adaptive,
        node_size: match a.node_size {
            Some(n) => u32::try_from(n).map_err(|_| Fail::error(format!("node size {n} is too large")))?,
            None => crashtest::Config::default_node_size(leaf),
        },
        ..match a.engine {
            EngineKind::Tree => crashtest::Config::for_leaf(leaf),
            EngineKind::Hash => crashtest::Config::for_hash(),
        }
    };
    let r = crashtest::run(&cfg);
    let text = if a.json {
        let v = serde_json::to_value(&r).map_err(|e| Fail::error(format!("crashtest report: {e}")))?;
        format!("{v}\n")
    } else {
        format!(
            "crashtest: engine {}, leaf {}, {} ops, seed {}, {} thread(s), drop {}{}\n\
             crash states checked: {}\n\
             points covered:       {} of {}\n\
             violations:           {}\n\
             time:                 {:.2} s\n\
             {}\n",
            r.engine,
            r.leaf,
            r.ops,
            r.seed,
            r.threads,
            r.drop.as_deref().unwrap_or("none"),
            if a.txn { ", with transactions" } else { "" },
            r.crash_states,
            r.points_covered.len(),
            points.len(),
            r.violations,
            r.seconds,
            if r.violations == 0 { "ok" } else { "FAILED" }
        )
    };
    io::stdout().write_all(text.as_bytes()).map_err(out_err)?;
    if r.violations == 0 {
        return Ok(());
    }
    let _ = io::stdout().flush();
    let mut err = io::stderr().lock();
    for d in &r.violation_details {
        let _ = writeln!(err, "violation: {d}");
    }
    drop(err);
    Err(Fail::negative(format!(
        "crashtest found {} violation(s) (seed {}{})",
        r.violations,
        r.seed,
        r.drop
            .as_deref()
            .map(|d| format!(", dropped point {d}"))
            .unwrap_or_default()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[u8]) -> Vec<u8> {
        v.to_vec()
    }

    #[test]
    fn scan_bounds_intersect() {
        use Bound::*;
        assert_eq!(scan_bounds(None, None, None), (Unbounded, Unbounded));
        assert_eq!(
            scan_bounds(Some(b"a"), Some(b"c"), None),
            (Included(b(b"a")), Included(b(b"c")))
        );
        assert_eq!(
            scan_bounds(None, None, Some(b"ab")),
            (Included(b(b"ab")), Excluded(b(b"ac")))
        );
        assert_eq!(
            scan_bounds(Some(b"aa"), Some(b"zz"), Some(b"ab")),
            (Included(b(b"ab")), Excluded(b(b"ac")))
        );
        assert_eq!(
            scan_bounds(Some(b"abc"), Some(b"abd"), Some(b"ab")),
            (Included(b(b"abc")), Included(b(b"abd")))
        );
        assert_eq!(
            scan_bounds(None, Some(b"ac"), Some(b"ab")),
            (Included(b(b"ab")), Excluded(b(b"ac")))
        );
        assert_eq!(
            scan_bounds(None, None, Some(&[0xff])),
            (Included(b(&[0xff])), Unbounded)
        );
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
