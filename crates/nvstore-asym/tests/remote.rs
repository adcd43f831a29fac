//! The front-end over an in-process back-end: modes, exact round trips,
//! caching, batching, and exactly-once re-execution after a writer dies.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::structures::{recover, Queue, Stack};
use nvstore_asym::transport::{share, SharedBackend};
use nvstore_asym::wire::Status;
use nvstore_asym::{Error, Fault, FaultyTransport, Layout, LocalTransport, Mode, Remote, RemoteOptions};

mod common;
use common::{backend, doomed_writer, opts, val, Switch, MODES};

#[test]
fn queue_and_stack_agree_with_a_model_in_every_mode_and_survive_reopen() {
    for mode in MODES {
        let b = backend();
        let mut r = Remote::open(LocalTransport::new(b.clone()), opts(mode, 7)).unwrap();
        let mut q = Queue::open(&mut r, "q").unwrap();
        let mut s = Stack::open(&mut r, "s").unwrap();
        let (mut mq, mut ms) = (VecDeque::new(), Vec::new());
        for i in 0..300u64 {
            if i % 3 == 2 {
                assert_eq!(q.dequeue(&mut r).unwrap(), mq.pop_front(), "{mode:?} op {i}");
                assert_eq!(s.pop(&mut r).unwrap(), ms.pop(), "{mode:?} op {i}");
            } else {
                q.enqueue(&mut r, i, &val(i)).unwrap();
                mq.push_back((i, val(i)));
                s.push(&mut r, i, &val(i)).unwrap();
                ms.push((i, val(i)));
            }
        }
        assert_eq!(q.items(&mut r).unwrap(), mq.iter().cloned().collect::<Vec<_>>());
        r.close().unwrap();
        let mut r = Remote::open(LocalTransport::new(b), opts(mode, 7)).unwrap();
        let q = Queue::open(&mut r, "q").unwrap();
        let s = Stack::open(&mut r, "s").unwrap();
        assert_eq!(q.len(&mut r).unwrap(), mq.len() as u64);
        assert_eq!(q.items(&mut r).unwrap(), mq.into_iter().collect::<Vec<_>>(), "{mode:?}");
        assert_eq!(
            s.items(&mut r).unwrap(),
            ms.into_iter().rev().collect::<Vec<_>>(),
            "{mode:?}"
        );
    }
}

/// Round trips per enqueue once warm, mallocs (one per 51 nodes) excluded;
/// a malloc that carried its operation's log (rcb) counts as the log's.
fn enqueue_round_trips(mode: Mode, batch: usize, n: u64) -> (u64, u64) {
    let mut r = Remote::open(LocalTransport::new(backend()), opts(mode, batch)).unwrap();
    let mut q = Queue::open(&mut r, "q").unwrap();
    q.enqueue(&mut r, 0, &val(0)).unwrap();
    r.flush().unwrap();
    let start = r.counters().clone();
    let allocs = r.alloc_trips();
    for i in 1..=n {
        q.enqueue(&mut r, i, &val(i)).unwrap();
    }
    let d = r.counters().since(&start);
    let allocs = r.alloc_trips() - allocs;
    (d.round_trips - allocs, d.verbs_of("tx_write"))
}

#[test]
fn round_trips_per_write_are_exact_in_each_mode() {
    // naive: read the metadata, write the node, link it, write the metadata.
    assert_eq!(enqueue_round_trips(Mode::Naive, 1, 100), (400, 0));
    // r: read the metadata, one tx_write.
    assert_eq!(enqueue_round_trips(Mode::R, 1, 100), (200, 100));
    // rc: the metadata is cached; one tx_write.
    assert_eq!(enqueue_round_trips(Mode::Rc, 1, 100), (100, 100));
    // rcb: one operation log each; every 10th carries the batch's tx_write.
    assert_eq!(enqueue_round_trips(Mode::Rcb, 10, 100), (100, 10));
}

#[test]
fn a_writer_that_dies_is_recovered_exactly_once() {
    for kill_after in [9u64, 17, 40, 63] {
        let b = backend();
        let mut r = doomed_writer(&b, kill_after);
        let mut q = Queue::open(&mut r, "q").unwrap();
        let mut model = VecDeque::new();
        let mut i = 0u64;
        let err = loop {
            i += 1;
            let res = if i.is_multiple_of(4) {
                q.dequeue(&mut r).map(|v| assert_eq!(v, model.pop_front()))
            } else {
                q.enqueue(&mut r, i, &val(i)).map(|_| model.push_back((i, val(i))))
            };
            if let Err(e) = res {
                break e;
            }
        };
        assert!(matches!(err, Error::Io(_)), "{err}");
        drop(r);
        // The restarted writer (same identity) re-executes the unapplied op logs.
        let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 8)).unwrap();
        let mut q2 = Queue::open(&mut r, "q").unwrap();
        recover(&mut r, &mut q2).unwrap();
        assert_eq!(
            q2.items(&mut r).unwrap(),
            model.into_iter().collect::<Vec<_>>(),
            "kill after {kill_after}"
        );
        assert_eq!(
            recover(&mut r, &mut q2).unwrap(),
            0,
            "a second recovery has nothing left"
        );
    }
}

