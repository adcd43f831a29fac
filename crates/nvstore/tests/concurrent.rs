//! Multi-thread stress tests on a real mapped pool, checked against models.
//!
//! Writers own disjoint key sets, so each thread's model is exact; readers
//! run at the same time and check what can be checked without a global
//! order: scans are sorted and duplicate-free, every value read was written
//! for that key, and per-key values a reader sees never go backwards
//! (writers write increasing versions).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nvstore::{Db, Options, RecoveryKind};
use rand::{Rng, SeedableRng};

fn pool_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-conc")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn key(thread: usize, i: u64) -> Vec<u8> {
    // Interleave threads' keys so they share leaves and splits race.
    let mut k = (i * 8 + thread as u64).to_be_bytes().to_vec();
    if i.is_multiple_of(7) {
        k.extend_from_slice(b"-long-key-suffix");
    }
    k
}

/// value = version (8 bytes BE) + optional padding, so versions are comparable.
fn value(version: u64, big: bool) -> Vec<u8> {
    let mut v = version.to_be_bytes().to_vec();
    if big {
        v.resize(100, 0xab);
    }
    v
}

fn version_of(v: &[u8]) -> u64 {
    u64::from_be_bytes(v[..8].try_into().unwrap())
}

#[test]
fn writers_and_readers_agree_with_models() {
    let dir = pool_dir();
    let path = dir.path().join("conc.nvs");
    let opts = Options {
        node_size: 512,
        size: 16 << 20,
        ..Options::default()
    };
    let db = Arc::new(Db::open(&path, opts.clone()).unwrap());
    let writers = 4;
    let ops = 40_000;
    let keys_per_thread = 5000;
    let stop = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..2)
        .map(|r| {
            let db = db.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + r);
                let mut seen: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
                let mut scans = 0;
                while !stop.load(Ordering::Relaxed) {
                    if rng.gen_bool(0.2) {
                        let all: Vec<_> = db.iter().collect();
                        assert!(
                            all.windows(2).all(|w| w[0].0 < w[1].0),
                            "scan not sorted or has duplicates"
                        );
                        scans += 1;
                    } else {
                        let t = rng.gen_range(0..writers);
                        let k = key(t, rng.gen_range(0..keys_per_thread));
                        if let Some(v) = db.get(&k).unwrap() {
                            let ver = version_of(&v);
                            let prev = seen.entry(k.clone()).or_insert(0);
                            assert!(ver >= *prev, "reader saw version {ver} after {prev} for {k:?}");
                            *prev = ver;
                        }
                    }
                }
                scans
            })
        })
        .collect();

    let handles: Vec<_> = (0..writers)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                let mut version = 1u64;
                for _ in 0..ops {
                    let k = key(t, rng.gen_range(0..keys_per_thread));
                    if rng.gen_bool(0.75) {
                        let v = value(version, rng.gen_bool(0.1));
                        version += 1;
                        db.put(&k, &v).unwrap();
                        model.insert(k, v);
                    } else {
                        let existed = db.delete(&k).unwrap();
                        assert_eq!(existed, model.remove(&k).is_some());
                    }
                    if rng.gen_bool(0.05) {
                        let k = key(t, rng.gen_range(0..keys_per_thread));
                        assert_eq!(db.get(&k).unwrap(), model.get(&k).cloned());
                    }
                }
                model
            })
        })
        .collect();

    let mut model = BTreeMap::new();
    for h in handles {
        model.extend(h.join().unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let all: Vec<_> = db.iter().collect();
    let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(all.len(), want.len());
    assert!(
        all == want,
        "final contents differ from the union of the writers' models"
    );
    assert_eq!(db.len(), model.len() as u64);
    let report = db.check();
    assert!(report.ok, "{:?}", report.problems);
    let stat = db.stat();
    assert!(stat.splits > 0, "the workload should split leaves");

    // Clean close, instant reopen, same contents.
    drop(all);
    let db = Arc::try_unwrap(db).ok().expect("all threads joined");
    db.close().unwrap();
    let db = Db::open(&path, opts).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Instant);
    let again: Vec<_> = db.iter().collect();
    assert!(again == want);
    assert!(db.check().ok);
}

#[test]
fn second_opener_is_refused_and_file_unchanged() {
    let dir = pool_dir();
    let path = dir.path().join("lock.nvs");
    let db = Db::open(&path, Options::default()).unwrap();
    db.put(b"k", b"v").unwrap();
    let before = std::fs::read(&path).unwrap();
    match Db::open(&path, Options::default()) {
        Err(nvstore::Error::Locked { .. }) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("second opener got in"),
    }
    assert!(std::fs::read(&path).unwrap() == before);
    drop(db);
}

/// Lookup hints (DRAM fingerprints) are built on a leaf's first lookup, by
/// whichever thread gets there first, while a writer may be appending to the
/// same leaf. After each reopen every leaf starts without hints; readers
/// race the writer to build them, and must never miss a key that was
/// there before they looked, nor see a value older than one they saw.
#[test]
fn readers_building_lookup_hints_never_miss_a_key() {
    // 8 KiB leaves (254 elements) also keep a key table; 1 KiB ones do not.
    for node_size in [1024, 8192] {
        readers_race_hint_builders(node_size);
    }
}

fn readers_race_hint_builders(node_size: u32) {
    let dir = pool_dir();
    let path = dir.path().join("hints.nvs");
    let opts = Options {
        node_size,
        ..Options::default()
    };
    let n = 4000u64;
    let k = |i: u64| (i * 2).to_be_bytes();
    {
        let db = Db::create(&path, opts.clone()).unwrap();
        for i in 0..n {
            db.put(&k(i), &0u64.to_be_bytes()).unwrap();
        }
        db.close().unwrap();
    }
    for round in 1..=4u64 {
        let db = Db::open(&path, opts.clone()).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (db, stop) = (&db, &stop);
            // The writer updates every key to `round` and inserts new odd keys,
            // in the order the readers read.
            s.spawn(move || {
                for i in 0..n {
                    db.put(&k(i), &round.to_be_bytes()).unwrap();
                    db.put(&(i * 2 + 1).to_be_bytes(), b"new").unwrap();
                }
                stop.store(true, Ordering::Relaxed);
            });
            s.spawn(move || {
                let mut passes = 0;
                while !stop.load(Ordering::Relaxed) || passes == 0 {
                    for i in 0..n {
                        let v = db
                            .get(&k(i))
                            .unwrap()
                            .unwrap_or_else(|| panic!("key {i} missing in round {round} ({node_size} B nodes)"));
                        let v = u64::from_be_bytes(v.try_into().unwrap());
                        assert!(
                            v == round || v == round - 1,
                            "key {i}: {v} in round {round} ({node_size} B nodes)"
                        );
                    }
                    passes += 1;
                }
            });
        });
        for i in 0..n {
            assert_eq!(db.get(&k(i)).unwrap(), Some(round.to_be_bytes().to_vec()));
        }
        assert!(db.check().ok);
        db.close().unwrap();
    }
}
