//! `nvstore bench kvindex`: the experiment of KVS B+Tree index §3. N
//! inserts, then N gets of random inserted keys; keys are the 40-character
//! SHA-1 hex digests of the integers 1..=N (as decimal text); a value is
//! its key padded with zeros to a whole number of 512-byte sectors. Run for
//! each value size (`--sectors`), through the blocking `Db` (`sync`) and
//! through [`AsyncDb`] (`async`), each with and without the ordered index.
//!
//! - `sync`: one thread calls `Db::put` N times, then `Db::get` N times.
//! - `async`: as the paper's client does (§3: it issues its 10 000
//!   asynchronous calls, then waits for each future in turn), one thread
//!   queues every put, then awaits their futures in order; then the same
//!   for the N gets. The workers drain the queue in batches meanwhile.
//!   Only from 8 sectors up is the client bounded: it keeps at most
//!   [`IN_FLIGHT_BYTES`] of values in flight (at 8 sectors 2 048
//!   requests, at 64 sectors 256, at 1 024 sectors 16), so the values in
//!   flight fit in the last-level cache and the allocator hands their
//!   memory out again while it is warm. With all 10 000 in flight (320
//!   MiB at 64 sectors), async fell behind sync at 64 and 1 024 sectors
//!   (BENCHMARKS.md). Bounded (or with `--window W`, at most W requests),
//!   the client issues in bursts of half the window: it queues one burst,
//!   then collects the burst before it, then queues the next. (Refilling
//!   a window one request per completion woke the client once per
//!   request: a context switch per operation, more than the operation.)
//!   Every put is durable when its future completes, as every sync put is
//!   when it returns: both modes write the same keys and values. Each put
//!   is an `AsyncDb::put_owned` of a value the client builds (a fresh
//!   buffer per request, as an asynchronous caller must keep its value
//!   until the put is done; the sync loop reuses one). A worker makes the
//!   puts it takes off the queue together durable as one group
//!   (`Db::put_many`: on a hash pool one fence for all their slots and one
//!   for all their headers), which the sync loop, one put per call,
//!   cannot.
//!
//! Each run's pool is created with every page mapped
//! ([`Options::populate`]), before the clock starts, in both modes: the
//! first-touch page faults of a fresh tmpfs file are the kernel's cost,
//! not the store's, and with two workers faulting at once they made the
//! async runs the noisier. For the same reason the async client's request
//! buffers are warmed before the clock ([`warm_request_buffers`]).
//!
//! `ops_per_sec` is 2N over the time of both phases, with the index: the
//! median of the `--repeat` runs. `index_overhead_pct` is how much longer
//! a run takes with the ordered index than without it: `(ops/s without /
//! ops/s with - 1) * 100`, negative when the run with the index was
//! faster. Each repeat is a pair of runs back to back, with and without
//! the index, in alternating order (with first, then without first, ...),
//! so drift in the machine's load falls on both alike; the number reported
//! is the median of the pairs' overheads, and the table (stderr with
//! `--json`) shows their spread. What "without the index" means depends on
//! the engine ([`engine_options`]): the tree engine's order is its
//! structure, so there it is the same store again, and the number is the
//! run-to-run noise the other engines' overheads are to be read against.
//!
//! Record count: N values of 1024 sectors are 5 GiB at the paper's N of
//! 10 000, too much for /dev/shm and a short run. N is therefore capped
//! per value size so the values written in one run stay within
//! `--max-mib`; the output says which sizes were capped and to how many
//! records (on stderr with `--json`, so the JSON lines stay exactly the
//! five fields).
//!
//! Every get's value is checked (length, and the key it starts with): a
//! run that read wrong data fails instead of reporting a rate.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::executor::block_on;
use futures::Future;
use nvstore::asyncdb::default_workers;
use nvstore::{AsyncDb, Db, Error, Options, Result};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha1::{Digest, Sha1};

use crate::args::parse_count;
use crate::output::{fmt_ops, print_and_save};

/// Bytes in a sector, the paper's value unit.
pub const SECTOR: usize = 512;
/// Length of a key: a SHA-1 digest in hex.
pub const KEY_LEN: usize = 40;

/// Engines `bench kvindex` runs on (see [`engine_options`]).
pub const KV_ENGINES: &[&str] = &["hash", "tree"];

/// Pairs of runs of each configuration by default.
pub const REPEAT: u32 = 5;

/// Requests the async client keeps in flight by default: 0, all of them
/// (the paper's client), up to [`IN_FLIGHT_BYTES`] of values.
pub const WINDOW: usize = 0;

