//! Tests of the ordered index: against `BTreeMap`, invariants after every
//! change, ranges under a concurrent writer, rebuild from the table.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;

fn bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(Vec::as_slice)
}

/// BTreeMap panics on an empty or inverted range; the index yields nothing.
fn model_range(m: &BTreeMap<Vec<u8>, u32>, lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> Vec<(Vec<u8>, u32)> {
    m.iter()
        .filter(|(k, _)| {
            let above = match lo {
                Bound::Included(l) => *k >= l,
                Bound::Excluded(l) => *k > l,
                Bound::Unbounded => true,
            };
            let below = match hi {
                Bound::Included(h) => *k <= h,
                Bound::Excluded(h) => *k < h,
                Bound::Unbounded => true,
            };
            above && below
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    // A small alphabet, so keys collide, share prefixes and include 0xff;
    // some start with the same 8 bytes and differ only past a key's head
    // (`Key::head`), some end inside it with zeros, and some are longer
    // than a node keeps inline (`INLINE`).
    let short = proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(0xfe), Just(0xff)], 0..4);
    (0..3u8, short).prop_map(|(long, k)| match long {
        0 => k,
        1 => [&[1, 0, 0, 0, 0, 0, 0, 0][..], &k].concat(),
        _ => [&[1u8; INLINE - 1][..], &k].concat(),
    })
}

/// Keys that end inside a head, share a head, or run past what a node
/// keeps inline (`long` is `INLINE + 3` bytes).
fn tricky_keys(long: &[u8]) -> [&[u8]; 13] {
    [
        &long[..INLINE],
        long,
        b"",
        b"\0",
        b"a",
        b"a\0",
        b"a\0\0\0\0\0\0\0",
        b"a\0\0\0\0\0\0\0\0",
        b"a\0\0\0\0\0\0\0\x01",
        b"abcdefgh",
        b"abcdefghi",
        b"abcdefghj",
        b"abcdefgi",
    ]
}

#[test]
fn inline_heads_order_keys_as_their_bytes() {
    let long = [7u8; INLINE + 3];
    for a in tricky_keys(&long) {
        for b in tricky_keys(&long) {
            let (ka, kb) = (Key::new(a), Key::new(b));
            assert_eq!(ka.cmp(&kb), a.cmp(b), "{a:?} against {b:?}");
            assert_eq!(ka.cmp_probe(&Probe::new(b)), a.cmp(b), "{a:?} against {b:?}");
            assert_eq!(ka.is(&Probe::new(b)), a == b);
        }
    }
}

#[test]
fn a_descent_by_heads_picks_the_child_a_search_of_whole_keys_picks() {
    let long = [7u8; INLINE + 3];
    let mut keys = tricky_keys(&long).to_vec();
    keys.sort();
    let probes: Vec<Vec<u8>> = keys
        .iter()
        .flat_map(|k| [k.to_vec(), [*k, &[0][..]].concat(), [*k, &[0xff][..]].concat()])
        .chain([Vec::new(), vec![0xff; 9]])
        .collect();
    // Every run of separators, so the tied heads fall at every position.
    for lo in 0..keys.len() {
        for hi in lo..=keys.len() {
            let seps = Seps::from(keys[lo..hi].iter().map(|k| Key::new(k)).collect::<Vec<_>>());
            assert!(seps.in_step());
            for p in &probes {
                let want = keys[lo..hi].partition_point(|s| *s <= &p[..]);
                assert_eq!(child(&seps, &Probe::new(p)), want, "{p:?} among {:?}", &keys[lo..hi]);
            }
        }
    }
}

fn bound_strategy() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        key_strategy().prop_map(Bound::Included),
        key_strategy().prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn matches_btreemap(
        order in 4usize..9,
        leaf in 4usize..13,
        ops in proptest::collection::vec((any::<bool>(), key_strategy(), any::<u32>()), 0..300),
        queries in proptest::collection::vec((bound_strategy(), bound_strategy(), key_strategy()), 1..8),
    ) {
        // Leaves and inner nodes of different sizes, as the engine's.
        let index = Index::with_leaves(order, leaf);
        let mut model = BTreeMap::new();
        for (insert, k, v) in ops {
            if insert && !model.contains_key(&k) && v % 2 == 0 {
                // The engine's path: a key known to be new.
                index.insert_new(&k, v);
                model.insert(k, v);
            } else if insert {
                prop_assert_eq!(index.insert(&k, v), model.insert(k, v));
            } else {
                prop_assert_eq!(index.remove(&k), model.remove(&k));
            }
            index.check().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(index.len(), model.len() as u64);
        for (k, v) in &model {
            prop_assert_eq!(index.get(k), Some(*v));
        }
        for (lo, hi, p) in queries {
            let want = model_range(&model, &lo, &hi);
            let got: Vec<_> = index.range(bound(&lo), bound(&hi)).collect();
            prop_assert_eq!(&got, &want, "range {:?}..{:?}", lo, hi);
            let mut want_rev = want;
            want_rev.reverse();
            let got_rev: Vec<_> = index.range_rev(bound(&lo), bound(&hi)).collect();
            prop_assert_eq!(&got_rev, &want_rev, "range_rev {:?}..{:?}", lo, hi);
            let want_p: Vec<_> = model.iter().filter(|(k, _)| k.starts_with(&p)).map(|(k, v)| (k.clone(), *v)).collect();
            let got_p: Vec<_> = index.prefix(&p).collect();
            prop_assert_eq!(got_p, want_p, "prefix {:?}", p);
        }
    }
}

#[test]
fn grows_and_shrinks_back_to_a_leaf() {
    let index = Index::new(4);
    for i in 0..2000u32 {
        index.insert(&i.to_be_bytes(), i);
    }
    index.check().unwrap();
    assert!(matches!(&*index.root.load_full(), Node::Inner { .. }));
    let all: Vec<u32> = index
        .range(Bound::Unbounded, Bound::Unbounded)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(all, (0..2000).collect::<Vec<_>>());
    for i in (0..2000u32).rev() {
        assert_eq!(index.remove(&i.to_be_bytes()), Some(i));
        if i % 97 == 0 {
            index.check().unwrap();
        }
    }
    index.check().unwrap();
    assert!(index.is_empty());
    assert!(matches!(&*index.root.load_full(), Node::Leaf { .. }));
}

#[test]
fn readers_see_ordered_whole_entries_while_a_writer_works() {
    let index = Arc::new(Index::new(6));
    // Readers check what a range guarantees whatever the writer does:
    // strictly ascending keys, each with its own value.
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<[std::sync::atomic::AtomicU64; 2]> = Arc::default();
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (index, stop, done) = (index.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut scans = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let snap: Vec<(Vec<u8>, u32)> = index.range(Bound::Unbounded, Bound::Unbounded).collect();
                    assert!(snap.windows(2).all(|w| w[0].0 < w[1].0), "range out of order");
                    assert!(
                        snap.iter().all(|(k, v)| k == &v.to_be_bytes()),
                        "value torn from its key"
                    );
                    let rev: Vec<(Vec<u8>, u32)> = index.range_rev(Bound::Unbounded, Bound::Unbounded).collect();
                    assert!(rev.windows(2).all(|w| w[0].0 > w[1].0), "reverse range out of order");
                    scans += 1;
                    done[r].fetch_add(1, Ordering::Relaxed);
                }
                scans
            })
        })
        .collect();
    // At least 20 rounds, and on until each reader has scanned a few times
    // while the writer works (bounded: a fast writer may finish 20 rounds
    // before a reader thread starts).
    let t0 = std::time::Instant::now();
    let scanned = || done.iter().all(|n| n.load(Ordering::Relaxed) >= 3);
    let mut round = 0u32;
    while round < 20 || (!scanned() && t0.elapsed().as_secs() < 20) {
        round += 1;
        for i in 0..300u32 {
            let k = (i * 7 + round) % 500;
            if (i + round).is_multiple_of(3) {
                index.remove(&k.to_be_bytes());
            } else {
                index.insert(&k.to_be_bytes(), k);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().expect("reader panicked") > 0);
    }
    index.check().unwrap();
}

