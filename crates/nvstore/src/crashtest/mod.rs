//! Crash-consistency campaigns (README, "How crash safety is shown").
//!
//! A campaign runs a seeded workload against a [`Db`](crate::Db) on the crash simulator
//! ([`SimSpace`](crate::pmem::SimSpace)) with image capture on, so every fence and every operation
//! boundary yields the images a machine could hold after a crash there. Every
//! new image (deduplicated across the whole campaign by content hash) is
//! recovered and checked:
//!
//! - **recovery** succeeds (only a pool whose creation was not acknowledged
//!   may say "not a pool");
//! - **durable linearizability** against a `BTreeMap` model: every
//!   acknowledged operation is present, each in-flight one present or absent
//!   as a whole, nothing else; point gets agree with a full scan and `len()`;
//! - **structure**: `check()` is ok (leaf chain = index, bounds, counts,
//!   allocator coverage: no leak, no double use);
//! - **crash during recovery**: capture stays on while the image is
//!   recovered, and the images recovery itself produces (clearing the clean
//!   flag, creating the first leaf) are recovered and checked the same way;
//! - on a seeded sample of images (1 in [`Config::sample_every`]): **recovery
//!   twice** (crash right after recovery, recover again: same contents, check
//!   ok) and **work continues** (eight random operations on the recovered
//!   pool against the model, then a scan and `check()`).
//!
//! Besides the simulator's images, after every acknowledged operation the
//! persisted image alone must recover to exactly the model (an acknowledged
//! write is durable: this strict check runs before the same bytes are seen
//! as an operation-boundary image), and after an acknowledged clean close it
//! must also recover *instantly* (the clean-shutdown promise). A [`Probe`]
//! wrapped around the simulator adds "publish-first" images: the persisted
//! data plus the latest atomic store of the fencing thread, i.e. the
//! publishing word reached memory before anything else in flight. The
//! simulator's random subsets almost never pick that combination when dozens
//! of lines are in flight (the saved state of a clean shutdown).
//!
//! # Workload
//!
//! Biased toward rare paths: 256-byte leaves (six elements), so splits,
//! replaces and merges happen every few operations; phases of 400 operations
//! (fill, churn, drain); a sliding window of ascending keys (inserted at its
//! right end while filling: splits pile up in one PLN and overflow it, index
//! rebuild; deleted from its left end while draining: replaces and merges);
//! deletes of absent keys; inline keys, long keys in blobs that all share
//! their first 8 bytes, edge keys (empty, `0xff..`, the 8-byte prefix of the
//! long keys); values from empty to 240 bytes, about 20 KB, and 66–150 KB
//! (runs of two or three chunks, freed and carved again smaller); a clean
//! close with instant reopen about every 90 operations and a power failure
//! (reopen from the persisted bytes) about every 200, both outside fill
//! phases; a fresh pool every 800 operations (creation is checked too, and
//! the tree grows from one leaf again). With `threads = 2` two writers own
//! disjoint, interleaved key sets and run one operation each per round,
//! started together at a barrier; images captured during a round may hold
//! any subset of the round's operations.
//!
//! The main line runs the workload and queues images; [`Config::check_threads`]
//! threads recover and check them meanwhile. With one writer and one checker
//! thread a campaign is reproducible from its seed; otherwise the operations
//! are, and which of two identical images is checked first is not.
//!
//! # Checking the checker
//!
//! With [`Config::drop`] naming a point, every flush or fence of that name
//! does nothing (on the main line and in every recovered pool). The
//! self-test (`tests/crash.rs`, `every_dropped_point_is_caught`) runs a
//! campaign per point and requires violations. Every point is caught except:
//!
//! - `nv.link.fence`: the sibling-pointer store of a split is flushed, and
//!   the same operation's next fence (the append that follows every split)
//!   persists it before the operation is acknowledged and before this thread
//!   can reuse a block the swap retired. It guards against another thread
//!   reusing a retired leaf (after an epoch advance) inside that window,
//!   which no campaign provokes. Keep it: without it, safety would rest on
//!   every caller of `split` fencing soon after.
//!
//! Two points are caught only through a promise rather than lost data:
//! `header.root.fence` (the clean flag of an acknowledged close is never
//! fenced, so the next open rebuilds instead of loading the saved state)
//! and, in the first close of a pool, `shutdown.state.flush` (later closes
//! recover a stale saved state: lost writes).

mod campaign;
mod model;
mod op;
mod probe;
mod verify;
mod workload;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Once};
use std::time::Instant;

