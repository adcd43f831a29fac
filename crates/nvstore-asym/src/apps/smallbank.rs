//! SmallBank (AsymNVM §9.3) over the remote hash table: each account has a
//! savings and a checking balance, two rows of the table (keys `2 * account`
//! and `2 * account + 1`; the row value is the balance, then the account
//! number). Balances are whole cents, so sums are exact.
//!
//! The six transactions of the H-Store SmallBank benchmark, in its mix:
//! Amalgamate 15%, Balance 15%, DepositChecking 15%, SendPayment 25%,
//! TransactSavings 15%, WriteCheck 15%; 90% of the accounts a transaction
//! names come from a hot set of 4% of the accounts.

use std::collections::BTreeMap;

use rand::Rng;

use super::{mix, tx_log, tx_words, Outcome};
use crate::structures::{HashTable, Replay, VALUE};
use crate::{Error, Remote, Result};

/// Smallest and largest initial balance, in cents.
pub const MIN_BALANCE: i64 = 10_000;
pub const MAX_BALANCE: i64 = 50_000;
/// Accounts loaded per logged load transaction.
const LOAD_CHUNK: u64 = 128;

const OP_LOAD: u8 = 1;
const OP_AMALGAMATE: u8 = 2;
const OP_DEPOSIT_CHECKING: u8 = 3;
const OP_SEND_PAYMENT: u8 = 4;
const OP_TRANSACT_SAVINGS: u8 = 5;
const OP_WRITE_CHECK: u8 = 6;

/// One SmallBank transaction and its parameters (amounts in cents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tx {
    /// Moves all of `from`'s money (savings and checking) into `to`'s checking.
    Amalgamate { from: u64, to: u64 },
    /// Reads an account's savings and checking balances.
    Balance { account: u64 },
    /// Adds `amount` (positive) to checking.
    DepositChecking { account: u64, amount: i64 },
    /// Moves `amount` from `from`'s checking to `to`'s; aborts on insufficient funds.
    SendPayment { from: u64, to: u64, amount: i64 },
    /// Adds `amount` (of either sign) to savings; aborts if savings would go negative.
    TransactSavings { account: u64, amount: i64 },
    /// Takes `amount` from checking, one cent more as a penalty if savings
    /// and checking together do not cover it.
    WriteCheck { account: u64, amount: i64 },
}

/// The standard mix's kinds, cumulative percentages.
const MIX: [(u32, &str); 6] = [
    (15, "amalgamate"),
    (30, "balance"),
    (45, "deposit_checking"),
    (70, "send_payment"),
    (85, "transact_savings"),
    (100, "write_check"),
];

impl Tx {
    /// A transaction of the standard mix over `accounts` accounts.
    pub fn random(rng: &mut impl Rng, accounts: u64) -> Tx {
        let p = rng.gen_range(0..100u32);
        let kind = MIX.iter().find(|(c, _)| p < *c).unwrap().1;
        Self::random_of(rng, accounts, kind)
    }

    /// A transaction of kind `kind` (as [`Tx::kind`] names it) with random parameters.
    pub fn random_of(rng: &mut impl Rng, accounts: u64, kind: &str) -> Tx {
        let a = pick(rng, accounts);
        let mut b = pick(rng, accounts);
        if accounts > 1 {
            while b == a {
                b = pick(rng, accounts);
            }
        }
        let amount = rng.gen_range(1..=100i64) * 100;
        match kind {
            "amalgamate" => Tx::Amalgamate { from: a, to: b },
            "balance" => Tx::Balance { account: a },
            "deposit_checking" => Tx::DepositChecking { account: a, amount },
            "send_payment" => Tx::SendPayment { from: a, to: b, amount },
            "transact_savings" => Tx::TransactSavings {
                account: a,
                amount: rng.gen_range(-100..=100i64) * 100,
            },
            _ => Tx::WriteCheck { account: a, amount },
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Tx::Amalgamate { .. } => "amalgamate",
            Tx::Balance { .. } => "balance",
            Tx::DepositChecking { .. } => "deposit_checking",
            Tx::SendPayment { .. } => "send_payment",
            Tx::TransactSavings { .. } => "transact_savings",
            Tx::WriteCheck { .. } => "write_check",
        }
    }
}

