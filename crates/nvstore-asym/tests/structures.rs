//! Hash table, skiplist and BST over an in-process back-end: agreement with a
//! model in every mode and after reopen, exact round trips per operation,
//! and exactly-once re-execution after a writer dies.

use std::collections::{BTreeMap, HashMap};

use rand::{Rng, SeedableRng};

use nvstore_asym::structures::hash::{bucket_of, fingerprint, may_hold, summary_of, FPS};
use nvstore_asym::structures::skiplist::{height_of, TALL};
use nvstore_asym::structures::{recover, BpTree, Bst, HashTable, SkipList};
use nvstore_asym::{LocalTransport, Mode, Remote, RemoteOptions};

mod common;
use common::{backend, doomed_writer, opts, val, MODES};

/// The two structures behind one interface, for shared tests.
trait Kv {
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]);
    fn get(&self, r: &mut Remote, k: u64) -> Option<Vec<u8>>;
    fn remove(&mut self, r: &mut Remote, k: u64) -> Option<Vec<u8>>;
    fn items(&self, r: &mut Remote) -> BTreeMap<u64, Vec<u8>>;
    fn len(&self, r: &mut Remote) -> u64;
}

impl Kv for HashTable {
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) {
        HashTable::put(self, r, k, v).unwrap()
    }
    fn get(&self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        HashTable::get(self, r, k).unwrap()
    }
    fn remove(&mut self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        HashTable::remove(self, r, k).unwrap()
    }
    fn items(&self, r: &mut Remote) -> BTreeMap<u64, Vec<u8>> {
        let v = HashTable::items(self, r).unwrap();
        let n = v.len();
        let m: BTreeMap<_, _> = v.into_iter().collect();
        assert_eq!(m.len(), n, "a key appears twice");
        m
    }
    fn len(&self, r: &mut Remote) -> u64 {
        HashTable::len(self, r).unwrap()
    }
}

impl Kv for SkipList {
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) {
        SkipList::put(self, r, k, v).unwrap()
    }
    fn get(&self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        SkipList::get(self, r, k).unwrap()
    }
    fn remove(&mut self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        SkipList::remove(self, r, k).unwrap()
    }
    fn items(&self, r: &mut Remote) -> BTreeMap<u64, Vec<u8>> {
        let v = SkipList::items(self, r).unwrap();
        assert!(v.windows(2).all(|w| w[0].0 < w[1].0), "level 0 is not sorted");
        v.into_iter().collect()
    }
    fn len(&self, r: &mut Remote) -> u64 {
        SkipList::len(self, r).unwrap()
    }
}

impl Kv for Bst {
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) {
        Bst::put(self, r, k, v).unwrap()
    }
    fn get(&self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        Bst::get(self, r, k).unwrap()
    }
    fn remove(&mut self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        Bst::remove(self, r, k).unwrap()
    }
    fn items(&self, r: &mut Remote) -> BTreeMap<u64, Vec<u8>> {
        // The walk checks every key against its ancestors' bounds.
        Bst::items(self, r).unwrap()
    }
    fn len(&self, r: &mut Remote) -> u64 {
        Bst::len(self, r).unwrap()
    }
}

impl Kv for BpTree {
    fn put(&mut self, r: &mut Remote, k: u64, v: &[u8]) {
        BpTree::put(self, r, k, v).unwrap()
    }
    fn get(&self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        BpTree::get(self, r, k).unwrap()
    }
    fn remove(&mut self, r: &mut Remote, k: u64) -> Option<Vec<u8>> {
        BpTree::remove(self, r, k).unwrap()
    }
    fn items(&self, r: &mut Remote) -> BTreeMap<u64, Vec<u8>> {
        BpTree::scan(self, r).unwrap()
    }
    fn len(&self, r: &mut Remote) -> u64 {
        BpTree::len(self, r).unwrap()
    }
}

fn open_bptree(r: &mut Remote) -> BpTree {
    BpTree::open(r, "t").unwrap()
}

fn open_bst(r: &mut Remote) -> Bst {
    Bst::open(r, "b").unwrap()
}

fn open_hash(r: &mut Remote) -> HashTable {
    HashTable::open(r, "h", 64).unwrap()
}

fn open_skip(r: &mut Remote) -> SkipList {
    SkipList::open(r, "s").unwrap()
}

