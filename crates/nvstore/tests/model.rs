//! Model tests: the tree against a BTreeMap (proptest), including range,
//! prefix and reverse edge cases, empty and large values, and reopening.

use std::collections::BTreeMap;
use std::ops::Bound as RB;

use nvstore::pmem::SimSpace;
use nvstore::{Db, Options};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
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

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(0u8..4, 0..4),
        2 => any::<u64>().prop_map(|k| (k % 512).to_be_bytes().to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 9..40),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..9),
        1 => proptest::collection::vec(any::<u8>(), 9..300),
        1 => Just(vec![7u8; 70_000]),
    ]
}

fn bound() -> impl Strategy<Value = RB<Vec<u8>>> {
    prop_oneof![
        Just(RB::Unbounded),
        key().prop_map(RB::Included),
        key().prop_map(RB::Excluded)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (key(), value()).prop_map(|(k, v)| Op::Put(k, v)),
        4 => key().prop_map(Op::Del),
        3 => key().prop_map(Op::Get),
        2 => (bound(), bound(), any::<bool>()).prop_map(|(a, b, r)| Op::Range(a, b, r)),
        1 => proptest::collection::vec(0u8..4, 0..3).prop_map(Op::Prefix),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        2 => proptest::collection::vec((key(), proptest::option::weighted(0.8, value())), 1..40).prop_map(Op::Batch),
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

fn small_opts() -> Options {
    Options {
        node_size: 256,
        size: 4 << 20,
        ..Options::default()
    }
}

fn run(ops: Vec<Op>) {
    let mut db = Db::create_in(SimSpace::new(4 << 20), "model".as_ref(), &small_opts()).unwrap();
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
                assert_eq!(db.recovery().kind, nvstore::RecoveryKind::Instant);
            }
            Op::Crash => {
                snaps.clear();
                let image = db.space().current_image();
                std::mem::forget(db); // no clean shutdown: a crash
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
        run(ops);
    }
}
