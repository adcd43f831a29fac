//! `nvstore load` killed with SIGKILL at random moments leaves a pool that
//! passes `check` and holds exactly a prefix of the input: each record is
//! durable before the next one is stored.

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

const RECORDS: usize = 200_000;
const SEED: u64 = 0x6b11_10ad;

fn nvstore() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nvstore"))
}

/// Records in key order (zero-padded index), in the `dump` format; values
/// mix short inline ones, escaped bytes and longer ones that need blobs.
fn input() -> Vec<u8> {
    let mut s = String::with_capacity(RECORDS * 40);
    for i in 0..RECORDS {
        match i % 3 {
            0 => s.push_str(&format!("{i:08}\tv{i}\n")),
            1 => s.push_str(&format!("{i:08}\tval\\t{i}\\n\\x00\\xff\n")),
            _ => s.push_str(&format!("{i:08}\t{}\n", "x".repeat(40 + i % 60))),
        }
    }
    s.into_bytes()
}

fn run_ok(args: &[&OsStr]) -> Vec<u8> {
    let o = nvstore().args(args).output().unwrap();
    assert!(
        o.status.success(),
        "nvstore {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// Checks the pool and returns how many input records it holds (a prefix).
fn verify_prefix(pool: &Path, input: &[u8]) -> usize {
    let check = run_ok(&[OsStr::new("check"), pool.as_os_str(), OsStr::new("--json")]);
    let v: serde_json::Value = serde_json::from_slice(&check).unwrap();
    assert_eq!(v["ok"], true, "check after kill: {v}");
    let dump = run_ok(&[OsStr::new("dump"), pool.as_os_str()]);
    assert!(dump.len() <= input.len(), "dump is longer than the input");
    assert!(
        dump[..] == input[..dump.len()],
        "dump is not a prefix of the input (first difference at byte {})",
        dump.iter().zip(input).position(|(a, b)| a != b).unwrap_or(dump.len())
    );
    assert!(dump.is_empty() || dump.last() == Some(&b'\n'));
    let k = dump.iter().filter(|&&b| b == b'\n').count();
    assert_eq!(v["keys"], k as u64, "check's key count differs from the dump");
    k
}

#[test]
fn killed_load_leaves_exactly_a_prefix() {
    let dir = tempfile::Builder::new()
        .prefix("nvstore-kill-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let data = input();
    let inp = dir.path().join("input.tsv");
    std::fs::write(&inp, &data).unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let started = Instant::now();
    // Estimated duration of a whole load; halved whenever a load finishes
    // before its kill, so the kills land mid-load on fast machines too.
    let mut est_ms = 1500.0f64;
    let mut killed = 0;
    let mut partial = 0;
    for round in 0..12 {
        if killed >= 4 || started.elapsed() > Duration::from_secs(20) {
            break;
        }
        let pool = dir.path().join(format!("round{round}.nvs"));
        run_ok(&[OsStr::new("create"), pool.as_os_str()]);
        let delay = Duration::from_secs_f64(est_ms * rng.gen_range(0.05..0.9) / 1e3);
        let mut child = nvstore()
            .args([OsStr::new("load"), pool.as_os_str(), inp.as_os_str()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // SIGKILL (std's `Child::kill` on Unix); the child has not been waited for.
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        let was_killed = out.status.signal() == Some(libc::SIGKILL);
        if !was_killed {
            assert!(
                out.status.success(),
                "load failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            est_ms /= 2.0;
        }
        let k = verify_prefix(&pool, &data);
        eprintln!(
            "round {round} (seed {SEED:#x}): {} after {:?}: {k} of {RECORDS} records",
            if was_killed { "killed" } else { "finished" },
            delay
        );
        if was_killed {
            killed += 1;
            if k > 0 && k < RECORDS {
                partial += 1;
            }
            // Loading more into the recovered pool continues the prefix.
            if round == 0 {
                let out = run_ok(&[OsStr::new("load"), pool.as_os_str(), inp.as_os_str()]);
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    format!("loaded {RECORDS} records into {}\n", pool.display())
                );
                assert_eq!(verify_prefix(&pool, &data), RECORDS);
            }
        } else {
            assert_eq!(k, RECORDS);
        }
        std::fs::remove_file(&pool).unwrap();
    }
    assert!(killed >= 2, "only {killed} loads were killed mid-way");
    assert!(partial >= 1, "no kill left a partial load");
}
