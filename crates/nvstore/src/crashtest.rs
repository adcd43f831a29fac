//! Crash-consistency campaigns (README, "How crash safety is shown").
//!
//! A campaign runs a seeded workload against a [`Db`] on the crash simulator
//! ([`SimSpace`]) with image capture on, so every fence and every operation
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Once};
use std::time::Instant;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::db::{Db, Options};
use crate::error::{Error, Result};
use crate::format::header::LeafFormat;
use crate::format::leaf_nv;
use crate::pmem::sim::CaptureConfig;
use crate::pmem::{points, FlushKind, MappingKind, Point, SimSpace, Space};
use crate::recovery::RecoveryKind;
use crate::txn::WriteBatch;

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
    /// Leaf format of the pool.
    pub leaf: LeafFormat,
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
    pub fn default_node_size(leaf: LeafFormat) -> u32 {
        match leaf {
            LeafFormat::Nv => 256,
            LeafFormat::Isle => 640,
        }
    }

    /// The default campaign for pools of `leaf`. Isle leaves hold four
    /// times the pairs of nv ones per line and deletes free room at once,
    /// so its campaign spreads over more keys to keep splits and merges
    /// as frequent.
    pub fn for_leaf(leaf: LeafFormat) -> Config {
        let d = Config::default();
        Config {
            leaf,
            node_size: Config::default_node_size(leaf),
            keys: match leaf {
                LeafFormat::Nv => d.keys,
                LeafFormat::Isle => 300,
            },
            // A general pair is four words in one line: more torn and
            // subset samples per capture reach more of its states.
            torn: match leaf {
                LeafFormat::Nv => d.torn,
                LeafFormat::Isle => 24,
            },
            random_subsets: match leaf {
                LeafFormat::Nv => d.random_subsets,
                LeafFormat::Isle => 24,
            },
            ..d
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
            leaf: LeafFormat::Nv,
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

/// The points a pool of leaf format `leaf` uses (an isle pool never
/// appends nv elements nor runs transactions; an nv pool never touches isle
/// lines).
pub fn points_for(leaf: LeafFormat) -> Vec<&'static str> {
    list_points()
        .into_iter()
        .filter(|p| match leaf {
            LeafFormat::Nv => !p.starts_with("isle."),
            LeafFormat::Isle => {
                !(p.starts_with("nv.element.") || p.starts_with("shutdown.counts.") || p.starts_with("txn."))
            }
        })
        .collect()
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
    keep_freed_memory();
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
    // A concurrent-split window the op-by-op campaign cannot reach.
    let (race_states, race_findings) = split_race(cfg);
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

/// The split race (docs/design.md, "the publish rule", rule 3): a split publishes its new leaves to
/// other threads when it releases its locks. If the link store that swaps
/// them into the chain were not yet fenced, another writer could append to a
/// new leaf, fence its own element and count, and acknowledge, while a crash
/// still finds the old chain and loses that write. The op-by-op campaign
/// never runs a second writer inside that window, so this probe does: a
/// split hook runs another thread's put into the new right leaf, then takes
/// the crash image of that instant (persisted data only) and checks that the
/// acknowledged put survives recovery. Returns (crash states, violations).
fn split_race(cfg: &Config) -> (u64, Vec<String>) {
    use std::sync::Mutex as StdMutex;
    let sim = crate::pmem::SimSpace::new(1 << 20);
    sim.set_drop(cfg.drop.clone());
    let opts = crate::db::Options {
        node_size: 256,
        size: 1 << 20,
        leaf: cfg.leaf,
        ..crate::db::Options::default()
    };
    let db = match Db::create_in(sim, Path::new("split-race"), &opts) {
        Ok(db) => Arc::new(db),
        Err(e) => return (0, vec![format!("split race: cannot create the pool: {e}")]),
    };
    let key = |i: u64| (i * 10).to_be_bytes();
    // A 256-byte leaf holds 6 elements: fill it; the 7th put splits it.
    for i in 1..=6 {
        if let Err(e) = db.put(&key(i), b"v") {
            return (0, vec![format!("split race: put failed: {e}")]);
        }
    }
    let image: Arc<StdMutex<Option<Vec<u8>>>> = Arc::default();
    let (db2, img2) = (Arc::clone(&db), Arc::clone(&image));
    db.set_split_hook(Some(Arc::new(move || {
        let mut slot = img2.lock().unwrap();
        if slot.is_some() {
            return;
        }
        // Another writer, on its own thread, puts into the new right leaf.
        let db3 = Arc::clone(&db2);
        let acked = std::thread::spawn(move || db3.put(&55u64.to_be_bytes(), b"acked").is_ok()).join();
        if acked.unwrap_or(false) {
            *slot = Some(db2.space().persisted_image());
        }
    })));
    let split_put = db.put(&key(7), b"v");
    db.set_split_hook(None);
    let taken = image.lock().unwrap().take();
    let mut problems = Vec::new();
    if let Err(e) = split_put {
        problems.push(format!("split race: the splitting put failed: {e}"));
    }
    let Some(img) = taken else {
        problems.push("split race: the split hook did not run".into());
        return (0, problems);
    };
    match catch_unwind(AssertUnwindSafe(|| {
        Db::open_space(crate::pmem::SimSpace::from_image(img), Path::new("split-race"))
    })) {
        Ok(Ok(rec)) => {
            let got = rec.get(&55u64.to_be_bytes()).ok().flatten();
            if got.as_deref() != Some(&b"acked"[..]) {
                problems.push(
                    "split race, crash point after another writer's acknowledged put into a freshly split leaf, \
                     image persisted: the acknowledged put is missing after recovery"
                        .into(),
                );
            }
            std::mem::forget(rec);
        }
        Ok(Err(e)) => problems.push(format!("split race: recovery failed: {e}")),
        Err(p) => problems.push(format!("split race: recovery panicked: {}", panic_msg(&p))),
    }
    // Break the hook's reference cycle and skip the clean close (a crash test pool).
    std::mem::forget(db);
    (1, problems)
}

// ---------------------------------------------------------------------------
// Probe: the simulator plus publish-first images.

/// One crash image to check.
#[derive(Clone)]
pub struct Image {
    pub kind: &'static str,
    /// Fence the image was captured before, `op-boundary`, or a campaign
    /// label (`acked`, `closed`).
    pub point: &'static str,
    pub data: Vec<u8>,
}

#[derive(Default)]
struct ProbeState {
    /// Offset of each thread's latest atomic store since its last fence.
    last_store: HashMap<std::thread::ThreadId, u64>,
    queue: Vec<Image>,
}

/// A [`SimSpace`] that also generates publish-first images: at a fence,
/// when more lines are in flight than the simulator images exhaustively,
/// the persisted image plus the current value of the fencing thread's latest
/// atomic store (a legal crash state: that word reached memory first).
pub struct Probe {
    pub sim: SimSpace,
    publish_first: bool,
    capture: std::sync::atomic::AtomicBool,
    /// Reports the space read-only, so dropping a checked Db does not
    /// write a clean shutdown (nothing would look at it).
    read_only: std::sync::atomic::AtomicBool,
    state: Mutex<ProbeState>,
}

impl Probe {
    pub fn new(sim: SimSpace, publish_first: bool) -> Probe {
        Probe {
            sim,
            publish_first,
            capture: Default::default(),
            read_only: Default::default(),
            state: Mutex::new(ProbeState::default()),
        }
    }

    /// Turns capture on or off, in the simulator and here.
    pub fn set_capture(&self, cfg: Option<CaptureConfig>) {
        self.capture.store(cfg.is_some(), Ordering::SeqCst);
        self.sim.set_capture(cfg);
        if cfg.is_none() {
            self.state.lock().last_store.clear();
        }
    }

    /// Drains the simulator's images and the publish-first ones.
    pub fn take_images(&self) -> Vec<Image> {
        let mut out: Vec<Image> = self
            .sim
            .take_images()
            .into_iter()
            .map(|i| Image {
                kind: i.kind.as_str(),
                point: i.point,
                data: i.data,
            })
            .collect();
        out.append(&mut self.state.lock().queue);
        out
    }

    /// Makes [`Space::writable`] false from now on.
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Relaxed);
    }

    fn capturing(&self) -> bool {
        self.publish_first && self.capture.load(Ordering::Relaxed)
    }
}

