//! The NV-Tree engine (`nvstore::Db`) on a back-end's data area through
//! `RemoteSpace`: agreement with a model in every mode, exact round trips
//! per operation, a writer killed after N round trips, a back-end restart.

#[allow(dead_code, reason = "shared with the other front-end tests")]
mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::transport::{share, Fault, FaultyTransport, LocalTransport, SharedBackend};
use nvstore_asym::{open_db, Layout, Mode, RemoteDb, SpaceOptions};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use common::{backend, opts, Switch, MODES};

fn space_opts(mode: Mode, batch: usize) -> SpaceOptions {
    let mut remote = opts(mode, batch);
    remote.cache_bytes = 2 << 20;
    SpaceOptions {
        remote,
        ..SpaceOptions::default()
    }
}

fn db_opts() -> nvstore::Options {
    nvstore::Options {
        node_size: 512,
        ..db_opts_big()
    }
}

fn db_opts_big() -> nvstore::Options {
    nvstore::Options {
        node_size: 4096,
        adaptive: nvstore::Adaptive::Off,
        ..nvstore::Options::default()
    }
}

fn open(b: &SharedBackend, mode: Mode, batch: usize) -> RemoteDb {
    open_db(LocalTransport::new(b.clone()), &space_opts(mode, batch), &db_opts()).unwrap()
}

fn key(i: u64) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

fn value(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i as u8).wrapping_mul(7).wrapping_add(j as u8))
        .collect()
}

fn contents(db: &RemoteDb) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (k, v) in db.iter() {
        assert!(m.insert(k.clone(), v).is_none(), "key {k:?} listed twice");
    }
    m
}

#[test]
fn the_nv_tree_on_a_back_end_agrees_with_a_model_in_every_mode() {
    for mode in MODES {
        let b = backend();
        let db = open(&b, mode, 16);
        assert!(db.created);
        let mut model = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let n = if mode == Mode::Naive { 500 } else { 1500 };
        for i in 0..n {
            let k = key(rng.gen_range(0..400));
            match rng.gen_range(0..10) {
                5 => {
                    let v = value(i, 24);
                    let had = model.contains_key(&k);
                    assert_eq!(db.update(&k, &v).unwrap(), had, "{mode:?}");
                    if had {
                        model.insert(k, v);
                    }
                }
                0..=4 => {
                    // Some values are long enough to live in a blob.
                    let v = value(i, if i % 13 == 0 { 300 } else { 24 });
                    db.put(&k, &v).unwrap();
                    model.insert(k, v);
                }
                6 | 7 => assert_eq!(db.delete(&k).unwrap(), model.remove(&k).is_some(), "{mode:?}"),
                8 => assert_eq!(db.get(&k).unwrap(), model.get(&k).cloned(), "{mode:?}"),
                _ => {
                    let hi = key(rng.gen_range(0..400));
                    let (k, hi) = if k <= hi { (k, hi) } else { (hi, k) };
                    let got: Vec<_> = db.range(k.clone()..hi.clone()).collect();
                    let want: Vec<_> = model.range(k..hi).map(|(a, b)| (a.clone(), b.clone())).collect();
                    assert_eq!(got, want, "{mode:?}");
                }
            }
        }
        assert_eq!(contents(&db), model, "{mode:?}");
        assert!(db.check().ok, "{mode:?}");
        db.close().unwrap();
        // A clean close saved the index: the reopened pool needs no replay.
        let db = open(&b, mode, 16);
        assert!(!db.created);
        assert_eq!(db.replayed, 0);
        assert_eq!(contents(&db), model, "{mode:?} after reopening");
        assert!(db.check().ok);
    }
}