fn agrees_with_a_model<T: Kv>(open: fn(&mut Remote) -> T) {
    for mode in MODES {
        let b = backend();
        let mut r = Remote::open(LocalTransport::new(b.clone()), opts(mode, 16)).unwrap();
        let mut t = open(&mut r);
        let mut model = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for i in 0..1200u64 {
            let k = rng.gen_range(0..400u64);
            match i % 5 {
                0..=2 => {
                    t.put(&mut r, k, &val(i));
                    model.insert(k, val(i));
                }
                3 => assert_eq!(t.remove(&mut r, k), model.remove(&k), "{mode:?} op {i}"),
                _ => assert_eq!(t.get(&mut r, k), model.get(&k).cloned(), "{mode:?} op {i}"),
            }
        }
        assert_eq!(t.items(&mut r), model, "{mode:?}");
        assert_eq!(t.len(&mut r), model.len() as u64, "{mode:?}");
        r.close().unwrap();
        let mut r = Remote::open(LocalTransport::new(b), opts(mode, 16)).unwrap();
        let t = open(&mut r);
        assert_eq!(t.items(&mut r), model, "{mode:?} after reopen");
        assert_eq!(t.len(&mut r), model.len() as u64, "{mode:?} after reopen");
        for k in 0..400u64 {
            assert_eq!(
                t.get(&mut r, k),
                model.get(&k).cloned(),
                "{mode:?} key {k} after reopen"
            );
        }
    }
}

#[test]
fn hash_table_agrees_with_a_model_in_every_mode_and_after_reopen() {
    agrees_with_a_model(open_hash);
}

/// A table written with another bucket layout (an older build's: its count
/// word's top byte 0) is refused with a clear error, not misread.
#[test]
fn a_hash_table_of_another_layout_is_refused() {
    let b = backend();
    let mut r = Remote::open(LocalTransport::new(b.clone()), opts(Mode::Naive, 1)).unwrap();
    let mut t = open_hash(&mut r);
    t.put(&mut r, 7, &val(7)).unwrap();
    assert_eq!(t.len(&mut r).unwrap(), 1);
    let meta = r.name_get("h").unwrap().unwrap();
    r.write(meta + 16, &1u64.to_le_bytes()).unwrap();
    r.flush().unwrap();
    let err = HashTable::open(&mut r, "h", 64)
        .err()
        .expect("an old-layout table opened");
    let msg = err.to_string();
    assert!(msg.contains("bucket layout 1") && msg.contains("recreate"), "{msg}");
    // The current layout still opens, with its count.
    r.write(
        meta + 16,
        &(1u64 | nvstore_asym::structures::hash::LAYOUT << 56).to_le_bytes(),
    )
    .unwrap();
    r.flush().unwrap();
    let t = HashTable::open(&mut r, "h", 64).unwrap();
    assert_eq!(t.len(&mut r).unwrap(), 1);
    assert_eq!(t.get(&mut r, 7).unwrap(), Some(val(7)));
}

#[test]
fn bptree_with_removes_agrees_with_a_model_in_every_mode_and_after_reopen() {
    agrees_with_a_model(open_bptree);
}

#[test]
fn skiplist_agrees_with_a_model_in_every_mode_and_after_reopen() {
    agrees_with_a_model(open_skip);
}

#[test]
fn bst_agrees_with_a_model_in_every_mode_and_after_reopen() {
    agrees_with_a_model(open_bst);
}

/// Round trips of `n` inserts of new keys (mallocs excluded; a malloc that
/// carried its operation's log, in rcb, counts as the log's) and the
/// tx_writes among them.
fn insert_round_trips<T: Kv>(mode: Mode, batch: usize, open: fn(&mut Remote) -> T, keys: &[u64]) -> (u64, u64) {
    let mut r = Remote::open(LocalTransport::new(backend()), opts(mode, batch)).unwrap();
    let mut t = open(&mut r);
    let start = r.counters().clone();
    let allocs = r.alloc_trips();
    for &k in keys {
        t.put(&mut r, k, &val(k));
    }
    let d = r.counters().since(&start);
    let allocs = r.alloc_trips() - allocs;
    (d.round_trips - allocs, d.verbs_of("tx_write"))
}