impl Space for Probe {
    fn size(&self) -> u64 {
        self.sim.size()
    }
    fn load(&self, off: u64) -> u64 {
        self.sim.load(off)
    }
    fn store(&self, off: u64, val: u64) {
        self.sim.store(off, val);
        if self.capturing() {
            self.state.lock().last_store.insert(std::thread::current().id(), off);
        }
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        self.sim.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) {
        self.sim.write(off, data)
    }
    fn zero(&self, off: u64, len: u64) {
        self.sim.zero(off, len)
    }
    fn flush(&self, off: u64, len: u64, point: Point) {
        self.sim.flush(off, len, point)
    }
    fn fence(&self, point: Point) {
        if self.capturing() {
            let last = self.state.lock().last_store.remove(&std::thread::current().id());
            // With four lines or fewer in flight the simulator images every
            // combination already.
            if let Some(off) = last.filter(|_| self.sim.in_flight_lines() > 4) {
                let mut data = self.sim.persisted_image();
                let cur = self.sim.load(off);
                data[off as usize..off as usize + 8].copy_from_slice(&cur.to_le_bytes());
                self.state.lock().queue.push(Image {
                    kind: "publish-first",
                    point: point.name,
                    data,
                });
            }
        }
        self.sim.fence(point)
    }
    fn grow(&self, new_size: u64) -> Result<()> {
        self.sim.grow(new_size)
    }
    fn op_boundary(&self) {
        self.sim.op_boundary()
    }
    fn writable(&self) -> bool {
        !self.read_only.load(Ordering::Relaxed) && self.sim.writable()
    }
    fn flush_kind(&self) -> FlushKind {
        self.sim.flush_kind()
    }
    fn mapping(&self) -> MappingKind {
        self.sim.mapping()
    }
    fn sync(&self) -> Result<()> {
        self.sim.sync()
    }
}

/// A campaign allocates and frees several pool-sized buffers per crash
/// image. glibc returns freed memory above 2x the last mmap threshold to
/// the kernel (a thread arena even with `madvise` on every free), so every
/// image paid page faults for fresh zeroed pages: half the run time. Keep
/// freed memory in the process instead (process-wide, set once; affects
/// only how much memory glibc caches, not behaviour).
fn keep_freed_memory() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        #[allow(unsafe_code)]
        // SAFETY: mallopt only changes allocator tuning parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        }
    });
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
                .is_some_and(|l| l.file().contains("nvstore/src/") && !l.file().ends_with("crashtest.rs"));
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

// ---------------------------------------------------------------------------
// Workload.

type Val = Arc<Vec<u8>>;
type Model = BTreeMap<Vec<u8>, Val>;

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Val),
    Del(Vec<u8>),
    Get(Vec<u8>),
    /// A write batch (`None`: delete) over distinct keys: all or nothing.
    Batch(Vec<(Vec<u8>, Option<Val>)>),
    /// A transaction that reads each key, then writes it as given.
    Txn(Vec<(Vec<u8>, Option<Val>)>),
}

impl Op {
    /// The model changes this op makes (all or none of them).
    fn effect(&self) -> Vec<(Vec<u8>, Option<Val>)> {
        match self {
            Op::Put(k, v) => vec![(k.clone(), Some(v.clone()))],
            Op::Del(k) => vec![(k.clone(), None)],
            Op::Get(_) => Vec::new(),
            Op::Batch(w) | Op::Txn(w) => w.clone(),
        }
    }
    fn describe(&self) -> String {
        let many = |what: &str, w: &[(Vec<u8>, Option<Val>)]| {
            let ks: Vec<String> = w
                .iter()
                .map(|(k, v)| format!("{}{}", if v.is_some() { "+" } else { "-" }, show(k)))
                .collect();
            format!("{what} [{}]", ks.join(" "))
        };
        match self {
            Op::Put(k, v) => format!("put {} ({} B value)", show(k), v.len()),
            Op::Del(k) => format!("delete {}", show(k)),
            Op::Get(k) => format!("get {}", show(k)),
            Op::Batch(w) => many("write batch", w),
            Op::Txn(w) => many("transaction", w),
        }
    }
}

/// Printable key: text when it is, hex otherwise; long keys shortened.
fn show(k: &[u8]) -> String {
    let s = if !k.is_empty() && k.iter().all(|b| b.is_ascii_graphic()) {
        format!("\"{}\"", String::from_utf8_lossy(k))
    } else {
        let h: String = k.iter().map(|b| format!("{b:02x}")).collect();
        format!("0x{h}")
    };
    if s.len() > 48 {
        format!("{}..({} B)", &s[..40], k.len())
    } else {
        s
    }
}

/// Key `id` of writer `t`. Writers' keys are disjoint but interleave in key
/// order, so they share leaves. Kinds: 8-byte big-endian integers (inline,
/// exactly one word), short text keys, long keys (in a blob) that all share
/// their first 8 bytes "longkey/" (so the inline key word never decides),
/// and for writer 0 a few edge keys.
fn key_of(t: usize, id: u32) -> Vec<u8> {
    let n = id as u64 * 2 + t as u64;
    if t == 0 && id >= 1_000_000 {
        return match id - 1_000_000 {
            0 => Vec::new(),
            1 => b"longkey/".to_vec(),
            2 => b"longkey".to_vec(),
            3 => vec![0xff; 9],
            _ => vec![0xff; 8],
        };
    }
    match id % 10 {
        0..=4 => (n * 0x0101).to_be_bytes().to_vec(),
        5..=7 => format!("s{n}").into_bytes(),
        _ => format!("longkey/{n:05}/{}", "x".repeat((n % 29) as usize)).into_bytes(),
    }
}

const EDGE_KEYS: u32 = 5;

/// Key `j` of writer `t`'s sliding window: 8 bytes, "w" then the big-endian
/// index, so a writer's window keys ascend with `j` and interleave with the
/// other writer's.
fn window_key(t: usize, j: u64) -> Vec<u8> {
    let mut k = (j * 2 + t as u64).to_be_bytes();
    k[0] = b'w';
    k.to_vec()
}

/// Value of length `len` unique to operation `g` (when long enough).
fn value_of(g: u64, len: usize) -> Vec<u8> {
    let tag = (g.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5bd1_e995).to_le_bytes();
    (0..len)
        .map(|i| {
            if i < 8 {
                tag[i]
            } else {
                (i as u64 ^ g).wrapping_mul(31) as u8
            }
        })
        .collect()
}

/// Workload phases, cycling every 400 operations: fill (grow the tree:
/// splits and index rebuilds), churn, drain (delete-heavy: replaces and
/// merges).
#[derive(Clone, Copy, Debug)]
enum Phase {
    Fill,
    Churn,
    Drain,
}

fn phase_of(op: u64) -> Phase {
    match op % 400 {
        0..150 => Phase::Fill,
        150..250 => Phase::Churn,
        _ => Phase::Drain,
    }
}

struct Gen {
    rng: StdRng,
    keys_per_thread: u32,
    /// Make one op in four a write batch or transaction.
    txn: bool,
    /// Isle pools: make 8-byte values common, so compact pairs and their
    /// in-place updates are exercised as much as general ones.
    compact_values: bool,
    /// Per writer: the sliding window of keys `[lo, hi)` (see [`window_key`]).
    window: [(u64, u64); 2],
}

impl Gen {
    fn pick_id(&mut self, t: usize) -> u32 {
        if t == 0 && self.rng.gen_ratio(1, 40) {
            1_000_000 + self.rng.gen_range(0..EDGE_KEYS)
        } else {
            self.rng.gen_range(0..self.keys_per_thread)
        }
    }