use parking_lot::Mutex;

use crate::format::header::{EngineKind, LeafKind};
use crate::pmem::points;

pub use probe::{Image, Probe};

use campaign::{check_worker, split_race, Campaign, Done, Shared, Task};
use op::keys_per_thread;
use verify::Env;

/// Settings of one campaign.
#[derive(Clone, Debug)]
pub struct Config {
    /// Operations (with two threads: operations of all threads together).
    pub ops: u64,
    pub seed: u64,
    /// Writer threads: 1 or 2.
    pub threads: usize,
    /// Persistence point to drop (the checker's self-test).
    pub drop: Option<String>,
    /// Engine of the pool (tree: leaves of `leaf`; hash: the table).
    pub engine: EngineKind,
    /// Leaf format of the pool (tree pools).
    pub leaf: LeafKind,
    /// Leaf node size in bytes (small: splits and merges happen often).
    pub node_size: u32,
    /// Initial pool size in bytes (the pool grows on demand).
    pub pool_size: u64,
    /// Distinct keys, shared out among the writers.
    pub keys: u32,
    /// Recover-twice and work-continues checks on 1 in this many images (0: never).
    pub sample_every: u64,
    /// Random subset images per capture (simulator setting).
    pub random_subsets: usize,
    /// Torn-word images per capture (simulator setting).
    pub torn: usize,
    /// Add the publish-first images of [`Probe`].
    pub publish_first: bool,
    /// Stop once this many violations were found (0: never stop early).
    pub stop_after: u64,
    /// Violations described in [`Report::violation_details`].
    pub max_details: usize,
    /// Threads that recover and check images (0: one per core).
    pub check_threads: usize,
    /// Make one op in four a write batch or transaction over several keys,
    /// which must be all or nothing in every image.
    pub txn: bool,
    /// Workload-adaptive sizing on the main line (also after every
    /// reopen): leaves of several sizes then coexist in every image.
    pub adaptive: crate::Adaptive,
}

impl Config {
    /// Node size a campaign uses unless told: small, so splits and merges
    /// are frequent; for isle large enough that line codes span two header
    /// words (pairs then move between words).
    pub fn default_node_size(leaf: LeafKind) -> u32 {
        match leaf {
            LeafKind::Nv => 256,
            LeafKind::Isle => 640,
        }
    }

    /// The default campaign for pools of `leaf`. Isle leaves hold four
    /// times the pairs of nv ones per line and deletes free room at once,
    /// so its campaign spreads over more keys to keep splits and merges
    /// as frequent.
    pub fn for_leaf(leaf: LeafKind) -> Config {
        let d = Config::default();
        Config {
            leaf,
            node_size: Config::default_node_size(leaf),
            keys: match leaf {
                LeafKind::Nv => d.keys,
                LeafKind::Isle => 300,
            },
            // A general pair is four words in one line: more torn and
            // subset samples per capture reach more of its states.
            torn: match leaf {
                LeafKind::Nv => d.torn,
                LeafKind::Isle => 24,
            },
            random_subsets: match leaf {
                LeafKind::Nv => d.random_subsets,
                LeafKind::Isle => 24,
            },
            ..d
        }
    }

    /// The default campaign for hash pools: enough keys that segments
    /// split and the directory doubles every few dozen operations (a
    /// segment holds 112 slots, and a key's two-bucket window fills
    /// first), and values that are inline, in blobs, and large.
    pub fn for_hash() -> Config {
        Config {
            engine: EngineKind::Hash,
            keys: 400,
            ..Config::default()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ops: 2000,
            seed: 7,
            threads: 1,
            drop: None,
            engine: EngineKind::Tree,
            leaf: LeafKind::Nv,
            node_size: 256,
            pool_size: 256 << 10,
            keys: 100,
            sample_every: 8,
            random_subsets: 8,
            torn: 8,
            publish_first: true,
            stop_after: 0,
            max_details: 10,
            check_threads: 0,
            txn: false,
            adaptive: crate::Adaptive::Off,
        }
    }
}

