//! Real process-kill tests (README, "How crash safety is shown"): `kill -9` at random moments against
//! a writer that logs what was acknowledged.
//!
//! The test binary re-executes itself (`--exact kill_child_entry`) with
//! `NVSTORE_KILL_CHILD=<pool>:<log dir>:<threads>:<seed>:<round>` set, so
//! the child runs a writer loop on a `FileSpace` pool (under `/dev/shm`
//! where it exists): each writer thread owns a disjoint key set and appends
//! to its own log `B <op>` before an operation and `A` once it returned
//! (acknowledged). The parent SIGKILLs the child after a seeded random
//! delay, reopens the pool, runs `check()` and verifies every key: its value
//! is the one of its last acknowledged operation, or of the one operation
//! that was in flight on that thread. Twelve rounds share one pool (kill,
//! reopen, write on); three of them kill the child while it recovers a large
//! pool (60k keys in over ten thousand 256-byte leaves). The parent
//! alternates read-only verification (the pool stays crashed, so the next
//! child rebuilds) with a writable open and clean close (the next child
//! recovers instantly).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvstore::{Db, LeafKind, Options};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "NVSTORE_KILL_CHILD";
/// Keys per writer thread.
const KEYS: u32 = 600;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts() -> Options {
    Options {
        node_size: 256,
        size: 4 << 20,
        ..Options::default()
    }
}

fn key(t: usize, n: u32) -> Vec<u8> {
    if n.is_multiple_of(5) {
        // Long key: lives in a blob.
        format!("t{t}/{n:05}/a-long-key-suffix").into_bytes()
    } else {
        format!("t{t}/{n:05}").into_bytes()
    }
}

/// Deterministic value bytes of length `len` for tag `tag`.
fn value(len: usize, tag: u64) -> Vec<u8> {
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Put { key: Vec<u8>, len: usize, tag: u64 },
    Del { key: Vec<u8> },
}

impl Op {
    fn key(&self) -> &[u8] {
        match self {
            Op::Put { key, .. } | Op::Del { key } => key,
        }
    }

    fn encode(&self) -> String {
        let hex = |k: &[u8]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
        match self {
            Op::Put { key, len, tag } => format!("B P {} {len} {tag}\n", hex(key)),
            Op::Del { key } => format!("B D {}\n", hex(key)),
        }
    }

    fn decode(line: &str) -> Option<Op> {
        let unhex = |s: &str| -> Option<Vec<u8>> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
                .collect()
        };
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["B", "P", k, len, tag] => Some(Op::Put {
                key: unhex(k)?,
                len: len.parse().ok()?,
                tag: tag.parse().ok()?,
            }),
            ["B", "D", k] => Some(Op::Del { key: unhex(k)? }),
            _ => None,
        }
    }

    fn apply(&self, m: &mut Model) {
        match self {
            Op::Put { key, len, tag } => {
                m.insert(key.clone(), value(*len, *tag));
            }
            Op::Del { key } => {
                m.remove(key);
            }
        }
    }
}

fn gen_op(rng: &mut StdRng, t: usize, tag: u64) -> Op {
    let key = key(t, rng.gen_range(0..KEYS));
    if rng.gen_bool(0.35) {
        return Op::Del { key };
    }
    let r = rng.gen_range(0..100);
    let len = match r {
        0..60 => rng.gen_range(0..=8),
        60..90 => rng.gen_range(9..200),
        90..98 => rng.gen_range(200..3000),
        98 => rng.gen_range(15_000..25_000),
        _ => rng.gen_range(66_000..80_000),
    };
    Op::Put { key, len, tag }
}

fn log_path(dir: &Path, t: usize) -> PathBuf {
    dir.join(format!("writer-{t}.log"))
}

fn status_path(dir: &Path) -> PathBuf {
    dir.join("status")
}

