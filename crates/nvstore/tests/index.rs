//! The DRAM index over the leaves: rebuilt as the tree grows, so the
//! parents of leaves (PLNs) stay small under random inserts, and the tree
//! still answers like a model across the rebuilds.

use std::collections::BTreeMap;

use nvstore::pmem::SimSpace;
use nvstore::{Adaptive, Db, Options};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A 16 MiB simulated pool of 256-byte leaves, adaptivity off: many
/// leaves from few keys.
fn small_leaves(name: &str) -> Db<SimSpace> {
    let opts = Options {
        node_size: 256,
        size: 16 << 20,
        adaptive: Adaptive::Off,
        ..Options::default()
    };
    Db::create_in(SimSpace::new(16 << 20), name.as_ref(), &opts).unwrap()
}

#[test]
fn random_inserts_keep_plns_small() {
    let db = small_leaves("index");
    let mut m = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(7);
    let mut most = 0.0f64;
    for i in 0..30_000u64 {
        let k: u64 = rng.gen();
        db.put(&k.to_be_bytes(), &i.to_le_bytes()).unwrap();
        m.insert(k.to_be_bytes(), i.to_le_bytes());
        if i % 1000 == 999 {
            let idx = db.tree().index.load();
            let mean = idx.leaf_count() as f64 / idx.used_plns as f64;
            most = most.max(mean);
        }
    }
    let idx = db.tree().index.load();
    let leaves = idx.leaf_count();
    assert!(leaves > 2000, "{leaves} leaves: the test needs a large tree");
    // A rebuild lays out 4 leaves per PLN, and the next comes before the
    // tree has half again as many leaves: at most 6 per PLN on average
    // (without it, every PLN grows with the tree).
    assert!(most <= 6.0, "PLNs held {most:.2} leaves on average");
    let rebuilds = db.stat().rebuilds;
    assert!((10..=40).contains(&rebuilds), "{rebuilds} rebuilds for {leaves} leaves");
    for (k, v) in &m {
        assert_eq!(db.get(k).unwrap().as_deref(), Some(&v[..]));
    }
    assert_eq!(db.len(), m.len() as u64);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

type Handle = std::sync::Arc<nvstore::tree::Leaf<nvstore::tree::nv::Nv>>;

/// Every leaf of `db`'s index with the guide its PLN slot holds.
fn guides(db: &Db<SimSpace>) -> Vec<(Handle, u64)> {
    let idx = db.tree().index.load();
    let mut v = Vec::new();
    for p in &idx.plns[..idx.used_plns] {
        let pln = p.load();
        v.extend(pln.entries().map(|e| e.leaf).zip(pln.guides()));
    }
    v
}

/// Leaves in both `before` and `after` (the same handle) whose guide
/// changed or was lost; and how many leaves `after` keeps from `before`.
fn lost_guides(before: &[(Handle, u64)], db: &Db<SimSpace>) -> (usize, usize) {
    let after = guides(db);
    let (mut lost, mut kept) = (0, 0);
    for (leaf, g) in &after {
        if let Some((_, was)) = before.iter().find(|(l, _)| std::sync::Arc::ptr_eq(l, leaf)) {
            kept += 1;
            lost += (g != was) as usize;
        }
    }
    (lost, kept)
}

#[test]
fn slots_keep_their_guides_across_splits_and_rebuilds() {
    // A guide (where a lookup's entry probably lies) is learned by the
    // first lookup of a leaf through its PLN slot; a split copies the PLN
    // and a rebuild lays out new ones, and both must carry it over.
    let db = small_leaves("guides");
    let mut rng = StdRng::seed_from_u64(11);
    let mut keys = Vec::new();
    let mut put = |keys: &mut Vec<u64>, n: usize| {
        for _ in 0..n {
            let k: u64 = rng.gen();
            db.put(&k.to_be_bytes(), b"v").unwrap();
            keys.push(k);
        }
    };
    put(&mut keys, 6000);
    let read_all = |keys: &[u64]| {
        for k in keys {
            assert!(db.get(&k.to_be_bytes()).unwrap().is_some());
        }
    };
    read_all(&keys);
    let before = guides(&db);
    assert!(before.iter().all(|(_, g)| *g != 0), "every leaf was read");
    // Splits without a rebuild: each copies its PLN.
    let rebuilds = db.stat().rebuilds;
    put(&mut keys, 150);
    assert_eq!(db.stat().rebuilds, rebuilds, "the test wants splits alone here");
    let (lost, kept) = lost_guides(&before, &db);
    assert!(
        kept < before.len(),
        "{kept} of {} leaves kept: no splits?",
        before.len()
    );
    assert_eq!(lost, 0, "{lost} of {kept} kept leaves lost their guide in a split");
    // Then enough to rebuild the index.
    read_all(&keys);
    let before = guides(&db);
    put(&mut keys, 6000);
    assert!(db.stat().rebuilds > rebuilds);
    let (lost, kept) = lost_guides(&before, &db);
    assert!(kept > 100, "{kept} leaves kept");
    assert_eq!(lost, 0, "{lost} of {kept} kept leaves lost their guide in a rebuild");
}
