//! The compact prefix of rewritten NV leaves (`format/leaf_nv.rs`): which
//! elements a split stores in 16 bytes, that snapshots and watches still
//! read the versions they need, and that a crash image recovers with the
//! clock above every stored version and the commit record.

use std::collections::BTreeMap;

use nvstore::format::{header, leaf_nv::Layout};
use nvstore::pmem::{SimSpace, Space};
use nvstore::{Db, Error, Options, RecoveryKind};

fn small_nodes() -> Options {
    Options {
        node_size: 256, // capacity 6: a split every few inserts
        size: 4 << 20,
        // Fixed leaf sizes: these tests count splits and compact entries.
        adaptive: nvstore::tree::adaptive::Strategy::Off,
        ..Options::default()
    }
}

fn sim_db() -> Db<SimSpace> {
    Db::create_in(SimSpace::new(4 << 20), "c".as_ref(), &small_nodes()).unwrap()
}

fn key(i: u64) -> [u8; 8] {
    (i * 7919 % 100_003).to_be_bytes()
}

/// (leaf offset, layout, count) of every leaf in chain order.
fn layouts<S: Space>(db: &Db<S>) -> Vec<(Layout, u64)> {
    db.tree()
        .leaf_offsets()
        .into_iter()
        .map(|(off, n)| (Layout::read(db.space(), off), n))
        .collect()
}

fn compact_entries<S: Space>(db: &Db<S>) -> u64 {
    layouts(db).iter().map(|(l, _)| l.compact).sum()
}