    /// A small value. Few distinct blob size classes keep the pool small
    /// (each class takes a chunk) and so the images cheap: blobs of 64,
    /// 128, 192 and 256 bytes (the last shared with the 256-byte leaves).
    fn value(&mut self, g: u64) -> Val {
        let r = self.rng.gen_range(0..1000);
        // Short values are often exactly 8 bytes: with an 8-byte key, an nv
        // rewrite stores the element compact, an isle leaf a compact pair.
        let len = if r < if self.compact_values { 400 } else { 275 } {
            8
        } else if r < 550 {
            self.rng.gen_range(0..=8)
        } else if r < 800 {
            self.rng.gen_range(9..=40)
        } else if r < 920 {
            self.rng.gen_range(100..=180)
        } else {
            self.rng.gen_range(200..=240)
        };
        Arc::new(value_of(g, len))
    }

    /// Next operation of writer `t` given the model (`g` numbers it).
    fn op(&mut self, t: usize, g: u64, phase: Phase, model: &Model, stats: &mut WorkStats) -> Op {
        let (new, upd, del, absent) = match phase {
            Phase::Fill => (70, 15, 5, 5),
            Phase::Churn => (30, 30, 25, 5),
            Phase::Drain => (8, 10, 67, 10),
        };
        // Big values on a few keys, so they are soon overwritten or
        // deleted and their blocks freed: about 20 KB (one size class, a
        // slab of two chunks), and over 64 KiB on one key (a run of two or
        // three whole chunks; once freed, a smaller run carved where a
        // larger one was puts a chunk header where value bytes were:
        // chunk.header.fence). The pool stays within 2 MiB.
        let big = self.rng.gen_range(0..1000);
        if t == 0 && big < 12 {
            stats.puts += 1;
            stats.huge_values += 1;
            let len = if self.rng.gen_bool(0.5) {
                self.rng.gen_range(66_000..72_000)
            } else {
                self.rng.gen_range(135_000..150_000)
            };
            return Op::Put(key_of(0, 0), Arc::new(value_of(g, len)));
        }
        if big < 30 {
            stats.puts += 1;
            stats.large_values += 1;
            let len = self.rng.gen_range(19_000..20_400);
            return Op::Put(key_of(t, self.rng.gen_range(0..4)), Arc::new(value_of(g, len)));
        }
        if self.txn && self.rng.gen_ratio(1, 4) {
            // Several of the writer's keys, usually in different leaves;
            // puts and deletes of present and absent keys.
            let mut w: Vec<(Vec<u8>, Option<Val>)> = Vec::new();
            for _ in 0..self.rng.gen_range(2..=6) {
                let k = key_of(t, self.pick_id(t));
                if w.iter().any(|(x, _)| *x == k) {
                    continue;
                }
                let del = match phase {
                    Phase::Fill => self.rng.gen_ratio(1, 6),
                    Phase::Churn => self.rng.gen_ratio(1, 3),
                    Phase::Drain => self.rng.gen_ratio(2, 3),
                };
                w.push((k, (!del).then(|| self.value(g))));
            }
            stats.txns += 1;
            return if self.rng.gen_bool(0.5) {
                Op::Batch(w)
            } else {
                Op::Txn(w)
            };
        }
        let r = self.rng.gen_range(0..100);
        // Find a key present (or absent) in the model, a few tries.
        let find = |want_present: bool, gen: &mut Gen| {
            for _ in 0..12 {
                let id = gen.pick_id(t);
                let k = key_of(t, id);
                if model.contains_key(&k) == want_present {
                    return Some((id, k));
                }
            }
            None
        };
        // The sliding window: most inserts while filling append to it in
        // ascending key order (splits pile up at its right end and overflow
        // one PLN: index rebuilds), most deletes while draining take its
        // oldest keys (emptied leaves at its left end: replaces, merges).
        let window_share = match phase {
            Phase::Fill => 0.7,
            Phase::Churn => 0.3,
            Phase::Drain => 0.7,
        };
        if r < new && !matches!(phase, Phase::Drain) && self.rng.gen_bool(window_share) {
            let k = window_key(t, self.window[t].1);
            self.window[t].1 += 1;
            stats.puts += 1;
            let v = self.value(g);
            return Op::Put(k, v);
        }
        if (new + upd..new + upd + del).contains(&r) && self.rng.gen_bool(window_share) {
            let (lo, hi) = &mut self.window[t];
            while *lo < *hi {
                let k = window_key(t, *lo);
                *lo += 1;
                if model.contains_key(&k) {
                    stats.deletes += 1;
                    return Op::Del(k);
                }
            }
        }
        if r < new + upd {
            let want_present = r >= new;
            let (_, k) = find(want_present, self).unwrap_or_else(|| {
                let id = self.pick_id(t);
                (id, key_of(t, id))
            });
            stats.puts += 1;
            let v = self.value(g);
            Op::Put(k, v)
        } else if r < new + upd + del + absent {
            let want_present = r < new + upd + del;
            let (_, k) = find(want_present, self).unwrap_or_else(|| {
                let id = self.pick_id(t);
                (id, key_of(t, id))
            });
            if model.contains_key(&k) {
                stats.deletes += 1;
            } else {
                stats.deletes_absent += 1;
            }
            Op::Del(k)
        } else {
            stats.gets += 1;
            let id = self.pick_id(t);
            Op::Get(key_of(t, id))
        }
    }
}

// ---------------------------------------------------------------------------
// Checking one image.

/// Where an image comes from, for violation reports.
#[derive(Clone)]
struct Ctx {
    op: u64,
    what: String,
    point: &'static str,
    kind: String,
}

impl Ctx {
    fn main(op: u64, what: &str, kind: &str) -> Ctx {
        Ctx {
            op,
            what: what.into(),
            point: "-",
            kind: kind.into(),
        }
    }
}

/// The states an image may recover to: `base` with any subset of the
/// in-flight effects applied (they touch distinct keys).
#[derive(Clone)]
struct Allowed {
    base: Arc<Model>,
    /// Per in-flight op, the keys it wrote with their values before it:
    /// each op is undone whole or not at all.
    inflight: Vec<Vec<(Vec<u8>, Option<Val>)>>,
    /// The pool's creation was not acknowledged yet: "not a pool" is fine.
    creating: bool,
    /// A clean close was acknowledged: recovery must be instant.
    instant: bool,
}

impl Allowed {
    /// Exactly `base`.
    fn exactly(base: Arc<Model>) -> Allowed {
        Allowed {
            base,
            inflight: Vec::new(),
            creating: false,
            instant: false,
        }
    }

    fn candidates(&self) -> usize {
        1 << self.inflight.len()
    }

    /// Expected value of `k` in candidate `mask`.
    fn get(&self, mask: usize, k: &[u8]) -> Option<&[u8]> {
        for (i, group) in self.inflight.iter().enumerate() {
            if mask & (1 << i) == 0 {
                continue;
            }
            if let Some((_, v)) = group.iter().find(|(ik, _)| ik.as_slice() == k) {
                return v.as_ref().map(|v| v.as_slice());
            }
        }
        self.base.get(k).map(|v| v.as_slice())
    }

    fn len(&self, mask: usize) -> usize {
        let mut n = self.base.len() as i64;
        for (i, group) in self.inflight.iter().enumerate() {
            if mask & (1 << i) != 0 {
                for (k, v) in group {
                    n += v.is_some() as i64 - self.base.contains_key(k) as i64;
                }
            }
        }
        n as usize
    }

    /// Whether sorted, distinct `pairs` are exactly candidate `mask`.
    fn matches(&self, mask: usize, pairs: &[(Vec<u8>, Vec<u8>)]) -> bool {
        pairs.len() == self.len(mask) && pairs.iter().all(|(k, v)| self.get(mask, k) == Some(v.as_slice()))
    }

