//! The asynchronous API (KVS B+Tree index §2, Fig. 2): every call on a
//! [`Db`] blocks its thread until the write is durable or the read is done;
//! [`AsyncDb`] turns each call into a future without blocking the caller.
//!
//! As the paper describes: a call wraps the blocking operation into a
//! function object, puts it into a lock-free queue (an unbounded
//! `crossbeam-channel`) and returns a future at once. A fixed set of worker
//! threads pops the function objects and runs them on the shared `Db`; the
//! worker that finishes one stores its result in the request's completion
//! slot (the paper's `std::promise`), and only then is the caller's future
//! ready. The function object and its slot are one allocation, shared by
//! the queue and the future.
//!
//! What a request costs besides its own work, and how it is kept small:
//! - A worker takes its share of the queue (up to [`BATCH`] requests) per
//!   visit, and wakes the callers waiting on a batch's results once the
//!   batch is done, not after each request: a caller that sleeps while a
//!   window of requests is in flight is woken about once per batch, not
//!   once per completion. A result is visible to a poll at once; only the
//!   wake-up is deferred.
//! - A worker makes the puts of its batch durable as one group
//!   ([`Db::put_many`]): on a hash pool, one fence for all their slots
//!   and one for all their bucket headers, instead of two per put, under
//!   one hold of the writer lock. Each put is still atomic on its own and
//!   durable before its future is ready.
//! - Likewise a run of gets in its batch is read together
//!   ([`Db::get_many`]): on a hash pool their cache misses overlap.
//! - Requests keep the queue's order within a batch: a run of puts or of
//!   gets completes before the next request runs, so a get sees the puts
//!   queued before it and none queued after it.
//! - A worker that finds the queue empty keeps looking for a short while
//!   ([`SPIN`], yielding its core meanwhile) before it sleeps, so a caller
//!   that issues requests at a steady pace rarely has to wake a worker.
//!
//! The futures need no particular runtime: they are plain
//! [`std::future::Future`]s woken by the worker, so tokio, `futures`'
//! `block_on` or any other executor can await them, and
//! [`DbFuture::wait`] blocks a thread that has no executor.
//!
//! Shutdown: dropping an [`AsyncDb`] (or [`AsyncDb::close`]) stops taking
//! requests, lets the workers finish every request already queued, joins
//! them and closes the pool cleanly. [`AsyncDb::shutdown_now`] instead
//! fails the queued requests that no worker has started with
//! [`Error::Closed`]. A future whose request was never run never hangs: it
//! resolves to [`Error::Closed`].

use std::future::Future;
use std::ops::RangeBounds;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::Mutex;

use crate::db::{owned, Db, Options};
use crate::error::{Error, Result};
use crate::pmem::{FileSpace, Space};
use crate::txn::Txn;

/// Pairs a range or prefix request returns, in the order asked for.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A request as the workers see it: run on the store, or told that it will
/// never run (`None`). Either way it completes its caller's future, and
/// returns the waker to wake for it (the worker wakes it after its batch).
/// The request's closure and its completion slot are one allocation
/// ([`Request`]), shared by the queue and the future.
type Job<S> = Arc<dyn Runnable<S>>;

/// What a worker does with a queued request.
trait Runnable<S: Space>: Send + Sync {
    fn run(&self, db: Option<&Db<S>>) -> Option<Waker>;

    /// What a worker may run in one group with its neighbours in the
    /// queue: a put ([`Db::put_many`]) or a get ([`Db::get_many`]); `None`
    /// for every other request.
    fn grouped(&self) -> Option<Grouped<'_>> {
        None
    }

    /// Completes a put made durable in a group with `r`, its result.
    fn done(&self, _r: Result<()>) -> Option<Waker> {
        None
    }

    /// Completes a get read in a group with `r`, its result.
    fn got(&self, _r: Result<Option<Vec<u8>>>) -> Option<Waker> {
        None
    }
}

/// A request a worker may run together with the requests of the same
/// kind next to it in the queue.
#[derive(Clone, Copy)]
enum Grouped<'a> {
    Put(&'a [u8], &'a [u8]),
    Get(&'a [u8]),
}

