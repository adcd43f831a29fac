//! The zero-copy read API against the copying one and a BTreeMap model:
//! `get_with`, `range_with`, `range_rev_with`, `prefix_with` and
//! `for_each` on both leaf formats, on a mapped pool file (which lends
//! blob bytes in place) and on the crash simulator (which copies them);
//! snapshots and transactions (a transaction's own writes win); and that
//! a point read lends its value without allocating, on every engine.

use std::collections::BTreeMap;
use std::ops::{Bound as RB, ControlFlow};

use nvstore::pmem::{SimSpace, Space};
use nvstore::tree::in_range;
use nvstore::{Db, LeafKind, Options};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

mod strategies;
use strategies::{bound, key};

/// The system allocator, counting the allocations of threads that ask it
/// to ([`allocations_in`]), so a test can show that a read allocates
/// nothing.
struct Counting;

thread_local! {
    static COUNT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

// SAFETY: every call is passed to the system allocator unchanged; the
// count is a thread-local cell that never allocates.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: forwarded as received.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: forwarded as received.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// How many allocations this thread made while `f` ran.
fn allocations_in<R>(f: impl FnOnce() -> R) -> (u64, R) {
    COUNT.with(|c| c.set(Some(0)));
    let r = f();
    (COUNT.with(|c| c.replace(None)).unwrap_or(0), r)
}

/// 8-byte keys are drawn from this many values.
const KEYS: u64 = 256;

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
    /// `Db::update`: writes only over a key that exists.
    Update(Vec<u8>, Vec<u8>),
    Get(Vec<u8>),
    /// Bounds, reverse, and how many pairs to take before breaking.
    Range(RB<Vec<u8>>, RB<Vec<u8>>, bool, Option<usize>),
    Prefix(Vec<u8>),
    /// A snapshot checked again after the next `n` operations.
    Snapshot(usize),
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..9),
        2 => proptest::collection::vec(any::<u8>(), 9..300),
        1 => Just(vec![9u8; 5_000]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (key(KEYS), value()).prop_map(|(k, v)| Op::Put(k, v)),
        3 => key(KEYS).prop_map(Op::Del),
        3 => (key(KEYS), value()).prop_map(|(k, v)| Op::Update(k, v)),
        4 => key(KEYS).prop_map(Op::Get),
        2 => (bound(KEYS), bound(KEYS), any::<bool>(), proptest::option::of(0usize..20))
            .prop_map(|(a, b, r, t)| Op::Range(a, b, r, t)),
        1 => proptest::collection::vec(0u8..4, 0..3).prop_map(Op::Prefix),
        1 => (1usize..30).prop_map(Op::Snapshot),
    ]
}