    fn materialize(&self, mask: usize) -> Model {
        let mut m = (*self.base).clone();
        for (i, group) in self.inflight.iter().enumerate() {
            if mask & (1 << i) != 0 {
                for (k, v) in group {
                    match v {
                        Some(v) => m.insert(k.clone(), v.clone()),
                        None => m.remove(k),
                    };
                }
            }
        }
        m
    }

    /// A short account of how `pairs` differ from the base model.
    fn diff(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> String {
        let got: BTreeMap<&[u8], &[u8]> = pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
        let mut out = Vec::new();
        for (k, v) in self.base.iter() {
            match got.get(k.as_slice()) {
                None => out.push(format!("missing {}", show(k))),
                Some(g) if *g != v.as_slice() => out.push(format!(
                    "{} has a {} B value, not the model's {} B",
                    show(k),
                    g.len(),
                    v.len()
                )),
                _ => {}
            }
            if out.len() >= 3 {
                break;
            }
        }
        for k in got.keys() {
            if out.len() >= 5 {
                break;
            }
            if !self.base.contains_key(*k) {
                out.push(format!("extra {}", show(k)));
            }
        }
        let infl: Vec<String> = self.inflight.iter().flatten().map(|(k, _)| show(k)).collect();
        format!(
            "{} pairs, model has {} (+/- in flight [{}]): {}",
            pairs.len(),
            self.base.len(),
            infl.join(", "),
            out.join("; ")
        )
    }
}

// ---------------------------------------------------------------------------
// The campaign: the main line runs the workload and submits images; checker
// threads recover and check them meanwhile.

const PATH: &str = "crashtest";

/// Operations on one pool before the campaign starts a fresh one.
const POOL_OPS: u64 = 800;

/// State shared with the checker threads.
#[derive(Default)]
struct Shared {
    /// Hashes of every image checked (or being checked).
    seen: Mutex<HashSet<u64>>,
    violations: AtomicU64,
}

/// One image to check.
struct Task {
    /// Submission order: violation reports are sorted by it.
    seq: u64,
    ctx: Ctx,
    data: Vec<u8>,
    allowed: Arc<Allowed>,
    sample: bool,
    seed: u64,
    /// Check even if an identical image was checked (under a weaker rule).
    strict: bool,
}

/// What checking one task found.
#[derive(Default)]
struct Done {
    states: u64,
    kinds: Vec<String>,
    /// (submission order, sub-order, where, what)
    findings: Vec<(u64, u64, Ctx, String)>,
    points: BTreeSet<&'static str>,
    sampled: u64,
    drop_hits: u64,
}

impl Done {
    fn merge(&mut self, o: Done) {
        self.states += o.states;
        self.kinds.extend(o.kinds);
        self.findings.extend(o.findings);
        self.points.extend(o.points);
        self.sampled += o.sampled;
        self.drop_hits += o.drop_hits;
    }
}

fn check_worker(env: &Env, shared: &Shared, tasks: &Mutex<mpsc::Receiver<Task>>) -> Done {
    campaign_thread(true);
    let mut acc = Done::default();
    loop {
        let task = tasks.lock().recv();
        let Ok(task) = task else { break };
        let d = process(env, shared, task);
        acc.merge(d);
    }
    acc
}

/// Checks a task's image and the images captured while recovering it.
fn process(env: &Env, shared: &Shared, task: Task) -> Done {
    let mut done = Done::default();
    let h = fast_hash(&task.data);
    let new = shared.seen.lock().insert(h);
    if !new && !task.strict {
        return done;
    }
    if new {
        done.states += 1;
        done.kinds.push(task.ctx.kind.clone());
    }
    let job = CheckJob {
        op: task.ctx.op,
        data: task.data,
        sample: task.sample,
        seed: task.seed,
        capture: true,
    };
    let checked = check_image(env, job, &task.allowed);
    done.points.extend(&checked.points);
    done.drop_hits += checked.drop_hits;
    done.sampled += checked.sampled as u64;
    for p in checked.problems {
        done.findings.push((task.seq, 0, task.ctx.clone(), p));
    }
    // A crash during recovery: recover the images recovery produced.
    let rec_allowed = Allowed {
        instant: false,
        ..(*task.allowed).clone()
    };
    for (i, ri) in checked.recovery_images.into_iter().enumerate() {
        if !shared.seen.lock().insert(fast_hash(&ri.data)) {
            continue;
        }
        let kind = format!("recovery:{}", ri.kind);
        done.states += 1;
        done.kinds.push(kind.clone());
        let seed = task.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let job = CheckJob {
            op: task.ctx.op,
            data: ri.data,
            sample: env.cfg.sample_every > 0 && seed.is_multiple_of(env.cfg.sample_every),
            seed,
            capture: false,
        };
        let c = check_image(env, job, &rec_allowed);
        done.points.extend(&c.points);
        done.drop_hits += c.drop_hits;
        done.sampled += c.sampled as u64;
        let ctx = Ctx {
            point: ri.point,
            kind,
            ..task.ctx.clone()
        };
        for p in c.problems {
            done.findings.push((task.seq, i as u64 + 1, ctx.clone(), p));
        }
    }
    shared
        .violations
        .fetch_add(done.findings.len() as u64, Ordering::Relaxed);
    done
}

/// Work for the second writer thread.
struct Job {
    db: Arc<Db<Probe>>,
    op: Op,
}

type OpResult = std::result::Result<Outcome, String>;

#[derive(Debug, PartialEq)]
enum Outcome {
    Put,
    Deleted(bool),
    Got(Option<Vec<u8>>),
}

fn exec(db: &Db<Probe>, op: &Op) -> OpResult {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<Outcome> {
        Ok(match op {
            Op::Put(k, v) => {
                db.put(k, v)?;
                Outcome::Put
            }
            Op::Del(k) => Outcome::Deleted(db.delete(k)?),
            Op::Get(k) => Outcome::Got(db.get(k)?),
            Op::Batch(w) => {
                let mut b = WriteBatch::new();
                for (k, v) in w {
                    match v {
                        Some(v) => b.put(k, v),
                        None => b.delete(k),
                    }
                }
                db.write_batch(b)?;
                Outcome::Put
            }
            Op::Txn(w) => {
                db.transaction(|tx| {
                    for (k, v) in w {
                        tx.get(k)?;
                        match v {
                            Some(v) => tx.put(k, v)?,
                            None => tx.delete(k)?,
                        }
                    }
                    Ok(())
                })?;
                Outcome::Put
            }
        })
    }));
    match r {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(e)) => Err(format!("error: {e}")),
        Err(p) => Err(format!("panic: {}", panic_msg(&p))),
    }
}

