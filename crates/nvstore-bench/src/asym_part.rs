//! `nvstore bench asym --partitions N`: AsymNVM Fig. 10 (§9.5) on this
//! machine. N back-ends (in this process, each on its own threads, its own
//! pool file and its own loopback port) each own one partition of the
//! structure; N writer front-ends, one per partition, run in parallel
//! threads, each holding its partition's writer lock only.
//!
//! The workload is the one of the single back-end run, split by key: the
//! same seeded stream of `--ops` puts (queue: enqueues of 0, 1, 2, …), each
//! executed by the front-end of its key's partition (key hashing for the
//! hash table and the queue, `N` equal key ranges for the trees and the
//! skiplist). So `--partitions 1` and `--partitions 3` do the same puts.
//! Aggregate throughput is all the puts over the wall time from the common
//! start until the last front-end has sent its last batch.
//!
//! `--app tatp` runs partitioned too: every row of a TATP subscriber has a
//! key from `s_id << 8` to `s_id << 8 | 255`, so N ranges of subscribers are
//! N key ranges and every transaction stays in one partition. Each
//! partition loads its own subscribers first (rcb, not timed), then the
//! seeded stream of `--ops` transactions is split by subscriber. SmallBank
//! is refused: its transfers touch two accounts, so two partitions.

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use hdrhistogram::Histogram;
use nvstore_asym::apps::{tatp, Outcome, Tatp};
use nvstore_asym::structures::{BpTree, Bst, HashTable, Queue, SkipList};
use nvstore_asym::transport::Counters;
use nvstore_asym::{Mode, PartitionMap, Partitioned, Remote, RemoteOptions};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::asym::{item_bytes, start_backend, transport, AsymArgs, AsymResult};

/// The structures that run partitioned.
pub const PARTITIONED: [&str; 5] = ["bptree", "bst", "skiplist", "hash", "queue"];

/// One partition's share of a partitioned run.
#[derive(Serialize, Clone, Debug)]
pub struct PartResult {
    pub partition: usize,
    pub ops: u64,
    /// Its own operations over its own time.
    pub ops_per_sec: f64,
    pub round_trips_per_op: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// One partition's structure.
enum Ds {
    Tree(BpTree),
    Bst(Bst),
    Skip(SkipList),
    Hash(HashTable),
    Queue(Queue),
    Tatp(Tatp),
}

impl Ds {
    fn open(r: &mut Remote, structure: &str, name: &str, buckets: u64, scale: u64) -> nvstore_asym::Result<Ds> {
        Ok(match structure {
            "tatp" => Ds::Tatp(Tatp::open(r, name, scale)?),
            "bst" => Ds::Bst(Bst::open(r, name)?),
            "skiplist" => Ds::Skip(SkipList::open(r, name)?),
            "hash" => Ds::Hash(HashTable::open(r, name, buckets)?),
            "queue" => Ds::Queue(Queue::open(r, name)?),
            _ => Ds::Tree(BpTree::open(r, name)?),
        })
    }

    fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> nvstore_asym::Result<()> {
        match self {
            Ds::Tree(t) => t.put(r, key, value),
            Ds::Bst(t) => t.put(r, key, value),
            Ds::Skip(t) => t.put(r, key, value),
            Ds::Hash(t) => t.put(r, key, value),
            Ds::Queue(q) => q.enqueue(r, key, value),
            Ds::Tatp(_) => unreachable!("TATP runs transactions"),
        }
    }
}

/// What one front-end thread measured.
struct Share {
    ops: u64,
    aborted: u64,
    start: Instant,
    end: Instant,
    counters: Counters,
    hist: Histogram<u64>,
}

/// Runs `--ops` puts (or TATP transactions) over `n` partitions and returns the aggregate, with
/// each partition's figures in `per_partition`.
pub fn run_partitioned(a: &AsymArgs, mode: Mode, n: usize) -> Result<AsymResult, String> {
    if a.app.as_deref().is_some_and(|app| app != "tatp") {
        return Err(
            "--partitions runs a structure or --app tatp: a SmallBank transaction spans two accounts, \
             so two partitions"
                .into(),
        );
    }
    if a.app.is_none() && !PARTITIONED.contains(&a.structure.as_str()) {
        return Err(format!(
            "--partitions runs {} or --app tatp, not {:?}",
            PARTITIONED.join(", "),
            a.structure
        ));
    }
    if a.connect.is_some() {
        return Err("--partitions starts its own back-ends; --connect names one".into());
    }
    if n == 0 {
        return Err("--partitions needs at least 1".into());
    }
    let mut started: Vec<(std::net::SocketAddr, PathBuf)> = Vec::new();
    for _ in 0..n {
        match start_backend() {
            Ok(b) => started.push(b),
            Err(e) => {
                remove(&started);
                return Err(e);
            }
        }
    }
    let r = run_on(a, mode, n, &started);
    remove(&started);
    r
}

fn remove(started: &[(std::net::SocketAddr, PathBuf)]) {
    for (_, p) in started {
        let _ = std::fs::remove_file(p);
    }
}

fn run_on(
    a: &AsymArgs,
    mode: Mode,
    n: usize,
    backends: &[(std::net::SocketAddr, PathBuf)],
) -> Result<AsymResult, String> {
    let key_space = a.ops.saturating_mul(4).max(1);
    let app = a.app.is_some();
    let what = if app { "tatp" } else { a.structure.as_str() };
    let scale = a.scale.max(n as u64);
    // TATP: partition i holds subscribers first[i]..first[i + 1].
    let first: Vec<u64> = (0..=n as u64).map(|i| 1 + scale * i / n as u64).collect();
    let map = match what {
        "hash" | "queue" => PartitionMap::hash(n),
        "tatp" => PartitionMap::range(
            (0..n)
                .map(|i| if i == 0 { 0 } else { tatp::subscriber_key(first[i]) })
                .collect(),
        )
        .map_err(|e| e.to_string())?,
        _ => PartitionMap::range_even(n, key_space),
    };
    // Bytes per put (per subscriber with TATP, about 11 rows in leaves).
    let item = if app { 11 * 100 } else { item_bytes(&a.structure) };
    let items = if app {
        scale.div_ceil(n as u64)
    } else {
        a.ops.div_ceil(n as u64)
    };
    let name = format!("{}-{}", what, rand::random::<u32>());
    let lock = format!("bench-{}", rand::random::<u32>());
    let per = a.ops.div_ceil(n as u64).max(1);
    let barrier = Barrier::new(n);
    let results: Vec<Result<Share, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (map, name, lock, barrier, first) = (&map, &name, &lock, &barrier, &first);
                s.spawn(move || -> Result<Share, String> {
                    let e = |e: nvstore_asym::Error| format!("partition {i}: {e}");
                    let opts = RemoteOptions {
                        mode,
                        batch: a.batch.max(1),
                        cache_bytes: ((items * item * a.cache_pct / 100) as usize).max(4096),
                        owner: (i as u64 + 1) << 1 | 1,
                        lock: lock.clone(),
                        ..RemoteOptions::default()
                    };
                    let open = |_: usize, r: &mut Remote| Ds::open(r, what, name, per, scale);
                    let writer = |opts: &RemoteOptions| {
                        transport(a, backends[i].0)
                            .and_then(|t| Partitioned::open_writer_of(map.clone(), name, i, t, opts, open).map_err(e))
                    };
                    // TATP: this partition's subscribers, loaded by an rcb front-end (not timed).
                    let loaded = if app {
                        let loader = RemoteOptions {
                            mode: Mode::Rcb,
                            batch: 1024,
                            cache_bytes: (items * item * 2) as usize,
                            ..opts.clone()
                        };
                        writer(&loader).and_then(|mut p| {
                            p.with_key(tatp::subscriber_key(first[i]), |d, r| match d {
                                Ds::Tatp(t) => t.load_range(r, first[i], first[i + 1]),
                                _ => unreachable!(),
                            })
                            .map_err(e)?;
                            p.close().map_err(e)
                        })
                    } else {
                        Ok(())
                    };
                    // Every thread reaches the barrier, even one that failed to open.
                    let opened = loaded.and_then(|()| writer(&opts));
                    barrier.wait();
                    let mut p = opened?;
                    let start = Instant::now();
                    let value = [0x42u8; 64];
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
                    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
                    let before = p.counters()[i].clone().expect("held");
                    let (mut ops, mut aborted) = (0, 0);
                    for j in 0..a.ops {
                        let tx = app.then(|| tatp::Tx::random(&mut rng, scale));
                        let key = match &tx {
                            Some(tx) => tatp::subscriber_key(tx.subscriber()),
                            None if a.structure == "queue" => j,
                            None => rng.gen_range(0..key_space),
                        };
                        if map.of(key) != i {
                            continue;
                        }
                        let t = Instant::now();
                        match &tx {
                            Some(tx) => {
                                let out = p
                                    .with_key(key, |d, r| match d {
                                        Ds::Tatp(db) => db.execute(r, tx),
                                        _ => unreachable!(),
                                    })
                                    .map_err(e)?;
                                aborted += (out == Outcome::Aborted) as u64;
                            }
                            None => p.with_key(key, |d, r| d.put(r, key, &value)).map_err(e)?,
                        }
                        hist.record(t.elapsed().as_nanos().max(1) as u64).expect("in bounds");
                        ops += 1;
                    }
                    // The last batch is part of the work.
                    p.flush().map_err(e)?;
                    let end = Instant::now();
                    let counters = p.counters()[i].clone().expect("held").since(&before);
                    p.close().map_err(e)?;
                    Ok(Share {
                        ops,
                        aborted,
                        start,
                        end,
                        counters,
                        hist,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a front-end thread panicked".into())))
            .collect()
    });
    let shares: Vec<Share> = results.into_iter().collect::<Result<_, _>>()?;
    // Wall time: from the first front-end's start to the last one's end.
    let t0 = shares.iter().map(|s| s.start).min().expect("n >= 1");
    let t1 = shares.iter().map(|s| s.end).max().expect("n >= 1");
    let secs = t1.duration_since(t0).as_secs_f64().max(1e-9);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    let mut total = Counters::default();
    for s in &shares {
        hist.add(&s.hist).expect("same bounds");
        total = add(&total, &s.counters);
    }
    let per_partition = shares
        .iter()
        .enumerate()
        .map(|(i, s)| PartResult {
            partition: i,
            ops: s.ops,
            ops_per_sec: s.ops as f64 / s.end.duration_since(s.start).as_secs_f64().max(1e-9),
            round_trips_per_op: s.counters.round_trips as f64 / s.ops.max(1) as f64,
            p50_ns: s.hist.value_at_quantile(0.5),
            p99_ns: s.hist.value_at_quantile(0.99),
        })
        .collect();
    let structure = if app { "bptree" } else { a.structure.as_str() };
    Ok(AsymResult {
        app: a.app.clone(),
        aborted: app.then(|| shares.iter().map(|s| s.aborted).sum()),
        partitions: n,
        per_partition: Some(per_partition),
        ..AsymResult::measured(structure, mode, a.ops, secs, &total, &hist)
    })
}

/// The sum of two counters (round trips, verbs, bytes).
fn add(a: &Counters, b: &Counters) -> Counters {
    let mut out = a.clone();
    out.round_trips += b.round_trips;
    out.retransmits += b.retransmits;
    out.bytes_sent += b.bytes_sent;
    out.bytes_received += b.bytes_received;
    for (o, v) in out.verbs.iter_mut().zip(b.verbs.iter()) {
        *o += v;
    }
    out
}
