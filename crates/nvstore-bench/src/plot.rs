//! `nvstore bench plot DIR`: the papers' figures, as SVG and PNG, from the
//! JSON lines that `bench micro|compare|ycsb --out DIR` wrote.
//!
//! Figures (each written as `NAME.svg` and `NAME.png` into `DIR/figures`,
//! or `--out`), drawn for whatever the results cover:
//!
//! - `time_vs_node_size_OP`, `flushes_vs_node_size_OP`: execution time of
//!   the run (keys / ops_per_sec) and cache-line flushes per operation
//!   against node size, one line per engine, at the key count measured with
//!   the most node sizes (NV-Tree Fig. 5, 6);
//! - `time_vs_keys_OP`: execution time against key count at the node size
//!   measured with the most key counts (NV-Tree Fig. 8);
//! - `throughput_OP`: operations per second per engine (NV-Tree Fig. 11),
//!   at the most measured (keys, node size); `--op mixed` runs give the
//!   mixed-workload bars (Fig. 12; results carrying a `read_ratio` are
//!   split by it);
//! - `ycsb_throughput`: run-phase throughput per workload, one bar per
//!   target (NV-Store's YCSB figure);
//! - `adaptive_WORKLOAD_LOCALITY_NODE[_shiftS]`: throughput per interval,
//!   one line per strategy, from `bench adaptive` (NV-Tree Fig. 13, 16);
//! - `adaptive_vs_locality_WORKLOAD_NODE`: last-interval throughput of
//!   each strategy against locality, when several were run (Fig. 14, 15);
//! - `adaptive_rebuild_ms_NODE`: rebuild time per strategy of
//!   `--workload seq-insert` runs (Fig. 17);
//! - from `bench asym --json` lines: `asym_table3` (AsymNVM Table 3):
//!   operations per second per structure, one bar per mode, at the most
//!   measured (batch, cache); `asym_vs_batch` (AsymNVM Fig. 6) and
//!   `asym_vs_cache` (Fig. 7): rcb throughput against `--batch` and
//!   against `--cache-pct`, one line per structure, when several were run.
//!
//! Text is drawn with a TrueType font loaded at run time (DejaVu Sans or
//! Liberation Sans from the usual system paths, or `NVSTORE_PLOT_FONT`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use nvstore::{Error, Result};

/// `nvstore bench plot` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct PlotArgs {
    /// Directory of JSON results (`--out DIR` of micro, compare, ycsb and adaptive).
    pub dir: PathBuf,
    /// Where to write the figures (default: DIR/figures).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

/// Registers the font once; an error names what is missing.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let env = std::env::var("NVSTORE_PLOT_FONT").ok();
        let candidates = env.iter().map(String::as_str).chain(FONT_PATHS.iter().copied());
        for p in candidates {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no TrueType font found for the figures (tried {}; set NVSTORE_PLOT_FONT or install fonts-dejavu-core)",
            FONT_PATHS.join(", ")
        ))
    })
    .clone()
    .map_err(Error::InvalidOption)
}

/// One result line, the fields the figures use.
#[derive(Clone, Debug)]
struct Run {
    engine: String,
    op: String,
    keys: u64,
    node_size: u64,
    ops_per_sec: f64,
    flushes_per_op: f64,
}

/// One strategy's line of `bench adaptive`.
#[derive(Clone, Debug)]
struct AdaptiveRun {
    strategy: String,
    workload: String,
    locality: f64,
    node_size: u64,
    interval_sec: f64,
    shift_at: Option<f64>,
    intervals: Vec<f64>,
    last: f64,
    rebuild_ms: f64,
}

#[derive(Clone, Debug)]
struct AsymRun {
    structure: String,
    mode: String,
    batch: u64,
    cache_pct: u64,
    ops_per_sec: f64,
}

#[derive(Clone, Debug)]
struct YcsbRun {
    workload: String,
    target: String,
    ops_per_sec: f64,
}

/// Reads every `*.jsonl` / `*.json` file of `dir` (one object per line).
/// Every kind of result a directory holds.
type Results = (Vec<Run>, Vec<YcsbRun>, Vec<AdaptiveRun>, Vec<AsymRun>);

