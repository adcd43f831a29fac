//! Shared by the `nvstore serve` integration tests: start the real binary on
//! a free port with a pool under /dev/shm (and an AsymNVM back-end), a minimal
//! RESP client, and the rule for external tools (skip with a reason, or fail under
//! `NVSTORE_REQUIRE_TOOLS=1`, which CI sets).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn pool_dir() -> tempfile::TempDir {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    tempfile::Builder::new().prefix("nvs-serve-").tempdir_in(base).unwrap()
}

/// A running `nvstore serve`.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub pool: PathBuf,
    pub log: Arc<Mutex<String>>,
    /// The stderr reader: once it has finished (read to the end, the
    /// server exited), `log` holds every line.
    reader: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts `nvstore serve --pool POOL --port 0 EXTRA...` (with
    /// `--threads 2` unless EXTRA names a count) and waits for its
    /// readiness line.
    pub fn start(pool: &Path, extra: &[&str]) -> Server {
        let threads: &[&str] = if extra.contains(&"--threads") {
            &[]
        } else {
            &["--threads", "2"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvstore"))
            .arg("serve")
            .arg("--pool")
            .arg(pool)
            .args(["--port", "0"])
            .args(threads)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nvstore serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                log2.lock().unwrap().push_str(&format!("{line}\n"));
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("nvstore: ready to accept connections on ") {
                        let port = addr.rsplit(':').next().unwrap().parse().unwrap();
                        return Server {
                            child,
                            port,
                            pool: pool.to_path_buf(),
                            log,
                            reader,
                        };
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("server did not become ready; stderr:\n{}", log.lock().unwrap());
                }
            }
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }

    /// SIGKILL (by pid) and reap.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends a signal by pid and waits for the exit status.
    pub fn signal_and_wait(mut self, sig: i32) -> std::process::ExitStatus {
        let rc = kill_by_pid(self.child.id(), sig);
        assert!(rc, "kill failed");
        self.wait()
    }

    /// Waits for the exit and for the stderr reader to pass on every line
    /// (the exit can be seen before the last lines are read).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                while !self.reader.is_finished() {
                    assert!(Instant::now() < deadline, "stderr stayed open after the exit");
                    std::thread::sleep(Duration::from_millis(5));
                }
                return st;
            }
            assert!(Instant::now() < deadline, "server did not exit; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// `kill(1)` by pid, through the kill command.
fn kill_by_pid(pid: u32, sig: i32) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A reply as the tests see it.
#[derive(Clone, Debug, PartialEq)]
pub enum R {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<R>),
    Map(Vec<(R, R)>),
    Set(Vec<R>),
    Double(String),
}

impl R {
    pub fn s(x: &str) -> R {
        R::Bulk(x.as_bytes().to_vec())
    }
    pub fn ok() -> R {
        R::Simple("OK".into())
    }
    pub fn arr(xs: &[&str]) -> R {
        R::Array(xs.iter().map(|x| R::s(x)).collect())
    }
    pub fn err_text(&self) -> &str {
        match self {
            R::Err(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }
}

pub struct Client {
    pub r: BufReader<TcpStream>,
    pub w: TcpStream,
}

pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

impl Client {
    pub fn connect(port: u16) -> Client {
        let w = TcpStream::connect(("127.0.0.1", port)).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        w.set_nodelay(true).unwrap();
        Client {
            r: BufReader::new(w.try_clone().unwrap()),
            w,
        }
    }

    pub fn send_raw(&mut self, b: &[u8]) {
        self.w.write_all(b).unwrap();
    }

    /// [`Client::send_raw`] to a server that may be gone.
    pub fn try_send_raw(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.w.write_all(b)
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        self.send_raw(&encode(args));
    }

    pub fn cmd(&mut self, args: &[&str]) -> R {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send(&a);
        self.read().unwrap()
    }

    /// Reads raw reply bytes until EOF or timeout: `Ok(None)` at EOF.
    pub fn read_lenient(&mut self) -> std::io::Result<Option<usize>> {
        let mut b = [0u8; 4096];
        match self.r.read(&mut b)? {
            0 => Ok(None),
            n => Ok(Some(n)),
        }
    }

    pub fn read(&mut self) -> std::io::Result<R> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        if line.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        assert!(line.ends_with(b"\r\n"), "bad line {line:?}");
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let n = || body.parse::<i64>().unwrap();
        Ok(match line[0] {
            b'+' => R::Simple(body),
            b'-' => R::Err(body),
            b':' => R::Int(n()),
            b',' => R::Double(body),
            b'_' => R::Nil,
            b'$' if n() < 0 => R::Nil,
            b'*' if n() < 0 => R::Nil,
            b'$' | b'=' => {
                let mut b = vec![0; n() as usize + 2];
                self.r.read_exact(&mut b)?;
                b.truncate(b.len() - 2);
                R::Bulk(b)
            }
            b'*' => R::Array((0..n()).map(|_| self.read()).collect::<Result<_, _>>()?),
            b'~' => R::Set((0..n()).map(|_| self.read()).collect::<Result<_, _>>()?),
            b'%' => R::Map(
                (0..n())
                    .map(|_| Ok((self.read()?, self.read()?)))
                    .collect::<std::io::Result<_>>()?,
            ),
            c => panic!("unexpected reply type {:?}", c as char),
        })
    }
}

/// Whether the external `tool` can be used. Missing: fails the test under
/// `NVSTORE_REQUIRE_TOOLS=1`, else prints why it is skipped.
pub fn have_tool(tool: &str, probe: &[&str]) -> bool {
    let ok = Command::new(tool)
        .args(probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("NVSTORE_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!(
                "`{tool}` is required (NVSTORE_REQUIRE_TOOLS=1) but `{tool} {}` failed",
                probe.join(" ")
            );
        }
        eprintln!(
            "SKIPPED: `{tool}` is not available (`{tool} {}` failed); install it to run this test",
            probe.join(" ")
        );
    }
    ok
}

/// Starts an AsymNVM back-end process, `nvstore backend`, on `pool` and waits for its readiness line.
pub fn backend(pool: &Path) -> (Child, SocketAddr) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvstore"))
        .args([
            "backend",
            "--pool",
            pool.to_str().unwrap(),
            "--port",
            "0",
            "--size",
            "32M",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn backend");
    let mut line = String::new();
    BufReader::new(c.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .strip_prefix("nvstore backend: ready on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no readiness line: {line:?}"));
    (c, addr.parse().unwrap())
}
