//! Crash campaigns over the back-end's persistent structures (log state,
//! operation-log ring, memory-log area, naming table, allocator bitmap).
//!
//! A seeded workload of verbs runs against a back-end on the crash
//! simulator with image capture on. Every image captured while verb `k` ran
//! is recovered (`Backend::open`) and must equal the back-end's state before
//! `k` or after it: exactly one of the two for atomic verbs (`tx_write`,
//! `op_log`, naming), word by word for a plain `write`, and between the two
//! for the bitmap of `malloc` and `free`. After every acknowledged verb the
//! persisted bytes alone must recover to exactly the acknowledged state.
//! With one persistence point dropped, a campaign must find violations
//! (all but one, see `UNCATCHABLE`).

use std::collections::BTreeSet;

#[allow(dead_code, reason = "shared with the other back-end tests")]
mod common;

use common::{snap, Snap};
use nvstore::pmem::sim::CaptureConfig;
use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::points;
use nvstore_asym::wire::{MemLog, Reply, Verb};
use nvstore_asym::Layout;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const POOL: u64 = 16 << 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Atomic,
    Words,
    Alloc,
    Free,
}

/// Whether `got` is an allowed recovery of a crash during a verb of `kind`.
fn allowed(kind: Kind, before: &Snap, after: &Snap, got: &Snap) -> Result<(), String> {
    if got == before || got == after {
        return Ok(());
    }
    let same_but = |f: &dyn Fn(&mut Snap)| {
        let (mut a, mut b, mut g) = (before.clone(), after.clone(), got.clone());
        f(&mut a);
        f(&mut b);
        f(&mut g);
        g == a || g == b
    };
    match kind {
        Kind::Atomic => {}
        Kind::Words => {
            if same_but(&|s: &mut Snap| s.data.clear()) {
                let ok = (0..got.data.len())
                    .step_by(8)
                    .all(|i| got.data[i..i + 8] == before.data[i..i + 8] || got.data[i..i + 8] == after.data[i..i + 8]);
                if ok {
                    return Ok(());
                }
            }
        }
        Kind::Alloc | Kind::Free => {
            if same_but(&|s: &mut Snap| s.bits.clear()) {
                let (lo, hi) = if kind == Kind::Alloc {
                    (before, after)
                } else {
                    (after, before)
                };
                let ok = (0..got.bits.len()).all(|i| (!lo.bits[i] || got.bits[i]) && (!got.bits[i] || hi.bits[i]));
                if ok {
                    return Ok(());
                }
            }
        }
    }
    let mut diff = Vec::new();
    if got.data != before.data && got.data != after.data {
        diff.push("data");
    }
    if got.names != before.names && got.names != after.names {
        diff.push("names");
    }
    if got.ops != before.ops && got.ops != after.ops {
        diff.push("op logs");
    }
    if got.bits != before.bits && got.bits != after.bits {
        diff.push("bitmap");
    }
    if (got.op_applied, got.op_next) != (before.op_applied, before.op_next)
        && (got.op_applied, got.op_next) != (after.op_applied, after.op_next)
    {
        diff.push("op positions");
    }
    Err(format!(
        "recovered state is neither before nor after ({diff:?}, mixed: {})",
        diff.is_empty()
    ))
}

struct Outcome {
    images: u64,
    violations: Vec<String>,
    drop_hits: u64,
}

fn reopen(img: Vec<u8>, drop: &Option<String>) -> Result<Backend<SimSpace>, String> {
    let sim = SimSpace::from_image(img);
    sim.set_drop(drop.clone());
    Backend::open(sim).map_err(|e| format!("recovery failed: {e}"))
}