fn read_results(dir: &Path) -> Result<Results> {
    let mut asym = Vec::new();
    let mut runs = Vec::new();
    let mut ycsb = Vec::new();
    let mut adaptive = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl" || x == "json"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
            let u = |k: &str| v.get(k).and_then(Value::as_u64);
            let fl = |k: &str| v.get(k).and_then(Value::as_f64);
            if s("bench").as_deref() == Some("adaptive") {
                if let (Some(strategy), Some(workload), Some(locality), Some(node_size), Some(intervals)) = (
                    s("strategy"),
                    s("workload"),
                    fl("locality"),
                    u("node_size"),
                    v.get("intervals").and_then(Value::as_array),
                ) {
                    adaptive.push(AdaptiveRun {
                        strategy,
                        workload,
                        locality,
                        node_size,
                        interval_sec: fl("interval_sec").unwrap_or(1.0),
                        shift_at: fl("shift_at_sec"),
                        intervals: intervals.iter().filter_map(Value::as_f64).collect(),
                        last: fl("last_interval_ops_per_sec").unwrap_or(0.0),
                        rebuild_ms: fl("rebuild_ms").unwrap_or(0.0),
                    });
                }
                continue;
            }
            // `bench asym --json`: a structure, a mode, round trips per op
            // (transaction benchmarks, with `app`, are left out).
            if v.get("round_trips_per_op").is_some() && v.get("app").is_none() {
                if let (Some(structure), Some(mode), Some(ops_per_sec)) = (s("structure"), s("mode"), fl("ops_per_sec"))
                {
                    asym.push(AsymRun {
                        structure,
                        mode,
                        batch: u("batch").unwrap_or(0),
                        cache_pct: u("cache_pct").unwrap_or(0),
                        ops_per_sec,
                    });
                }
                continue;
            }
            if s("bench").as_deref() == Some("ycsb") {
                if let (Some(workload), Some(target), Some(ops_per_sec)) =
                    (s("workload"), s("target"), fl("ops_per_sec"))
                {
                    let target = if target.starts_with("resp://") {
                        "resp".into()
                    } else if target == "embedded" && s("engine").as_deref() == Some("hash") {
                        "embedded/hash".into()
                    } else {
                        target
                    };
                    ycsb.push(YcsbRun {
                        workload,
                        target,
                        ops_per_sec,
                    });
                }
                continue;
            }
            let (Some(engine), Some(op), Some(keys), Some(node_size), Some(ops_per_sec)) =
                (s("engine"), s("op"), u("keys"), u("node_size"), fl("ops_per_sec"))
            else {
                continue;
            };
            let engine = match s("leaf") {
                Some(l) if engine == "tree" => format!("tree/{l}"),
                _ => engine,
            };
            let op = match (op.as_str(), fl("read_ratio")) {
                ("mixed", Some(r)) => format!("mixed-r{:.0}", r * 100.0),
                _ => op,
            };
            runs.push(Run {
                engine,
                op,
                keys,
                node_size,
                ops_per_sec,
                flushes_per_op: fl("flushes_per_op").unwrap_or(0.0),
            });
        }
    }
    Ok((runs, ycsb, adaptive, asym))
}

