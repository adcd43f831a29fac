//! Snapshots and snapshot-isolation transactions on a real mapped pool
//! (NV-Tree §6.1.1): what SI promises and what it allows, stable snapshots under
//! concurrent writers and leaf rewrites, and a bank-transfer workload whose
//! total is the same in every snapshot and after every reopen.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nvstore::{Db, Error, Options, RecoveryKind, WriteBatch};
use rand::{Rng, SeedableRng};

fn pool_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-txn")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn small_nodes() -> Options {
    Options {
        node_size: 256,
        size: 1 << 20,
        ..Options::default()
    }
}

fn num(v: Option<Vec<u8>>) -> i64 {
    v.map_or(0, |v| i64::from_be_bytes(v.try_into().expect("8-byte number")))
}

#[test]
fn snapshot_is_stable_under_writes_and_splits() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), small_nodes()).unwrap();
    for i in 0u32..200 {
        db.put(&i.to_be_bytes(), format!("v0-{i}").as_bytes()).unwrap();
    }
    let snap = db.snapshot().unwrap();
    let before: Vec<_> = snap.iter().collect();
    assert_eq!(before.len(), 200);
    // Updates, deletes and inserts, enough to split, replace and merge leaves.
    for round in 1..8 {
        for i in 0u32..400 {
            match (i + round) % 3 {
                0 => db
                    .put(&i.to_be_bytes(), format!("v{round}-{i}-padding-to-a-blob").as_bytes())
                    .unwrap(),
                1 => {
                    db.delete(&i.to_be_bytes()).unwrap();
                }
                _ => db.put(&i.to_be_bytes(), b"short").unwrap(),
            }
        }
    }
    let st = db.stat();
    assert!(
        st.splits + st.replaces + st.merges > 10,
        "the workload rewrote too few leaves: {st:?}"
    );
    assert_eq!(st.oldest_snapshot, Some(snap.ts()));
    assert_eq!(snap.iter().collect::<Vec<_>>(), before, "snapshot scan changed");
    assert_eq!(snap.range_rev::<&[u8], _>(..).count(), 200);
    for i in 0u32..200 {
        assert_eq!(
            snap.get(&i.to_be_bytes()).unwrap(),
            Some(format!("v0-{i}").into_bytes())
        );
    }
    for i in 200u32..400 {
        assert_eq!(snap.get(&i.to_be_bytes()).unwrap(), None);
    }
    let later = db.snapshot().unwrap();
    assert!(later.ts() > snap.ts());
    let latest: Vec<_> = db.iter().collect();
    assert_eq!(later.iter().collect::<Vec<_>>(), latest);
    drop(snap);
    drop(later);
    assert_eq!(db.stat().oldest_snapshot, None);
    assert!(db.check().ok, "{:?}", db.check().problems);
}

#[test]
fn pinned_versions_of_one_key_grow_its_leaf() {
    // A snapshot pins old versions; one key updated far more often than a
    // leaf holds must still be readable at every snapshot.
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), small_nodes()).unwrap();
    let mut snaps = Vec::new();
    for i in 0u64..120 {
        db.put(b"hot", &i.to_be_bytes()).unwrap();
        if i % 10 == 0 {
            snaps.push((i, db.snapshot().unwrap()));
        }
    }
    for (i, s) in &snaps {
        assert_eq!(num(s.get(b"hot").unwrap()), *i as i64);
    }
    assert!(db.check().ok, "{:?}", db.check().problems);
    drop(snaps);
    for i in 0u64..200 {
        db.put(b"hot", &i.to_be_bytes()).unwrap();
    }
    assert_eq!(num(db.get(b"hot").unwrap()), 199);
    assert!(db.check().ok, "{:?}", db.check().problems);
}

#[test]
fn lost_update_is_prevented() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), Options::default()).unwrap();
    db.put(b"x", &10i64.to_be_bytes()).unwrap();
    let mut t1 = db.begin().unwrap();
    let mut t2 = db.begin().unwrap();
    let x1 = num(t1.get(b"x").unwrap());
    let x2 = num(t2.get(b"x").unwrap());
    t1.put(b"x", &(x1 + 1).to_be_bytes()).unwrap();
    t2.put(b"x", &(x2 + 1).to_be_bytes()).unwrap();
    t1.commit().unwrap();
    assert!(matches!(t2.commit(), Err(Error::Conflict)));
    assert_eq!(num(db.get(b"x").unwrap()), 11);
    assert_eq!(db.stat().conflicts, 1);

    // A plain put after the start conflicts too, and so does a delete.
    let mut t3 = db.begin().unwrap();
    t3.put(b"x", b"t3").unwrap();
    db.delete(b"x").unwrap();
    assert!(matches!(t3.commit(), Err(Error::Conflict)));
    assert_eq!(db.get(b"x").unwrap(), None);
}