/// What a range guarantees under a concurrent writer (leaves are read as
/// they are when entered, so this is weaker than a snapshot): keys in
/// order, each once, and every key present throughout the range, here the
/// even keys, which the writer never removes, while it inserts and removes
/// odd keys around them and so splits, merges and refills the leaves.
#[test]
fn ranges_see_every_key_present_throughout_while_a_writer_works() {
    let index = Arc::new(Index::new(4));
    let stable: Vec<Vec<u8>> = (0..400u32).map(|i| (2 * i).to_be_bytes().to_vec()).collect();
    for k in &stable {
        index.insert(k, 1u32);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (index, stop, stable) = (index.clone(), stop.clone(), stable.clone());
            std::thread::spawn(move || {
                let mut scans = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let lo = stable[(scans as usize * 37 + r) % 100].clone();
                    let keys: Vec<Vec<u8>> = if scans.is_multiple_of(2) {
                        index
                            .range(Bound::Included(&lo), Bound::Unbounded)
                            .map(|(k, _)| k)
                            .collect()
                    } else {
                        let mut v: Vec<Vec<u8>> = index
                            .range_rev(Bound::Included(&lo), Bound::Unbounded)
                            .map(|(k, _)| k)
                            .collect();
                        v.reverse();
                        v
                    };
                    assert!(keys.windows(2).all(|w| w[0] < w[1]), "range out of order or repeated");
                    let evens: Vec<&Vec<u8>> = keys.iter().filter(|k| k[3] % 2 == 0).collect();
                    let want: Vec<&Vec<u8>> = stable.iter().filter(|k| **k >= lo).collect();
                    assert_eq!(evens, want, "a key present throughout the range was missed");
                    scans += 1;
                }
                scans
            })
        })
        .collect();
    for round in 0..30u32 {
        for i in 0..400u32 {
            let k = (2 * ((i * 7 + round) % 400) + 1).to_be_bytes();
            if (i + round).is_multiple_of(3) {
                index.remove(&k);
            } else {
                index.insert(&k, 2);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().expect("reader panicked") > 0);
    }
    index.check().unwrap();
}