/// The child: recover the pool, then write until killed.
#[test]
fn kill_child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // run as an ordinary test: nothing to do
    };
    let f: Vec<&str> = spec.split(':').collect();
    let [pool, dir, threads, seed, round] = f.as_slice() else {
        panic!("bad {CHILD_ENV}={spec}");
    };
    let (pool, dir) = (PathBuf::from(pool), PathBuf::from(dir));
    let threads: usize = threads.parse().unwrap();
    let seed: u64 = seed.parse().unwrap();
    let round: u64 = round.parse().unwrap();
    let mut status = OpenOptions::new()
        .create(true)
        .append(true)
        .open(status_path(&dir))
        .unwrap();
    status.write_all(b"opening\n").unwrap();
    let db = Db::open(&pool, opts()).expect("child: open pool");
    status.write_all(b"opened\n").unwrap();
    std::thread::scope(|sc| {
        for t in 0..threads {
            let db = &db;
            let dir = &dir;
            sc.spawn(move || {
                let mut log = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log_path(dir, t))
                    .unwrap();
                let mut rng = StdRng::seed_from_u64(seed ^ (round << 16) ^ (t as u64) << 8);
                for i in 0u64.. {
                    let op = gen_op(&mut rng, t, (round << 40) | ((t as u64) << 32) | i);
                    log.write_all(op.encode().as_bytes()).unwrap();
                    match &op {
                        Op::Put { key, len, tag } => db.put(key, &value(*len, *tag)).unwrap(),
                        Op::Del { key } => {
                            db.delete(key).unwrap();
                        }
                    }
                    log.write_all(b"A\n").unwrap();
                }
            });
        }
    });
    unreachable!("writers run until killed");
}

/// Acknowledged ops (applied to `model`) and the op in flight, per log.
fn replay(dir: &Path, threads: usize, model: &mut Model) -> (Vec<Op>, usize) {
    let mut inflight = Vec::new();
    let mut acked = 0;
    for t in 0..threads {
        let Ok(f) = File::open(log_path(dir, t)) else { continue };
        let mut text = String::new();
        let mut r = BufReader::new(f);
        let mut pending: Option<Op> = None;
        loop {
            text.clear();
            if r.read_line(&mut text).unwrap() == 0 || !text.ends_with('\n') {
                break; // end, or a line cut by the kill (never acknowledged)
            }
            let line = text.trim_end();
            if line == "A" {
                pending.take().expect("A without B").apply(model);
                acked += 1;
            } else {
                assert!(pending.is_none(), "B without A in log of writer {t}");
                pending = Some(Op::decode(line).unwrap_or_else(|| panic!("bad log line {line:?}")));
            }
        }
        inflight.extend(pending);
        // The next round starts a fresh log.
        std::fs::remove_file(log_path(dir, t)).unwrap();
    }
    (inflight, acked)
}

/// Opens the pool after a kill and checks it against `model` (acknowledged
/// ops applied) and the ops in flight; returns the pool's actual contents.
fn verify(pool: &Path, model: &Model, inflight: &[Op], read_only: bool, what: &str) -> Model {
    let db = Db::open(
        pool,
        Options {
            read_only,
            create: false,
            ..opts()
        },
    )
    .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    let r = db.check();
    assert!(r.ok, "{what}: check failed: {:?}", r.problems);
    let got: Model = db.iter().collect();
    assert_eq!(db.len(), got.len() as u64, "{what}: len() disagrees with a scan");
    let mut keys: Vec<&Vec<u8>> = got.keys().chain(model.keys()).collect();
    let extra: Vec<Vec<u8>> = inflight.iter().map(|o| o.key().to_vec()).collect();
    keys.extend(extra.iter());
    keys.sort();
    keys.dedup();
    for k in keys {
        let have = got.get(k);
        assert_eq!(db.get(k).unwrap().as_ref(), have, "{what}: get disagrees with a scan");
        let acked = model.get(k);
        if have == acked {
            continue;
        }
        // Only the op in flight on this key may differ from the acked state.
        let fly = inflight.iter().find(|o| o.key() == k.as_slice());
        let ok = match fly {
            Some(Op::Put { len, tag, .. }) => have == Some(&value(*len, *tag)),
            Some(Op::Del { .. }) => have.is_none(),
            None => false,
        };
        assert!(
            ok,
            "{what}: key {:?}: pool has {:?} B, last acknowledged op gives {:?} B, in flight {:?}",
            String::from_utf8_lossy(k),
            have.map(|v| v.len()),
            acked.map(|v| v.len()),
            fly
        );
    }
    if !read_only {
        db.close().unwrap();
    }
    got
}

