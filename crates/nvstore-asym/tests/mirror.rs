//! Mirror nodes over real TCP, in process: writes through a front-end
//! reach every mirror before they are acknowledged, the mirror's pool is a
//! byte-identical replica of the data area, and a mirror that connects late
//! (full copy) or comes back after missing batches (resend) catches up.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nvstore::pmem::Space;
use nvstore_asym::failover::resend_kept;
use nvstore_asym::mirror::{follow, Node, Replication, Stop};
use nvstore_asym::structures::recover;
use nvstore_asym::structures::Queue;
use nvstore_asym::transport::SharedBackend;
use nvstore_asym::{server, Backend, Layout, Mode, Remote, RemoteOptions, TcpTransport};
use parking_lot::Mutex;

const POOL: u64 = 8 << 20;

fn opts() -> RemoteOptions {
    RemoteOptions {
        mode: Mode::Rcb,
        batch: 8,
        flush_after: Duration::from_secs(3600),
        ..RemoteOptions::default()
    }
}

/// A primary node on `path`, served on a free loopback port.
fn primary(path: &Path) -> (Arc<Mutex<Node>>, SocketAddr) {
    primary_with(path, Replication::Sync)
}

fn primary_with(path: &Path, mode: Replication) -> (Arc<Mutex<Node>>, SocketAddr) {
    let b = Backend::open_file(path, POOL, Layout::default_for(POOL)).unwrap();
    let node = Arc::new(Mutex::new(Node::primary(path, b).with_replication(mode)));
    (node.clone(), serve(node))
}

fn serve(node: Arc<Mutex<Node>>) -> SocketAddr {
    let (l, addr) = server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let shared: SharedBackend = node;
    std::thread::spawn(move || server::serve(l, shared));
    addr
}

struct Follower {
    node: Arc<Mutex<Node>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Stop>,
}

/// A mirror on `path` following `addr`; returns once it is in sync.
fn mirror_on(node: Arc<Mutex<Node>>, addr: SocketAddr) -> Follower {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let (n, s) = (node.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        follow(&n, addr, &s, |_| {
            let _ = tx.send(());
        })
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("mirror never got in sync");
    Follower { node, stop, thread }
}

fn stop(f: Follower) -> Arc<Mutex<Node>> {
    f.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = f.thread.join().unwrap();
    assert!(matches!(r, Stop::Stopped), "{r:?}");
    f.node
}

/// The pool bytes a replica must share with its primary: everything but
/// the epoch and replication words (128..152).
fn replicated_bytes(n: &Node) -> (Vec<u8>, Vec<u8>) {
    let b = n.backend().unwrap();
    let s = b.space();
    let mut head = vec![0; 128];
    s.read(0, &mut head);
    let g = b.geometry();
    let mut rest = vec![0; (s.size() - 152) as usize];
    s.read(152, &mut rest);
    assert!(g.data_off > 152);
    (head, rest)
}

fn assert_replica(p: &Arc<Mutex<Node>>, m: &Arc<Mutex<Node>>) {
    let (p, m) = (p.lock(), m.lock());
    let (pb, mb) = (p.backend().unwrap(), m.backend().unwrap());
    let g = pb.geometry();
    let len = (g.slabs * g.slab) as usize;
    assert!(
        pb.peek(g.data_off, len) == mb.peek(g.data_off, len),
        "data areas differ"
    );
    assert_eq!(pb.names(), mb.names());
    assert_eq!(pb.live_ops(), mb.live_ops());
    assert_eq!((pb.op_applied(), pb.op_next()), (mb.op_applied(), mb.op_next()));
    assert!(
        replicated_bytes(&p) == replicated_bytes(&m),
        "pools differ outside the data area"
    );
}

fn enqueue(r: &mut Remote, q: &mut Queue, keys: std::ops::Range<u64>) {
    for k in keys {
        q.enqueue(r, k, &k.to_le_bytes()).unwrap();
    }
}

#[test]
fn writes_reach_the_mirror_before_they_are_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (p, addr) = primary(&dir.path().join("p.pool"));
    let m = mirror_on(Arc::new(Mutex::new(Node::mirror(&dir.path().join("m.pool")))), addr);
    assert_eq!(m.node.lock().copies(), 1, "a new mirror starts with a full copy");
    let mut r = Remote::open(TcpTransport::connect(addr).unwrap(), opts()).unwrap();
    let mut q = Queue::open(&mut r, "q").unwrap();
    enqueue(&mut r, &mut q, 0..100);
    // No flush: the operation logs of the last batch are live on both.
    let ops = m.node.lock().backend().unwrap().live_ops();
    assert!(!ops.is_empty(), "the unbatched operation logs are on the mirror");
    assert_replica(&p, &m.node);
    r.flush().unwrap();
    assert_replica(&p, &m.node);
    assert_eq!(p.lock().mirror_count(), 1);
    stop(m);
}

