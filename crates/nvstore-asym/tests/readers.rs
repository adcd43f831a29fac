//! Readers beside a writer: the multi-version BST and B+-tree (path
//! copying, readers without a lock, retired nodes reused after a delay)
//! and the sequence-number reader lock for structures changed in place.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use nvstore_asym::structures::{recover, BpTree, Bst, HashTable, MvBpTree, MvBst, Replay};
use nvstore_asym::transport::SharedBackend;
use nvstore_asym::{Error, Fault, FaultyTransport, LocalTransport, Mode, Remote, RemoteOptions};

mod common;
use common::{backend, doomed_writer, opts, val, MODES};

/// The two multi-version trees behind one interface.
trait Mv: Replay + Send + 'static {
    fn open(r: &mut Remote) -> Self;
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) -> nvstore_asym::Result<()>;
    fn get(&self, r: &mut Remote, k: u64) -> nvstore_asym::Result<Option<Vec<u8>>>;
    fn items(&self, r: &mut Remote) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>>;
    fn len(&self, r: &mut Remote) -> nvstore_asym::Result<u64>;
}

impl Mv for MvBst {
    fn open(r: &mut Remote) -> Self {
        MvBst::open(r, "mvbst").unwrap()
    }
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) -> nvstore_asym::Result<()> {
        MvBst::put(self, r, k, v)
    }
    fn get(&self, r: &mut Remote, k: u64) -> nvstore_asym::Result<Option<Vec<u8>>> {
        MvBst::get(self, r, k)
    }
    fn items(&self, r: &mut Remote) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>> {
        MvBst::items(self, r)
    }
    fn len(&self, r: &mut Remote) -> nvstore_asym::Result<u64> {
        MvBst::len(self, r)
    }
}

impl Mv for MvBpTree {
    fn open(r: &mut Remote) -> Self {
        MvBpTree::open(r, "mvbpt").unwrap()
    }
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) -> nvstore_asym::Result<()> {
        MvBpTree::put(self, r, k, v)
    }
    fn get(&self, r: &mut Remote, k: u64) -> nvstore_asym::Result<Option<Vec<u8>>> {
        MvBpTree::get(self, r, k)
    }
    fn items(&self, r: &mut Remote) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>> {
        MvBpTree::scan(self, r)
    }
    fn len(&self, r: &mut Remote) -> nvstore_asym::Result<u64> {
        MvBpTree::len(self, r)
    }
}

fn agrees_with_a_model<T: Mv>() {
    for mode in MODES {
        let b = backend();
        let o = RemoteOptions {
            reclaim_after: Duration::ZERO,
            ..opts(mode, 16)
        };
        let mut r = Remote::open(LocalTransport::new(b.clone()), o.clone()).unwrap();
        let mut t = T::open(&mut r);
        let mut model = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for i in 0..1500u64 {
            let k = rng.gen_range(0..1000u64);
            if i % 4 == 3 {
                assert_eq!(t.get(&mut r, k).unwrap(), model.get(&k).cloned(), "{mode:?} op {i}");
            } else {
                t.put(&mut r, k, &val(i)).unwrap();
                model.insert(k, val(i));
            }
        }
        assert_eq!(t.items(&mut r).unwrap(), model, "{mode:?}");
        assert_eq!(t.len(&mut r).unwrap(), model.len() as u64, "{mode:?}");
        // Replaced nodes were reused (the delay is zero here).
        assert!(r.retired().1 > 0, "{mode:?}: nothing reclaimed");
        r.close().unwrap();
        let mut r = Remote::open(LocalTransport::new(b), o).unwrap();
        let t = T::open(&mut r);
        assert_eq!(t.items(&mut r).unwrap(), model, "{mode:?} after reopen");
        for k in 0..1000u64 {
            assert_eq!(t.get(&mut r, k).unwrap(), model.get(&k).cloned(), "{mode:?} key {k}");
        }
    }
}

#[test]
fn mv_bst_agrees_with_a_model_in_every_mode_and_after_reopen() {
    agrees_with_a_model::<MvBst>();
}

#[test]
fn mv_bptree_agrees_with_a_model_in_every_mode_and_after_reopen() {
    agrees_with_a_model::<MvBpTree>();
}

