//! Checking images (on any thread): recovery, the allowed states, structure,
//! recovery twice and work after recovery.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::model::{apply, expected, Allowed};
use super::op::{exec, outcome_str, PATH};
use super::probe::{Image, Probe};
use super::workload::{show, Gen, Model, Phase};
use super::{panic_msg, Config, WorkStats};
use crate::db::Db;
use crate::error::Error;
use crate::format::header::{EngineKind, LeafKind};
use crate::format::leaf_nv;
use crate::pmem::sim::CaptureConfig;
use crate::pmem::{SimSpace, Space};
use crate::recovery::RecoveryKind;

/// What checking an image needs from the campaign.
pub(super) struct Env<'c> {
    pub(super) cfg: &'c Config,
    pub(super) keys_per_thread: u32,
}

impl Env<'_> {
    /// A probe over `sim` with the campaign's drop and capture settings.
    pub(super) fn probe(&self, sim: SimSpace, capture_seed: Option<u64>) -> Probe {
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

pub(super) struct CheckJob {
    /// Campaign operation the image belongs to.
    pub(super) op: u64,
    pub(super) data: Vec<u8>,
    /// Also recover twice and let work continue.
    pub(super) sample: bool,
    /// Seed of this image's own random choices.
    pub(super) seed: u64,
    /// Capture images while recovering (a crash during recovery).
    pub(super) capture: bool,
}

#[derive(Default)]
pub(super) struct Checked {
    pub(super) problems: Vec<String>,
    pub(super) recovery_images: Vec<Image>,
    pub(super) points: BTreeSet<&'static str>,
    pub(super) sampled: bool,
    /// Dropped-point hits in the recovered pool (recovery and work after it).
    pub(super) drop_hits: u64,
}

/// Recovers one image and checks it.
pub(super) fn check_image(env: &Env, mut job: CheckJob, allowed: &Allowed) -> Checked {
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
pub(super) fn verify_read_only(env: &Env, image: Vec<u8>, db: &Db<Probe>, problems: &mut Vec<String>) {
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
pub(super) fn verify(env: &Env, db: &Db<Probe>, allowed: &Allowed, job: &CheckJob, out: &mut Checked) {
    let problems = &mut out.problems;
    // A tree loads its saved state, a hash pool its saved index.
    let saved = match db.engine() {
        crate::format::header::EngineKind::Tree => RecoveryKind::Instant,
        crate::format::header::EngineKind::Hash => RecoveryKind::Loaded,
    };
    if allowed.instant && db.recovery().kind != saved {
        problems.push(format!(
            "clean close was acknowledged but recovery was {:?}, not {saved:?}",
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
                compact_values: env.cfg.leaf == LeafKind::Isle,
                pinned_deletes: env.cfg.engine == EngineKind::Tree && env.cfg.leaf == LeafKind::Nv,
                pin_rng: StdRng::seed_from_u64(job.seed ^ 0x5A5A_0F0F_3C3C_9696),
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
pub(super) fn leaves_sane(db: &Db<Probe>) -> std::result::Result<(), String> {
    let pool = db.space().size();
    let capacity = match db.leaf_format() {
        LeafKind::Nv => leaf_nv::max_count,
        LeafKind::Isle => crate::format::leaf_isle::capacity,
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
