//! Tests of the hash table: behaviour against a model, and crash campaigns.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::layout as l;
use super::points;
use super::table::HashTable;
use crate::alloc::Allocator;
use crate::format::{blob, header};
use crate::pmem::sim::{CaptureConfig, OP_BOUNDARY};
use crate::pmem::{SimSpace, Space, LINE};

/// The table's root word: a spare word after the pool header's two lines.
const ROOT: u64 = 2 * LINE;
const DATA_START: u64 = 4096;
const CHUNK: u64 = 16 * 1024;
const POOL: u64 = DATA_START + 16 * CHUNK;

fn pool() -> (Arc<SimSpace>, Arc<Allocator>) {
    let space = Arc::new(SimSpace::new(POOL));
    space.store(header::pool_size_word(), POOL);
    space.persist(header::pool_size_word(), 8, points::ROOT_FLUSH, points::ROOT_FENCE);
    let alloc = Arc::new(Allocator::fresh(CHUNK, DATA_START, POOL));
    (space, alloc)
}

fn contents<S: Space>(t: &HashTable<S>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    t.for_each(|k, v| {
        assert!(m.insert(k.to_vec(), v.to_vec()).is_none(), "key {k:?} listed twice");
    });
    m
}

/// Allocator coverage: every block reachable from the table or free.
fn leaks<S: Space>(space: &S, alloc: &Allocator, t: &HashTable<S>) -> Vec<String> {
    let reach = t.reachable().expect("table reads back");
    alloc.verify(space, &reach)
}

fn key(i: u32) -> Vec<u8> {
    // Short keys inline, every third one out of line.
    if i.is_multiple_of(3) {
        format!("a-long-key-{i:06}").into_bytes()
    } else {
        i.to_le_bytes().to_vec()
    }
}

