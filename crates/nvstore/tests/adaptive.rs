//! Workload-adaptive node sizing (NV-Tree §5) end to end: a skewed
//! workload makes leaves of several sizes; the tree still agrees with a
//! BTreeMap model, `check` passes, and both a clean reopen and a crash
//! (rebuild from the leaves) keep every leaf's size and every pair.

use std::collections::{BTreeMap, BTreeSet};

use nvstore::pmem::SimSpace;
use nvstore::{Adaptive, Db, Options, RecoveryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn opts(adaptive: Adaptive) -> Options {
    Options {
        node_size: 256,
        size: 8 << 20,
        adaptive,
        ..Options::default()
    }
}

fn leaf_sizes(db: &Db<SimSpace>) -> BTreeMap<u64, u64> {
    db.tree()
        .index
        .load()
        .entries()
        .iter()
        .map(|e| (e.leaf.off, e.leaf.size))
        .collect()
}

/// Loads 2000 keys, then runs skewed updates (a hot 5 % zone), some
/// deletes and inserts, and searches of a cold zone; checks against the
/// model as it goes. Returns the db and the model.
fn skewed(s: Adaptive, seed: u64) -> (Db<SimSpace>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let db = Db::create_in(SimSpace::new(8 << 20), "adaptive".as_ref(), &opts(Adaptive::Off)).unwrap();
    let mut m = BTreeMap::new();
    let key = |i: u64| (i * 7919 % 2000).to_be_bytes().to_vec();
    for i in 0..2000 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        m.insert(key(i), i.to_le_bytes().to_vec());
    }
    db.set_adaptive(s);
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..20_000u64 {
        let r: u32 = rng.gen_range(0..100);
        let k = if r < 80 {
            (1900 + rng.gen_range(0..100u64)).to_be_bytes().to_vec() // hot writes
        } else {
            rng.gen_range(0..400u64).to_be_bytes().to_vec() // cold-write zone
        };
        match r {
            0..=79 => {
                // Half the values are 7 bytes: an 8-byte value over a key
                // held compact is replaced in place and never fills a leaf.
                let v = round.to_le_bytes()[..7 + (round % 2) as usize].to_vec();
                db.put(&k, &v).unwrap();
                m.insert(k, v);
            }
            80..=84 => assert_eq!(db.delete(&k).unwrap(), m.remove(&k).is_some()),
            _ => assert_eq!(db.get(&k).unwrap(), m.get(&k).cloned(), "round {round}"),
        }
    }
    (db, m)
}

fn assert_same(db: &Db<SimSpace>, m: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let got: BTreeMap<Vec<u8>, Vec<u8>> = db.iter().collect();
    assert!(got == *m, "tree differs from the model");
    assert_eq!(db.len(), m.len() as u64);
    let r = db.check();
    assert!(r.ok, "{r:?}");
}

#[test]
fn every_strategy_keeps_the_model_and_mixes_leaf_sizes() {
    for s in [Adaptive::Conservative, Adaptive::Aggressive, Adaptive::Balanced] {
        let (db, m) = skewed(s, 3);
        assert_same(&db, &m);
        let sizes: BTreeSet<u64> = leaf_sizes(&db).into_values().collect();
        assert!(sizes.len() >= 2, "{s}: leaf sizes {sizes:?}");
        assert!(sizes.iter().any(|&z| z > 256), "{s}: no leaf grew: {sizes:?}");
        assert!(db.tree().adaptive.enlarged.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
}

#[test]
fn off_keeps_the_node_size() {
    let (db, m) = skewed(Adaptive::Off, 3);
    assert_same(&db, &m);
    assert_eq!(
        db.tree().adaptive.enlarged.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(db.tree().adaptive.writes.load(), 0);
}

#[test]
fn balanced_grows_hot_leaves_more_than_cold_ones() {
    let (db, _) = skewed(Adaptive::Balanced, 5);
    let entries = db.tree().index.load().entries();
    let size_of = |k: u64| {
        let f = db.tree().index.load().find(&k.to_be_bytes());
        f.leaf.size
    };
    let hot = size_of(1950);
    let untouched = size_of(1000);
    assert!(hot >= 4 * 256, "hot leaf {hot} B");
    assert_eq!(untouched, 256, "a leaf nothing wrote kept its size");
    assert!(entries.len() > 10);
}

#[test]
fn mixed_sizes_survive_clean_reopen_and_crash() {
    let (db, m) = skewed(Adaptive::Balanced, 9);
    let before = leaf_sizes(&db);
    // Crash: every store so far reached memory, no clean shutdown.
    let image = db.space().current_image();
    std::mem::forget(db);
    let db = Db::open_space(SimSpace::from_image(image), "adaptive".as_ref()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Rebuild);
    assert_same(&db, &m);
    assert_eq!(leaf_sizes(&db), before, "recovery keeps every leaf and its size");
    // Work goes on with adaptivity, then a clean reopen.
    db.set_adaptive(Adaptive::Balanced);
    let mut m = m;
    for i in 0..3000u64 {
        let k = (1990 + i % 10).to_be_bytes().to_vec();
        db.put(&k, &i.to_le_bytes()).unwrap();
        m.insert(k, i.to_le_bytes().to_vec());
    }
    assert_same(&db, &m);
    let before = leaf_sizes(&db);
    let space = db.close_into_space().unwrap();
    let image = space.current_image();
    drop(space);
    let db = Db::open_space(SimSpace::from_image(image), "adaptive".as_ref()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Instant);
    assert_same(&db, &m);
    assert_eq!(leaf_sizes(&db), before);
}

/// The model is measured at the first open with adaptivity on, cached in
/// the header, reused by the next open, and measured again when the
/// emulated latency changes.
#[test]
fn calibration_is_cached_in_the_header_per_latency() {
    use nvstore::format::header::CALIBRATION_OFF;
    use nvstore::pmem::Space;
    use nvstore::tree::adaptive::Model;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cal.nvs");
    let words = |db: &Db| [db.space().load(CALIBRATION_OFF), db.space().load(CALIBRATION_OFF + 8)];
    let off = Db::open(&path, opts(Adaptive::Off)).unwrap();
    assert_eq!(words(&off), [0, 0], "adaptivity off measures nothing");
    off.close().unwrap();
    let db = Db::open(&path, opts(Adaptive::Balanced)).unwrap();
    let first = words(&db);
    // The header caches what was measured; the search share is the leaf
    // format's.
    let live = db.adaptive_model();
    assert_eq!(
        Model::decode(first, 0).map(|m| Model {
            search_line_share: live.search_line_share,
            ..m
        }),
        Some(live)
    );
    db.close().unwrap();
    let db = Db::open(&path, opts(Adaptive::Balanced)).unwrap();
    assert_eq!(words(&db), first, "the cached model is reused");
    db.close().unwrap();
    let db = Db::open(
        &path,
        Options {
            latency_ns: 500,
            ..opts(Adaptive::Aggressive)
        },
    )
    .unwrap();
    let slow = words(&db);
    assert!(Model::decode(slow, 500).is_some() && Model::decode(slow, 0).is_none());
    // 500 ns per flushed line: an 8 KiB write (128 lines) costs far more.
    assert!(
        db.adaptive_model().t_w(8192) > 128.0 * 400.0,
        "{:?}",
        db.adaptive_model()
    );
    let r = db.check();
    assert!(r.ok, "{r:?}");
}