#[test]
fn write_skew_is_possible_as_si_allows() {
    // Constraint x + y >= 1; each transaction checks it on its snapshot and
    // sets a different key to 0. Both commit: SI does not prevent it.
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), Options::default()).unwrap();
    db.put(b"x", &1i64.to_be_bytes()).unwrap();
    db.put(b"y", &1i64.to_be_bytes()).unwrap();
    let mut t1 = db.begin().unwrap();
    let mut t2 = db.begin().unwrap();
    for (t, k) in [(&mut t1, b"x"), (&mut t2, b"y")] {
        let sum = num(t.get(b"x").unwrap()) + num(t.get(b"y").unwrap());
        assert_eq!(sum, 2);
        t.put(k, &0i64.to_be_bytes()).unwrap();
    }
    t1.commit().unwrap();
    t2.commit().unwrap();
    assert_eq!(num(db.get(b"x").unwrap()) + num(db.get(b"y").unwrap()), 0);
}

#[test]
fn transaction_reads_its_own_writes_and_abort_writes_nothing() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), Options::default()).unwrap();
    db.put(b"a", b"1").unwrap();
    db.put(b"c", b"3").unwrap();
    let mut t = db.begin().unwrap();
    t.put(b"b", b"2").unwrap();
    t.delete(b"c").unwrap();
    t.put(b"a", b"one, now longer than eight bytes").unwrap();
    assert_eq!(t.get(b"b").unwrap(), Some(b"2".to_vec()));
    assert_eq!(t.get(b"c").unwrap(), None);
    assert_eq!(
        t.range(b"a".as_slice()..),
        vec![
            (b"a".to_vec(), b"one, now longer than eight bytes".to_vec()),
            (b"b".to_vec(), b"2".to_vec())
        ]
    );
    assert_eq!(t.prefix(b"c"), vec![]);
    assert_eq!(db.get(b"b").unwrap(), None, "an uncommitted write is visible");
    t.abort();
    assert_eq!(db.get(b"b").unwrap(), None);
    assert_eq!(db.get(b"c").unwrap(), Some(b"3".to_vec()));
    let used = db.used_bytes();
    // A conflicting commit frees the blobs it wrote.
    let mut t = db.begin().unwrap();
    t.put(b"a", &[7u8; 300]).unwrap();
    db.put(b"a", b"race").unwrap();
    assert!(matches!(t.commit(), Err(Error::Conflict)));
    assert!(db.used_bytes() <= used + 4096);
    assert!(db.check().ok, "{:?}", db.check().problems);
}

#[test]
fn watch_fails_the_commit_when_the_key_changes() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), Options::default()).unwrap();
    db.put(b"w", b"0").unwrap();
    let since = db.last_commit_ts();
    let mut t = db.begin().unwrap();
    t.watch(b"w", since);
    t.put(b"other", b"x").unwrap();
    t.commit().unwrap();
    // Changed after the watch: the commit fails, even a read-only one.
    let since = db.last_commit_ts();
    db.put(b"w", b"1").unwrap();
    let mut t = db.begin().unwrap();
    t.watch(b"w", since);
    t.put(b"other", b"y").unwrap();
    assert!(matches!(t.commit(), Err(Error::Conflict)));
    let mut t = db.begin().unwrap();
    t.watch(b"w", since);
    assert!(matches!(t.commit(), Err(Error::Conflict)));
    assert_eq!(db.get(b"other").unwrap(), Some(b"x".to_vec()));
}

#[test]
fn write_batch_spanning_many_leaves_is_applied_whole() {
    let dir = pool_dir();
    let path = dir.path().join("p.nvs");
    let db = Db::create(&path, small_nodes()).unwrap();
    for i in 0u32..300 {
        db.put(&i.to_be_bytes(), b"old").unwrap();
    }
    // One batch: 600 keys, far more than one leaf holds, into leaves of
    // every fill (a cut of an empty range, splits of full ones).
    let mut b = WriteBatch::new();
    for i in 0u32..600 {
        if i % 5 == 0 {
            b.delete(&i.to_be_bytes());
        } else {
            b.put(&i.to_be_bytes(), format!("new-{i}").as_bytes());
        }
    }
    let ts = db.write_batch(b).unwrap();
    assert!(ts > 0);
    assert_eq!(db.stat().multi_leaf_commits, 1);
    for i in 0u32..600 {
        let want = (i % 5 != 0).then(|| format!("new-{i}").into_bytes());
        assert_eq!(db.get(&i.to_be_bytes()).unwrap(), want);
    }
    assert_eq!(db.len(), 480);
    assert!(db.check().ok, "{:?}", db.check().problems);
    db.close().unwrap();
    let db = Db::open(&path, Options::default()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Instant);
    assert_eq!(db.len(), 480);
    assert!(db.last_commit_ts() >= ts);
    assert!(db.check().ok, "{:?}", db.check().problems);
}

