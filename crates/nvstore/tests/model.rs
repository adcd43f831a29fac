//! Model tests: each engine against a BTreeMap (proptest), including range,
//! prefix and reverse edge cases, empty and large values, and reopening.
//! The same operations run on tree pools and on hash pools; on a hash pool
//! write batches and snapshots must be refused (`Error::Unsupported`) and
//! leave the pool unchanged.

use std::collections::BTreeMap;
use std::ops::Bound as RB;

use nvstore::pmem::SimSpace;
use nvstore::{Db, EngineKind, Error, Options};
use proptest::prelude::*;

mod strategies;
use strategies::{bound, key};

/// 8-byte keys are drawn from this many values.
const KEYS: u64 = 512;

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
    /// `Db::update`: writes only over a key that exists.
    Update(Vec<u8>, Vec<u8>),
    Get(Vec<u8>),
    Range(RB<Vec<u8>>, RB<Vec<u8>>, bool),
    Prefix(Vec<u8>),
    /// Clean close, instant reopen.
    Reopen,
    /// Process crash (every store so far reached memory), rebuild on open.
    Crash,
    /// A write batch (`None`: delete).
    Batch(Vec<(Vec<u8>, Option<Vec<u8>>)>),
    /// A snapshot taken now, checked against the model as it was after
    /// the next `n` operations.
    Snapshot(usize),
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..9),
        1 => proptest::collection::vec(any::<u8>(), 9..300),
        1 => Just(vec![7u8; 70_000]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (key(KEYS), value()).prop_map(|(k, v)| Op::Put(k, v)),
        4 => key(KEYS).prop_map(Op::Del),
        3 => (key(KEYS), value()).prop_map(|(k, v)| Op::Update(k, v)),
        3 => key(KEYS).prop_map(Op::Get),
        2 => (bound(KEYS), bound(KEYS), any::<bool>()).prop_map(|(a, b, r)| Op::Range(a, b, r)),
        1 => proptest::collection::vec(0u8..4, 0..3).prop_map(Op::Prefix),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        2 => proptest::collection::vec((key(KEYS), proptest::option::weighted(0.8, value())), 1..40).prop_map(Op::Batch),
        1 => (1usize..30).prop_map(Op::Snapshot),
    ]
}

fn model_range(
    m: &BTreeMap<Vec<u8>, Vec<u8>>,
    lo: &RB<Vec<u8>>,
    hi: &RB<Vec<u8>>,
    rev: bool,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> = m
        .iter()
        .filter(|(k, _)| nvstore::tree::in_range(k, lo, hi))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if rev {
        v.reverse();
    }
    v
}

fn small_opts(engine: EngineKind) -> Options {
    Options {
        node_size: 256,
        size: 4 << 20,
        engine,
        ..Options::default()
    }
}