fn dies_and_recovers<T: Mv>() {
    for kill_after in [19u64, 57, 133] {
        let b = backend();
        let mut r = doomed_writer(&b, kill_after);
        let mut t = T::open(&mut r);
        let mut model = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(kill_after);
        let mut i = 0u64;
        let err = loop {
            i += 1;
            let k = rng.gen_range(0..300u64);
            match t.put(&mut r, k, &val(i)) {
                Ok(()) => {
                    model.insert(k, val(i));
                }
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::Io(_)), "ended by {err}");
        drop(r);
        let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 8)).unwrap();
        let mut t = T::open(&mut r);
        recover(&mut r, &mut t).unwrap();
        // The link died before the failed request left: every acknowledged put, once.
        let got = t.items(&mut r).unwrap();
        assert_eq!(got, model, "kill after {kill_after}");
        assert_eq!(t.len(&mut r).unwrap(), got.len() as u64);
        assert_eq!(recover(&mut r, &mut t).unwrap(), 0);
    }
}

#[test]
fn an_mv_bst_writer_that_dies_is_recovered_exactly_once() {
    dies_and_recovers::<MvBst>();
}

#[test]
fn an_mv_bptree_writer_that_dies_is_recovered_exactly_once() {
    dies_and_recovers::<MvBpTree>();
}

/// `n` distinct keys in a shuffled order.
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut keys: Vec<u64> = (1..=n).map(|i| i * 17).collect();
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.gen_range(0..=i));
    }
    keys
}

/// Reads a whole structure inside a read section.
type Snapshot<T> = fn(&mut Remote, &T) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>>;

/// Whether `seen` is exactly the first `seen.len()` keys of `order`, each with its value.
fn is_prefix(seen: &BTreeMap<u64, Vec<u8>>, order: &[u64]) -> bool {
    seen.len() <= order.len()
        && order[..seen.len()]
            .iter()
            .all(|k| seen.get(k).is_some_and(|v| *v == val(*k)))
}

/// One writer inserts `order` while `readers` readers repeatedly read the
/// whole structure with `snapshot` (inside their read section) and check
/// that each view holds exactly the first operations. Answers the
/// writer's front-end and the readers' views and retries.
fn writer_and_readers<T: Mv>(
    b: SharedBackend,
    mode: Mode,
    order: Vec<u64>,
    readers: usize,
    snapshot: Snapshot<T>,
    o: RemoteOptions,
) -> (Remote, Vec<(u64, u64)>) {
    let mut w = Remote::open(LocalTransport::new(b.clone()), RemoteOptions { mode, ..o.clone() }).unwrap();
    let mut t = T::open(&mut w);
    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(order);
    let handles: Vec<_> = (0..readers)
        .map(|_| {
            let (b, done, order, o) = (b.clone(), done.clone(), order.clone(), o.clone());
            let started = started.clone();
            std::thread::spawn(move || {
                let mut r = Remote::open_reader(LocalTransport::new(b), o).unwrap();
                let t = T::open(&mut r);
                let (mut views, mut last) = (0u64, 0usize);
                // Bounded: stops when the writer is done, or after many views.
                while !done.load(Ordering::Acquire) && views < 5_000 {
                    let seen = snapshot(&mut r, &t).unwrap();
                    assert!(
                        is_prefix(&seen, &order),
                        "a view of {} items is not a prefix",
                        seen.len()
                    );
                    assert!(seen.len() >= last, "a later view went back in time");
                    last = seen.len();
                    if views == 0 {
                        started.fetch_add(1, Ordering::AcqRel);
                    }
                    views += 1;
                }
                (views, r.read_retries())
            })
        })
        .collect();
    // The writer starts once every reader is reading (bounded wait).
    let t0 = std::time::Instant::now();
    while started.load(Ordering::Acquire) < readers && t0.elapsed() < Duration::from_secs(20) {
        std::thread::yield_now();
    }
    for &k in order.iter() {
        t.put(&mut w, k, &val(k)).unwrap();
    }
    w.flush().unwrap();
    done.store(true, Ordering::Release);
    let stats = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let all: BTreeMap<u64, Vec<u8>> = order.iter().map(|k| (*k, val(*k))).collect();
    assert_eq!(t.items(&mut w).unwrap(), all);
    (w, stats)
}

fn versioned<T: Mv>(r: &mut Remote, t: &T) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>> {
    r.read_versioned(|r| t.items(r))
}