fn random_verb(rng: &mut StdRng, b: &Backend<SimSpace>, allocated: &[(u64, u32)]) -> (Verb, Kind) {
    let g = b.geometry();
    let data_len = g.slabs * g.slab;
    let addr = |rng: &mut StdRng, len: u64| g.data_off + rng.gen_range(0..(data_len - len) / 8) * 8;
    let names = ["root", "lock", "tail", "part/1"];
    match rng.gen_range(0..100) {
        0..=34 => {
            let n = rng.gen_range(0..70);
            (
                Verb::OpLog {
                    payload: (0..n).map(|_| rng.gen()).collect(),
                },
                Kind::Atomic,
            )
        }
        35..=59 => {
            let mut logs = Vec::new();
            for _ in 0..rng.gen_range(1..5) {
                let len = if rng.gen_bool(0.5) { 8 } else { rng.gen_range(1..120) };
                let a = addr(rng, len) + if len % 8 == 0 { 0 } else { rng.gen_range(0..8) };
                logs.push(MemLog::Write {
                    addr: a,
                    data: (0..len).map(|_| rng.gen()).collect(),
                });
            }
            if !allocated.is_empty() && rng.gen_bool(0.2) {
                let (a, n) = allocated[rng.gen_range(0..allocated.len())];
                logs.push(MemLog::Free { addr: a, slabs: n });
            }
            let op_applied = if b.op_next() > b.op_applied() + 1 && rng.gen_bool(0.7) {
                rng.gen_range(b.op_applied() + 1..b.op_next())
            } else {
                0
            };
            (Verb::TxWrite { op_applied, logs }, Kind::Atomic)
        }
        60..=69 => (
            Verb::Malloc {
                slabs: rng.gen_range(1..4),
            },
            Kind::Alloc,
        ),
        70..=74 if !allocated.is_empty() => {
            let (a, n) = allocated[rng.gen_range(0..allocated.len())];
            (Verb::Free { addr: a, slabs: n }, Kind::Free)
        }
        75..=84 => {
            let name = names[rng.gen_range(0..names.len())].to_string();
            match rng.gen_range(0..4) {
                0 => (Verb::NameSet { name, value: rng.gen() }, Kind::Atomic),
                1 => (
                    Verb::NameCas {
                        name,
                        old: 0,
                        new: rng.gen_range(1..5),
                    },
                    Kind::Atomic,
                ),
                2 => (
                    Verb::WriterLock {
                        name,
                        owner: rng.gen_range(1..3),
                    },
                    Kind::Atomic,
                ),
                _ => (
                    Verb::WriterUnlock {
                        name,
                        owner: rng.gen_range(1..3),
                    },
                    Kind::Atomic,
                ),
            }
        }
        85..=94 => {
            let len = rng.gen_range(1..6) * 8;
            (
                Verb::Write {
                    addr: addr(rng, len),
                    data: (0..len).map(|_| rng.gen()).collect(),
                },
                Kind::Words,
            )
        }
        _ => {
            let a = addr(rng, 8);
            let cur = u64::from_le_bytes(b.peek(a, 8).try_into().unwrap());
            let old = if rng.gen_bool(0.5) { cur } else { cur ^ 1 };
            (
                Verb::Cas {
                    addr: a,
                    old,
                    new: rng.gen(),
                },
                Kind::Atomic,
            )
        }
    }
}

