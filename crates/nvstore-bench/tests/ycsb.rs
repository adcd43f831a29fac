//! YCSB: the generators against their distributions (fixed seeds,
//! statistical bounds), the workloads' operation mix, and end-to-end runs on
//! the embedded target and (when installed) on redis-server.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvstore::EngineKind;
use nvstore_bench::ycsb::gen::{fnvhash64, zeta, AckCounter, ScrambledZipfian, SkewedLatest, Zipfian};
use nvstore_bench::ycsb::target::{decode_record, encode_record, java_string_hash};
use nvstore_bench::ycsb::{key_name, run_ycsb, KeyChooser, OpKind, WorkloadName, YcsbArgs};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// |observed - expected| within `sigmas` binomial standard deviations.
fn within_sigmas(hits: u64, n: u64, p: f64, sigmas: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (hits as f64 - mean).abs() <= sigmas * sd
}

#[test]
fn fnvhash64_and_key_names_match_ycsb() {
    // Values of YCSB's Utils.fnvhash64 (FNV-1a-64 over the 8 little-endian
    // bytes, then Math.abs); "user6284781860667377211" is YCSB's first key.
    assert_eq!(fnvhash64(0), 6284781860667377211);
    assert_eq!(fnvhash64(1), 8517097267634966620);
    assert_eq!(fnvhash64(42), 55488592825689361);
    assert_eq!(key_name(0), "user6284781860667377211");
    // Java's String.hashCode, the redis binding's zset score.
    assert_eq!(java_string_hash("user1"), 111578566);
    assert_eq!(java_string_hash("user6284781860667377211"), -594971599);
}

#[test]
fn zipfian_skew_matches_theory() {
    let n_items = 1000u64;
    let draws = 400_000u64;
    let mut z = Zipfian::new(0, n_items - 1);
    let zetan = zeta(0, n_items, 0.99, 0.0);
    assert!((z.zetan() - zetan).abs() < 1e-9);
    let mut rng = StdRng::seed_from_u64(7);
    let mut counts = vec![0u64; n_items as usize];
    for _ in 0..draws {
        let v = z.next(&mut rng);
        assert!(v < n_items, "{v} out of range");
        counts[v as usize] += 1;
    }
    // Items 0 and 1 are drawn exactly with probability 1/zeta(n) and
    // 2^-0.99/zeta(n) by Gray's method.
    let p0 = 1.0 / zetan;
    let p1 = 0.5f64.powf(0.99) / zetan;
    assert!(
        within_sigmas(counts[0], draws, p0, 4.0),
        "item 0: {} of {draws}, p {p0}",
        counts[0]
    );
    assert!(
        within_sigmas(counts[1], draws, p1, 4.0),
        "item 1: {} of {draws}, p {p1}",
        counts[1]
    );
    // The rest follows the zipfian law only approximately (Gray's method):
    // the head and tail shares of items within 15% of their theoretical mass.
    let mass = |a: u64, b: u64| (a..b).map(|i| 1.0 / ((i + 1) as f64).powf(0.99)).sum::<f64>() / zetan;
    for (a, b) in [(0, 100), (0, 500), (100, 1000), (500, 1000)] {
        let got = counts[a as usize..b as usize].iter().sum::<u64>() as f64 / draws as f64;
        let want = mass(a, b);
        assert!(
            (got - want).abs() / want < 0.15,
            "items [{a}, {b}): share {got:.4}, theory {want:.4}"
        );
    }
    // Monotone on average: the first 10 items each beat the mean of the last 100.
    let tail = counts[900..].iter().sum::<u64>() as f64 / 100.0;
    assert!(counts[..10].iter().all(|&c| c as f64 > 5.0 * tail));
}

#[test]
fn zipfian_zeta_grows_incrementally() {
    let mut z = Zipfian::new(0, 999);
    let mut rng = StdRng::seed_from_u64(1);
    // Asking for more items extends zeta from 1000 to 5000 terms.
    let mut max = 0;
    for _ in 0..50_000 {
        max = max.max(z.next_with(5000, &mut rng));
    }
    assert!(
        (z.zetan() - zeta(0, 5000, 0.99, 0.0)).abs() < 1e-9,
        "zetan {}",
        z.zetan()
    );
    assert!(max >= 1000, "values beyond the first 1000 items appear (max {max})");
    assert!(max < 5000);
}

