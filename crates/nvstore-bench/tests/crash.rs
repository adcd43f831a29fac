//! Short crash-simulator campaigns for every persistent baseline (lcb, cdds,
//! fptree, wbtree, fastfair): each engine runs inserts, updates and deletes on
//! a `SimSpace` with capture on; every crash image (at each fence and
//! operation boundary) is recovered with the engine's own recovery and
//! checked against a model: every acknowledged key present with its value,
//! the operation in flight either applied or not, nothing else.
//!
//! FAST-FAIR assumes that stores to one cache line persist in program order
//! (its paper, §3), so its campaign skips the simulator's word-torn images
//! and keeps the line-granular ones (with torn images it fails at the first
//! insert: a record's value word persisted without its key word).
//!
//! Each campaign is also run with one essential flush dropped, and must then
//! find violations: the check can fail.

use std::collections::BTreeMap;
use std::sync::Arc;

use nvstore::pmem::sim::{CaptureConfig, ImageKind, OP_BOUNDARY};
use nvstore::pmem::SimSpace;
use nvstore_bench::baselines::{Cdds, FastFair, FpTree, Lcb, WbTree};
use nvstore_bench::BenchIndex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NODE: u64 = 256;
const SPACE: u64 = 256 * 1024;

type Make = fn(Arc<SimSpace>) -> Box<dyn BenchIndex>;

struct Report {
    images: u64,
    violations: Vec<String>,
}

/// What the operation in flight may leave for its key.
#[derive(Clone, Copy)]
struct InFlight {
    key: u64,
    before: Option<u64>,
    after: Option<u64>,
}

fn check(e: &dyn BenchIndex, model: &BTreeMap<u64, u64>, fl: Option<InFlight>, what: &str, out: &mut Vec<String>) {
    let ok_for = |k: u64, got: Option<u64>| -> bool {
        match fl {
            Some(f) if f.key == k => got == f.before || got == f.after,
            _ => got == model.get(&k).copied(),
        }
    };
    for (&k, _) in model.iter() {
        let got = e.search(k);
        if !ok_for(k, got) {
            out.push(format!("{what}: search {k} = {got:?}, want {:?}", model.get(&k)));
            return;
        }
    }
    if let Some(f) = fl {
        let got = e.search(f.key);
        if !ok_for(f.key, got) {
            out.push(format!("{what}: in-flight key {} = {got:?}", f.key));
            return;
        }
    }
    let mut all = Vec::new();
    e.scan(0, usize::MAX, &mut all);
    let mut prev = None;
    for &(k, v) in &all {
        if prev.is_some_and(|p| p >= k) {
            out.push(format!("{what}: scan out of order at {k}"));
            return;
        }
        prev = Some(k);
        if !ok_for(k, Some(v)) {
            out.push(format!("{what}: scan has {k} = {v}, model {:?}", model.get(&k)));
            return;
        }
    }
    // Every model key (other than the one in flight) in the scan too.
    let other = |k: &u64| fl.is_none_or(|f| f.key != *k);
    let want = model.keys().filter(|k| other(k)).count();
    let got = all.iter().filter(|(k, _)| other(k)).count();
    if got != want {
        out.push(format!("{what}: scan has {got} settled keys, want {want}"));
    }
}

