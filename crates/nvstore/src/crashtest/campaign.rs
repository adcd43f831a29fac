//! The campaign: the main line runs the workload and submits images; checker
//! threads recover and check them meanwhile.

use std::collections::{BTreeSet, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::model::{apply, expected, Allowed, Ctx};
use super::op::{exec, keys_per_thread, outcome_str, OpResult, PATH};
use super::probe::{Image, Probe};
use super::verify::{check_image, CheckJob, Env};
use super::workload::{phase_of, Gen, Model, Op, Phase};
use super::{campaign_thread, panic_msg, Config, Report};
use crate::db::{Db, Options};
use crate::format::header::{EngineKind, LeafKind};
use crate::format::leaf_nv;
use crate::pmem::{SimSpace, Space};
use crate::recovery::RecoveryKind;

/// The split race (docs/design.md, "the publish rule", rule 3): a split publishes its new leaves to
/// other threads when it releases its locks. If the link store that swaps
/// them into the chain were not yet fenced, another writer could append to a
/// new leaf, fence its own element and count, and acknowledge, while a crash
/// still finds the old chain and loses that write. The op-by-op campaign
/// never runs a second writer inside that window, so this probe does: a
/// split hook runs another thread's put into the new right leaf, then takes
/// the crash image of that instant (persisted data only) and checks that the
/// acknowledged put survives recovery. Returns (crash states, violations).
pub(super) fn split_race(cfg: &Config) -> (u64, Vec<String>) {
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

/// Operations on one pool before the campaign starts a fresh one.
pub(super) const POOL_OPS: u64 = 800;

/// State shared with the checker threads.
#[derive(Default)]
pub(super) struct Shared {
    /// Hashes of every image checked (or being checked).
    pub(super) seen: Mutex<HashSet<u64>>,
    pub(super) violations: AtomicU64,
}

/// One image to check.
pub(super) struct Task {
    /// Submission order: violation reports are sorted by it.
    pub(super) seq: u64,
    pub(super) ctx: Ctx,
    pub(super) data: Vec<u8>,
    pub(super) allowed: Arc<Allowed>,
    pub(super) sample: bool,
    pub(super) seed: u64,
    /// Check even if an identical image was checked (under a weaker rule).
    pub(super) strict: bool,
}

/// What checking one task found.
#[derive(Default)]
pub(super) struct Done {
    pub(super) states: u64,
    pub(super) kinds: Vec<String>,
    /// (submission order, sub-order, where, what)
    pub(super) findings: Vec<(u64, u64, Ctx, String)>,
    pub(super) points: BTreeSet<&'static str>,
    pub(super) sampled: u64,
    pub(super) drop_hits: u64,
}

impl Done {
    pub(super) fn merge(&mut self, o: Done) {
        self.states += o.states;
        self.kinds.extend(o.kinds);
        self.findings.extend(o.findings);
        self.points.extend(o.points);
        self.sampled += o.sampled;
        self.drop_hits += o.drop_hits;
    }
}

pub(super) fn check_worker(env: &Env, shared: &Shared, tasks: &Mutex<mpsc::Receiver<Task>>) -> Done {
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
pub(super) fn process(env: &Env, shared: &Shared, task: Task) -> Done {
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
pub(super) struct Job {
    pub(super) db: Arc<Db<Probe>>,
    pub(super) op: Op,
}

/// The second writer thread: runs one op per round, started together with
/// the main thread's op at a barrier.
pub(super) struct Helper {
    pub(super) tx: Option<mpsc::Sender<Job>>,
    pub(super) rx: mpsc::Receiver<OpResult>,
    pub(super) barrier: Arc<Barrier>,
    pub(super) handle: Option<std::thread::JoinHandle<()>>,
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

pub(super) struct Campaign<'c> {
    pub(super) cfg: &'c Config,
    pub(super) shared: &'c Shared,
    pub(super) tasks: Option<mpsc::SyncSender<Task>>,
    pub(super) gen: Gen,
    /// Random choices of the checker (sampling, seeds of checks).
    pub(super) check_rng: StdRng,
    pub(super) model: Arc<Model>,
    pub(super) db: Option<Arc<Db<Probe>>>,
    pub(super) op_index: u64,
    pub(super) seq: u64,
    pub(super) report: Report,
    /// Violations seen by the main line itself.
    pub(super) findings: Vec<(u64, u64, Ctx, String)>,
    pub(super) points: BTreeSet<&'static str>,
    /// The main line cannot go on (its pool is in an unknown state).
    pub(super) broken: bool,
    pub(super) helper: Option<Helper>,
}

impl<'c> Campaign<'c> {
    pub(super) fn new(cfg: &'c Config, shared: &'c Shared, tasks: mpsc::SyncSender<Task>) -> Campaign<'c> {
        Campaign {
            cfg,
            shared,
            tasks: Some(tasks),
            gen: Gen {
                rng: StdRng::seed_from_u64(cfg.seed),
                keys_per_thread: keys_per_thread(cfg),
                txn: cfg.txn,
                compact_values: cfg.leaf == LeafKind::Isle,
                pinned_deletes: cfg.engine == EngineKind::Tree && cfg.leaf == LeafKind::Nv,
                pin_rng: StdRng::seed_from_u64(cfg.seed ^ 0x5A5A_0F0F_3C3C_9696),
                window: [(0, 0); 2],
            },
            check_rng: StdRng::seed_from_u64(cfg.seed ^ 0xC0FF_EE00_D15E_A5E5),
            model: Arc::new(Model::new()),
            db: None,
            op_index: 0,
            seq: 0,
            report: Report {
                engine: cfg.engine.as_str().into(),
                leaf: match cfg.engine {
                    EngineKind::Tree => cfg.leaf.as_str().into(),
                    EngineKind::Hash => "none".into(),
                },
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
            engine: self.cfg.engine,
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
    pub(super) fn violation(&mut self, g: u64, what: &str, msg: String, fatal: bool) {
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
        if db.leaf_format() == LeafKind::Nv {
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
        // A tree pool saves its state at close, a hash pool its index.
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

    pub(super) fn run(&mut self) {
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
            let kind = match self.cfg.engine {
                EngineKind::Tree => RecoveryKind::Instant,
                EngineKind::Hash => RecoveryKind::Loaded,
            };
            self.reopen_main(g, current, "clean reopen", kind);
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
    pub(super) fn close(&mut self) {
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

/// A 64-bit content hash of an image for deduplication across spaces: four
/// independent multiply-xor lanes over 8-byte words (memory bound).
pub(super) fn fast_hash(data: &[u8]) -> u64 {
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
