//! Metamorphic runs: one seeded operation sequence over every configuration
//! of a pool must end in the same contents.
//!
//! A sequence holds puts of new keys, updates of present ones, deletes of
//! present and absent keys, point gets, and write batches and transactions
//! over several keys; keys and values of every size class (inline 8-byte
//! words, short ones, long keys and values in blobs, values of 20 KB and
//! over 64 KiB in whole chunk runs). It runs over nv and isle leaves, node
//! sizes 256 to 8192, adaptive sizing off and on, and three lives of the
//! pool: never reopened, closed cleanly and reopened a few times, or
//! crashed during a few operations (one crash image the simulator captured
//! inside the operation, picked at random, is recovered: the operation must
//! be there whole or not at all, and is run again when it is not; a clean
//! close, and the instant reopen after it, may crash too). Isle
//! pools take no write batches or transactions, so there each becomes its
//! single-key writes, which must end in the same contents.
//!
//! Along the way every get and every transaction's reads agree with a
//! `BTreeMap` model; at checkpoints and at the end the full scan (forward
//! and reverse), bounded ranges and prefixes equal the model's, `len()` its
//! size, and `check()` is clean;
//! and the scans of all configurations at each checkpoint are equal.
//!
//! `NVSTORE_METAMORPHIC_SEEDS=n` runs `n` seeds instead of the fixed list,
//! `NVSTORE_METAMORPHIC_OPS=n` sequences of `n` operations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use nvstore::pmem::sim::CaptureConfig;
use nvstore::pmem::SimSpace;
use nvstore::{Adaptive, Db, LeafKind, Options, WriteBatch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;
type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

const PATH: &str = "metamorphic";

/// Operations per sequence (`NVSTORE_METAMORPHIC_OPS` overrides it);
/// scans are compared every `CHECKPOINT` of them.
const OPS: usize = 360;
const CHECKPOINT: usize = 90;

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
    Get(Vec<u8>),
    Batch(Writes),
    Txn(Writes),
}