#[test]
fn a_warm_write_costs_one_round_trip_in_rcb_and_a_warm_read_none() {
    let b = backend();
    // Leaves of 4 KiB: the overwrites below fit without a split.
    let db = open_db(
        LocalTransport::new(b.clone()),
        &space_opts(Mode::Rcb, 4),
        &db_opts_big(),
    )
    .unwrap();
    for i in 0..8 {
        db.put(&key(i), &value(i, 16)).unwrap();
    }
    // Warm: the leaf is cached. Overwrites of one key neither split nor miss.
    let before = db.space().stats();
    for i in 0..12 {
        db.put(&key(3), &value(100 + i, 16)).unwrap();
    }
    let after = db.space().stats();
    let c = after.counters.since(&before.counters);
    assert_eq!(after.read_trips - before.read_trips, 0, "the leaf missed the cache");
    // One operation log each; the 3 batches ride in the same frames.
    assert_eq!(c.round_trips, 12);
    assert_eq!(c.verbs_of("op_log"), 12);
    assert_eq!(c.verbs_of("tx_write"), 3);
    let before = db.space().stats();
    for i in 0..8 {
        assert!(db.get(&key(i)).unwrap().is_some());
    }
    let after = db.space().stats();
    assert_eq!(
        after.counters.round_trips, before.counters.round_trips,
        "a warm lookup went remote"
    );

    // r: one tx_write per write operation, reads remote every time.
    let b = backend();
    let db = open(&b, Mode::R, 4);
    db.put(&key(1), &value(1, 16)).unwrap();
    let before = db.space().stats();
    db.put(&key(1), &value(2, 16)).unwrap();
    let after = db.space().stats();
    let c = after.counters.since(&before.counters);
    assert_eq!(c.verbs_of("tx_write"), 1);
    assert_eq!(c.round_trips, 1 + after.read_trips - before.read_trips);
    assert!(after.read_trips > before.read_trips);

    // naive: one tx_write per fence of the engine.
    let b = backend();
    let db = open(&b, Mode::Naive, 4);
    db.put(&key(1), &value(1, 16)).unwrap();
    let before = db.space().stats();
    db.put(&key(1), &value(2, 16)).unwrap();
    let after = db.space().stats();
    let c = after.counters.since(&before.counters);
    assert!(c.verbs_of("tx_write") >= 2, "{c:?}");
    assert_eq!(
        c.round_trips,
        c.verbs_of("tx_write") + after.read_trips - before.read_trips
    );
}

#[test]
fn a_cold_write_pays_only_the_reads_after_its_first_in_rcb_its_log_riding_on_the_leaf_read() {
    let b = backend();
    // `bench asym --structure nvtree` in small: 8-byte keys, 64-byte
    // values, a page cache of a tenth of the puts' bytes (144 a put), so
    // many puts of random keys miss their leaf.
    let n = 2000;
    let mut o = space_opts(Mode::Rcb, 64);
    o.remote.cache_bytes = 3 * n as usize * 144 / 10;
    let db_opts = nvstore::Options {
        adaptive: nvstore::Adaptive::Off,
        ..nvstore::Options::default()
    };
    let db = open_db(LocalTransport::new(b.clone()), &o, &db_opts).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut put = |db: &RemoteDb| {
        let k: u64 = rng.gen_range(0..4 * n);
        db.put(&k.to_be_bytes(), &[0x42; 64]).unwrap();
    };
    for _ in 0..2 * n {
        put(&db);
    }
    let before = db.space().stats();
    for _ in 0..n {
        put(&db);
    }
    let after = db.space().stats();
    let c = after.counters.since(&before.counters);
    let reads = after.read_trips - before.read_trips;
    let ahead = after.logs_ahead - before.logs_ahead;
    // Many puts missed, and each of their logs rode on the first miss.
    assert!(ahead > n / 20, "{ahead} of {n} logs rode on a read");
    assert_eq!(c.verbs_of("op_log"), n);
    // One round trip per operation, plus only the reads after an operation's first.
    assert_eq!(c.round_trips, n + reads - ahead, "{c:?}");
    // Batches of 64 ride first on later frames, never alone.
    let tx = c.verbs_of("tx_write");
    assert!(tx == n / 64 || tx == n / 64 + 1, "{tx} batches");
    // (How often a put misses more than one page depends on the pool's
    // layout; the bench test checks the per-put figure at `bench asym`'s settings.)
    db.close().unwrap();
}

/// An rcb writer whose transport dies after `kill_after` round trips.
fn doomed(b: &SharedBackend, kill_after: u64) -> Option<RemoteDb> {
    let fault = Fault {
        kill_after: Some(kill_after),
        ..Fault::default()
    };
    let t = FaultyTransport::new(LocalTransport::new(b.clone()), fault);
    catch_unwind(AssertUnwindSafe(|| {
        open_db(t, &space_opts(Mode::Rcb, 8), &db_opts()).ok()
    }))
    .unwrap_or(None)
}

