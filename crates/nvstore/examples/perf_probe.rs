//! A quick throughput probe: `cargo run --release --example perf_probe -- N NODE_SIZE`.
//! Not a benchmark (those live in `nvstore bench`); a smoke check for regressions.
use nvstore::{Db, Options};
use std::time::Instant;
fn main() {
    let n: u64 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(1_000_000);
    let ns: u32 = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(1024);
    let p = std::env::temp_dir().join("perf_probe.nvs");
    let p = if std::path::Path::new("/dev/shm").exists() {
        "/dev/shm/perf_probe.nvs".into()
    } else {
        p
    };
    let _ = std::fs::remove_file(&p);
    let db = Db::open(
        &p,
        Options {
            node_size: ns,
            size: 256 << 20,
            ..Options::default()
        },
    )
    .unwrap();
    let sequential = std::env::var("SEQUENTIAL").is_ok();
    let mut keys: Vec<u64> = (0..n)
        .map(|i| {
            if sequential {
                i
            } else {
                i.wrapping_mul(0x9e3779b97f4a7c15)
            }
        })
        .collect();
    let c0 = nvstore::pmem::Counters::sum();
    let t = Instant::now();
    for &k in &keys {
        db.put(&k.to_be_bytes(), &k.to_le_bytes()).unwrap();
    }
    let ins = t.elapsed();
    let c1 = nvstore::pmem::Counters::sum().since(c0);
    keys.reverse();
    let t = Instant::now();
    for &k in &keys {
        assert!(db.get(&k.to_be_bytes()).unwrap().is_some());
    }
    let get = t.elapsed();
    let t = Instant::now();
    let scans: u64 = std::env::var("SCANS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut got = 0;
    for i in 0..scans {
        let start = keys[(i as usize * 7919) % keys.len()].to_be_bytes().to_vec();
        got += db.range(start..).take(100).count();
    }
    let sc = t.elapsed();
    println!(
        "scan of 100: {:.1} us each ({got} pairs)",
        sc.as_secs_f64() * 1e6 / scans as f64
    );
    // Narrow scans (a hash's fields, a prefix): 16 consecutive keys.
    let t = Instant::now();
    let mut got = 0;
    for i in 0..scans {
        let k = keys[(i as usize * 7919) % keys.len()];
        got += db
            .range(k.to_be_bytes().to_vec()..(k.saturating_add(1 << 48)).to_be_bytes().to_vec())
            .take(16)
            .count();
    }
    println!(
        "narrow scan (<=16): {:.1} us each ({got} pairs)",
        t.elapsed().as_secs_f64() * 1e6 / scans as f64
    );
    let st = db.stat();
    println!(
        "n={n} node={ns}: insert {:.0} ops/s ({:.2} flushes/op), get {:.0} ops/s, leaves {}, rebuilds {} ({:.1} ms)",
        n as f64 / ins.as_secs_f64(),
        c1.flushes as f64 / n as f64,
        n as f64 / get.as_secs_f64(),
        st.leaves,
        st.rebuilds,
        st.rebuild_ms
    );
    let t = Instant::now();
    drop(db);
    let close = t.elapsed();
    let t = Instant::now();
    let db = Db::open(&p, Options::default()).unwrap();
    println!("clean close {close:?}, reopen {:?} ({:?})", t.elapsed(), db.recovery());
    std::mem::forget(db); // simulate a crash: no clean shutdown
    let _ = std::fs::remove_file(&p);
}

#[allow(dead_code)]
fn scan_probe() {}
