//! `nvstore bench asym --app`: both transaction benchmarks end to end over
//! loopback TCP with a tiny database, in the naive and the fastest mode.

use nvstore_bench::{run_asym, AsymArgs};

fn args(app: &str, mode: &str) -> AsymArgs {
    AsymArgs {
        structure: "queue".into(),
        app: Some(app.into()),
        scale: 200,
        mode: mode.into(),
        ops: 400,
        batch: 64,
        cache_pct: 10,
        delay_us: 0,
        connect: None,
        json: true,
        partitions: None,
    }
}

#[test]
fn both_apps_run_in_naive_and_rcb_and_name_themselves() {
    for (app, structure) in [("smallbank", "hash"), ("tatp", "bptree")] {
        let naive = run_asym(&args(app, "naive")).unwrap();
        let rcb = run_asym(&args(app, "rcb")).unwrap();
        for r in [&naive, &rcb] {
            assert_eq!(r.app.as_deref(), Some(app));
            assert_eq!(r.structure, structure);
            assert_eq!(r.ops, 400);
            assert!(r.ops_per_sec > 0.0 && r.p50_ns > 0);
            let json = serde_json::to_value(r).unwrap();
            assert_eq!(json["app"], app);
            assert!(json["aborted"].as_u64().is_some());
        }
        // Caching and batching take round trips off every transaction.
        assert!(
            rcb.round_trips_per_op < naive.round_trips_per_op,
            "{app}: rcb {} naive {}",
            rcb.round_trips_per_op,
            naive.round_trips_per_op
        );
    }
    let mut bad = args("tpcc", "rcb");
    assert!(run_asym(&bad).unwrap_err().contains("smallbank or tatp"));
    bad.app = None;
    bad.structure = "nope".into();
    assert!(run_asym(&bad).is_err());
}