/// A writer whose op-log ring fills mid-batch commits the batch (which
/// already holds the current operation's writes) and logs again. Dying at
/// any round trip around that must still leave every operation applied
/// once: the operation that failed at most once, an acknowledged one
/// exactly once, none twice.
#[test]
fn a_writer_that_dies_around_a_full_op_ring_is_recovered_exactly_once() {
    let layout = Layout {
        op_ring: 1024,
        ..Layout::default_for(8 << 20)
    };
    let mut ring_full_seen = false;
    for kill_after in 1..=60u64 {
        let b = share(Backend::create(SimSpace::new(8 << 20), layout).unwrap());
        let fault = Fault {
            kill_after: Some(kill_after),
            ..Fault::default()
        };
        // Batches far larger than the ring: only a full ring commits them.
        let Ok(mut r) = Remote::open(
            FaultyTransport::new(LocalTransport::new(b.clone()), fault),
            opts(Mode::Rcb, 10_000),
        ) else {
            continue; // killed before the first operation
        };
        let Ok(mut q) = Queue::open(&mut r, "q") else {
            continue;
        };
        let mut model = Vec::new();
        let mut i = 0u64;
        let failed = loop {
            i += 1;
            let before = r.counters().clone();
            match q.enqueue(&mut r, i, &val(i)) {
                Ok(()) => {
                    let d = r.counters().since(&before);
                    ring_full_seen |= d.verbs_of("op_log") >= 2;
                    model.push((i, val(i)));
                }
                Err(_) => break (i, val(i)),
            }
        };
        drop(r);
        let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 10_000)).unwrap();
        let mut q2 = Queue::open(&mut r, "q").unwrap();
        recover(&mut r, &mut q2).unwrap();
        let got = q2.items(&mut r).unwrap();
        let mut with_failed = model.clone();
        with_failed.push(failed);
        assert!(
            got == model || got == with_failed,
            "kill after {kill_after}: {} items recovered, {} acknowledged",
            got.len(),
            model.len()
        );
        assert_eq!(recover(&mut r, &mut q2).unwrap(), 0, "kill after {kill_after}");
    }
    assert!(ring_full_seen, "no enqueue met a full op-log ring");
}

#[test]
fn a_back_end_restart_makes_the_session_stale_and_recovery_completes_it() {
    let typed = Arc::new(Mutex::new(
        Backend::create(SimSpace::new(8 << 20), Layout::default_for(8 << 20)).unwrap(),
    ));
    let shared: SharedBackend = typed.clone();
    let switch = Switch(Arc::new(Mutex::new(shared)));
    let mut r = Remote::open(switch.clone(), opts(Mode::Rcb, 16)).unwrap();
    let mut s = Stack::open(&mut r, "s").unwrap();
    for i in 0..50 {
        s.push(&mut r, i, &val(i)).unwrap();
    }
    // The back-end process dies and restarts on the persisted bytes.
    let image = typed.lock().space().persisted_image();
    let restarted: SharedBackend = share(Backend::open(SimSpace::from_image(image)).unwrap());
    *switch.0.lock() = restarted;
    let e = s.push(&mut r, 99, &val(99)).unwrap_err();
    assert!(matches!(e, Error::Rejected(Status::Stale)), "{e}");
    drop(r);
    let mut r = Remote::open(switch, opts(Mode::Rcb, 16)).unwrap();
    let mut s = Stack::open(&mut r, "s").unwrap();
    // Batches of 16 covered 48 pushes; the last two are re-executed.
    assert_eq!(recover(&mut r, &mut s).unwrap(), 2);
    let items: Vec<u64> = s.items(&mut r).unwrap().into_iter().map(|x| x.0).collect();
    assert_eq!(items, (0..50).rev().collect::<Vec<_>>());
}

#[test]
fn bptree_agrees_with_a_model_in_every_mode() {
    use nvstore_asym::structures::BpTree;
    use rand::{Rng, SeedableRng};
    for mode in MODES {
        let b = backend();
        let mut r = Remote::open(LocalTransport::new(b.clone()), opts(mode, 32)).unwrap();
        let mut t = BpTree::open(&mut r, "t").unwrap();
        let mut model = std::collections::BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for i in 0..1500u64 {
            let k = rng.gen_range(0..3000u64);
            t.put(&mut r, k, &val(i)).unwrap();
            model.insert(k, val(i));
            if i % 97 == 0 {
                let probe = rng.gen_range(0..3000u64);
                assert_eq!(t.get(&mut r, probe).unwrap(), model.get(&probe).cloned(), "{mode:?}");
            }
        }
        assert_eq!(t.len(&mut r).unwrap(), model.len() as u64);
        r.close().unwrap();
        let mut r = Remote::open(LocalTransport::new(b), opts(mode, 32)).unwrap();
        let t = BpTree::open(&mut r, "t").unwrap();
        assert_eq!(t.scan(&mut r).unwrap(), model, "{mode:?}");
    }
}