impl Grouped<'_> {
    fn is_put(self) -> bool {
        matches!(self, Grouped::Put(..))
    }
}

/// A put: its key and value, which the worker may group with others.
struct PutRequest {
    key: Vec<u8>,
    value: Vec<u8>,
    slot: Slot<()>,
}

impl<S: Space> Runnable<S> for PutRequest {
    fn run(&self, db: Option<&Db<S>>) -> Option<Waker> {
        let r = db.map_or(Err(Error::Closed), |db| guarded(|| db.put(&self.key, &self.value)));
        self.slot.complete(r)
    }

    fn grouped(&self) -> Option<Grouped<'_>> {
        Some(Grouped::Put(&self.key, &self.value))
    }

    fn done(&self, r: Result<()>) -> Option<Waker> {
        self.slot.complete(r)
    }
}

impl HasSlot<()> for PutRequest {
    fn slot(&self) -> &Slot<()> {
        &self.slot
    }
}

/// A get: its key, which the worker may read with other gets.
struct GetRequest {
    key: Vec<u8>,
    slot: Slot<Option<Vec<u8>>>,
}

impl<S: Space> Runnable<S> for GetRequest {
    fn run(&self, db: Option<&Db<S>>) -> Option<Waker> {
        let r = db.map_or(Err(Error::Closed), |db| guarded(|| db.get(&self.key)));
        self.slot.complete(r)
    }

    fn grouped(&self) -> Option<Grouped<'_>> {
        Some(Grouped::Get(&self.key))
    }

    fn got(&self, r: Result<Option<Vec<u8>>>) -> Option<Waker> {
        self.slot.complete(r)
    }
}

impl HasSlot<Option<Vec<u8>>> for GetRequest {
    fn slot(&self) -> &Slot<Option<Vec<u8>>> {
        &self.slot
    }
}

/// One request: its closure, taken by the worker that runs it, and the
/// slot its result goes to.
struct Request<F, T> {
    f: Mutex<Option<F>>,
    slot: Slot<T>,
}

impl<S, F, T> Runnable<S> for Request<F, T>
where
    S: Space + Send + Sync + 'static,
    T: Send,
    F: FnOnce(&Db<S>) -> Result<T> + Send,
{
    fn run(&self, db: Option<&Db<S>>) -> Option<Waker> {
        let f = self.f.lock().take()?;
        let r = db.map_or(Err(Error::Closed), |db| guarded(|| f(db)));
        self.slot.complete(r)
    }
}

/// The future's view of a [`Request`]: its slot.
trait HasSlot<T>: Send + Sync {
    fn slot(&self) -> &Slot<T>;
}

impl<F: Send, T: Send> HasSlot<T> for Request<F, T> {
    fn slot(&self) -> &Slot<T> {
        &self.slot
    }
}

/// Worker threads [`AsyncDb::open`] and [`AsyncDb::new`] start: one per
/// core, at least two, so one long request never holds up all others.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)
}

/// A [`Db`] whose operations return futures. See the module docs.
pub struct AsyncDb<S: Space + Send + Sync + 'static = FileSpace> {
    /// `None` only inside [`AsyncDb::close`], after the workers are gone.
    db: Option<Arc<Db<S>>>,
    queue: Option<Sender<Job<S>>>,
    /// The queue's other end, for [`AsyncDb::shutdown_now`] to empty.
    pending: Receiver<Job<S>>,
    workers: Vec<JoinHandle<()>>,
    /// Set by [`AsyncDb::shutdown_now`]: workers fail what is left.
    abort: Arc<AtomicBool>,
}

impl AsyncDb<FileSpace> {
    /// Opens (or creates, as `opts` says) the pool at `path` with
    /// [`default_workers`] workers.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Self> {
        Ok(AsyncDb::new(Db::open(path, opts)?))
    }
}