/// Collects what a `*_with` scan lends, breaking after `take` pairs.
fn collect_with(take: Option<usize>, scan: impl FnOnce(&mut dyn FnMut(&[u8], &[u8]) -> ControlFlow<()>)) -> Pairs {
    let mut got = Vec::new();
    scan(&mut |k, v| {
        got.push((k.to_vec(), v.to_vec()));
        if take.is_some_and(|t| got.len() >= t) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    got
}

fn model_range(m: &BTreeMap<Vec<u8>, Vec<u8>>, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>, rev: bool) -> Pairs {
    let mut v: Pairs = m
        .iter()
        .filter(|(k, _)| in_range(k, lo, hi))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if rev {
        v.reverse();
    }
    v
}

fn run<S: Space>(db: &Db<S>, ops: &[Op]) {
    let mut m = BTreeMap::new();
    let versioned = db.leaf_format() == LeafKind::Nv;
    let mut snaps = Vec::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                db.put(k, v).unwrap();
                m.insert(k.clone(), v.clone());
            }
            Op::Del(k) => {
                db.delete(k).unwrap();
                m.remove(k);
            }
            Op::Update(k, v) => {
                let had = m.contains_key(k);
                assert_eq!(db.update(k, v).unwrap(), had);
                if had {
                    m.insert(k.clone(), v.clone());
                }
            }
            Op::Get(k) => {
                let want = m.get(k).cloned();
                assert_eq!(db.get(k).unwrap(), want);
                assert_eq!(db.get_with(k, |v| v.to_vec()).unwrap(), want);
                assert_eq!(db.get_with(k, |v| v.len()).unwrap(), want.map(|v| v.len()));
            }
            Op::Range(lo, hi, rev, take) => {
                let mut want = model_range(&m, lo, hi, *rev);
                let copied: Pairs = if *rev {
                    db.range_rev((lo.clone(), hi.clone())).collect()
                } else {
                    db.range((lo.clone(), hi.clone())).collect()
                };
                assert_eq!(copied, want);
                let got = collect_with(*take, |f| {
                    let r = (lo.clone(), hi.clone());
                    if *rev {
                        db.range_rev_with(r, f).unwrap()
                    } else {
                        db.range_with(r, f).unwrap()
                    }
                });
                if let Some(t) = take {
                    want.truncate((*t).max(1));
                }
                assert_eq!(got, want, "range {lo:?}..{hi:?} rev={rev} take={take:?}");
            }
            Op::Prefix(p) => {
                let want: Pairs = m
                    .iter()
                    .filter(|(k, _)| k.starts_with(p))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(db.prefix(p).collect::<Pairs>(), want);
                assert_eq!(collect_with(None, |f| db.prefix_with(p, f).unwrap()), want);
            }
            Op::Snapshot(n) if versioned => snaps.push((*n, m.clone(), db.snapshot().unwrap())),
            Op::Snapshot(_) => {}
        }
        for (left, at, snap) in &mut snaps {
            *left -= 1;
            if *left == 0 {
                let all = (RB::<Vec<u8>>::Unbounded, RB::<Vec<u8>>::Unbounded);
                let want = model_range(at, &all.0, &all.1, false);
                assert_eq!(collect_with(None, |f| snap.range_with(all.clone(), f).unwrap()), want);
                for (k, v) in at.iter().take(8) {
                    assert_eq!(snap.get_with(k, |x| x.to_vec()).unwrap().as_ref(), Some(v));
                    assert_eq!(snap.get(k).unwrap().as_ref(), Some(v));
                }
                for k in m.keys().filter(|k| !at.contains_key(*k)).take(4) {
                    assert_eq!(snap.get_with(k, |x| x.to_vec()).unwrap(), None);
                }
            }
        }
        snaps.retain(|(left, _, _)| *left > 0);
    }
    let all = collect_with(None, |f| db.for_each(f).unwrap());
    assert_eq!(all, model_range(&m, &RB::Unbounded, &RB::Unbounded, false));
    assert_eq!(all, db.iter().collect::<Pairs>());
}

fn opts(leaf: LeafKind) -> Options {
    Options {
        node_size: 256,
        size: 4 << 20,
        leaf,
        adaptive: nvstore::Adaptive::Off,
        ..Options::default()
    }
}

fn pool_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-read-with")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn leaf_kind() -> impl Strategy<Value = LeafKind> {
    prop_oneof![Just(LeafKind::Nv), Just(LeafKind::Isle)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The simulator copies lent bytes (its default `with_bytes`).
    #[test]
    fn reads_with_match_copies_and_the_model_simulated(
        leaf in leaf_kind(),
        ops in proptest::collection::vec(op(), 1..400),
    ) {
        let db = Db::create_in(SimSpace::new(4 << 20), "read-with".as_ref(), &opts(leaf)).unwrap();
        run(&db, &ops);
    }

    /// A mapped file lends blob bytes straight from the mapping.
    #[test]
    fn reads_with_match_copies_and_the_model_mapped(
        leaf in leaf_kind(),
        ops in proptest::collection::vec(op(), 1..400),
    ) {
        let dir = pool_dir();
        let db = Db::create(dir.path().join("p.nvs"), opts(leaf)).unwrap();
        run(&db, &ops);
    }
}

#[test]
fn transaction_reads_with_see_own_writes_over_the_snapshot() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), opts(LeafKind::Nv)).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let key = |rng: &mut rand::rngs::StdRng| format!("k{:03}", rng.gen_range(0..120)).into_bytes();
    let val = |rng: &mut rand::rngs::StdRng| vec![rng.gen::<u8>(); rng.gen_range(0..30)];
    for _ in 0..300 {
        let (k, v) = (key(&mut rng), val(&mut rng));
        db.put(&k, &v).unwrap();
    }
    for round in 0..60 {
        let mut tx = db.begin().unwrap();
        for _ in 0..rng.gen_range(0..25) {
            let k = key(&mut rng);
            if rng.gen_bool(0.3) {
                tx.delete(&k).unwrap();
            } else {
                let v = val(&mut rng);
                tx.put(&k, &v).unwrap();
            }
        }
        // Writes by others after the start stay invisible to the transaction.
        for _ in 0..5 {
            let (k, v) = (key(&mut rng), val(&mut rng));
            db.put(&k, &v).unwrap();
        }
        for _ in 0..20 {
            let k = key(&mut rng);
            assert_eq!(tx.get_with(&k, |v| v.to_vec()).unwrap(), tx.get(&k).unwrap());
        }
        let bound = |rng: &mut rand::rngs::StdRng| match rng.gen_range(0..3) {
            0 => RB::Unbounded,
            1 => RB::Included(key(rng)),
            _ => RB::Excluded(key(rng)),
        };
        for _ in 0..5 {
            let (lo, hi) = (bound(&mut rng), bound(&mut rng));
            let mut want = tx.range((lo.clone(), hi.clone()));
            let take = rng.gen_bool(0.3).then(|| rng.gen_range(1..10));
            if let Some(t) = take {
                want.truncate(t);
            }
            let got = collect_with(take, |f| tx.range_with((lo.clone(), hi.clone()), f).unwrap());
            assert_eq!(got, want, "round {round} {lo:?}..{hi:?} take {take:?}");
        }
        if round % 2 == 0 {
            // The writes above may have beaten it to a key.
            match tx.commit() {
                Ok(_) | Err(nvstore::Error::Conflict) => {}
                Err(e) => panic!("commit: {e}"),
            }
        }
    }
}

