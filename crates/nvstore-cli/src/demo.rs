//! `nvstore demo`: the first thing a new user runs.
//!
//! Opens (creating if missing) a pool in the working directory, inserts N
//! random 8-byte keys with 8-byte values, reads them all back, runs a range
//! scan, deletes a tenth, runs `check`, closes cleanly and reopens to show
//! instant recovery. Every step is verified against an in-memory model that
//! starts from whatever the pool already held; any mismatch exits 1.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use nvstore::pmem::Counters;
use nvstore::{Db, Options, RecoveryKind};
use rand::{Rng, SeedableRng};

use crate::escape::escape;
use crate::units::fmt_bytes;
use crate::{lib_err, CmdResult, Fail};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Pool file (created with default options if missing; an existing pool keeps its keys).
    #[arg(long, default_value = "./nvstore.nvs")]
    pool: PathBuf,
    /// Number of random 8-byte keys to insert.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Random seed (default: a fresh one each run).
    #[arg(long)]
    seed: Option<u64>,
}

fn rate(n: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    let r = n as f64 / secs;
    if r >= 1e6 {
        format!("{:.2} M ops/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} K ops/s", r / 1e3)
    } else {
        format!("{r:.0} ops/s")
    }
}

fn fail(step: &str, what: String) -> Fail {
    Fail::negative(format!("demo FAILED at {step}: {what}"))
}

