//! SmallBank and TATP over an in-process back-end: their invariants, the
//! same results in every mode, exact round trips of a warm transaction, and
//! exactly-once re-execution of the transactions of a writer that dies.

use std::collections::BTreeMap;

use rand::SeedableRng;

use nvstore_asym::apps::smallbank::{self, initial_balance};
use nvstore_asym::apps::tatp::{self, subscriber_rows};
use nvstore_asym::apps::{Outcome, SmallBank, Tatp};
use nvstore_asym::structures::recover;
use nvstore_asym::transport::SharedBackend;
use nvstore_asym::{LocalTransport, Mode, Remote};

// Shared with the structure tests; `val` is theirs.
#[allow(dead_code)]
mod common;
use common::{backend, doomed_writer, opts, MODES};

type Balances = BTreeMap<u64, (i64, i64)>;

fn initial(accounts: u64) -> Balances {
    (0..accounts)
        .map(|a| (a, (initial_balance(2 * a), initial_balance(2 * a + 1))))
        .collect()
}

/// SmallBank's transactions on a map, written apart from the app.
fn model(m: &mut Balances, tx: &smallbank::Tx) -> Outcome {
    use smallbank::Tx::*;
    match *tx {
        Balance { account } => {
            let (s, c) = m[&account];
            Outcome::Read(vec![s as u64, c as u64])
        }
        Amalgamate { from, to } => {
            let (s, c) = m[&from];
            m.insert(from, (0, 0));
            m.get_mut(&to).unwrap().1 += s + c;
            Outcome::Committed
        }
        DepositChecking { account, amount } => {
            m.get_mut(&account).unwrap().1 += amount;
            Outcome::Committed
        }
        SendPayment { from, to, amount } => {
            if m[&from].1 < amount {
                return Outcome::Aborted;
            }
            m.get_mut(&from).unwrap().1 -= amount;
            m.get_mut(&to).unwrap().1 += amount;
            Outcome::Committed
        }
        TransactSavings { account, amount } => {
            let e = m.get_mut(&account).unwrap();
            if e.0 + amount < 0 {
                return Outcome::Aborted;
            }
            e.0 += amount;
            Outcome::Committed
        }
        WriteCheck { account, amount } => {
            let e = m.get_mut(&account).unwrap();
            e.1 -= if e.0 + e.1 < amount { amount + 1 } else { amount };
            Outcome::Committed
        }
    }
}

fn open_bank(b: &SharedBackend, mode: Mode, batch: usize, accounts: u64) -> (Remote, SmallBank) {
    let mut r = Remote::open(LocalTransport::new(b.clone()), opts(mode, batch)).unwrap();
    let bank = SmallBank::open(&mut r, "bank", accounts).unwrap();
    (r, bank)
}

#[test]
fn smallbank_amalgamate_and_send_payment_conserve_money_in_every_mode() {
    for mode in MODES {
        let (mut r, mut bank) = open_bank(&backend(), mode, 16, 100);
        bank.load(&mut r).unwrap();
        let start = bank.total(&mut r).unwrap();
        assert_eq!(start, initial(100).values().map(|(s, c)| s + c).sum::<i64>());
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (mut committed, mut aborted) = (0, 0);
        for i in 0..600 {
            let kind = if i % 3 == 0 { "amalgamate" } else { "send_payment" };
            match bank
                .execute(&mut r, &smallbank::Tx::random_of(&mut rng, 100, kind))
                .unwrap()
            {
                Outcome::Committed => committed += 1,
                Outcome::Aborted => aborted += 1,
                o => panic!("{o:?}"),
            }
        }
        assert!(committed > 300 && aborted > 0, "{mode:?}: {committed} {aborted}");
        assert_eq!(bank.total(&mut r).unwrap(), start, "{mode:?}");
    }
}

#[test]
fn smallbank_agrees_with_a_model_in_every_mode_and_after_reopen() {
    for mode in MODES {
        let b = backend();
        let (mut r, mut bank) = open_bank(&b, mode, 16, 150);
        bank.load(&mut r).unwrap();
        let mut m = initial(150);
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let mut kinds = BTreeMap::new();
        for i in 0..1500 {
            let tx = smallbank::Tx::random(&mut rng, 150);
            let got = bank.execute(&mut r, &tx).unwrap();
            assert_eq!(got, model(&mut m, &tx), "{mode:?} tx {i} {tx:?}");
            *kinds.entry((tx.kind(), got == Outcome::Aborted)).or_insert(0) += 1;
        }
        assert_eq!(kinds.keys().filter(|k| !k.1).count(), 6, "every kind ran: {kinds:?}");
        assert_eq!(bank.balances(&mut r).unwrap(), m, "{mode:?}");
        r.close().unwrap();
        let (mut r, bank) = open_bank(&b, mode, 16, 150);
        assert_eq!(bank.balances(&mut r).unwrap(), m, "{mode:?} after reopen");
    }
}

