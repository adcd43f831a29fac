//! AsymNVM recovery with real processes (AsymNVM §7, cases 1–3), loopback only,
//! bounded in count and time: a back-end process (`nvstore backend`) and
//! writer front-ends are killed with SIGKILL, restarted, recovered; every
//! acknowledged operation must then be present exactly once.
//!
//! The writer front-end process is this test binary run again with
//! `ASYM_KILL_CHILD` set (see `writer_child`): it pushes keys 0, 1, 2, … to
//! a queue in rcb mode and prints `acked N` after each acknowledgement.

mod server_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvstore_asym::structures::{recover, Queue};
use nvstore_asym::{Mode, Remote, RemoteOptions, TcpTransport};
use server_support::backend;

const OWNER: u64 = 77;

fn opts() -> RemoteOptions {
    RemoteOptions {
        mode: Mode::Rcb,
        batch: 16,
        owner: OWNER,
        ..RemoteOptions::default()
    }
}

fn connect(addr: SocketAddr) -> Remote {
    Remote::open(TcpTransport::connect(addr).unwrap(), opts()).unwrap()
}

/// Recovers the queue as the restarted writer and returns its keys.
fn recovered_keys(addr: SocketAddr) -> Vec<u64> {
    let mut r = connect(addr);
    let mut q = Queue::open(&mut r, "q").unwrap();
    recover(&mut r, &mut q).unwrap();
    let keys = q.items(&mut r).unwrap().into_iter().map(|x| x.0).collect();
    r.close().unwrap();
    keys
}

/// Keys must be 0..m in order with m >= acked: no acknowledged push lost,
/// none applied twice, nothing invented.
fn assert_exactly_once(keys: &[u64], acked: u64, what: &str) {
    let m = keys.len() as u64;
    assert!(m >= acked, "{what}: {acked} pushes acknowledged, {m} present");
    assert!(
        keys.iter().copied().eq(0..m),
        "{what}: keys are not 0..{m} in order: {keys:?}"
    );
}

#[test]
fn writer_child() {
    let Ok(addr) = std::env::var("ASYM_KILL_CHILD") else {
        return;
    };
    let mut r = connect(addr.parse().unwrap());
    let mut q = Queue::open(&mut r, "q").unwrap();
    recover(&mut r, &mut q).unwrap();
    let start = q.len(&mut r).unwrap();
    for i in start..start + 100_000 {
        q.enqueue(&mut r, i, &[1; 64]).unwrap();
        println!("acked {}", i + 1);
    }
}

/// Runs a writer process until it has acknowledged at least `n` pushes
/// (counted from the start of the queue), then SIGKILLs it; returns the
/// highest acknowledged count it printed.
fn run_writer_and_kill(addr: SocketAddr, n: u64) -> u64 {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new(exe)
        .args(["--exact", "writer_child", "--nocapture", "--test-threads", "1"])
        .env("ASYM_KILL_CHILD", addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = 0;
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    while acked < n && Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(v) = l.strip_prefix("acked ") {
                    acked = v.trim().parse().unwrap();
                }
            }
            _ => break,
        }
    }
    c.kill().unwrap();
    c.wait().unwrap();
    // Lines written before the kill are still in the pipe.
    for l in lines.map_while(Result::ok) {
        if let Some(v) = l.strip_prefix("acked ") {
            acked = v.trim().parse().unwrap();
        }
    }
    assert!(acked >= n, "writer acknowledged only {acked} of {n} pushes in time");
    acked
}

#[test]
fn killed_writers_and_back_ends_lose_no_acknowledged_operation() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("asym.pool");
    let (mut be, addr) = backend(&pool);

    // Case 2: the writer front-end dies with buffered memory logs (batch 16,
    // so almost every kill leaves op logs a transaction does not cover).
    for n in [5, 40, 77] {
        let acked = run_writer_and_kill(addr, recovered_keys(addr).len() as u64 + n);
        eprintln!("writer killed after {acked} acknowledged pushes");
        assert_exactly_once(&recovered_keys(addr), acked, &format!("writer killed after {acked}"));
    }

    // Case 1: a reader that dies mid-read leaves nothing to repair: the
    // naming space still leads a new reader to the same data.
    let before = recovered_keys(addr);
    {
        let mut reader = connect(addr);
        let q = Queue::open(&mut reader, "q").unwrap();
        assert_eq!(q.len(&mut reader).unwrap(), before.len() as u64);
    }
    assert_eq!(recovered_keys(addr), before);

    // Case 3: the back-end process dies, between and inside transactions,
    // while this process writes; it restarts on the same pool (a new port).
    let mut addr = addr;
    for round in 0..3u64 {
        let acked = Arc::new(AtomicU64::new(0));
        let a2 = acked.clone();
        let writer = std::thread::spawn(move || {
            let mut r = connect(addr);
            let mut q = Queue::open(&mut r, "q").unwrap();
            recover(&mut r, &mut q).unwrap();
            let start = q.len(&mut r).unwrap();
            a2.store(start, Ordering::SeqCst);
            for i in start.. {
                if q.enqueue(&mut r, i, &[2; 64]).is_err() {
                    return;
                }
                a2.store(i + 1, Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(30 + 37 * round));
        be.kill().unwrap();
        be.wait().unwrap();
        writer.join().unwrap();
        let n = acked.load(Ordering::SeqCst);
        eprintln!("round {round}: back-end killed after {n} acknowledged pushes");
        let (b2, a) = backend(&pool);
        (be, addr) = (b2, a);
        assert_exactly_once(&recovered_keys(addr), n, &format!("back-end killed in round {round}"));
    }
    be.kill().unwrap();
    be.wait().unwrap();
}