#[test]
fn split_stores_settled_pairs_compact_and_search_finds_them() {
    let db = sim_db();
    for i in 0..200u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    assert!(db.tree().stats.splits.load(std::sync::atomic::Ordering::Relaxed) > 10);
    let ls = layouts(&db);
    let compact = compact_entries(&db);
    // No snapshot: every element a split copies is settled, 8-byte key and
    // value: all of them go compact (elements appended since stay full).
    assert!(compact >= 100, "only {compact} compact entries in {} leaves", ls.len());
    for (l, n) in &ls {
        assert!(l.compact <= *n);
        assert!(l.compact_version <= db.tree().clock.last());
    }
    for i in 0..200u64 {
        assert_eq!(db.get(&key(i)).unwrap(), Some(i.to_le_bytes().to_vec()), "key {i}");
    }
    assert_eq!(db.get(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap(), None);
    assert_eq!(db.iter().count(), 200);
    // Update keys held compact (in place: no snapshot is live) and delete
    // some (a NEGATIVE element follows the entry).
    for i in 0..200u64 {
        match i % 3 {
            0 => db.put(&key(i), b"updated!").unwrap(),
            1 => assert!(db.delete(&key(i)).unwrap()),
            _ => {}
        }
    }
    for i in 0..200u64 {
        let want = match i % 3 {
            0 => Some(b"updated!".to_vec()),
            1 => None,
            _ => Some(i.to_le_bytes().to_vec()),
        };
        assert_eq!(db.get(&key(i)).unwrap(), want, "key {i}");
    }
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

#[test]
fn only_pairs_every_snapshot_reads_are_compact() {
    let db = sim_db();
    // Values of other lengths and long keys stay full.
    db.put(b"short", b"v").unwrap();
    db.put(b"a-key-longer-than-8", &7u64.to_le_bytes()).unwrap();
    for i in 0..40u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    let snap = db.begin().unwrap();
    // Newer than the snapshot: written full by every rewrite while it lives.
    for i in 0..40u64 {
        db.put(&key(i), &(i + 1000).to_le_bytes()).unwrap();
    }
    for i in 40..120u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    let at = snap.start_ts();
    for (l, _) in layouts(&db) {
        assert!(
            l.compact == 0 || l.compact_version <= at,
            "{l:?} above the snapshot {at}"
        );
    }
    for i in 0..40u64 {
        assert_eq!(
            snap.get(&key(i)).unwrap(),
            Some(i.to_le_bytes().to_vec()),
            "snapshot, key {i}"
        );
        assert_eq!(
            db.get(&key(i)).unwrap(),
            Some((i + 1000).to_le_bytes().to_vec()),
            "key {i}"
        );
    }
    assert_eq!(snap.get(&key(100)).unwrap(), None);
    drop(snap);
    // With the snapshot gone, the next rewrites settle the new versions too.
    for i in 120..400u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    assert!(compact_entries(&db) > 200);
    assert_eq!(db.get(b"short").unwrap(), Some(b"v".to_vec()));
    assert_eq!(
        db.get(b"a-key-longer-than-8").unwrap(),
        Some(7u64.to_le_bytes().to_vec())
    );
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

/// A compact entry reads as its leaf's `compact_version`, the largest
/// version among the leaf's compact entries: a write after a watch is never
/// hidden by a rewrite that stores it compact.
#[test]
fn watch_sees_a_change_stored_compact() {
    let db = sim_db();
    for i in 0..10u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    let since = db.last_commit_ts();
    db.put(&key(3), b"changed!").unwrap();
    // Rewrites of every leaf until the changed key is held compact.
    for i in 10..200u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    let kw = u64::from_be_bytes(key(3));
    let held_compact = layouts(&db)
        .iter()
        .any(|(l, _)| (0..l.compact).any(|i| l.key_word(db.space(), i) == kw));
    assert!(held_compact, "the changed key never went compact");
    assert!(db.tree().newest_version(&key(3)).unwrap().unwrap() > since);
    let mut t = db.begin().unwrap();
    t.watch(&key(3), since);
    t.put(b"other", b"x").unwrap();
    assert!(matches!(t.commit(), Err(Error::Conflict)));
    // Unchanged since a later watch: commits.
    let since = db.last_commit_ts();
    let mut t = db.begin().unwrap();
    t.watch(&key(3), since);
    t.put(b"other", b"y").unwrap();
    t.commit().unwrap();
}

/// After a crash the clock restarts from the leaves' versions (compact
/// entries read as their leaf's `compact_version`) and the header's commit
/// record: above every version stored and every committed transaction, so
/// versions keep rising per key and a new transaction's elements never look
/// committed before their record is.
#[test]
fn crash_restart_keeps_the_clock_above_stored_versions_and_the_commit_record() {
    let db = sim_db();
    let mut model = BTreeMap::new();
    for i in 0..150u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    // A transaction over many leaves writes the commit record.
    let mut t = db.begin().unwrap();
    for i in (0..150u64).step_by(10) {
        t.put(&key(i), b"txn-val!").unwrap();
        model.insert(key(i).to_vec(), b"txn-val!".to_vec());
    }
    t.commit().unwrap();
    let committed = db.space().load(header::TXN_COMMIT_OFF);
    assert!(committed > 0, "the transaction spanned one leaf only");
    // Later splits settle the transaction's elements into compact prefixes.
    for i in 150..400u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    let top = layouts(&db).iter().map(|(l, _)| l.compact_version).max().unwrap();
    assert!(
        top >= committed,
        "no compact entry settled the transaction ({top} < {committed})"
    );

    // Power failure: only what was persisted survives (every acknowledged write).
    let image = db.space().persisted_image();
    drop(db);
    let db = Db::open_space(SimSpace::from_image(image), "c".as_ref()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Rebuild);
    let last = db.tree().clock.last();
    assert!(last >= committed, "clock {last} below the commit record {committed}");
    assert!(last >= top, "clock {last} below a compact version {top}");
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    for (k, v) in &model {
        assert_eq!(db.get(k).unwrap().as_ref(), Some(v));
    }
    // Work goes on: a new multi-leaf transaction and plain writes.
    let mut t = db.begin().unwrap();
    for i in (5..400u64).step_by(25) {
        t.put(&key(i), b"second!!").unwrap();
        model.insert(key(i).to_vec(), b"second!!".to_vec());
    }
    let ts = t.commit().unwrap();
    assert!(ts > committed && ts > top);
    for i in 400..500u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    let all: BTreeMap<Vec<u8>, Vec<u8>> = db.iter().collect();
    assert_eq!(all, model);
}

/// Elements stored in every leaf, compact entries included.
fn elements<S: Space>(db: &Db<S>) -> u64 {
    layouts(db).iter().map(|(_, n)| n).sum()
}

#[test]
fn an_update_of_a_compact_pair_replaces_its_value_in_place_unless_a_snapshot_lives() {
    use nvstore::pmem::ThreadCounters;
    let db = sim_db();
    for i in 0..200u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    // Keys whose newest element is a compact entry: the prefix of each leaf.
    let held: Vec<u64> = (0..200u64)
        .filter(|&i| {
            layouts(&db)
                .iter()
                .any(|(l, _)| (0..l.compact).any(|j| l.key_word(db.space(), j) == u64::from_be_bytes(key(i))))
        })
        .collect();
    assert!(held.len() >= 50, "only {} keys held compact", held.len());
    let (elems, splits) = (
        elements(&db),
        db.tree().stats.splits.load(std::sync::atomic::Ordering::Relaxed),
    );
    // No snapshot: one store, one flush, one fence each; the leaves do not grow.
    for &i in &held {
        let before = ThreadCounters::get();
        db.put(&key(i), &(i + 5000).to_le_bytes()).unwrap();
        let d = ThreadCounters::get().since(before);
        assert_eq!((d.flushes, d.fences), (1, 1), "update of key {i}");
        assert!(db.update(&key(i), &(i + 7000).to_le_bytes()).unwrap());
    }
    assert_eq!(elements(&db), elems, "an in-place update appended");
    assert_eq!(
        db.tree().stats.splits.load(std::sync::atomic::Ordering::Relaxed),
        splits
    );
    for &i in &held {
        assert_eq!(
            db.get(&key(i)).unwrap(),
            Some((i + 7000).to_le_bytes().to_vec()),
            "key {i}"
        );
    }
    // A value of another length cannot live in the entry: it is appended.
    db.put(&key(held[0]), b"short").unwrap();
    assert_eq!(elements(&db), elems + 1);
    assert_eq!(db.get(&key(held[0])).unwrap(), Some(b"short".to_vec()));

    // With a snapshot live, updates append, and the snapshot keeps its values.
    let snap = db.begin().unwrap();
    let before = elements(&db);
    for &i in &held[1..11] {
        db.put(&key(i), &(i + 9000).to_le_bytes()).unwrap();
    }
    assert!(elements(&db) > before, "updates under a snapshot did not append");
    for &i in &held[1..11] {
        assert_eq!(
            snap.get(&key(i)).unwrap(),
            Some((i + 7000).to_le_bytes().to_vec()),
            "snapshot, key {i}"
        );
        assert_eq!(
            db.get(&key(i)).unwrap(),
            Some((i + 9000).to_le_bytes().to_vec()),
            "key {i}"
        );
    }
    drop(snap);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

#[test]
fn a_crash_after_an_in_place_update_recovers_the_new_value() {
    let db = sim_db();
    for i in 0..200u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    for i in 0..200u64 {
        db.put(&key(i), &(i + 100).to_le_bytes()).unwrap();
    }
    // Only what was flushed and fenced: an unfenced in-place store is lost here.
    let image = db.space().persisted_image();
    drop(db);
    let db = Db::open_space(SimSpace::from_image(image), "c".as_ref()).unwrap();
    for i in 0..200u64 {
        assert_eq!(
            db.get(&key(i)).unwrap(),
            Some((i + 100).to_le_bytes().to_vec()),
            "key {i}"
        );
    }
    // The clock restarted from the leaves still orders new writes after old ones.
    db.put(&key(3), &1u64.to_le_bytes()).unwrap();
    assert_eq!(db.get(&key(3)).unwrap(), Some(1u64.to_le_bytes().to_vec()));
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

/// Snapshots taken while another thread updates compact pairs in place
/// read one value per key for as long as they live: a snapshot is never
/// taken in the middle of an in-place update without that update seeing it.
#[test]
fn snapshots_taken_during_in_place_updates_stay_stable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = std::sync::Arc::new(sim_db());
    for i in 0..100u64 {
        db.put(&key(i), &0u64.to_le_bytes()).unwrap();
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut round = 1u64;
            while !stop.load(Ordering::Relaxed) && round < 200_000 {
                for i in 0..100u64 {
                    db.put(&key(i), &round.to_le_bytes()).unwrap();
                }
                round += 1;
            }
        });
        for _ in 0..300 {
            let snap = db.begin().unwrap();
            let first: Vec<_> = (0..100u64).map(|i| snap.get(&key(i)).unwrap()).collect();
            std::thread::yield_now();
            let again: Vec<_> = (0..100u64).map(|i| snap.get(&key(i)).unwrap()).collect();
            assert_eq!(first, again, "a snapshot's values changed under it");
        }
        stop.store(true, Ordering::Relaxed);
    });
}

/// Format 4: a leaf built with a compact prefix takes appends into the bytes
/// the prefix saves, beyond the count a leaf without one holds, and a crash
/// image of such leaves recovers every acknowledged write.
#[test]
fn a_compact_prefix_makes_room_for_more_appends_and_they_survive_a_crash() {
    use nvstore::format::leaf_nv::{capacity, capacity_at};
    let db = sim_db();
    let mut model = BTreeMap::new();
    for i in 0..300u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    let size = small_nodes().node_size as u64;
    let ls = layouts(&db);
    for (l, n) in &ls {
        assert!(*n <= capacity_at(size, l.compact), "{n} elements, prefix {}", l.compact);
    }
    let dense = ls.iter().filter(|(_, n)| *n > capacity(size)).count();
    assert!(
        dense > 0,
        "no leaf of {} took more than {} elements",
        ls.len(),
        capacity(size)
    );

    let image = db.space().persisted_image();
    drop(db);
    let db = Db::open_space(SimSpace::from_image(image), "c".as_ref()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Rebuild);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    assert!(layouts(&db).iter().any(|(_, n)| *n > capacity(size)));
    let all: BTreeMap<Vec<u8>, Vec<u8>> = db.iter().collect();
    assert_eq!(all, model);
    // Full dense leaves split as before.
    for i in 300..400u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    let all: BTreeMap<Vec<u8>, Vec<u8>> = db.iter().collect();
    assert_eq!(all, model);
}

/// Format 5: a delete while no snapshot lives marks every element of its
/// key gone in the leaf's header line (one flush, one fence), appends
/// nothing and rewrites no leaf; with a snapshot live it appends a NEGATIVE
/// element and the snapshot keeps the key. A crash image recovers every
/// delete, and deleted keys can be written again.
#[test]
fn deletes_mark_elements_gone_in_place_unless_a_snapshot_lives() {
    use nvstore::pmem::ThreadCounters;
    use std::sync::atomic::Ordering::Relaxed;
    let db = sim_db();
    let mut model = BTreeMap::new();
    for i in 0..300u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    // Some keys get a second, appended version (a value of another length).
    for i in (0..300u64).step_by(7) {
        db.put(&key(i), b"v2").unwrap();
        model.insert(key(i).to_vec(), b"v2".to_vec());
    }
    let (elems, splits) = (elements(&db), db.tree().stats.splits.load(Relaxed));
    for i in (0..300u64).filter(|i| i % 3 == 0) {
        let before = ThreadCounters::get();
        assert!(db.delete(&key(i)).unwrap(), "key {i}");
        let d = ThreadCounters::get().since(before);
        assert_eq!((d.flushes, d.fences), (1, 1), "delete of key {i}");
        assert!(!db.delete(&key(i)).unwrap(), "key {i} deleted twice");
        model.remove(key(i).as_slice());
    }
    assert_eq!(elements(&db), elems, "a delete in place appended");
    assert_eq!(db.tree().stats.splits.load(Relaxed), splits);
    assert!(layouts(&db).iter().any(|(l, _)| l.gone != [0, 0]));
    for i in 0..300u64 {
        assert_eq!(
            db.get(&key(i)).unwrap(),
            model.get(key(i).as_slice()).cloned(),
            "key {i}"
        );
    }
    assert_eq!(db.iter().collect::<BTreeMap<_, _>>(), model);

    // With a snapshot live, deletes append, and the snapshot keeps the keys.
    let gone_bits = |db: &Db<SimSpace>| -> u32 {
        layouts(db)
            .iter()
            .map(|(l, _)| l.gone[0].count_ones() + l.gone[1].count_ones())
            .sum()
    };
    let (bits, splits) = (gone_bits(&db), db.tree().stats.splits.load(Relaxed));
    let snap = db.begin().unwrap();
    let doomed: Vec<u64> = (0..300u64).filter(|i| i % 3 == 1).take(10).collect();
    for &i in &doomed {
        let before = elements(&db);
        assert!(db.delete(&key(i)).unwrap());
        assert!(
            elements(&db) > before || db.tree().stats.splits.load(Relaxed) > splits,
            "a delete under a snapshot appended nothing"
        );
        model.remove(key(i).as_slice());
    }
    // Rewrites drop bits; a delete under a snapshot sets none.
    assert!(gone_bits(&db) <= bits);
    for &i in &doomed {
        assert!(snap.get(&key(i)).unwrap().is_some(), "snapshot, key {i}");
        assert_eq!(db.get(&key(i)).unwrap(), None, "key {i}");
    }
    drop(snap);
    // Deleted keys come back when written again.
    for i in (0..300u64).filter(|i| i % 6 == 0) {
        db.put(&key(i), b"again").unwrap();
        model.insert(key(i).to_vec(), b"again".to_vec());
    }
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);

    // Only what was flushed and fenced survives: every delete did.
    let image = db.space().persisted_image();
    drop(db);
    let db = Db::open_space(SimSpace::from_image(image), "c".as_ref()).unwrap();
    assert_eq!(db.iter().collect::<BTreeMap<_, _>>(), model);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    // Rewrites drop the gone elements: writing on splits the leaves again.
    for i in 300..600u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
        model.insert(key(i).to_vec(), i.to_le_bytes().to_vec());
    }
    for i in (0..600u64).filter(|i| i % 5 == 0) {
        db.delete(&key(i)).unwrap();
        model.remove(key(i).as_slice());
    }
    assert_eq!(db.iter().collect::<BTreeMap<_, _>>(), model);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