/// Structural work the campaign made the engine do (main line only).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WorkStats {
    pub puts: u64,
    pub deletes: u64,
    pub deletes_absent: u64,
    /// Deletes run while a snapshot was live (they append).
    pub deletes_pinned: u64,
    /// Updates run while a snapshot was live (they append).
    pub puts_pinned: u64,
    pub gets: u64,
    pub large_values: u64,
    pub huge_values: u64,
    /// Write batches and transactions (`txn` campaigns).
    pub txns: u64,
    pub splits: u64,
    pub replaces: u64,
    pub merges: u64,
    pub rebuilds: u64,
    pub clean_reopens: u64,
    pub power_failures: u64,
    pub max_pool_bytes: u64,
    pub max_keys: u64,
    pub max_leaves: u64,
    /// Most compact leaf entries (see `format/leaf_nv.rs`) seen in one tree
    /// when a main-line Db went away: the rewritten leaves the crash images
    /// recover carry compact prefixes.
    pub max_compact_entries: u64,
    /// Most distinct leaf sizes seen in one tree at once.
    pub max_leaf_sizes: u64,
    /// Pools created (a fresh one every 800 operations).
    pub pools: u64,
}

/// What a campaign found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    /// "tree" or "hash".
    pub engine: String,
    /// Tree pools: the leaf format; hash pools: "none".
    pub leaf: String,
    pub ops: u64,
    pub seed: u64,
    pub threads: usize,
    pub drop: Option<String>,
    /// Distinct crash images recovered and checked.
    pub crash_states: u64,
    pub violations: u64,
    /// Every persistence point the campaign reached (main line and recoveries).
    pub points_covered: Vec<String>,
    /// First violations, each saying seed, operation, crash point, image kind and what was wrong.
    pub violation_details: Vec<String>,
    pub seconds: f64,
    /// Operations actually run (fewer than `ops` when stopped early).
    pub ops_done: u64,
    pub crash_states_per_sec: f64,
    /// Checked images by kind (persisted, all-in-flight, subset, torn,
    /// publish-first, acked, and `recovery:`-prefixed ones captured while
    /// recovering an image).
    pub images_by_kind: BTreeMap<String, u64>,
    /// Images that also got the recover-twice and work-continues checks.
    pub sampled: u64,
    /// How often the dropped point was skipped, on the main line and in
    /// recovered pools.
    pub drop_hits: u64,
    pub work: WorkStats,
    /// Isle pools: recoveries that repaired a leaf, by kind.
    pub isle_repairs: IsleRepairs,
}

/// Crash states of isle leaves that recovery repairs (counted over the
/// campaign's recoveries).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IsleRepairs {
    /// A split in place was cut short after its link: the old leaf's codes
    /// still named the pairs it moved on.
    pub stale_dropped: u64,
    /// An update that moved a pair between code words was cut short: the
    /// key was live twice.
    pub duplicates_dropped: u64,
}

/// Names of every persistence point (`nvstore crashtest --list-points`).
pub fn list_points() -> Vec<&'static str> {
    points::ALL.iter().map(|p| p.name).collect()
}

/// The points a tree pool of leaf format `leaf` uses (an isle pool never
/// appends nv elements nor runs transactions; an nv pool never touches isle
/// lines; neither touches a hash table).
pub fn points_for(leaf: LeafKind) -> Vec<&'static str> {
    list_points()
        .into_iter()
        .filter(|p| !p.starts_with("hash."))
        .filter(|p| match leaf {
            LeafKind::Nv => !p.starts_with("isle."),
            LeafKind::Isle => {
                !(p.starts_with("nv.element.")
                    || p.starts_with("nv.compact.")
                    || p.starts_with("nv.gone.")
                    || p.starts_with("shutdown.counts.")
                    || p.starts_with("txn.")
                    || *p == "blob.fence")
            }
        })
        .collect()
}

/// The points a hash pool uses: the header's, the allocator's chunk
/// headers and the table's own (no leaves, no saved state: its clean close
/// is one header root store).
pub fn points_for_hash() -> Vec<&'static str> {
    list_points()
        .into_iter()
        .filter(|p| p.starts_with("hash.") || p.starts_with("header.") || p.starts_with("chunk."))
        .collect()
}

/// The points a campaign of `cfg` can reach.
pub fn points_for_config(cfg: &Config) -> Vec<&'static str> {
    match cfg.engine {
        EngineKind::Tree => points_for(cfg.leaf),
        EngineKind::Hash => points_for_hash(),
    }
}

fn isle_repairs_now() -> (u64, u64) {
    use crate::tree::isle::{DUPLICATES_DROPPED, STALE_DROPPED};
    (
        STALE_DROPPED.load(Ordering::Relaxed),
        DUPLICATES_DROPPED.load(Ordering::Relaxed),
    )
}