#[test]
fn an_update_of_an_absent_key_writes_nothing() {
    let dir = pool_dir();
    for leaf in [LeafKind::Nv, LeafKind::Isle] {
        let db = Db::create(dir.path().join(format!("u{leaf:?}.nvs")), opts(leaf)).unwrap();
        db.put(b"there", b"old").unwrap();
        let used = db.used_bytes();
        // A value large enough for a blob: the blob written ahead of the
        // leaf is freed again when the key turns out absent.
        assert!(!db.update(b"absent", &vec![7u8; 5000]).unwrap());
        assert!(!db.update(b"absent", b"small").unwrap());
        assert_eq!(db.get(b"absent").unwrap(), None);
        assert_eq!(db.used_bytes(), used, "{leaf:?}");
        assert!(db.update(b"there", &vec![8u8; 5000]).unwrap());
        assert_eq!(db.get(b"there").unwrap(), Some(vec![8u8; 5000]));
        assert!(db.update(b"there", b"new").unwrap());
        assert_eq!(db.get(b"there").unwrap(), Some(b"new".to_vec()));
        let report = db.check();
        assert!(report.ok, "{leaf:?}: {:?}", report.problems);
        assert_eq!(report.keys, 1);
    }
}

#[test]
fn a_lent_value_is_the_stored_one_for_every_size() {
    let dir = pool_dir();
    for engine in ["nv", "isle", "hash"] {
        let o = match engine {
            "nv" => opts(LeafKind::Nv),
            "isle" => opts(LeafKind::Isle),
            _ => Options {
                engine: nvstore::EngineKind::Hash,
                ..opts(LeafKind::Nv)
            },
        };
        let db = Db::create(dir.path().join(format!("{engine}.nvs")), o).unwrap();
        let sizes = [0usize, 1, 7, 8, 9, 63, 64, 65, 255, 256, 257, 4096, 100_000];
        for (i, &n) in sizes.iter().enumerate() {
            let v: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
            db.put(format!("key{i:02}").as_bytes(), &v).unwrap();
        }
        for (i, &n) in sizes.iter().enumerate() {
            let k = format!("key{i:02}");
            let want: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
            assert_eq!(db.get_with(k.as_bytes(), |v| v == want.as_slice()).unwrap(), Some(true));
        }
        assert_eq!(db.get_with(b"absent", |_| unreachable!()).unwrap(), None::<()>);
        // A point read lends in place: no allocation, whether key and
        // value sit in the element (or slot) or out of line, nor for a
        // miss.
        let long = [b'k'; 40];
        db.put(&long, &[7u8; 512]).unwrap();
        let keys: Vec<Vec<u8>> = (0..sizes.len()).map(|i| format!("key{i:02}").into_bytes()).collect();
        for _ in 0..2 {
            let (n, lens) = allocations_in(|| {
                let lens: [Option<usize>; 4] = [&keys[0][..], &keys[3], &keys[sizes.len() - 1], &long]
                    .map(|k| db.get_with(k, |v| v.len()).unwrap());
                (lens, db.get_with(b"absent", |v| v.len()).unwrap())
            });
            assert_eq!(lens, ([Some(0), Some(8), Some(100_000), Some(512)], None), "{engine}");
            assert_eq!(n, 0, "{engine}: get_with allocated {n} times");
        }
        db.delete(&long).unwrap();
        let mut seen = 0;
        db.for_each(|k, v| {
            let i: usize = std::str::from_utf8(&k[3..]).unwrap().parse().unwrap();
            assert_eq!(v.len(), sizes[i]);
            seen += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(seen, sizes.len());
        assert!(matches!(
            db.get_with(&vec![0u8; nvstore::tree::MAX_KEY + 1], |_| ()),
            Err(nvstore::Error::KeyTooLarge { .. })
        ));
    }
}