/// Most bytes of values the async client keeps in flight with `--window
/// 0` (see the module docs).
pub const IN_FLIGHT_BYTES: usize = 8 << 20;

/// The window a run of `n` requests of `value_len`-byte values uses for
/// `--window window`: `window` if set, else all `n` (0) up to
/// [`IN_FLIGHT_BYTES`] of values.
pub fn window_for(window: usize, n: usize, value_len: usize) -> usize {
    let cap = (IN_FLIGHT_BYTES / value_len.max(1)).max(2);
    match window {
        0 if cap >= n => 0,
        0 => cap,
        w => w,
    }
}

/// `nvstore bench kvindex` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct KvIndexArgs {
    /// Engine: hash or tree (a comma list of engines is accepted). Without
    /// the ordered index, the hash engine keeps none (point operations
    /// only); the tree engine is the same store again (its order is its
    /// structure), so its index_overhead_pct is run-to-run noise.
    #[arg(long, default_value = "hash")]
    pub engine: String,
    /// Value sizes in 512-byte sectors, a comma list (the paper: 1 to 1024).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,1024")]
    pub sectors: Vec<u32>,
    /// Modes, a comma list: sync (blocking Db calls) and async (AsyncDb futures).
    #[arg(long, value_delimiter = ',', default_value = "sync,async")]
    pub mode: Vec<Mode>,
    /// Records N: N inserts, then N gets (k suffix allowed); capped per
    /// value size by --max-mib.
    #[arg(long, value_parser = parse_count, default_value = "10k")]
    pub keys: u64,
    /// Most MiB of values one run writes: N is capped to this over the value size.
    #[arg(long, default_value_t = 512)]
    pub max_mib: u64,
    /// AsyncDb worker threads (default: one per core, at least two).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Requests the async client keeps in flight; 0 queues every request
    /// of a phase, then awaits them (the paper's client), up to 8 MiB of
    /// values in flight.
    #[arg(long, default_value_t = WINDOW)]
    pub window: usize,
    /// Pairs of runs (with and without the index) of each configuration;
    /// the medians count.
    #[arg(long, default_value_t = REPEAT)]
    pub repeat: u32,
    /// Emulated write latency per flushed cache line, in nanoseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Seed of the get order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the results as JSON lines into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Directory of the pool files (tmpfs keeps them in DRAM).
    #[arg(long, default_value = "/dev/shm")]
    pub pool_dir: PathBuf,
}

impl Default for KvIndexArgs {
    fn default() -> Self {
        KvIndexArgs {
            engine: "hash".into(),
            sectors: vec![1, 8, 64, 1024],
            mode: vec![Mode::Sync, Mode::Async],
            keys: 10_000,
            max_mib: 512,
            workers: None,
            window: WINDOW,
            repeat: REPEAT,
            latency_ns: 0,
            seed: 1,
            json: false,
            out: None,
            pool_dir: "/dev/shm".into(),
        }
    }
}

/// How the operations are called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Blocking `Db` calls from one thread.
    Sync,
    /// `AsyncDb` futures, a window of them in flight.
    Async,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }
}

/// One row: an engine, a mode and a value size.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KvIndexResult {
    pub engine: String,
    pub mode: Mode,
    pub value_sectors: u32,
    /// Inserts and gets per second, with the ordered index.
    pub ops_per_sec: f64,
    /// Extra time the ordered index costs, in percent of the time without it.
    pub index_overhead_pct: f64,
}

/// The options that create a pool of `engine` with or without its ordered
/// index. A new engine is one more arm here (and its name in
/// [`KV_ENGINES`]).
pub fn engine_options(engine: &str, ordered_index: bool, base: Options) -> Result<Options> {
    match engine {
        "hash" => Ok(Options {
            engine: nvstore::EngineKind::Hash,
            ordered_index,
            ..base
        }),
        // The tree keeps its keys in order by construction: there is no
        // index to leave out, so both runs are of the same store.
        "tree" => {
            let _ = ordered_index;
            Ok(base)
        }
        _ => Err(Error::InvalidOption(format!(
            "bench kvindex: unknown engine '{engine}' (expected {})",
            KV_ENGINES.join(", ")
        ))),
    }
}

/// The key of record `i` (1-based, as the paper's integers).
pub fn record_key(i: u64) -> [u8; KEY_LEN] {
    let digest = Sha1::digest(i.to_string().as_bytes());
    let mut key = [0u8; KEY_LEN];
    for (pair, b) in key.chunks_exact_mut(2).zip(digest.iter()) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        pair[0] = HEX[(b >> 4) as usize];
        pair[1] = HEX[(b & 15) as usize];
    }
    key
}

