//! The network side: listener, connections, shutdown.
//!
//! Each connection is one tokio task that reads, parses every complete
//! request in its buffer, and hands the batch (with the connection's state)
//! to one blocking task, which runs the commands in order against the engine
//! and encodes their replies. Engine calls flush persistent memory and may
//! wait for the transaction lock, so they never run on a reactor thread. The
//! replies are written only after the batch returned: every write in it is
//! durable by then. An idle or slow client holds only its own task.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::cmd::{self, Conn};
use crate::resp::{Parser, Reply};
use crate::shared::{ClientInfo, Shared};

/// Most requests run in one blocking batch.
const BATCH: usize = 512;
/// A batch stops once its replies take this many bytes; the rest run next,
/// after these were written (a pipeline of huge GETs is not held in memory).
const MAX_BATCH_REPLY: usize = 4 << 20;

/// Accepts connections until a signal or SHUTDOWN; then lets connections
/// finish their current batch and returns. `ready` runs once the signal
/// handlers are in place (so a signal right after readiness closes cleanly).
pub async fn run(sh: Arc<Shared>, listener: TcpListener, ready: impl FnOnce()) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    ready();
    let mut stop = sh.shutdown.subscribe();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (sock, addr) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and the like: keep serving the clients we have.
                        eprintln!("nvstore: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                sh.stats.connections.fetch_add(1, Ordering::Relaxed);
                if sh.connected.load(Ordering::Relaxed) >= sh.cfg.maxclients {
                    sh.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(async move {
                        let mut sock = sock;
                        let _ = sock.write_all(b"-ERR max number of clients reached\r\n").await;
                    });
                    continue;
                }
                sh.connected.fetch_add(1, Ordering::Relaxed);
                let sh2 = sh.clone();
                tasks.spawn(async move {
                    let id = sh2.next_id.fetch_add(1, Ordering::Relaxed);
                    let laddr = sock.local_addr().map(|a| a.to_string()).unwrap_or_default();
                    sh2.clients.lock().insert(id, ClientInfo::new(addr.to_string(), laddr));
                    if let Err(e) = connection(&sh2, sock, id).await {
                        if !matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) {
                            eprintln!("nvstore: client {addr}: {e}");
                        }
                    }
                    sh2.clients.lock().remove(&id);
                    sh2.connected.fetch_sub(1, Ordering::Relaxed);
                });
            }
            _ = sigint.recv() => { eprintln!("nvstore: SIGINT received, shutting down"); break; }
            _ = sigterm.recv() => { eprintln!("nvstore: SIGTERM received, shutting down"); break; }
            _ = stop.changed() => { eprintln!("nvstore: SHUTDOWN received, shutting down"); break; }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let _ = sh.shutdown.send(true);
    // Connections stop at their next read; a batch in flight finishes first.
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    Ok(())
}

/// Runs parsed requests in order (consecutive groupable writes as one group
/// commit) until they are done, the connection closes, or the replies are
/// large; returns the connection state, the replies and what is left.
fn run_batch(sh: &Arc<Shared>, mut c: Conn, mut todo: VecDeque<Vec<Bytes>>) -> (Conn, BytesMut, VecDeque<Vec<Bytes>>) {
    let mut out = BytesMut::new();
    while let Some(args) = todo.pop_front() {
        if cmd::groupable(&c, &args) {
            let mut group = vec![args];
            while group.len() < cmd::MAX_GROUP && todo.front().is_some_and(|a| cmd::groupable(&c, a)) {
                group.push(todo.pop_front().unwrap());
            }
            for r in cmd::execute_group(sh, &mut c, &group) {
                r.encode(c.proto, &mut out);
            }
        } else if !cmd::fast::read_into(sh, &c, &args, &mut out) {
            let r = cmd::execute(sh, &mut c, args);
            r.encode(c.proto, &mut out);
        }
        if c.close || out.len() >= MAX_BATCH_REPLY {
            break;
        }
    }
    (c, out, todo)
}

async fn connection(sh: &Arc<Shared>, mut sock: TcpStream, id: u64) -> std::io::Result<()> {
    sock.set_nodelay(true)?;
    let mut stop = sh.shutdown.subscribe();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut parser = Parser::new();
    let mut conn = Some(Conn::new(id, sh.cfg.requirepass.is_none()));
    let lim = sh.cfg.limits;
    // Parsed requests not yet run (a batch stops early once its replies are large).
    let mut batch: VecDeque<Vec<Bytes>> = VecDeque::new();
    // A protocol error ends the connection once the requests before it ran.
    let mut bad = None;
    loop {
        while bad.is_none() && batch.len() < BATCH {
            match parser.next(&mut buf, &lim) {
                Ok(Some(a)) => batch.push_back(a),
                Ok(None) => break,
                Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let c = conn.take().expect("connection state is back after each batch");
            let sh2 = sh.clone();
            let todo = std::mem::take(&mut batch);
            // Engine calls are short and never wait for I/O (the pool is
            // memory; a write's flush and fence take well under a
            // microsecond), so a batch runs on this worker thread, as Redis
            // runs commands on its event loop. Commands that walk the whole
            // key space go to the blocking pool so they cannot stall the
            // other connections of this worker.
            let slow = todo.iter().any(|a| cmd::walks_keyspace(a));
            let (c, out, rest) = if slow {
                tokio::task::spawn_blocking(move || run_batch(&sh2, c, todo))
                    .await
                    .map_err(std::io::Error::other)?
            } else {
                run_batch(&sh2, c, todo)
            };
            batch = rest;
            sh.stats.net_out.fetch_add(out.len() as u64, Ordering::Relaxed);
            sock.write_all(&out).await?;
            let close = c.close;
            conn = Some(c);
            if close {
                return Ok(());
            }
            if !batch.is_empty() || (bad.is_none() && !buf.is_empty()) {
                // Requests left over, or more complete ones may wait in the buffer.
                continue;
            }
        }
        if let Some(e) = bad {
            let mut out = BytesMut::new();
            Reply::Error(format!("ERR {e}")).encode(2, &mut out);
            sock.write_all(&out).await?;
            eprintln!("nvstore: client {id}: {e}; closing the connection");
            return Ok(());
        }
        if *stop.borrow() {
            return Ok(());
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        tokio::select! {
            r = sock.read_buf(&mut buf) => {
                let n = r?;
                if n == 0 {
                    return Ok(());
                }
                sh.stats.net_in.fetch_add(n as u64, Ordering::Relaxed);
            }
            _ = stop.changed() => return Ok(()),
        }
    }
}
