//! `bench plot` end to end: small real results written with `--out`, then
//! the figures drawn from them as non-empty SVG and PNG files.

use nvstore_bench::micro::{CompareArgs, Op};
use nvstore_bench::ycsb::WorkloadName;
use nvstore_bench::{compare_main, plot_main, ycsb_main, PlotArgs, YcsbArgs};

#[test]
fn plotting_a_small_result_dir_writes_svg_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("results");
    let mut sink = Vec::new();
    for (op, keys, ns) in [
        (Op::Insert, 2000, 512),
        (Op::Insert, 2000, 1024),
        (Op::Insert, 4000, 1024),
        (Op::Search, 2000, 1024),
    ] {
        let a = CompareArgs {
            op,
            keys,
            node_size: ns,
            reps: 1,
            engines: "tree,lcb,fptree".into(),
            out: Some(res.clone()),
            ..CompareArgs::default()
        };
        compare_main(&a, &mut sink).unwrap();
    }
    for w in [WorkloadName::A, WorkloadName::C] {
        let a = YcsbArgs {
            workload: w,
            records: 500,
            ops: 500,
            node_size: 1024,
            out: Some(res.clone()),
            ..YcsbArgs::default()
        };
        ycsb_main(&a, &mut sink).unwrap();
    }
    let mut listing = Vec::new();
    let files = plot_main(
        &PlotArgs {
            dir: res.clone(),
            out: None,
        },
        &mut listing,
    )
    .unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "time_vs_node_size_insert.svg",
        "time_vs_node_size_insert.png",
        "flushes_vs_node_size_insert.svg",
        "flushes_vs_node_size_insert.png",
        "time_vs_keys_insert.svg",
        "time_vs_keys_insert.png",
        "throughput_insert.svg",
        "throughput_search.png",
        "ycsb_throughput.svg",
        "ycsb_throughput.png",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert_eq!(String::from_utf8(listing).unwrap().lines().count(), files.len());
    for f in &files {
        assert!(f.starts_with(res.join("figures")), "{}", f.display());
        let bytes = std::fs::read(f).unwrap();
        assert!(bytes.len() > 1000, "{}: {} bytes", f.display(), bytes.len());
        if f.extension().unwrap() == "png" {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", f.display());
        } else {
            let text = String::from_utf8(bytes).unwrap();
            assert!(text.contains("<svg") && text.contains("</svg>"), "{}", f.display());
            // Every engine of the run appears in the legend of the line charts.
            if f.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("time_vs_node_size")
            {
                for e in ["tree/nv", "lcb", "fptree"] {
                    assert!(text.contains(e), "{}: no {e}", f.display());
                }
            }
        }
    }
}

#[test]
fn plotting_an_empty_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = plot_main(
        &PlotArgs {
            dir: dir.path().to_path_buf(),
            out: None,
        },
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no benchmark results"), "{e}");
}

#[test]
fn plotting_asym_json_draws_table_3_and_figures_6_and_7() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("results");
    std::fs::create_dir_all(&res).unwrap();
    // Real `bench asym --json` lines from small runs: Table 3 at batch 64 and
    // 10% cache, a batch sweep and a cache sweep in rcb.
    let mut lines = String::new();
    let mut run = |structure: &str, mode: &str, batch: usize, cache_pct: u64| {
        let a = nvstore_bench::AsymArgs {
            structure: structure.into(),
            app: None,
            scale: 0,
            mode: mode.into(),
            ops: 300,
            batch,
            cache_pct,
            delay_us: 0,
            connect: None,
            partitions: None,
            json: true,
        };
        let mut out = Vec::new();
        nvstore_bench::asym::asym_main(&a, &mut out).unwrap();
        lines.push_str(&String::from_utf8(out).unwrap());
    };
    for s in ["queue", "bptree"] {
        for m in ["naive", "rcb"] {
            run(s, m, 64, 10);
        }
        run(s, "rcb", 1, 10);
        run(s, "rcb", 64, 100);
    }
    // A transaction benchmark's line is not a structure's: left out.
    lines.push_str(
        "{\"app\":\"tatp\",\"structure\":\"bptree\",\"mode\":\"rcb\",\"ops_per_sec\":1.0,\"round_trips_per_op\":1.0}\n",
    );
    std::fs::write(res.join("asym.jsonl"), lines).unwrap();
    let files = plot_main(
        &PlotArgs {
            dir: res.clone(),
            out: None,
        },
        &mut Vec::new(),
    )
    .unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["asym_table3", "asym_vs_batch", "asym_vs_cache"] {
        for ext in ["svg", "png"] {
            let n = format!("{want}.{ext}");
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
    }
    let table = std::fs::read_to_string(res.join("figures/asym_table3.svg")).unwrap();
    for label in ["queue", "bptree", "naive", "rcb", "batch 64, cache 10%"] {
        assert!(table.contains(label), "table 3 lacks {label}");
    }
    let batch = std::fs::read_to_string(res.join("figures/asym_vs_batch.svg")).unwrap();
    assert!(batch.contains("bptree") && batch.contains("queue"));
}