impl<S: Space + Send + Sync + 'static> AsyncDb<S> {
    /// Serves `db` with [`default_workers`] worker threads.
    pub fn new(db: Db<S>) -> Self {
        AsyncDb::with_workers(db, default_workers())
    }

    /// Serves `db` with `workers` worker threads (at least one).
    pub fn with_workers(db: Db<S>, workers: usize) -> Self {
        let db = Arc::new(db);
        let abort = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::unbounded::<Job<S>>();
        let workers = (0..workers.max(1))
            .map(|i| {
                let (db, rx, abort) = (db.clone(), rx.clone(), abort.clone());
                let n = workers.max(1);
                std::thread::Builder::new()
                    .name(format!("nvstore-async-{i}"))
                    .spawn(move || worker(&db, &rx, &abort, n))
                    .expect("spawning an async worker thread")
            })
            .collect();
        AsyncDb {
            db: Some(db),
            queue: Some(tx),
            pending: rx,
            workers,
            abort,
        }
    }

    /// The store itself, for its synchronous API (snapshots, `stat`, ...).
    pub fn db(&self) -> &Db<S> {
        self.db.as_ref().expect("the store is present until close")
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Requests queued that no worker has taken yet (a worker takes a
    /// batch of them at once, see [`BATCH`]).
    pub fn queued(&self) -> usize {
        self.queue.as_ref().map_or(0, |q| q.len())
    }

    /// Runs `f` on a worker with the store and returns its result as a
    /// future: the paper's wrapper for any blocking call. A panic in `f`
    /// becomes [`Error::WorkerPanic`]; the worker lives on. `f` must not
    /// wait for another request of this store: with every worker waiting,
    /// none would be left to run it.
    pub fn run<T, F>(&self, f: F) -> DbFuture<T>
    where
        T: Send + 'static,
        F: FnOnce(&Db<S>) -> Result<T> + Send + 'static,
    {
        let req = Arc::new(Request {
            f: Mutex::new(Some(f)),
            slot: Slot::default(),
        });
        self.send(req.clone());
        DbFuture { req }
    }

    /// Queues `job`; if no worker will ever take it, completes it with
    /// [`Error::Closed`] at once.
    fn send(&self, job: Job<S>) {
        // Sending fails only once every worker is gone (or after close);
        // then the request is told it will never run, and its future
        // resolves to `Closed`.
        let unsent = match &self.queue {
            Some(q) => q.send(job).err().map(|e| e.into_inner()),
            None => Some(job),
        };
        if let Some(job) = unsent {
            if let Some(w) = job.run(None) {
                w.wake();
            }
        }
    }

    /// The value stored for `key`.
    ///
    /// A worker reads the gets it takes off the queue together
    /// ([`Db::get_many`]), which on a hash pool overlaps their cache
    /// misses.
    pub fn get(&self, key: &[u8]) -> DbFuture<Option<Vec<u8>>> {
        let req = Arc::new(GetRequest {
            key: key.to_vec(),
            slot: Slot::default(),
        });
        self.send(req.clone());
        DbFuture { req }
    }

    /// Stores `value` under `key`; the future is ready once it is durable.
    /// Copies both into the request ([`AsyncDb::put_owned`] takes them
    /// as they are).
    pub fn put(&self, key: &[u8], value: &[u8]) -> DbFuture<()> {
        self.put_owned(key.to_vec(), value.to_vec())
    }

    /// [`AsyncDb::put`] of a key and value the caller gives away (no copy).
    /// The worker that takes this put off the queue together with other
    /// puts makes them durable as one group ([`Db::put_many`]): on a hash
    /// pool one fence for all their slots and one for all their bucket
    /// headers, instead of two per put. Each put is still durable before
    /// its own future is ready, and atomic on its own.
    pub fn put_owned(&self, key: Vec<u8>, value: Vec<u8>) -> DbFuture<()> {
        let req = Arc::new(PutRequest {
            key,
            value,
            slot: Slot::default(),
        });
        self.send(req.clone());
        DbFuture { req }
    }

    /// Removes `key`; resolves to whether it was there, once durable.
    pub fn delete(&self, key: &[u8]) -> DbFuture<bool> {
        let key = key.to_vec();
        self.run(move |db| db.delete(&key))
    }

    /// Pairs with keys in `range`, in key order. Damage met on the way is
    /// the error (the pairs before it are not returned).
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> DbFuture<Pairs> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        self.run(move |db| db.range::<Vec<u8>, _>((lo, hi)).checked().collect())
    }

    /// Pairs with keys in `range`, in reverse key order.
    pub fn range_rev<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> DbFuture<Pairs> {
        let (lo, hi) = (owned(range.start_bound()), owned(range.end_bound()));
        self.run(move |db| db.range_rev::<Vec<u8>, _>((lo, hi)).checked().collect())
    }

    /// Pairs whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> DbFuture<Pairs> {
        let prefix = prefix.to_vec();
        self.run(move |db| db.prefix(&prefix).checked().collect())
    }

    /// Runs `f` in a transaction on a worker and commits it, as
    /// [`Db::transaction`] does (retrying `f` from a fresh snapshot on a
    /// conflict); resolves to `f`'s result once the commit is durable.
    pub fn transaction<T, F>(&self, mut f: F) -> DbFuture<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Txn<'_, S>) -> Result<T> + Send + 'static,
    {
        self.run(move |db| db.transaction(&mut f))
    }

    /// Stops taking requests, lets the workers finish every queued one,
    /// joins them and closes the pool cleanly (what dropping does, with
    /// the close's error returned).
    pub fn close(mut self) -> Result<()> {
        self.stop();
        match self.db.take().map(Arc::try_unwrap) {
            Some(Ok(db)) => db.close(),
            // A worker that outlived the join (only when the handle was
            // closed on a worker): the pool closes when that worker ends.
            _ => Ok(()),
        }
    }

    /// Like [`AsyncDb::close`], but requests no worker has started yet
    /// fail with [`Error::Closed`] instead of running. Requests already
    /// running finish (a write is never torn by a shutdown).
    pub fn shutdown_now(self) -> Result<()> {
        self.abort.store(true, Ordering::SeqCst);
        // Fail the queued requests here, at once, rather than when a busy
        // worker next looks; workers drop anything that races past.
        while let Ok(job) = self.pending.try_recv() {
            if let Some(w) = job.run(None) {
                w.wake();
            }
        }
        self.close()
    }

    /// Closes the queue and joins the workers (not the current thread, if
    /// it is one of them).
    fn stop(&mut self) {
        self.queue = None;
        let me = std::thread::current().id();
        for w in self.workers.drain(..) {
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
    }
}