fn campaign(seed: u64, steps: usize, drop: Option<&str>) -> Outcome {
    let drop = drop.map(str::to_string);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Outcome {
        images: 0,
        violations: Vec::new(),
        drop_hits: 0,
    };
    let cfg = CaptureConfig {
        seed,
        random_subsets: 4,
        torn: 2,
    };

    // Creation: every image is "not a pool" or an empty pool.
    let sim = SimSpace::new(POOL);
    sim.set_drop(drop.clone());
    sim.set_capture(Some(cfg));
    let mut b = Backend::create(sim, Layout::small()).expect("create");
    let empty = snap(&b);
    for img in b.space().take_images() {
        out.images += 1;
        if let Ok(r) = Backend::open(SimSpace::from_image(img.data)) {
            if snap(&r) != empty {
                out.violations
                    .push(format!("creation image at {} recovers to a non-empty pool", img.point));
            }
        }
    }
    let mut acked_epoch = b.epoch();
    let mut allocated: Vec<(u64, u32)> = Vec::new();
    let mut before = snap(&b);
    for step in 0..steps {
        if rng.gen_range(0..40) == 0 {
            // Power failure between verbs: only persisted bytes survive.
            out.drop_hits += b.space().drop_hits();
            let img = b.space().persisted_image();
            b = match reopen(img, &drop) {
                Ok(r) => r,
                Err(e) => {
                    out.violations.push(format!("step {step}: {e}"));
                    return out;
                }
            };
            b.space().set_capture(Some(cfg));
            b.space().take_images();
            if b.epoch() <= acked_epoch {
                out.violations.push(format!(
                    "step {step}: epoch {} did not advance past {acked_epoch}",
                    b.epoch()
                ));
            }
            acked_epoch = b.epoch();
            let now = snap(&b);
            if now != before {
                out.violations
                    .push(format!("step {step}: power failure lost acknowledged state"));
                before = now;
            }
            continue;
        }
        let (verb, kind) = random_verb(&mut rng, &b, &allocated);
        let reply = b.verb(&verb);
        match (&verb, &reply) {
            (Verb::Malloc { slabs }, Reply::Word(a)) => allocated.push((*a, *slabs)),
            (Verb::Free { addr, .. }, Reply::Ok) => allocated.retain(|x| x.0 != *addr),
            (Verb::TxWrite { logs, .. }, Reply::Word(_)) => {
                for l in logs {
                    if let MemLog::Free { addr, .. } = l {
                        allocated.retain(|x| x.0 != *addr);
                    }
                }
            }
            _ => {}
        }
        let after = snap(&b);
        for img in b.space().take_images() {
            out.images += 1;
            match reopen(img.data, &drop) {
                Ok(r) => {
                    if let Err(e) = allowed(kind, &before, &after, &snap(&r)) {
                        out.violations
                            .push(format!("step {step} {verb:?} image {} at {}: {e}", img.kind, img.point));
                    }
                    if r.epoch() <= acked_epoch {
                        out.violations.push(format!(
                            "step {step}: recovered epoch {} not past {acked_epoch}",
                            r.epoch()
                        ));
                    }
                }
                Err(e) => out.violations.push(format!("step {step} image at {}: {e}", img.point)),
            }
        }
        // Acknowledged means durable: the persisted bytes alone recover it.
        match reopen(b.space().persisted_image(), &drop) {
            Ok(r) if snap(&r) == after => {}
            Ok(_) => out
                .violations
                .push(format!("step {step} {verb:?}: acknowledged state not durable")),
            Err(e) => out.violations.push(format!("step {step}: {e}")),
        }
        before = after;
    }
    out.drop_hits += b.space().drop_hits();
    out
}

#[test]
fn crash_anywhere_recovers_before_or_after_each_verb() {
    for seed in 1..=3 {
        let o = campaign(seed, 300, None);
        assert!(
            o.violations.is_empty(),
            "seed {seed}: {} violations, first: {:?}",
            o.violations.len(),
            &o.violations[..o.violations.len().min(5)]
        );
        eprintln!("seed {seed}: {} images", o.images);
        assert!(o.images > 500, "seed {seed}: only {} images", o.images);
    }
}

/// `asym.header.fence` orders the header before the epoch word that makes
/// the file a pool. Without it the epoch word's own fence still persists the
/// header before creation is acknowledged, and a crash in between can only
/// leave a file that does not open, which an unacknowledged creation may.
/// It stays: the publish rule (everything a word publishes is durable
/// first) is what makes "does not open" the worst case.
const UNCATCHABLE: &[&str] = &["asym.header.fence"];

#[test]
fn every_dropped_point_is_caught() {
    let mut missed = BTreeSet::new();
    // A mirror's own points are exercised by tests/mirror_crash.rs.
    let mine = |p: &&nvstore::pmem::Point| p.name.starts_with("asym.mirror.");
    for p in points::ALL
        .iter()
        .filter(|p| !UNCATCHABLE.contains(&p.name) && !mine(p))
    {
        let mut caught = false;
        let mut hits = 0;
        for seed in 1..=3 {
            let o = campaign(seed, 200, Some(p.name));
            hits += o.drop_hits;
            if !o.violations.is_empty() {
                caught = true;
                break;
            }
        }
        if !caught {
            missed.insert((p.name, hits));
        }
    }
    assert!(
        missed.is_empty(),
        "points whose loss no campaign detects (name, times dropped): {missed:?}"
    );
}
