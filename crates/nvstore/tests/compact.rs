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
    // Update and delete keys held compact: NEGATIVE + new elements follow them.
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