impl<S: Space + Send + Sync + 'static> Drop for AsyncDb<S> {
    fn drop(&mut self) {
        self.stop();
        // The last `Arc<Db>` drops here, which closes the pool cleanly.
    }
}

/// Most requests a worker takes off the queue at once.
pub const BATCH: usize = 32;

/// How long a worker that found the queue empty keeps looking before it
/// sleeps.
pub const SPIN: Duration = Duration::from_micros(50);

/// A worker's loop. It takes its share of what is queued (up to [`BATCH`],
/// the rest left for the other workers) in one go, runs the batch, then
/// wakes the callers of the batch's requests; so a client that keeps many
/// requests in flight costs the workers one queue visit per batch rather
/// than per request, and itself about one wake-up per batch. With the
/// queue empty, it looks again for [`SPIN`], yielding its core, and only
/// then sleeps in `recv`.
fn worker<S: Space>(db: &Db<S>, rx: &Receiver<Job<S>>, abort: &AtomicBool, workers: usize) {
    let mut batch: Vec<Job<S>> = Vec::with_capacity(BATCH);
    let mut wake: Vec<Waker> = Vec::with_capacity(BATCH);
    let mut group: Vec<Job<S>> = Vec::with_capacity(BATCH);
    // `recv` fails once the queue is closed and empty: every request sent
    // before the close has been handed to some worker.
    while let Some(job) = next_job(rx) {
        batch.push(job);
        let share = (rx.len() / workers.max(1)).min(BATCH - 1);
        batch.extend(rx.try_iter().take(share));
        for job in batch.drain(..) {
            let live = (!abort.load(Ordering::SeqCst)).then_some(db);
            // A run of puts, or of gets, next to each other in the queue is
            // one group. The requests before this one complete before it
            // runs: a worker keeps the queue's order.
            let kind = live.and(job.grouped()).map(Grouped::is_put);
            if group.first().and_then(|g| g.grouped()).map(Grouped::is_put) != kind {
                run_group(db, &mut group, &mut wake);
            }
            match kind {
                Some(_) => group.push(job),
                None => wake.extend(job.run(live)),
            }
        }
        run_group(db, &mut group, &mut wake);
        for w in wake.drain(..) {
            w.wake();
        }
    }
}

