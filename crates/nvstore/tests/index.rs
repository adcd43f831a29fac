//! The DRAM index over the leaves: rebuilt as the tree grows, so the
//! parents of leaves (PLNs) stay small under random inserts, and the tree
//! still answers like a model across the rebuilds.

use std::collections::BTreeMap;

use nvstore::pmem::SimSpace;
use nvstore::{Adaptive, Db, Options};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn random_inserts_keep_plns_small() {
    let opts = Options {
        node_size: 256,
        size: 16 << 20,
        adaptive: Adaptive::Off,
        ..Options::default()
    };
    let db = Db::create_in(SimSpace::new(16 << 20), "index".as_ref(), &opts).unwrap();
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
