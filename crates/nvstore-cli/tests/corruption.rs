//! Corruption campaign: seeded damage (bit flips, junk blocks, zeroed
//! blocks, truncations) of populated nv, isle and transaction pools, each
//! copy run through the real `nvstore` binary: `stat` (open), `check`,
//! `get`, `scan`, `dump`, `salvage` and `put`. A command may refuse the
//! pool (exit 1 or 2 with a message) or answer; it may never end by a
//! signal, a panic (exit 101) or a timeout.
//!
//! `NVSTORE_CORRUPT_VARIANTS` sets the number of damaged copies (default
//! small, for `cargo test`); `NVSTORE_BIN` runs another binary (CI points
//! it at the release build and asks for a few thousand variants);
//! `NVSTORE_CORRUPT_SEED` moves the seeds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvstore::{Db, LeafKind, Options};
use rand::{Rng, SeedableRng};

/// Longest any one command may take on a damaged 2 MiB pool.
const LIMIT: Duration = Duration::from_secs(20);

fn bin() -> PathBuf {
    std::env::var_os("NVSTORE_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nvstore")), PathBuf::from)
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-corrupt-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::Builder::new().prefix("nvstore-corrupt-").tempdir())
        .expect("temporary directory")
}

fn key(i: u64) -> Vec<u8> {
    if i.is_multiple_of(7) {
        // Long keys live in blobs.
        format!("k{i:06}-with-a-long-tail").into_bytes()
    } else {
        format!("k{i:06}").into_bytes()
    }
}