/// Inserts of new keys mostly append to their leaf: the leaf a key went
/// into is the one object a later range reads it from, and nodes on the
/// path are only copied at splits.
#[test]
fn inserts_append_in_place_until_a_split() {
    let index = Index::new(8);
    for i in 0..4u32 {
        index.insert(&[i as u8 * 2], i);
    }
    let before = index.root.load_full();
    // Room in the root leaf: the same leaf object takes the key.
    index.insert(&[3], 9);
    assert!(Arc::ptr_eq(&before, &index.root.load_full()));
    let Node::Leaf(leaf) = &*before else {
        panic!("a root leaf")
    };
    assert_eq!((leaf.sorted, leaf.len()), (0, 5));
    let got: Vec<(Vec<u8>, u32)> = index.range(Bound::Unbounded, Bound::Unbounded).collect();
    assert_eq!(
        got,
        vec![(vec![0], 0), (vec![2], 1), (vec![3], 9), (vec![4], 2), (vec![6], 3)]
    );
    // Replacing a value copies the leaf; the old one keeps the old value.
    assert_eq!(index.insert(&[3], 10), Some(9));
    assert!(!Arc::ptr_eq(&before, &index.root.load_full()));
    assert_eq!(leaf.entry(leaf.find(&Probe::new(&[3])).unwrap()).1, 9);
    assert_eq!(index.get(&[3]), Some(10));
    index.check().unwrap();
}

