//! A `redis-server` started (and stopped) by the benchmark, configured as a
//! durable store comparable to nvstore: `appendonly yes`, `appendfsync
//! always` (every write is in the append-only file, fsynced, before the
//! reply), no RDB snapshots, its files in a fresh directory on /dev/shm
//! (DRAM-backed, as nvstore's pools), listening on a free local port.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nvstore::{Error, Result};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A running server; killed and its directory removed on drop.
pub struct RedisServer {
    child: Child,
    dir: PathBuf,
    addr: String,
}

impl RedisServer {
    /// Starts `redis-server` (from PATH) and waits until it accepts connections.
    pub fn start() -> Result<RedisServer> {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("127.0.0.1:0", e))?;
            l.local_addr().map_err(|e| Error::io("127.0.0.1:0", e))?.port()
        };
        let dir = PathBuf::from(format!(
            "/dev/shm/nvstore-redis-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Error::InvalidOption(format!(
                    "cannot start redis-server ({e}); install it (apt-get install redis-server)"
                ))
            })?;
        let addr = format!("127.0.0.1:{port}");
        let mut s = RedisServer { child, dir, addr };
        let t0 = Instant::now();
        while TcpStream::connect(&s.addr).is_err() {
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(Error::InvalidOption(format!("redis-server exited at start: {status}")));
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(Error::InvalidOption(format!(
                    "redis-server did not listen on {}",
                    s.addr
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(s)
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
