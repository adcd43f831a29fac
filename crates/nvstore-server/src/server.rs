//! The network side: listener, connections, shutdown.
//!
//! Each connection is one tokio task that reads, parses every complete
//! request in its buffer and runs them in order on its worker thread (a
//! batch holding a key-space walk runs on the blocking pool instead),
//! encoding the replies into one buffer that is written once. The replies
//! are written only after the batch returned: every write in it is durable
//! by then. An idle or slow client holds only its own task.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::cmd::{self, Conn, Req};
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
    // Connections stop at their next await: a read, a reply write, or a
    // batch on the blocking pool (which the runtime's shutdown lets
    // finish). A batch running on a worker finishes first, and every reply
    // sent was durable before it was sent. Connections do not watch the
    // shutdown signal themselves: a watch per read costs a lock per request.
    tasks.abort_all();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// Runs parsed requests in order (consecutive groupable writes as one group
/// commit), encoding their replies into `out`, until they are done, the
/// connection closes, or the replies are large; what is left stays in `todo`.
fn run_batch(sh: &Arc<Shared>, c: &mut Conn, todo: &mut VecDeque<Req>, out: &mut BytesMut) {
    while let Some(req) = todo.pop_front() {
        if cmd::groupable(c, &req) && todo.front().is_some_and(|r| cmd::groupable(c, r)) {
            let mut group = vec![req];
            while group.len() < cmd::MAX_GROUP && todo.front().is_some_and(|r| cmd::groupable(c, r)) {
                group.push(todo.pop_front().unwrap());
            }
            for r in cmd::execute_group(sh, c, group) {
                r.encode(c.proto, out);
            }
        } else if !cmd::fast::read_into(sh, c, &req, out) {
            let r = cmd::execute_req(sh, c, req);
            r.encode(c.proto, out);
        }
        if c.close || out.len() >= MAX_BATCH_REPLY {
            break;
        }
    }
}

/// Reply buffers up to this capacity are kept for the connection's next
/// batch (one allocation per connection, not per batch); a larger one, left
/// by a pipeline of big replies, is given back.
const KEEP_OUT: usize = 256 << 10;

/// One connection: read what the client sent, run every complete request in
/// it, write all their replies with one write, repeat. The read buffer, the
/// parsed-request queue and the reply buffer live as long as the connection.
/// Shutdown aborts the task at its next await (see [`run`]): between a read
/// and the write of its replies there is none unless a batch runs on the
/// blocking pool, so a batch in flight still finishes.
async fn connection(sh: &Arc<Shared>, mut sock: TcpStream, id: u64) -> std::io::Result<()> {
    sock.set_nodelay(true)?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut parser = Parser::new();
    let mut conn = Conn::new(id, sh.cfg.requirepass.is_none());
    let lim = sh.cfg.limits;
    // Parsed requests not yet run (a batch stops early once its replies are large).
    let mut batch: VecDeque<Req> = VecDeque::with_capacity(16);
    // A protocol error ends the connection once the requests before it ran.
    let mut bad = None;
    loop {
        while bad.is_none() && batch.len() < BATCH {
            match parser.next(&mut buf, &lim) {
                Ok(Some(a)) => batch.push_back(Req::new(a)),
                Ok(None) => break,
                Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
        }
        if !batch.is_empty() {
            // Engine calls are short and never wait for I/O (the pool is
            // memory; a write's flush and fence take well under a
            // microsecond), so a batch runs on this worker thread, as Redis
            // runs commands on its event loop. Commands that walk the whole
            // key space go to the blocking pool so they cannot stall the
            // other connections of this worker.
            if batch.iter().any(cmd::walks_keyspace) {
                let sh2 = sh.clone();
                let mut c = std::mem::replace(&mut conn, Conn::new(id, false));
                let mut todo = std::mem::take(&mut batch);
                let mut o = std::mem::take(&mut out);
                (conn, batch, out) = tokio::task::spawn_blocking(move || {
                    run_batch(&sh2, &mut c, &mut todo, &mut o);
                    (c, todo, o)
                })
                .await
                .map_err(std::io::Error::other)?;
            } else {
                run_batch(sh, &mut conn, &mut batch, &mut out);
            }
            sh.stats.net_out.fetch_add(out.len() as u64, Ordering::Relaxed);
            sock.write_all(&out).await?;
            if out.capacity() > KEEP_OUT {
                out = BytesMut::with_capacity(16 * 1024);
            } else {
                out.clear();
            }
            if conn.close {
                return Ok(());
            }
            if !batch.is_empty() || (bad.is_none() && !buf.is_empty()) {
                // Requests left over, or more complete ones may wait in the buffer.
                continue;
            }
        }
        if let Some(e) = bad {
            out.clear();
            Reply::Error(format!("ERR {e}")).encode(2, &mut out);
            sock.write_all(&out).await?;
            eprintln!("nvstore: client {id}: {e}; closing the connection");
            return Ok(());
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        let n = sock.read_buf(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        sh.stats.net_in.fetch_add(n as u64, Ordering::Relaxed);
    }
}