fn value(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.gen_bool(0.5) {
        rng.gen_range(0..=8)
    } else {
        rng.gen_range(9..40)
    };
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn matches_a_map_through_splits_and_reopen() {
    matches_a_map_through_splits_and_reopen_with(l::KeyHash::NEW);
}

/// A table of the hash that pools created before XXH3 use: it keeps that
/// hash through splits, directory doublings and a reopen.
#[test]
fn a_table_of_the_older_hash_keeps_it() {
    assert_ne!(l::KeyHash::NEW, l::KeyHash::Fnv1a);
    matches_a_map_through_splits_and_reopen_with(l::KeyHash::Fnv1a);
}

fn matches_a_map_through_splits_and_reopen_with(kh: l::KeyHash) {
    let (space, alloc) = pool();
    let t = HashTable::create_with(space.clone(), alloc.clone(), ROOT, kh).unwrap();
    assert_eq!(t.key_hash(), kh);
    let mut model = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(1);
    for step in 0..3000u32 {
        let k = key(rng.gen_range(0..600));
        if rng.gen_bool(0.25) {
            assert_eq!(t.delete(&k), model.remove(&k).is_some(), "step {step}");
        } else {
            let v = value(&mut rng);
            t.put(&k, &v).unwrap();
            model.insert(k.clone(), v);
        }
        assert_eq!(t.get(&k), model.get(&k).cloned(), "step {step}");
        assert_eq!(t.len(), model.len() as u64);
    }
    assert!(t.depth() >= 3, "the workload splits segments and doubles the directory");
    // Depth 3 needs a segment split three times at least; every split counts.
    assert!(t.splits() >= t.depth() as u64, "{} splits", t.splits());
    assert_eq!(contents(&t), model);
    for k in model.keys() {
        assert_eq!(t.get(k).as_ref(), model.get(k));
    }
    assert_eq!(leaks(&*space, &alloc, &t), Vec::<String>::new());

    // Reopen from what is persisted: same contents, same allocation.
    let img = SimSpace::from_image(space.persisted_image());
    let img = Arc::new(img);
    let scan = HashTable::recover(&*img, ROOT).unwrap();
    assert_eq!(scan.len(), model.len() as u64);
    let alloc2 = Arc::new(Allocator::rebuild(&*img, CHUNK, DATA_START, &scan.reachable).unwrap());
    assert_eq!(alloc2.used_bytes(), alloc.used_bytes());
    let t2 = HashTable::open(img.clone(), alloc2.clone(), ROOT, scan);
    assert_eq!(t2.key_hash(), kh, "the directory names the table's hash");
    assert_eq!(l::KeyHash::from_word0(img.load(img.load(ROOT))), Some(kh));
    assert_eq!(contents(&t2), model);
    t2.put(b"after", b"reopen").unwrap();
    assert_eq!(t2.get(b"after"), Some(b"reopen".to_vec()));
    assert_eq!(leaks(&*img, &alloc2, &t2), Vec::<String>::new());
}

/// The directory entries a put's prefetch reads without the lock follow
/// every split and doubling, of single and grouped puts, and are built
/// again at open; entries that name blocks outside the pool (or no
/// segment at all) prefetch nothing and change nothing.
#[test]
fn the_prefetch_hint_follows_the_directory() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    assert!(t.hint_is_current());
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = BTreeMap::new();
    for step in 0..1500u32 {
        let (splits, depth) = (t.splits(), t.depth());
        if step % 3 == 0 {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> =
                (0..8).map(|_| (key(rng.gen_range(0..900)), value(&mut rng))).collect();
            let refs: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            for r in t.put_group(&refs) {
                r.unwrap();
            }
            model.extend(pairs);
        } else {
            let (k, v) = (key(rng.gen_range(0..900)), value(&mut rng));
            t.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        if t.splits() != splits || t.depth() != depth {
            assert!(
                t.hint_is_current(),
                "step {step}: a split or doubling left the hint behind"
            );
        }
    }
    assert!(t.depth() >= 3, "the workload splits segments and doubles the directory");
    assert!(t.hint_is_current());

    let img = Arc::new(SimSpace::from_image(space.persisted_image()));
    let scan = HashTable::recover(&*img, ROOT).unwrap();
    let alloc2 = Arc::new(Allocator::rebuild(&*img, CHUNK, DATA_START, &scan.reachable).unwrap());
    let t2 = HashTable::open(img.clone(), alloc2, ROOT, scan);
    assert!(t2.hint_is_current());

    // The same with the pool in a file, whose prefetch touches the
    // mapping: entries naming no segment, blocks past the pool's end or
    // reaching over it, or lines that are no segment's start, are skipped
    // or warm harmless lines; puts still land where the directory says.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let path = dir.path().join("hint.pool");
    let opts = crate::pmem::file::FileOptions {
        mode: crate::pmem::file::OpenMode::Create { size: POOL },
        max_size: POOL,
        ..Default::default()
    };
    let file = Arc::new(crate::pmem::FileSpace::open(&path, &opts).unwrap());
    file.store(header::pool_size_word(), POOL);
    let falloc = Arc::new(Allocator::fresh(CHUNK, DATA_START, POOL));
    let ft = HashTable::create(file.clone(), falloc, ROOT).unwrap();
    let wild = [
        0,
        POOL,
        POOL - LINE,
        !63,
        1 << 40,
        POOL - l::SEGMENT_BYTES + LINE,
        LINE,
        3 * LINE,
    ];
    for hint in [&wild[..], &wild[..1], &[]] {
        ft.set_hint(hint);
        // Every entry of the copy, by the top bits of the hash.
        for i in 0..64u64 {
            ft.prefetch_buckets(i.rotate_right(6));
        }
        for (k, v) in &model {
            ft.put(k, v).unwrap();
        }
        let pairs: Vec<(&[u8], &[u8])> = model.iter().take(16).map(|(k, v)| (&k[..], &v[..])).collect();
        for r in ft.put_group(&pairs) {
            r.unwrap();
        }
    }
    assert_eq!(contents(&ft), model);
}

/// Slots written before an out-of-line key's hash was kept in the slot
/// hold 0 there: such a table reopens, splits (rehashing those keys from
/// their blobs) and reads back whole; a kept hash that is not the key's is
/// refused at open.
#[test]
fn slots_without_a_kept_hash_still_split_and_a_wrong_one_is_refused() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(5);
    for i in 0..120u32 {
        let (k, v) = (key(i), value(&mut rng));
        t.put(&k, &v).unwrap();
        model.insert(k, v);
    }
    t.forget_key_hashes();
    let img = Arc::new(SimSpace::from_image(space.persisted_image()));
    let scan = HashTable::recover(&*img, ROOT).unwrap();
    let alloc2 = Arc::new(Allocator::rebuild(&*img, CHUNK, DATA_START, &scan.reachable).unwrap());
    let t2 = HashTable::open(img.clone(), alloc2.clone(), ROOT, scan);
    let splits = t2.splits();
    for i in 120..600u32 {
        let (k, v) = (key(i), value(&mut rng));
        t2.put(&k, &v).unwrap();
        model.insert(k, v);
    }
    assert!(t2.splits() > splits + 3, "the old entries were split again");
    assert_eq!(contents(&t2), model);
    assert_eq!(leaks(&*img, &alloc2, &t2), Vec::<String>::new());

    // A kept hash that is wrong: the open names the slot.
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc, ROOT).unwrap();
    t.put(&key(3), b"v").unwrap();
    let data = space.persisted_image();
    let long = key(3);
    let want = t.hash(&long).to_le_bytes();
    let at = data
        .windows(8)
        .position(|w| w == want)
        .expect("the kept hash is in the pool");
    let mut bad = data.clone();
    bad[at] ^= 1;
    let err = HashTable::recover(&SimSpace::from_image(bad), ROOT).unwrap_err();
    assert!(err.to_string().contains("keeps a hash that is not its key's"), "{err}");
}

#[test]
fn empty_keys_and_values_and_update_in_full_bucket() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    t.put(b"", b"").unwrap();
    assert_eq!(t.get(b""), Some(vec![]));
    assert_eq!(t.get(b"x"), None);
    // Many updates of one key: each reuses its bucket, nothing accumulates.
    for i in 0..100u32 {
        t.put(b"k", &i.to_le_bytes().repeat(i as usize % 5)).unwrap();
    }
    assert_eq!(t.len(), 2);
    assert_eq!(t.get(b"k"), Some(99u32.to_le_bytes().repeat(4)));
    assert!(t.delete(b""));
    assert!(!t.delete(b""));
    assert_eq!(leaks(&*space, &alloc, &t), Vec::<String>::new());
}

