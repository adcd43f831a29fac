//! `nvstore bench asym --partitions N` (AsymNVM Fig. 10): the same puts
//! spread over 1–3 back-ends, one writer front-end per partition, with
//! each partition's share reported.

use nvstore_bench::{run_asym, AsymArgs};

fn args(structure: &str, partitions: Option<usize>) -> AsymArgs {
    AsymArgs {
        structure: structure.into(),
        app: None,
        scale: 100,
        mode: "rcb".into(),
        ops: 1200,
        batch: 64,
        cache_pct: 10,
        delay_us: 0,
        connect: None,
        json: true,
        partitions,
    }
}

#[test]
fn every_partition_runs_its_share_of_the_same_puts() {
    for structure in ["bptree", "hash", "queue"] {
        for n in 1..=3 {
            let r = run_asym(&args(structure, Some(n))).unwrap();
            assert_eq!((r.partitions, r.ops, r.structure.as_str()), (n, 1200, structure));
            let parts = r.per_partition.as_ref().expect("per-partition figures");
            assert_eq!(parts.len(), n);
            assert_eq!(parts.iter().map(|p| p.ops).sum::<u64>(), 1200, "{structure} over {n}");
            for (i, p) in parts.iter().enumerate() {
                assert_eq!(p.partition, i);
                // Uniform keys (hash, ranges) and hashed sequence numbers (queue) spread evenly.
                assert!(p.ops > 1200 / n as u64 * 3 / 4, "{structure} over {n}: {parts:?}");
                assert!(p.ops_per_sec > 0.0 && p.p50_ns > 0);
                // rcb: one operation log per put, batches riding along, a few opening round trips.
                assert!(p.round_trips_per_op >= 1.0 && p.round_trips_per_op < 3.0, "{p:?}");
            }
            assert!(r.ops_per_sec > 0.0 && r.round_trips_per_op >= 1.0);
            let json = serde_json::to_value(&r).unwrap();
            for f in [
                "ops_per_sec",
                "round_trips_per_op",
                "bytes_per_op",
                "p50_ns",
                "p99_ns",
                "partitions",
            ] {
                assert!(json.get(f).is_some(), "{f} missing: {json}");
            }
            assert_eq!(json["per_partition"].as_array().unwrap().len(), n);
        }
    }
}

#[test]
fn tatp_runs_partitioned_by_subscriber_range() {
    for n in 1..=3 {
        let mut a = args("queue", Some(n));
        a.app = Some("tatp".into());
        a.scale = 300;
        a.ops = 900;
        let r = run_asym(&a).unwrap();
        assert_eq!(
            (r.app.as_deref(), r.structure.as_str(), r.partitions),
            (Some("tatp"), "bptree", n)
        );
        let parts = r.per_partition.as_ref().unwrap();
        assert_eq!(parts.iter().map(|p| p.ops).sum::<u64>(), 900);
        // TATP's non-uniform s_id still reaches every range.
        assert!(parts.iter().all(|p| p.ops > 0), "{parts:?}");
        // Some transactions find no row (TATP's mix aborts a share by design).
        assert!(r.aborted.is_some_and(|x| x > 0 && x < 900), "{r:?}");
    }
}

#[test]
fn without_partitions_the_json_says_one_and_lists_none() {
    let r = run_asym(&args("bptree", None)).unwrap();
    assert_eq!(r.partitions, 1);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["partitions"], 1);
    assert!(json.get("per_partition").is_none());
}

#[test]
fn what_does_not_partition_is_refused() {
    let mut a = args("bptree", Some(2));
    a.app = Some("smallbank".into());
    assert!(run_asym(&a).unwrap_err().contains("--app"));
    assert!(run_asym(&args("mvbst", Some(2))).unwrap_err().contains("mvbst"));
    assert!(run_asym(&args("bptree", Some(0))).is_err());
}
