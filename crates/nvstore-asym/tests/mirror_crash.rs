//! Crash campaigns over a mirror's persistent writes: applying a primary's
//! batches (`mirror::apply_batch`) and taking a full copy
//! (`mirror::copy_begin` / `copy_chunk` / `copy_end`).
//!
//! Every image the crash simulator can produce while the mirror works is
//! recovered. A clean applied-batch word must name a batch whose state the
//! pool holds exactly (the primary's state after that batch); a dirty word
//! (or, during a copy, a pool that does not open) is allowed: the mirror
//! then asks for a full copy. With one of the mirror's persistence points
//! dropped, a campaign must find violations.

#[allow(dead_code, reason = "shared with the other back-end tests")]
mod common;

use common::{snap, Snap};
use nvstore::pmem::sim::CaptureConfig;
use nvstore::pmem::SimSpace;
use nvstore_asym::backend::{Backend, DIRTY};
use nvstore_asym::mirror::{apply_batch, copy_begin, copy_chunk, copy_end};
use nvstore_asym::wire::{MemLog, Reply, Verb};
use nvstore_asym::{points, Layout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const POOL: u64 = 16 << 10;

/// One frame's worth of random verbs on the primary.
fn random_frame(rng: &mut StdRng, b: &Backend<SimSpace>, slabs: &mut Vec<u64>) -> Vec<Verb> {
    let g = b.geometry();
    let mut v = Vec::new();
    for _ in 0..rng.gen_range(1..4) {
        v.push(match rng.gen_range(0..100) {
            0..=19 => Verb::Malloc { slabs: 1 },
            20..=44 => Verb::OpLog {
                payload: (0..rng.gen_range(1..40)).map(|_| rng.gen()).collect(),
            },
            45..=74 if !slabs.is_empty() => {
                let s = slabs[rng.gen_range(0..slabs.len())];
                let logs = (0..rng.gen_range(1..4))
                    .map(|_| {
                        let len = rng.gen_range(1..5) * 8;
                        MemLog::Write {
                            addr: s + rng.gen_range(0..(g.slab - len) / 8) * 8,
                            data: (0..len).map(|_| rng.gen()).collect(),
                        }
                    })
                    .collect();
                let op_applied = if rng.gen_bool(0.5) { b.op_next() - 1 } else { 0 };
                Verb::TxWrite { op_applied, logs }
            }
            75..=84 if !slabs.is_empty() => {
                let s = slabs.swap_remove(rng.gen_range(0..slabs.len()));
                Verb::Free { addr: s, slabs: 1 }
            }
            _ => Verb::NameSet {
                name: format!("n{}", rng.gen_range(0..6)),
                value: rng.gen(),
            },
        });
    }
    v
}

struct Outcome {
    images: usize,
    violations: Vec<String>,
}

fn check_image(img: Vec<u8>, snaps: &[Snap], copy_ok: bool) -> Result<(), String> {
    match Backend::open(SimSpace::from_image(img)) {
        Err(e) if copy_ok => {
            let _ = e;
            Ok(())
        }
        Err(e) => Err(format!("does not open: {e}")),
        Ok(r) => {
            let (_, w) = r.repl_words();
            if w & DIRTY != 0 {
                return Ok(());
            }
            match snaps.get(w as usize) {
                Some(s) if *s == snap(&r) => Ok(()),
                Some(_) => Err(format!("clean word names batch {w}, the pool holds something else")),
                None => Err(format!("clean word names batch {w}, never applied")),
            }
        }
    }
}

/// Runs `batches` random frames on a primary; a mirror that started as a
/// copy of the primary applies each batch with capture on; then a second
/// mirror, holding an older state, takes a full copy with capture on.
fn campaign(seed: u64, batches: usize, drop: Option<&str>) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let cfg = CaptureConfig {
        seed,
        random_subsets: 4,
        torn: 2,
    };
    let mut out = Outcome {
        images: 0,
        violations: Vec::new(),
    };
    let mut p = Backend::create(SimSpace::new(POOL), Layout::small()).unwrap();
    p.set_journal(true);
    let source = p.epoch();
    let start = p.space().persisted_image();
    let mut snaps = vec![snap(&p)];
    let mirror_space = SimSpace::from_image(start.clone());
    copy_end(&mirror_space, source, 0);
    mirror_space.set_drop(drop.map(str::to_string));
    let mut m = Backend::open(mirror_space).unwrap();
    m.space().set_capture(Some(cfg));
    let mut slabs = Vec::new();
    for k in 1..=batches as u64 {
        let verbs = random_frame(&mut rng, &p, &mut slabs);
        for v in &verbs {
            if let (Verb::Malloc { .. }, Reply::Word(a)) = (v, p.verb(v)) {
                slabs.push(a);
            }
        }
        let j = p.take_journal();
        let (verbs, replies): (Vec<_>, Vec<_>) = j.into_iter().unzip();
        snaps.push(snap(&p));
        if let Err(e) = apply_batch(&mut m, source, k, &verbs, &replies) {
            out.violations.push(format!("batch {k}: {e}"));
            return out;
        }
        for img in m.space().take_images() {
            out.images += 1;
            if let Err(e) = check_image(img.data, &snaps[..=k as usize], false) {
                out.violations.push(format!("batch {k} image at {}: {e}", img.point));
            }
        }
        let durable = Backend::open(SimSpace::from_image(m.space().persisted_image())).unwrap();
        if durable.repl_words() != (source, k) || snap(&durable) != snaps[k as usize] {
            out.violations
                .push(format!("batch {k}: acknowledged batch not durable"));
        }
    }

    // A stale mirror (the start state, batch 0) takes a full copy.
    let stale = SimSpace::from_image(start);
    copy_end(&stale, source, 0);
    stale.set_drop(drop.map(str::to_string));
    stale.set_capture(Some(cfg));
    let image = p.space().persisted_image();
    let last = batches as u64;
    copy_begin(&stale);
    for c in image.chunks(POOL as usize / 4).enumerate() {
        copy_chunk(&stale, (c.0 * POOL as usize / 4) as u64, c.1).unwrap();
    }
    copy_end(&stale, source, last);
    let mut both = vec![snaps[0].clone()];
    both.resize(last as usize, snaps[0].clone());
    both.push(snaps[last as usize].clone());
    for img in stale.take_images() {
        out.images += 1;
        // Clean words name batch 0 (old state) or the last (the copy).
        let w = Backend::open(SimSpace::from_image(img.data.clone())).map(|r| r.repl_words().1);
        let want: &[Snap] = match w {
            Ok(0) => &snaps[..1],
            _ => &both,
        };
        if let Err(e) = check_image(img.data, want, true) {
            out.violations.push(format!("copy image at {}: {e}", img.point));
        }
    }
    match Backend::open(SimSpace::from_image(stale.persisted_image())) {
        Ok(r) if r.repl_words() == (source, last) && snap(&r) == snaps[last as usize] => {}
        _ => out.violations.push("finished copy not durable".into()),
    }
    out
}

#[test]
fn a_mirror_crashing_anywhere_recovers_a_clean_batch_or_knows_it_is_dirty() {
    for seed in 1..=3 {
        let o = campaign(seed, 60, None);
        assert!(
            o.violations.is_empty(),
            "seed {seed}: {} violations, first: {:?}",
            o.violations.len(),
            &o.violations[..o.violations.len().min(5)]
        );
        assert!(o.images > 300, "seed {seed}: only {} images", o.images);
    }
}

#[test]
fn every_dropped_mirror_point_is_caught() {
    let mine: Vec<_> = points::ALL
        .iter()
        .filter(|p| p.name.starts_with("asym.mirror."))
        .collect();
    assert_eq!(mine.len(), 4);
    for p in mine {
        let caught = (1..=3).any(|seed| !campaign(seed, 60, Some(p.name)).violations.is_empty());
        assert!(caught, "dropping {} goes unnoticed", p.name);
    }
}