/// The second writer thread: runs one op per round, started together with
/// the main thread's op at a barrier.
struct Helper {
    tx: Option<mpsc::Sender<Job>>,
    rx: mpsc::Receiver<OpResult>,
    barrier: Arc<Barrier>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Helper {
    fn spawn() -> Helper {
        let (tx, jobs) = mpsc::channel::<Job>();
        let (results, rx) = mpsc::channel::<OpResult>();
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let handle = std::thread::Builder::new()
            .name("crashtest-writer-1".into())
            .spawn(move || {
                campaign_thread(true);
                while let Ok(job) = jobs.recv() {
                    b.wait();
                    let r = exec(&job.db, &job.op);
                    drop(job);
                    if results.send(r).is_err() {
                        break;
                    }
                }
            })
            .expect("spawn crashtest writer");
        Helper {
            tx: Some(tx),
            rx,
            barrier,
            handle: Some(handle),
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Campaign<'c> {
    cfg: &'c Config,
    shared: &'c Shared,
    tasks: Option<mpsc::SyncSender<Task>>,
    gen: Gen,
    /// Random choices of the checker (sampling, seeds of checks).
    check_rng: StdRng,
    model: Arc<Model>,
    db: Option<Arc<Db<Probe>>>,
    op_index: u64,
    seq: u64,
    report: Report,
    /// Violations seen by the main line itself.
    findings: Vec<(u64, u64, Ctx, String)>,
    points: BTreeSet<&'static str>,
    /// The main line cannot go on (its pool is in an unknown state).
    broken: bool,
    helper: Option<Helper>,
}

impl<'c> Campaign<'c> {
    fn new(cfg: &'c Config, shared: &'c Shared, tasks: mpsc::SyncSender<Task>) -> Campaign<'c> {
        Campaign {
            cfg,
            shared,
            tasks: Some(tasks),
            gen: Gen {
                rng: StdRng::seed_from_u64(cfg.seed),
                keys_per_thread: keys_per_thread(cfg),
                txn: cfg.txn,
                compact_values: cfg.leaf == LeafFormat::Isle,
                window: [(0, 0); 2],
            },
            check_rng: StdRng::seed_from_u64(cfg.seed ^ 0xC0FF_EE00_D15E_A5E5),
            model: Arc::new(Model::new()),
            db: None,
            op_index: 0,
            seq: 0,
            report: Report {
                leaf: cfg.leaf.as_str().into(),
                ops: cfg.ops,
                seed: cfg.seed,
                threads: cfg.threads,
                drop: cfg.drop.clone(),
                ..Report::default()
            },
            findings: Vec::new(),
            points: BTreeSet::new(),
            broken: false,
            helper: (cfg.threads >= 2).then(Helper::spawn),
        }
    }

    fn stopped(&self) -> bool {
        self.broken
            || (self.cfg.stop_after > 0 && self.shared.violations.load(Ordering::Relaxed) >= self.cfg.stop_after)
    }

    fn opts(&self) -> Options {
        Options {
            node_size: self.cfg.node_size,
            size: self.cfg.pool_size,
            leaf: self.cfg.leaf,
            adaptive: self.cfg.adaptive,
            ..Options::default()
        }
    }

    /// A main-line probe over `sim`, capturing.
    fn probe(&self, sim: SimSpace, salt: u64) -> Probe {
        let env = Env {
            cfg: self.cfg,
            keys_per_thread: self.gen.keys_per_thread,
        };
        env.probe(sim, Some(self.cfg.seed ^ salt.wrapping_mul(0x2545_F491_4F6C_DD1D)))
    }

    /// A violation seen by the main line; `fatal` stops the campaign.
    fn violation(&mut self, g: u64, what: &str, msg: String, fatal: bool) {
        self.seq += 1;
        self.findings.push((self.seq, 0, Ctx::main(g, what, "live"), msg));
        self.shared.violations.fetch_add(1, Ordering::Relaxed);
        self.broken |= fatal;
    }

    fn db(&self) -> &Arc<Db<Probe>> {
        self.db.as_ref().expect("main-line db open")
    }

    /// Counts main-line engine statistics and points before a Db goes away.
    fn harvest(&mut self, db: &Db<Probe>) {
        let st = db.tree_stats();
        let w = &mut self.report.work;
        w.splits += st.splits.load(Ordering::Relaxed);
        w.replaces += st.replaces.load(Ordering::Relaxed);
        w.merges += st.merges.load(Ordering::Relaxed);
        w.rebuilds += st.rebuilds.load(Ordering::Relaxed);
        w.max_leaves = w
            .max_leaves
            .max(db.index_leaves().iter().filter(|l| l.0 != 0).count() as u64);
        if db.leaf_format() == LeafFormat::Nv {
            let compact: u64 = (db.leaf_offsets().iter())
                .filter(|(off, _)| *off != 0)
                .map(|&(off, _)| leaf_nv::Layout::read(db.space(), off).compact)
                .sum();
            w.max_compact_entries = w.max_compact_entries.max(compact);
        }
        let sizes: BTreeSet<u64> = db.index_leaves().iter().map(|l| l.1).collect();
        w.max_leaf_sizes = w.max_leaf_sizes.max(sizes.len() as u64);
    }

    /// Statistics and points of a main-line Db about to go away.
    fn harvest_all(&mut self, db: &Db<Probe>) {
        self.harvest(db);
        self.harvest_space(db.space());
    }

    fn harvest_space(&mut self, p: &Probe) {
        self.report.drop_hits += p.sim.drop_hits();
        self.points.extend(p.sim.points_seen());
    }

    /// Queues images for the checker threads.
    fn submit(&mut self, imgs: Vec<Image>, allowed: Allowed, g: u64, what: &str, strict: bool) {
        let allowed = Arc::new(allowed);
        for img in imgs {
            if self.stopped() {
                return;
            }
            self.seq += 1;
            let task = Task {
                seq: self.seq,
                ctx: Ctx {
                    op: g,
                    what: what.into(),
                    point: img.point,
                    kind: img.kind.to_string(),
                },
                data: img.data,
                allowed: allowed.clone(),
                sample: self.cfg.sample_every > 0 && self.check_rng.gen_range(0..self.cfg.sample_every) == 0,
                seed: self.check_rng.gen(),
                strict,
            };
            let sent = self.tasks.as_ref().is_some_and(|t| t.send(task).is_ok());
            if !sent {
                self.violation(g, what, "the checker threads are gone".into(), true);
                return;
            }
        }
    }

    /// The persisted image alone must hold exactly the model (every
    /// acknowledged operation is durable); after a clean close the
    /// recovery must also be instant.
    fn submit_acked(&mut self, data: Vec<u8>, g: u64, what: &str, closed: bool) {
        let allowed = Allowed {
            instant: closed,
            ..Allowed::exactly(self.model.clone())
        };
        let img = Image {
            kind: if closed { "closed" } else { "acked" },
            point: "acknowledged",
            data,
        };
        self.submit(vec![img], allowed, g, what, true);
    }

    /// A fresh pool, created with capture on: a crash before creation is
    /// acknowledged may leave "not a pool" or an empty pool.
    fn create(&mut self, g: u64) {
        self.model = Arc::new(Model::new());
        self.gen.window = [(0, 0); 2];
        self.report.work.pools += 1;
        let probe = self.probe(SimSpace::new(self.cfg.pool_size), 0x5EED_0000 + g);
        let db = match Db::create_in(probe, Path::new(PATH), &self.opts()) {
            Ok(db) => Arc::new(db),
            Err(e) => return self.violation(g, "create", format!("create failed: {e}"), true),
        };
        let imgs = db.space().take_images();
        let acked = db.space().sim.persisted_image();
        self.db = Some(db);
        self.submit_acked(acked, g, "create", false);
        let allowed = Allowed {
            creating: true,
            ..Allowed::exactly(self.model.clone())
        };
        self.submit(imgs, allowed, g, "create", false);
    }

    fn run(&mut self) {
        self.create(0);
        while self.op_index < self.cfg.ops && !self.stopped() {
            let g = self.op_index;
            // Every POOL_OPS operations a fresh pool: the tree grows from
            // one leaf again (the emptied leaves the sliding window leaves
            // behind are gone, index rebuilds come back).
            if g > 0 && g.is_multiple_of(POOL_OPS) {
                if self.close_clean(g).is_some() {
                    self.create(g);
                }
                if self.stopped() {
                    break;
                }
            }
            // Occasionally a clean close and instant reopen, or a power
            // failure; not while filling, so the index grows until its
            // PLNs overflow.
            let filling = matches!(phase_of(g), Phase::Fill);
            if g > 0 && !filling && self.gen.rng.gen_ratio(1, 90) {
                self.reopen_clean(g);
            } else if g > 0 && !filling && self.gen.rng.gen_ratio(1, 200) {
                self.power_failure(g);
            }
            if self.stopped() {
                break;
            }
            if self.helper.is_some() {
                self.round(g);
            } else {
                self.single(g);
            }
            let w = &mut self.report.work;
            w.max_keys = w.max_keys.max(self.model.len() as u64);
            w.max_pool_bytes = w.max_pool_bytes.max(self.db.as_ref().map_or(0, |d| d.space().size()));
        }
        // A final clean close, checked like any other.
        if !self.stopped() {
            self.reopen_clean(self.op_index);
        }
    }

    fn single(&mut self, g: u64) {
        let op = self.gen.op(0, g, phase_of(g), &self.model, &mut self.report.work);
        let r = exec(self.db(), &op);
        self.op_index += 1;
        let what = op.describe();
        self.after_ops(g, &[(op, r)], &what);
    }

    /// One op per writer, started together.
    fn round(&mut self, g: u64) {
        let phase = phase_of(g);
        let op0 = self.gen.op(0, g, phase, &self.model, &mut self.report.work);
        let op1 = self.gen.op(1, g + 1, phase, &self.model, &mut self.report.work);
        let db = self.db().clone();
        let helper = self.helper.as_ref().expect("helper thread");
        let job = Job {
            db: db.clone(),
            op: op1.clone(),
        };
        if helper.tx.as_ref().is_none_or(|tx| tx.send(job).is_err()) {
            return self.violation(g, "round", "writer thread 1 is gone".into(), true);
        }
        helper.barrier.wait();
        let r0 = exec(&db, &op0);
        let r1 = helper.rx.recv().unwrap_or_else(|_| Err("writer thread 1 died".into()));
        drop(db);
        self.op_index += 2;
        let what = format!("t0 {} | t1 {}", op0.describe(), op1.describe());
        self.after_ops(g, &[(op0, r0), (op1, r1)], &what);
    }

    /// Verifies the ops' results against the model, applies them, and
    /// submits the acknowledged state and the images captured meanwhile.
    fn after_ops(&mut self, g: u64, done: &[(Op, OpResult)], what: &str) {
        let mut failed = false;
        for (op, r) in done {
            let want = expected(op, &self.model);
            match r {
                Ok(o) if *o == want => {}
                Ok(o) => {
                    let msg = format!(
                        "{} returned {}, model says {}",
                        op.describe(),
                        outcome_str(o),
                        outcome_str(&want)
                    );
                    self.violation(g, what, msg, false);
                }
                Err(e) => {
                    failed = true;
                    self.violation(g, what, format!("{} failed: {e}", op.describe()), false);
                }
            }
        }
        let imgs = self.db().space().take_images();
        // Apply the ops; the images captured while they ran may miss any
        // of them, i.e. hold the new model with any subset of them undone.
        let model = Arc::make_mut(&mut self.model);
        let undo: Vec<_> = done.iter().filter_map(|(op, _)| apply(model, op)).collect();
        if failed {
            // The engine's state is unknown from here on.
            self.broken = true;
            return;
        }
        // The strict check of the acknowledged state first: the same image
        // captured at the operation boundary is then not only checked
        // against the lenient in-flight rule.
        if !undo.is_empty() {
            let acked = self.db().space().sim.persisted_image();
            self.submit_acked(acked, g, what, false);
        }
        let allowed = Allowed {
            inflight: undo,
            ..Allowed::exactly(self.model.clone())
        };
        self.submit(imgs, allowed, g, what, false);
    }

    /// Clean close, then instant reopen of the current bytes with capture on.
    fn reopen_clean(&mut self, g: u64) {
        if let Some(current) = self.close_clean(g) {
            self.reopen_main(g, current, "instant reopen", RecoveryKind::Instant);
        }
    }

    /// Closes the main-line pool cleanly, submits its images, and returns
    /// its current bytes.
    fn close_clean(&mut self, g: u64) -> Option<Vec<u8>> {
        self.report.work.clean_reopens += 1;
        let what = "clean close";
        let db = self.db.take().expect("db open");
        let Ok(db) = Arc::try_unwrap(db) else {
            self.violation(g, what, "db still shared at close".into(), true);
            return None;
        };
        self.harvest(&db);
        let space = match catch_unwind(AssertUnwindSafe(|| db.close_into_space())) {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                self.violation(g, what, format!("close failed: {e}"), true);
                return None;
            }
            Err(p) => {
                self.violation(g, what, format!("close panicked: {}", panic_msg(&p)), true);
                return None;
            }
        };
        let imgs = space.take_images();
        let persisted = space.sim.persisted_image();
        let current = space.sim.current_image();
        self.harvest_space(&space);
        space.set_capture(None);
        drop(space);
        // Acknowledged close: the persisted bytes recover instantly. Crash
        // images of the close itself may recover either way.
        self.submit_acked(persisted, g, what, true);
        self.submit(imgs, Allowed::exactly(self.model.clone()), g, what, false);
        Some(current)
    }

    /// Power failure: only the persisted bytes survive; reopen rebuilds.
    fn power_failure(&mut self, g: u64) {
        self.report.work.power_failures += 1;
        let db = self.db.take().expect("db open");
        let image = db.space().sim.persisted_image();
        db.space().set_capture(None);
        self.harvest_all(&db);
        if let Ok(db) = Arc::try_unwrap(db) {
            db.space().set_read_only();
            let _ = catch_unwind(AssertUnwindSafe(move || drop(db)));
        }
        self.reopen_main(g, image, "power failure and rebuild", RecoveryKind::Rebuild);
    }

    /// Continues the main line on `image`, recovered with capture on.
    fn reopen_main(&mut self, g: u64, image: Vec<u8>, what: &str, kind: RecoveryKind) {
        let probe = self.probe(SimSpace::from_image(image), 0x1000 + g);
        let db = match catch_unwind(AssertUnwindSafe(|| Db::open_space(probe, Path::new(PATH)))) {
            Ok(Ok(db)) => {
                db.set_adaptive(self.cfg.adaptive);
                Arc::new(db)
            }
            Ok(Err(e)) => return self.violation(g, what, format!("reopen failed: {e}"), true),
            Err(p) => return self.violation(g, what, format!("reopen panicked: {}", panic_msg(&p)), true),
        };
        if db.recovery().kind != kind {
            let msg = format!("reopen recovered by {:?}, expected {:?}", db.recovery().kind, kind);
            self.violation(g, what, msg, false);
        }
        let imgs = db.space().take_images();
        self.db = Some(db);
        // The reopened pool holds the model.
        let allowed = Allowed::exactly(self.model.clone());
        match catch_unwind(AssertUnwindSafe(|| self.db().iter().collect::<Vec<_>>())) {
            Ok(pairs) if allowed.matches(0, &pairs) => {}
            Ok(pairs) => {
                let d = allowed.diff(&pairs);
                self.violation(g, what, format!("reopened pool differs: {d}"), false);
            }
            Err(p) => self.violation(g, what, format!("scan panicked: {}", panic_msg(&p)), true),
        }
        let acked = self.db().space().sim.persisted_image();
        self.submit_acked(acked, g, what, false);
        // Crash images of the reopen (recovery writes).
        self.submit(imgs, allowed, g, what, false);
    }

    /// Ends the main line: no more tasks.
    fn close(&mut self) {
        if let Some(db) = self.db.take() {
            self.harvest_all(&db);
            if let Ok(db) = Arc::try_unwrap(db) {
                db.space().set_read_only();
                let _ = catch_unwind(AssertUnwindSafe(move || drop(db)));
            }
        }
        self.helper.take();
        self.tasks.take();
    }
}

fn keys_per_thread(cfg: &Config) -> u32 {
    (cfg.keys / cfg.threads.clamp(1, 2) as u32).max(4)
}

fn outcome_str(o: &Outcome) -> String {
    match o {
        Outcome::Put => "ok".into(),
        Outcome::Deleted(b) => format!("deleted={b}"),
        Outcome::Got(v) => match v {
            Some(v) => format!("a {} B value", v.len()),
            None => "nothing".into(),
        },
    }
}

// ---------------------------------------------------------------------------
// Checking images (on any thread).

/// What checking an image needs from the campaign.
struct Env<'c> {
    cfg: &'c Config,
    keys_per_thread: u32,
}

