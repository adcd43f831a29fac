use super::*;
use crate::format::header::{EngineKind, Header, LeafKind, VERSION};
use crate::pmem::SimSpace;
use rand::{Rng, SeedableRng};

const CHUNK: u64 = 64 * 1024;

fn pool(chunks: u64) -> (SimSpace, Allocator) {
    let size = CHUNK * (1 + chunks);
    let s = SimSpace::new(size);
    Header {
        version: VERSION,
        flags: 0,
        uuid: [1; 16],
        engine: EngineKind::Tree,
        leaf_format: LeafKind::Nv,
        node_size: 1024,
        chunk_size: CHUNK,
        data_start: CHUNK,
    }
    .create(&s, size);
    let a = Allocator::fresh(CHUNK, CHUNK, size);
    (s, a)
}

#[test]
fn classes_are_multiples_of_a_line_up_to_64k() {
    let c = classes();
    assert_eq!(c[0], 64);
    assert_eq!(*c.last().unwrap(), MAX_CLASS);
    assert!(c.windows(2).all(|w| w[0] < w[1]));
    assert!(c.iter().all(|s| s % 64 == 0));
    assert_eq!(classes()[class_index(65)], 128);
    assert_eq!(classes()[class_index(4096)], 4096);
}

#[test]
fn model_alloc_free_rebuild() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (s, a) = pool(4);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for step in 0..5000 {
        if live.is_empty() || rng.gen_bool(0.6) {
            let size = match rng.gen_range(0..10) {
                0 => rng.gen_range(MAX_CLASS + 1..4 * MAX_CLASS),
                1..=3 => rng.gen_range(1..MAX_CLASS),
                _ => rng.gen_range(1..2048),
            };
            let off = a.alloc(&s, size).unwrap();
            assert!(a.block_size(off) >= size);
            assert_eq!(off % 64, 0);
            // No overlap with any live block.
            if let Some((&p, &ps)) = live.range(..=off).next_back() {
                assert!(p + ps <= off, "step {step}: block {off} overlaps {p}+{ps}");
            }
            if let Some((&n, _)) = live.range(off..).next() {
                assert!(off + size <= n, "step {step}: block {off}+{size} overlaps {n}");
            }
            live.insert(off, size);
        } else {
            let k = *live.keys().nth(rng.gen_range(0..live.len())).unwrap();
            live.remove(&k);
            a.free(k);
        }
    }
    let reachable: BTreeSet<u64> = live.keys().copied().collect();
    assert_eq!(a.verify(&s, &reachable), Problems::new());

    // Saved and loaded free lists describe the same state.
    let saved = a.save();
    let c = Allocator::load(&s, CHUNK, CHUNK, &saved).unwrap();
    assert_eq!(c.verify(&s, &reachable), Problems::new());

    // Rebuild from reachability: exactly the unreached blocks become free.
    let b = Allocator::rebuild(&s, CHUNK, CHUNK, &reachable).unwrap();
    assert_eq!(b.verify(&s, &reachable), Problems::new());
    // Allocating everything the rebuilt allocator has never returns a live block.
    for _ in 0..2000 {
        let off = b.alloc(&s, 100).unwrap();
        assert!(
            !reachable.contains(&off),
            "rebuilt allocator handed out live block {off}"
        );
    }
}

#[test]
fn verify_catches_leak_and_double_use() {
    let (s, a) = pool(2);
    let x = a.alloc(&s, 64).unwrap();
    let y = a.alloc(&s, 64).unwrap();
    let mut reachable = BTreeSet::from([x]);
    // y allocated but not reachable: a leak.
    assert!(a.verify(&s, &reachable).iter().any(|p| p.contains("leak")));
    a.free(y);
    assert_eq!(a.verify(&s, &reachable), Problems::new());
    reachable.insert(y);
    assert!(a.verify(&s, &reachable).iter().any(|p| p.contains("double use")));
}

#[test]
fn growth_keeps_offsets_and_publishes_size() {
    let (s, a) = pool(1);
    let first = a.alloc(&s, 64).unwrap();
    s.write(first, b"still here");
    let before = header::pool_size(&s);
    let big = a.alloc(&s, 10 * CHUNK).unwrap();
    assert!(header::pool_size(&s) > before);
    let mut buf = [0u8; 10];
    s.read(first, &mut buf);
    assert_eq!(&buf, b"still here");
    assert!(big + 10 * CHUNK <= header::pool_size(&s));
}

#[test]
fn rebuild_frees_empty_slabs_and_rejects_bad_references() {
    let (s, a) = pool(4);
    let x = a.alloc(&s, 256).unwrap();
    let _y = a.alloc(&s, 256).unwrap();
    let b = Allocator::rebuild(&s, CHUNK, CHUNK, &BTreeSet::new()).unwrap();
    assert_eq!(b.used_bytes(), 0);
    let err = Allocator::rebuild(&s, CHUNK, CHUNK, &BTreeSet::from([x + 8]));
    assert!(matches!(err, Err(Error::Corrupt { .. })));
}