impl Op {
    fn writes(&self) -> Writes {
        match self {
            Op::Put(k, v) => vec![(k.clone(), Some(v.clone()))],
            Op::Del(k) => vec![(k.clone(), None)],
            Op::Get(_) => Vec::new(),
            Op::Batch(w) | Op::Txn(w) => w.clone(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let many = |w: &Writes| {
            w.iter()
                .map(|(k, v)| format!("{}{}", if v.is_some() { "+" } else { "-" }, show(k)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self {
            Op::Put(k, v) => write!(f, "put {} ({} B)", show(k), v.len()),
            Op::Del(k) => write!(f, "delete {}", show(k)),
            Op::Get(k) => write!(f, "get {}", show(k)),
            Op::Batch(w) => write!(f, "batch [{}]", many(w)),
            Op::Txn(w) => write!(f, "txn [{}]", many(w)),
        }
    }
}

fn show(k: &[u8]) -> String {
    let h: String = k.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!(
        "0x{h}{}",
        if k.len() > 12 {
            format!("..({} B)", k.len())
        } else {
            String::new()
        }
    )
}

fn apply(model: &mut Model, w: &Writes) {
    for (k, v) in w {
        match v {
            Some(v) => model.insert(k.clone(), v.clone()),
            None => model.remove(k),
        };
    }
}

/// Key `n` of the universe: 8-byte integers (inline), short text, long
/// keys in blobs sharing their first 8 bytes, and a few edge keys.
fn key(n: u64) -> Vec<u8> {
    match n % 16 {
        0..=6 => (n.wrapping_mul(0x0101_0101_0101)).to_be_bytes().to_vec(),
        7..=10 => format!("k{n}").into_bytes(),
        11..=13 => format!("longkey/{n:06}/{}", "y".repeat((n % 61) as usize)).into_bytes(),
        14 => vec![0xff; (n % 12) as usize],
        _ => Vec::new(),
    }
}

fn value(rng: &mut StdRng, tag: u64) -> Vec<u8> {
    let len = match rng.gen_range(0..1000) {
        0..=299 => 8,
        300..=499 => rng.gen_range(0..8),
        500..=749 => rng.gen_range(9..64),
        750..=929 => rng.gen_range(100..1500),
        930..=979 => rng.gen_range(2000..6000),
        980..=993 => rng.gen_range(19_000..21_000),
        _ => rng.gen_range(66_000..80_000),
    };
    let t = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
    (0..len)
        .map(|i| if i < 8 { t[i] } else { (i as u64 ^ tag) as u8 })
        .collect()
}

/// The seeded sequence (generated against its own model, so updates and
/// deletes find present keys).
fn sequence(seed: u64) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let universe = rng.gen_range(150..400);
    let mut model = Model::new();
    let n = ops_per_sequence();
    let mut ops = Vec::with_capacity(n);
    for i in 0..n {
        let tag = seed << 32 | i as u64;
        // Fill first, then churn, then drain: splits, then replaces and merges.
        let (put, del) = match i * 3 / n {
            0 => (75, 10),
            1 => (45, 35),
            _ => (15, 70),
        };
        let present = |rng: &mut StdRng, model: &Model| {
            (!model.is_empty()).then(|| model.keys().nth(rng.gen_range(0..model.len())).unwrap().clone())
        };
        let r = rng.gen_range(0..100);
        let op = if i % 97 == 40 {
            // A value over 64 KiB (a run of whole chunks) now and then, on
            // a few keys, so runs are freed and carved again.
            let len = rng.gen_range(66_000..150_000);
            let t = tag.to_le_bytes();
            Op::Put(key(rng.gen_range(0..3)), (0..len).map(|j| t[j % 8] ^ j as u8).collect())
        } else if r < 8 {
            let mut w: Writes = Vec::new();
            for _ in 0..rng.gen_range(2..=7) {
                let k = key(rng.gen_range(0..universe));
                if w.iter().all(|(x, _)| *x != k) {
                    let v = (rng.gen_range(0..100) >= del).then(|| value(&mut rng, tag ^ w.len() as u64));
                    w.push((k, v));
                }
            }
            if rng.gen_bool(0.5) {
                Op::Batch(w)
            } else {
                Op::Txn(w)
            }
        } else if r < 8 + put {
            // Half new keys, half updates of present ones.
            let k = match rng.gen_bool(0.5) {
                true => present(&mut rng, &model),
                false => None,
            };
            let k = k.unwrap_or_else(|| key(rng.gen_range(0..universe)));
            Op::Put(k, value(&mut rng, tag))
        } else if r < 8 + put + del {
            // Mostly present keys, some absent.
            let k = match rng.gen_ratio(9, 10) {
                true => present(&mut rng, &model),
                false => None,
            };
            Op::Del(k.unwrap_or_else(|| key(rng.gen_range(0..universe))))
        } else {
            Op::Get(key(rng.gen_range(0..universe)))
        };
        apply(&mut model, &op.writes());
        ops.push(op);
    }
    ops
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Life {
    NoReopen,
    CleanReopen,
    Crash,
}

#[derive(Clone, Copy, Debug)]
struct Conf {
    leaf: LeafKind,
    node_size: u32,
    adaptive: Adaptive,
    life: Life,
}

impl fmt::Display for Conf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} leaves, node {}, adaptive {}, {:?}",
            self.leaf.as_str(),
            self.node_size,
            self.adaptive.as_str(),
            self.life
        )
    }
}

fn confs() -> Vec<Conf> {
    let mut out = Vec::new();
    for leaf in [LeafKind::Nv, LeafKind::Isle] {
        for node_size in [256, 1024, 4096, 8192] {
            for adaptive in [Adaptive::Off, Adaptive::Balanced] {
                for life in [Life::NoReopen, Life::CleanReopen, Life::Crash] {
                    out.push(Conf {
                        leaf,
                        node_size,
                        adaptive,
                        life,
                    });
                }
            }
        }
    }
    out
}

/// The steps a configuration runs: isle pools run batches and
/// transactions as their single-key writes.
fn steps(conf: &Conf, ops: &[Op]) -> Vec<(usize, Op)> {
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Batch(w) | Op::Txn(w) if conf.leaf == LeafKind::Isle => {
                for (k, v) in w {
                    out.push((
                        i,
                        match v {
                            Some(v) => Op::Put(k.clone(), v.clone()),
                            None => Op::Del(k.clone()),
                        },
                    ));
                }
            }
            _ => out.push((i, op.clone())),
        }
    }
    out
}