impl Env<'_> {
    /// A probe over `sim` with the campaign's drop and capture settings.
    fn probe(&self, sim: SimSpace, capture_seed: Option<u64>) -> Probe {
        let p = Probe::new(sim, self.cfg.publish_first);
        p.sim.set_drop(self.cfg.drop.clone());
        p.set_capture(capture_seed.map(|seed| CaptureConfig {
            seed,
            random_subsets: self.cfg.random_subsets,
            torn: self.cfg.torn,
        }));
        p
    }
}

struct CheckJob {
    /// Campaign operation the image belongs to.
    op: u64,
    data: Vec<u8>,
    /// Also recover twice and let work continue.
    sample: bool,
    /// Seed of this image's own random choices.
    seed: u64,
    /// Capture images while recovering (a crash during recovery).
    capture: bool,
}

#[derive(Default)]
struct Checked {
    problems: Vec<String>,
    recovery_images: Vec<Image>,
    points: BTreeSet<&'static str>,
    sampled: bool,
    /// Dropped-point hits in the recovered pool (recovery and work after it).
    drop_hits: u64,
}

/// Recovers one image and checks it.
fn check_image(env: &Env, mut job: CheckJob, allowed: &Allowed) -> Checked {
    let mut out = Checked::default();
    let data = std::mem::take(&mut job.data);
    let original = data.clone();
    let probe = env.probe(SimSpace::from_image(data), job.capture.then_some(job.seed));
    let opened = catch_unwind(AssertUnwindSafe(|| Db::open_space(probe, Path::new(PATH))));
    let db = match opened {
        Ok(Ok(db)) => ManuallyDrop::new(db),
        Ok(Err(Error::NotAPool { .. })) if allowed.creating => return out,
        Ok(Err(e)) => {
            out.problems.push(format!("recovery failed: {e}"));
            return out;
        }
        Err(p) => {
            out.problems.push(format!("recovery panicked: {}", panic_msg(&p)));
            return out;
        }
    };
    out.points.extend(db.space().sim.points_seen());
    // Images captured while recovering: a crash during recovery.
    out.recovery_images = db.space().take_images();
    db.space().set_capture(None);
    // (Not of a pool cut short while being created: a read-only open
    // cannot write its missing first leaf.)
    let r = catch_unwind(AssertUnwindSafe(|| {
        if !allowed.creating {
            verify_read_only(env, original, &db, &mut out.problems)
        }
    }));
    if let Err(p) = r {
        out.problems
            .push(format!("checking a read-only open panicked: {}", panic_msg(&p)));
    }
    let r = catch_unwind(AssertUnwindSafe(|| verify(env, &db, allowed, &job, &mut out)));
    if let Err(p) = r {
        out.problems
            .push(format!("checking the recovered pool panicked: {}", panic_msg(&p)));
    }
    out.drop_hits = db.space().sim.drop_hits();
    // Dropped without a clean shutdown: read-only, so dropping writes
    // nothing and cannot trip over a broken pool.
    db.space().set_read_only();
    let db = ManuallyDrop::into_inner(db);
    let _ = catch_unwind(AssertUnwindSafe(move || drop(db)));
    out
}