fn run(engine: EngineKind, ops: Vec<Op>) {
    let hash = engine == EngineKind::Hash;
    let mut db = Db::create_in(SimSpace::new(4 << 20), "model".as_ref(), &small_opts(engine)).unwrap();
    assert_eq!(db.engine(), engine);
    let mut m = BTreeMap::new();
    // Open snapshots: (operations left, model at the snapshot, its contents
    // read when taken); checked again when the countdown ends.
    type Pin = std::sync::Arc<nvstore::tree::SnapshotPin<SimSpace, nvstore::tree::nv::Nv>>;
    type Open = (usize, BTreeMap<Vec<u8>, Vec<u8>>, Pin);
    let mut snaps: Vec<Open> = Vec::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                db.put(&k, &v).unwrap();
                m.insert(k, v);
            }
            Op::Del(k) => assert_eq!(db.delete(&k).unwrap(), m.remove(&k).is_some()),
            Op::Update(k, v) => {
                let had = m.contains_key(&k);
                assert_eq!(db.update(&k, &v).unwrap(), had);
                if had {
                    m.insert(k, v);
                }
            }
            Op::Get(k) => assert_eq!(db.get(&k).unwrap(), m.get(&k).cloned()),
            Op::Range(lo, hi, rev) => {
                let got: Vec<_> = if rev {
                    db.range_rev((lo.clone(), hi.clone())).collect()
                } else {
                    db.range((lo.clone(), hi.clone())).collect()
                };
                assert_eq!(got, model_range(&m, &lo, &hi, rev), "range {lo:?}..{hi:?} rev={rev}");
            }
            Op::Prefix(p) => {
                let got: Vec<_> = db.prefix(&p).collect();
                let want: Vec<_> = m
                    .iter()
                    .filter(|(k, _)| k.starts_with(&p))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(got, want);
                let mut rev: Vec<_> = db.prefix_rev(&p).collect();
                rev.reverse();
                assert_eq!(rev, want, "prefix_rev {p:?}");
            }
            Op::Batch(w) if hash => {
                let mut b = nvstore::WriteBatch::new();
                for (k, v) in &w {
                    match v {
                        Some(v) => b.put(k, v),
                        None => b.delete(k),
                    }
                }
                assert!(matches!(db.write_batch(b), Err(Error::Unsupported(_))));
            }
            Op::Snapshot(_) if hash => {
                assert!(matches!(db.snapshot(), Err(Error::Unsupported(_))));
                assert!(matches!(db.begin(), Err(Error::Unsupported(_))));
            }
            Op::Batch(w) => {
                let mut b = nvstore::WriteBatch::new();
                for (k, v) in w {
                    match v {
                        Some(v) => {
                            b.put(&k, &v);
                            m.insert(k, v);
                        }
                        None => {
                            b.delete(&k);
                            m.remove(&k);
                        }
                    }
                }
                db.write_batch(b).unwrap();
            }
            Op::Snapshot(n) => {
                let pin = db.tree().pin_snapshot();
                snaps.push((n, m.clone(), pin));
            }
            Op::Reopen => {
                snaps.clear(); // snapshots do not outlive the open pool
                let space = db.close_into_space().unwrap();
                db = Db::open_space(SimSpace::from_image(space.current_image()), "model".as_ref()).unwrap();
                // A hash pool loads the index its clean close saved.
                let want = if hash {
                    nvstore::RecoveryKind::Loaded
                } else {
                    nvstore::RecoveryKind::Instant
                };
                assert_eq!(db.recovery().kind, want);
                assert!(db.stat().clean_shutdown);
            }
            Op::Crash => {
                snaps.clear();
                // A crash: the next open sees the image as it is now. The
                // old pool's clean shutdown on drop writes only its own
                // space, which nothing reads again; forgetting the Db
                // instead leaked a pool per crash (gigabytes per run).
                let image = db.space().current_image();
                drop(db);
                db = Db::open_space(SimSpace::from_image(image), "model".as_ref()).unwrap();
                assert_eq!(db.recovery().kind, nvstore::RecoveryKind::Rebuild);
            }
        }
        assert_eq!(db.len(), m.len() as u64);
        for (left, at, pin) in &mut snaps {
            *left = left.saturating_sub(1);
            if *left == 0 {
                let got: BTreeMap<_, _> = db
                    .tree()
                    .range_at(RB::Unbounded, RB::Unbounded, false, Some(pin.clone()))
                    .collect();
                assert_eq!(&got, at, "snapshot at {} changed", pin.ts);
                for (k, v) in at.iter().take(5) {
                    assert_eq!(db.tree().get_at(k, pin.ts).unwrap().as_ref(), Some(v));
                }
            }
        }
        snaps.retain(|(left, _, _)| *left > 0);
        if std::env::var("NVSTORE_CHECK_EVERY_OP").is_ok() {
            let r = db.check();
            assert!(r.ok, "{:?}", r.problems);
        }
    }
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    let all: Vec<_> = db.iter().collect();
    assert_eq!(all, model_range(&m, &RB::Unbounded, &RB::Unbounded, false));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn tree_matches_btreemap(ops in proptest::collection::vec(op(), 1..600)) {
        run(EngineKind::Tree, ops);
    }

    #[test]
    fn hash_matches_btreemap(ops in proptest::collection::vec(op(), 1..600)) {
        run(EngineKind::Hash, ops);
    }
}