#[test]
fn concurrent_counters_lose_no_increment() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), small_nodes()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for i in 0..300 {
                    let k = format!("ctr{}", i % 4);
                    db.transaction(|t| {
                        let v = num(t.get(k.as_bytes())?);
                        t.put(k.as_bytes(), &(v + 1).to_be_bytes())
                    })
                    .unwrap();
                }
            });
        }
    });
    let total: i64 = (0..4).map(|i| num(db.get(format!("ctr{i}").as_bytes()).unwrap())).sum();
    assert_eq!(total, 900);
}

/// `Db::write_one` increments of a few counters from several threads, with
/// transactions and snapshots of the same keys meanwhile: no increment is
/// lost (the read and the write are one step under the leaf lock), a
/// snapshot taken before keeps its values, and deletes and "keep" decisions
/// write nothing more than they say.
#[test]
fn write_one_loses_no_increment_and_snapshots_keep_their_view() {
    let dir = pool_dir();
    let db = Db::create(dir.path().join("p.nvs"), small_nodes()).unwrap();
    // Filler keys so the counters' leaves split while they are written.
    for i in 0u32..100 {
        db.put(format!("ctr{i:03}").as_bytes(), b"x").unwrap();
    }
    db.put(b"ctr0", &7i64.to_be_bytes()).unwrap();
    let snap = db.snapshot().unwrap();
    std::thread::scope(|s| {
        for t in 0..3 {
            let db = &db;
            s.spawn(move || {
                for i in 0..300 {
                    let k = format!("ctr{}", i % 4);
                    if t == 2 && i % 3 == 0 {
                        db.transaction(|tx| {
                            let v = num(tx.get(k.as_bytes())?);
                            tx.put(k.as_bytes(), &(v + 1).to_be_bytes())
                        })
                        .unwrap();
                        continue;
                    }
                    let seen = db
                        .write_one(k.as_bytes(), |v| {
                            let n = num(v.map(<[u8]>::to_vec)) + 1;
                            (nvstore::OneWrite::Put(n.to_be_bytes().to_vec()), n)
                        })
                        .unwrap();
                    assert!(seen >= 1);
                }
            });
        }
    });
    let total: i64 = (0..4).map(|i| num(db.get(format!("ctr{i}").as_bytes()).unwrap())).sum();
    assert_eq!(total, 900 + 7);
    assert_eq!(num(snap.get(b"ctr0").unwrap()), 7);
    assert_eq!(snap.get(b"ctr1").unwrap(), None);
    drop(snap);
    let len = db.len();
    // Keep writes nothing; a delete of an absent key writes nothing.
    let commits = db.stat().commits;
    assert_eq!(
        db.write_one(b"ctr1", |v| (nvstore::OneWrite::Keep, v.map(<[u8]>::len)))
            .unwrap(),
        Some(8)
    );
    assert!(!db
        .write_one(b"nokey", |v| (nvstore::OneWrite::Delete, v.is_some()))
        .unwrap());
    assert_eq!(db.stat().commits, commits);
    assert!(db
        .write_one(b"ctr1", |v| (nvstore::OneWrite::Delete, v.is_some()))
        .unwrap());
    assert_eq!(db.get(b"ctr1").unwrap(), None);
    assert_eq!(db.len(), len - 1);
    // A large value goes to a blob and survives a reopen.
    let big = vec![0xabu8; 5000];
    db.write_one(b"big", |_| (nvstore::OneWrite::Put(big.clone()), ()))
        .unwrap();
    let path = dir.path().join("p.nvs");
    db.close().unwrap();
    let db = Db::open(&path, small_nodes()).unwrap();
    assert_eq!(db.get(b"big").unwrap(), Some(big));
    assert_eq!(num(db.get(b"ctr2").unwrap()), 225);
    assert!(db.check().ok);
}

const ACCOUNTS: u32 = 60;
const START: i64 = 1000;

fn account(i: u32) -> Vec<u8> {
    // Long keys on some accounts: blobs too.
    if i.is_multiple_of(4) {
        format!("account/{i:04}/with-a-long-key").into_bytes()
    } else {
        format!("acct{i:04}").into_bytes()
    }
}

fn total<'a>(pairs: impl Iterator<Item = (Vec<u8>, Vec<u8>)> + 'a) -> (i64, usize) {
    let mut sum = 0;
    let mut n = 0;
    for (_, v) in pairs {
        sum += num(Some(v));
        n += 1;
    }
    (sum, n)
}

