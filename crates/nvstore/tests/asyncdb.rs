//! `AsyncDb` (KVS B+Tree index §2: a queue of requests, worker threads,
//! a oneshot per request): the same answers as the blocking `Db` on a
//! random sequence, under tokio and under `futures`' `block_on`; many
//! outstanding futures at once; shutdown with requests still queued;
//! errors reaching the caller; and puts and gets a worker runs as groups.

use std::ops::Bound;
use std::sync::mpsc;

use nvstore::{AsyncDb, Db, Error, LeafKind, Options};
use rand::{Rng, SeedableRng};

fn pool_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-async")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// Small nodes, so a few hundred keys already split and merge leaves.
fn small_nodes() -> Options {
    Options {
        node_size: 256,
        size: 1 << 20,
        ..Options::default()
    }
}

/// A small hash pool.
fn hash_pool() -> Options {
    Options {
        engine: nvstore::EngineKind::Hash,
        size: 8 << 20,
        ..Options::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

fn num(v: Option<Vec<u8>>) -> u64 {
    v.map_or(0, |v| u64::from_be_bytes(v.try_into().expect("8-byte number")))
}

/// Bounds for a random range over the key space.
fn random_bounds(rng: &mut impl Rng) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let b = |rng: &mut rand::rngs::StdRng| match rng.gen_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(key(rng.gen_range(0..300))),
        _ => Bound::Excluded(key(rng.gen_range(0..300))),
    };
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    (b(&mut r), b(&mut r))
}