fn spawn_child(pool: &Path, dir: &Path, threads: usize, seed: u64, round: u64) -> Child {
    let exe = std::env::current_exe().unwrap();
    let spec = format!("{}:{}:{threads}:{seed}:{round}", pool.display(), dir.display());
    Command::new(exe)
        .args(["--exact", "kill_child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child")
}

fn sigkill(child: &mut Child) {
    // `Child::kill` sends SIGKILL on Unix.
    child.kill().expect("kill failed");
    child.wait().unwrap();
}

fn status(dir: &Path) -> String {
    std::fs::read_to_string(status_path(dir)).unwrap_or_default()
}

fn shm_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Rounds of kill, verify, write on; `threads` writers in the child.
fn campaign(threads: usize, seed: u64) {
    campaign_on(threads, seed, LeafKind::Nv)
}

/// The campaign on a pool of leaf format `leaf` (the parent creates the
/// pool; every child opens it with the format its header records).
fn campaign_on(threads: usize, seed: u64, leaf: LeafKind) {
    let started = Instant::now();
    let tmp = shm_dir();
    let pool = tmp.path().join("kill.nvs");
    let dir = tmp.path().to_path_buf();
    let mut rng = StdRng::seed_from_u64(seed);
    // A large pool, so that recovering it takes a moment: bulk keys of
    // their own, never touched by the writers.
    let mut model = Model::new();
    {
        let db = Db::open(&pool, Options { leaf, ..opts() }).unwrap();
        assert_eq!(db.leaf_format(), leaf);
        // Random order: ascending inserts would split the last leaf every
        // third insert and overflow the last PLN every few dozen splits.
        let mut ids: Vec<u32> = (0..60_000).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.gen_range(0..=i));
        }
        let tb = Instant::now();
        for i in ids {
            let k = format!("bulk/{i:07}").into_bytes();
            let v = value(i as usize % 12, i as u64);
            db.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        db.close().unwrap();
        if std::env::var("NVSTORE_KILL_DEBUG").is_ok() {
            eprintln!("bulk load {:.2}s, stat {:?}", tb.elapsed().as_secs_f64(), ());
        }
    }
    let mut recovery_kills = 0;
    let mut acked_total = 0;
    let rounds = 12u64;
    let recovery_round = |r: u64| r > 0 && r.is_multiple_of(3);
    for round in 0..rounds {
        // Rounds 3, 6 and 9: kill while the child recovers. The pool is
        // crashed from the round before and verified read-only, so the
        // child rebuilds it from its leaves; a kill that lands after
        // recovery is an ordinary round and the next attempt kills sooner.
        let kill_in_recovery = recovery_round(round);
        for attempt in 0..if kill_in_recovery { 6 } else { 1 } {
            let _ = std::fs::remove_file(status_path(&dir));
            let mut child = spawn_child(&pool, &dir, threads, seed, round * 8 + attempt);
            let wait_for = if kill_in_recovery { "opening" } else { "opened" };
            let t0 = Instant::now();
            while !status(&dir).contains(wait_for) {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "child never got to {wait_for:?}"
                );
                std::thread::sleep(Duration::from_micros(100));
            }
            if kill_in_recovery {
                std::thread::sleep(Duration::from_micros(rng.gen_range(0..2000) >> attempt));
            } else {
                std::thread::sleep(Duration::from_millis(rng.gen_range(20..250)));
            }
            sigkill(&mut child);
            let opened = status(&dir).contains("opened");
            if kill_in_recovery && !opened {
                recovery_kills += 1;
            }
            let (inflight, acked) = replay(&dir, threads, &mut model);
            acked_total += acked;
            // Alternate read-only verification (the pool stays crashed, the
            // next child rebuilds) and a writable open with a clean close
            // (the next child recovers instantly); read-only before and
            // during the recovery-kill rounds.
            let retry = kill_in_recovery && opened;
            let read_only = round % 2 == 0 || recovery_round(round + 1) || retry;
            let what = format!("{threads} thread(s), round {round}.{attempt}");
            let tv = Instant::now();
            model = verify(&pool, &model, &inflight, read_only, &what);
            if std::env::var("NVSTORE_KILL_DEBUG").is_ok() {
                eprintln!(
                    "{what}: acked {acked} opened {opened} verify {:.2}s total {:.2}s",
                    tv.elapsed().as_secs_f64(),
                    started.elapsed().as_secs_f64()
                );
            }
            if !retry {
                break;
            }
        }
    }
    eprintln!(
        "kill test: {threads} thread(s), {rounds} rounds, {acked_total} acknowledged ops, \
         {recovery_kills} kill(s) during recovery, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(acked_total > 100, "the writers barely ran: {acked_total} ops");
    assert!(recovery_kills >= 1, "no kill landed while the child was recovering");
}

#[test]
fn kill9_one_writer() {
    campaign(1, 7);
}

#[test]
fn kill9_two_writers() {
    campaign(2, 8);
}

#[test]
fn kill9_two_writers_isle() {
    campaign_on(2, 9, LeafKind::Isle);
}