#[test]
fn a_late_mirror_gets_a_full_copy_and_a_returning_one_the_batches_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let (p, addr) = primary(&dir.path().join("p.pool"));
    let mut r = Remote::open(TcpTransport::connect(addr).unwrap(), opts()).unwrap();
    let mut q = Queue::open(&mut r, "q").unwrap();
    enqueue(&mut r, &mut q, 0..50);
    r.flush().unwrap();

    // Late: everything so far arrives as one copy.
    let a = mirror_on(Arc::new(Mutex::new(Node::mirror(&dir.path().join("a.pool")))), addr);
    assert_replica(&p, &a.node);
    enqueue(&mut r, &mut q, 50..80);
    assert_replica(&p, &a.node);

    // Away while 40 operations run, then back: the batches it missed are resent.
    let a = stop(a);
    enqueue(&mut r, &mut q, 80..120);
    assert_eq!(p.lock().mirror_count(), 0, "the primary dropped the mirror that left");
    let a = mirror_on(a, addr);
    assert_eq!(a.node.lock().copies(), 1, "a returning mirror is not copied again");
    assert_replica(&p, &a.node);
    enqueue(&mut r, &mut q, 120..130);
    r.flush().unwrap();
    assert_replica(&p, &a.node);
    let items: Vec<u64> = q.items(&mut r).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(items, (0..130).collect::<Vec<_>>());
    stop(a);
}

#[test]
fn a_mirror_restarted_on_its_pool_resumes_without_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (p, addr) = primary(&dir.path().join("p.pool"));
    let mut r = Remote::open(TcpTransport::connect(addr).unwrap(), opts()).unwrap();
    let mut q = Queue::open(&mut r, "q").unwrap();
    let mpath = dir.path().join("m.pool");
    let m = mirror_on(Arc::new(Mutex::new(Node::mirror(&mpath))), addr);
    enqueue(&mut r, &mut q, 0..30);
    drop(stop(m));
    enqueue(&mut r, &mut q, 30..60);
    // A new process on the same pool: its replication words say where it was.
    let m = mirror_on(Arc::new(Mutex::new(Node::mirror(&mpath))), addr);
    assert_eq!(m.node.lock().copies(), 0);
    assert_replica(&p, &m.node);
    stop(m);
}

#[test]
fn async_front_ends_keep_what_the_mirror_lacks_and_resend_it_after_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let (p, addr) = primary_with(&dir.path().join("p.pool"), Replication::Async);
    let m = mirror_on(Arc::new(Mutex::new(Node::mirror(&dir.path().join("m.pool")))), addr);
    let mut r = Remote::open(TcpTransport::connect(addr).unwrap(), opts()).unwrap();
    r.retain_ops(true);
    let mut q = Queue::open(&mut r, "q").unwrap();
    enqueue(&mut r, &mut q, 0..40);
    // The mirror keeps up: the mark passes the kept logs (up to the last
    // frame's). Key 1000 is enqueued at least once, however fast it does.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        enqueue(&mut r, &mut q, 1000..1001);
        if r.retained_ops().len() <= 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the mark never advanced");
        std::thread::sleep(Duration::from_millis(5));
    }
    let ok: Vec<u64> = (0..40).chain([1000]).collect();
    let extra = q.items(&mut r).unwrap().len() as u64 - 40;

    // The mirror stalls (its pool is busy) and then loses its link: the
    // primary acknowledges 60 writes it never applies.
    let stalled = m.node.lock();
    enqueue(&mut r, &mut q, 40..100);
    assert!(r.retained_ops().len() >= 50, "{} kept", r.retained_ops().len());
    m.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(stalled);
    let mnode = stop(m);
    drop(p); // the primary is gone for this front-end

    // The mirror takes over; the writer recovers and resends what it lacks.
    let kept = r.retained_ops();
    let epoch = mnode.lock().epoch() + 10;
    mnode.lock().promote(epoch).unwrap();
    let maddr = serve(mnode.clone());
    let mut r2 = Remote::open(TcpTransport::connect(maddr).unwrap(), opts()).unwrap();
    let mut q2 = Queue::open(&mut r2, "q").unwrap();
    recover(&mut r2, &mut q2).unwrap();
    let lacked = (r.op_next() - r2.hello().op_next) as usize;
    assert!(lacked > 0, "the mirror had everything: the test proves nothing");
    let n = resend_kept(&mut r2, &mut q2, &kept).unwrap();
    assert_eq!(n as usize, lacked);
    r2.flush().unwrap();
    let mut keys: Vec<u64> = q2.items(&mut r2).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys.len() as u64, 100 + extra);
    keys.sort();
    keys.dedup();
    let mut want: Vec<u64> = ok.into_iter().chain(40..100).collect();
    want.sort();
    assert_eq!(keys, want, "every acknowledged write once");
}