/// Records a run at `sectors` writes: `keys`, capped so the values stay
/// within `max_mib` MiB (at least one).
pub fn records_for(keys: u64, sectors: u32, max_mib: u64) -> u64 {
    let value = sectors as u64 * SECTOR as u64;
    keys.min((max_mib << 20) / value.max(1)).max(1)
}

thread_local! {
    /// Each thread's value buffer: a put builds its value here in place.
    static VALUE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with the value of `key` at `len` bytes (the key, then zeros),
/// built in this thread's buffer.
fn with_value<T>(key: &[u8; KEY_LEN], len: usize, f: impl FnOnce(&[u8]) -> T) -> T {
    VALUE.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() != len {
            *b = vec![0; len];
        }
        b[..KEY_LEN].copy_from_slice(key);
        f(&b)
    })
}

fn check_value(key: &[u8; KEY_LEN], len: usize, got: Option<Vec<u8>>) -> Result<()> {
    match got {
        Some(v) if v.len() == len && v[..KEY_LEN] == key[..] => Ok(()),
        other => Err(Error::InvalidOption(format!(
            "bench kvindex: get of {} read {}, not its {len}-byte value",
            String::from_utf8_lossy(key),
            match other {
                None => "nothing".to_string(),
                Some(v) => format!("{} bytes", v.len()),
            }
        ))),
    }
}

/// Runs `n` requests, keeping up to `window` of them in flight (all `n`
/// when `window` is 0), in bursts of half the window: `issue(i)` starts
/// request `i`, `done(i, result)` takes its result. The client issues one
/// burst, then collects the burst before it (in order; those requests ran meanwhile), then
/// issues the next. So it waits at most once per burst, and only when the
/// older burst is not done by the time the newer one is queued; it is
/// never woken once per completion, and the workers find a burst's worth
/// of requests queued, which they take in batches.
fn in_flight<T, F: Future<Output = Result<T>>>(
    n: usize,
    window: usize,
    mut issue: impl FnMut(usize) -> F,
    mut done: impl FnMut(usize, T) -> Result<()>,
) -> Result<()> {
    let burst = if window == 0 { n.max(1) } else { (window / 2).max(1) };
    block_on(async {
        let mut older: Vec<(usize, F)> = Vec::with_capacity(burst);
        let mut next = 0;
        while next < n || !older.is_empty() {
            let end = (next + burst).min(n);
            let newer: Vec<(usize, F)> = (next..end).map(|i| (i, issue(i))).collect();
            next = end;
            for (i, f) in older.drain(..) {
                done(i, f.await?)?;
            }
            older = newer;
        }
        Ok(())
    })
}

/// Allocates, touches and frees as many key and value buffers as the
/// async client will keep in flight (`count`, each `value_len` bytes),
/// before the clock starts. The allocator then hands the client memory it
/// has already mapped, as the pool's pages are mapped before the clock
/// ([`Options::populate`]). Without it, the first touch of fresh heap memory
/// (a transparent huge page at a time, several milliseconds each on a VM
/// whose host backs the page lazily) fell inside the client's issue loop
/// in some runs and not others: that loop took 2 ms in most runs and 8 to
/// 27 ms in the rest (BENCHMARKS.md). The sync loop reuses one buffer and
/// needs no warming.
fn warm_request_buffers(count: usize, value_len: usize) {
    crate::micro::warm_blocks(count, &[KEY_LEN, value_len]);
}

/// One measured run on a fresh pool; returns operations per second.
#[allow(clippy::too_many_arguments, reason = "one run's parameters, all distinct")]
fn run_once(
    opts: Options,
    pool_dir: &Path,
    mode: Mode,
    n: u64,
    value_len: usize,
    workers: usize,
    window: usize,
    seed: u64,
) -> Result<f64> {
    let path = pool_dir.join(format!(
        "nvstore-bench-kvindex-{}-{}.pool",
        std::process::id(),
        rand::random::<u32>()
    ));
    let db = Db::create(&path, opts);
    // The mapping keeps the pages; nothing is left behind if we crash.
    let _ = std::fs::remove_file(&path);
    let db = db?;
    let keys: Vec<[u8; KEY_LEN]> = (1..=n).map(record_key).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let order: Vec<usize> = (0..n).map(|_| rng.gen_range(0..n as usize)).collect();
    match mode {
        Mode::Sync => {
            let t0 = Instant::now();
            for k in &keys {
                with_value(k, value_len, |v| db.put(k, v))?;
            }
            for &i in &order {
                check_value(&keys[i], value_len, db.get(&keys[i])?)?;
            }
            let secs = t0.elapsed().as_secs_f64();
            db.close()?;
            Ok(2.0 * n as f64 / secs)
        }
        Mode::Async => {
            let adb = AsyncDb::with_workers(db, workers);
            let window = window_for(window, keys.len(), value_len);
            warm_request_buffers(if window == 0 { keys.len() } else { window }, value_len);
            let t0 = Instant::now();
            // Each put hands its key and value to the request (no copy);
            // the value is built here, as the sync loop builds it.
            in_flight(
                keys.len(),
                window,
                |i| {
                    let k = &keys[i];
                    let mut v = vec![0u8; value_len];
                    v[..KEY_LEN].copy_from_slice(k);
                    adb.put_owned(k.to_vec(), v)
                },
                |_, ()| Ok(()),
            )?;
            in_flight(
                order.len(),
                window,
                |i| adb.get(&keys[order[i]]),
                |i, v| check_value(&keys[order[i]], value_len, v),
            )?;
            let secs = t0.elapsed().as_secs_f64();
            adb.close()?;
            Ok(2.0 * n as f64 / secs)
        }
    }
}

