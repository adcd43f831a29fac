//! `nvstore bench asym --structure nvtree`: the engine's NV-Tree on a
//! back-end over loopback TCP, in every mode, with a small run.

use nvstore_bench::{run_asym, AsymArgs};

fn args(mode: &str, cache_pct: u64) -> AsymArgs {
    AsymArgs {
        structure: "nvtree".into(),
        app: None,
        scale: 0,
        mode: mode.into(),
        ops: 4000,
        batch: 64,
        cache_pct,
        delay_us: 0,
        connect: None,
        json: true,
        partitions: None,
    }
}

#[test]
fn nvtree_runs_in_every_mode_and_rcb_writes_cost_one_round_trip_when_cached() {
    let mut trips = Vec::new();
    for mode in ["naive", "r", "rc", "rcb"] {
        let r = run_asym(&args(mode, 100)).unwrap();
        assert_eq!(r.structure, "nvtree");
        assert_eq!(r.mode, mode);
        assert_eq!(r.ops, 4000);
        assert!(r.ops_per_sec > 0.0 && r.p50_ns > 0);
        let json = serde_json::to_value(&r).unwrap();
        for field in [
            "ops_per_sec",
            "round_trips_per_op",
            "bytes_per_op",
            "p50_ns",
            "p99_ns",
            "p999_ns",
            "max_ns",
            "mean_ns",
            "slow_time_share",
        ] {
            assert!(json[field].is_number(), "{field}");
        }
        assert!(r.p999_ns >= r.p99_ns && r.max_ns >= r.p999_ns && r.mean_ns > 0);
        assert!((0.0..=1.0).contains(&r.slow_time_share), "{}", r.slow_time_share);
        trips.push(r.round_trips_per_op);
    }
    // naive: a tx_write per fence and a read per load; r: a tx_write per
    // put and the reads; rc: the reads cached; rcb: the operation log (the
    // batches ride with it). With a cache that holds the tree, rc and rcb
    // only miss on leaves nobody read yet.
    assert!(trips[0] > trips[1] && trips[1] > 2.0 * trips[2], "{trips:?}");
    assert!(trips[2] >= 1.0 && trips[2] <= 1.1, "rc {trips:?}");
    assert!(trips[3] >= 1.0 && trips[3] <= 1.1, "rcb {trips:?}");
}

#[test]
fn nvtree_rcb_writes_cost_one_round_trip_with_the_default_cache_of_a_tenth() {
    // The operation log rides on the read of the leaf the DRAM inner nodes
    // led to; with a page cache of a tenth of the tree (`--cache-pct 10`,
    // the default) puts still miss leaf pages.
    let rcb = run_asym(&args("rcb", 10)).unwrap();
    let rc = run_asym(&args("rc", 10)).unwrap();
    // rc pays its misses and a tx_write per put; rcb its misses after an
    // operation's first, and nothing more.
    assert!(rcb.round_trips_per_op >= 1.0, "rcb {rcb:?}");
    assert!(
        rcb.round_trips_per_op + 0.3 <= rc.round_trips_per_op,
        "rcb {rcb:?} rc {rc:?}"
    );
    // The engine's debug assertions load more of a leaf than a put needs
    // (more pages miss): the per-put figure is the optimised build's.
    if !cfg!(debug_assertions) {
        assert!(rcb.round_trips_per_op <= 1.1, "rcb {rcb:?}");
    }
}