#[test]
fn recovery_rejects_a_slot_in_the_wrong_bucket() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc, ROOT).unwrap();
    t.put(b"key", b"value").unwrap();
    let h = t.hash(b"key");
    let dir = space.load(ROOT);
    let seg = l::entry_seg(space.load(dir + 8));
    let home = l::bucket_off(seg, l::home_bucket(h));
    let far = l::bucket_off(seg, l::home_bucket(h) + 5);
    // Move the published slot five buckets on: recovery must refuse it.
    let mut b = vec![0u8; l::BUCKET_BYTES as usize];
    space.read(home, &mut b);
    space.write(far, &b);
    space.store(home, 0);
    let err = HashTable::recover(&*space, ROOT).unwrap_err();
    assert!(err.to_string().contains("does not hash there"), "{err}");
}

/// One operation of a crash workload.
#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Puts made durable together (`HashTable::put_group`).
    Group(Vec<(Vec<u8>, Vec<u8>)>),
}

/// A workload of puts, deletes and groups of 2 to 9 puts (a group now and
/// then writes one key twice).
fn group_workload(seed: u64, ops: usize, keys: u32) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..ops)
        .map(|_| {
            let k = key(rng.gen_range(0..keys));
            match rng.gen_range(0..10) {
                0 | 1 => Op::Delete(k),
                2 => Op::Put(k, value(&mut rng)),
                _ => {
                    let n = rng.gen_range(2..10);
                    let mut g: Vec<(Vec<u8>, Vec<u8>)> =
                        (0..n).map(|_| (key(rng.gen_range(0..keys)), value(&mut rng))).collect();
                    if rng.gen_bool(0.2) {
                        let again = g[0].0.clone();
                        g.push((again, value(&mut rng)));
                    }
                    Op::Group(g)
                }
            }
        })
        .collect()
}

fn workload(seed: u64, ops: usize, keys: u32) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..ops)
        .map(|_| {
            let k = key(rng.gen_range(0..keys));
            if rng.gen_bool(0.2) {
                Op::Delete(k)
            } else {
                Op::Put(k, value(&mut rng))
            }
        })
        .collect()
}

/// Recovers one crash image and returns what is wrong with it, given the
/// state before the operation in flight and after it.
/// `written`: the values a group wrote to each key besides its last one
/// (a key a group writes twice may show the first value between the two).
fn check_image(
    data: Vec<u8>,
    at_boundary: bool,
    before: &BTreeMap<Vec<u8>, Vec<u8>>,
    after: &BTreeMap<Vec<u8>, Vec<u8>>,
    written: &BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
) -> Vec<String> {
    let space = Arc::new(SimSpace::from_image(data));
    let scan = match HashTable::recover(&*space, ROOT) {
        Ok(s) => s,
        Err(e) => return vec![format!("recovery failed: {e}")],
    };
    let reach = scan.reachable.clone();
    let alloc = match Allocator::rebuild(&*space, CHUNK, DATA_START, &reach) {
        Ok(a) => Arc::new(a),
        Err(e) => return vec![format!("allocator rebuild failed: {e}")],
    };
    let t = HashTable::open(space.clone(), alloc.clone(), ROOT, scan);
    let got = contents(&t);
    let mut problems = Vec::new();
    let keys: BTreeSet<&Vec<u8>> = got.keys().chain(before.keys()).chain(after.keys()).collect();
    for k in keys {
        let (g, b, a) = (got.get(k), before.get(k), after.get(k));
        let mid = || g.is_some_and(|g| written.get(k).is_some_and(|w| w.contains(g)));
        let ok = if at_boundary { g == a } else { g == a || g == b || mid() };
        if !ok {
            problems.push(format!("key {k:?}: recovered {g:?}, before {b:?}, after {a:?}"));
        }
        if t.get(k).as_ref() != g {
            problems.push(format!("key {k:?}: get disagrees with the iteration"));
        }
    }
    if t.len() != got.len() as u64 {
        problems.push(format!("len {} but {} keys", t.len(), got.len()));
    }
    problems.extend(alloc.verify(&*space, &reach));
    // Work continues after recovery, and allocates nothing twice.
    if problems.is_empty() {
        for i in 0..40u32 {
            if let Err(e) = t.put(&key(10_000 + i), &[i as u8; 12]) {
                problems.push(format!("put after recovery failed: {e}"));
                break;
            }
        }
        problems.extend(leaks(&*space, &alloc, &t));
    }
    problems
}

struct Campaign {
    images: u64,
    violations: Vec<String>,
    drop_hits: u64,
    points_seen: BTreeSet<&'static str>,
    /// The directory's global depth after the workload.
    depth: u32,
}

/// Runs `ops` with capture on, crashing at every fence and operation
/// boundary; stops at the first violating image when `stop_early`.
fn campaign(ops: &[Op], seed: u64, drop: Option<&str>, stop_early: bool) -> Campaign {
    campaign_with(l::KeyHash::NEW, ops, seed, drop, stop_early)
}