/// A key whose elements straddle the two words of deletion bits, or lie
/// past them, cannot be hidden by one store: its delete appends a NEGATIVE
/// element instead, and the key stays deleted across a crash.
#[test]
fn a_delete_whose_elements_straddle_the_bit_words_appends() {
    let opts = Options {
        node_size: 8192,
        ..small_nodes()
    };
    let db = Db::create_in(SimSpace::new(4 << 20), "c".as_ref(), &opts).unwrap();
    // One leaf, no rewrite: element i is the i-th write.
    db.put(&key(0), b"a").unwrap();
    for i in 1..140u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    db.put(&key(0), b"b").unwrap(); // element 140: key 0 now spans both sides
    assert_eq!(db.tree().stats.splits.load(std::sync::atomic::Ordering::Relaxed), 0);
    let before = elements(&db);
    assert!(db.delete(&key(0)).unwrap()); // elements 0 and 140
    assert!(db.delete(&key(135)).unwrap()); // element 135: past the bits
    assert_eq!(elements(&db), before + 2, "deletes that cannot go in place append");
    assert!(db.delete(&key(5)).unwrap()); // element 5: in place
    assert_eq!(elements(&db), before + 2);
    for k in [0, 135, 5] {
        assert_eq!(db.get(&key(k)).unwrap(), None, "key {k}");
    }
    let image = db.space().persisted_image();
    drop(db);
    let db = Db::open_space(SimSpace::from_image(image), "c".as_ref()).unwrap();
    for k in [0, 135, 5] {
        assert_eq!(db.get(&key(k)).unwrap(), None, "key {k}");
    }
    assert_eq!(db.iter().count(), 137);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

/// A one-key read-modify-write that deletes (`Db::write_one`, the server's
/// DEL) deletes in place as a plain delete does.
#[test]
fn a_one_key_write_deletes_in_place() {
    use nvstore::pmem::ThreadCounters;
    use nvstore::txn::OneWrite;
    let db = sim_db();
    for i in 0..200u64 {
        db.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    let elems = elements(&db);
    for i in (0..200u64).step_by(3) {
        let before = ThreadCounters::get();
        let seen = db
            .write_one(&key(i), |v| (OneWrite::Delete, v.map(|v| v.to_vec())))
            .unwrap();
        let d = ThreadCounters::get().since(before);
        assert_eq!(seen, Some(i.to_le_bytes().to_vec()), "key {i}");
        assert_eq!((d.flushes, d.fences), (1, 1), "delete of key {i}");
        assert_eq!(db.get(&key(i)).unwrap(), None, "key {i}");
    }
    assert_eq!(elements(&db), elems, "a one-key delete appended");
    assert_eq!(db.iter().count(), 200 - 67);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}
