//! Workload: seeded operations biased toward rare paths (see the module
//! documentation of `crashtest`).

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;

use super::WorkStats;

pub(super) type Val = Arc<Vec<u8>>;
pub(super) type Model = BTreeMap<Vec<u8>, Val>;

#[derive(Clone, Debug)]
pub(super) enum Op {
    Put(Vec<u8>, Val),
    Del(Vec<u8>),
    /// A delete while a snapshot is live: it cannot mark the key's elements
    /// gone in place, so it appends a NEGATIVE element.
    DelPinned(Vec<u8>),
    /// A put while a snapshot is live: an update appends instead of
    /// replacing a compact entry's value in place.
    PutPinned(Vec<u8>, Val),
    Get(Vec<u8>),
    /// A write batch (`None`: delete) over distinct keys: all or nothing.
    Batch(Vec<(Vec<u8>, Option<Val>)>),
    /// A transaction that reads each key, then writes it as given.
    Txn(Vec<(Vec<u8>, Option<Val>)>),
}

impl Op {
    /// The model changes this op makes (all or none of them).
    pub(super) fn effect(&self) -> Vec<(Vec<u8>, Option<Val>)> {
        match self {
            Op::Put(k, v) | Op::PutPinned(k, v) => vec![(k.clone(), Some(v.clone()))],
            Op::Del(k) | Op::DelPinned(k) => vec![(k.clone(), None)],
            Op::Get(_) => Vec::new(),
            Op::Batch(w) | Op::Txn(w) => w.clone(),
        }
    }
    pub(super) fn describe(&self) -> String {
        let many = |what: &str, w: &[(Vec<u8>, Option<Val>)]| {
            let ks: Vec<String> = w
                .iter()
                .map(|(k, v)| format!("{}{}", if v.is_some() { "+" } else { "-" }, show(k)))
                .collect();
            format!("{what} [{}]", ks.join(" "))
        };
        match self {
            Op::Put(k, v) => format!("put {} ({} B value)", show(k), v.len()),
            Op::PutPinned(k, v) => format!("put {} ({} B value) under a snapshot", show(k), v.len()),
            Op::Del(k) => format!("delete {}", show(k)),
            Op::DelPinned(k) => format!("delete {} under a snapshot", show(k)),
            Op::Get(k) => format!("get {}", show(k)),
            Op::Batch(w) => many("write batch", w),
            Op::Txn(w) => many("transaction", w),
        }
    }
}

/// Printable key: text when it is, hex otherwise; long keys shortened.
pub(super) fn show(k: &[u8]) -> String {
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
pub(super) fn key_of(t: usize, id: u32) -> Vec<u8> {
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

pub(super) const EDGE_KEYS: u32 = 5;

/// Key `j` of writer `t`'s sliding window: 8 bytes, "w" then the big-endian
/// index, so a writer's window keys ascend with `j` and interleave with the
/// other writer's.
pub(super) fn window_key(t: usize, j: u64) -> Vec<u8> {
    let mut k = (j * 2 + t as u64).to_be_bytes();
    k[0] = b'w';
    k.to_vec()
}

/// Value of length `len` unique to operation `g` (when long enough).
pub(super) fn value_of(g: u64, len: usize) -> Vec<u8> {
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
pub(super) enum Phase {
    Fill,
    Churn,
    Drain,
}

pub(super) fn phase_of(op: u64) -> Phase {
    match op % 400 {
        0..150 => Phase::Fill,
        150..250 => Phase::Churn,
        _ => Phase::Drain,
    }
}

pub(super) struct Gen {
    pub(super) rng: StdRng,
    pub(super) keys_per_thread: u32,
    /// Make one op in four a write batch or transaction.
    pub(super) txn: bool,
    /// Isle pools: make 8-byte values common, so compact pairs and their
    /// in-place updates are exercised as much as general ones.
    pub(super) compact_values: bool,
    /// Run some deletes and updates under a live snapshot (pools that have
    /// snapshots): they append rather than change a leaf in place.
    pub(super) pinned_deletes: bool,
    /// Draws which of them: a stream of its own, so the operations are the
    /// same with and without pinning.
    pub(super) pin_rng: StdRng,
    /// Per writer: the sliding window of keys `[lo, hi)` (see [`window_key`]).
    pub(super) window: [(u64, u64); 2],
}

impl Gen {
    pub(super) fn pick_id(&mut self, t: usize) -> u32 {
        if t == 0 && self.rng.gen_ratio(1, 40) {
            1_000_000 + self.rng.gen_range(0..EDGE_KEYS)
        } else {
            self.rng.gen_range(0..self.keys_per_thread)
        }
    }

    /// A small value. Few distinct blob size classes keep the pool small
    /// (each class takes a chunk) and so the images cheap: blobs of 64,
    /// 128, 192 and 256 bytes (the last shared with the 256-byte leaves).
    pub(super) fn value(&mut self, g: u64) -> Val {
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

    /// A delete of `k`; one in two runs while a snapshot is live (a
    /// reader's), which keeps the NEGATIVE-element path of deletes as
    /// covered as deletes in place.
    fn del(&mut self, k: Vec<u8>, stats: &mut WorkStats) -> Op {
        if self.pinned_deletes && self.pin_rng.gen_ratio(1, 2) {
            stats.deletes_pinned += 1;
            Op::DelPinned(k)
        } else {
            Op::Del(k)
        }
    }

    /// Next operation of writer `t` given the model (`g` numbers it).
    pub(super) fn op(&mut self, t: usize, g: u64, phase: Phase, model: &Model, stats: &mut WorkStats) -> Op {
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
            // Several of the writer's keys, usually in different leaves
            // (or one: a transaction of one key takes `Db::write_one`);
            // puts and deletes of present and absent keys.
            let mut w: Vec<(Vec<u8>, Option<Val>)> = Vec::new();
            for _ in 0..self.rng.gen_range(1..=6) {
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
                    return self.del(k, stats);
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
            if want_present && self.pinned_deletes && self.pin_rng.gen_ratio(1, 2) {
                stats.puts_pinned += 1;
                return Op::PutPinned(k, v);
            }
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
            self.del(k, stats)
        } else {
            stats.gets += 1;
            let id = self.pick_id(t);
            Op::Get(key_of(t, id))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

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
}