/// [`campaign`] on a table that places its keys by `kh`.
fn campaign_with(kh: l::KeyHash, ops: &[Op], seed: u64, drop: Option<&str>, stop_early: bool) -> Campaign {
    let (space, alloc) = pool();
    let t = HashTable::create_with(space.clone(), alloc.clone(), ROOT, kh).unwrap();
    // Other writers: a put writes its blob before taking the writer lock,
    // so a concurrent writer may take the blocks a split frees the moment
    // they are freed, and write over them before this thread's next
    // fence. At every split the hook does what such writers would: it
    // allocates blobs of each directory size and of a segment's size (the
    // freed directory's and segment's blocks among them) and writes and
    // flushes them. Their puts never publish (the blobs are freed after the
    // operation), so no key changes; what the campaign checks is that the
    // old table, which a crash before the new root or the rewritten
    // directory entries are durable brings back, was not overwritten.
    let others: Arc<Mutex<Vec<u64>>> = Arc::default();
    {
        let (space, alloc, others) = (space.clone(), alloc.clone(), others.clone());
        t.set_split_hook(Some(Arc::new(move || {
            let sizes = (0..=l::MAX_DEPTH.min(8)).map(l::dir_bytes).chain([l::SEGMENT_BYTES]);
            for len in sizes {
                if let Ok(off) = alloc.alloc(&*space, len) {
                    let filler = vec![0xb1; (len - blob::DATA_OFF) as usize];
                    blob::write(&*space, off, &[], &filler, points::BLOB_FLUSH);
                    others.lock().push(off);
                }
            }
        })));
    }
    space.set_drop(drop.map(str::to_string));
    space.set_capture(Some(CaptureConfig {
        seed,
        random_subsets: 4,
        torn: 2,
    }));
    let mut model = BTreeMap::new();
    let mut c = Campaign {
        images: 0,
        violations: Vec::new(),
        drop_hits: 0,
        points_seen: BTreeSet::new(),
        depth: 0,
    };
    for (n, op) in ops.iter().enumerate() {
        let before = model.clone();
        let mut written: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
        match op {
            Op::Group(g) => {
                let pairs: Vec<(&[u8], &[u8])> = g.iter().map(|(k, v)| (&k[..], &v[..])).collect();
                for (r, (k, v)) in t.put_group(&pairs).into_iter().zip(g) {
                    let new = r.unwrap();
                    assert_eq!(new, !model.contains_key(k), "put_group's answer for {k:?}");
                    if let Some(old) = model.insert(k.clone(), v.clone()) {
                        if before.get(k) != Some(&old) {
                            written.entry(k.clone()).or_default().push(old);
                        }
                    }
                }
            }
            Op::Put(k, v) => {
                t.put(k, v).unwrap();
                model.insert(k.clone(), v.clone());
            }
            Op::Delete(k) => {
                t.delete(k);
                model.remove(k);
            }
        }
        for img in space.take_images() {
            c.images += 1;
            let at_boundary = img.point == OP_BOUNDARY;
            for v in check_image(img.data, at_boundary, &before, &model, &written) {
                c.violations
                    .push(format!("op {n} {op:?}, {} image at {}: {v}", img.kind, img.point));
            }
        }
        for off in others.lock().drain(..) {
            alloc.free(off);
        }
        if stop_early && !c.violations.is_empty() {
            break;
        }
    }
    c.drop_hits = space.drop_hits();
    c.points_seen = space.points_seen();
    c.depth = t.depth();
    c
}

#[test]
fn crash_at_every_point_finds_no_violation() {
    let ops = workload(11, 700, 400);
    let c = campaign(&ops, 11, None, false);
    assert!(
        c.violations.is_empty(),
        "{} violations, first: {:#?}",
        c.violations.len(),
        &c.violations[..c.violations.len().min(5)]
    );
    for p in points::ALL {
        assert!(c.points_seen.contains(p.name), "workload never reaches {}", p.name);
    }
    assert!(c.images > 1000, "only {} images", c.images);
}

/// The crash campaign on a table of the older hash: its directory
/// doublings keep naming it, and recovery reads every image by it.
#[test]
fn a_table_of_the_older_hash_survives_every_crash_point() {
    let ops = workload(13, 400, 300);
    let c = campaign_with(l::KeyHash::Fnv1a, &ops, 13, None, false);
    assert!(
        c.violations.is_empty(),
        "{:#?}",
        &c.violations[..c.violations.len().min(5)]
    );
    assert!(c.depth >= 2, "the workload doubles the directory (depth {})", c.depth);
    assert!(c.images > 500, "only {} images", c.images);
}

#[test]
fn every_dropped_point_is_caught() {
    let ops = workload(12, 700, 400);
    let mut missed = Vec::new();
    for p in points::ALL {
        let c = campaign(&ops, 12, Some(p.name), true);
        assert!(
            c.drop_hits > 0 || !c.violations.is_empty(),
            "{} was never reached",
            p.name
        );
        if c.violations.is_empty() {
            missed.push(p.name);
        }
    }
    assert!(missed.is_empty(), "dropping these points went unnoticed: {missed:?}");
}

