//! One capture: the crash images a machine could hold at this moment,
//! built, deduplicated and queued (see the module documentation of `sim`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::hash::{finish_hash, line_hash};
use super::{line_range, CrashImage, ImageKind, State, EXHAUSTIVE_LINES, EXHAUSTIVE_MAX_IMAGES, WORD};

impl State {
    /// Generates this moment's crash images (when capture is on).
    pub(super) fn capture(&mut self, point: &'static str) {
        let Some(cfg) = self.capture else {
            return;
        };
        self.capture_seq += 1;
        let seq = self.capture_seq;
        let base = self.persisted_sum();
        let size = self.cur.len();

        // Every in-flight line with more than one possible content.
        let mut vars: Vec<VarLine> = Vec::new();
        for (&idx, ls) in &self.lines {
            let r = line_range(size, idx);
            let p = &self.persisted[r.clone()];
            let c = &self.cur[r.clone()];
            let mut cands = vec![Cand::new(idx, p.to_vec())];
            let mut current = 0;
            if c != p {
                cands.push(Cand::new(idx, c.to_vec()));
                current = 1;
            }
            for snap in &ls.pending {
                let mut b = p.to_vec();
                b[..snap.bytes.len()].copy_from_slice(&snap.bytes);
                if cands.iter().all(|x| x.bytes != b) {
                    cands.push(Cand::new(idx, b));
                }
            }
            if cands.len() > 1 {
                vars.push(VarLine {
                    idx,
                    start: r.start,
                    cands,
                    current,
                });
            }
        }

        let mut rng = StdRng::seed_from_u64(cfg.seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut em = Emitter {
            state: self,
            point,
            seq,
            base,
            vars: &vars,
        };

        // (a) persisted only, (b) everything in flight.
        em.emit(ImageKind::Persisted, &vec![0; vars.len()]);
        let all: Vec<usize> = vars.iter().map(|v| v.current).collect();
        em.emit(ImageKind::AllInFlight, &all);

        // (c) subsets of whole lines.
        if !vars.is_empty() {
            let combos = vars.iter().try_fold(1usize, |acc, v| acc.checked_mul(v.cands.len()));
            match combos {
                Some(n) if vars.len() <= EXHAUSTIVE_LINES && n <= EXHAUSTIVE_MAX_IMAGES => {
                    let mut pick = vec![0; vars.len()];
                    for mut k in 0..n {
                        for (slot, v) in pick.iter_mut().zip(&vars) {
                            *slot = k % v.cands.len();
                            k /= v.cands.len();
                        }
                        em.emit(ImageKind::Subset, &pick);
                    }
                }
                _ => {
                    for _ in 0..cfg.random_subsets {
                        let pick: Vec<usize> = vars.iter().map(|v| rng.gen_range(0..v.cands.len())).collect();
                        em.emit(ImageKind::Subset, &pick);
                    }
                }
            }
        }

        // (d) torn words between persisted and current.
        if vars.iter().any(|v| v.current != 0) {
            for _ in 0..cfg.torn {
                let lines: Vec<Cand> = vars
                    .iter()
                    .map(|v| {
                        let p = &v.cands[0].bytes;
                        if v.current == 0 {
                            return Cand::new(v.idx, p.clone());
                        }
                        let c = &v.cands[v.current].bytes;
                        let mut b = p.clone();
                        for (w, cw) in b.chunks_mut(WORD).zip(c.chunks(WORD)) {
                            if rng.gen::<bool>() {
                                w.copy_from_slice(cw);
                            }
                        }
                        Cand::new(v.idx, b)
                    })
                    .collect();
                em.emit_lines(ImageKind::Torn, &lines);
            }
        }
    }
}

/// One possible content of a line, with its hash.
struct Cand {
    bytes: Vec<u8>,
    hash: u64,
}

impl Cand {
    fn new(idx: u64, bytes: Vec<u8>) -> Cand {
        Cand {
            hash: line_hash(idx, &bytes),
            bytes,
        }
    }
}

/// An in-flight line with its possible contents: `cands[0]` is the
/// persisted content, `cands[current]` the current one, the rest pending
/// flush-time snapshots; all distinct.
struct VarLine {
    idx: u64,
    start: usize,
    cands: Vec<Cand>,
    current: usize,
}

/// Builds, deduplicates and queues the images of one capture.
struct Emitter<'a> {
    state: &'a mut State,
    point: &'static str,
    seq: u64,
    base: u64,
    vars: &'a [VarLine],
}

impl Emitter<'_> {
    /// The image with line `vars[i]` at its candidate `pick[i]`.
    fn emit(&mut self, kind: ImageKind, pick: &[usize]) {
        let chosen: Vec<&Cand> = self.vars.iter().zip(pick).map(|(v, &k)| &v.cands[k]).collect();
        self.emit_chosen(kind, &chosen);
    }

    /// The image with line `vars[i]` holding `lines[i]`.
    fn emit_lines(&mut self, kind: ImageKind, lines: &[Cand]) {
        let chosen: Vec<&Cand> = lines.iter().collect();
        self.emit_chosen(kind, &chosen);
    }

    fn emit_chosen(&mut self, kind: ImageKind, chosen: &[&Cand]) {
        let s = &mut *self.state;
        let mut sum = self.base;
        for (v, c) in self.vars.iter().zip(chosen) {
            sum = sum.wrapping_sub(v.cands[0].hash).wrapping_add(c.hash);
        }
        if !s.seen.insert(finish_hash(sum, s.persisted.len())) {
            s.images_duplicate += 1;
            return;
        }
        let mut data = s.persisted.clone();
        for (v, c) in self.vars.iter().zip(chosen) {
            data[v.start..v.start + c.bytes.len()].copy_from_slice(&c.bytes);
        }
        s.queue.push(CrashImage {
            kind,
            point: self.point,
            seq: self.seq,
            data,
        });
        s.images_generated += 1;
    }
}