fn readers_see_whole_versions<T: Mv>() {
    for (mode, batch) in [(Mode::R, 1), (Mode::Rcb, 4)] {
        let o = RemoteOptions {
            reclaim_after: Duration::from_millis(30),
            ..opts(mode, batch)
        };
        let (mut w, stats) = writer_and_readers::<T>(backend(), mode, shuffled(400, 9), 2, versioned::<T>, o.clone());
        assert!(
            stats.iter().all(|s| s.0 > 0),
            "{mode:?}: a reader saw nothing: {stats:?}"
        );
        // Blocks retired while the readers ran are reused once the delay has passed.
        std::thread::sleep(o.reclaim_after);
        let mut t = T::open(&mut w);
        t.put(&mut w, 1, &val(1)).unwrap();
        assert!(w.retired().1 > 0, "{mode:?}: nothing reclaimed");
    }
}

#[test]
fn mv_bst_readers_see_whole_versions_while_a_writer_path_copies() {
    readers_see_whole_versions::<MvBst>();
}

#[test]
fn mv_bptree_readers_see_whole_versions_while_a_writer_path_copies() {
    readers_see_whole_versions::<MvBpTree>();
}

/// A structure changed in place, behind the shared interface: its readers
/// take the sequence-number lock.
macro_rules! in_place {
    ($wrap:ident, $ty:ty, $open:expr, $items:ident) => {
        struct $wrap($ty);
        impl Replay for $wrap {
            fn redo(&mut self, r: &mut Remote, op: &[u8]) -> nvstore_asym::Result<()> {
                self.0.redo(r, op)
            }
        }
        impl Mv for $wrap {
            fn open(r: &mut Remote) -> Self {
                $wrap($open(r).unwrap())
            }
            fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) -> nvstore_asym::Result<()> {
                self.0.put(r, k, v)
            }
            fn get(&self, r: &mut Remote, k: u64) -> nvstore_asym::Result<Option<Vec<u8>>> {
                self.0.get(r, k)
            }
            fn items(&self, r: &mut Remote) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>> {
                Ok(self.0.$items(r)?.into_iter().collect())
            }
            fn len(&self, r: &mut Remote) -> nvstore_asym::Result<u64> {
                self.0.len(r)
            }
        }
    };
}

in_place!(LockedBst, Bst, |r| Bst::open(r, "bst"), items);
in_place!(LockedBpTree, BpTree, |r| BpTree::open(r, "bpt"), scan);
in_place!(LockedHash, HashTable, |r| HashTable::open(r, "hash", 64), items);

/// The whole structure and, last, its count, in one locked section: they
/// agree unless an operation slipped in between.
fn locked<T: Mv>(r: &mut Remote, t: &T) -> nvstore_asym::Result<BTreeMap<u64, Vec<u8>>> {
    let (items, len) = r.read_locked(|r| Ok((t.items(r)?, t.len(r)?)))?;
    assert_eq!(items.len() as u64, len, "the count and the items of one section differ");
    Ok(items)
}

fn locked_readers_see_whole_operations<T: Mv>() {
    for (mode, batch) in [(Mode::R, 1), (Mode::Rcb, 4)] {
        let (_, stats) = writer_and_readers::<T>(backend(), mode, shuffled(300, 4), 2, locked::<T>, opts(mode, batch));
        assert!(stats.iter().all(|s| s.0 > 0), "{mode:?}: {stats:?}");
    }
}

#[test]
fn bst_readers_under_the_sequence_lock_see_whole_operations() {
    locked_readers_see_whole_operations::<LockedBst>();
}

#[test]
fn bptree_readers_under_the_sequence_lock_see_whole_operations() {
    locked_readers_see_whole_operations::<LockedBpTree>();
}

#[test]
fn hash_table_readers_under_the_sequence_lock_see_whole_operations() {
    locked_readers_see_whole_operations::<LockedHash>();
}