#[test]
fn groups_match_a_map_and_reach_every_point() {
    let ops = group_workload(21, 260, 400);
    let c = campaign(&ops, 21, None, false);
    assert!(
        c.violations.is_empty(),
        "{} violations, first: {:#?}",
        c.violations.len(),
        &c.violations[..c.violations.len().min(5)]
    );
    // A group splits segments too (its put that needs a split runs alone).
    for p in points::ALL.iter().chain(points::GROUP) {
        assert!(c.points_seen.contains(p.name), "workload never reaches {}", p.name);
    }
    assert!(c.images > 1000, "only {} images", c.images);
}

#[test]
fn every_dropped_group_point_is_caught() {
    let ops = group_workload(22, 260, 120);
    let mut missed = Vec::new();
    for p in points::GROUP {
        let c = campaign(&ops, 22, Some(p.name), true);
        assert!(
            c.drop_hits > 0 || !c.violations.is_empty(),
            "{} was never reached",
            p.name
        );
        if c.violations.is_empty() {
            missed.push(p.name);
        }
    }
    assert!(missed.is_empty(), "dropping these points went unnoticed: {missed:?}");
}

/// Flushes and fences this thread has issued.
fn flushes_and_fences() -> (u64, u64) {
    let c = crate::pmem::counters::ThreadCounters::get();
    (c.flushes, c.fences)
}

/// Fences this thread has issued.
fn fences() -> u64 {
    flushes_and_fences().1
}

/// What a group costs: two fences for the whole group, against two per
/// put alone; a key written twice keeps the last value. (A put with bad
/// input fails alone: `tests/asyncdb.rs`.)
#[test]
fn a_group_is_two_fences_and_keeps_its_promises() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    let keys: Vec<Vec<u8>> = (0..6).map(|i| format!("fresh-key-{i}").into_bytes()).collect();
    let mut pairs: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &b"v"[..])).collect();
    pairs.push((&keys[0], b"last"));
    let f0 = fences();
    let r = t.put_group(&pairs);
    assert_eq!(r.iter().filter(|r| matches!(r, Ok(true))).count(), 6, "{r:?}");
    assert!(matches!(r[6], Ok(false)), "{:?}", r[6]);
    // One group for the six, then the repeated key alone.
    assert_eq!(fences() - f0, 2 + 2, "two fences per group and per lone put");
    assert_eq!(t.get(&keys[0]), Some(b"last".to_vec()));
    assert_eq!(t.len(), 6);
    // Updates in place, values out of line: one group, old blobs freed.
    let long: Vec<Vec<u8>> = (0..6)
        .map(|i| format!("a value out of line, number {i}").into_bytes())
        .collect();
    for round in 0..2 {
        let pairs: Vec<(&[u8], &[u8])> = keys.iter().zip(&long).map(|(k, v)| (&k[..], &v[..])).collect();
        let f0 = fences();
        assert!(t.put_group(&pairs).iter().all(|r| matches!(r, Ok(false))));
        assert_eq!(fences() - f0, 2, "round {round}");
    }
    for (k, v) in keys.iter().zip(&long) {
        assert_eq!(t.get(k).as_ref(), Some(v));
    }
    assert!(leaks(&*space, &alloc, &t).is_empty());
}

/// The table hands each key it adds to its caller (the engine inserts it
/// into the ordered index there) after the key's slot is written and its
/// flush issued, and before the fence that orders that flush: alone and
/// in a group, once per new key, never for an update.
#[test]
fn new_keys_are_handed_over_between_their_slot_flush_and_its_fence() {
    let (space, alloc) = pool();
    let t = HashTable::create(space, alloc, ROOT).unwrap();
    let now = flushes_and_fences;
    let keys: Vec<Vec<u8>> = (0..4).map(|i| format!("handed-over-{i}").into_bytes()).collect();
    let mut seen: Vec<(Vec<u8>, (u64, u64))> = Vec::new();
    // Alone: a new key, then an update of it.
    for (round, new) in [(0, true), (1, false)] {
        let k = &keys[0];
        let blob = t.write_blob(k, b"v", points::BLOB_FLUSH).unwrap();
        let (flushes, fences) = now();
        let r = t.put_blob(t.hash(k), k, b"v", blob, |key| seen.push((key.to_vec(), now())));
        assert_eq!(r.unwrap(), new, "round {round}");
        let handed = std::mem::take(&mut seen);
        if !new {
            assert!(handed.is_empty(), "an update was handed over: {handed:?}");
            continue;
        }
        assert_eq!(handed.len(), 1);
        let (key, (f, n)) = &handed[0];
        assert_eq!(key, k);
        assert!(*f > flushes, "handed over before the slot's flush");
        assert_eq!(*n, fences, "handed over after a fence");
        assert_eq!(now().1 - fences, 2, "the slot's fence and the header's");
    }
    // A group: three new keys and an update of the first one's.
    let pairs: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &b"w"[..])).collect();
    let hashes = t.hashes(&pairs);
    let blobs = t.write_blobs(&pairs, &hashes);
    let (flushes, fences) = now();
    let r = t.put_group_blobs(&pairs, &hashes, blobs, |key| seen.push((key.to_vec(), now())));
    assert_eq!(
        r.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        [false, true, true, true]
    );
    assert_eq!(
        seen.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        keys[1..].iter().collect::<Vec<_>>()
    );
    for (i, (_, (f, n))) in seen.iter().enumerate() {
        assert!(*f > flushes + i as u64, "key {i} handed over before its slot's flush");
        assert_eq!(*n, fences, "key {i} handed over after the group's fence");
    }
    assert_eq!(now().1 - fences, 2, "one group: two fences");
}