fn hex(k: &[u8]) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn run(a: DemoArgs) -> CmdResult {
    let p = &a.pool;
    let n = a.keys as usize;
    let seed = a.seed.unwrap_or_else(rand::random);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let existed = p.exists();

    println!(
        "nvstore demo: {} random 8-byte keys with 8-byte values, seed {seed}",
        a.keys
    );
    let t = Instant::now();
    let db = Db::open(p, Options::default()).map_err(lib_err(p))?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let st = db.stat();
    println!(
        "  open     {} {}: {}, leaf {}, node {} B, mapping {}, flush {} ({open_ms:.1} ms)",
        if existed {
            "opened existing pool"
        } else {
            "created pool"
        },
        p.display(),
        fmt_bytes(st.size_bytes),
        st.leaf_format,
        st.node_size,
        st.mapping,
        st.flush,
    );

    // The model starts from what the pool already holds.
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = db.iter().collect();
    if existed {
        println!(
            "           the pool already holds {} keys; they are kept and verified too",
            model.len()
        );
    }
    if model.len() as u64 != db.len() {
        return Err(fail(
            "open",
            format!("the pool reports {} keys but iteration found {}", db.len(), model.len()),
        ));
    }

    // Distinct new keys, not already in the pool.
    let mut seen = HashSet::with_capacity(n);
    let mut pairs: Vec<([u8; 8], [u8; 8])> = Vec::with_capacity(n);
    while pairs.len() < n {
        let k: [u8; 8] = rng.gen();
        if model.contains_key(&k[..]) || !seen.insert(k) {
            continue;
        }
        pairs.push((k, rng.gen()));
    }

    // put
    let c0 = Counters::sum();
    let t = Instant::now();
    for (k, v) in &pairs {
        db.put(k, v).map_err(lib_err(p))?;
    }
    let put_s = t.elapsed().as_secs_f64();
    let c = Counters::sum().since(c0);
    for (k, v) in &pairs {
        model.insert(k.to_vec(), v.to_vec());
    }
    let per = |x: u64| if n == 0 { 0.0 } else { x as f64 / n as f64 };
    println!(
        "  put      {n} keys in {put_s:.3} s  {:>14}  {:.2} flushes/put, {:.2} fences/put",
        rate(n as u64, put_s),
        per(c.flushes),
        per(c.fences),
    );

    // get
    let t = Instant::now();
    let mut wrong = 0u64;
    let mut first_wrong = None;
    for (k, v) in &pairs {
        let got = db.get(k).map_err(lib_err(p))?;
        if got.as_deref() != Some(&v[..]) {
            wrong += 1;
            first_wrong.get_or_insert_with(|| (hex(k), got.map(|g| hex(&g))));
        }
    }
    let get_s = t.elapsed().as_secs_f64();
    if let Some((k, got)) = first_wrong {
        return Err(fail(
            "get",
            format!("{wrong} keys read back wrong; first: key {k} gave {got:?}"),
        ));
    }
    println!(
        "  get      {n} keys in {get_s:.3} s  {:>14}  every value verified",
        rate(n as u64, get_s)
    );

    // range scan over about a tenth of the key space, then a full scan
    let mut sorted: Vec<&[u8; 8]> = pairs.iter().map(|(k, _)| k).collect();
    sorted.sort();
    if !sorted.is_empty() {
        let lo = sorted[sorted.len() / 4].to_vec();
        let hi = sorted[(sorted.len() / 4 + sorted.len() / 10).min(sorted.len() - 1)].to_vec();
        let t = Instant::now();
        let got: Vec<(Vec<u8>, Vec<u8>)> = db.range(lo.clone()..=hi.clone()).collect();
        let scan_s = t.elapsed().as_secs_f64();
        let want: Vec<(Vec<u8>, Vec<u8>)> = model
            .range(lo.clone()..=hi.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if got != want {
            return Err(fail(
                "scan",
                format!(
                    "range [{}, {}] returned {} pairs, expected {}",
                    escape(&lo),
                    escape(&hi),
                    got.len(),
                    want.len()
                ),
            ));
        }
        println!(
            "  scan     {} pairs in {:.3} s  {:>14}  range [{}, {}] matches the model",
            got.len(),
            scan_s,
            rate(got.len() as u64, scan_s),
            hex(&lo),
            hex(&hi)
        );
    }

    // delete a tenth
    let ndel = n / 10;
    let t = Instant::now();
    for (k, _) in &pairs[..ndel] {
        if !db.delete(k).map_err(lib_err(p))? {
            return Err(fail("delete", format!("key {} was reported absent", hex(k))));
        }
    }
    let del_s = t.elapsed().as_secs_f64();
    for (k, _) in &pairs[..ndel] {
        model.remove(&k[..]);
        if db.get(k).map_err(lib_err(p))?.is_some() {
            return Err(fail("delete", format!("deleted key {} is still there", hex(k))));
        }
    }
    let all: Vec<(Vec<u8>, Vec<u8>)> = db.iter().collect();
    if all.len() != model.len() || all.iter().zip(&model).any(|(a, (k, v))| a.0 != *k || a.1 != *v) {
        return Err(fail(
            "delete",
            format!(
                "a full scan found {} pairs, expected {} (or different contents)",
                all.len(),
                model.len()
            ),
        ));
    }
    println!(
        "  delete   {ndel} keys in {del_s:.3} s  {:>14}  gone; a full scan of {} pairs matches the model",
        rate(ndel as u64, del_s),
        all.len()
    );
    drop(all);

    // check
    let t = Instant::now();
    let r = db.check();
    let check_s = t.elapsed().as_secs_f64();
    if !r.ok {
        return Err(fail(
            "check",
            format!(
                "{} problems; first: {}",
                r.problems.len(),
                r.problems.first().map_or("?", |s| s.as_str())
            ),
        ));
    }
    if r.keys != model.len() as u64 {
        return Err(fail(
            "check",
            format!("check counted {} keys, expected {}", r.keys, model.len()),
        ));
    }
    println!(
        "  check    ok in {check_s:.3} s: {} keys, {} leaves, {} elements, {} used",
        r.keys,
        r.leaves,
        r.elements,
        fmt_bytes(r.used_bytes)
    );

    // clean close, reopen
    let t = Instant::now();
    db.close().map_err(lib_err(p))?;
    println!("  close    clean shutdown in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let t = Instant::now();
    let db = Db::open(
        p,
        Options {
            create: false,
            ..Options::default()
        },
    )
    .map_err(lib_err(p))?;
    let reopen_ms = t.elapsed().as_secs_f64() * 1e3;
    let rec = db.recovery();
    let st = db.stat();
    if rec.kind != RecoveryKind::Instant {
        return Err(fail(
            "reopen",
            format!("expected instant recovery after a clean close, got {:?}", rec.kind),
        ));
    }
    if db.len() != model.len() as u64 {
        return Err(fail(
            "reopen",
            format!("{} keys after reopening, expected {}", db.len(), model.len()),
        ));
    }
    let sample = 1000.min(pairs.len());
    for _ in 0..sample {
        let (k, _) = &pairs[rng.gen_range(0..pairs.len())];
        let want = model.get(&k[..]).map(|v| v.as_slice());
        let got = db.get(k).map_err(lib_err(p))?;
        if got.as_deref() != want {
            return Err(fail(
                "reopen",
                format!(
                    "key {} reads {:?} after reopening, expected {:?}",
                    hex(k),
                    got.map(|g| hex(&g)),
                    want.map(hex)
                ),
            ));
        }
    }
    println!(
        "  reopen   {} recovery in {:.3} ms (open took {reopen_ms:.1} ms): {} keys, {} leaves; {sample} sampled keys verified",
        format!("{:?}", rec.kind).to_lowercase(),
        rec.millis,
        st.keys,
        st.leaves
    );
    db.close().map_err(lib_err(p))?;

    println!(
        "demo passed: {} keys in {} ({} used); inspect it with `nvstore stat {}`",
        model.len(),
        p.display(),
        fmt_bytes(st.used_bytes),
        p.display()
    );
    if st.mapping == "shared" {
        println!(
            "note: mapping 'shared' (no DAX file system here): every write survives a process crash; \
             surviving power loss needs persistent memory with DAX"
        );
    }
    Ok(())
}
