//! The back-end's verbs and frame checks, through the in-process transport.

use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::transport::{share, Client, LocalTransport, SharedBackend};
use nvstore_asym::wire::{self, Code, MemLog, Reply, Request, Status, Verb};
use nvstore_asym::Layout;

fn backend() -> Backend<SimSpace> {
    Backend::create(SimSpace::new(64 << 10), Layout::small()).unwrap()
}

fn word(r: &Reply) -> u64 {
    match r {
        Reply::Word(w) => *w,
        other => panic!("expected a word, got {other:?}"),
    }
}

#[test]
fn torn_stale_and_replayed_frames_are_rejected_and_retransmits_run_once() {
    let mut b = backend();
    let hello = Request {
        epoch: 0,
        client: 7,
        seq: 1,
        verbs: vec![Verb::Hello],
    };
    let r = wire::decode_response(&b.handle_frame(&wire::encode_request(&hello))).unwrap();
    assert_eq!(r.status, Status::Ok);
    let epoch = b.epoch();
    let req = |seq: u64, epoch: u64, verbs: Vec<Verb>| {
        wire::encode_request(&Request {
            epoch,
            client: 7,
            seq,
            verbs,
        })
    };
    let status = |b: &mut Backend<SimSpace>, f: &[u8]| wire::decode_response(&b.handle_frame(f)).unwrap();

    // Torn: every truncation and a flipped byte, nothing runs.
    let f = req(
        2,
        epoch,
        vec![Verb::OpLog {
            payload: b"one".to_vec(),
        }],
    );
    for cut in [0, 5, wire::HEADER, f.len() - 1] {
        assert_eq!(status(&mut b, &f[..cut]).status, Status::Torn);
    }
    let mut g = f.clone();
    g[wire::HEADER + 3] ^= 1;
    assert_eq!(status(&mut b, &g).status, Status::Torn);
    assert_eq!(b.op_next(), 1);

    // Accepted once; a retransmission answers the same without running again.
    let first = b.handle_frame(&f);
    assert_eq!(b.op_next(), 2);
    assert_eq!(b.handle_frame(&f), first);
    assert_eq!(b.op_next(), 2);

    // Replayed (older sequence number), gap, unknown session, stale epoch.
    assert_eq!(
        status(&mut b, &req(1, epoch, vec![Verb::SeqRead])).status,
        Status::Replayed
    );
    assert_eq!(
        status(&mut b, &req(9, epoch, vec![Verb::SeqRead])).status,
        Status::NoSession
    );
    assert_eq!(
        status(&mut b, &req(3, epoch + 1, vec![Verb::SeqRead])).status,
        Status::Stale
    );
    let other = wire::encode_request(&Request {
        epoch,
        client: 8,
        seq: 1,
        verbs: vec![Verb::SeqRead],
    });
    assert_eq!(status(&mut b, &other).status, Status::NoSession);

    // After a restart the epoch moves on and the old session is stale.
    let b2 = Backend::open(SimSpace::from_image(b.space().persisted_image())).unwrap();
    assert!(b2.epoch() > epoch);
    let mut b2 = b2;
    assert_eq!(
        status(&mut b2, &req(3, epoch, vec![Verb::SeqRead])).status,
        Status::Stale
    );
    assert_eq!(b2.live_ops(), vec![(1, b"one".to_vec())]);
}

#[test]
fn op_log_ring_wraps_fills_and_is_freed_by_tx_write() {
    let mut b = backend();
    let payload = vec![0xab; 100];
    let mut seqs = Vec::new();
    loop {
        match b.verb(&Verb::OpLog {
            payload: payload.clone(),
        }) {
            Reply::Word(s) => seqs.push(s),
            Reply::Err(Code::LogFull, _) => break,
            other => panic!("{other:?}"),
        }
    }
    // 2048-byte ring, 16-byte header + 100 bytes rounded to 128: 16 entries.
    assert_eq!(seqs.len(), 16);
    let g = b.geometry();
    // Covering the first ten frees their room; the ring then wraps.
    let r = b.verb(&Verb::TxWrite {
        op_applied: 10,
        logs: vec![MemLog::Write {
            addr: g.data_off,
            data: vec![1; 8],
        }],
    });
    assert!(matches!(r, Reply::Word(_)), "{r:?}");
    assert_eq!(b.op_applied(), 10);
    for _ in 0..10 {
        assert!(matches!(
            b.verb(&Verb::OpLog {
                payload: payload.clone()
            }),
            Reply::Word(_)
        ));
    }
    assert!(matches!(
        b.verb(&Verb::OpLog {
            payload: payload.clone()
        }),
        Reply::Err(Code::LogFull, _)
    ));
    let live: Vec<u64> = b.live_ops().iter().map(|e| e.0).collect();
    assert_eq!(live, (11..=26).collect::<Vec<_>>());
    // Recovery finds the same live entries across the wrap.
    let r = Backend::open(SimSpace::from_image(b.space().persisted_image())).unwrap();
    assert_eq!(r.live_ops(), b.live_ops());
    assert_eq!((r.op_applied(), r.op_next()), (10, 27));
    // A transaction may not claim operations that were never logged or go back.
    assert!(matches!(
        b.verb(&Verb::TxWrite {
            op_applied: 27,
            logs: vec![]
        }),
        Reply::Err(Code::Invalid, _)
    ));
    assert!(matches!(
        b.verb(&Verb::TxWrite {
            op_applied: 9,
            logs: vec![]
        }),
        Reply::Err(Code::Invalid, _)
    ));
}