/// Runs every configuration and returns the rows, plus a note for each
/// value size whose record count was capped.
pub fn run_kvindex(a: &KvIndexArgs) -> Result<(Vec<KvIndexResult>, Vec<String>)> {
    let engines: Vec<&str> = a.engine.split(',').map(str::trim).collect();
    for e in &engines {
        engine_options(e, true, Options::default())?;
    }
    if a.sectors.is_empty() || a.sectors.contains(&0) {
        return Err(Error::InvalidOption(
            "--sectors needs sizes of at least one sector".into(),
        ));
    }
    let workers = a.workers.unwrap_or_else(default_workers).max(1);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for &sectors in &a.sectors {
        let n = records_for(a.keys.max(1), sectors, a.max_mib);
        let value_len = sectors as usize * SECTOR;
        if n < a.keys {
            notes.push(format!(
                "{sectors} sectors: N = {n} of the {} records asked (values capped at {} MiB per run, --max-mib)",
                a.keys, a.max_mib
            ));
        }
        let base = Options {
            create: true,
            populate: true,
            // Room for every value and its allocation rounding, so the
            // pool never grows during a measured run.
            size: (n * (value_len as u64 + 256) * 5 / 4 + (64 << 20)).next_multiple_of(2 << 20),
            latency_ns: a.latency_ns,
            ..Options::default()
        };
        for e in &engines {
            for &mode in &a.mode {
                let (mut with, mut overheads) = (Vec::new(), Vec::new());
                // Each repeat is a pair of runs back to back, with and
                // without the index, the order alternating between pairs.
                for r in 0..a.repeat.max(1) {
                    let seed = a.seed.wrapping_add(r as u64);
                    let mut pair = [0f64; 2];
                    let order = if r % 2 == 0 { [true, false] } else { [false, true] };
                    for indexed in order {
                        let o = engine_options(e, indexed, base.clone())?;
                        pair[indexed as usize] = run_once(o, &a.pool_dir, mode, n, value_len, workers, a.window, seed)?;
                    }
                    let [without, w] = pair;
                    with.push(w);
                    overheads.push((without / w - 1.0) * 100.0);
                }
                let lo = overheads.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = overheads.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if a.repeat > 1 {
                    notes.push(format!(
                        "{e} {} {sectors} sectors: index overhead of {} pairs from {lo:.1}% to {hi:.1}%, ops/s with the index from {} to {}",
                        mode.as_str(),
                        overheads.len(),
                        fmt_ops(with.iter().copied().fold(f64::INFINITY, f64::min)),
                        fmt_ops(with.iter().copied().fold(0.0, f64::max)),
                    ));
                }
                rows.push(KvIndexResult {
                    engine: e.to_string(),
                    mode,
                    value_sectors: sectors,
                    ops_per_sec: median(&mut with),
                    index_overhead_pct: median(&mut overheads),
                });
            }
        }
    }
    Ok((rows, notes))
}

/// The median of `xs` (the mean of the middle two for an even count).
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn table(rs: &[KvIndexResult], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<8} {:<6} {:>8} {:>10} {:>15}",
        "engine", "mode", "sectors", "ops/s", "index overhead"
    )?;
    for r in rs {
        writeln!(
            out,
            "{:<8} {:<6} {:>8} {:>10} {:>14.1}%",
            r.engine,
            r.mode.as_str(),
            r.value_sectors,
            fmt_ops(r.ops_per_sec),
            r.index_overhead_pct
        )?;
    }
    Ok(())
}