/// An account: 90% of the time from the hot 4%.
fn pick(rng: &mut impl Rng, accounts: u64) -> u64 {
    let hot = (accounts * 4 / 100).max(1);
    if rng.gen_range(0..100) < 90 {
        rng.gen_range(0..hot)
    } else {
        rng.gen_range(0..accounts.max(1))
    }
}

/// The initial balance of row `key`.
pub fn initial_balance(key: u64) -> i64 {
    MIN_BALANCE + (mix(key) % (MAX_BALANCE - MIN_BALANCE + 1) as u64) as i64
}

fn savings(account: u64) -> u64 {
    2 * account
}

fn checking(account: u64) -> u64 {
    2 * account + 1
}

fn row(key: u64, balance: i64) -> [u8; VALUE] {
    let mut v = [0u8; VALUE];
    v[..8].copy_from_slice(&balance.to_le_bytes());
    v[8..16].copy_from_slice(&(key / 2).to_le_bytes());
    v
}

/// SmallBank's accounts in a hash table on a back-end.
pub struct SmallBank {
    table: HashTable,
    accounts: u64,
}

impl SmallBank {
    /// Opens the bank named `name`, or creates it empty for `accounts`
    /// accounts (two buckets per account); [`SmallBank::load`] fills it.
    pub fn open(r: &mut Remote, name: &str, accounts: u64) -> Result<SmallBank> {
        Ok(SmallBank {
            table: HashTable::open(r, name, accounts.max(1) * 2)?,
            accounts: accounts.max(1),
        })
    }

    pub fn accounts(&self) -> u64 {
        self.accounts
    }

    /// Creates every account with its initial balances, in logged
    /// transactions of 128 accounts (accounts already present keep theirs).
    pub fn load(&mut self, r: &mut Remote) -> Result<()> {
        let mut lo = 0;
        while lo < self.accounts {
            let hi = (lo + LOAD_CHUNK).min(self.accounts);
            r.begin(&tx_log(OP_LOAD, &[lo, hi]));
            self.do_load(r, lo, hi)?;
            r.commit()?;
            lo = hi;
        }
        r.flush()
    }

    fn do_load(&mut self, r: &mut Remote, lo: u64, hi: u64) -> Result<()> {
        for a in lo..hi {
            for key in [savings(a), checking(a)] {
                if self.table.get(r, key)?.is_none() {
                    self.table.put_in_op(r, key, &row(key, initial_balance(key)))?;
                }
            }
        }
        Ok(())
    }

    fn balance(&self, r: &mut Remote, key: u64) -> Result<i64> {
        match self.table.get(r, key)? {
            Some(v) => Ok(i64::from_le_bytes(v[..8].try_into().unwrap())),
            None => Err(Error::Protocol(format!("SmallBank row {key} is missing"))),
        }
    }

    fn set(&mut self, r: &mut Remote, key: u64, balance: i64) -> Result<()> {
        self.table.put_in_op(r, key, &row(key, balance))
    }

    /// Runs one transaction; durable when it returns.
    pub fn execute(&mut self, r: &mut Remote, tx: &Tx) -> Result<Outcome> {
        self.run(r, tx, true)
    }

