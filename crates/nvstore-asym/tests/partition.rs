//! Partitioning (AsymNVM §8.3, §9.5): a structure spread over 1–3
//! back-ends answers exactly as on one back-end, each partition has one
//! writer, and a writer that dies is recovered on its partition alone.

#[allow(dead_code, reason = "this file uses part of the shared setup")]
mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use common::{backend, opts, snap, val};
use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::structures::{BpTree, HashTable, Queue};
use nvstore_asym::transport::{share, SharedBackend};
use nvstore_asym::wire::Code;
use nvstore_asym::{
    server, Error, Fault, FaultyTransport, Layout, LocalTransport, Mode, PartitionMap, Partitioned, Remote,
    RemoteOptions, TcpTransport, Transport,
};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

const KEYS: u64 = 600;

/// A back-end kept by its type, so a test can look at its pool.
type Node = Arc<Mutex<Backend<SimSpace>>>;

fn shared(b: &Node) -> SharedBackend {
    b.clone()
}

fn local(bs: &[Node]) -> Vec<Box<dyn Transport>> {
    bs.iter()
        .map(|b| Box::new(LocalTransport::new(shared(b))) as Box<dyn Transport>)
        .collect()
}

fn backends(n: usize) -> Vec<Node> {
    (0..n)
        .map(|_| {
            Arc::new(Mutex::new(
                Backend::create(SimSpace::new(8 << 20), Layout::default_for(8 << 20)).unwrap(),
            ))
        })
        .collect()
}

fn owner(o: u64, mode: Mode) -> RemoteOptions {
    RemoteOptions {
        owner: o,
        ..opts(mode, 8)
    }
}

/// The operations the model test runs, on one structure or routed.
#[derive(Clone, Copy, Debug)]
enum Op {
    Put(u64, u64),
    Remove(u64),
    Get(u64),
}

fn ops(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n as u64)
        .map(|i| {
            let k = rng.gen_range(0..KEYS);
            match rng.gen_range(0..10) {
                0..=5 => Op::Put(k, i),
                6..=7 => Op::Remove(k),
                _ => Op::Get(k),
            }
        })
        .collect()
}

/// What one operation answered.
type Answer = Option<Vec<u8>>;

macro_rules! kv_model {
    ($name:ident, $ty:ty, $open:expr, $map:expr, $items:ident, $sorted:expr) => {
        #[test]
        fn $name() {
            for mode in [Mode::R, Mode::Rcb] {
                for n in 1..=3usize {
                    let run = ops(n as u64 * 7 + 1, 1500);
                    // One back-end: the reference.
                    let one = backend();
                    let mut r = Remote::open(LocalTransport::new(one.clone()), opts(mode, 8)).unwrap();
                    let mut s: $ty = $open(&mut r).unwrap();
                    let want: Vec<Answer> = run
                        .iter()
                        .map(|op| match *op {
                            Op::Put(k, i) => s.put(&mut r, k, &val(i)).map(|_| None),
                            Op::Remove(k) => s.remove(&mut r, k),
                            Op::Get(k) => s.get(&mut r, k),
                        })
                        .collect::<Result<_, _>>()
                        .unwrap();
                    let want_items: Vec<(u64, Vec<u8>)> = s.$items(&mut r).unwrap().into_iter().collect();

                    let bs = backends(n);
                    let map: PartitionMap = $map(n);
                    let mut p: Partitioned<$ty> =
                        Partitioned::open_writers(map.clone(), "kv", local(&bs), &opts(mode, 8), |_, r| $open(r))
                            .unwrap();
                    let got: Vec<Answer> = run
                        .iter()
                        .map(|op| match *op {
                            Op::Put(k, i) => p.with_key(k, |s, r| s.put(r, k, &val(i)).map(|_| None)),
                            Op::Remove(k) => p.with_key(k, |s, r| s.remove(r, k)),
                            Op::Get(k) => p.with_key(k, |s, r| s.get(r, k)),
                        })
                        .collect::<Result<_, _>>()
                        .unwrap();
                    assert_eq!(got, want, "{mode:?}, {n} partitions: answers");
                    let per: Vec<Vec<(u64, Vec<u8>)>> =
                        p.each(|_, s, r| Ok(s.$items(r)?.into_iter().collect())).unwrap();
                    for (i, items) in per.iter().enumerate() {
                        assert!(
                            items.iter().all(|(k, _)| map.of(*k) == i),
                            "a key in the wrong partition"
                        );
                        if n > 1 {
                            assert!(!items.is_empty(), "partition {i} got no key");
                        }
                    }
                    let mut all: Vec<(u64, Vec<u8>)> = per.into_iter().flatten().collect();
                    let mut want_items = want_items;
                    if !$sorted {
                        all.sort();
                        want_items.sort();
                    }
                    // Range partitions in order are the keys in order: no sort for the tree.
                    assert_eq!(all, want_items, "{mode:?}, {n} partitions: contents");
                    p.close().unwrap();

                    // A reader front-end over all partitions sees the same.
                    let mut rd: Partitioned<$ty> =
                        Partitioned::open_readers(map.clone(), "kv", local(&bs), &opts(mode, 8), |_, r| $open(r))
                            .unwrap();
                    for (k, v) in &want_items {
                        let got = rd.with_key(*k, |s, r| r.read_locked(|r| s.get(r, *k))).unwrap();
                        assert_eq!(got.as_ref(), Some(v));
                    }
                }
            }
        }
    };
}