#[test]
fn a_locked_read_overtaken_by_a_replay_runs_again_and_costs_no_extra_round_trip() {
    let b = backend();
    let mut w = Remote::open(LocalTransport::new(b.clone()), opts(Mode::R, 1)).unwrap();
    let mut t = Bst::open(&mut w, "t").unwrap();
    for k in [50u64, 20, 80] {
        t.put(&mut w, k, &val(k)).unwrap();
    }
    let mut rd = Remote::open_reader(LocalTransport::new(b), opts(Mode::Rcb, 1)).unwrap();
    let rt = Bst::open(&mut rd, "t").unwrap();
    // Undisturbed: a get of 80 reads the metadata, 50 and 80, with the
    // sequence number checked inside those three round trips.
    let before = rd.counters().clone();
    assert_eq!(rd.read_locked(|r| rt.get(r, 80)).unwrap(), Some(val(80)));
    let d = rd.counters().since(&before);
    assert_eq!((d.round_trips, d.verbs_of("seq_read")), (3, 6));
    assert_eq!(rd.read_retries(), 0);
    // A put replayed between two reads of one section: it runs again and
    // sees the put.
    let mut first = true;
    let got = rd
        .read_locked(|r| {
            let a = rt.get(r, 20)?;
            if first {
                first = false;
                t.put(&mut w, 20, &val(7)).unwrap();
            }
            Ok((a, rt.get(r, 80)?))
        })
        .unwrap();
    assert_eq!(got, (Some(val(7)), Some(val(80))));
    assert_eq!(rd.read_retries(), 1);
    // A reader cannot write.
    let mut rt = rt;
    assert!(rt.put(&mut rd, 1, &val(1)).is_err());
}

#[test]
fn a_versioned_read_slower_than_the_reclamation_delay_gives_up() {
    let b = backend();
    let mut w = Remote::open(LocalTransport::new(b.clone()), opts(Mode::R, 1)).unwrap();
    let mut t = MvBst::open(&mut w, "t").unwrap();
    for k in [50u64, 20, 80] {
        t.put(&mut w, k, &val(k)).unwrap();
    }
    let slow = Fault {
        delay: Duration::from_millis(3),
        ..Fault::default()
    };
    let o = RemoteOptions {
        reclaim_after: Duration::from_millis(1),
        read_attempts: 3,
        ..opts(Mode::R, 1)
    };
    let mut rd = Remote::open_reader(FaultyTransport::new(LocalTransport::new(b.clone()), slow.clone()), o).unwrap();
    let rt = MvBst::open(&mut rd, "t").unwrap();
    let e = rd.read_versioned(|r| rt.get(r, 80)).unwrap_err();
    assert!(matches!(e, Error::Contended { attempts: 3 }), "{e}");
    assert_eq!(rd.read_retries(), 3);
    // Within the delay, the same read succeeds at once.
    let o = RemoteOptions {
        reclaim_after: Duration::from_secs(60),
        ..opts(Mode::R, 1)
    };
    let mut rd = Remote::open_reader(FaultyTransport::new(LocalTransport::new(b), slow), o).unwrap();
    assert_eq!(rd.read_versioned(|r| rt.get(r, 80)).unwrap(), Some(val(80)));
    assert_eq!(rd.read_retries(), 0);
}

/// Keys 1..2^levels in level order of a perfect tree, with their depths.
fn level_order(levels: u32) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for d in 1..=levels {
        let step = 1u64 << (levels - d + 1);
        let mut k = step / 2;
        while k < 1 << levels {
            out.push((k, d));
            k += step;
        }
    }
    out
}

#[test]
fn mv_bst_round_trips_per_insert_are_exact() {
    let order = level_order(7);
    let keys: Vec<u64> = order.iter().map(|p| p.0).collect();
    let n = keys.len() as u64;
    let run = |mode: Mode, batch: usize| {
        let mut r = Remote::open(LocalTransport::new(backend()), opts(mode, batch)).unwrap();
        let mut t = MvBst::open(&mut r, "t").unwrap();
        let start = r.counters().clone();
        let allocs0 = r.alloc_trips();
        for &k in &keys {
            t.put(&mut r, k, &val(k)).unwrap();
        }
        let d = r.counters().since(&start);
        // Round trips that only allocated are left out (a malloc that
        // carried its operation's log, in rcb, is the log's round trip).
        (d.round_trips - (r.alloc_trips() - allocs0), d.verbs_of("tx_write"))
    };
    // naive: metadata and ancestors read; the new node, a copy of each
    // ancestor and the metadata written.
    let naive: u64 = order.iter().map(|p| 2 * p.1 as u64 + 1).sum();
    assert_eq!(run(Mode::Naive, 1), (naive, 0));
    // r: the same reads, one tx_write.
    let reads: u64 = order.iter().map(|p| p.1 as u64).sum();
    assert_eq!(run(Mode::R, 1), (reads + n, n));
    // rc, rcb: every node of the current version was written by this front-end and is cached.
    assert_eq!(run(Mode::Rc, 1), (n, n));
    assert_eq!(run(Mode::Rcb, 10), (n, n / 10));
}