/// `nvstore bench kvindex`: runs and prints.
pub fn kvindex_main(a: &KvIndexArgs, out: &mut dyn Write) -> Result<Vec<KvIndexResult>> {
    let (rows, notes) = run_kvindex(a)?;
    for n in &notes {
        if a.json {
            eprintln!("note: {n}");
        } else {
            writeln!(out, "note: {n}").map_err(|e| Error::io("<stdout>", e))?;
        }
    }
    print_and_save(&rows, a.json, table, out, a.out.as_deref(), || "kvindex.jsonl".into())?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sha1_hex_of_the_integers() {
        // SHA-1("1"), as `printf 1 | sha1sum` prints it.
        assert_eq!(&record_key(1), b"356a192b7913b04c54574d18c28d46e6395428ab");
        let keys: std::collections::HashSet<_> = (1..=10_000).map(record_key).collect();
        assert_eq!(keys.len(), 10_000);
    }

    #[test]
    fn the_default_window_is_every_request_up_to_the_bytes_in_flight() {
        assert_eq!(window_for(0, 10_000, SECTOR), 0);
        assert_eq!(window_for(0, 10_000, 8 * SECTOR), 2048);
        assert_eq!(window_for(0, 1_000, 8 * SECTOR), 0);
        assert_eq!(window_for(0, 10_000, 64 * SECTOR), 256);
        assert_eq!(window_for(0, 1024, 1024 * SECTOR), 16);
        assert_eq!(window_for(0, 10, 1 << 30), 2);
        assert_eq!(window_for(64, 10_000, SECTOR), 64);
    }

    #[test]
    fn record_count_is_capped_by_the_value_budget() {
        assert_eq!(records_for(10_000, 1, 512), 10_000);
        assert_eq!(records_for(10_000, 1024, 512), 1024);
        assert_eq!(records_for(10_000, 1024, 0), 1);
    }

    #[test]
    fn small_run_reports_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let a = KvIndexArgs {
            sectors: vec![1, 3],
            keys: 300,
            max_mib: 1,
            workers: Some(2),
            repeat: 1,
            pool_dir: dir.path().into(),
            ..KvIndexArgs::default()
        };
        let (rows, notes) = run_kvindex(&a).unwrap();
        let got: Vec<_> = rows.iter().map(|r| (r.mode, r.value_sectors)).collect();
        assert_eq!(
            got,
            vec![(Mode::Sync, 1), (Mode::Async, 1), (Mode::Sync, 3), (Mode::Async, 3)]
        );
        assert!(rows
            .iter()
            .all(|r| r.ops_per_sec > 0.0 && r.index_overhead_pct.is_finite()));
        // 3 sectors x 300 records is over 1 MiB only after 682 records: no cap.
        assert!(notes.is_empty(), "{notes:?}");
        let capped = KvIndexArgs {
            sectors: vec![1024],
            keys: 10,
            ..a
        };
        let (rows, notes) = run_kvindex(&capped).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            notes,
            vec!["1024 sectors: N = 2 of the 10 records asked (values capped at 1 MiB per run, --max-mib)"]
        );
        // Every pool file is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn repeats_report_the_medians_and_their_spread() {
        let mut xs = [3.0, -1.0, 10.0];
        assert_eq!(median(&mut xs), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 8.0]), 3.0);
        let dir = tempfile::tempdir().unwrap();
        let a = KvIndexArgs {
            sectors: vec![1],
            mode: vec![Mode::Sync],
            keys: 100,
            repeat: 3,
            pool_dir: dir.path().into(),
            ..KvIndexArgs::default()
        };
        let (rows, notes) = run_kvindex(&a).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("hash sync 1 sectors: index overhead of 3 pairs from "),
            "{}",
            notes[0]
        );
    }

    #[test]
    fn unknown_engine_and_bad_sizes_are_refused() {
        let a = KvIndexArgs {
            engine: "btrfs".into(),
            ..KvIndexArgs::default()
        };
        assert!(matches!(run_kvindex(&a), Err(Error::InvalidOption(_))));
        let a = KvIndexArgs {
            sectors: vec![0],
            ..KvIndexArgs::default()
        };
        assert!(matches!(run_kvindex(&a), Err(Error::InvalidOption(_))));
        // Past the store's value limit: its own error, from the first put.
        let dir = tempfile::tempdir().unwrap();
        let a = KvIndexArgs {
            sectors: vec![64 << 10],
            keys: 1,
            pool_dir: dir.path().into(),
            ..KvIndexArgs::default()
        };
        assert!(matches!(run_kvindex(&a), Err(Error::ValueTooLarge { .. })));
    }
}