kv_model!(
    range_partitioned_bptree_answers_as_one_backend,
    BpTree,
    |r: &mut Remote| BpTree::open(r, "kv"),
    |n| PartitionMap::range_even(n, KEYS),
    scan,
    true
);
kv_model!(
    hash_partitioned_table_answers_as_one_backend,
    HashTable,
    |r: &mut Remote| HashTable::open(r, "kv", 64),
    PartitionMap::hash,
    items,
    false
);

#[test]
fn hash_partitioned_queue_keeps_fifo_within_each_partition() {
    for n in 1..=3usize {
        let bs = backends(n);
        let map = PartitionMap::hash(n);
        let mut p: Partitioned<Queue> =
            Partitioned::open_writers(map.clone(), "q", local(&bs), &opts(Mode::Rcb, 8), |_, r| {
                Queue::open(r, "q")
            })
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
        let (mut next, mut out) = (0u64, Vec::new());
        for _ in 0..600 {
            if rng.gen_range(0..3) < 2 {
                p.with_key(next, |q, r| q.enqueue(r, next, &val(next))).unwrap();
                next += 1;
            } else if let Some((k, v)) = p.dequeue().unwrap() {
                assert_eq!(v, val(k));
                out.push(k);
            }
        }
        let left: Vec<Vec<(u64, Vec<u8>)>> = p.each(|_, q, r| q.items(r)).unwrap();
        // Every key once, dequeued or left; each partition dequeued in enqueue order.
        let mut all: Vec<u64> = out.clone();
        all.extend(left.iter().flatten().map(|(k, _)| *k));
        all.sort();
        assert_eq!(all, (0..next).collect::<Vec<_>>());
        for (i, left) in left.iter().enumerate() {
            let mine: Vec<u64> = out.iter().copied().filter(|k| map.of(*k) == i).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "partition {i} out of order");
            assert!(left.iter().all(|(k, _)| map.of(*k) == i));
        }
        while p.dequeue().unwrap().is_some() {}
        assert!(p.each(|_, q, r| q.is_empty(r)).unwrap().into_iter().all(|e| e));
    }
}

fn tcp_backends(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|_| {
            let b = share(Backend::create(SimSpace::new(8 << 20), Layout::default_for(8 << 20)).unwrap());
            let (l, addr) = server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            std::thread::spawn(move || server::serve(l, b));
            addr
        })
        .collect()
}