/// Runs `group`, puts ([`Db::put_many`], made durable together) or gets
/// ([`Db::get_many`], read together), completes each request with its
/// own result and empties `group`. A lone request runs as it would
/// alone. A panic fails every request of the group with
/// [`Error::WorkerPanic`] (a put the group made durable before the panic
/// stays; a failed put may or may not have been written).
fn run_group<S: Space>(db: &Db<S>, group: &mut Vec<Job<S>>, wake: &mut Vec<Waker>) {
    match group.len() {
        0 => return,
        1 => wake.extend(group[0].run(Some(db))),
        _ if group[0].grouped().is_some_and(Grouped::is_put) => {
            let pairs: Vec<(&[u8], &[u8])> = group
                .iter()
                .filter_map(|j| match j.grouped() {
                    Some(Grouped::Put(k, v)) => Some((k, v)),
                    _ => None,
                })
                .collect();
            let done = caught(|| db.put_many(&pairs), pairs.len());
            wake.extend(group.iter().zip(done).filter_map(|(j, r)| j.done(r)));
        }
        _ => {
            let keys: Vec<&[u8]> = group
                .iter()
                .filter_map(|j| match j.grouped() {
                    Some(Grouped::Get(k)) => Some(k),
                    _ => None,
                })
                .collect();
            let got = caught(|| db.get_many(&keys), keys.len());
            wake.extend(group.iter().zip(got).filter_map(|(j, r)| j.got(r)));
        }
    }
    group.clear();
}

/// The next request: at once if one is queued, else after looking again
/// for up to [`SPIN`], else whenever one comes. `None` once the queue is
/// closed and empty.
fn next_job<S: Space>(rx: &Receiver<Job<S>>) -> Option<Job<S>> {
    let until = Instant::now() + SPIN;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if Instant::now() < until => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

/// The result of a request's call, or [`Error::WorkerPanic`] if it
/// panicked.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(Error::WorkerPanic(panic_message(&*p))))
}

/// The results of a group's call, or, if it panicked, `n` times
/// [`Error::WorkerPanic`].
fn caught<T>(f: impl FnOnce() -> Vec<Result<T>>, n: usize) -> Vec<Result<T>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = panic_message(&*p);
        (0..n).map(|_| Err(Error::WorkerPanic(msg.clone()))).collect()
    })
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

/// Where a request's result goes: set once by the worker (or marked done
/// without one when the request will never run), taken by the future.
struct Slot<T> {
    state: Mutex<SlotState<T>>,
}

struct SlotState<T> {
    done: bool,
    result: Option<Result<T>>,
    waker: Option<Waker>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            state: Mutex::new(SlotState {
                done: false,
                result: None,
                waker: None,
            }),
        }
    }
}

impl<T> Slot<T> {
    /// Stores the result; returns the waker of a future waiting for it,
    /// for the caller to wake (the worker does so after its batch).
    fn complete(&self, r: Result<T>) -> Option<Waker> {
        let mut st = self.state.lock();
        st.done = true;
        st.result = Some(r);
        st.waker.take()
    }
}

/// The result of an [`AsyncDb`] request, ready once a worker has run it.
/// Dropping it does not cancel the request (a write still happens).
#[must_use = "the request runs anyway; its result is only seen by awaiting the future"]
pub struct DbFuture<T> {
    req: Arc<dyn HasSlot<T>>,
}

impl<T> DbFuture<T> {
    /// Blocks this thread until the result is ready (for callers without
    /// an executor).
    pub fn wait(self) -> Result<T> {
        futures_executor::block_on(self)
    }
}

impl<T> Future for DbFuture<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut st = self.req.slot().state.lock();
        if st.done {
            // No result: the request was dropped without running (the
            // store shut down).
            return Poll::Ready(st.result.take().unwrap_or(Err(Error::Closed)));
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> std::fmt::Debug for DbFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbFuture").finish_non_exhaustive()
    }
}
