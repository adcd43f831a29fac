//! `nvstore bench adaptive`: workload-adaptive node sizing over time
//! (NV-Tree §6.4.2–6.4.3 and §6.5; Fig. 13–17).
//!
//! Procedure, for each strategy and for adaptivity off, in one run: create
//! a pool (`--node-size` leaves, the model calibrated at open), load
//! `--keys` random 8-byte keys in random order with adaptivity off (so
//! every pool starts as the same tree of `--node-size` leaves), then turn
//! the strategy on and run `--workload` on one thread for `--duration`
//! seconds, reporting operations per second in each `--interval`. The
//! strategies take turns in quarter-interval slices (all pools stay open),
//! so a shared, noisy machine slows them alike. Workloads:
//!
//! - `update`: updates of random keys of the hot zone, a contiguous
//!   `--locality` % of the loaded keys in key order (the largest keys;
//!   after `--shift-at` seconds, the smallest: Fig. 16);
//! - `insert`: inserts of new random keys inside the hot zone's key range
//!   (Fig. 14);
//! - `seq-insert`: ascending inserts into an empty tree; the result's
//!   `rebuilds` and `rebuild_ms` are Fig. 17's rebuild time.
//!
//! `ratio_vs_off` is a strategy's last-interval throughput over that of
//! adaptivity off. Pools are files in `--pool-dir`, unlinked once open.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::args::{parse_count, parse_size};
use crate::keys::{key_at, value_of};
use crate::output::print_and_save;
use crate::registry::pool_size_for;
use nvstore::{Adaptive, Db, Error, Options, Result};

/// The measured operation of `bench adaptive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdaptiveWorkload {
    Update,
    Insert,
    SeqInsert,
}

impl AdaptiveWorkload {
    pub fn as_str(self) -> &'static str {
        match self {
            AdaptiveWorkload::Update => "update",
            AdaptiveWorkload::Insert => "insert",
            AdaptiveWorkload::SeqInsert => "seq-insert",
        }
    }
}

/// `nvstore bench adaptive` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct AdaptiveArgs {
    /// Strategy: off, conservative, aggressive, balanced, a comma list, or
    /// all. Adaptivity off always runs too, as the baseline.
    #[arg(long, default_value = "all")]
    pub strategy: String,
    #[arg(long, value_enum, default_value = "update")]
    pub workload: AdaptiveWorkload,
    /// Percentage of the loaded keys (a contiguous hot zone) the workload touches.
    #[arg(long, default_value_t = 1.0)]
    pub locality: f64,
    /// Leaf node size in bytes at creation (K suffix allowed).
    #[arg(long, value_parser = parse_size, default_value = "1024")]
    pub node_size: u64,
    /// Seconds of measured work per strategy.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds per reported interval.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Move the hot zone from the largest keys to the smallest after this many seconds.
    #[arg(long)]
    pub shift_at: Option<f64>,
    /// Keys loaded before the measured phase (k/M suffixes allowed).
    #[arg(long, value_parser = parse_count, default_value = "1M")]
    pub keys: u64,
    /// Emulated write latency per flushed cache line, in nanoseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Print one JSON object per strategy and line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the results as JSON lines into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of keys, values and operation order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory of the pool files (tmpfs keeps them in DRAM).
    #[arg(long, default_value = "/dev/shm")]
    pub pool_dir: PathBuf,
}

impl Default for AdaptiveArgs {
    fn default() -> Self {
        AdaptiveArgs {
            strategy: "all".into(),
            workload: AdaptiveWorkload::Update,
            locality: 1.0,
            node_size: 1024,
            duration: 10.0,
            interval: 1.0,
            shift_at: None,
            keys: 1_000_000,
            latency_ns: 0,
            json: false,
            out: None,
            seed: 1,
            pool_dir: "/dev/shm".into(),
        }
    }
}