#[test]
fn partitions_over_tcp_backends_answer_as_one_backend() {
    let addrs = tcp_backends(3);
    let run = ops(99, 600);
    let one = backend();
    let mut r = Remote::open(LocalTransport::new(one), opts(Mode::Rcb, 8)).unwrap();
    let mut t = BpTree::open(&mut r, "kv").unwrap();
    let map = PartitionMap::range_even(3, KEYS);
    let tcp = |addrs: &[SocketAddr]| -> Vec<TcpTransport> {
        addrs.iter().map(|a| TcpTransport::connect(*a).unwrap()).collect()
    };
    let mut p: Partitioned<BpTree> =
        Partitioned::open_writers(map.clone(), "kv", tcp(&addrs), &opts(Mode::Rcb, 8), |_, r| {
            BpTree::open(r, "kv")
        })
        .unwrap();
    for op in run {
        let (want, got) = match op {
            Op::Put(k, i) => {
                t.put(&mut r, k, &val(i)).unwrap();
                p.with_key(k, |s, r| s.put(r, k, &val(i))).unwrap();
                (None, None)
            }
            Op::Remove(k) => (
                t.remove(&mut r, k).unwrap(),
                p.with_key(k, |s, r| s.remove(r, k)).unwrap(),
            ),
            Op::Get(k) => (t.get(&mut r, k).unwrap(), p.with_key(k, |s, r| s.get(r, k)).unwrap()),
        };
        assert_eq!(got, want, "{op:?}");
    }
    let want: Vec<_> = t.scan(&mut r).unwrap().into_iter().collect();
    p.close().unwrap();
    // A second front-end, after the first released its locks, sees it all.
    let mut p: Partitioned<BpTree> = Partitioned::open_writers(map, "kv", tcp(&addrs), &opts(Mode::Rcb, 8), |_, r| {
        BpTree::open(r, "kv")
    })
    .unwrap();
    let got: Vec<_> = p.each(|_, s, r| s.scan(r)).unwrap().into_iter().flatten().collect();
    assert_eq!(got, want);
}

#[test]
fn each_partition_has_a_single_writer_and_many_readers() {
    let bs = backends(3);
    let map = PartitionMap::range_even(3, KEYS);
    let open = |_: usize, r: &mut Remote| BpTree::open(r, "kv");
    let one = |i: usize, o: u64| {
        Partitioned::open_writer_of(
            map.clone(),
            "kv",
            i,
            LocalTransport::new(shared(&bs[i])),
            &owner(o, Mode::Rcb),
            open,
        )
    };
    let mut w0 = one(0, 1).unwrap();
    let mut w1 = one(1, 2).unwrap();
    // A second writer of a held partition is refused, whatever the others do.
    for o in [2, 3] {
        match one(0, o) {
            Err(Error::Verb { code: Code::Locked, .. }) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("owner {o} took partition 0's writer lock from owner 1"),
        }
    }
    assert!(w0.holds(0) && !w0.holds(1) && !w0.holds(2));
    // A writer routes only its own partition's keys.
    let k1 = KEYS / 2;
    assert_eq!(map.of(k1), 1);
    assert!(matches!(
        w0.with_key(k1, |s, r| s.put(r, k1, &val(1))),
        Err(Error::Partition(_))
    ));
    for k in [1, KEYS / 3 - 1] {
        w0.with_key(k, |s, r| s.put(r, k, &val(k))).unwrap();
    }
    w1.with_key(k1, |s, r| s.put(r, k1, &val(k1))).unwrap();
    w0.flush().unwrap();
    w1.flush().unwrap();
    // Partition 2 has had no writer: readers cannot open it yet.
    let readers = || Partitioned::open_readers(map.clone(), "kv", local(&bs), &owner(9, Mode::Rcb), open);
    assert!(matches!(readers(), Err(Error::Partition(_))));
    let mut w2 = one(2, 3).unwrap();
    w2.with_key(KEYS - 1, |s, r| s.put(r, KEYS - 1, &val(7))).unwrap();
    w2.flush().unwrap();
    let mut rd = [readers().unwrap(), readers().unwrap()];
    for rd in &mut rd {
        let all: Vec<u64> = rd
            .each(|_, s, r| r.read_locked(|r| s.scan(r)))
            .unwrap()
            .into_iter()
            .flat_map(|m| m.into_keys())
            .collect();
        assert_eq!(all, vec![1, KEYS / 3 - 1, k1, KEYS - 1]);
    }
    // Released, the lock goes to the next writer.
    w0.close().unwrap();
    let mut w0b = one(0, 4).unwrap();
    assert_eq!(w0b.with_key(1, |s, r| s.get(r, 1)).unwrap(), Some(val(1)));
}