#[test]
fn removals_mark_in_place_until_a_node_reaches_its_minimum() {
    let index = Index::new(8);
    for i in 0..8u32 {
        index.insert_new(&[i as u8 * 2], i);
    }
    // The root leaf, full: removing marks slots dead, the same leaf stays.
    let before = index.root.load_full();
    assert_eq!(index.remove(&[4]), Some(2));
    assert_eq!(index.remove(&[5]), None);
    assert!(Arc::ptr_eq(&before, &index.root.load_full()));
    let Node::Leaf(leaf) = &*before else {
        panic!("a root leaf")
    };
    assert_eq!((leaf.len(), leaf.live()), (8, 7));
    assert_eq!(index.get(&[4]), None);
    index.check().unwrap();
    // Inserted again while every slot is used: the leaf is copied, which
    // drops the dead entry, and then takes the key.
    index.insert_new(&[4], 20);
    let after = index.root.load_full();
    assert!(!Arc::ptr_eq(&before, &after));
    let Node::Leaf(copy) = &*after else {
        panic!("still a root leaf")
    };
    assert_eq!((copy.len(), copy.live()), (8, 8));
    assert_eq!(index.get(&[4]), Some(20));
    index.check().unwrap();

    // Below the root: in place while the leaf is above its minimum, by a
    // copy of the path once it is at it.
    let index = Index::new(8);
    for i in 0..40u32 {
        index.insert_new(&i.to_be_bytes(), i);
    }
    let mut model: BTreeMap<Vec<u8>, u32> = (0..40u32).map(|i| (i.to_be_bytes().to_vec(), i)).collect();
    let (mut in_place, mut copied) = (0, 0);
    let mut rng = 7u64;
    for _ in 0..400 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let k = ((rng >> 33) % 48) as u32;
        let key = k.to_be_bytes();
        let root = index.root.load_full();
        if (rng >> 20).is_multiple_of(3) {
            if !model.contains_key(&key[..]) {
                index.insert_new(&key, k);
                model.insert(key.to_vec(), k);
            }
        } else {
            let want = model.remove(&key[..]);
            assert_eq!(index.remove(&key), want);
            if want.is_some() {
                if Arc::ptr_eq(&root, &index.root.load_full()) {
                    in_place += 1;
                } else {
                    copied += 1;
                }
            }
        }
        index.check().unwrap();
        let got: Vec<(Vec<u8>, u32)> = index.range(Bound::Unbounded, Bound::Unbounded).collect();
        let want: Vec<(Vec<u8>, u32)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(got, want);
        let mut rev: Vec<(Vec<u8>, u32)> = index.range_rev(Bound::Unbounded, Bound::Unbounded).collect();
        rev.reverse();
        assert_eq!(rev, want);
    }
    assert!(in_place > 20 && copied > 5, "{in_place} in place, {copied} copied");
}

/// Deep trees of small nodes under random inserts and removals: borrows
/// that move several entries or children at once keep every invariant.
#[test]
fn random_removals_keep_a_deep_tree_balanced() {
    for (order, leaf) in [(4, 4), (5, 6), (8, 16)] {
        let index = Index::with_leaves(order, leaf);
        let mut model = BTreeMap::new();
        let mut rng = order as u64;
        for step in 0..6000u32 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k = ((rng >> 33) % 1500) as u32;
            let key = k.to_be_bytes();
            // Grow for a while, then mostly shrink, then grow again.
            let insert_pct = match step {
                0..2000 => 80,
                2000..4500 => 25,
                _ => 60,
            };
            if (rng >> 16) % 100 < insert_pct {
                assert_eq!(index.insert(&key, step), model.insert(key.to_vec(), step));
            } else {
                assert_eq!(index.remove(&key), model.remove(&key[..]));
            }
            if step % 50 == 0 {
                index
                    .check()
                    .unwrap_or_else(|e| panic!("order {order} leaf {leaf} step {step}: {e}"));
                let got: Vec<(Vec<u8>, u32)> = index.range(Bound::Unbounded, Bound::Unbounded).collect();
                let want: Vec<(Vec<u8>, u32)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
                assert_eq!(got, want, "order {order} leaf {leaf} step {step}");
            }
        }
        index.check().unwrap();
        assert_eq!(index.len(), model.len() as u64);
    }
}