fn campaign(make: Make, recover: Make, ops: usize, seed: u64, drop: Option<&str>, torn: bool) -> Report {
    let space = Arc::new(SimSpace::new(SPACE));
    let e = make(space.clone());
    space.set_drop(drop.map(str::to_string));
    space.set_capture(Some(CaptureConfig::new(seed)));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut rep = Report {
        images: 0,
        violations: Vec::new(),
    };
    let _ = space.take_images();
    for i in 0..ops {
        let present = !model.is_empty() && rng.gen_bool(0.4);
        let key = if present {
            *model.keys().nth(rng.gen_range(0..model.len())).unwrap()
        } else {
            rng.gen_range(0..2_000u64) * 7919
        };
        let val = rng.gen_range(1..u64::MAX);
        let before = model.get(&key).copied();
        // Fill first, then churn with deletes.
        let delete = present && rng.gen_bool(if i < ops / 2 { 0.2 } else { 0.6 });
        let after = if delete { None } else { Some(val) };
        if delete {
            assert!(e.delete(key));
        } else if present && rng.gen_bool(0.5) {
            assert!(e.update(key, val));
        } else {
            e.insert(key, val);
        }
        let fl = InFlight { key, before, after };
        for img in space.take_images() {
            if !torn && img.kind == ImageKind::Torn {
                continue;
            }
            rep.images += 1;
            let boundary = img.point == OP_BOUNDARY;
            let r = recover(Arc::new(SimSpace::from_image(img.data)));
            let mut m = model.clone();
            let what = format!("op {i} ({}) at {} [{}]", key, img.point, img.kind);
            if boundary {
                // Acknowledged: strictly the new state.
                match after {
                    Some(v) => m.insert(key, v),
                    None => m.remove(&key),
                };
                check(&*r, &m, None, &what, &mut rep.violations);
            } else {
                check(&*r, &m, Some(fl), &what, &mut rep.violations);
            }
            if rep.violations.len() > 5 {
                return rep;
            }
        }
        match after {
            Some(v) => model.insert(key, v),
            None => model.remove(&key),
        };
    }
    rep
}

fn lcb(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(Lcb::new(s, NODE).unwrap())
}
fn lcb_recover(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(Lcb::recover(s, NODE).unwrap())
}
fn cdds(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(Cdds::new(s, NODE).unwrap())
}
fn cdds_recover(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(Cdds::recover(s, NODE).unwrap())
}
fn fptree(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(FpTree::new(s, NODE).unwrap())
}
fn fptree_recover(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(FpTree::recover(s, NODE).unwrap())
}

fn wbtree(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(WbTree::new(s, NODE).unwrap())
}
fn wbtree_recover(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(WbTree::recover(s, NODE).unwrap())
}
fn fastfair(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(FastFair::new(s, NODE).unwrap())
}
fn fastfair_recover(s: Arc<SimSpace>) -> Box<dyn BenchIndex> {
    Box::new(FastFair::recover(s, NODE).unwrap())
}

fn clean(name: &str, make: Make, recover: Make, min_images: u64) {
    let r = campaign(make, recover, 300, 1, None, name != "fastfair");
    assert!(r.violations.is_empty(), "{name}: {:#?}", r.violations);
    assert!(r.images >= min_images, "{name}: only {} crash states", r.images);
    eprintln!("{name}: {} crash states, no violation", r.images);
}

fn dropped(name: &str, make: Make, recover: Make, point: &str) {
    let r = campaign(make, recover, 300, 1, Some(point), name != "fastfair");
    assert!(
        !r.violations.is_empty(),
        "{name}: dropping {point} went unnoticed over {} crash states",
        r.images
    );
}

#[test]
fn lcb_survives_every_crash_state() {
    clean("lcb", lcb, lcb_recover, 2000);
}

#[test]
fn lcb_campaign_catches_a_dropped_log_flush() {
    dropped("lcb", lcb, lcb_recover, "lcb.log.flush");
}

#[test]
fn cdds_survives_every_crash_state() {
    clean("cdds", cdds, cdds_recover, 2000);
}

#[test]
fn cdds_campaign_catches_a_dropped_entry_flush() {
    dropped("cdds", cdds, cdds_recover, "cdds.entry.flush");
}

#[test]
fn fptree_survives_every_crash_state() {
    clean("fptree", fptree, fptree_recover, 1000);
}

#[test]
fn fptree_campaign_catches_a_dropped_pair_flush() {
    dropped("fptree", fptree, fptree_recover, "fptree.kv.flush");
}

#[test]
fn wbtree_survives_every_crash_state() {
    clean("wbtree", wbtree, wbtree_recover, 1000);
}

#[test]
fn wbtree_campaign_catches_a_dropped_entry_flush() {
    dropped("wbtree", wbtree, wbtree_recover, "wbtree.entry.flush");
}

#[test]
fn fastfair_survives_every_crash_state() {
    clean("fastfair", fastfair, fastfair_recover, 1000);
}

#[test]
fn fastfair_campaign_catches_a_dropped_node_flush() {
    dropped("fastfair", fastfair, fastfair_recover, "fastfair.node.flush");
}