#[test]
fn backends_in_another_order_or_another_map_are_refused() {
    let bs = backends(3);
    let map = PartitionMap::range_even(3, KEYS);
    let open = |_: usize, r: &mut Remote| BpTree::open(r, "kv");
    Partitioned::open_writers(map.clone(), "kv", local(&bs), &opts(Mode::Rcb, 8), open)
        .unwrap()
        .close()
        .unwrap();
    let swapped = vec![bs[1].clone(), bs[0].clone(), bs[2].clone()];
    for (what, m, b) in [
        ("swapped back-ends", map.clone(), swapped),
        ("a hash map", PartitionMap::hash(3), bs.clone()),
        ("other ranges", PartitionMap::range_even(3, KEYS * 2), bs.clone()),
    ] {
        match Partitioned::open_writers(m, "kv", local(&b), &opts(Mode::Rcb, 8), open) {
            Err(Error::Partition(msg)) => assert!(msg.contains("partition"), "{msg}"),
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    assert!(matches!(
        Partitioned::open_writers(PartitionMap::hash(2), "kv", local(&bs), &opts(Mode::Rcb, 8), open),
        Err(Error::Partition(_))
    ));
    // The same map, in order, still opens.
    Partitioned::open_writers(map, "kv", local(&bs), &opts(Mode::Rcb, 8), open).unwrap();
}

#[test]
fn a_killed_writer_of_one_partition_recovers_exactly_once_alone() {
    let mut replayed_somewhere = false;
    for kill_after in [25u64, 40, 77, 150, 260] {
        let bs = backends(3);
        let map = PartitionMap::range_even(3, KEYS);
        let open = |_: usize, r: &mut Remote| BpTree::open(r, "kv");
        let writer = |i: usize, t: Box<dyn Transport>| {
            Partitioned::open_writer_of(map.clone(), "kv", i, t, &owner(10 + i as u64, Mode::Rcb), open).unwrap()
        };
        // Partition 1's writer dies after `kill_after` round trips (its opening included).
        let doomed = Fault {
            kill_after: Some(kill_after),
            ..Fault::default()
        };
        let mut ws = vec![
            writer(0, Box::new(LocalTransport::new(shared(&bs[0])))),
            writer(
                1,
                Box::new(FaultyTransport::new(LocalTransport::new(shared(&bs[1])), doomed)),
            ),
            writer(2, Box::new(LocalTransport::new(shared(&bs[2])))),
        ];
        let mut model = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(kill_after);
        let (mut dead_at, mut after) = (None, 0);
        for i in 0..2000u64 {
            let k = rng.gen_range(0..KEYS);
            let part = map.of(k);
            if part == 1 && dead_at.is_some() {
                continue;
            }
            match ws[part].with_key(k, |s, r| s.put(r, k, &val(i))) {
                Ok(()) => {
                    model.insert(k, val(i));
                }
                Err(e) => {
                    assert!(part == 1 && e.is_disconnect(), "partition {part}: {e}");
                    dead_at = Some(i);
                }
            }
            if dead_at.is_some() {
                after += 1;
                if after > 200 {
                    break;
                }
            }
        }
        assert!(dead_at.is_some(), "kill after {kill_after}: the writer never died");
        // The others keep writing; their state is what it is before recovery.
        for w in [0, 2] {
            ws[w].flush().unwrap();
        }
        let before: Vec<_> = [0, 2].map(|i| snap(&bs[i].lock())).into();
        drop(ws.remove(1));
        let mut again = writer(1, Box::new(LocalTransport::new(shared(&bs[1]))));
        let n = again.recover().unwrap();
        assert_eq!(n.len(), 1, "recovery touches only the partition it holds");
        assert_eq!(n[0].0, 1);
        replayed_somewhere |= n[0].1 > 0;
        let after_rec: Vec<_> = [0, 2].map(|i| snap(&bs[i].lock())).into();
        assert_eq!(before, after_rec, "recovering partition 1 changed another partition");
        assert_eq!(again.recover().unwrap(), vec![(1, 0)], "re-executed twice");
        again.flush().unwrap();
        let mut rd: Partitioned<BpTree> =
            Partitioned::open_readers(map.clone(), "kv", local(&bs), &opts(Mode::Rcb, 8), open).unwrap();
        let all: BTreeMap<u64, Vec<u8>> = rd
            .each(|_, s, r| r.read_locked(|r| s.scan(r)))
            .unwrap()
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(all, model, "kill after {kill_after}");
    }
    assert!(replayed_somewhere, "no kill point left an operation to re-execute");
}

#[test]
fn a_writer_that_dies_anywhere_in_opening_leaves_partitions_that_open_again() {
    // Opening a partition: hello, writer lock, the map record (name_get,
    // malloc, tx_write, name_set), the structure. Die after each round trip.
    let open = |_: usize, r: &mut Remote| BpTree::open(r, "kv");
    let map = PartitionMap::range_even(2, KEYS);
    let mut survived = false;
    for kill_after in 1..=20u64 {
        let bs = backends(2);
        let doomed = Fault {
            kill_after: Some(kill_after),
            ..Fault::default()
        };
        let links: Vec<Box<dyn Transport>> = vec![
            Box::new(LocalTransport::new(shared(&bs[0]))),
            Box::new(FaultyTransport::new(LocalTransport::new(shared(&bs[1])), doomed)),
        ];
        match Partitioned::open_writers(map.clone(), "kv", links, &opts(Mode::Rcb, 8), open) {
            Ok(p) => {
                survived = true;
                drop(p);
            }
            Err(e) => assert!(e.is_disconnect(), "kill after {kill_after}: {e}"),
        }
        // The same writer again: the record is there whole, or written now.
        let mut p = Partitioned::open_writers(map.clone(), "kv", local(&bs), &opts(Mode::Rcb, 8), open).unwrap();
        assert_eq!(p.recover().unwrap().iter().map(|(_, n)| n).sum::<u64>(), 0);
        for k in [1, KEYS - 1] {
            p.with_key(k, |s, r| s.put(r, k, &val(k))).unwrap();
            assert_eq!(p.with_key(k, |s, r| s.get(r, k)).unwrap(), Some(val(k)));
        }
        p.close().unwrap();
        let swapped = vec![bs[1].clone(), bs[0].clone()];
        assert!(matches!(
            Partitioned::open_writers(map.clone(), "kv", local(&swapped), &opts(Mode::Rcb, 8), open),
            Err(Error::Partition(_))
        ));
    }
    assert!(survived, "no kill point let the opening finish");
}

#[test]
fn tatp_over_subscriber_ranges_answers_as_one_backend() {
    use nvstore_asym::apps::{tatp, Tatp};
    let subs = 120u64;
    let one = backend();
    let mut r = Remote::open(LocalTransport::new(one), opts(Mode::Rcb, 8)).unwrap();
    let mut db = Tatp::open(&mut r, "tatp", subs).unwrap();
    db.load(&mut r).unwrap();
    for n in 1..=3u64 {
        // Partition i: subscribers first[i]..first[i + 1], keys from subscriber_key(first[i]).
        let first: Vec<u64> = (0..=n).map(|i| 1 + subs * i / n).collect();
        let starts = (0..n as usize)
            .map(|i| if i == 0 { 0 } else { tatp::subscriber_key(first[i]) })
            .collect();
        let map = PartitionMap::range(starts).unwrap();
        let bs = backends(n as usize);
        let mut p: Partitioned<Tatp> =
            Partitioned::open_writers(map, "tatp", local(&bs), &opts(Mode::Rcb, 8), |_, r| {
                Tatp::open(r, "tatp", subs)
            })
            .unwrap();
        for i in 0..n as usize {
            let (lo, hi) = (first[i], first[i + 1]);
            p.with_key(tatp::subscriber_key(lo), |t, r| t.load_range(r, lo, hi))
                .unwrap();
        }
        let mut single = {
            // A fresh single-back-end copy for this round.
            let b = backend();
            let mut r1 = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 8)).unwrap();
            let mut d = Tatp::open(&mut r1, "tatp", subs).unwrap();
            d.load(&mut r1).unwrap();
            (r1, d)
        };
        assert_eq!(
            p.each(|_, t, r| t.rows(r))
                .unwrap()
                .into_iter()
                .flatten()
                .collect::<Vec<_>>(),
            db.rows(&mut r).unwrap().into_iter().collect::<Vec<_>>(),
            "{n} partitions: loaded rows"
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(n);
        for _ in 0..1500 {
            let tx = tatp::Tx::random(&mut rng, subs);
            let want = single.1.execute(&mut single.0, &tx).unwrap();
            let got = p
                .with_key(tatp::subscriber_key(tx.subscriber()), |t, r| t.execute(r, &tx))
                .unwrap();
            assert_eq!(got, want, "{tx:?}");
        }
        let got: Vec<_> = p.each(|_, t, r| t.rows(r)).unwrap().into_iter().flatten().collect();
        let want: Vec<_> = single.1.rows(&mut single.0).unwrap().into_iter().collect();
        assert_eq!(got, want, "{n} partitions: rows after the transactions");
    }
}