/// One strategy's run.
#[derive(Clone, Debug, Serialize)]
pub struct AdaptiveResult {
    /// Always "adaptive" (how `bench plot` tells these lines apart).
    pub bench: &'static str,
    pub strategy: &'static str,
    pub workload: &'static str,
    pub locality: f64,
    pub node_size: u64,
    pub keys: u64,
    pub latency_ns: u64,
    pub interval_sec: f64,
    pub shift_at_sec: Option<f64>,
    /// Operations per second in each interval.
    pub intervals: Vec<f64>,
    pub last_interval_ops_per_sec: f64,
    pub mean_ops_per_sec: f64,
    /// Last-interval throughput over adaptivity off's.
    pub ratio_vs_off: f64,
    pub ops: u64,
    pub load_sec: f64,
    pub splits: u64,
    pub replaces: u64,
    pub merges: u64,
    pub rebuilds: u64,
    pub rebuild_ms: f64,
    /// Leaf rewrites that made the leaves larger / smaller, and PLNs given a
    /// larger limit at rebuild.
    pub enlarged: u64,
    pub shrunk: u64,
    pub hot_plns: u64,
    pub leaves: u64,
    pub largest_leaf_bytes: u64,
    pub mean_leaf_bytes: f64,
    pub used_bytes: u64,
    /// The calibrated model: T_r and T_w as fixed + per-line ns.
    pub model: nvstore::tree::adaptive::Model,
}

/// The strategies `--strategy` names, off first.
pub fn parse_strategies(s: &str) -> Result<Vec<Adaptive>> {
    let mut v = vec![Adaptive::Off];
    if s == "all" {
        v = Adaptive::ALL.to_vec();
    } else {
        for name in s.split(',') {
            let st: Adaptive = name.trim().parse().map_err(Error::InvalidOption)?;
            if !v.contains(&st) {
                v.push(st);
            }
        }
    }
    Ok(v)
}