fn value(i: u64) -> Vec<u8> {
    if i.is_multiple_of(3) {
        format!("v{i}").into_bytes()
    } else {
        format!("value-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes()
    }
}

/// A populated pool: `keys` pairs with inline and blob keys and values,
/// some updated and deleted, written with transactions when `txn`.
/// Returns the image after a clean close and the image of the same pool
/// while still open (what a crash leaves: recovery rebuilds from leaves).
fn populate(dir: &Path, name: &str, leaf: LeafKind, txn: bool, keys: u64) -> (Vec<u8>, Vec<u8>) {
    let path = dir.join(name);
    let opts = Options {
        create: true,
        size: 2 << 20,
        leaf,
        node_size: if leaf == LeafKind::Isle { 640 } else { 512 },
        ..Options::default()
    };
    let db = Db::open(&path, opts).expect("create pool");
    if txn {
        for chunk in (0..keys).collect::<Vec<_>>().chunks(16) {
            let mut t = db.begin().expect("begin");
            for &i in chunk {
                t.put(&key(i), &value(i)).expect("txn put");
            }
            t.commit().expect("commit");
        }
    } else {
        for i in 0..keys {
            db.put(&key(i), &value(i)).expect("put");
        }
    }
    for i in (0..keys).step_by(5) {
        db.put(&key(i), &value(i + 1)).expect("update");
    }
    for i in (0..keys).step_by(11) {
        db.delete(&key(i)).expect("delete");
    }
    db.sync().expect("sync");
    let crashed = std::fs::read(&path).expect("read open pool");
    db.close().expect("close");
    let clean = std::fs::read(&path).expect("read closed pool");
    std::fs::remove_file(&path).expect("remove");
    (clean, crashed)
}

/// The bytes in use: damage beyond them mostly hits free space.
fn used_len(img: &[u8]) -> usize {
    let last = img.iter().rposition(|&b| b != 0).unwrap_or(0);
    (last + 4096).min(img.len())
}

/// One seeded kind of damage applied to `img`; returns what it did.
fn damage(img: &mut Vec<u8>, rng: &mut rand::rngs::StdRng) -> String {
    let used = used_len(img);
    match rng.gen_range(0..5) {
        0 | 1 => {
            let n = rng.gen_range(1..=8);
            let mut at = Vec::new();
            for _ in 0..n {
                let byte = rng.gen_range(0..used);
                let bit = rng.gen_range(0..8);
                img[byte] ^= 1 << bit;
                at.push(byte);
            }
            format!("{n} bit flips at {at:?}")
        }
        2 => {
            let len = [8usize, 64, 512, 4096][rng.gen_range(0..4)];
            let off = rng.gen_range(0..used.saturating_sub(len).max(1));
            for b in &mut img[off..(off + len).min(used)] {
                *b = rng.gen();
            }
            format!("{len} junk bytes at {off}")
        }
        3 => {
            let len = [8usize, 64, 512, 4096][rng.gen_range(0..4)];
            let off = rng.gen_range(0..used.saturating_sub(len).max(1)) & !7;
            for b in &mut img[off..(off + len).min(used)] {
                *b = 0;
            }
            format!("{len} zero bytes at {off}")
        }
        _ => {
            let len = rng.gen_range(0..img.len());
            img.truncate(len);
            format!("truncated to {len} bytes")
        }
    }
}

/// Runs `args` with a time limit; `Err` describes a crash or a hang.
fn run(args: &[&std::ffi::OsStr]) -> Result<i32, String> {
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait().map_err(|e| format!("wait: {e}"))? {
            Some(st) => {
                use std::io::Read;
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return match st.code() {
                    Some(101) => Err(format!(
                        "panicked: {}",
                        err.lines().take(3).collect::<Vec<_>>().join(" | ")
                    )),
                    Some(c) => Ok(c),
                    None => {
                        use std::os::unix::process::ExitStatusExt;
                        Err(format!("killed by signal {:?}: {}", st.signal(), err.trim()))
                    }
                };
            }
            None if started.elapsed() > LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {LIMIT:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Every command on one damaged copy.
fn exercise(dir: &Path, img: &[u8]) -> Result<(), String> {
    let p = dir.join("pool.nvs");
    let out = dir.join("salvaged.nvs");
    let _ = std::fs::remove_file(&out);
    std::fs::write(&p, img).map_err(|e| e.to_string())?;
    let pool = p.as_os_str();
    let cmds: Vec<Vec<&std::ffi::OsStr>> = vec![
        vec!["stat".as_ref(), pool],
        vec!["check".as_ref(), pool],
        vec!["get".as_ref(), pool, "k001500".as_ref()],
        vec!["get".as_ref(), pool, "k000007-with-a-long-tail".as_ref()],
        vec!["scan".as_ref(), pool],
        vec![
            "scan".as_ref(),
            pool,
            "--reverse".as_ref(),
            "--limit".as_ref(),
            "500".as_ref(),
        ],
        vec!["dump".as_ref(), pool],
        vec!["salvage".as_ref(), pool, out.as_os_str()],
        vec!["put".as_ref(), pool, "k000001".as_ref(), "new".as_ref()],
        vec!["scan".as_ref(), pool],
    ];
    for c in cmds {
        run(&c).map_err(|e| format!("`nvstore {}`: {e}", c[0].to_string_lossy()))?;
    }
    Ok(())
}

#[test]
fn damaged_pools_never_crash_a_command() {
    let variants: usize = std::env::var("NVSTORE_CORRUPT_VARIANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let seed0: u64 = std::env::var("NVSTORE_CORRUPT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    // Which pools to damage: `NVSTORE_CORRUPT_KINDS=nv,isle,txn` (all by default).
    let kinds = std::env::var("NVSTORE_CORRUPT_KINDS").unwrap_or_else(|_| "nv,isle,txn".into());
    let kinds: Vec<&str> = kinds.split(',').map(str::trim).collect();
    let base = tmpdir();
    let mut images = Vec::new();
    for (name, leaf, txn) in [
        ("nv", LeafKind::Nv, false),
        ("isle", LeafKind::Isle, false),
        ("txn", LeafKind::Nv, true),
    ] {
        if !kinds.contains(&name) {
            continue;
        }
        let (clean, crashed) = populate(base.path(), name, leaf, txn, 3000);
        images.push((format!("{name} (clean)"), clean));
        images.push((format!("{name} (crashed)"), crashed));
    }
    // Undamaged images must pass every command, so a failure below is the damage's.
    let d = base.path().join("undamaged");
    std::fs::create_dir(&d).unwrap();
    for (name, img) in &images {
        exercise(&d, img).unwrap_or_else(|e| panic!("undamaged {name} pool: {e}"));
    }

    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    std::thread::scope(|sc| {
        for w in 0..workers {
            let (next, failures, images, base) = (&next, &failures, &images, base.path());
            sc.spawn(move || {
                let d = base.join(format!("w{w}"));
                std::fs::create_dir(&d).unwrap();
                loop {
                    let v = next.fetch_add(1, Ordering::Relaxed);
                    if v >= variants {
                        break;
                    }
                    let seed = seed0.wrapping_mul(1_000_003).wrapping_add(v as u64);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                    let (name, img) = &images[v % images.len()];
                    let mut img = img.clone();
                    let what = damage(&mut img, &mut rng);
                    if let Err(e) = exercise(&d, &img) {
                        let f = format!("seed {seed}, {name} pool, {what}: {e}");
                        eprintln!("{f}");
                        failures.lock().unwrap().push(f);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {variants} damaged pools crashed or hung a command:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