/// A long run of pairs is published in groups of at most `GROUP_MAX`
/// puts (each group's keys and headers are short lists, searched in full
/// for every put), two fences per group.
#[test]
fn a_long_run_of_puts_is_published_in_bounded_groups() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    let n = 3 * super::table::GROUP_MAX;
    // Eight times the keys, then seven in eight deleted: every bucket has
    // room for a second copy, so no update of the run needs to run alone.
    let all: Vec<Vec<u8>> = (0..8 * n).map(|i| format!("run-key-{i:04}").into_bytes()).collect();
    for k in &all {
        t.put(k, b"old").unwrap();
    }
    let keys: Vec<Vec<u8>> = all.iter().step_by(8).cloned().collect();
    for (i, k) in all.iter().enumerate() {
        if i % 8 != 0 {
            assert!(t.delete(k));
        }
    }
    let pairs: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &b"new"[..])).collect();
    let f0 = fences();
    let r = t.put_group(&pairs);
    assert!(r.iter().all(|r| matches!(r, Ok(false))), "{r:?}");
    assert_eq!(fences() - f0, 2 * 3, "three groups of GROUP_MAX updates");
    for k in &keys {
        assert_eq!(t.get(k).as_deref(), Some(&b"new"[..]));
    }
    assert_eq!(t.len(), n as u64);
    assert!(leaks(&*space, &alloc, &t).is_empty());
}

/// A slot a group clears (the old copy of a key it updates) is not reused
/// by the same group: the put that would need it waits for the group's
/// publish and runs alone. Crashing anywhere in between loses nothing.
#[test]
fn a_group_does_not_reuse_a_slot_it_clears() {
    // Six keys in bucket 0 (slots 0..=5): updating the first takes slot 6
    // and clears slot 0; the second then finds bucket 0 full for the
    // group and would go to bucket 1 (a cross-bucket update): it runs
    // alone after the group, into slot 0.
    let keys = keys_homed_at_zero(6);
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    for k in &keys {
        t.put(k, b"old").unwrap();
    }
    let f0 = fences();
    let r = t.put_group(&[(&keys[0][..], &b"new0"[..]), (&keys[1][..], &b"new1"[..])]);
    assert!(r.iter().all(|r| matches!(r, Ok(false))), "{r:?}");
    assert_eq!(fences() - f0, 2 + 2);
    assert_eq!(t.get(&keys[0]), Some(b"new0".to_vec()));
    assert_eq!(t.get(&keys[1]), Some(b"new1".to_vec()));
    let seg = l::entry_seg(space.load(space.load(ROOT) + 8));
    let b0 = l::BucketHeader(space.load(l::bucket_off(seg, 0)));
    assert!((0..7).all(|i| b0.valid(i) != (i == 1)), "bucket 0: {:#x}", b0.0);
    assert!(leaks(&*space, &alloc, &t).is_empty());
    let mut ops: Vec<Op> = keys.iter().map(|k| Op::Put(k.clone(), b"old".to_vec())).collect();
    ops.push(Op::Group(vec![
        (keys[0].clone(), b"new0".to_vec()),
        (keys[1].clone(), b"new1".to_vec()),
        (keys[2].clone(), b"new2-out-of-line".to_vec()),
    ]));
    let c = campaign(&ops, 6, None, false);
    assert!(
        c.violations.is_empty(),
        "{:#?}",
        &c.violations[..c.violations.len().min(5)]
    );
}

/// Keys whose home is bucket 0 of the first segment.
fn keys_homed_at_zero(n: usize) -> Vec<Vec<u8>> {
    (0u32..)
        .map(|i| format!("h{i}").into_bytes())
        .filter(|k| l::home_bucket(l::KeyHash::NEW.of(k)) == 0)
        .take(n)
        .collect()
}