#[test]
fn rebuilds_from_the_hash_table() {
    use crate::alloc::Allocator;
    use crate::format::header;
    use crate::pmem::{SimSpace, LINE};
    let size = 4096 + 16 * 16384;
    let space = Arc::new(SimSpace::new(size));
    space.store(header::pool_size_word(), size);
    let alloc = Arc::new(Allocator::fresh(16384, 4096, size));
    let table = HashTable::create(space, alloc, 2 * LINE).unwrap();
    let mut model = BTreeMap::new();
    for i in 0..700u32 {
        let k = format!("user/{:04}", (i * 37) % 1000).into_bytes();
        table.put(&k, &i.to_le_bytes()).unwrap();
        model.insert(k, i);
    }
    let index = Index::rebuild(&table, 16, 24, |_, v| u32::from_le_bytes(v.try_into().unwrap()));
    index.check().unwrap();
    let got: Vec<_> = index.range(Bound::Unbounded, Bound::Unbounded).collect();
    let want_prefix = model.keys().filter(|k| k.starts_with(b"user/01")).count();
    assert!(want_prefix > 0);
    assert_eq!(index.prefix(b"user/01").count(), want_prefix);
    assert_eq!(got, model.into_iter().collect::<Vec<_>>());
}

/// A bottom-up load keeps every node within its bounds at any size, and
/// the loaded index then takes inserts and removes like any other.
#[test]
fn loads_sorted_keys_bottom_up() {
    for n in [
        0usize, 1, 5, 31, 32, 33, 47, 48, 49, 63, 64, 65, 95, 96, 97, 127, 128, 129, 100, 1000, 3001, 20_000,
    ] {
        let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("{:08}", i * 2).into_bytes()).collect();
        let idx: Index<u32> = Index::from_sorted(ORDER, LEAF, keys.iter().cloned().zip(0u32..));
        idx.check().unwrap_or_else(|e| panic!("n = {n}: {e}"));
        assert_eq!(idx.len(), n as u64);
        let got: Vec<Vec<u8>> = idx.range(Bound::Unbounded, Bound::Unbounded).map(|(k, _)| k).collect();
        assert_eq!(got, keys, "n = {n}");
        let mut m: BTreeMap<Vec<u8>, u32> = keys.iter().cloned().zip(0u32..).collect();
        for i in 0..n.min(500) {
            let odd = format!("{:08}", i * 2 + 1).into_bytes();
            idx.insert(&odd, 7);
            m.insert(odd, 7);
            let even = format!("{:08}", i * 4).into_bytes();
            assert_eq!(idx.remove(&even), m.remove(&even), "n = {n}");
        }
        idx.check().unwrap_or_else(|e| panic!("n = {n} after updates: {e}"));
        let got: Vec<(Vec<u8>, u32)> = idx.range(Bound::Unbounded, Bound::Unbounded).collect();
        assert_eq!(got, m.into_iter().collect::<Vec<_>>(), "n = {n}");
    }
}

/// A value that counts its live copies in `live`.
struct Counted(Arc<std::sync::atomic::AtomicIsize>);

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counted(self.0.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let was = self.0.fetch_sub(1, Ordering::SeqCst);
        assert!(was > 0, "a value was dropped more often than it was made");
    }
}

#[test]
fn every_entry_is_dropped_once_when_the_index_goes() {
    // Append slots start unset and are dropped by their leaf only below
    // its length: every value made is dropped exactly once, through
    // appends, splits, replacements, dead marks, merges and the drop of
    // the whole tree. Keys short and long (inline and shared).
    let live = Arc::new(std::sync::atomic::AtomicIsize::new(0));
    let value = || {
        live.fetch_add(1, Ordering::SeqCst);
        Counted(live.clone())
    };
    let key = |i: u32| {
        let mut k = format!("{:08}", (i * 7919) % 1000).into_bytes();
        if i.is_multiple_of(3) {
            k.extend_from_slice(&[b'x'; 60]);
        }
        k
    };
    let index = Index::with_leaves(4, 8);
    for i in 0..1000 {
        index.insert_new(&key(i), value());
    }
    for i in (0..1000).step_by(3) {
        assert!(index.insert(&key(i), value()).is_some());
    }
    for i in (0..1000).step_by(2) {
        assert!(index.remove(&key(i)).is_some());
    }
    index.check().unwrap();
    assert!(live.load(Ordering::SeqCst) >= index.len() as isize);
    drop(index);
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "every value is dropped when the index goes"
    );
}
