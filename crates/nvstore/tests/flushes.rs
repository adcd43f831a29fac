//! Deterministic flush and fence counts per operation (seed 000 Alg. 2:
//! element flushed and fenced, then the count stored, flushed and fenced).

use nvstore::pmem::{SimSpace, ThreadCounters};
use nvstore::{Db, Options};

#[test]
fn common_insert_flushes_two_lines_and_fences_twice() {
    let db = Db::create_in(
        SimSpace::new(4 << 20),
        "f".as_ref(),
        &Options {
            node_size: 4096,
            ..Options::default()
        },
    )
    .unwrap();
    // 8-byte keys and values: no blob, no split for the first 100 inserts (capacity 126).
    for i in 0..100u64 {
        let before = ThreadCounters::get();
        db.put(&(i * 7919).to_be_bytes(), &i.to_le_bytes()).unwrap();
        let d = ThreadCounters::get().since(before);
        assert_eq!((d.flushes, d.fences), (2, 2), "insert {i}");
    }
    // Update: NEGATIVE + new element (64 bytes: one line, or two when they straddle a line), then the count.
    let before = ThreadCounters::get();
    db.put(&0u64.to_be_bytes(), b"new").unwrap();
    let d = ThreadCounters::get().since(before);
    assert!(d.flushes == 2 || d.flushes == 3, "update flushed {} lines", d.flushes);
    assert_eq!(d.fences, 2);
    // Delete: one NEGATIVE element.
    let before = ThreadCounters::get();
    assert!(db.delete(&7919u64.to_be_bytes()).unwrap());
    let d = ThreadCounters::get().since(before);
    assert_eq!((d.flushes, d.fences), (2, 2));
    // Deleting an absent key writes nothing.
    let before = ThreadCounters::get();
    assert!(!db.delete(b"absent").unwrap());
    let d = ThreadCounters::get().since(before);
    assert_eq!((d.flushes, d.fences), (0, 0));
    // Reads never flush.
    let before = ThreadCounters::get();
    let _ = db.get(&0u64.to_be_bytes()).unwrap();
    let _: Vec<_> = db.iter().collect();
    assert_eq!(ThreadCounters::get().since(before).flushes, 0);
}

#[test]
fn random_inserts_amortise_splits() {
    // 4 KB leaves: 2 flushes per insert plus the amortised cost of copying
    // leaves on splits (32-byte elements: about one line per insert).
    let db = Db::create_in(
        SimSpace::new(8 << 20),
        "f".as_ref(),
        &Options {
            node_size: 4096,
            ..Options::default()
        },
    )
    .unwrap();
    let n = 20_000u64;
    let before = ThreadCounters::get();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        db.put(&x.to_be_bytes(), &x.to_le_bytes()).unwrap();
    }
    let d = ThreadCounters::get().since(before);
    let per = d.flushes as f64 / n as f64;
    eprintln!(
        "flushes per random insert with 4 KB leaves: {per:.3}; fences {:.3}",
        d.fences as f64 / n as f64
    );
    assert!(per > 2.0 && per < 3.3, "{per}");
}
