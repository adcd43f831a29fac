//! Each engine's characteristic flush and fence counts per operation,
//! deterministic on the crash simulator's space (ThreadCounters deltas).

use std::path::Path;

use nvstore::pmem::{Counters, SimSpace, ThreadCounters};
use nvstore_bench::registry::{engine_in, EngineConfig};
use nvstore_bench::BenchIndex;

fn engine(name: &str, node_size: u64) -> Box<dyn BenchIndex> {
    engine_in(
        name,
        SimSpace::new(1 << 20),
        Path::new("sim"),
        &EngineConfig::new(node_size),
    )
    .unwrap()
}

fn cost(f: impl FnOnce()) -> (u64, u64) {
    let before = ThreadCounters::get();
    f();
    let d: Counters = ThreadCounters::get().since(before);
    (d.flushes, d.fences)
}

/// Scattered keys (no split for the first few dozen in a fresh tree).
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[test]
fn volatile_never_flushes() {
    let e = engine("volatile", 1024);
    for i in 0..1000 {
        assert_eq!(cost(|| e.insert(key(i), i + 1)), (0, 0));
    }
    assert_eq!(cost(|| assert!(e.update(key(3), 9))), (0, 0));
    assert_eq!(cost(|| assert!(e.delete(key(3)))), (0, 0));
}

#[test]
fn tree_insert_is_one_line_one_fence() {
    let e = engine("tree", 4096);
    for i in 0..100 {
        assert_eq!(cost(|| e.insert(key(i), i + 1)), (1, 1), "insert {i}");
    }
    assert_eq!(e.stats().splits, 0);
    assert_eq!(cost(|| assert!(e.delete(key(5)))), (1, 1));
    assert_eq!(cost(|| assert!(e.search(key(6)).is_some())), (0, 0));
}

#[test]
fn fptree_insert_flushes_pair_fingerprint_and_bitmap() {
    for ns in [1024, 4096] {
        let e = engine("fptree", ns);
        // 1 KB leaves hold 56 pairs; 4 KB leaves 236.
        for i in 0..50 {
            assert_eq!(cost(|| e.insert(key(i), i + 1)), (3, 2), "{ns}: insert {i}");
        }
        assert_eq!(e.stats().splits, 0);
        // Update: new pair + fingerprint, then one bitmap store flipping both bits.
        assert_eq!(cost(|| assert!(e.update(key(7), 99))), (3, 2));
        // Delete: one bitmap store.
        assert_eq!(cost(|| assert!(e.delete(key(8)))), (1, 1));
        assert_eq!(cost(|| assert_eq!(e.search(key(7)), Some(99))), (0, 0));
    }
}

#[test]
fn wbtree_insert_flushes_bitmap_entry_slots_bitmap() {
    let e = engine("wbtree", 1024);
    // 1 KB nodes: 56 slots, a one-word bitmap, a one-line slot array.
    for i in 0..50 {
        assert_eq!(cost(|| e.insert(key(i), i + 1)), (4, 3), "insert {i}");
    }
    assert_eq!(e.stats().splits, 0);
    assert_eq!(cost(|| assert!(e.update(key(7), 99))), (4, 3));
    assert_eq!(cost(|| assert!(e.delete(key(8)))), (3, 3));
    assert_eq!(cost(|| assert_eq!(e.search(key(7)), Some(99))), (0, 0));

    // 4 KB nodes: a 4-line slot array and a 4-word bitmap cost more lines.
    let e = engine("wbtree", 4096);
    for i in 0..200 {
        let (f, n) = cost(|| e.insert(key(i), i + 1));
        assert!((4..=9).contains(&f), "insert {i}: {f} flushes");
        assert!((3..=4).contains(&n), "insert {i}: {n} fences");
    }
    assert_eq!(e.stats().splits, 0);
}

