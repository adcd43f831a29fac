//! Process-kill tests of transactions (NV-Tree §6.1.1; README, "How crash safety is shown"): `kill -9` a process
//! running bank transfers on several threads, then check that no transfer
//! is half there.
//!
//! The test binary re-executes itself (`--exact kill_txn_child_entry`) with
//! `NVSTORE_KILL_TXN_CHILD=<pool>:<log dir>:<seed>` set. Each child thread
//! runs transactions that move money between two accounts (in different
//! leaves, mostly) and store the thread's transfer number under its own
//! key, then logs the number once `commit` returned. After the kill the
//! parent reopens the pool (alternately read-only, and writable with a clean
//! close) and checks: the total over all accounts is unchanged, every
//! thread's stored transfer number is its last acknowledged one or the one
//! after it (in flight), `check()` passes. Rounds share one pool.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nvstore::{Db, Options, WriteBatch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "NVSTORE_KILL_TXN_CHILD";
const ACCOUNTS: u32 = 400;
const START: i64 = 1_000;
const THREADS: usize = 2;

fn opts() -> Options {
    Options {
        node_size: 256,
        size: 4 << 20,
        ..Options::default()
    }
}

fn account(i: u32) -> Vec<u8> {
    if i.is_multiple_of(3) {
        format!("acct/{i:05}/with-a-long-key").into_bytes()
    } else {
        format!("acct/{i:05}").into_bytes()
    }
}

fn seq_key(t: usize) -> Vec<u8> {
    format!("seq/{t}").into_bytes()
}

fn num(v: Option<Vec<u8>>) -> i64 {
    v.map_or(0, |v| i64::from_be_bytes(v.try_into().expect("8-byte number")))
}

fn log_path(dir: &Path, t: usize) -> PathBuf {
    dir.join(format!("acked-{t}.log"))
}

#[test]
fn kill_txn_child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let parts: Vec<&str> = spec.split(':').collect();
    let (pool, dir, seed) = (
        PathBuf::from(parts[0]),
        PathBuf::from(parts[1]),
        parts[2].parse::<u64>().unwrap(),
    );
    let db = Db::open(&pool, opts()).unwrap();
    if db.is_empty() {
        let mut b = WriteBatch::new();
        for i in 0..ACCOUNTS {
            b.put(&account(i), &START.to_be_bytes());
        }
        db.write_batch(b).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let db = &db;
            let dir = &dir;
            s.spawn(move || {
                let mut log = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log_path(dir, t))
                    .unwrap();
                let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) * 0x9E37_79B9));
                loop {
                    let (a, b) = (rng.gen_range(0..ACCOUNTS), rng.gen_range(0..ACCOUNTS));
                    if a == b {
                        continue;
                    }
                    let amount = rng.gen_range(1..100i64);
                    let n = db
                        .transaction(|tx| {
                            let n = num(tx.get(&seq_key(t))?) + 1;
                            let va = num(tx.get(&account(a))?);
                            let vb = num(tx.get(&account(b))?);
                            tx.put(&account(a), &(va - amount).to_be_bytes())?;
                            tx.put(&account(b), &(vb + amount).to_be_bytes())?;
                            tx.put(&seq_key(t), &n.to_be_bytes())?;
                            Ok(n)
                        })
                        .unwrap();
                    writeln!(log, "{n}").unwrap();
                }
            });
        }
    });
}

fn last_acked(dir: &Path, t: usize) -> i64 {
    let Ok(f) = File::open(log_path(dir, t)) else { return 0 };
    BufReader::new(f)
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| l.trim().parse::<i64>().ok())
        .last()
        .unwrap_or(0)
}

fn spawn_child(pool: &Path, dir: &Path, seed: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "kill_txn_child_entry", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, format!("{}:{}:{seed}", pool.display(), dir.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[test]
fn kill9_during_transfers_leaves_no_transfer_half_done() {
    let dir = tempfile::Builder::new()
        .prefix("nvstore-kill-txn")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let pool = dir.path().join("bank.nvs");
    let mut rng = StdRng::seed_from_u64(42);
    let want = START * ACCOUNTS as i64;
    let mut progress = 0;
    for round in 0..8u64 {
        let mut child = spawn_child(&pool, dir.path(), 1000 + round);
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..700)));
        kill9(&mut child);
        let read_only = round % 2 == 0;
        let db = Db::open(
            &pool,
            Options {
                read_only,
                create: false,
                ..opts()
            },
        )
        .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        let r = db.check();
        assert!(r.ok, "round {round}: check failed: {:?}", r.problems);
        let (mut sum, mut n) = (0i64, 0u32);
        for (_, v) in db.prefix(b"acct/") {
            sum += num(Some(v));
            n += 1;
        }
        if n > 0 {
            assert_eq!((sum, n), (want, ACCOUNTS), "round {round}: a transfer is half there");
        }
        for t in 0..THREADS {
            let acked = last_acked(dir.path(), t);
            let stored = num(db.get(&seq_key(t)).unwrap());
            assert!(
                stored == acked || stored == acked + 1,
                "round {round} thread {t}: stored transfer {stored}, last acknowledged {acked}"
            );
            progress += acked;
        }
        if read_only {
            drop(db);
        } else {
            db.close().unwrap();
        }
    }
    assert!(progress > 0, "no transfer was ever acknowledged");
}

/// SIGKILL without a shell: `Child::kill` sends SIGKILL on Unix.
fn kill9(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}