#[test]
fn a_writer_killed_after_n_round_trips_is_recovered_exactly_once() {
    let mut replayed = 0;
    for kill_after in (4..90).step_by(3) {
        let b = backend();
        // A first writer makes the pool and some history, cleanly.
        let db = open(&b, Mode::Rcb, 8);
        let mut model = BTreeMap::new();
        for i in 0..30 {
            db.put(&key(i), &value(i, 20)).unwrap();
            model.insert(key(i), value(i, 20));
        }
        db.close().unwrap();
        // The doomed writer: deletes, updates and new keys until it dies.
        let Some(db) = doomed(&b, kill_after) else {
            continue; // died while opening
        };
        let mut i = 0u64;
        let in_flight = loop {
            let op = i % 4;
            let k = if op >= 2 { key(i % 30) } else { key(100 + i) };
            let r = catch_unwind(AssertUnwindSafe(|| match op {
                3 => db.delete(&k).map(|_| ()),
                2 => db.update(&k, &value(i, 20)).map(|_| ()),
                _ => db.put(&k, &value(i, 20)),
            }));
            match r {
                Ok(Ok(())) => match op {
                    3 => {
                        model.remove(&k);
                    }
                    2 => {
                        if let Some(v) = model.get_mut(&k) {
                            *v = value(i, 20);
                        }
                    }
                    _ => {
                        model.insert(k, value(i, 20));
                    }
                },
                _ => break (op, k),
            }
            i += 1;
            assert!(i < 10_000, "the transport never died");
        };
        drop(catch_unwind(AssertUnwindSafe(|| drop(db))));
        // The restarted writer re-executes what was logged and not sent.
        let db = open(&b, Mode::Rcb, 8);
        replayed += db.replayed;
        assert!(db.check().ok, "kill after {kill_after}");
        let mut got = contents(&db);
        // The operation in flight may or may not have been logged.
        {
            let (op, k) = in_flight;
            let want_after = if op == 3 { None } else { Some(value(i, 20)) };
            if got.get(&k) != model.get(&k) {
                assert_eq!(got.get(&k).cloned(), want_after, "kill after {kill_after}");
                match want_after {
                    Some(_) => {
                        got.remove(&k);
                    }
                    None => {
                        got.insert(k.clone(), model[&k].clone());
                    }
                }
            }
        }
        assert_eq!(got, model, "kill after {kill_after}");
        // Recovery covered what it re-executed: a second open replays nothing.
        db.close().unwrap();
        let db = open(&b, Mode::Rcb, 8);
        assert_eq!(db.replayed, 0, "kill after {kill_after}");
    }
    assert!(replayed > 0, "no restarted writer had logged operations to re-execute");
}

#[test]
fn a_back_end_restart_keeps_the_pool() {
    // The back-end restarts on its persisted bytes after `n` puts, in every
    // mode; rcb's batches of 16 leave `n % 16` puts to re-execute.
    for mode in MODES {
        for n in [0u64, 1, 37, 200] {
            let typed = Arc::new(Mutex::new(
                Backend::create(SimSpace::new(8 << 20), Layout::default_for(8 << 20)).unwrap(),
            ));
            let shared: SharedBackend = typed.clone();
            let switch = Switch(Arc::new(Mutex::new(shared)));
            let so = space_opts(mode, 16);
            let db = open_db(switch.clone(), &so, &db_opts()).unwrap();
            for i in 0..n {
                db.put(&key(i), &value(i, 40)).unwrap();
            }
            // The back-end process dies and restarts on the persisted bytes;
            // the front-end's session is stale, so it dies too.
            let image = typed.lock().space().persisted_image();
            let restarted: SharedBackend = share(Backend::open(SimSpace::from_image(image)).unwrap());
            *switch.0.lock() = restarted;
            let r = catch_unwind(AssertUnwindSafe(|| db.put(&key(999), &value(999, 40))));
            assert!(!matches!(r, Ok(Ok(()))), "{mode:?}: a stale session wrote");
            drop(catch_unwind(AssertUnwindSafe(|| drop(db))));
            let db = open_db(switch, &so, &db_opts()).unwrap();
            assert!(!db.created);
            let want = if mode == Mode::Rcb { n % 16 } else { 0 };
            assert_eq!(db.replayed, want, "{mode:?} after {n}");
            assert!(db.check().ok);
            let got = contents(&db);
            assert_eq!(got.len() as u64, n, "{mode:?}");
            for i in 0..n {
                assert_eq!(got.get(&key(i)), Some(&value(i, 40)), "{mode:?}");
            }
        }
    }
}

#[test]
fn a_pool_cannot_grow_past_the_data_area() {
    let b = share(Backend::create(SimSpace::new(2 << 20), Layout::default_for(2 << 20)).unwrap());
    let db = open(&b, Mode::Rcb, 64);
    let mut err = None;
    for i in 0..100_000 {
        if let Err(e) = db.put(&key(i), &value(i, 200)) {
            err = Some(e);
            break;
        }
    }
    let e = err.expect("a 2 MiB back-end held 20 MB");
    assert!(matches!(e, nvstore::Error::PoolFull { .. }), "{e}");
    // What was acknowledged is still there, and the pool still serves.
    assert!(db.check().ok);
    assert_eq!(db.get(&key(0)).unwrap(), Some(value(0, 200)));
}