#[test]
fn hash_table_round_trips_per_insert_are_exact_in_each_mode() {
    // About 9 keys a bucket: chains outgrow their summaries' fingerprints.
    let keys: Vec<u64> = (0..600u64).map(|i| i * 7919 + 3).collect();
    // Chain length each insert walks: keys of its bucket inserted before
    // it, when the bucket's summary cannot rule the new key out (a chain
    // longer than FPS, or a fingerprint equal to one of the chain's).
    let mut per_bucket: HashMap<u64, Vec<u64>> = HashMap::new();
    let (mut walked, mut ruled_out) = (0, 0);
    for &k in &keys {
        let chain = per_bucket.entry(bucket_of(k, 64)).or_default();
        if may_hold(summary_of(chain), k) {
            walked += chain.len() as u64;
        } else if !chain.is_empty() {
            ruled_out += 1;
        }
        let fp_clash = chain.iter().any(|c| fingerprint(*c) == fingerprint(k));
        assert_eq!(
            may_hold(summary_of(chain), k),
            chain.len() > FPS || fp_clash,
            "the summary rules out exactly the keys it can"
        );
        chain.push(k);
    }
    let n = keys.len() as u64;
    assert!(walked > 0, "some chains are walked");
    assert!(ruled_out > 0, "some non-empty chains are skipped by their summary");
    // naive: metadata, bucket, each chain node walked; write node, bucket, count.
    assert_eq!(
        insert_round_trips(Mode::Naive, 1, open_hash, &keys),
        (5 * n + walked, 0)
    );
    // r: the same reads, then one tx_write.
    assert_eq!(insert_round_trips(Mode::R, 1, open_hash, &keys), (3 * n + walked, n));
    // rc: the metadata is cached after the first read, bucket words after theirs,
    // new nodes on creation: one read of each bucket word, once.
    let buckets = per_bucket.len() as u64;
    assert_eq!(insert_round_trips(Mode::Rc, 1, open_hash, &keys), (n + buckets, n));
    // rcb: one operation log each, riding on the read of the bucket word
    // when that misses (its first touch); a tx_write every 10.
    assert_eq!(insert_round_trips(Mode::Rcb, 10, open_hash, &keys), (n, n / 10));
}

/// Tall nodes a skiplist search for `key` reads, given the present
/// `(key, height)` pairs in key order: at each level from the top down to
/// the run level, the nodes of that level after the predecessor, up to the
/// first not below `key` (the levels below are in the run's directory).
fn search_reads(present: &[(u64, usize)], key: u64) -> u64 {
    let mut visited = std::collections::BTreeSet::new();
    let mut pred: Option<usize> = None;
    for l in (TALL - 1..12).rev() {
        let mut from = pred.map_or(0, |p| p + 1);
        while let Some(j) = (from..present.len()).find(|&j| present[j].1 > l) {
            visited.insert(j);
            if present[j].0 < key {
                pred = Some(j);
                from = j + 1;
            } else {
                break;
            }
        }
    }
    visited.len() as u64
}

/// The room of a run directory that must hold `n` entries and one more.
fn dir_room(n: usize) -> usize {
    let mut cap = 8;
    while cap <= n {
        cap *= 2;
    }
    cap
}

#[test]
fn skiplist_round_trips_per_insert_are_exact_in_each_mode() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut keys: Vec<u64> = (1..=300u64).map(|i| i * 13).collect();
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.gen_range(0..=i));
    }
    let n = keys.len() as u64;
    // rc, rcb: the head, its directory and the metadata are cached at
    // creation, new nodes and directories when written.
    assert_eq!(insert_round_trips(Mode::Rc, 1, open_skip, &keys), (n, n));
    assert_eq!(insert_round_trips(Mode::Rcb, 10, open_skip, &keys), (n, n / 10));
    let mut present: Vec<(u64, usize)> = Vec::new();
    // Room of each run directory, by its owner's key (None: the head's).
    let mut room: HashMap<Option<u64>, usize> = HashMap::from([(None, 8)]);
    let (mut expect_r, mut expect_naive, mut grown, mut split) = (0, 0, 0, 0);
    for &k in &keys {
        let reads = 2 + search_reads(&present, k) + 1;
        let h = height_of(k);
        // The run `k` falls in: its owner (the last tall node before `k`)
        // and its entries; `i` of them are below `k`.
        let at = present.partition_point(|p| p.0 < k);
        let owner = present[..at].iter().rposition(|p| p.1 >= TALL);
        let from = owner.map_or(0, |o| o + 1);
        let to = (at..present.len())
            .find(|&j| present[j].1 >= TALL)
            .unwrap_or(present.len());
        let (len, i) = (to - from, at - from);
        let owner_key = owner.map(|o| present[o].0);
        let dir_writes = if h < TALL {
            if len + 1 > room[&owner_key] {
                // A larger directory, and the owner's word pointing to it.
                room.insert(owner_key, dir_room(len + 1));
                grown += 1;
                2
            } else {
                1
            }
        } else {
            // The new node's directory takes the entries past it; the
            // owner's count changes if any moved.
            room.insert(Some(k), dir_room(len - i));
            split += 1;
            1 + u64::from(len > i)
        };
        // r: metadata, head, the tall nodes of the search and the run's
        // directory, then one tx_write.
        expect_r += reads + 1;
        // naive: the same reads, then the node, one link per level, the
        // directories and the count.
        expect_naive += reads + 1 + h as u64 + dir_writes + 1;
        present.insert(at, (k, h));
    }
    assert!(
        grown > 0 && split > 0,
        "some directories grow ({grown}), some runs split ({split})"
    );
    assert!(
        present.iter().any(|p| p.1 > TALL),
        "some nodes are taller than the run level"
    );
    assert_eq!(insert_round_trips(Mode::R, 1, open_skip, &keys), (expect_r, n));
    assert_eq!(insert_round_trips(Mode::Naive, 1, open_skip, &keys), (expect_naive, 0));
}