#[test]
fn tx_write_is_validated_whole_before_anything_changes() {
    let mut b = backend();
    let g = b.geometry();
    let before = b.peek(g.data_off, 64);
    let bad = Verb::TxWrite {
        op_applied: 0,
        logs: vec![
            MemLog::Write {
                addr: g.data_off,
                data: vec![5; 8],
            },
            MemLog::Write {
                addr: g.data_end(),
                data: vec![1],
            },
        ],
    };
    assert!(matches!(b.verb(&bad), Reply::Err(Code::Bounds, _)));
    assert_eq!(b.peek(g.data_off, 64), before);
    // Freeing a slab that is not allocated is refused too.
    let free = Verb::TxWrite {
        op_applied: 0,
        logs: vec![MemLog::Free {
            addr: g.data_off,
            slabs: 1,
        }],
    };
    assert!(matches!(b.verb(&free), Reply::Err(Code::Invalid, _)));
    let sn = word(&b.verb(&Verb::SeqRead));
    let ok = Verb::TxWrite {
        op_applied: 0,
        logs: vec![MemLog::Write {
            addr: g.data_off + 3,
            data: vec![9; 11],
        }],
    };
    assert!(matches!(b.verb(&ok), Reply::Word(_)));
    assert_eq!(b.peek(g.data_off + 3, 11), vec![9; 11]);
    // The reader-lock sequence number moved by two (odd during replay).
    assert_eq!(word(&b.verb(&Verb::SeqRead)), sn + 2);
}

#[test]
fn malloc_free_naming_and_writer_lock() {
    let mut b = backend();
    let g = b.geometry();
    let total = b.free_slabs();
    let a = word(&b.verb(&Verb::Malloc { slabs: 3 }));
    assert_eq!((a - g.data_off) % g.slab, 0);
    assert_eq!(b.free_slabs(), total - 3);
    assert!(matches!(
        b.verb(&Verb::Malloc { slabs: total as u32 }),
        Reply::Err(Code::NoSpace, _)
    ));
    let tx = Verb::TxWrite {
        op_applied: 0,
        logs: vec![MemLog::Free { addr: a, slabs: 3 }],
    };
    assert!(matches!(b.verb(&tx), Reply::Word(_)));
    assert_eq!(b.free_slabs(), total);
    assert!(matches!(
        b.verb(&Verb::Free { addr: a, slabs: 1 }),
        Reply::Err(Code::Invalid, _)
    ));

    assert!(matches!(
        b.verb(&Verb::NameGet { name: "root".into() }),
        Reply::Err(Code::NotFound, _)
    ));
    assert_eq!(
        b.verb(&Verb::NameSet {
            name: "root".into(),
            value: 42
        }),
        Reply::Ok
    );
    assert_eq!(
        word(&b.verb(&Verb::NameCas {
            name: "root".into(),
            old: 41,
            new: 1
        })),
        42
    );
    assert_eq!(
        word(&b.verb(&Verb::NameCas {
            name: "root".into(),
            old: 42,
            new: 43
        })),
        42
    );
    assert_eq!(word(&b.verb(&Verb::NameGet { name: "root".into() })), 43);
    let long = "x".repeat(wire::MAX_NAME + 1);
    assert!(matches!(
        b.verb(&Verb::NameSet { name: long, value: 1 }),
        Reply::Err(Code::Invalid, _)
    ));

    let lock = |o| Verb::WriterLock {
        name: "w".into(),
        owner: o,
    };
    assert_eq!(word(&b.verb(&lock(5))), 5);
    assert_eq!(
        word(&b.verb(&lock(5))),
        5,
        "re-entrant for its owner (a rebooted writer)"
    );
    assert_eq!(word(&b.verb(&lock(6))), 5, "held: answers the holder");
    assert!(matches!(
        b.verb(&Verb::WriterUnlock {
            name: "w".into(),
            owner: 6
        }),
        Reply::Err(Code::Locked, _)
    ));
    // The lock word is persistent: a restarted back-end still knows the holder.
    let mut r = Backend::open(SimSpace::from_image(b.space().persisted_image())).unwrap();
    assert_eq!(word(&r.verb(&lock(6))), 5);
    assert_eq!(
        r.verb(&Verb::WriterUnlock {
            name: "w".into(),
            owner: 5
        }),
        Reply::Ok
    );
    assert_eq!(word(&r.verb(&lock(6))), 6);
    assert_eq!(word(&r.verb(&Verb::NameGet { name: "root".into() })), 43);
}

#[test]
fn client_counts_round_trips_verbs_and_bytes() {
    let shared: SharedBackend = share(backend());
    let (mut c, h) = Client::connect(LocalTransport::new(shared.clone())).unwrap();
    assert_eq!(c.counters().round_trips, 1);
    let start = c.counters().clone();
    let r = c
        .post(&[
            Verb::OpLog { payload: vec![1; 10] },
            Verb::Read {
                addr: h.data_off,
                len: 16,
            },
            Verb::SeqRead,
        ])
        .unwrap();
    assert_eq!(r.len(), 3);
    let d = c.counters().since(&start);
    assert_eq!(d.round_trips, 1);
    assert_eq!(
        (
            d.verbs_of("op_log"),
            d.verbs_of("read"),
            d.verbs_of("seq_read"),
            d.verbs_of("tx_write")
        ),
        (1, 1, 1, 0)
    );
    assert!(d.bytes_sent > 10 + wire::HEADER as u64 && d.bytes_received > 16 + wire::HEADER as u64);
    // A verb error is a reply, not a failed post.
    let r = c.post(&[Verb::Read { addr: 0, len: 8 }]).unwrap();
    assert!(matches!(r[0], Reply::Err(Code::Bounds, _)));
}