/// Runs `op`, checking what it returns (and a transaction's reads) against
/// the model before the op.
fn exec(db: &Db<SimSpace>, op: &Op, model: &Model) -> Result<(), String> {
    match op {
        Op::Put(k, v) => db.put(k, v).map_err(|e| e.to_string()),
        Op::Del(k) => match db.delete(k) {
            Ok(d) if d == model.contains_key(k) => Ok(()),
            Ok(d) => Err(format!("delete returned {d}, model says {}", !d)),
            Err(e) => Err(e.to_string()),
        },
        Op::Get(k) => match db.get(k) {
            Ok(v) if v.as_ref() == model.get(k) => Ok(()),
            Ok(v) => Err(format!(
                "get gives {:?} B, model {:?} B",
                v.map(|v| v.len()),
                model.get(k).map(|v| v.len())
            )),
            Err(e) => Err(e.to_string()),
        },
        Op::Batch(w) => {
            let mut b = WriteBatch::new();
            for (k, v) in w {
                match v {
                    Some(v) => b.put(k, v),
                    None => b.delete(k),
                }
            }
            db.write_batch(b).map(|_| ()).map_err(|e| e.to_string())
        }
        Op::Txn(w) => {
            let mut bad_read = None;
            let r = db.transaction(|tx| {
                for (k, v) in w {
                    let got = tx.get(k)?;
                    if got.as_ref() != model.get(k) && bad_read.is_none() {
                        bad_read = Some(show(k));
                    }
                    match v {
                        Some(v) => tx.put(k, v)?,
                        None => tx.delete(k)?,
                    }
                }
                Ok(())
            });
            match (r, bad_read) {
                (Err(e), _) => Err(e.to_string()),
                (Ok(()), Some(k)) => Err(format!("transaction read of {k} differs from the model")),
                (Ok(()), None) => Ok(()),
            }
        }
    }
}

fn scan(db: &Db<SimSpace>) -> Pairs {
    db.iter().collect()
}

/// Full scan (both ways), len and check against the model.
fn verify(db: &Db<SimSpace>, model: &Model) -> Result<Pairs, String> {
    let pairs = scan(db);
    if !pairs.iter().map(|(k, v)| (k, v)).eq(model.iter()) {
        return Err(format!("scan differs from the model: {}", diff(&pairs, model)));
    }
    let rev: Vec<_> = db.range_rev::<&[u8], _>(..).collect();
    if !rev.iter().rev().eq(pairs.iter()) {
        return Err("reverse scan differs from the forward scan".into());
    }
    if db.len() != model.len() as u64 {
        return Err(format!("len() is {}, model has {}", db.len(), model.len()));
    }
    ranges(db, model)?;
    let r = db.check();
    if !r.ok {
        return Err(format!("check: {}", r.problems.join("; ")));
    }
    Ok(pairs)
}