#[test]
fn update_across_buckets_is_crash_safe() {
    // Seven keys fill bucket 0; updating one must place the new copy in
    // bucket 1 and clear the old one by a second store. A crash between
    // the two leaves both copies: recovery must yield the newer value.
    let keys = keys_homed_at_zero(8);
    let mut ops: Vec<Op> = keys[..7].iter().map(|k| Op::Put(k.clone(), b"old".to_vec())).collect();
    ops.push(Op::Put(keys[0].clone(), b"new-and-long-value".to_vec()));
    ops.push(Op::Put(keys[7].clone(), b"eighth".to_vec()));
    ops.push(Op::Delete(keys[0].clone()));
    ops.push(Op::Put(keys[0].clone(), b"again".to_vec()));
    let c = campaign(&ops, 5, None, false);
    assert!(
        c.violations.is_empty(),
        "{:#?}",
        &c.violations[..c.violations.len().min(5)]
    );

    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc, ROOT).unwrap();
    for k in &keys[..7] {
        t.put(k, b"old").unwrap();
    }
    space.set_capture(Some(CaptureConfig::new(3)));
    t.put(&keys[0], b"new").unwrap();
    space.set_capture(None);
    let seg = l::entry_seg(space.load(space.load(ROOT) + 8));
    let b0 = l::BucketHeader(space.load(l::bucket_off(seg, 0)));
    let b1 = l::BucketHeader(space.load(l::bucket_off(seg, 1)));
    assert_eq!(
        (b0.free_slot(), b1.free_slot()),
        (Some(0), Some(1)),
        "moved from slot 0 of bucket 0 to bucket 1"
    );
    assert_eq!(t.get(&keys[0]), Some(b"new".to_vec()));
    // Some crash image holds both copies; recovery reads the newer one.
    let word = |img: &[u8], off: u64| u64::from_le_bytes(img[off as usize..off as usize + 8].try_into().unwrap());
    let mut both = 0;
    for img in space.take_images() {
        let h0 = l::BucketHeader(word(&img.data, l::bucket_off(seg, 0)));
        let h1 = l::BucketHeader(word(&img.data, l::bucket_off(seg, 1)));
        if h0.valid(0) && h1.valid(0) {
            both += 1;
            let sim = Arc::new(SimSpace::from_image(img.data));
            let scan = HashTable::recover(&*sim, ROOT).unwrap();
            assert_eq!(scan.len(), 7, "two copies count as one key");
            let a = Arc::new(Allocator::rebuild(&*sim, CHUNK, DATA_START, &scan.reachable).unwrap());
            let t2 = HashTable::open(sim, a, ROOT, scan);
            assert_eq!(t2.get(&keys[0]), Some(b"new".to_vec()));
            assert_eq!(contents(&t2).get(&keys[0]), Some(&b"new".to_vec()));
            // Deleting it clears both copies, the older first.
            assert!(t2.delete(&keys[0]));
            assert_eq!(t2.get(&keys[0]), None);
        }
    }
    assert!(both > 0, "no image caught the update between its two stores");
}

/// A hash `Db` on a simulated pool with `n` keys, closed cleanly: the image.
fn closed_hash_pool(n: u32) -> Vec<u8> {
    let opts = crate::db::Options {
        engine: header::EngineKind::Hash,
        size: 8 << 20,
        ..crate::db::Options::default()
    };
    let db = crate::db::Db::create_in(SimSpace::new(8 << 20), Path::new("img"), &opts).unwrap();
    for i in 0..n {
        db.put(&key(i), format!("v{i}").as_bytes()).unwrap();
    }
    db.delete(&key(3)).unwrap();
    db.close_into_space().unwrap().current_image()
}

fn sorted_keys(n: u32) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = (0..n).filter(|&i| i != 3).map(key).collect();
    keys.sort();
    keys
}

/// A clean close saves the index; the next open loads it (same keys, in
/// order), frees its block, and the pool checks clean.
#[test]
fn clean_close_saves_the_index_and_open_loads_it() {
    use crate::recovery::RecoveryKind;
    let image = closed_hash_pool(700);
    let db = crate::db::Db::open_space(SimSpace::from_image(image), Path::new("img")).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Loaded);
    let keys: Vec<Vec<u8>> = db.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, sorted_keys(700));
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    // Written again and closed again: loaded again.
    db.put(b"zz-new", b"1").unwrap();
    let image = db.close_into_space().unwrap().current_image();
    let db = crate::db::Db::open_space(SimSpace::from_image(image), Path::new("img")).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Loaded);
    assert_eq!(db.len(), 700);
    assert_eq!(db.prefix(b"zz-").count(), 1);
}

/// A damaged image (one flipped byte), or one whose count is not the
/// table's, is not trusted: the open rebuilds, with the same contents.
#[test]
fn a_damaged_or_stale_image_is_rebuilt() {
    use crate::recovery::RecoveryKind;
    let image = closed_hash_pool(300);
    let clean = header::clean_state(&SimSpace::from_image(image.clone()));
    let at = (clean & ((1 << 48) - 1)) as usize;
    assert!(at > 0);
    // A byte inside the first saved key, then the key count.
    for (pos, what) in [(at + 8 * 6, "a key byte"), (at + 8 * 4, "the key count")] {
        let mut bad = image.clone();
        bad[pos] ^= 0x40;
        let db = crate::db::Db::open_space(SimSpace::from_image(bad), Path::new("img")).unwrap();
        assert_eq!(db.recovery().kind, RecoveryKind::Rebuild, "{what}");
        let keys: Vec<Vec<u8>> = db.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, sorted_keys(300), "{what}");
        assert!(db.check().ok, "{what}");
    }
}

/// The directory's entries as the pool holds them: (directory, entries).
fn dir_entries(space: &SimSpace) -> (u64, Vec<u64>) {
    let dir = space.load(ROOT);
    let depth = space.load(dir) & 0xffff_ffff;
    (dir, (0..1u64 << depth).map(|j| space.load(dir + 8 + 8 * j)).collect())
}