/// Mean throughput of the runs `keep` selects, or 0.
fn mean_ops(rs: &[AsymRun], keep: impl Fn(&AsymRun) -> bool) -> f64 {
    let xs: Vec<f64> = rs.iter().filter(|r| keep(r)).map(|r| r.ops_per_sec).collect();
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// The `bench asym` figures: AsymNVM Table 3, Fig. 6 and Fig. 7.
fn asym_figures(out: &Path, rs: &[AsymRun]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    if rs.is_empty() {
        return Ok(files);
    }
    let order = [
        "queue", "stack", "hash", "skiplist", "bst", "bptree", "mvbst", "mvbpt", "nvtree",
    ];
    let rank = |s: &str| order.iter().position(|o| *o == s).unwrap_or(order.len());
    let mut structures: Vec<&str> = rs
        .iter()
        .map(|r| r.structure.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    structures.sort_by_key(|s| (rank(s), s.to_string()));
    // Table 3: every mode at the most measured (batch, cache).
    if let Some((b, c)) = mode(rs.iter().map(|r| (r.batch, r.cache_pct))) {
        let at: Vec<AsymRun> = rs
            .iter()
            .filter(|r| r.batch == b && r.cache_pct == c)
            .cloned()
            .collect();
        let modes: Vec<&str> = ["naive", "r", "rc", "rcb"]
            .into_iter()
            .filter(|m| at.iter().any(|r| r.mode == *m))
            .collect();
        let series: Vec<(String, Vec<f64>)> = modes
            .iter()
            .map(|&m| {
                let v = structures
                    .iter()
                    .map(|&s| mean_ops(&at, |r| r.mode == m && r.structure == s))
                    .collect();
                (m.to_string(), v)
            })
            .collect();
        let cats: Vec<String> = structures.iter().map(|s| s.to_string()).collect();
        files.extend(bars(
            out,
            "asym_table3",
            &format!("AsymNVM Table 3: throughput per structure and mode (batch {b}, cache {c}%)"),
            "operations / s",
            &cats,
            &series,
        )?);
    }
    // Fig. 6 and 7: rcb against batch size (at the most measured cache)
    // and against cache size (at the most measured batch).
    let rcb: Vec<&AsymRun> = rs.iter().filter(|r| r.mode == "rcb").collect();
    type Axis = (
        &'static str,
        &'static str,
        &'static str,
        fn(&AsymRun) -> u64,
        fn(&AsymRun) -> u64,
    );
    let axes: [Axis; 2] = [
        (
            "asym_vs_batch",
            "batch size (operations per tx_write)",
            "cache",
            |r| r.batch,
            |r| r.cache_pct,
        ),
        (
            "asym_vs_cache",
            "front-end cache (% of the structure)",
            "batch",
            |r| r.cache_pct,
            |r| r.batch,
        ),
    ];
    for (name, xl, other, x, fixed) in axes {
        let Some(f) = mode(rcb.iter().map(|r| fixed(r))) else {
            continue;
        };
        let mut series: Series = Vec::new();
        for &s in &structures {
            let xs: BTreeSet<u64> = rcb
                .iter()
                .filter(|r| r.structure == s && fixed(r) == f)
                .map(|r| x(r))
                .collect();
            if xs.len() < 2 {
                continue;
            }
            let pts = xs
                .iter()
                .map(|&xv| {
                    let y = mean_ops(rs, |r| {
                        r.mode == "rcb" && r.structure == s && fixed(r) == f && x(r) == xv
                    });
                    (xv as f64, y)
                })
                .collect();
            series.push((s.to_string(), pts));
        }
        if series.is_empty() {
            continue;
        }
        let title = format!(
            "AsymNVM Fig. {}: rcb throughput, {other} {f}{}",
            if name == "asym_vs_batch" { 6 } else { 7 },
            if other == "cache" { "%" } else { "" }
        );
        files.extend(lines(
            out,
            name,
            &title,
            xl,
            "operations / s",
            &series,
            name == "asym_vs_batch",
        )?);
    }
    Ok(files)
}

/// Per strategy, in report order (off first): `(rank, name)`.
type ByStrategy<T> = BTreeMap<(usize, String), T>;

/// The `bench adaptive` figures.
fn adaptive_figures(out: &Path, rs: &[AdaptiveRun]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let order = ["off", "conservative", "aggressive", "balanced"];
    let rank = |s: &str| order.iter().position(|o| *o == s).unwrap_or(order.len());
    // Over time, per (workload, locality, node size, shift); the last run of each strategy wins.
    let mut groups: BTreeMap<(String, String, u64, String), ByStrategy<&AdaptiveRun>> = BTreeMap::new();
    for r in rs {
        let shift = r.shift_at.map_or(String::new(), |s| format!("_shift{}", trim(s)));
        groups
            .entry((r.workload.clone(), trim(r.locality), r.node_size, shift))
            .or_default()
            .insert((rank(&r.strategy), r.strategy.clone()), r);
    }
    for ((w, loc, ns, shift), by) in &groups {
        let series: Series = by
            .iter()
            .map(|((_, name), r)| {
                let pts = r
                    .intervals
                    .iter()
                    .enumerate()
                    .map(|(i, v)| ((i + 1) as f64 * r.interval_sec, *v))
                    .collect();
                (name.clone(), pts)
            })
            .collect();
        files.extend(lines(
            out,
            &format!("adaptive_{w}_{loc}_{ns}{shift}"),
            &format!("{w}, {loc}% locality, {ns} B nodes: throughput over time"),
            "seconds",
            "operations / s",
            &series,
            false,
        )?);
    }
    // Against locality, per (workload, node size), without shifts.
    // Per locality (as text, for the key): (locality, last-interval ops/s).
    type Points = BTreeMap<String, (f64, f64)>;
    let mut by_loc: BTreeMap<(String, u64), ByStrategy<Points>> = BTreeMap::new();
    for r in rs.iter().filter(|r| r.shift_at.is_none()) {
        by_loc
            .entry((r.workload.clone(), r.node_size))
            .or_default()
            .entry((rank(&r.strategy), r.strategy.clone()))
            .or_default()
            .insert(trim(r.locality), (r.locality, r.last));
    }
    for ((w, ns), by) in &by_loc {
        if by.values().all(|pts| pts.len() < 2) {
            continue;
        }
        let series: Series = by
            .iter()
            .map(|((_, name), pts)| {
                let mut v: Vec<(f64, f64)> = pts.values().copied().collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                (name.clone(), v)
            })
            .collect();
        files.extend(lines(
            out,
            &format!("adaptive_vs_locality_{w}_{ns}"),
            &format!("{w}, {ns} B nodes: last-interval throughput against locality"),
            "hot zone (% of keys)",
            "operations / s",
            &series,
            true,
        )?);
    }
    // Rebuild time of sequential inserts (Fig. 17), per node size.
    let mut rebuild: BTreeMap<u64, BTreeMap<(usize, String), f64>> = BTreeMap::new();
    for r in rs.iter().filter(|r| r.workload == "seq-insert") {
        rebuild
            .entry(r.node_size)
            .or_default()
            .insert((rank(&r.strategy), r.strategy.clone()), r.rebuild_ms);
    }
    for (ns, by) in &rebuild {
        let cats: Vec<String> = by.keys().map(|(_, n)| n.clone()).collect();
        let vals: Vec<f64> = by.values().copied().collect();
        files.extend(bars(
            out,
            &format!("adaptive_rebuild_ms_{ns}"),
            &format!("sequential inserts, {ns} B nodes: rebuild time"),
            "milliseconds",
            &cats,
            &[("rebuild ms".to_string(), vals)],
        )?);
    }
    Ok(files)
}

/// 1.5M, 250k, 4096, 2.5: axis labels.
fn short(x: f64) -> String {
    if x.abs() >= 1e6 {
        format!("{}M", trim(x / 1e6))
    } else if x.abs() >= 1e4 {
        format!("{}k", trim(x / 1e3))
    } else {
        trim(x)
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

type Series = Vec<(String, Vec<(f64, f64)>)>;

fn plot_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> Error + '_ {
    move |e| Error::InvalidOption(format!("{}: drawing failed: {e}", path.display()))
}

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &Series,
    log_x: bool,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let tx = |x: f64| if log_x { x.log10() } else { x };
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in pts {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y1 = y1.max(y);
    }
    if x0 >= x1 {
        (x0, x1) = (x0 - 0.5, x1 + 0.5);
    }
    let pad = (x1 - x0) * 0.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0 - pad..x1 + pad, 0f64..(y1 * 1.1).max(1e-9))
        .map_err(|e| e.to_string())?;
    let fmt_x = |v: &f64| short(if log_x { 10f64.powf(*v) } else { *v });
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, p)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let data: Vec<(f64, f64)> = p.iter().map(|&(x, y)| (tx(x), y)).collect();
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(data.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Grouped bars: one group per category, one bar per series.
fn draw_bars<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let y1 = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0f64, f64::max);
    let n = categories.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..(y1 * 1.15).max(1e-9))
        .map_err(|e| e.to_string())?;
    let cats = categories.to_vec();
    let fmt_x = move |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 0.01 && i >= 0.0 && (i as usize) < cats.len() {
            cats[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(categories.len() * 4 + 1)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| short(*v))
        .y_desc(y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    let w = 0.8 / series.len().max(1) as f64;
    for (j, (name, vals)) in series.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        chart
            .draw_series(vals.iter().enumerate().filter(|(_, v)| **v > 0.0).map(|(i, &v)| {
                let x = i as f64 - 0.4 + j as f64 * w;
                Rectangle::new([(x, 0.0), (x + w * 0.9, v)], color.filled())
            }))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

const SIZE: (u32, u32) = (900, 560);

/// Line chart as SVG and PNG.
fn lines(out: &Path, name: &str, title: &str, xl: &str, yl: &str, s: &Series, log_x: bool) -> Result<Vec<PathBuf>> {
    let svg = out.join(format!("{name}.svg"));
    let png = out.join(format!("{name}.png"));
    draw_lines(SVGBackend::new(&svg, SIZE).into_drawing_area(), title, xl, yl, s, log_x).map_err(plot_err(&svg))?;
    draw_lines(
        BitMapBackend::new(&png, SIZE).into_drawing_area(),
        title,
        xl,
        yl,
        s,
        log_x,
    )
    .map_err(plot_err(&png))?;
    Ok(vec![svg, png])
}

/// Bar chart as SVG and PNG.
fn bars(
    out: &Path,
    name: &str,
    title: &str,
    yl: &str,
    cats: &[String],
    s: &[(String, Vec<f64>)],
) -> Result<Vec<PathBuf>> {
    let svg = out.join(format!("{name}.svg"));
    let png = out.join(format!("{name}.png"));
    draw_bars(SVGBackend::new(&svg, SIZE).into_drawing_area(), title, yl, cats, s).map_err(plot_err(&svg))?;
    draw_bars(BitMapBackend::new(&png, SIZE).into_drawing_area(), title, yl, cats, s).map_err(plot_err(&png))?;
    Ok(vec![svg, png])
}

/// The most frequent value.
fn mode<T: Ord + Copy>(it: impl Iterator<Item = T>) -> Option<T> {
    let mut c: BTreeMap<T, usize> = BTreeMap::new();
    for v in it {
        *c.entry(v).or_default() += 1;
    }
    c.into_iter().max_by_key(|&(v, n)| (n, v)).map(|(v, _)| v)
}

/// The value of `group` whose runs cover the most distinct values of
/// `spread` (the largest such value on a tie).
fn best(runs: &[&Run], group: impl Fn(&Run) -> u64, spread: impl Fn(&Run) -> u64) -> u64 {
    let mut m: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for r in runs {
        m.entry(group(r)).or_default().insert(spread(r));
    }
    m.into_iter().max_by_key(|(g, s)| (s.len(), *g)).map_or(0, |(g, _)| g)
}

/// Mean per (engine, x) of `y`, as series sorted by x.
fn series_of(runs: &[&Run], x: impl Fn(&Run) -> f64, y: impl Fn(&Run) -> f64) -> Series {
    let mut m: BTreeMap<String, BTreeMap<u64, (f64, f64, usize)>> = BTreeMap::new();
    for r in runs {
        let e = m
            .entry(r.engine.clone())
            .or_default()
            .entry(x(r).to_bits())
            .or_insert((x(r), 0.0, 0));
        e.1 += y(r);
        e.2 += 1;
    }
    let mut out: Series = m
        .into_iter()
        .map(|(name, pts)| {
            let mut v: Vec<(f64, f64)> = pts.into_values().map(|(x, s, n)| (x, s / n as f64)).collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            (name, v)
        })
        .collect();
    // tree first (the subject), then the others by name.
    out.sort_by_key(|(n, _)| (!n.starts_with("tree"), n.clone()));
    out
}

/// Draws every figure the results in `args.dir` support; returns the files written.
pub fn plot(args: &PlotArgs) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let (runs, ycsb, adaptive, asym) = read_results(&args.dir)?;
    if runs.is_empty() && ycsb.is_empty() && adaptive.is_empty() && asym.is_empty() {
        return Err(Error::InvalidOption(format!(
            "{}: no benchmark results (*.jsonl from --out) found",
            args.dir.display()
        )));
    }
    let out = args.out.clone().unwrap_or_else(|| args.dir.join("figures"));
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    let mut files = Vec::new();
    let ops: BTreeSet<&str> = runs.iter().map(|r| r.op.as_str()).collect();
    let secs = |r: &Run| r.keys as f64 / r.ops_per_sec;
    for op in ops {
        let of_op: Vec<&Run> = runs.iter().filter(|r| r.op == op).collect();
        // vs node size, at the key count measured with the most node sizes
        // (the largest on a tie).
        let keys = best(&of_op, |r| r.keys, |r| r.node_size);
        let at_keys: Vec<&Run> = of_op.iter().copied().filter(|r| r.keys == keys).collect();
        if at_keys.iter().map(|r| r.node_size).collect::<BTreeSet<_>>().len() > 1 {
            let t = series_of(&at_keys, |r| r.node_size as f64, secs);
            files.extend(lines(
                &out,
                &format!("time_vs_node_size_{op}"),
                &format!("{op}: execution time, {keys} keys"),
                "node size (bytes)",
                "seconds",
                &t,
                false,
            )?);
            // LMDB's and RocksDB's writes bypass the pmem layer: their
            // flushes are not counted.
            let counted: Vec<&Run> = at_keys
                .iter()
                .copied()
                .filter(|r| !r.engine.starts_with("lmdb") && !r.engine.starts_with("rocksdb"))
                .collect();
            let f = series_of(&counted, |r| r.node_size as f64, |r| r.flushes_per_op);
            files.extend(lines(
                &out,
                &format!("flushes_vs_node_size_{op}"),
                &format!("{op}: cache-line flushes per operation, {keys} keys"),
                "node size (bytes)",
                "flushes / op",
                &f,
                false,
            )?);
        }
        // vs key count, at the node size measured with the most key counts.
        let ns = best(&of_op, |r| r.node_size, |r| r.keys);
        let at_ns: Vec<&Run> = of_op.iter().copied().filter(|r| r.node_size == ns).collect();
        if at_ns.iter().map(|r| r.keys).collect::<BTreeSet<_>>().len() > 1 {
            let t = series_of(&at_ns, |r| r.keys as f64, secs);
            files.extend(lines(
                &out,
                &format!("time_vs_keys_{op}"),
                &format!("{op}: execution time, {ns} B nodes"),
                "keys",
                "seconds",
                &t,
                true,
            )?);
        }
        // Throughput per engine at the most measured (keys, node size).
        if let Some((k, n)) = mode(of_op.iter().map(|r| (r.keys, r.node_size))) {
            let sel: Vec<&Run> = of_op
                .iter()
                .copied()
                .filter(|r| r.keys == k && r.node_size == n)
                .collect();
            let s = series_of(&sel, |_| 0.0, |r| r.ops_per_sec);
            let cats: Vec<String> = s.iter().map(|(e, _)| e.clone()).collect();
            let vals: Vec<f64> = s.iter().map(|(_, p)| p[0].1).collect();
            files.extend(bars(
                &out,
                &format!("throughput_{op}"),
                &format!("{op}: throughput, {k} keys, {n} B nodes"),
                "operations / s",
                &cats,
                &[("ops/s".to_string(), vals)],
            )?);
        }
    }
    if !ycsb.is_empty() {
        let workloads: BTreeSet<&str> = ycsb.iter().map(|r| r.workload.as_str()).collect();
        let targets: BTreeSet<&str> = ycsb.iter().map(|r| r.target.as_str()).collect();
        let cats: Vec<String> = workloads.iter().map(|w| w.to_uppercase()).collect();
        let series: Vec<(String, Vec<f64>)> = targets
            .iter()
            .map(|&t| {
                let v = workloads
                    .iter()
                    .map(|&w| {
                        let xs: Vec<f64> = ycsb
                            .iter()
                            .filter(|r| r.target == t && r.workload == w)
                            .map(|r| r.ops_per_sec)
                            .collect();
                        if xs.is_empty() {
                            0.0
                        } else {
                            xs.iter().sum::<f64>() / xs.len() as f64
                        }
                    })
                    .collect();
                (t.to_string(), v)
            })
            .collect();
        files.extend(bars(
            &out,
            "ycsb_throughput",
            "YCSB run phase: throughput per workload",
            "operations / s",
            &cats,
            &series,
        )?);
    }
    files.extend(adaptive_figures(&out, &adaptive)?);
    files.extend(asym_figures(&out, &asym)?);
    Ok(files)
}

/// `nvstore bench plot`: draws and lists the files written.
pub fn plot_main(args: &PlotArgs, out: &mut dyn std::io::Write) -> Result<Vec<PathBuf>> {
    let files = plot(args)?;
    for f in &files {
        writeln!(out, "{}", f.display()).map_err(|e| Error::io("<stdout>", e))?;
    }
    Ok(files)
}