fn key_bytes(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

/// Slices per interval: the strategies take turns this often, so the
/// noise of a shared machine falls on all of them alike.
const SLICES: usize = 4;

/// One strategy's pool and workload state.
struct Runner {
    s: Adaptive,
    db: Db,
    sorted: Vec<u64>,
    zones: [(usize, usize); 2],
    rng: StdRng,
    round: u64,
    next_key: u64,
    load_sec: f64,
    base: [u64; 5],
    /// Measured seconds and operations so far.
    secs: f64,
    ops: u64,
    intervals: Vec<f64>,
}

fn stats(db: &Db) -> [u64; 5] {
    let st = &db.tree().stats;
    [
        st.splits.load(Relaxed),
        st.replaces.load(Relaxed),
        st.merges.load(Relaxed),
        st.rebuilds.load(Relaxed),
        st.rebuild_ns.load(Relaxed),
    ]
}

impl Runner {
    /// Creates the pool (the model calibrated at open) and loads it with
    /// adaptivity off.
    fn new(args: &AdaptiveArgs, s: Adaptive) -> Result<Runner> {
        let path = args.pool_dir.join(format!(
            "nvstore-bench-adaptive-{}-{}.pool",
            std::process::id(),
            s.as_str()
        ));
        let _ = std::fs::remove_file(&path);
        let ns = u32::try_from(args.node_size)
            .map_err(|_| Error::InvalidOption(format!("node size {} is too large", args.node_size)))?;
        let db = Db::open(
            &path,
            Options {
                node_size: ns,
                latency_ns: args.latency_ns,
                size: pool_size_for(args.keys),
                adaptive: s,
                ..Options::default()
            },
        );
        // The mapping keeps the pages; nothing is left behind if we crash.
        let _ = std::fs::remove_file(&path);
        let db = db?;
        db.set_adaptive(Adaptive::Off);
        let seed = args.seed;
        let t = Instant::now();
        let mut sorted = Vec::new();
        if args.workload != AdaptiveWorkload::SeqInsert {
            sorted.reserve(args.keys as usize);
            for i in 0..args.keys {
                let k = key_at(seed, i);
                db.put(&key_bytes(k), &value_of(seed, k, 0).to_le_bytes())?;
                sorted.push(k);
            }
            sorted.sort_unstable();
        }
        let load_sec = t.elapsed().as_secs_f64();
        let n = sorted.len();
        let hot = ((n as f64 * args.locality / 100.0).round() as usize).clamp(1.min(n), n);
        db.set_adaptive(s);
        Ok(Runner {
            s,
            base: stats(&db),
            db,
            sorted,
            // Right-most zone first, left-most after the shift (NV-Tree §6.4.3).
            zones: [(n - hot, n), (0, hot)],
            rng: StdRng::seed_from_u64(seed ^ 0xada9_71fe),
            round: 1,
            next_key: 1,
            load_sec,
            secs: 0.0,
            ops: 0,
            intervals: Vec::new(),
        })
    }

    /// Runs the workload for `secs` seconds; returns operations and seconds.
    fn slice(&mut self, args: &AdaptiveArgs, secs: f64) -> Result<(u64, f64)> {
        let seed = args.seed;
        let start = Instant::now();
        let mut ops = 0u64;
        loop {
            let elapsed = start.elapsed().as_secs_f64();
            if elapsed >= secs {
                self.secs += elapsed;
                self.ops += ops;
                return Ok((ops, elapsed));
            }
            let shifted = args.shift_at.is_some_and(|at| self.secs + elapsed >= at);
            let (lo, hi) = self.zones[shifted as usize];
            for _ in 0..64 {
                match args.workload {
                    AdaptiveWorkload::Update => {
                        let k = self.sorted[self.rng.gen_range(lo..hi)];
                        self.round += 1;
                        let v = value_of(seed, k, self.round);
                        self.db.put(&key_bytes(k), &v.to_le_bytes())?;
                    }
                    AdaptiveWorkload::Insert => {
                        let (a, b) = (self.sorted[lo], self.sorted[hi - 1]);
                        let k = if b > a {
                            self.rng.gen_range(a..=b)
                        } else {
                            self.rng.gen()
                        };
                        self.db.put(&key_bytes(k), &value_of(seed, k, 0).to_le_bytes())?;
                    }
                    AdaptiveWorkload::SeqInsert => {
                        let k = self.next_key;
                        self.db.put(&key_bytes(k), &k.to_le_bytes())?;
                        self.next_key += 1;
                    }
                }
            }
            ops += 64;
        }
    }

    fn result(&self, args: &AdaptiveArgs) -> AdaptiveResult {
        let tree = self.db.tree();
        let sizes: Vec<u64> = tree.index.load().entries().iter().map(|e| e.leaf.size).collect();
        let now = stats(&self.db);
        let ad = &tree.adaptive;
        AdaptiveResult {
            bench: "adaptive",
            strategy: self.s.as_str(),
            workload: args.workload.as_str(),
            locality: args.locality,
            node_size: args.node_size,
            keys: args.keys,
            latency_ns: args.latency_ns,
            interval_sec: args.interval,
            shift_at_sec: args.shift_at,
            intervals: self.intervals.clone(),
            last_interval_ops_per_sec: self.intervals.last().copied().unwrap_or(0.0),
            mean_ops_per_sec: self.ops as f64 / self.secs.max(1e-9),
            ratio_vs_off: 1.0,
            ops: self.ops,
            load_sec: self.load_sec,
            splits: now[0] - self.base[0],
            replaces: now[1] - self.base[1],
            merges: now[2] - self.base[2],
            rebuilds: now[3] - self.base[3],
            rebuild_ms: (now[4] - self.base[4]) as f64 / 1e6,
            enlarged: ad.enlarged.load(Relaxed),
            shrunk: ad.shrunk.load(Relaxed),
            hot_plns: ad.hot_plns.load(Relaxed),
            leaves: sizes.len() as u64,
            largest_leaf_bytes: sizes.iter().copied().max().unwrap_or(0),
            mean_leaf_bytes: sizes.iter().sum::<u64>() as f64 / sizes.len().max(1) as f64,
            used_bytes: self.db.used_bytes(),
            model: self.db.adaptive_model(),
        }
    }
}

/// Every requested strategy and off, with `ratio_vs_off` filled in. All
/// pools are loaded first; then each interval is cut into [`SLICES`]
/// slices and the strategies take turns, slice by slice, so each
/// interval's numbers of all strategies come from the same stretch of
/// wall-clock time.
pub fn run_adaptive(args: &AdaptiveArgs) -> Result<Vec<AdaptiveResult>> {
    if !(args.locality > 0.0 && args.locality <= 100.0) {
        return Err(Error::InvalidOption(format!(
            "--locality {} must be in (0, 100]",
            args.locality
        )));
    }
    if args.workload != AdaptiveWorkload::SeqInsert && args.keys == 0 {
        return Err(Error::InvalidOption("--keys must be at least 1".into()));
    }
    if !(args.interval > 0.0 && args.duration > 0.0) {
        return Err(Error::InvalidOption(
            "--interval and --duration must be positive".into(),
        ));
    }
    let mut runners = Vec::new();
    for s in parse_strategies(&args.strategy)? {
        runners.push(Runner::new(args, s)?);
    }
    let intervals = ((args.duration / args.interval).round() as usize).max(1);
    let slice = args.interval / SLICES as f64;
    for _ in 0..intervals {
        let mut acc = vec![(0u64, 0f64); runners.len()];
        for _ in 0..SLICES {
            for (r, a) in runners.iter_mut().zip(&mut acc) {
                let (ops, secs) = r.slice(args, slice)?;
                a.0 += ops;
                a.1 += secs;
            }
        }
        for (r, (ops, secs)) in runners.iter_mut().zip(acc) {
            r.intervals.push(ops as f64 / secs);
        }
    }
    let mut rs: Vec<AdaptiveResult> = runners.iter().map(|r| r.result(args)).collect();
    let off = rs[0].last_interval_ops_per_sec;
    for r in &mut rs {
        r.ratio_vs_off = r.last_interval_ops_per_sec / off;
    }
    Ok(rs)
}

fn print_table(rs: &[AdaptiveResult], out: &mut dyn Write) -> std::io::Result<()> {
    if let Some(r) = rs.first() {
        writeln!(
            out,
            "{} at {}% locality, {} keys, {} B nodes, {} ns/line, ops/s per {} s interval",
            r.workload, r.locality, r.keys, r.node_size, r.latency_ns, r.interval_sec
        )?;
    }
    for r in rs {
        let iv: Vec<String> = r.intervals.iter().map(|v| format!("{:.0}k", v / 1e3)).collect();
        writeln!(
            out,
            "{:<12} last {:>9.0} ops/s  {:>5.2}x off  splits {:>6} replaces {:>7} rebuilds {:>3} ({:.1} ms)  leaves {} (largest {} B)\n             {}",
            r.strategy,
            r.last_interval_ops_per_sec,
            r.ratio_vs_off,
            r.splits,
            r.replaces,
            r.rebuilds,
            r.rebuild_ms,
            r.leaves,
            r.largest_leaf_bytes,
            iv.join(" ")
        )?;
    }
    Ok(())
}

/// `nvstore bench adaptive`: runs, prints a table (or JSON lines with
/// `--json`), and writes JSON lines into `--out DIR`.
pub fn adaptive_main(args: &AdaptiveArgs, out: &mut dyn Write) -> Result<Vec<AdaptiveResult>> {
    let rs = run_adaptive(args)?;
    print_and_save(&rs, args.json, print_table, out, args.out.as_deref(), || {
        format!(
            "adaptive-{}-{}-{}-{}{}.jsonl",
            args.workload.as_str(),
            args.locality,
            args.node_size,
            args.strategy.replace(',', "+"),
            args.shift_at.map_or(String::new(), |s| format!("-shift{s}"))
        )
    })?;
    Ok(rs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_with_off_first() {
        assert_eq!(parse_strategies("all").unwrap(), Adaptive::ALL.to_vec());
        assert_eq!(
            parse_strategies("balanced").unwrap(),
            vec![Adaptive::Off, Adaptive::Balanced]
        );
        assert_eq!(parse_strategies("off").unwrap(), vec![Adaptive::Off]);
        assert!(parse_strategies("fast").is_err());
    }

    #[test]
    fn a_short_run_reports_every_strategy() {
        let dir = std::env::temp_dir();
        let args = AdaptiveArgs {
            keys: 20_000,
            duration: 0.3,
            interval: 0.1,
            pool_dir: dir,
            ..AdaptiveArgs::default()
        };
        let rs = run_adaptive(&args).unwrap();
        let names: Vec<&str> = rs.iter().map(|r| r.strategy).collect();
        assert_eq!(names, ["off", "conservative", "aggressive", "balanced"]);
        assert_eq!(rs[0].ratio_vs_off, 1.0);
        for r in &rs {
            assert!(!r.intervals.is_empty() && r.ops > 0, "{r:?}");
        }
        // Off never resizes; the hot zone's leaves grow under the others.
        assert_eq!(rs[0].enlarged, 0);
        assert!(rs[3].enlarged > 0 && rs[3].largest_leaf_bytes > 1024, "{:?}", rs[3]);
    }
}
