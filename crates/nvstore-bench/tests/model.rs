//! Every engine against a BTreeMap model: random inserts, updates, deletes,
//! searches and scans over enough keys to split many times, with small nodes.

use std::collections::BTreeMap;
use std::path::Path;

use nvstore::pmem::{FileSpace, OpenMode, SimSpace};
use nvstore_bench::registry::{engine_in, EngineConfig, ENGINES};
use nvstore_bench::BenchIndex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn sim_engine(name: &str, node_size: u64) -> Box<dyn BenchIndex> {
    engine_in(
        name,
        SimSpace::new(1 << 20),
        Path::new("sim"),
        &EngineConfig::new(node_size),
    )
    .unwrap()
}

/// Keys spread over the whole u64 range, including both ends.
fn key_of(i: u64, space: u64) -> u64 {
    match i {
        0 => 0,
        1 => u64::MAX,
        _ => i.wrapping_mul(u64::MAX / space),
    }
}

fn external(name: &str) -> bool {
    name.starts_with("lmdb") || name.starts_with("rocksdb")
}

fn check_all(e: &dyn BenchIndex, m: &BTreeMap<u64, u64>, what: &str) {
    let mut all = Vec::new();
    e.scan(0, usize::MAX, &mut all);
    let want: Vec<(u64, u64)> = m.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(all.len(), want.len(), "{}: {what}: full scan length", e.name());
    assert_eq!(all, want, "{}: {what}: full scan", e.name());
    for (&k, &v) in m {
        assert_eq!(e.search(k), Some(v), "{}: {what}: search {k}", e.name());
    }
}

/// One model run: phases weighted toward inserts, then deletes, then inserts again.
fn model(e: &dyn BenchIndex, seed: u64, ops_per_phase: usize, space: u64) {
    let mut m: BTreeMap<u64, u64> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(seed);
    // (insert, update, delete, search, scan) weights per phase.
    let phases: [[u32; 5]; 3] = [[60, 10, 10, 15, 5], [5, 10, 65, 15, 5], [55, 15, 10, 15, 5]];
    for (p, w) in phases.iter().enumerate() {
        let total: u32 = w.iter().sum();
        for step in 0..ops_per_phase {
            let present = !m.is_empty() && rng.gen_bool(0.5);
            let k = if present {
                let n = rng.gen_range(0..m.len());
                *m.keys().nth(n).unwrap()
            } else {
                key_of(rng.gen_range(0..space), space)
            };
            let v = rng.gen_range(1..u64::MAX);
            let mut r = rng.gen_range(0..total);
            let mut op = 0;
            while r >= w[op] {
                r -= w[op];
                op += 1;
            }
            let ctx = || format!("{}: phase {p} step {step} key {k}", e.name());
            match op {
                0 => {
                    e.insert(k, v);
                    m.insert(k, v);
                }
                1 => {
                    let had = m.contains_key(&k);
                    assert_eq!(e.update(k, v), had, "{}: update", ctx());
                    if had {
                        m.insert(k, v);
                    }
                }
                2 => assert_eq!(e.delete(k), m.remove(&k).is_some(), "{}: delete", ctx()),
                3 => assert_eq!(e.search(k), m.get(&k).copied(), "{}: search", ctx()),
                _ => {
                    let n = rng.gen_range(0..60);
                    let mut got = Vec::new();
                    e.scan(k, n, &mut got);
                    let want: Vec<(u64, u64)> = m.range(k..).take(n).map(|(&a, &b)| (a, b)).collect();
                    assert_eq!(got, want, "{}: scan {n}", ctx());
                }
            }
        }
        check_all(e, &m, &format!("after phase {p}"));
    }
    // External engines (LMDB, RocksDB, with their features) report no structure counters.
    if !external(e.name()) {
        assert!(e.stats().splits > 0, "{}: no split", e.name());
    }
}

#[test]
fn every_engine_matches_the_model_small_nodes() {
    for &name in ENGINES {
        let e = sim_engine(name, 256);
        model(&*e, 7, 12_000, 6_000);
        assert!(
            external(name) || e.stats().splits >= 20,
            "{name}: only {} splits",
            e.stats().splits
        );
    }
}

#[test]
fn every_engine_matches_the_model_large_nodes() {
    // 4 KB nodes: multi-word bitmaps (fptree, wbtree), multi-line shifts (fastfair).
    for &name in ENGINES {
        let e = sim_engine(name, 4096);
        model(&*e, 11, 15_000, 8_000);
    }
}

#[test]
fn every_engine_matches_the_model_on_a_file() {
    let dir = tempfile::Builder::new()
        .prefix("nvb-model")
        .tempdir_in("/dev/shm")
        .unwrap();
    for (i, &name) in ENGINES.iter().enumerate() {
        let path = dir.path().join(format!("p{i}"));
        let fo = nvstore::pmem::file::FileOptions {
            mode: OpenMode::Create { size: 1 << 20 },
            ..Default::default()
        };
        let space = FileSpace::open(&path, &fo).unwrap();
        let e = engine_in(name, space, &path, &EngineConfig::new(512)).unwrap();
        model(&*e, 3, 20_000, 10_000);
    }
}

#[test]
fn sequential_and_reverse_inserts() {
    for &name in ENGINES {
        let e = sim_engine(name, 512);
        let mut m = BTreeMap::new();
        for i in 0..3000u64 {
            e.insert(i * 3, i + 1);
            m.insert(i * 3, i + 1);
            let k = u64::MAX - i * 5;
            e.insert(k, i + 7);
            m.insert(k, i + 7);
        }
        check_all(&*e, &m, "sequential");
        // Empty the tree completely, then fill it again.
        for &k in m.keys() {
            assert!(e.delete(k), "{name}: delete {k}");
        }
        check_all(&*e, &BTreeMap::new(), "emptied");
        for (&k, &v) in &m {
            e.insert(k, v);
        }
        check_all(&*e, &m, "refilled");
    }
}

/// RocksDB (feature `rocksdb`): both variants are in the engine list (so the
/// tests above run them too) and pass the model on their own.
#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_matches_the_model() {
    for name in ["rocksdb", "rocksdb-batch"] {
        assert!(ENGINES.contains(&name), "{name} missing from {ENGINES:?}");
        let e = sim_engine(name, 4096);
        assert_eq!(e.name(), name);
        model(&*e, 5, 15_000, 8_000);
    }
}
