//! One workload operation against a pool and what it returned: the piece
//! the campaign's main line, its second writer and the image checks share.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::probe::Probe;
use super::workload::Op;
use super::{panic_msg, Config};
use crate::db::Db;
use crate::error::Result;
use crate::txn::WriteBatch;

/// The name crash-test pools carry in messages.
pub(super) const PATH: &str = "crashtest";

/// What an operation returned, or the error or panic it ended in.
pub(super) type OpResult = std::result::Result<Outcome, String>;

/// What an operation returned.
#[derive(Debug, PartialEq)]
pub(super) enum Outcome {
    Put,
    Deleted(bool),
    Got(Option<Vec<u8>>),
}

/// Runs `op` on `db`, catching panics.
pub(super) fn exec(db: &Db<Probe>, op: &Op) -> OpResult {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<Outcome> {
        Ok(match op {
            Op::Put(k, v) => {
                db.put(k, v)?;
                Outcome::Put
            }
            Op::Del(k) => Outcome::Deleted(db.delete(k)?),
            Op::PutPinned(k, v) => {
                let snap = db.snapshot()?;
                db.put(k, v)?;
                drop(snap);
                Outcome::Put
            }
            Op::DelPinned(k) => {
                let snap = db.snapshot()?;
                let deleted = db.delete(k)?;
                drop(snap);
                Outcome::Deleted(deleted)
            }
            Op::Get(k) => Outcome::Got(db.get(k)?),
            Op::Batch(w) => {
                let mut b = WriteBatch::new();
                for (k, v) in w {
                    match v {
                        Some(v) => b.put(k, v),
                        None => b.delete(k),
                    }
                }
                db.write_batch(b)?;
                Outcome::Put
            }
            Op::Txn(w) if w.len() == 1 => {
                // A one-key transaction: the read-modify-write path that
                // skips the transaction machinery.
                let (k, v) = &w[0];
                db.write_one(k, |_| match v {
                    Some(v) => (crate::txn::OneWrite::Put(v.to_vec()), ()),
                    None => (crate::txn::OneWrite::Delete, ()),
                })?;
                Outcome::Put
            }
            Op::Txn(w) => {
                db.transaction(|tx| {
                    for (k, v) in w {
                        tx.get(k)?;
                        match v {
                            Some(v) => tx.put(k, v)?,
                            None => tx.delete(k)?,
                        }
                    }
                    Ok(())
                })?;
                Outcome::Put
            }
        })
    }));
    match r {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(e)) => Err(format!("error: {e}")),
        Err(p) => Err(format!("panic: {}", panic_msg(&p))),
    }
}

/// `o` as violation reports show it.
pub(super) fn outcome_str(o: &Outcome) -> String {
    match o {
        Outcome::Put => "ok".into(),
        Outcome::Deleted(b) => format!("deleted={b}"),
        Outcome::Got(v) => match v {
            Some(v) => format!("a {} B value", v.len()),
            None => "nothing".into(),
        },
    }
}

/// Keys each workload thread draws from.
pub(super) fn keys_per_thread(cfg: &Config) -> u32 {
    (cfg.keys / cfg.threads.clamp(1, 2) as u32).max(4)
}