#[test]
fn a_smallbank_writer_that_dies_is_recovered_exactly_once() {
    let mut redone = 0;
    for kill_after in [30u64, 77, 160] {
        let b = backend();
        let (mut r, mut bank) = open_bank(&b, Mode::Rcb, 8, 64);
        bank.load(&mut r).unwrap();
        r.close().unwrap();
        let mut r = doomed_writer(&b, kill_after);
        let mut bank = SmallBank::open(&mut r, "bank", 64).unwrap();
        let mut m = initial(64);
        let mut rng = rand::rngs::StdRng::seed_from_u64(kill_after);
        let mut done = 0;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            let tx = smallbank::Tx::random(&mut rng, 64);
            let got = bank.execute(&mut r, &tx).unwrap();
            assert_eq!(got, model(&mut m, &tx));
            done += 1;
        }));
        let payload = result.expect_err("the transport dies");
        let msg = payload.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("Io("), "ended by {msg:?}");
        assert!(done > 5, "the writer ran transactions before dying");
        drop(r);
        let (mut r, mut bank) = open_bank(&b, Mode::Rcb, 8, 64);
        redone += recover(&mut r, &mut bank).unwrap();
        assert_eq!(bank.balances(&mut r).unwrap(), m, "kill after {kill_after}");
        assert_eq!(recover(&mut r, &mut bank).unwrap(), 0);
    }
    assert!(redone > 0, "some logged transactions were re-executed");
}

/// Runs `n` TATP transactions of seed `seed` on a fresh database of
/// `subs` subscribers: the outcomes and the final rows.
fn tatp_run(mode: Mode, subs: u64, seed: u64, n: usize) -> (Vec<Outcome>, BTreeMap<u64, Vec<u8>>) {
    let b = backend();
    let mut r = Remote::open(LocalTransport::new(b), opts(mode, 16)).unwrap();
    let mut db = Tatp::open(&mut r, "tatp", subs).unwrap();
    db.load(&mut r).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let out = (0..n)
        .map(|_| db.execute(&mut r, &tatp::Tx::random(&mut rng, subs)).unwrap())
        .collect();
    let rows = db.rows(&mut r).unwrap();
    (out, rows)
}

#[test]
fn tatp_reads_find_what_was_loaded_and_inserted() {
    let b = backend();
    let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rc, 16)).unwrap();
    let mut db = Tatp::open(&mut r, "tatp", 120).unwrap();
    db.load(&mut r).unwrap();
    let mut all = BTreeMap::new();
    for s in 1..=120 {
        all.extend(subscriber_rows(s).into_iter().map(|(k, v)| (k, v.to_vec())));
    }
    assert_eq!(db.rows(&mut r).unwrap(), all);
    for s in 1..=120 {
        let got = db.execute(&mut r, &tatp::Tx::GetSubscriberData { s_id: s }).unwrap();
        assert!(matches!(got, Outcome::Read(_)), "subscriber {s}");
        for (k, v) in subscriber_rows(s) {
            assert_eq!(db.tree().get(&mut r, k).unwrap(), Some(v.to_vec()));
        }
    }
    // A forwarding inserted on an active facility is the new destination;
    // inserting it again fails, deleting it makes the destination go away.
    let (s_id, sf_type) = (1..=120u64)
        .flat_map(|s| (1..=4u8).map(move |t| (s, t)))
        .find(|&(s, t)| {
            let rows = subscriber_rows(s);
            let sf = rows.iter().find(|r| r.0 == tatp::special_facility_key(s, t));
            let cf = rows.iter().any(|r| r.0 == tatp::call_forwarding_key(s, t, 16));
            sf.is_some_and(|r| r.1[9] == 1) && !cf
        })
        .expect("an active facility without a forwarding at 16");
    let insert = tatp::Tx::InsertCallForwarding {
        sub_nbr: s_id,
        sf_type,
        start_time: 16,
        end_time: 24,
        numberx: 123_456_789,
    };
    assert_eq!(db.execute(&mut r, &insert).unwrap(), Outcome::Committed);
    assert_eq!(db.execute(&mut r, &insert).unwrap(), Outcome::Aborted);
    let dest = |db: &mut Tatp, r: &mut Remote| {
        let tx = tatp::Tx::GetNewDestination {
            s_id,
            sf_type,
            start_time: 16,
            end_time: 23,
        };
        match db.execute(r, &tx).unwrap() {
            Outcome::Read(v) => v.len(),
            _ => 0,
        }
    };
    assert!(dest(&mut db, &mut r) >= 1);
    let before = db.tree().len(&mut r).unwrap();
    let delete = tatp::Tx::DeleteCallForwarding {
        sub_nbr: s_id,
        sf_type,
        start_time: 16,
    };
    assert_eq!(db.execute(&mut r, &delete).unwrap(), Outcome::Committed);
    assert_eq!(db.execute(&mut r, &delete).unwrap(), Outcome::Aborted);
    assert_eq!(db.tree().len(&mut r).unwrap(), before - 1);
    assert_eq!(db.rows(&mut r).unwrap(), all);
}