#[test]
fn scrambled_zipfian_covers_its_range_and_is_skewed() {
    let mut g = ScrambledZipfian::new(100, 1099);
    let mut rng = StdRng::seed_from_u64(3);
    let draws = 200_000;
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for _ in 0..draws {
        let v = g.next(&mut rng);
        assert!((100..=1099).contains(&v), "{v} out of range");
        *counts.entry(v).or_default() += 1;
    }
    assert!(counts.len() >= 990, "only {} of 1000 items drawn", counts.len());
    // The hottest item is the image of zipfian item 0 (p = 1/26.469 ~ 3.8%),
    // and it is not at the start of the range (the point of scrambling).
    let hot = 100 + fnvhash64(0) % 1000;
    let share = counts[&hot] as f64 / draws as f64;
    assert!(share > 0.035 && share < 0.045, "hot item share {share}");
    let (&top, _) = counts.iter().max_by_key(|(_, &c)| c).unwrap();
    assert_eq!(top, hot);
}

#[test]
fn latest_favours_recent_inserts() {
    let ack = AckCounter::new(10_000);
    let mut g = SkewedLatest::new(ack.last_value());
    let mut rng = StdRng::seed_from_u64(5);
    let draws = 100_000;
    let mut newest = 0;
    let mut recent = 0;
    for _ in 0..draws {
        let v = g.next(ack.last_value(), &mut rng);
        assert!(v <= 9_999);
        newest += u64::from(v == 9_999);
        recent += u64::from(v >= 9_000);
    }
    // The newest key is zipfian item 0 of ~10,000: p = 1/zeta(9999).
    let p = 1.0 / zeta(0, 9_999, 0.99, 0.0);
    assert!(
        within_sigmas(newest, draws, p, 4.0),
        "newest {newest} of {draws}, p {p}"
    );
    assert!(recent as f64 / draws as f64 > 0.6, "only {recent} in the newest 10%");
    // After inserts are acknowledged, the newest key moves with them.
    for _ in 0..100 {
        let n = ack.next_value();
        ack.acknowledge(n);
    }
    assert_eq!(ack.last_value(), 10_099);
    let hits = (0..10_000)
        .filter(|_| g.next(ack.last_value(), &mut rng) == 10_099)
        .count();
    assert!(hits > 500, "newest after inserts drawn {hits} times in 10000");
}

#[test]
fn ack_counter_waits_for_gaps() {
    let ack = AckCounter::new(10);
    let (a, b, c) = (ack.next_value(), ack.next_value(), ack.next_value());
    assert_eq!((a, b, c), (10, 11, 12));
    ack.acknowledge(c);
    ack.acknowledge(b);
    assert_eq!(ack.last_value(), 9, "10 is not acknowledged yet");
    ack.acknowledge(a);
    assert_eq!(ack.last_value(), 12);
}

#[test]
fn key_chooser_never_returns_unacknowledged_keys() {
    let w = WorkloadName::E.spec();
    let ack = AckCounter::new(1000);
    // The zipfian range extends past the loaded records (expected new keys).
    let mut k = KeyChooser::new(&w, 1000, 100_000, &ack);
    let mut rng = StdRng::seed_from_u64(9);
    for _ in 0..20_000 {
        assert!(k.next_keynum(&ack, &mut rng) < 1000);
    }
}

#[test]
fn workload_proportions() {
    let want: [(WorkloadName, [f64; 5]); 6] = [
        (WorkloadName::A, [0.5, 0.5, 0.0, 0.0, 0.0]),
        (WorkloadName::B, [0.95, 0.05, 0.0, 0.0, 0.0]),
        (WorkloadName::C, [1.0, 0.0, 0.0, 0.0, 0.0]),
        (WorkloadName::D, [0.95, 0.0, 0.05, 0.0, 0.0]),
        (WorkloadName::E, [0.0, 0.0, 0.05, 0.95, 0.0]),
        (WorkloadName::F, [0.5, 0.0, 0.0, 0.0, 0.5]),
    ];
    for (name, props) in want {
        let chooser = name.spec().op_chooser();
        let mut rng = StdRng::seed_from_u64(11);
        let n = 100_000u64;
        let mut counts: HashMap<OpKind, u64> = HashMap::new();
        for _ in 0..n {
            *counts.entry(chooser.next(&mut rng)).or_default() += 1;
        }
        for (kind, p) in OpKind::ALL.iter().zip(props) {
            let got = counts.get(kind).copied().unwrap_or(0);
            if p == 0.0 {
                assert_eq!(got, 0, "{name:?}: {kind:?} never issued");
            } else {
                assert!(
                    within_sigmas(got, n, p, 4.5),
                    "{name:?}: {kind:?} {got} of {n}, want {p}"
                );
            }
        }
    }
    let e = WorkloadName::E.spec();
    assert_eq!((e.min_scan_length, e.max_scan_length), (1, 100));
    assert_eq!((e.field_count, e.field_length), (10, 100));
}

