//! The runner end to end with tiny N: compare over every engine, and each
//! micro operation.

use nvstore_bench::micro::{CompareArgs, MicroArgs, Op};
use nvstore_bench::output::print_json_lines;
use nvstore_bench::registry::{open_engine, EngineConfig, ENGINES};
use nvstore_bench::{run_compare, run_micro};

const MICRO_FIELDS: &[&str] = &[
    "engine",
    "leaf",
    "op",
    "keys",
    "threads",
    "node_size",
    "latency_ns",
    "ops_per_sec",
    "flushes_per_op",
    "fences_per_op",
    "p50_ns",
    "p99_ns",
    "p999_ns",
    "splits",
    "rebuilds",
    "rebuild_ms",
];

#[test]
fn compare_runs_every_engine() {
    let args = CompareArgs {
        keys: 2000,
        node_size: 512,
        reps: 3,
        json: true,
        ..CompareArgs::default()
    };
    let rs = run_compare(&args).unwrap();
    let names: Vec<&str> = rs.iter().map(|r| r.engine.as_str()).collect();
    for e in ENGINES {
        assert!(names.contains(e), "{e} missing from {names:?}");
    }
    let mut buf = Vec::new();
    print_json_lines(&rs, &mut buf).unwrap();
    let text = String::from_utf8(buf).unwrap();
    // The tree runs once per leaf format (nv and isle).
    assert_eq!(text.lines().count(), ENGINES.len() + 1);
    assert!(rs.iter().any(|r| r.engine == "tree" && r.leaf == "isle"));
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for f in [
            "engine",
            "op",
            "keys",
            "node_size",
            "latency_ns",
            "ops_per_sec",
            "flushes_per_op",
            "fences_per_op",
            "p50_ns",
            "p99_ns",
            "p999_ns",
            "splits",
            "ratio_vs_nv",
        ] {
            assert!(v.get(f).is_some(), "field {f} missing in {line}");
        }
        assert!(v["ops_per_sec"].as_f64().unwrap() > 0.0);
        assert!(v["ratio_vs_nv"].as_f64().unwrap() > 0.0, "{line}");
        if v["engine"] == "tree" && v["leaf"] == "nv" {
            assert_eq!(v["ratio_vs_nv"].as_f64().unwrap(), 1.0);
        }
        // The volatile bound never flushes; LMDB and RocksDB (the `lmdb` and
        // `rocksdb` features) write outside the pmem layer, so their flushes
        // are not counted.
        let engine = v["engine"].as_str().unwrap();
        if engine == "volatile" || engine.starts_with("lmdb") || engine.starts_with("rocksdb") {
            assert_eq!(v["flushes_per_op"].as_f64().unwrap(), 0.0);
        } else {
            assert!(v["flushes_per_op"].as_f64().unwrap() >= 1.0, "{line}");
        }
    }
}

#[test]
fn compare_searches_the_hash_engine_next_to_the_tree() {
    let args = CompareArgs {
        op: Op::Search,
        keys: 3000,
        reps: 2,
        engines: "hash".into(),
        ..CompareArgs::default()
    };
    let rs = run_compare(&args).unwrap();
    let names: Vec<(&str, &str)> = rs.iter().map(|r| (r.engine.as_str(), r.leaf.as_str())).collect();
    assert_eq!(names, [("tree", "nv"), ("tree", "isle"), ("hash", "-")]);
    for r in &rs {
        assert!(r.ops_per_sec > 0.0 && r.ratio_vs_nv > 0.0, "{r:?}");
        // Point gets write nothing.
        assert_eq!(r.flushes_per_op, 0.0, "{r:?}");
    }
}

#[test]
fn hash_engine_answers_points_and_ordered_scans() {
    let cfg = EngineConfig::new(512);
    let e = open_engine("hash", &cfg).unwrap();
    assert_eq!(e.name(), "hash");
    // Keys in an order unrelated to their hash or their value.
    for k in (0..1000u64).map(|i| (i * 7919) % 1000 * 3) {
        e.insert(k, k + 1);
    }
    assert_eq!(e.search(300), Some(301));
    assert_eq!(e.search(301), None);
    assert!(e.update(300, 7));
    assert!(!e.update(301, 7));
    assert_eq!(e.search(300), Some(7));
    assert!(e.delete(303));
    assert!(!e.delete(303));
    let mut out = Vec::new();
    // From a key that is absent (keys are multiples of 3), past a deleted one.
    e.scan(298, 4, &mut out);
    assert_eq!(out, [(300, 7), (306, 307), (309, 310), (312, 313)]);
    out.clear();
    e.scan(2996, 10, &mut out);
    assert_eq!(out, [(2997, 2998)]);
}

#[test]
fn micro_runs_every_op_with_exact_fields() {
    for op in [Op::Insert, Op::Update, Op::Delete, Op::Search, Op::Scan, Op::Mixed] {
        for locality in [100.0, 5.0] {
            let args = MicroArgs {
                engine: "all".into(),
                op,
                keys: 2000,
                node_size: 512,
                locality,
                ..MicroArgs::default()
            };
            let rs = run_micro(&args).unwrap();
            assert_eq!(rs.len(), ENGINES.len());
            for r in &rs {
                let v = serde_json::to_value(r).unwrap();
                let keys: Vec<&str> = v.as_object().unwrap().keys().map(|s| s.as_str()).collect();
                let mut want = MICRO_FIELDS.to_vec();
                want.sort();
                let mut got = keys.clone();
                got.sort();
                assert_eq!(got, want);
                assert_eq!(v["op"], serde_json::json!(format!("{op:?}").to_lowercase()));
                assert!(r.ops_per_sec > 0.0 && r.p50_ns > 0 && r.p99_ns >= r.p50_ns);
            }
        }
    }
}

#[test]
fn tree_runs_with_threads_and_string_keys() {
    let args = MicroArgs {
        engine: "tree,fptree".into(),
        op: Op::Insert,
        keys: 4000,
        threads: 2,
        ..MicroArgs::default()
    };
    let rs = run_micro(&args).unwrap();
    assert_eq!(rs[0].threads, 2);
    assert_eq!(rs[1].threads, 1, "baselines run on one thread");
    let args = MicroArgs {
        engine: "tree".into(),
        op: Op::Search,
        keys: 2000,
        key_kind: nvstore_bench::KeyKind::String,
        ..MicroArgs::default()
    };
    assert_eq!(run_micro(&args).unwrap().len(), 1);
    let bad = MicroArgs {
        engine: "fptree".into(),
        key_kind: nvstore_bench::KeyKind::String,
        keys: 10,
        ..MicroArgs::default()
    };
    assert!(run_micro(&bad).is_err());
    assert!(run_micro(&MicroArgs {
        engine: "btree".into(),
        keys: 10,
        ..MicroArgs::default()
    })
    .is_err());
}