#[test]
fn tatp_results_are_identical_in_every_mode() {
    let (want, rows) = tatp_run(Mode::Naive, 150, 9, 2000);
    let writes = want.iter().filter(|o| **o == Outcome::Committed).count();
    let reads = want.iter().filter(|o| matches!(o, Outcome::Read(_))).count();
    assert!(writes > 250 && reads > 1000, "{writes} writes, {reads} reads");
    for mode in [Mode::R, Mode::Rc, Mode::Rcb] {
        let (got, got_rows) = tatp_run(mode, 150, 9, 2000);
        assert!(got == want, "{mode:?}: outcomes differ");
        assert!(got_rows == rows, "{mode:?}: rows differ");
    }
}

#[test]
fn a_tatp_writer_that_dies_is_recovered_exactly_once() {
    let mut redone = 0;
    for kill_after in [40u64, 95] {
        let b = backend();
        let mut r = Remote::open(LocalTransport::new(b.clone()), opts(Mode::Rcb, 8)).unwrap();
        Tatp::open(&mut r, "tatp", 60).unwrap().load(&mut r).unwrap();
        r.close().unwrap();
        let mut r = doomed_writer(&b, kill_after);
        let mut db = Tatp::open(&mut r, "tatp", 60).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(kill_after);
        let mut done = 0;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            db.execute(&mut r, &tatp::Tx::random(&mut rng, 60)).unwrap();
            done += 1;
        }));
        let payload = result.expect_err("the transport dies");
        let msg = payload.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("Io("), "ended by {msg:?}");
        drop(r);
        let mut r = Remote::open(LocalTransport::new(b), opts(Mode::Rcb, 8)).unwrap();
        let mut db = Tatp::open(&mut r, "tatp", 60).unwrap();
        redone += recover(&mut r, &mut db).unwrap();
        assert!(done > 5, "the writer ran transactions before dying");
        // The same transactions, all acknowledged ones and no other, on a clean run.
        let (_, want) = tatp_run(Mode::R, 60, kill_after, done);
        assert!(
            db.rows(&mut r).unwrap() == want,
            "kill after {kill_after} ({done} done)"
        );
        assert_eq!(recover(&mut r, &mut db).unwrap(), 0);
    }
    assert!(redone > 0, "some logged transactions were re-executed");
}

#[test]
fn a_warm_write_transaction_costs_one_round_trip_with_caching() {
    // SmallBank rc: the rows are cached, so DepositChecking is its tx_write.
    let (mut r, mut bank) = open_bank(&backend(), Mode::Rc, 1, 32);
    bank.load(&mut r).unwrap();
    let tx = smallbank::Tx::DepositChecking {
        account: 5,
        amount: 100,
    };
    bank.execute(&mut r, &tx).unwrap();
    let start = r.counters().clone();
    for _ in 0..10 {
        bank.execute(&mut r, &tx).unwrap();
    }
    let d = r.counters().since(&start);
    assert_eq!((d.round_trips, d.verbs_of("tx_write")), (10, 10));
    // Naive: per row touched, the metadata, the bucket word and the node,
    // then the value written: DepositChecking touches one row.
    let (mut r, mut bank) = open_bank(&backend(), Mode::Naive, 1, 32);
    bank.load(&mut r).unwrap();
    let start = r.counters().clone();
    bank.execute(&mut r, &tx).unwrap();
    let d = r.counters().since(&start);
    assert!(d.round_trips >= 6, "{}", d.round_trips);
    // TATP rcb: UpdateLocation's index and subscriber leaves are cached;
    // it is one operation log until the batch fills.
    let mut r = Remote::open(LocalTransport::new(backend()), opts(Mode::Rcb, 64)).unwrap();
    let mut db = Tatp::open(&mut r, "tatp", 20).unwrap();
    db.load(&mut r).unwrap();
    let tx = tatp::Tx::UpdateLocation {
        sub_nbr: 7,
        vlr_location: 1,
    };
    db.execute(&mut r, &tx).unwrap();
    r.flush().unwrap();
    let start = r.counters().clone();
    for _ in 0..10 {
        db.execute(&mut r, &tx).unwrap();
    }
    let d = r.counters().since(&start);
    assert_eq!((d.round_trips, d.verbs_of("op_log")), (10, 10));
}