/// Bounded ranges (both ways, bounds present and absent, inclusive and
/// exclusive) and prefixes agree with the model.
fn ranges(db: &Db<SimSpace>, model: &Model) -> Result<(), String> {
    let keys: Vec<&Vec<u8>> = model.keys().collect();
    let mut points: Vec<Vec<u8>> = [1, 3, 4, 5, 7]
        .iter()
        .filter_map(|i| keys.get(keys.len() * i / 8).map(|k| k.to_vec()))
        .collect();
    points.extend([key(5), key(8), key(12), b"longkey/0001".to_vec(), vec![0xff; 3]]);
    points.sort();
    for (n, w) in points.windows(2).enumerate() {
        let (lo, hi) = (w[0].clone(), w[1].clone());
        let bounds = match n % 3 {
            0 => (Bound::Included(lo), Bound::Excluded(hi)),
            1 => (Bound::Excluded(lo), Bound::Included(hi)),
            _ => (Bound::Included(lo), Bound::Unbounded),
        };
        if matches!(&bounds, (Bound::Excluded(a), Bound::Included(b)) if a == b) {
            continue;
        }
        let want: Pairs = model
            .range(bounds.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let got: Pairs = db.range(bounds.clone()).collect();
        if got != want {
            return Err(format!("range {bounds:?}: {} pairs, model {}", got.len(), want.len()));
        }
        let rev: Pairs = db.range_rev(bounds.clone()).collect();
        if !rev.iter().rev().eq(want.iter()) {
            return Err(format!(
                "reverse range {bounds:?}: {} pairs, model {}",
                rev.len(),
                want.len()
            ));
        }
    }
    for p in [&b"longkey/"[..], b"k1", b"k", &[0xff], &[0xff, 0xff], &[0, 0]] {
        let want: Vec<&Vec<u8>> = model.keys().filter(|k| k.starts_with(p)).collect();
        let got: Vec<Vec<u8>> = db.prefix(p).map(|(k, _)| k).collect();
        if !got.iter().eq(want.iter().copied()) {
            return Err(format!("prefix {}: {} keys, model {}", show(p), got.len(), want.len()));
        }
        let rev: Vec<Vec<u8>> = db.prefix_rev(p).map(|(k, _)| k).collect();
        if !rev.iter().rev().eq(want.iter().copied()) {
            return Err(format!(
                "reverse prefix {}: {} keys, model {}",
                show(p),
                rev.len(),
                want.len()
            ));
        }
    }
    Ok(())
}

fn diff(pairs: &[(Vec<u8>, Vec<u8>)], model: &Model) -> String {
    let got: Model = pairs.iter().cloned().collect();
    let mut out = Vec::new();
    for (k, v) in model {
        match got.get(k) {
            None => out.push(format!("missing {}", show(k))),
            Some(g) if g != v => out.push(format!("{} is {} B, model {} B", show(k), g.len(), v.len())),
            _ => {}
        }
    }
    out.extend(
        got.keys()
            .filter(|k| !model.contains_key(*k))
            .map(|k| format!("extra {}", show(k))),
    );
    let n = out.len();
    out.truncate(4);
    format!(
        "{} pairs, model {}, {n} differences: {}",
        pairs.len(),
        model.len(),
        out.join("; ")
    )
}

fn open(image: Vec<u8>, conf: &Conf) -> Result<Db<SimSpace>, String> {
    let db = Db::open_space(SimSpace::from_image(image), Path::new(PATH)).map_err(|e| format!("reopen: {e}"))?;
    db.set_adaptive(conf.adaptive);
    Ok(db)
}

/// How the simulated crashes recovered, and what adaptivity did.
#[derive(Debug, Default)]
struct Seen {
    /// The op was lost whole (and run again).
    lost: u64,
    /// The op survived whole.
    kept: u64,
    /// The image was captured at a fence inside the op (not at its boundary).
    mid_op: u64,
    /// Crashes during a clean close, and during the instant reopen after one.
    close_crashes: u64,
    reopen_crashes: u64,
    /// Most distinct leaf sizes in one tree at a checkpoint (adaptive runs).
    leaf_sizes: usize,
}

type Scans = Vec<Pairs>;

/// Runs the sequence over one configuration; returns the scan at every
/// checkpoint (and at the end).
fn run_conf(conf: &Conf, seed: u64, ops: &[Op], seen: &mut Seen) -> Result<Scans, String> {
    let steps = steps(conf, ops);
    // Where this configuration reopens or crashes: its own seeded choice.
    let mut rng = StdRng::seed_from_u64(
        seed ^ (conf.node_size as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (conf.leaf == LeafKind::Isle) as u64,
    );
    let events: Vec<usize> = match conf.life {
        Life::NoReopen => Vec::new(),
        Life::CleanReopen | Life::Crash => (0..3).map(|_| rng.gen_range(0..steps.len())).collect(),
    };
    let opts = Options {
        node_size: conf.node_size,
        size: 1 << 20,
        leaf: conf.leaf,
        adaptive: conf.adaptive,
        ..Options::default()
    };
    let mut db = Db::create_in(SimSpace::new(opts.size), Path::new(PATH), &opts).map_err(|e| format!("create: {e}"))?;
    let mut model = Model::new();
    let mut scans = Vec::new();
    for (s, (i, op)) in steps.iter().enumerate() {
        let at = |what: String| format!("step {s} (op {i}: {op}): {what}");
        if conf.life == Life::CleanReopen && events.contains(&s) {
            // Capture on: a crash may come during the close or during the
            // instant reopen (which clears the clean flag); either way the
            // pool recovers to the model.
            db.space().set_capture(Some(CaptureConfig::new(rng.gen())));
            let space = db.close_into_space().map_err(|e| at(format!("close: {e}")))?;
            let closing = space.take_images();
            space.set_capture(None);
            if !closing.is_empty() && rng.gen_ratio(1, 3) {
                seen.close_crashes += 1;
                let image = &closing[rng.gen_range(0..closing.len())];
                let (kind, point) = (image.kind, image.point);
                db = open(image.data.clone(), conf)
                    .map_err(|e| at(format!("crash image {kind} of the close before {point}: {e}")))?;
            } else {
                let reopened = SimSpace::from_image(space.current_image());
                reopened.set_capture(Some(CaptureConfig::new(rng.gen())));
                db = Db::open_space(reopened, Path::new(PATH)).map_err(|e| at(format!("reopen: {e}")))?;
                db.set_adaptive(conf.adaptive);
                if db.recovery().kind != nvstore::RecoveryKind::Instant {
                    return Err(at(format!("clean reopen recovered by {:?}", db.recovery().kind)));
                }
                let opening = db.space().take_images();
                db.space().set_capture(None);
                if !opening.is_empty() && rng.gen_bool(0.5) {
                    seen.reopen_crashes += 1;
                    let image = &opening[rng.gen_range(0..opening.len())];
                    let (kind, point) = (image.kind, image.point);
                    db = open(image.data.clone(), conf)
                        .map_err(|e| at(format!("crash image {kind} of the reopen before {point}: {e}")))?;
                }
            }
            verify(&db, &model).map_err(|e| at(format!("after a clean reopen: {e}")))?;
        }
        let mut after = model.clone();
        apply(&mut after, &op.writes());
        if conf.life == Life::Crash && events.contains(&s) {
            db.space().set_capture(Some(CaptureConfig {
                seed: rng.gen(),
                random_subsets: 4,
                torn: 2,
            }));
            exec(&db, op, &model).map_err(at)?;
            let mut images = db.space().take_images();
            db.space().set_capture(None);
            images.push(nvstore::pmem::sim::CrashImage {
                kind: nvstore::pmem::sim::ImageKind::Persisted,
                point: "acknowledged",
                seq: 0,
                data: db.space().persisted_image(),
            });
            let image = images.swap_remove(rng.gen_range(0..images.len()));
            let (kind, point) = (image.kind, image.point);
            seen.mid_op += (point != nvstore::pmem::sim::OP_BOUNDARY && point != "acknowledged") as u64;
            let at = |what: String| at(format!("crash image {kind} before {point}: {what}"));
            drop(db);
            db = open(image.data, conf).map_err(at)?;
            let pairs = scan(&db);
            let whole = |m: &Model| pairs.iter().map(|(k, v)| (k, v)).eq(m.iter());
            if whole(&model) {
                // Lost whole: run it again.
                seen.lost += 1;
                verify(&db, &model).map_err(|e| at(format!("recovered to before the op: {e}")))?;
                exec(&db, op, &model).map_err(|e| at(format!("again after recovery: {e}")))?;
            } else if whole(&after) {
                seen.kept += 1;
            } else {
                return Err(at(format!(
                    "recovered to neither before nor after the op: {}",
                    diff(&pairs, &after)
                )));
            }
            verify(&db, &after).map_err(|e| at(format!("after recovery: {e}")))?;
        } else {
            exec(&db, op, &model).map_err(at)?;
        }
        model = after;
        let last_of_op = steps.get(s + 1).is_none_or(|n| n.0 != *i);
        if last_of_op && (i + 1) % CHECKPOINT == 0 {
            scans.push(verify(&db, &model).map_err(|e| at(format!("checkpoint: {e}")))?);
            if conf.adaptive != Adaptive::Off {
                let sizes: BTreeSet<u64> = db.index_leaves().iter().map(|l| l.1).collect();
                seen.leaf_sizes = seen.leaf_sizes.max(sizes.len());
            }
        }
    }
    scans.push(verify(&db, &model).map_err(|e| format!("at the end: {e}"))?);
    Ok(scans)
}

fn run_seed(seed: u64, confs: &[Conf], seen: &mut Seen) {
    let ops = sequence(seed);
    let mut first: Option<(Conf, Scans)> = None;
    let mut failures = Vec::new();
    for conf in confs {
        let r = catch_unwind(AssertUnwindSafe(|| run_conf(conf, seed, &ops, seen)));
        let scans = match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                failures.push(format!("seed {seed}, {conf}: {e}"));
                continue;
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("seed {seed}, {conf}: panicked: {msg}"));
                continue;
            }
        };
        match &first {
            None => first = Some((*conf, scans)),
            Some((c0, s0)) => {
                for (n, (a, b)) in s0.iter().zip(&scans).enumerate() {
                    if a != b {
                        failures.push(format!("seed {seed}: checkpoint {n} of {conf} differs from {c0}"));
                        break;
                    }
                }
                if s0.len() != scans.len() {
                    failures.push(format!(
                        "seed {seed}: {conf} has {} checkpoints, {c0} {}",
                        scans.len(),
                        s0.len()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn ops_per_sequence() -> usize {
    std::env::var("NVSTORE_METAMORPHIC_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(OPS)
}

fn seeds() -> Vec<u64> {
    match std::env::var("NVSTORE_METAMORPHIC_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(n) => (1..=n).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect(),
        None => vec![1, 2, 3],
    }
}

#[test]
fn every_configuration_ends_in_the_same_contents() {
    let confs = confs();
    let mut seen = Seen::default();
    for seed in seeds() {
        run_seed(seed, &confs, &mut seen);
    }
    // The crashes reached both outcomes, from images inside operations,
    // and adaptive sizing made leaves of several sizes.
    assert!(seen.lost > 0 && seen.kept > 0 && seen.mid_op > 0, "{seen:?}");
    assert!(seen.close_crashes > 0 && seen.reopen_crashes > 0, "{seen:?}");
    assert!(seen.leaf_sizes > 1, "{seen:?}");
}

#[test]
fn sequences_cover_every_kind_of_operation() {
    for seed in seeds() {
        let ops = sequence(seed);
        let count = |f: fn(&Op) -> bool| ops.iter().filter(|o| f(o)).count();
        assert!(count(|o| matches!(o, Op::Put(..))) > ops.len() / 3, "seed {seed}: puts");
        assert!(
            count(|o| matches!(o, Op::Del(..))) > ops.len() / 10,
            "seed {seed}: deletes"
        );
        assert!(count(|o| matches!(o, Op::Get(..))) > 0, "seed {seed}: gets");
        assert!(
            count(|o| matches!(o, Op::Batch(..) | Op::Txn(..))) > 4,
            "seed {seed}: batches"
        );
        assert!(
            count(|o| matches!(o, Op::Put(_, v) if v.len() > 64 * 1024)) > 0,
            "seed {seed}: huge values"
        );
        assert!(
            count(|o| matches!(o, Op::Put(k, _) if k.len() > 8)) > 0,
            "seed {seed}: long keys"
        );
    }
}