#[test]
fn bank_transfers_keep_the_total_in_every_snapshot_and_reopen() {
    let dir = pool_dir();
    let path = dir.path().join("bank.nvs");
    let db = Db::create(&path, small_nodes()).unwrap();
    let mut b = WriteBatch::new();
    for i in 0..ACCOUNTS {
        b.put(&account(i), &START.to_be_bytes());
    }
    db.write_batch(b).unwrap();
    let want = START * ACCOUNTS as i64;
    let stop = AtomicBool::new(false);
    let transfers = AtomicU64::new(0);
    let snapshots = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (db, stop, transfers, snapshots) = (&db, &stop, &transfers, &snapshots);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for _ in 0..400 {
                    let (a, b) = (rng.gen_range(0..ACCOUNTS), rng.gen_range(0..ACCOUNTS));
                    if a == b {
                        continue;
                    }
                    let amount = rng.gen_range(1..50);
                    db.transaction(|tx| {
                        let va = num(tx.get(&account(a))?);
                        let vb = num(tx.get(&account(b))?);
                        tx.put(&account(a), &(va - amount).to_be_bytes())?;
                        tx.put(&account(b), &(vb + amount).to_be_bytes())
                    })
                    .unwrap();
                    transfers.fetch_add(1, Ordering::Relaxed);
                }
                if t == 0 {
                    // The reader must have looked at least a few times.
                    while snapshots.load(Ordering::Relaxed) < 3 {
                        std::thread::yield_now();
                    }
                    stop.store(true, Ordering::Relaxed);
                }
            });
        }
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let snap = db.snapshot().unwrap();
                let (sum, n) = total(snap.iter());
                assert_eq!((sum, n), (want, ACCOUNTS as usize), "a snapshot saw part of a transfer");
                let by_get: i64 = (0..ACCOUNTS).map(|i| num(snap.get(&account(i)).unwrap())).sum();
                assert_eq!(by_get, want);
                snapshots.fetch_add(1, Ordering::Relaxed);
            }
        });
    });
    assert!(snapshots.load(Ordering::Relaxed) > 0);
    assert_eq!(total(db.iter()), (want, ACCOUNTS as usize));
    assert!(db.stat().multi_leaf_commits > 0, "no transfer spanned two leaves");
    assert!(db.check().ok, "{:?}", db.check().problems);
    db.close().unwrap();
    let db = Db::open(&path, Options::default()).unwrap();
    assert_eq!(total(db.iter()), (want, ACCOUNTS as usize));
    // Transactions go on after the reopen with timestamps above the old ones.
    let before = db.last_commit_ts();
    db.transaction(|tx| {
        let v = num(tx.get(&account(1))?);
        tx.put(&account(1), &(v - 5).to_be_bytes())?;
        let w = num(tx.get(&account(ACCOUNTS - 1))?);
        tx.put(&account(ACCOUNTS - 1), &(w + 5).to_be_bytes())
    })
    .unwrap();
    assert!(db.last_commit_ts() > before);
    assert_eq!(total(db.snapshot().unwrap().iter()), (want, ACCOUNTS as usize));
}

#[test]
fn transactions_model_check() {
    // Random transactions against a BTreeMap model, with reopen and
    // snapshot reads in between.
    let dir = pool_dir();
    let path = dir.path().join("p.nvs");
    let mut db = Db::create(&path, small_nodes()).unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for round in 0..300 {
        let snap_model = model.clone();
        let snap = db.snapshot().unwrap();
        let mut tx = db.begin().unwrap();
        let mut staged = model.clone();
        for _ in 0..rng.gen_range(1..20) {
            let k = format!("k{:03}", rng.gen_range(0..150)).into_bytes();
            if rng.gen_bool(0.3) {
                tx.delete(&k).unwrap();
                staged.remove(&k);
            } else {
                let v = vec![b'a' + (round % 26) as u8; rng.gen_range(0..40)];
                tx.put(&k, &v).unwrap();
                staged.insert(k, v);
            }
        }
        if rng.gen_bool(0.1) {
            tx.abort();
        } else {
            tx.commit().unwrap();
            model = staged;
        }
        assert_eq!(snap.iter().collect::<BTreeMap<_, _>>(), snap_model);
        drop(snap);
        assert_eq!(db.iter().collect::<BTreeMap<_, _>>(), model);
        if round % 97 == 96 {
            db.close().unwrap();
            db = Db::open(&path, Options::default()).unwrap();
        }
    }
    assert!(db.check().ok, "{:?}", db.check().problems);
}