/// A writer whose cache holds the skiplist's tall nodes and none of its
/// run directories or short nodes: every put (new key or update, short
/// or tall) costs exactly one round trip in rcb, its operation log riding
/// on the read of the run's directory when that misses (AsymNVM §4.3,
/// §8.4), and a tx_write every `batch` operations rides along too.
#[test]
fn skiplist_puts_cost_one_round_trip_with_the_tall_nodes_cached() {
    let b = backend();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut r = Remote::open(LocalTransport::new(b.clone()), opts(Mode::Rcb, 10)).unwrap();
    let mut t = open_skip(&mut r);
    let mut model = BTreeMap::new();
    for _ in 0..2000 {
        let k = rng.gen_range(0..1_000_000u64);
        t.put(&mut r, k, &val(k)).unwrap();
        model.insert(k, val(k));
    }
    r.close().unwrap();
    let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 10)).unwrap();
    let mut t = open_skip(&mut r);
    // Warm: a get of each tall key walks tall nodes only.
    let tall: Vec<u64> = model.keys().copied().filter(|k| height_of(*k) >= TALL).collect();
    assert!(tall.len() > 50, "{} tall nodes", tall.len());
    for &k in &tall {
        assert_eq!(t.get(&mut r, k).unwrap(), Some(val(k)));
    }
    let cached = r.cache().len();
    assert_eq!(cached, 2 + tall.len(), "metadata, head and the tall nodes only");
    let (start, allocs) = (r.counters().clone(), r.alloc_trips());
    let existing: Vec<u64> = model.keys().copied().step_by(7).collect();
    let mut ops = 0u64;
    for (j, &old) in existing.iter().enumerate() {
        // An update, then a new key.
        t.put(&mut r, old, &val(j as u64)).unwrap();
        model.insert(old, val(j as u64));
        let k = loop {
            let k = rng.gen_range(0..1_000_000u64);
            if !model.contains_key(&k) {
                break k;
            }
        };
        t.put(&mut r, k, &val(k)).unwrap();
        model.insert(k, val(k));
        ops += 2;
    }
    let d = r.counters().since(&start);
    let allocs = r.alloc_trips() - allocs;
    assert!(ops > 500);
    assert_eq!(
        (d.round_trips - allocs, d.verbs_of("op_log"), d.verbs_of("tx_write")),
        (ops, ops, ops / 10)
    );
    assert!(d.verbs_of("read") > 0, "some directories were read");
    assert_eq!(
        SkipList::items(&t, &mut r)
            .unwrap()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        model
    );
}

#[test]
fn a_skiplist_of_another_layout_is_refused_with_a_clear_error() {
    let b = backend();
    let mut r = Remote::open(LocalTransport::new(b.clone()), opts(Mode::Rcb, 4)).unwrap();
    let mut t = open_skip(&mut r);
    t.put(&mut r, 5, &val(5)).unwrap();
    r.flush().unwrap();
    let meta = r.name_get("s").unwrap().unwrap();
    let head = u64::from_le_bytes(r.read(meta, 8, 0).unwrap().try_into().unwrap());
    // A head whose key word is 0: the layout before run directories.
    r.begin(&[1]);
    r.write(head, &0u64.to_le_bytes()).unwrap();
    r.commit().unwrap();
    r.close().unwrap();
    let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 4)).unwrap();
    let e = SkipList::open(&mut r, "s").err().expect("refused");
    assert!(e.to_string().contains("unknown layout"), "{e}");
}