/// A split that keeps the directory's depth stores its segment's entries
/// in place. A crash that persisted only some of those stores leaves a run
/// naming the old segment in part and its halves in part; recovery names
/// the old segment throughout again (it still holds every entry), so the
/// table is as before the put that split, and the halves are free again.
#[test]
fn a_split_whose_entries_were_partly_stored_is_rolled_back() {
    let (space, alloc) = pool();
    let t = HashTable::create(space.clone(), alloc.clone(), ROOT).unwrap();
    let mut rng = StdRng::seed_from_u64(31);
    let mut model = BTreeMap::new();
    let mut in_place = 0;
    for i in 0..3000u32 {
        let (d0, e0) = dir_entries(&space);
        let before = model.clone();
        let (k, v) = (key(i), value(&mut rng));
        t.put(&k, &v).unwrap();
        model.insert(k, v);
        let (d1, e1) = dir_entries(&space);
        if d0 != d1 || e0 == e1 {
            continue;
        }
        // An in-place split: tear it, keeping the first `keep` of its
        // run's new entries and the old entry in the rest.
        let changed: Vec<usize> = (0..e0.len()).filter(|&j| e0[j] != e1[j]).collect();
        let old = e0[changed[0]];
        assert!(changed.iter().all(|&j| e0[j] == old), "one segment's run changes");
        assert_eq!(changed.len().count_ones(), 1, "an aligned run");
        // A put that split twice (a half split again at once) has its
        // first split's fence behind it: only single splits can be torn so.
        let halves: BTreeSet<u64> = changed.iter().map(|&j| e1[j]).collect();
        if halves.len() != 2 {
            continue;
        }
        in_place += 1;
        let image = space.persisted_image();
        let n = changed.len();
        let keeps: BTreeSet<usize> = [1, n / 2, n / 2 + 1, n - 1].into_iter().filter(|&k| k < n).collect();
        for keep in keeps {
            let torn = SimSpace::from_image(image.clone());
            for &j in &changed[keep..] {
                let at = d1 + 8 + 8 * j as u64;
                torn.store(at, old);
                torn.persist(at, 8, points::DIRENTRY_FLUSH, points::DIRENTRY_FENCE);
            }
            let (_, entries) = dir_entries(&torn);
            let depth = entries.len().trailing_zeros();
            assert_eq!(
                super::table::torn_split(&entries, depth),
                Some((changed[0], changed.len(), old)),
                "keeping {keep} of {}",
                changed.len()
            );
            let problems = check_image(torn.persisted_image(), true, &before, &before, &BTreeMap::new());
            assert!(problems.is_empty(), "keeping {keep}: {problems:?}");
            let recovered = SimSpace::from_image(torn.persisted_image());
            HashTable::recover(&recovered, ROOT).unwrap();
            let (_, entries) = dir_entries(&recovered);
            assert!(
                changed.iter().all(|&j| entries[j] == old),
                "the run is rolled back in the pool"
            );
        }
        if in_place >= 3 {
            break;
        }
    }
    assert!(in_place >= 3, "only {in_place} splits kept the depth");
}

/// Only a run of one segment's entry mixed with its two halves (one per
/// half of the run, one level deeper) is taken for a torn split; anything
/// else is left for recovery's validation to refuse.
#[test]
fn only_a_run_mixed_with_its_own_halves_is_a_torn_split() {
    let e = |seg: u64, d: u32| l::dir_entry(seg * 64, d);
    let torn = super::table::torn_split;
    // Depth 2: `a` (local depth 0) names all four entries; `b` and `c`
    // (local depth 1) are its halves.
    let (a, b, c) = (e(100, 0), e(200, 1), e(300, 1));
    assert_eq!(torn(&[a, a, a, a], 2), None);
    assert_eq!(torn(&[b, b, c, c], 2), None);
    assert_eq!(torn(&[b, a, a, a], 2), Some((0, 4, a)));
    assert_eq!(torn(&[b, b, c, a], 2), Some((0, 4, a)));
    assert_eq!(torn(&[a, a, c, a], 2), Some((0, 4, a)));
    // The same segment in both halves, or an entry two levels deeper: no.
    assert_eq!(torn(&[b, a, b, a], 2), None);
    assert_eq!(torn(&[e(400, 2), a, a, a], 2), None);
    // Depth 3: a valid run of four, then a torn one found where it is.
    let (x, a1) = (e(500, 1), e(600, 1));
    let (p, q) = (e(700, 2), e(800, 2));
    assert_eq!(torn(&[x, x, x, x, a1, a1, a1, a1], 3), None);
    assert_eq!(torn(&[x, x, x, x, p, p, q, q], 3), None);
    assert_eq!(torn(&[x, x, x, x, p, a1, a1, a1], 3), Some((4, 4, a1)));
    assert_eq!(torn(&[x, x, x, x, p, p, q, a1], 3), Some((4, 4, a1)));
    assert_eq!(torn(&[x, x, x, x, e(900, 3), a1, a1, a1], 3), None);
}