/// Applies one random sequence to `sync` directly and to `adb` through its
/// futures, awaiting each, and checks every answer is the same.
async fn same_as_sync(adb: &AsyncDb, sync: &Db, seed: u64, ops: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for step in 0..ops {
        match rng.gen_range(0..100) {
            0..=39 => {
                let k = key(rng.gen_range(0..300));
                // Some values past the inline size, stored as blobs.
                let len = if rng.gen_bool(0.1) {
                    rng.gen_range(300..3000)
                } else {
                    rng.gen_range(0..40)
                };
                let v: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                sync.put(&k, &v).unwrap();
                adb.put(&k, &v).await.unwrap();
            }
            40..=59 => {
                let k = key(rng.gen_range(0..300));
                assert_eq!(adb.get(&k).await.unwrap(), sync.get(&k).unwrap(), "get at step {step}");
            }
            60..=74 => {
                let k = key(rng.gen_range(0..300));
                assert_eq!(
                    adb.delete(&k).await.unwrap(),
                    sync.delete(&k).unwrap(),
                    "delete at step {step}"
                );
            }
            75..=82 => {
                let r = random_bounds(&mut rng);
                let want: Vec<_> = sync.range::<Vec<u8>, _>(r.clone()).collect();
                assert_eq!(adb.range(r.clone()).await.unwrap(), want, "range at step {step}");
                let want: Vec<_> = sync.range_rev::<Vec<u8>, _>(r.clone()).collect();
                assert_eq!(adb.range_rev(r).await.unwrap(), want, "range_rev at step {step}");
            }
            83..=90 => {
                let p = format!("k{}", rng.gen_range(0..30)).into_bytes();
                let want: Vec<_> = sync.prefix(&p).collect();
                assert_eq!(adb.prefix(&p).await.unwrap(), want, "prefix at step {step}");
            }
            _ => {
                // Move one key's value onto another, as a counter sum.
                let (a, b) = (key(rng.gen_range(0..300)), key(rng.gen_range(0..300)));
                let add = rng.gen_range(1..1000u64);
                let body = move |tx: &mut nvstore::Txn<'_, nvstore::pmem::FileSpace>| {
                    let sum = num(tx.get(&b)?.filter(|v| v.len() == 8)) + add;
                    tx.put(&b, &sum.to_be_bytes())?;
                    tx.delete(&a)?;
                    Ok(sum)
                };
                let mut sync_body = body.clone();
                let want = sync.transaction(&mut sync_body).unwrap();
                assert_eq!(adb.transaction(body).await.unwrap(), want, "transaction at step {step}");
            }
        }
    }
    let all: Vec<_> = sync.iter().collect();
    assert_eq!(adb.range::<Vec<u8>, _>(..).await.unwrap(), all);
    assert_eq!(adb.db().len(), sync.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_results_equal_sync() {
    let dir = pool_dir();
    let sync = Db::create(dir.path().join("sync.nvs"), small_nodes()).unwrap();
    let adb = AsyncDb::open(dir.path().join("async.nvs"), small_nodes()).unwrap();
    same_as_sync(&adb, &sync, 7, 3000).await;
    adb.close().unwrap();
}

#[test]
fn block_on_results_equal_sync() {
    let dir = pool_dir();
    let sync = Db::create(dir.path().join("sync.nvs"), small_nodes()).unwrap();
    let adb = AsyncDb::with_workers(Db::create(dir.path().join("async.nvs"), small_nodes()).unwrap(), 3);
    futures::executor::block_on(same_as_sync(&adb, &sync, 11, 3000));
    // And the pool the async store wrote reopens with the same contents.
    adb.close().unwrap();
    let reopened = Db::open(dir.path().join("async.nvs"), small_nodes()).unwrap();
    assert_eq!(reopened.iter().collect::<Vec<_>>(), sync.iter().collect::<Vec<_>>());
}

#[test]
fn isle_pool_point_ops_and_ranges() {
    // Any leaf format: the wrapper only forwards to `Db`.
    let dir = pool_dir();
    let opts = Options {
        leaf: LeafKind::Isle,
        ..small_nodes()
    };
    let adb = AsyncDb::open(dir.path().join("isle.nvs"), opts).unwrap();
    let puts: Vec<_> = (0..500).map(|i| adb.put(&key(i), &i.to_be_bytes())).collect();
    for f in puts {
        f.wait().unwrap();
    }
    assert_eq!(adb.get(&key(42)).wait().unwrap(), Some(42u32.to_be_bytes().to_vec()));
    assert_eq!(adb.prefix(b"k04").wait().unwrap().len(), 10);
    // Transactions need versions that isle leaves do not keep.
    let e = adb.transaction(|tx| tx.put(b"a", b"b")).wait().unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_outstanding_futures() {
    let dir = pool_dir();
    let adb = AsyncDb::open(dir.path().join("p.nvs"), small_nodes()).unwrap();
    let n = 4000u32;
    // Every put in flight at once, then every get.
    let puts: Vec<_> = (0..n)
        .map(|i| adb.put(format!("key{i:05}").as_bytes(), &i.to_le_bytes()))
        .collect();
    for r in futures::future::join_all(puts).await {
        r.unwrap();
    }
    let gets: Vec<_> = (0..n).map(|i| adb.get(format!("key{i:05}").as_bytes())).collect();
    for (i, r) in futures::future::join_all(gets).await.into_iter().enumerate() {
        assert_eq!(r.unwrap(), Some((i as u32).to_le_bytes().to_vec()));
    }
    assert_eq!(adb.range::<&[u8], _>(..).await.unwrap().len(), n as usize);

    // Contended transactions: each adds one to the same counter; conflicts
    // retry on the worker, so no increment is lost.
    let incs: Vec<_> = (0..300)
        .map(|_| {
            adb.transaction(|tx| {
                let v = num(tx.get(b"counter")?) + 1;
                tx.put(b"counter", &v.to_be_bytes())?;
                Ok(v)
            })
        })
        .collect();
    let mut seen: Vec<u64> = futures::future::join_all(incs)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (1..=300).collect::<Vec<_>>(), "each commit saw a distinct count");
    assert_eq!(num(adb.get(b"counter").await.unwrap()), 300);

    // Futures awaited from many tokio tasks at once.
    let adb = std::sync::Arc::new(adb);
    let tasks: Vec<_> = (0..8u32)
        .map(|t| {
            let adb = adb.clone();
            tokio::spawn(async move {
                for i in 0..200u32 {
                    let k = format!("t{t}-{i:03}");
                    adb.put(k.as_bytes(), k.as_bytes()).await.unwrap();
                    assert_eq!(adb.get(k.as_bytes()).await.unwrap(), Some(k.into_bytes()));
                }
                adb.prefix(format!("t{t}-").as_bytes()).await.unwrap().len()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
}

/// Holds the only worker of `adb` (once it has started the request that
/// holds it) until the returned sender is used; the future is that
/// request's.
fn hold_worker(adb: &AsyncDb) -> (mpsc::Sender<()>, nvstore::DbFuture<()>) {
    let (release, wait) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel::<()>();
    let blocker = adb.run(move |_| {
        started_tx.send(()).unwrap();
        wait.recv().unwrap();
        Ok(())
    });
    started.recv().unwrap();
    (release, blocker)
}

/// Holds the only worker of `adb` until the returned sender is used, with
/// `n` puts queued behind it; returns the sender and the puts' futures.
fn block_worker_and_queue(adb: &AsyncDb, n: u32) -> (mpsc::Sender<()>, Vec<nvstore::DbFuture<()>>) {
    let (release, _blocker) = hold_worker(adb);
    let puts = (0..n).map(|i| adb.put(&key(i), b"queued")).collect();
    (release, puts)
}

#[test]
fn drop_completes_queued_requests() {
    let dir = pool_dir();
    let path = dir.path().join("p.nvs");
    let adb = AsyncDb::with_workers(Db::create(&path, small_nodes()).unwrap(), 1);
    let (release, puts) = block_worker_and_queue(&adb, 200);
    assert_eq!(adb.queued(), 200);
    let dropper = std::thread::spawn(move || drop(adb));
    release.send(()).unwrap();
    dropper.join().unwrap();
    for f in puts {
        f.wait().unwrap();
    }
    // Every queued put ran, and the drop closed the pool cleanly.
    let db = Db::open(&path, small_nodes()).unwrap();
    assert_eq!(db.recovery().kind, nvstore::RecoveryKind::Instant);
    assert_eq!(db.len(), 200);
    assert_eq!(db.get(&key(199)).unwrap(), Some(b"queued".to_vec()));
}

#[test]
fn shutdown_now_fails_queued_requests() {
    let dir = pool_dir();
    let path = dir.path().join("p.nvs");
    let adb = AsyncDb::with_workers(Db::create(&path, small_nodes()).unwrap(), 1);
    adb.put(b"before", b"1").wait().unwrap();
    let (release, puts) = block_worker_and_queue(&adb, 200);
    let stopper = std::thread::spawn(move || adb.shutdown_now());
    // The queued puts fail while the worker is still held: none ran.
    for f in puts {
        assert!(matches!(f.wait(), Err(Error::Closed)));
    }
    release.send(()).unwrap();
    stopper.join().unwrap().unwrap();
    let db = Db::open(&path, small_nodes()).unwrap();
    assert_eq!(db.recovery().kind, nvstore::RecoveryKind::Instant);
    assert_eq!(db.iter().collect::<Vec<_>>(), vec![(b"before".to_vec(), b"1".to_vec())]);
}

#[test]
fn errors_reach_the_caller() {
    let dir = pool_dir();
    let path = dir.path().join("p.nvs");
    let adb = AsyncDb::with_workers(Db::create(&path, small_nodes()).unwrap(), 2);
    let big = vec![b'k'; 100_000];
    assert!(matches!(adb.put(&big, b"v").wait(), Err(Error::KeyTooLarge { .. })));
    assert!(matches!(adb.get(&big).wait(), Err(Error::KeyTooLarge { .. })));
    // An error from the transaction's body aborts it: nothing is written.
    let r = adb
        .transaction(|tx| {
            tx.put(b"half", b"done")?;
            Err::<(), _>(Error::InvalidOption("the body gave up".into()))
        })
        .wait();
    assert!(matches!(r, Err(Error::InvalidOption(ref m)) if m == "the body gave up"));
    assert_eq!(adb.get(b"half").wait().unwrap(), None);
    // A panic becomes an error; the workers keep serving.
    for _ in 0..3 {
        let r = adb.run(|_| -> nvstore::Result<()> { panic!("boom") }).wait();
        assert!(matches!(r, Err(Error::WorkerPanic(ref m)) if m == "boom"), "{r:?}");
    }
    adb.put(b"after", b"panic").wait().unwrap();
    assert_eq!(adb.get(b"after").wait().unwrap(), Some(b"panic".to_vec()));
    adb.close().unwrap();

    // A read-only pool refuses writes through the futures too.
    let ro = AsyncDb::open(
        &path,
        Options {
            read_only: true,
            ..small_nodes()
        },
    )
    .unwrap();
    assert!(matches!(ro.put(b"x", b"y").wait(), Err(Error::ReadOnly)));
    assert!(matches!(ro.delete(b"after").wait(), Err(Error::ReadOnly)));
    assert_eq!(ro.get(b"after").wait().unwrap(), Some(b"panic".to_vec()));
}

/// Puts a worker takes off the queue together are made durable as one
/// group on a hash pool (`Db::put_many`): each future still gets its own
/// answer (a bad key fails alone), a key written twice keeps the later
/// value, a get queued after a put sees it, and everything is in the pool
/// after a crash-free reopen and a rebuild of the index.
#[test]
fn queued_puts_on_a_hash_pool_complete_as_one_group() {
    let dir = pool_dir();
    let path = dir.path().join("h.nvs");
    let opts = hash_pool();
    let adb = AsyncDb::with_workers(Db::create(&path, opts.clone()).unwrap(), 1);
    let (release, blocker) = hold_worker(&adb);
    let big = vec![b'k'; 100_000];
    let mut futs = Vec::new();
    for i in 0..300u32 {
        let v = if i % 7 == 0 {
            vec![i as u8; 700]
        } else {
            i.to_be_bytes().to_vec()
        };
        futs.push((i, adb.put_owned(key(i), v)));
    }
    let bad = adb.put(&big, b"v");
    let again = adb.put(&key(5), b"again");
    let seen = adb.get(&key(5));
    assert_eq!(adb.queued(), 303);
    release.send(()).unwrap();
    blocker.wait().unwrap();
    for (i, f) in futs {
        f.wait().unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    assert!(matches!(bad.wait(), Err(Error::KeyTooLarge { .. })));
    again.wait().unwrap();
    assert_eq!(seen.wait().unwrap(), Some(b"again".to_vec()));
    let pairs = adb.prefix(b"k").wait().unwrap();
    assert_eq!(pairs.len(), 300);
    adb.close().unwrap();
    let db = Db::open(&path, opts).unwrap();
    assert!(db.check().ok, "{:?}", db.check().problems);
    assert_eq!(db.len(), 300);
    assert_eq!(db.get(&key(5)).unwrap(), Some(b"again".to_vec()));
    assert_eq!(db.get(&key(14)).unwrap(), Some(vec![14u8; 700]));
    assert_eq!(db.get(&key(299)).unwrap(), Some(299u32.to_be_bytes().to_vec()));
}

/// Gets a worker takes off the queue together are read as one group
/// (`Db::get_many`): each future gets its own answer (present, missing,
/// inline or in a blob, a bad key's error), and the queue's order holds
/// around puts: a get queued before a put of its key sees the old value,
/// one queued after it the new.
#[test]
fn queued_gets_on_a_hash_pool_read_as_one_group_in_queue_order() {
    let dir = pool_dir();
    let path = dir.path().join("h.nvs");
    let opts = hash_pool();
    let db = Db::create(&path, opts).unwrap();
    let value = |i: u32| {
        if i.is_multiple_of(3) {
            vec![i as u8; 600]
        } else {
            i.to_be_bytes().to_vec()
        }
    };
    for i in (0..200u32).step_by(2) {
        db.put(&key(i), &value(i)).unwrap();
    }
    let adb = AsyncDb::with_workers(db, 1);
    let (release, blocker) = hold_worker(&adb);
    let gets: Vec<_> = (0..200u32).map(|i| (i, adb.get(&key(i)))).collect();
    let bad = adb.get(&vec![b'k'; 100_000]);
    let before = adb.get(&key(4));
    let put = adb.put(&key(4), b"new");
    let after = adb.get(&key(4));
    let missing_then_put = adb.get(&key(5));
    let put5 = adb.put(&key(5), b"five");
    let after5 = adb.get(&key(5));
    release.send(()).unwrap();
    blocker.wait().unwrap();
    for (i, f) in gets {
        let want = i.is_multiple_of(2).then(|| value(i));
        assert_eq!(f.wait().unwrap(), want, "get {i}");
    }
    assert!(matches!(bad.wait(), Err(Error::KeyTooLarge { .. })));
    assert_eq!(before.wait().unwrap(), Some(value(4)));
    put.wait().unwrap();
    assert_eq!(after.wait().unwrap(), Some(b"new".to_vec()));
    assert_eq!(missing_then_put.wait().unwrap(), None);
    put5.wait().unwrap();
    assert_eq!(after5.wait().unwrap(), Some(b"five".to_vec()));
}

/// `Db::get_many` answers each key as `Db::get` does, on both engines:
/// present and missing keys, inline and blob values, an empty value, a
/// key given twice, and a bad key's error in its own place.
#[test]
fn get_many_answers_each_key_as_get_does() {
    for engine in [nvstore::EngineKind::Tree, nvstore::EngineKind::Hash] {
        let dir = pool_dir();
        let db = Db::create(
            dir.path().join("p.nvs"),
            Options {
                engine,
                size: 16 << 20,
                ..Options::default()
            },
        )
        .unwrap();
        // Short keys are held in their slot on a hash pool, longer ones in
        // the value's blob.
        let key = |i: u32| {
            if i.is_multiple_of(4) {
                key(i)
            } else {
                format!("a longer key {i:05}").into_bytes()
            }
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for i in 0..500u32 {
            let len = [0, 1, 8, 9, 100, 2000][i as usize % 6];
            let v: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            db.put(&key(i * 2), &v).unwrap();
        }
        let big = vec![b'k'; 100_000];
        for n in [0usize, 1, 2, 7, 33, 200] {
            let mut keys: Vec<Vec<u8>> = (0..n).map(|_| key(rng.gen_range(0..1000))).collect();
            if n > 2 {
                keys[1] = keys[0].clone();
                keys[n / 2] = big.clone();
            }
            let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
            let got = db.get_many(&refs);
            assert_eq!(got.len(), n);
            for (k, g) in keys.iter().zip(got) {
                match db.get(k) {
                    Ok(want) => assert_eq!(g.unwrap(), want, "{engine:?} {k:?}"),
                    Err(Error::KeyTooLarge { .. }) => assert!(matches!(g, Err(Error::KeyTooLarge { .. }))),
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
}