/// FAST: one flush (and fence) per cache line the shift crosses.
#[test]
fn fastfair_flushes_each_line_the_shift_crosses() {
    let e = engine("fastfair", 1024);
    // 1 KB nodes: 62 records of 16 bytes after a 32-byte header, at most 61 pairs.
    let n = 40u64;
    for i in 1..=n {
        // Appending shifts nothing: the new record's line only.
        assert_eq!(cost(|| e.insert(i * 10, i)), (1, 1), "append {i}");
    }
    // Inserting the smallest key shifts all n records right: record j+1 is
    // written for j = n-1..0, and its line is flushed when j+1 starts a line,
    // plus the final flush of record 0's line.
    let at_line_start = |j: u64| (32 + 16 * j).is_multiple_of(64);
    let want = (1..=n).filter(|&j| at_line_start(j)).count() as u64 + 1;
    assert_eq!(cost(|| e.insert(5, 1000)), (want, want));
    // In-place update: one line.
    assert_eq!(cost(|| assert!(e.update(5, 77))), (1, 1));
    // Deleting the smallest shifts n records left, flushing a line when the
    // shift leaves it and at the end.
    let cnt = n + 1;
    let want = (0..cnt - 1).filter(|&j| j == cnt - 2 || at_line_start(j + 1)).count() as u64;
    assert_eq!(cost(|| assert!(e.delete(5))), (want, want));
    assert_eq!(e.stats().splits, 0);

    // Random inserts into 4 KB nodes: between 1 line and the whole node.
    let e = engine("fastfair", 4096);
    let mut total = 0;
    for i in 0..250 {
        let (f, n) = cost(|| e.insert(key(i), i + 1));
        assert!((1..=64).contains(&f) && f == n, "insert {i}: {f} flushes, {n} fences");
        total += f;
    }
    assert_eq!(e.stats().splits, 0);
    // On average the shift moves about half the records: far more than one line.
    assert!(total / 250 >= 5, "mean {} lines", total / 250);
}

#[test]
fn searches_and_scans_never_flush() {
    for name in ["tree", "lcb", "cdds", "fptree", "fastfair", "wbtree"] {
        let e = engine(name, 512);
        for i in 0..2000 {
            e.insert(key(i), i + 1);
        }
        let (f, n) = cost(|| {
            for i in 0..2000 {
                assert_eq!(e.search(key(i)), Some(i + 1));
            }
            let mut out = Vec::new();
            e.scan(0, 5000, &mut out);
            assert_eq!(out.len(), 2000);
        });
        assert_eq!((f, n), (0, 0), "{name}");
    }
}

/// LCB+Tree: the used part of the node is logged (one record flush, one
/// count flush), the node's changed lines are flushed, the log is truncated.
#[test]
fn lcb_logs_the_node_before_changing_it() {
    let e = engine("lcb", 1024);
    // 1 KB nodes: 60 entries of 16 bytes after a 64-byte header.
    e.insert(10, 1); // allocates the first log block
    for c in 1..40u64 {
        // Appending entry c: log record = 64-byte record header + the node's
        // 64-byte header + c entries; then the count word; then the node's
        // header line and the new entry's line; then the commit.
        let record_lines = (128 + 16 * c).div_ceil(64);
        assert_eq!(
            cost(|| e.insert(10 * (c + 1), c)),
            (record_lines + 1 + 2 + 1, 4),
            "append {c}"
        );
    }
    // Update in place: the node is logged all the same (paper §6.3).
    let c = 40u64;
    assert_eq!(
        cost(|| assert!(e.update(50, 7))),
        ((128 + 16 * c).div_ceil(64) + 1 + 1 + 1, 4)
    );
    // Inserting the smallest key shifts every entry: all entry lines flushed.
    let (f, n) = cost(|| e.insert(1, 1));
    assert_eq!(n, 4);
    assert_eq!(
        f,
        (128 + 16 * c).div_ceil(64) + 1 + (1 + (16 * (c + 1)).div_ceil(64)) + 1
    );
    assert_eq!(e.stats().splits, 0);
}

/// CDDS-Tree: a delete is one end-version store and the version commit; an
/// insert flushes each shifted entry (two persisted steps each, see cdds.rs).
#[test]
fn cdds_flushes_entries_and_the_version() {
    let e = engine("cdds", 4096);
    for c in 0..40u64 {
        // Append: the entry (beyond the count), the count, the version.
        assert_eq!(cost(|| e.insert(10 * (c + 1), c + 1)), (3, 3), "append {c}");
    }
    let c = 40u64;
    // Smallest key: a full copy of the last entry, the count, two steps per
    // shifted entry, two for the new entry, the version.
    assert_eq!(cost(|| e.insert(1, 1)), (2 * c + 3, 2 * c + 3));
    // Delete: end version + commit.
    assert_eq!(cost(|| assert!(e.delete(200))), (2, 2));
    // Update of the largest key: end the old entry, append the new one.
    assert_eq!(cost(|| assert!(e.update(400, 9))), (4, 4));
    assert_eq!(e.search(400), Some(9));
    assert_eq!(e.search(200), None);
    assert_eq!(e.stats().splits, 0);
}