#[test]
fn record_encoding_round_trips() {
    let rec: Vec<Vec<u8>> = (0..10).map(|i| vec![b'a' + i as u8; 100]).collect();
    let mut buf = Vec::new();
    encode_record(&rec, &mut buf);
    assert_eq!(buf.len(), 10 * 104);
    assert_eq!(decode_record(&buf).unwrap(), rec);
    assert!(decode_record(&buf[..buf.len() - 1]).is_none());
}

const FIELDS: &[&str] = &[
    "bench",
    "workload",
    "records",
    "ops",
    "threads",
    "target",
    "engine",
    "layout",
    "load_ops_per_sec",
    "run_secs",
    "ops_per_sec",
    "operations",
];
const OP_FIELDS: &[&str] = &["count", "ops_per_sec", "p50_ns", "p99_ns", "p999_ns", "not_found"];

/// Runs every workload on `target` and checks the JSON.
fn run_all(target: &str) {
    run_all_on(target, EngineKind::Tree)
}

/// Runs every workload on `target` (an embedded pool of `engine`) and checks the JSON.
fn run_all_on(target: &str, engine: EngineKind) {
    for w in WorkloadName::ALL {
        let args = YcsbArgs {
            workload: w,
            records: 3000,
            ops: 4000,
            threads: 2,
            target: target.into(),
            json: true,
            node_size: 1024,
            engine,
            ..YcsbArgs::default()
        };
        let mut out = Vec::new();
        let r = nvstore_bench::ycsb_main(&args, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        for f in FIELDS {
            assert!(v.get(f).is_some(), "{w:?} {target}: field {f} missing in {text}");
        }
        assert_eq!(v["workload"], w.as_str());
        assert_eq!(v["records"], 3000);
        assert_eq!(v["ops"], 4000);
        assert_eq!(v["threads"], 2);
        assert_eq!(v["target"], target);
        if target == "embedded" {
            assert_eq!(v["engine"], engine.as_str());
        }
        let ops = v["operations"].as_object().unwrap();
        let mut total = 0;
        for (name, s) in ops {
            for f in OP_FIELDS {
                assert!(s.get(f).is_some(), "{w:?}: {name}.{f} missing");
            }
            let p50 = s["p50_ns"].as_u64().unwrap();
            let p999 = s["p999_ns"].as_u64().unwrap();
            assert!(p50 > 0 && p50 <= p999, "{w:?} {name}: p50 {p50} p999 {p999}");
            assert_eq!(s["not_found"], 0, "{w:?} {name}: records not found");
            total += s["count"].as_u64().unwrap();
        }
        assert_eq!(total, 4000, "{w:?}: operation counts");
        let spec = w.spec();
        for (kind, p) in [
            (OpKind::Read, spec.read),
            (OpKind::Update, spec.update),
            (OpKind::Insert, spec.insert),
            (OpKind::Scan, spec.scan),
            (OpKind::ReadModifyWrite, spec.read_modify_write),
        ] {
            assert_eq!(
                ops.contains_key(kind.as_str()),
                p > 0.0,
                "{w:?}: {kind:?} present iff issued"
            );
        }
        assert!(r.ops_per_sec > 0.0);
    }
}

#[test]
fn embedded_runs_every_workload() {
    run_all("embedded");
}

#[test]
fn embedded_hash_engine_runs_every_workload() {
    run_all_on("embedded", EngineKind::Hash);
}

#[test]
fn hash_engine_pool_holds_every_record_in_order_and_scans_find_them() {
    let dir = tempfile::Builder::new()
        .prefix("nvb-ycsb-hash")
        .tempdir_in("/dev/shm")
        .unwrap();
    let pool = dir.path().join("p");
    // Workload E: scans (answered by the hash engine's ordered index) and inserts.
    let args = YcsbArgs {
        workload: WorkloadName::E,
        records: 2000,
        ops: 2000,
        threads: 2,
        pool: Some(pool.clone()),
        engine: EngineKind::Hash,
        ..YcsbArgs::default()
    };
    let r = run_ycsb(&args).unwrap();
    assert_eq!(r.engine, "hash");
    let scans = &r.operations["scan"];
    assert!(scans.count > 1000, "{} scans", scans.count);
    let inserted = r.operations["insert"].count;
    let db = nvstore::Db::open(&pool, nvstore::Options::default()).unwrap();
    assert_eq!(db.engine(), EngineKind::Hash);
    assert_eq!(db.len(), 2000 + inserted);
    let mut want: Vec<String> = (0..2000 + inserted).map(key_name).collect();
    want.sort();
    let got: Vec<String> = db
        .range::<&[u8], _>(..)
        .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
        .collect();
    assert_eq!(got, want);
    // A scan from any key returns the records from it on, in key order.
    let start = &want[want.len() / 2];
    let from: Vec<String> = db
        .range(start.as_bytes()..)
        .take(10)
        .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
        .collect();
    assert_eq!(from, want[want.len() / 2..want.len() / 2 + 10]);
}

#[test]
fn engine_flag_is_refused_for_servers() {
    let args = YcsbArgs {
        target: "resp://127.0.0.1:1".into(),
        engine: EngineKind::Hash,
        records: 10,
        ops: 10,
        ..YcsbArgs::default()
    };
    let e = run_ycsb(&args).expect_err("refused");
    assert!(e.to_string().contains("embedded target only"), "{e}");
}

#[test]
fn embedded_records_are_readable_after_the_run() {
    // Workload D inserts: every key number up to the counter's end is present.
    let dir = tempfile::Builder::new()
        .prefix("nvb-ycsb")
        .tempdir_in("/dev/shm")
        .unwrap();
    let pool = dir.path().join("p");
    let args = YcsbArgs {
        workload: WorkloadName::D,
        records: 2000,
        ops: 2000,
        threads: 2,
        pool: Some(pool.clone()),
        node_size: 1024,
        ..YcsbArgs::default()
    };
    let r = run_ycsb(&args).unwrap();
    let inserted = r.operations["insert"].count;
    assert!(inserted > 50);
    let db = nvstore::Db::open(&pool, nvstore::Options::default()).unwrap();
    assert_eq!(db.len(), 2000 + inserted);
    for n in 0..2000 + inserted {
        let v = db.get(key_name(n).as_bytes()).unwrap().expect("record present");
        let rec = decode_record(&v).unwrap();
        assert_eq!(rec.len(), 10);
        assert!(rec
            .iter()
            .all(|f| f.len() == 100 && f.iter().all(|b| (b' '..=b'~').contains(b))));
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tool_missing(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
}

/// False (after printing why) when redis-server is missing; a failure
/// instead with NVSTORE_REQUIRE_TOOLS=1.
fn have_redis() -> bool {
    if !tool_missing("redis-server") {
        return true;
    }
    let required = std::env::var("NVSTORE_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "redis-server is not installed and NVSTORE_REQUIRE_TOOLS=1 (apt-get install -y redis-server)"
    );
    eprintln!("skipping: redis-server is not installed (apt-get install -y redis-server)");
    false
}

#[test]
fn redis_target_starts_and_stops_a_durable_server() {
    if !have_redis() {
        return;
    }
    let args = YcsbArgs {
        workload: WorkloadName::A,
        records: 1000,
        ops: 1000,
        threads: 2,
        target: "redis".into(),
        ..YcsbArgs::default()
    };
    let r = run_ycsb(&args).unwrap();
    assert_eq!(r.target, "redis");
    assert_eq!(r.operations.values().map(|s| s.count).sum::<u64>(), 1000);
    assert!(r.operations.values().all(|s| s.not_found == 0));
    // The server and its files on /dev/shm are gone after the run.
    let prefix = format!("nvstore-redis-{}-", std::process::id());
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn resp_runs_every_workload_against_redis() {
    if !have_redis() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("nvb-redis")
        .tempdir_in("/dev/shm")
        .unwrap();
    // A port unlikely to be in use: derived from the process id.
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let server = Server(
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server"),
    );
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "redis-server did not start on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run_all(&format!("resp://{addr}"));
    // The binding's layout: a hash per record and every key in _indices.
    let mut c = nvstore_bench::ycsb::resp::RespConn::connect(&addr).unwrap();
    let n = c.cmd(&[b"ZCARD", b"_indices"]).unwrap();
    assert!(
        matches!(n, nvstore_bench::ycsb::resp::Reply::Int(k) if k >= 3000),
        "{n:?}"
    );
    let h = c.cmd(&[b"HGETALL", key_name(0).as_bytes()]).unwrap().into_array();
    assert_eq!(h.len(), 20, "10 fields and their values");
    drop(server);
}