#[test]
fn bptree_updates_with_a_warm_cache_cost_one_round_trip_in_rcb() {
    use nvstore_asym::structures::BpTree;
    let mut r = Remote::open(LocalTransport::new(backend()), opts(Mode::Rcb, 50)).unwrap();
    let mut t = BpTree::open(&mut r, "t").unwrap();
    for k in 0..500u64 {
        t.put(&mut r, k * 7 % 500, &val(k)).unwrap();
    }
    for k in 0..500u64 {
        t.get(&mut r, k).unwrap();
    }
    let start = r.counters().clone();
    for k in 0..500u64 {
        t.put(&mut r, k, &val(k + 1)).unwrap();
    }
    let d = r.counters().since(&start);
    assert_eq!(
        (d.round_trips, d.verbs_of("op_log"), d.verbs_of("tx_write")),
        (500, 500, 10)
    );
}

#[test]
fn a_bptree_writer_that_dies_is_recovered_exactly_once() {
    use nvstore_asym::structures::BpTree;
    for kill_after in [30u64, 77] {
        let b = backend();
        let mut r = doomed_writer(&b, kill_after);
        let mut t = BpTree::open(&mut r, "t").unwrap();
        let mut model = std::collections::BTreeMap::new();
        for i in 0.. {
            let k = i * 37 % 1000;
            if t.put(&mut r, k, &val(i)).is_err() {
                break;
            }
            model.insert(k, val(i));
        }
        drop(r);
        let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 8)).unwrap();
        let mut t = BpTree::open(&mut r, "t").unwrap();
        recover(&mut r, &mut t).unwrap();
        assert_eq!(t.scan(&mut r).unwrap(), model, "kill after {kill_after}");
        assert_eq!(t.len(&mut r).unwrap(), model.len() as u64);
    }
}

#[test]
fn an_old_batch_travels_with_the_next_operation_log() {
    let o = RemoteOptions {
        mode: Mode::Rcb,
        batch: 1000,
        flush_after: Duration::ZERO,
        ..RemoteOptions::default()
    };
    let mut r = Remote::open(LocalTransport::new(backend()), o).unwrap();
    let mut q = Queue::open(&mut r, "q").unwrap();
    q.enqueue(&mut r, 0, &val(0)).unwrap();
    r.flush().unwrap();
    let start = r.counters().clone();
    let allocs = r.alloc_trips();
    for i in 1..=20 {
        q.enqueue(&mut r, i, &val(i)).unwrap();
    }
    let before_flush = r.counters().round_trips;
    r.flush().unwrap();
    let flush_trip = r.counters().round_trips - before_flush;
    let d = r.counters().since(&start);
    let allocs = r.alloc_trips() - allocs;
    // Batch by age: every operation's frame carries the batch, still one
    // round trip each (an operation whose log rode on its malloc leaves its
    // batch to the next frame, or to the flush when it is the last).
    assert_eq!(
        (
            d.round_trips - allocs - flush_trip,
            d.verbs_of("op_log"),
            d.verbs_of("tx_write")
        ),
        (20, 20, 20)
    );
}

/// Queue length a reader sees on the back-end.
fn seen_len(b: &SharedBackend) -> u64 {
    let mut rd = Remote::open_reader(LocalTransport::new(b.clone()), opts(Mode::R, 1)).unwrap();
    let q = Queue::open(&mut rd, "q").unwrap();
    q.len(&mut rd).unwrap()
}

#[test]
fn the_flush_timer_sends_an_idle_writers_batch() {
    let b = backend();
    let o = RemoteOptions {
        mode: Mode::Rcb,
        batch: 1000,
        flush_after: Duration::from_millis(20),
        ..RemoteOptions::default()
    };
    // Without the timer, an idle writer's batch stays in the front-end.
    let mut r = Remote::open(LocalTransport::new(b.clone()), o.clone()).unwrap();
    let mut q = Queue::open(&mut r, "q").unwrap();
    for i in 0..5 {
        q.enqueue(&mut r, i, &val(i)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(seen_len(&b), 0);
    // A timer finds the batch old and sends it in one tx_write.
    let start = r.counters().clone();
    let shared = Arc::new(Mutex::new(r));
    let timer = nvstore_asym::FlushTimer::start(shared.clone());
    let t0 = std::time::Instant::now();
    while seen_len(&b) != 5 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen_len(&b), 5);
    assert_eq!(timer.flushes(), 1);
    // Operations the writer runs meanwhile are never split by the timer.
    for i in 5..50 {
        q.enqueue(&mut shared.lock(), i, &val(i)).unwrap();
    }
    let t0 = std::time::Instant::now();
    while seen_len(&b) != 50 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen_len(&b), 50);
    drop(timer);
    let r = Arc::try_unwrap(shared).ok().expect("timer thread joined").into_inner();
    let d = r.counters().since(&start);
    assert!(d.verbs_of("tx_write") >= 2, "{d:?}");
    assert_eq!(d.verbs_of("op_log"), 45);
}