/// Runs a campaign.
pub fn run(cfg: &Config) -> Report {
    install_quiet_hook();
    crate::pmem::os::keep_freed_memory();
    QUIET.fetch_add(1, Ordering::SeqCst);
    campaign_thread(true);
    let t = Instant::now();
    let repairs0 = isle_repairs_now();
    let shared = Shared::default();
    let env = Env {
        cfg,
        keys_per_thread: keys_per_thread(cfg),
    };
    let workers = match cfg.check_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // Bounded: the main line waits when the checkers fall behind.
    let (tx, rx) = mpsc::sync_channel::<Task>(4 * workers);
    let rx = Mutex::new(rx);
    let (c, done) = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (env, shared, rx) = (&env, &shared, &rx);
                sc.spawn(move || check_worker(env, shared, rx))
            })
            .collect();
        let mut c = Campaign::new(cfg, &shared, tx);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| c.run())) {
            let msg = format!("campaign aborted by a panic: {}", panic_msg(&p));
            c.violation(c.op_index, "campaign", msg, true);
        }
        c.close();
        let mut done = Done::default();
        for h in handles {
            match h.join() {
                Ok(d) => done.merge(d),
                Err(p) => c.violation(
                    c.op_index,
                    "checker",
                    format!("checker panicked: {}", panic_msg(&p)),
                    true,
                ),
            }
        }
        (c, done)
    });
    QUIET.fetch_sub(1, Ordering::SeqCst);
    campaign_thread(false);
    let seconds = t.elapsed().as_secs_f64();
    let mut r = c.report;
    r.ops_done = c.op_index;
    r.seconds = seconds;
    r.crash_states = done.states;
    r.crash_states_per_sec = if seconds > 0.0 {
        r.crash_states as f64 / seconds
    } else {
        0.0
    };
    for k in done.kinds {
        *r.images_by_kind.entry(k).or_default() += 1;
    }
    r.sampled = done.sampled;
    r.drop_hits += done.drop_hits;
    let repairs1 = isle_repairs_now();
    r.isle_repairs = IsleRepairs {
        stale_dropped: repairs1.0 - repairs0.0,
        duplicates_dropped: repairs1.1 - repairs0.1,
    };
    let mut points = c.points;
    points.extend(done.points);
    r.points_covered = points.iter().map(|p| p.to_string()).collect();
    let mut findings = c.findings;
    findings.extend(done.findings);
    findings.sort_by_key(|f| (f.0, f.1));
    // A concurrent-split window the op-by-op campaign cannot reach (tree
    // pools: a hash table's writers are serialised, and its split swaps a
    // whole new directory in by one root store).
    let (race_states, race_findings) = match cfg.engine {
        EngineKind::Tree => split_race(cfg),
        EngineKind::Hash => (0, Vec::new()),
    };
    r.crash_states += race_states;
    r.violations = findings.len() as u64 + race_findings.len() as u64;
    let race_details: Vec<String> = race_findings
        .iter()
        .map(|w| format!("seed {}: {w}", cfg.seed))
        .collect();
    r.violation_details = race_details
        .into_iter()
        .chain(findings.iter().take(cfg.max_details).map(|(_, _, ctx, what)| {
            format!(
                "seed {} op {} ({}), crash point {}, image {}: {}",
                cfg.seed, ctx.op, ctx.what, ctx.point, ctx.kind, what
            )
        }))
        .take(cfg.max_details)
        .collect();
    r
}

// ---------------------------------------------------------------------------
// Quiet panics: a violation often shows as a panic inside the engine while
// recovering a bad image; it is caught and reported, not printed.

static QUIET: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the campaign's own threads (main line, writer, checkers).
    static CAMPAIGN_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as a campaign thread (its engine panics are
/// caught and reported, not printed).
fn campaign_thread(on: bool) {
    CAMPAIGN_THREAD.with(|c| c.set(on));
}

/// Silences engine panics on campaign threads, and on unnamed threads (the
/// recovery's scan threads) while a campaign runs; everything else (a test's
/// own assertion, another test's thread) prints as usual.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let engine = info
                .location()
                .is_some_and(|l| l.file().contains("nvstore/src/") && !l.file().contains("src/crashtest/"));
            let ours = CAMPAIGN_THREAD.with(|c| c.get())
                || (QUIET.load(Ordering::SeqCst) > 0 && std::thread::current().name().is_none());
            if engine && ours {
                return;
            }
            prev(info)
        }));
    });
}

fn panic_msg(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_campaign_runs_clean() {
        let r = run(&Config {
            ops: 150,
            ..Config::default()
        });
        assert_eq!(r.violations, 0, "{:#?}", r.violation_details);
        assert!(r.crash_states > 100, "{r:?}");
    }
}