/// The crash image opened read-only (the parent of a kill test does that):
/// it repairs nothing in the pool, yet must pass `check` and read exactly
/// what recovery (`db`, just recovered from the same image) left.
fn verify_read_only(env: &Env, image: Vec<u8>, db: &Db<Probe>, problems: &mut Vec<String>) {
    let probe = env.probe(SimSpace::from_image(image), None);
    probe.set_read_only();
    let ro = match Db::open_space(probe, Path::new(PATH)) {
        Ok(ro) => ro,
        Err(e) => return problems.push(format!("read-only open failed: {e}")),
    };
    let r = ro.check();
    if !r.ok {
        problems.push(format!("check of a read-only open failed: {}", r.problems.join("; ")));
    }
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = ro.iter().collect();
    let recovered: Vec<(Vec<u8>, Vec<u8>)> = db.iter().collect();
    if pairs != recovered {
        let first = pairs.iter().zip(&recovered).position(|(a, b)| a != b);
        problems.push(format!(
            "a read-only open reads other pairs than recovery ({} vs {} pairs, first difference at {:?})",
            pairs.len(),
            recovered.len(),
            first.map(|i| show(&pairs[i].0))
        ));
    } else if ro.len() != db.len() {
        problems.push(format!("read-only len() is {} but recovery's {}", ro.len(), db.len()));
    } else if let Some((k, _)) = pairs.iter().find(|(k, v)| ro.get(k).ok().flatten().as_ref() != Some(v)) {
        problems.push(format!("read-only get {} disagrees with its scan", show(k)));
    }
}

/// Every check of one recovered image; problems go to `out`.
fn verify(env: &Env, db: &Db<Probe>, allowed: &Allowed, job: &CheckJob, out: &mut Checked) {
    let problems = &mut out.problems;
    if allowed.instant && db.recovery().kind != RecoveryKind::Instant {
        problems.push(format!(
            "clean close was acknowledged but recovery was {:?}, not instant",
            db.recovery().kind
        ));
    }
    // Reading a leaf allocates by its count: a garbage count would abort
    // the process (allocation failure is not a catchable panic).
    if let Err(e) = leaves_sane(db) {
        problems.push(e);
        return;
    }
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = db.iter().collect();
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 >= w[1].0) {
        problems.push(format!("scan out of order at {} >= {}", show(&w[0].0), show(&w[1].0)));
    }
    let mask = (0..allowed.candidates()).find(|&m| allowed.matches(m, &pairs));
    if mask.is_none() {
        problems.push(format!(
            "recovered state is not an allowed one: {}",
            allowed.diff(&pairs)
        ));
    }
    if db.len() != pairs.len() as u64 {
        problems.push(format!("len() is {} but a scan finds {} pairs", db.len(), pairs.len()));
    }
    // Point gets agree with the scan, also for keys in flight.
    let scanned: BTreeMap<&[u8], &[u8]> = pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    let mut probe_keys: Vec<&[u8]> = scanned.keys().copied().collect();
    probe_keys.extend(allowed.inflight.iter().flatten().map(|(k, _)| k.as_slice()));
    for k in probe_keys {
        let got = db.get(k).ok().flatten();
        if got.as_deref() != scanned.get(k).copied() {
            problems.push(format!(
                "get {} gives {:?} B but the scan {:?} B",
                show(k),
                got.as_ref().map(|v| v.len()),
                scanned.get(k).map(|v| v.len())
            ));
            break;
        }
    }
    let r = db.check();
    if !r.ok {
        problems.push(format!("check failed: {}", r.problems.join("; ")));
    }
    if !problems.is_empty() || !job.sample {
        return;
    }
    let Some(mask) = mask else { return };
    out.sampled = true;
    // Recovery twice: crash right after recovery, recover again.
    let again = db.space().sim.current_image();
    match Db::open_space(env.probe(SimSpace::from_image(again), None), Path::new(PATH)) {
        Ok(db2) => {
            db2.space().set_read_only();
            let pairs2: Vec<(Vec<u8>, Vec<u8>)> = db2.iter().collect();
            if pairs2 != pairs {
                problems.push(format!(
                    "second recovery differs from the first ({} vs {} pairs)",
                    pairs2.len(),
                    pairs.len()
                ));
            }
            // The same leaves with the same counts, the same key count and
            // allocator usage (cheaper than a second full check).
            if db2.leaf_offsets() != db.leaf_offsets() || db2.len() != db.len() || db2.used_bytes() != db.used_bytes() {
                problems.push(format!(
                    "second recovery differs from the first in structure: {} vs {} leaves, {} vs {} keys, \
                     {} vs {} bytes used",
                    db2.leaf_offsets().len(),
                    db.leaf_offsets().len(),
                    db2.len(),
                    db.len(),
                    db2.used_bytes(),
                    db.used_bytes()
                ));
            }
        }
        Err(e) => problems.push(format!("second recovery failed: {e}")),
    }
    if !problems.is_empty() {
        return;
    }
    // Work continues on the recovered pool, on another thread than the one
    // that recovered it (as an application opens a pool and hands it to
    // workers): recovery's own writes must be durable by its own fences.
    let model = std::thread::scope(|sc| {
        sc.spawn(|| -> std::result::Result<Model, String> {
            let mut model = allowed.materialize(mask);
            let mut rng = StdRng::seed_from_u64(job.seed);
            let threads = env.cfg.threads.clamp(1, 2);
            let mut gen = Gen {
                rng: StdRng::seed_from_u64(rng.gen()),
                keys_per_thread: env.keys_per_thread,
                txn: env.cfg.txn,
                compact_values: env.cfg.leaf == LeafFormat::Isle,
                window: [(0, 0); 2],
            };
            let mut scratch = WorkStats::default();
            for i in 0..8 {
                let t = rng.gen_range(0..threads);
                let phase = [Phase::Fill, Phase::Churn, Phase::Drain][rng.gen_range(0..3)];
                let op = gen.op(t, 1 << 40 | job.op << 8 | i, phase, &model, &mut scratch);
                let want = expected(&op, &model);
                match exec(db, &op) {
                    Ok(o) if o == want => {}
                    Ok(o) => {
                        return Err(format!(
                            "after recovery, {} returned {}, model says {}",
                            op.describe(),
                            outcome_str(&o),
                            outcome_str(&want)
                        ))
                    }
                    Err(e) => return Err(format!("after recovery, {} failed: {e}", op.describe())),
                }
                apply(&mut model, &op);
            }
            Ok(model)
        })
        .join()
        .unwrap_or_else(|p| Err(format!("work after recovery panicked: {}", panic_msg(&p))))
    });
    let model = match model {
        Ok(m) => m,
        Err(e) => {
            problems.push(e);
            return;
        }
    };
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = db.iter().collect();
    let model = Arc::new(model);
    let a = Allowed::exactly(model.clone());
    if !a.matches(0, &pairs) {
        problems.push(format!("after work on the recovered pool: {}", a.diff(&pairs)));
    }
    if db.len() != model.len() as u64 {
        problems.push(format!(
            "after work on the recovered pool len() is {}, model {}",
            db.len(),
            model.len()
        ));
    }
    let r = db.check();
    if !r.ok {
        problems.push(format!(
            "check after work on the recovered pool failed: {}",
            r.problems.join("; ")
        ));
        return;
    }
    // Then a crash: the persisted bytes hold every acknowledged write of
    // both lives of the pool (so recovery's own writes were durable before
    // the work that followed relied on them).
    let image = db.space().sim.persisted_image();
    let probe = env.probe(SimSpace::from_image(image), None);
    match catch_unwind(AssertUnwindSafe(|| Db::open_space(probe, Path::new(PATH)))) {
        Ok(Ok(db3)) => {
            db3.space().set_read_only();
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = db3.iter().collect();
            if !a.matches(0, &pairs) {
                problems.push(format!("crash after work on the recovered pool: {}", a.diff(&pairs)));
            }
        }
        Ok(Err(e)) => problems.push(format!("recovery after work on the recovered pool failed: {e}")),
        Err(p) => problems.push(format!(
            "recovery after work on the recovered pool panicked: {}",
            panic_msg(&p)
        )),
    }
}

