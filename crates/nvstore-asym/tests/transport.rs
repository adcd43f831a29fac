//! TCP, in-process and fault-injecting transports against a real back-end.

use std::net::SocketAddr;
use std::time::Duration;

use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::transport::{share, SharedBackend};
use nvstore_asym::wire::{Reply, Verb};
use nvstore_asym::{server, Client, Error, Fault, FaultyTransport, Layout, LocalTransport, TcpTransport};

fn start() -> (SharedBackend, SocketAddr) {
    let b = Backend::create(SimSpace::new(1 << 20), Layout::default_for(1 << 20)).unwrap();
    let shared = share(b);
    let (l, addr) = server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let s = shared.clone();
    std::thread::spawn(move || server::serve(l, s));
    (shared, addr)
}

fn op_seq(r: &[Reply]) -> u64 {
    match r[0] {
        Reply::Word(w) => w,
        ref o => panic!("{o:?}"),
    }
}

#[test]
fn tcp_posts_are_one_round_trip_each_even_with_split_reads() {
    let (_b, addr) = start();
    for split in [None, Some(64), Some(7)] {
        let mut t = TcpTransport::connect(addr).unwrap();
        if let Some(n) = split {
            t = t.split_io(n);
        }
        let (mut c, h) = Client::connect(t).unwrap();
        let start = c.counters().clone();
        let big = vec![0x5a; 3000];
        let r = c
            .post(&[
                Verb::Write {
                    addr: h.data_off,
                    data: big.clone(),
                },
                Verb::Read {
                    addr: h.data_off,
                    len: 3000,
                },
                Verb::OpLog {
                    payload: b"put k v".to_vec(),
                },
            ])
            .unwrap();
        assert_eq!(r[1], Reply::Data(big));
        let d = c.counters().since(&start);
        assert_eq!(d.round_trips, 1, "split {split:?}");
        assert_eq!(d.retransmits, 0);
    }
}

#[test]
fn lost_and_torn_frames_are_retransmitted_and_run_exactly_once() {
    let (b, addr) = start();
    let fault = Fault {
        drop_request_every: 3,
        drop_response_every: 4,
        tear_every: 5,
        ..Fault::default()
    };
    let t = FaultyTransport::new(TcpTransport::connect(addr).unwrap(), fault);
    let (mut c, _) = Client::connect(t).unwrap();
    let mut seqs = Vec::new();
    for i in 0..40u8 {
        seqs.push(op_seq(&c.post(&[Verb::OpLog { payload: vec![i] }]).unwrap()));
    }
    // Every append ran once: consecutive sequence numbers, 40 live logs.
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
    assert!(c.counters().retransmits > 10, "{:?}", c.counters());
    let (mut local, _) = Client::connect(LocalTransport::new(b)).unwrap();
    match &local.post(&[Verb::OpLogRead { from: 0, max: 100 }]).unwrap()[0] {
        Reply::OpLogs(v) => assert_eq!(
            v.iter().map(|e| e.1[0]).collect::<Vec<_>>(),
            (0..40).collect::<Vec<u8>>()
        ),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_killed_link_fails_and_a_delayed_one_still_works() {
    let (b, _) = start();
    let fault = Fault {
        kill_after: Some(3),
        ..Fault::default()
    };
    let (mut c, _) = Client::connect(FaultyTransport::new(LocalTransport::new(b.clone()), fault)).unwrap();
    c.post(&[Verb::SeqRead]).unwrap();
    c.post(&[Verb::SeqRead]).unwrap();
    let e = c.post(&[Verb::SeqRead]).unwrap_err();
    assert!(matches!(e, Error::Io(_)) && e.is_disconnect(), "{e}");

    let fault = Fault {
        delay: Duration::from_millis(2),
        ..Fault::default()
    };
    let (mut c, _) = Client::connect(FaultyTransport::new(LocalTransport::new(b), fault)).unwrap();
    let t0 = std::time::Instant::now();
    c.post(&[Verb::SeqRead]).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(2));
}
