//! YCSB's request generators, as YCSB's `site.ycsb.generator` package defines
//! them (B. F. Cooper et al., "Benchmarking Cloud Serving Systems with YCSB",
//! SoCC 2010; the zipfian method is J. Gray et al., "Quickly Generating
//! Billion-Record Synthetic Databases", SIGMOD 1994).
//!
//! - [`Zipfian`]: `ZipfianGenerator`, constant 0.99, zeta(n) computed once and
//!   extended incrementally when the item count grows (`nextLong(itemcount)`);
//! - [`ScrambledZipfian`]: `ScrambledZipfianGenerator`: a zipfian over
//!   10,000,000,000 items with the precomputed zeta 26.46902820178302, hashed
//!   with FNV-1a-64 into `[min, max]`, so the popular items are scattered;
//! - [`SkewedLatest`]: `SkewedLatestGenerator`: `last - zipfian(last)`, so
//!   the most recently inserted keys are the most popular;
//! - [`Uniform`]: `UniformLongGenerator`, inclusive bounds;
//! - [`AckCounter`]: `AcknowledgedCounterGenerator`: insert key numbers are
//!   handed out in order and `last_value` only moves past a key once it and
//!   every key before it have been acknowledged (inserted).
//!
//! Each generator draws from a caller-supplied RNG, so a thread owns its own
//! generator and runs are reproducible from their seed (YCSB uses
//! `ThreadLocalRandom`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rand::Rng;

/// YCSB's `ZipfianGenerator.ZIPFIAN_CONSTANT`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// `ScrambledZipfianGenerator.ITEM_COUNT`: the zipfian is drawn over this
/// many items, then hashed into the real range.
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// `ScrambledZipfianGenerator.ZETAN`: zeta(ITEM_COUNT, 0.99), precomputed.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 bytes of `val`, low byte
/// first, then `Math.abs` of the signed result.
pub fn fnvhash64(mut val: u64) -> u64 {
    let mut h = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        h ^= val & 0xff;
        h = h.wrapping_mul(FNV_PRIME_64);
        val >>= 8;
    }
    (h as i64).wrapping_abs() as u64
}

/// `ZipfianGenerator.zeta(st, n, theta, initialsum)`: adds the terms
/// `1 / (i + 1)^theta` for `i` in `[st, n)` to `initial`.
pub fn zeta(st: u64, n: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in st..n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// YCSB's `ZipfianGenerator`: item `base + i` has probability proportional
/// to `1 / (i + 1)^theta`.
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: u64,
    base: u64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    countforzeta: u64,
    eta: f64,
}

impl Zipfian {
    /// Items `[min, max]`, constant 0.99, zeta computed (O(items)).
    pub fn new(min: u64, max: u64) -> Zipfian {
        let items = max - min + 1;
        Zipfian::with_zetan(min, max, ZIPFIAN_CONSTANT, zeta(0, items, ZIPFIAN_CONSTANT, 0.0))
    }

    /// Items `[0, items)`.
    pub fn with_items(items: u64) -> Zipfian {
        Zipfian::new(0, items - 1)
    }

    /// With a precomputed zeta(items, theta).
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        Zipfian {
            items,
            base: min,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            countforzeta: items,
            eta: (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan),
        }
    }

    /// `nextLong(itemcount)`: a value in `[base, base + itemcount)`. A larger
    /// item count than last time extends zeta incrementally; a smaller one is
    /// ignored (YCSB's default, `allowitemcountdecrease = false`).
    pub fn next_with<R: Rng + ?Sized>(&mut self, itemcount: u64, rng: &mut R) -> u64 {
        if itemcount > self.countforzeta {
            self.zetan = zeta(self.countforzeta, itemcount, self.theta, self.zetan);
            self.countforzeta = itemcount;
            // YCSB recomputes eta with the constructor's item count here.
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan);
        }
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
    }

    /// `nextValue()`: over the constructor's item count.
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.next_with(self.items, rng)
    }

    /// zeta(n) as currently computed.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }
}

/// YCSB's `ScrambledZipfianGenerator` (constant 0.99 only, as YCSB's
/// workloads use it).
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    gen: Zipfian,
    min: u64,
    itemcount: u64,
}

impl ScrambledZipfian {
    /// Items `[min, max]`.
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            gen: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
            min,
            itemcount: max - min + 1,
        }
    }

    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.min + fnvhash64(self.gen.next(rng)) % self.itemcount
    }
}

/// YCSB's `UniformLongGenerator`: uniform over `[lb, ub]`.
#[derive(Clone, Copy, Debug)]
pub struct Uniform {
    lb: u64,
    ub: u64,
}

impl Uniform {
    pub fn new(lb: u64, ub: u64) -> Uniform {
        Uniform { lb, ub }
    }

    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        rng.gen_range(self.lb..=self.ub)
    }
}

/// YCSB's `AcknowledgedCounterGenerator`, shared by every client thread:
/// `next_value` hands out insert key numbers; `last_value` is the highest
/// number such that it and every number before it have been acknowledged.
#[derive(Debug)]
pub struct AckCounter {
    next: AtomicU64,
    limit: AtomicU64,
    /// Acknowledged numbers above `limit + 1`.
    pending: Mutex<BTreeSet<u64>>,
}

impl AckCounter {
    /// Starts at `start` (the record count: keys `[0, start)` are loaded).
    pub fn new(start: u64) -> AckCounter {
        AckCounter {
            next: AtomicU64::new(start),
            limit: AtomicU64::new(start.wrapping_sub(1)),
            pending: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn next_value(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks `v` as inserted.
    pub fn acknowledge(&self, v: u64) {
        let mut pending = self.pending.lock();
        pending.insert(v);
        let mut limit = self.limit.load(Ordering::Relaxed);
        while pending.remove(&limit.wrapping_add(1)) {
            limit = limit.wrapping_add(1);
        }
        self.limit.store(limit, Ordering::Release);
    }

    pub fn last_value(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }
}

/// YCSB's `SkewedLatestGenerator`: `last - zipfian(last)` over the
/// acknowledged insert counter, so recent inserts are the most popular.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// Over a counter whose current `last_value` is `last`.
    pub fn new(last: u64) -> SkewedLatest {
        SkewedLatest {
            zipfian: Zipfian::with_items(last.max(1)),
        }
    }

    /// The next key number, given the counter's current `last_value`.
    pub fn next<R: Rng + ?Sized>(&mut self, last: u64, rng: &mut R) -> u64 {
        last - self.zipfian.next_with(last, rng).min(last)
    }
}

/// YCSB's `DiscreteGenerator` over operation kinds: pick with the given
/// weights (normalised by their sum).
#[derive(Clone, Debug)]
pub struct Discrete<T: Copy> {
    values: Vec<(f64, T)>,
    sum: f64,
}

impl<T: Copy> Discrete<T> {
    pub fn new(values: Vec<(f64, T)>) -> Discrete<T> {
        let values: Vec<(f64, T)> = values.into_iter().filter(|(w, _)| *w > 0.0).collect();
        let sum = values.iter().map(|(w, _)| w).sum();
        assert!(!values.is_empty(), "a discrete generator needs a positive weight");
        Discrete { values, sum }
    }

    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> T {
        let mut val: f64 = rng.gen();
        for &(w, v) in &self.values {
            if val < w / self.sum {
                return v;
            }
            val -= w / self.sum;
        }
        self.values.last().expect("non-empty").1
    }
}