/// Every leaf the recovered index routes to lies inside the pool with a
/// sane size and a count within its capacity.
fn leaves_sane(db: &Db<Probe>) -> std::result::Result<(), String> {
    let pool = db.space().size();
    let capacity = match db.leaf_format() {
        LeafFormat::Nv => leaf_nv::capacity,
        LeafFormat::Isle => crate::format::leaf_isle::capacity,
    };
    for (off, size, n) in db.index_leaves() {
        if off == 0 {
            continue;
        }
        let ok = off % 64 == 0
            && size >= leaf_nv::MIN_SIZE
            && size % 64 == 0
            && off.checked_add(size).is_some_and(|end| end <= pool)
            && n <= capacity(size);
        if !ok {
            return Err(format!(
                "recovered index holds an invalid leaf: offset {off}, size {size}, count {n} (pool {pool} bytes)"
            ));
        }
    }
    Ok(())
}

/// What `op` must return against `model`.
fn expected(op: &Op, model: &Model) -> Outcome {
    match op {
        Op::Put(..) | Op::Batch(_) | Op::Txn(_) => Outcome::Put,
        Op::Del(k) => Outcome::Deleted(model.contains_key(k)),
        Op::Get(k) => Outcome::Got(model.get(k).map(|v| v.to_vec())),
    }
}

/// Applies `op` to `model`; returns the keys it wrote with their previous
/// values (`None` if it writes nothing).
fn apply(model: &mut Model, op: &Op) -> Option<Vec<(Vec<u8>, Option<Val>)>> {
    let effect = op.effect();
    if effect.is_empty() {
        return None;
    }
    Some(
        effect
            .into_iter()
            .map(|(k, v)| {
                let old = match v {
                    Some(v) => model.insert(k.clone(), v),
                    None => model.remove(&k),
                };
                (k, old)
            })
            .collect(),
    )
}

/// A 64-bit content hash of an image for deduplication across spaces: four
/// independent multiply-xor lanes over 8-byte words (memory bound).
fn fast_hash(data: &[u8]) -> u64 {
    const K: [u64; 4] = [
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0x85EB_CA77_C2B2_AE63,
    ];
    let mut h = [1u64, 2, 3, 4];
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        for (i, hi) in h.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *hi = (hi.rotate_left(23) ^ w).wrapping_mul(K[i]);
        }
    }
    let mut tail = [0u8; 32];
    let rest = chunks.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    let mut out = data.len() as u64;
    for (i, hi) in h.iter().enumerate() {
        let w = u64::from_le_bytes(tail[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        out = (out.rotate_left(31) ^ hi ^ w).wrapping_mul(K[(i + 1) % 4]);
        out ^= out >> 29;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_writers_are_disjoint() {
        let a: BTreeSet<Vec<u8>> = (0..300).map(|i| key_of(0, i)).collect();
        let b: BTreeSet<Vec<u8>> = (0..300).map(|i| key_of(1, i)).collect();
        assert_eq!(a.len(), 300);
        assert_eq!(b.len(), 300);
        assert!(a.is_disjoint(&b));
        let edge: BTreeSet<Vec<u8>> = (0..EDGE_KEYS).map(|i| key_of(0, 1_000_000 + i)).collect();
        assert!(edge.is_disjoint(&a) && edge.is_disjoint(&b));
    }

    #[test]
    fn window_keys_ascend_and_interleave() {
        let a: Vec<Vec<u8>> = (0..50).map(|j| window_key(0, j)).collect();
        let b: Vec<Vec<u8>> = (0..50).map(|j| window_key(1, j)).collect();
        assert!(a.windows(2).all(|w| w[0] < w[1]) && b.windows(2).all(|w| w[0] < w[1]));
        assert!(a.iter().zip(&b).all(|(x, y)| x < y));
        assert!(a.iter().all(|k| k.len() == 8 && k[0] == b'w' && !b.contains(k)));
    }

    #[test]
    fn probe_adds_publish_first_image() {
        let p = Probe::new(SimSpace::new(4096), true);
        p.set_capture(Some(CaptureConfig::new(1)));
        // Six lines of payload, flushed but not fenced, then the publishing word.
        p.write(64, &[7; 6 * 64]);
        p.flush(64, 6 * 64, Point::new("t.flush"));
        p.store(1024, 42);
        p.flush(1024, 8, Point::new("t.flush"));
        p.fence(Point::new("t.fence"));
        let imgs = p.take_images();
        let pf: Vec<&Image> = imgs.iter().filter(|i| i.kind == "publish-first").collect();
        assert_eq!(pf.len(), 1);
        let d = &pf[0].data;
        assert_eq!(u64::from_le_bytes(d[1024..1032].try_into().unwrap()), 42);
        assert!(d[64..64 + 6 * 64].iter().all(|&b| b == 0), "payload not persisted yet");
        assert_eq!(pf[0].point, "t.fence");
        // After the fence everything is persisted: nothing more to add.
        p.fence(Point::new("t.fence"));
        assert!(p.take_images().iter().all(|i| i.kind != "publish-first"));
    }

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