    /// Runs `tx`: reads, decides, then its writes as one operation whose
    /// log is `tx` (`logged`), or inside the caller's replay (not `logged`).
    fn run(&mut self, r: &mut Remote, tx: &Tx, logged: bool) -> Result<Outcome> {
        let log = |code: u8, words: &[u64]| if logged { Some(tx_log(code, words)) } else { None };
        // Each arm reads, then returns the log and the writes, or an outcome.
        let (op, writes): (Option<Vec<u8>>, Vec<(u64, i64)>) = match *tx {
            Tx::Balance { account } => {
                let s = self.balance(r, savings(account))?;
                let c = self.balance(r, checking(account))?;
                return Ok(Outcome::Read(vec![s as u64, c as u64]));
            }
            Tx::Amalgamate { from, to } => {
                let s = self.balance(r, savings(from))?;
                let c = self.balance(r, checking(from))?;
                let t = self.balance(r, checking(to))?;
                if from == to {
                    // Everything moves into the same checking account.
                    (
                        log(OP_AMALGAMATE, &[from, to]),
                        vec![(savings(from), 0), (checking(to), s + c)],
                    )
                } else {
                    (
                        log(OP_AMALGAMATE, &[from, to]),
                        vec![(savings(from), 0), (checking(from), 0), (checking(to), t + s + c)],
                    )
                }
            }
            Tx::DepositChecking { account, amount } => {
                if amount < 0 {
                    return Ok(Outcome::Aborted);
                }
                let c = self.balance(r, checking(account))?;
                (
                    log(OP_DEPOSIT_CHECKING, &[account, amount as u64]),
                    vec![(checking(account), c + amount)],
                )
            }
            Tx::SendPayment { from, to, amount } => {
                let f = self.balance(r, checking(from))?;
                let t = self.balance(r, checking(to))?;
                if f < amount || amount < 0 {
                    return Ok(Outcome::Aborted);
                }
                let writes = if from == to {
                    vec![]
                } else {
                    vec![(checking(from), f - amount), (checking(to), t + amount)]
                };
                (log(OP_SEND_PAYMENT, &[from, to, amount as u64]), writes)
            }
            Tx::TransactSavings { account, amount } => {
                let s = self.balance(r, savings(account))?;
                if s + amount < 0 {
                    return Ok(Outcome::Aborted);
                }
                (
                    log(OP_TRANSACT_SAVINGS, &[account, amount as u64]),
                    vec![(savings(account), s + amount)],
                )
            }
            Tx::WriteCheck { account, amount } => {
                let s = self.balance(r, savings(account))?;
                let c = self.balance(r, checking(account))?;
                let take = if s + c < amount { amount + 1 } else { amount };
                (
                    log(OP_WRITE_CHECK, &[account, amount as u64]),
                    vec![(checking(account), c - take)],
                )
            }
        };
        if writes.is_empty() {
            return Ok(Outcome::Committed);
        }
        if let Some(op) = &op {
            r.begin(op);
        }
        for (key, balance) in writes {
            self.set(r, key, balance)?;
        }
        if op.is_some() {
            r.commit()?;
        }
        Ok(Outcome::Committed)
    }

    /// Every account's `(savings, checking)` balances.
    pub fn balances(&self, r: &mut Remote) -> Result<BTreeMap<u64, (i64, i64)>> {
        let mut out: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
        for (key, v) in self.table.items(r)? {
            let b = i64::from_le_bytes(v[..8].try_into().unwrap());
            let e = out.entry(key / 2).or_default();
            if key % 2 == 0 {
                e.0 = b;
            } else {
                e.1 = b;
            }
        }
        Ok(out)
    }

    /// The money in the bank: every balance summed.
    pub fn total(&self, r: &mut Remote) -> Result<i64> {
        Ok(self.balances(r)?.values().map(|(s, c)| s + c).sum())
    }
}

impl Replay for SmallBank {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        let w = |n| tx_words(op, n, "SmallBank");
        let tx = match op.first() {
            Some(&OP_LOAD) => {
                let w = w(2)?;
                return self.do_load(r, w[0], w[1]);
            }
            Some(&OP_AMALGAMATE) => {
                let w = w(2)?;
                Tx::Amalgamate { from: w[0], to: w[1] }
            }
            Some(&OP_DEPOSIT_CHECKING) => {
                let w = w(2)?;
                Tx::DepositChecking {
                    account: w[0],
                    amount: w[1] as i64,
                }
            }
            Some(&OP_SEND_PAYMENT) => {
                let w = w(3)?;
                Tx::SendPayment {
                    from: w[0],
                    to: w[1],
                    amount: w[2] as i64,
                }
            }
            Some(&OP_TRANSACT_SAVINGS) => {
                let w = w(2)?;
                Tx::TransactSavings {
                    account: w[0],
                    amount: w[1] as i64,
                }
            }
            Some(&OP_WRITE_CHECK) => {
                let w = w(2)?;
                Tx::WriteCheck {
                    account: w[0],
                    amount: w[1] as i64,
                }
            }
            _ => return Err(Error::Protocol(format!("not a SmallBank transaction: {op:?}"))),
        };
        self.run(r, &tx, false).map(|_| ())
    }
}
