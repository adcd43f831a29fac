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