fn dies_and_recovers<T: Kv + nvstore_asym::structures::Replay>(open: fn(&mut Remote) -> T) {
    for kill_after in [25u64, 61, 140] {
        let b = backend();
        let mut r = doomed_writer(&b, kill_after);
        let mut t = open(&mut r);
        let mut model = BTreeMap::new();
        let mut i = 0u64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(kill_after);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            i += 1;
            let k = rng.gen_range(0..200u64);
            if i.is_multiple_of(4) {
                let got = t.remove(&mut r, k);
                assert_eq!(got, model.remove(&k));
            } else {
                t.put(&mut r, k, &val(i));
                model.insert(k, val(i));
            }
        }));
        // Only the injected death may end the loop, not a disagreement with the model.
        let payload = result.expect_err("the transport dies");
        let msg = payload.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("Io("), "ended by {msg:?}");
        drop(r);
        let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 8)).unwrap();
        let mut t = open(&mut r);
        recover(&mut r, &mut t).unwrap();
        assert_eq!(t.items(&mut r), model, "kill after {kill_after}");
        assert_eq!(t.len(&mut r), model.len() as u64);
        assert_eq!(recover(&mut r, &mut t).unwrap(), 0);
    }
}

#[test]
fn a_hash_table_writer_that_dies_is_recovered_exactly_once() {
    dies_and_recovers(open_hash);
}

#[test]
fn a_bptree_writer_that_dies_is_recovered_exactly_once() {
    dies_and_recovers(open_bptree);
}

#[test]
fn a_skiplist_writer_that_dies_is_recovered_exactly_once() {
    dies_and_recovers(open_skip);
}

#[test]
fn a_bst_writer_that_dies_is_recovered_exactly_once() {
    dies_and_recovers(open_bst);
}

/// Keys 1..2^levels in level order of a perfect tree: inserted in this
/// order, the key of level `d` (root 1) lands at depth `d`.
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
fn bst_round_trips_per_insert_are_exact_in_each_mode() {
    let order = level_order(8);
    let keys: Vec<u64> = order.iter().map(|p| p.0).collect();
    let n = keys.len() as u64;
    assert_eq!(n, 255);
    // Ancestors read by each insert: its depth minus one.
    let ancestors: u64 = order.iter().map(|p| p.1 as u64 - 1).sum();
    // naive: metadata, ancestors; write node, link, count.
    assert_eq!(
        insert_round_trips(Mode::Naive, 1, open_bst, &keys),
        (4 * n + ancestors, 0)
    );
    // r: the same reads, one tx_write.
    assert_eq!(insert_round_trips(Mode::R, 1, open_bst, &keys), (2 * n + ancestors, n));
    // rc: eight levels fit the level-aware cache; new nodes are cached when written.
    assert_eq!(insert_round_trips(Mode::Rc, 1, open_bst, &keys), (n, n));
    // rcb: one operation log each; a tx_write every 10.
    assert_eq!(insert_round_trips(Mode::Rcb, 10, open_bst, &keys), (n, n / 10));
}

#[test]
fn bptree_writes_cost_one_round_trip_with_a_cache_of_a_tenth() {
    // `bench asym`'s default in small: random keys, a cache of a tenth of
    // the tree (100 bytes a key). The inner levels stay cached (leaves are
    // evicted first), so a put misses at most its leaf, and its log rides
    // on that read.
    let n = 3000u64;
    let o = RemoteOptions {
        cache_bytes: (n * 100 / 10) as usize,
        ..opts(Mode::Rcb, 64)
    };
    let mut r = Remote::open(LocalTransport::new(backend()), o).unwrap();
    let mut t = BpTree::open(&mut r, "t").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..n {
        let k = rng.gen_range(0..4 * n);
        t.put(&mut r, k, &val(k)).unwrap();
    }
    let start = r.counters().clone();
    let (ahead0, allocs0) = (r.logs_ahead(), r.alloc_trips());
    for _ in 0..n {
        let k = rng.gen_range(0..4 * n);
        t.put(&mut r, k, &val(k)).unwrap();
    }
    let d = r.counters().since(&start);
    let (ahead, allocs) = (r.logs_ahead() - ahead0, r.alloc_trips() - allocs0);
    assert!(ahead > n / 2, "only {ahead} of {n} puts missed their leaf");
    // One round trip per put, besides mallocs of new slabs for splits.
    assert_eq!(d.round_trips - allocs, n);
    assert_eq!(d.verbs_of("op_log"), n);
    assert!(d.round_trips * 10 <= n * 11, "{d:?}");
}
