//! TATP (AsymNVM §9.3) over the remote B+-tree: the Telecom Application
//! Transaction Processing benchmark's four tables and its `sub_nbr` index
//! in one tree, each row a 64-byte value. Keys are subscriber-major, the
//! table and the row within the subscriber in the low byte:
//!
//! | table | key |
//! |---|---|
//! | Subscriber | `s_id << 8` |
//! | `sub_nbr` index | `sub_nbr << 8 \| 1` |
//! | Access_Info | `s_id << 8 \| 0x10 \| ai_type - 1` |
//! | Special_Facility | `s_id << 8 \| 0x20 \| sf_type - 1` |
//! | Call_Forwarding | `s_id << 8 \| 0x40 \| (sf_type - 1) << 2 \| start_time / 8` |
//!
//! `sub_nbr` is `s_id` as 15 decimal digits, so its index key is numeric
//! too, and lands beside its subscriber's rows; the three transactions
//! that name a subscriber by `sub_nbr` look it up there first. All rows of
//! a subscriber (about 11) are neighbours in the tree, so the lookups of
//! one transaction mostly share a leaf: one miss, not one per table.
//!
//! The read-dominant mix: GET_SUBSCRIBER_DATA 35%, GET_NEW_DESTINATION
//! 10%, GET_ACCESS_DATA 35%, UPDATE_SUBSCRIBER_DATA 2%, UPDATE_LOCATION
//! 14%, INSERT_CALL_FORWARDING 2%, DELETE_CALL_FORWARDING 2%; subscribers
//! are drawn with TATP's non-uniform distribution.

use std::collections::BTreeMap;

use rand::Rng;

use super::{mix, tx_log, tx_words, Outcome};
use crate::structures::{BpTree, Replay, VALUE};
use crate::{Error, Remote, Result};

/// A row to write: its key and value.
type Row = (u64, [u8; VALUE]);

/// Subscribers loaded per logged load transaction.
const LOAD_CHUNK: u64 = 32;

const OP_LOAD: u8 = 1;
const OP_UPDATE_SUBSCRIBER_DATA: u8 = 2;
const OP_UPDATE_LOCATION: u8 = 3;
const OP_INSERT_CALL_FORWARDING: u8 = 4;
const OP_DELETE_CALL_FORWARDING: u8 = 5;

const SUB_NBR: u64 = 1;
const AI: u64 = 0x10;
const SF: u64 = 0x20;
const CF: u64 = 0x40;

/// Subscriber row: `s_id`, `sub_nbr` (15 digits), `bit_1..10`, `hex_1..10`
/// (4 bits each), `byte2_1..10`, `msc_location`, `vlr_location`.
const SUB_BITS: usize = 23;
const SUB_HEX: usize = 25;
const SUB_BYTE2: usize = 30;
const SUB_MSC: usize = 40;
const SUB_VLR: usize = 44;
/// Special_Facility row: `s_id`, `sf_type`, `is_active`, `error_cntrl`, `data_a`, `data_b[5]`.
const SF_ACTIVE: usize = 9;
const SF_DATA_A: usize = 11;
/// Call_Forwarding row: `s_id`, `sf_type`, `start_time`, `end_time`, `numberx[15]`.
const CF_END: usize = 10;
const CF_NUMBERX: usize = 11;

/// The key of a subscriber's row.
pub fn subscriber_key(s_id: u64) -> u64 {
    s_id << 8
}

pub fn access_info_key(s_id: u64, ai_type: u8) -> u64 {
    s_id << 8 | AI | (ai_type as u64 - 1)
}

pub fn special_facility_key(s_id: u64, sf_type: u8) -> u64 {
    s_id << 8 | SF | (sf_type as u64 - 1)
}

pub fn call_forwarding_key(s_id: u64, sf_type: u8, start_time: u8) -> u64 {
    s_id << 8 | CF | (sf_type as u64 - 1) << 2 | (start_time as u64 / 8)
}

pub fn sub_nbr_key(sub_nbr: u64) -> u64 {
    sub_nbr << 8 | SUB_NBR
}

/// One TATP transaction and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tx {
    GetSubscriberData {
        s_id: u64,
    },
    GetNewDestination {
        s_id: u64,
        sf_type: u8,
        start_time: u8,
        end_time: u8,
    },
    GetAccessData {
        s_id: u64,
        ai_type: u8,
    },
    UpdateSubscriberData {
        s_id: u64,
        sf_type: u8,
        bit_1: u8,
        data_a: u8,
    },
    UpdateLocation {
        sub_nbr: u64,
        vlr_location: u32,
    },
    InsertCallForwarding {
        sub_nbr: u64,
        sf_type: u8,
        start_time: u8,
        end_time: u8,
        numberx: u64,
    },
    DeleteCallForwarding {
        sub_nbr: u64,
        sf_type: u8,
        start_time: u8,
    },
}

/// TATP's non-uniform subscriber: `(rand(0, A) | rand(1, P)) % P + 1`.
fn pick(rng: &mut impl Rng, subscribers: u64) -> u64 {
    let p = subscribers.max(1);
    let a = if p <= 1_000_000 {
        65_535
    } else if p <= 10_000_000 {
        1_048_575
    } else {
        2_097_151
    };
    (rng.gen_range(0..=a) | rng.gen_range(1..=p)) % p + 1
}

impl Tx {
    /// The subscriber whose rows the transaction reads and writes (a
    /// `sub_nbr` names `s_id`'s index row, and equals it).
    pub fn subscriber(&self) -> u64 {
        match *self {
            Tx::GetSubscriberData { s_id }
            | Tx::GetNewDestination { s_id, .. }
            | Tx::GetAccessData { s_id, .. }
            | Tx::UpdateSubscriberData { s_id, .. } => s_id,
            Tx::UpdateLocation { sub_nbr, .. }
            | Tx::InsertCallForwarding { sub_nbr, .. }
            | Tx::DeleteCallForwarding { sub_nbr, .. } => sub_nbr,
        }
    }

    /// A transaction of the read-dominant mix over `subscribers` subscribers.
    pub fn random(rng: &mut impl Rng, subscribers: u64) -> Tx {
        let s_id = pick(rng, subscribers);
        let sf_type = rng.gen_range(1..=4u8);
        let start_time = 8 * rng.gen_range(0..3u8);
        match rng.gen_range(0..100u32) {
            0..35 => Tx::GetSubscriberData { s_id },
            35..45 => Tx::GetNewDestination {
                s_id,
                sf_type,
                start_time,
                end_time: rng.gen_range(1..=24u8),
            },
            45..80 => Tx::GetAccessData {
                s_id,
                ai_type: rng.gen_range(1..=4u8),
            },
            80..82 => Tx::UpdateSubscriberData {
                s_id,
                sf_type,
                bit_1: rng.gen_range(0..=1u8),
                data_a: rng.gen(),
            },
            82..96 => Tx::UpdateLocation {
                sub_nbr: s_id,
                vlr_location: rng.gen(),
            },
            96..98 => Tx::InsertCallForwarding {
                sub_nbr: s_id,
                sf_type,
                start_time,
                end_time: start_time + rng.gen_range(1..=8u8),
                numberx: rng.gen_range(0..1_000_000_000_000_000u64),
            },
            _ => Tx::DeleteCallForwarding {
                sub_nbr: s_id,
                sf_type,
                start_time,
            },
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Tx::GetSubscriberData { .. } => "get_subscriber_data",
            Tx::GetNewDestination { .. } => "get_new_destination",
            Tx::GetAccessData { .. } => "get_access_data",
            Tx::UpdateSubscriberData { .. } => "update_subscriber_data",
            Tx::UpdateLocation { .. } => "update_location",
            Tx::InsertCallForwarding { .. } => "insert_call_forwarding",
            Tx::DeleteCallForwarding { .. } => "delete_call_forwarding",
        }
    }
}

/// `n` as 15 ASCII digits.
fn digits15(n: u64) -> [u8; 15] {
    let mut d = [b'0'; 15];
    let mut n = n;
    for i in (0..15).rev() {
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    d
}

/// The first `n` of a permutation of `1..=4` drawn from `h`.
fn types(h: u64, n: usize) -> Vec<u8> {
    let mut t = [1u8, 2, 3, 4];
    let mut h = h;
    for i in (1..4).rev() {
        t.swap(i, (h % (i as u64 + 1)) as usize);
        h /= 4;
    }
    t[..n].to_vec()
}

/// The rows of subscriber `s_id` as TATP populates them: a function of
/// `s_id` alone, so a reloaded chunk is the same.
pub fn subscriber_rows(s_id: u64) -> Vec<(u64, [u8; VALUE])> {
    let h = |salt: u64| mix(s_id.wrapping_mul(0x100).wrapping_add(salt));
    let mut rows = Vec::new();
    let mut sub = [0u8; VALUE];
    sub[..8].copy_from_slice(&s_id.to_le_bytes());
    sub[8..SUB_BITS].copy_from_slice(&digits15(s_id));
    let r = h(1);
    sub[SUB_BITS..SUB_HEX].copy_from_slice(&((r & 0x3ff) as u16).to_le_bytes());
    sub[SUB_HEX..SUB_BYTE2].copy_from_slice(&(r >> 10).to_le_bytes()[..5]);
    sub[SUB_BYTE2..SUB_MSC].copy_from_slice(&h(2).to_le_bytes().repeat(2)[..10]);
    let loc = h(3);
    sub[SUB_MSC..SUB_VLR].copy_from_slice(&(loc as u32).to_le_bytes());
    sub[SUB_VLR..SUB_VLR + 4].copy_from_slice(&((loc >> 32) as u32).to_le_bytes());
    rows.push((subscriber_key(s_id), sub));
    let mut idx = [0u8; VALUE];
    idx[..8].copy_from_slice(&s_id.to_le_bytes());
    idx[8..23].copy_from_slice(&digits15(s_id));
    rows.push((sub_nbr_key(s_id), idx));
    let a = h(4);
    for t in types(a >> 2, 1 + (a % 4) as usize) {
        let mut v = [0u8; VALUE];
        v[..8].copy_from_slice(&s_id.to_le_bytes());
        v[8] = t;
        let d = h(10 + t as u64).to_le_bytes();
        v[9..19].copy_from_slice(&d.repeat(2)[..10]);
        rows.push((access_info_key(s_id, t), v));
    }
    let s = h(5);
    for t in types(s >> 2, 1 + (s % 4) as usize) {
        let d = h(20 + t as u64);
        let mut v = [0u8; VALUE];
        v[..8].copy_from_slice(&s_id.to_le_bytes());
        v[8] = t;
        v[SF_ACTIVE] = (d % 100 < 85) as u8;
        v[10] = (d >> 8) as u8;
        v[SF_DATA_A] = (d >> 16) as u8;
        v[12..17].copy_from_slice(&(d >> 24).to_le_bytes()[..5]);
        rows.push((special_facility_key(s_id, t), v));
        // 0 to 3 call forwardings, at distinct start times.
        let c = h(30 + t as u64);
        let n = (c % 4) as usize;
        let mut starts = types(c >> 2, 4);
        starts.retain(|s| *s <= 3);
        for st in starts.into_iter().take(n).map(|s| 8 * (s - 1)) {
            let e = h(40 + 4 * t as u64 + st as u64 / 8);
            rows.push((
                call_forwarding_key(s_id, t, st),
                cf_row(s_id, t, st, st + 1 + (e % 8) as u8, e),
            ));
        }
    }
    rows
}

fn cf_row(s_id: u64, sf_type: u8, start: u8, end: u8, numberx: u64) -> [u8; VALUE] {
    let mut v = [0u8; VALUE];
    v[..8].copy_from_slice(&s_id.to_le_bytes());
    v[8] = sf_type;
    v[9] = start;
    v[CF_END] = end;
    v[CF_NUMBERX..CF_NUMBERX + 15].copy_from_slice(&digits15(numberx % 1_000_000_000_000_000));
    v
}

fn word(v: &[u8], at: usize, len: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..len].copy_from_slice(&v[at..at + len]);
    u64::from_le_bytes(b)
}

/// TATP's tables in a B+-tree on a back-end.
pub struct Tatp {
    tree: BpTree,
    subscribers: u64,
}

impl Tatp {
    /// Opens the database named `name` for `subscribers` subscribers
    /// (`s_id` 1 to `subscribers`), creating its tree empty if missing;
    /// [`Tatp::load`] fills it.
    pub fn open(r: &mut Remote, name: &str, subscribers: u64) -> Result<Tatp> {
        Ok(Tatp {
            tree: BpTree::open(r, name)?,
            subscribers: subscribers.max(1),
        })
    }

    pub fn subscribers(&self) -> u64 {
        self.subscribers
    }

    pub fn tree(&self) -> &BpTree {
        &self.tree
    }

    /// Populates every subscriber's rows, in logged transactions of 32
    /// subscribers (rows already present are kept).
    pub fn load(&mut self, r: &mut Remote) -> Result<()> {
        self.load_range(r, 1, self.subscribers + 1)
    }

    /// Populates the rows of subscribers `lo..hi` only (one partition's
    /// share: every row of a subscriber, its `sub_nbr` index row included,
    /// has a key from `s_id << 8` to `s_id << 8 | 255`).
    pub fn load_range(&mut self, r: &mut Remote, lo: u64, hi: u64) -> Result<()> {
        let (mut lo, end) = (lo.max(1), hi.min(self.subscribers + 1));
        while lo < end {
            let hi = (lo + LOAD_CHUNK).min(end);
            r.begin(&tx_log(OP_LOAD, &[lo, hi]));
            self.do_load(r, lo, hi)?;
            r.commit()?;
            lo = hi;
        }
        r.flush()
    }

    fn do_load(&mut self, r: &mut Remote, lo: u64, hi: u64) -> Result<()> {
        for s_id in lo..hi {
            for (k, v) in subscriber_rows(s_id) {
                if self.tree.get(r, k)?.is_none() {
                    self.tree.put_in_op(r, k, &v)?;
                }
            }
        }
        Ok(())
    }

    /// Runs one transaction; durable when it returns.
    pub fn execute(&mut self, r: &mut Remote, tx: &Tx) -> Result<Outcome> {
        self.run(r, tx, true)
    }

    /// Reads, decides, then writes as one operation logged as `tx`
    /// (`logged`) or inside the caller's replay.
    fn run(&mut self, r: &mut Remote, tx: &Tx, logged: bool) -> Result<Outcome> {
        let t = &mut self.tree;
        let (op, puts, delete): (Vec<u8>, Vec<Row>, Option<u64>) = match *tx {
            Tx::GetSubscriberData { s_id } => {
                return Ok(match t.get(r, subscriber_key(s_id))? {
                    Some(v) => Outcome::Read(vec![
                        word(&v, SUB_BITS, 2),
                        word(&v, SUB_HEX, 5),
                        word(&v, SUB_BYTE2, 8),
                        word(&v, SUB_MSC, 4),
                        word(&v, SUB_VLR, 4),
                    ]),
                    None => Outcome::Aborted,
                })
            }
            Tx::GetNewDestination {
                s_id,
                sf_type,
                start_time,
                end_time,
            } => {
                let active = t
                    .get(r, special_facility_key(s_id, sf_type))?
                    .is_some_and(|v| v[SF_ACTIVE] == 1);
                if !active {
                    return Ok(Outcome::Aborted);
                }
                let mut found = Vec::new();
                for st in (0..=start_time).step_by(8) {
                    if let Some(v) = t.get(r, call_forwarding_key(s_id, sf_type, st))? {
                        if end_time < v[CF_END] {
                            found.push(word(&v, CF_NUMBERX, 8));
                        }
                    }
                }
                return Ok(if found.is_empty() {
                    Outcome::Aborted
                } else {
                    Outcome::Read(found)
                });
            }
            Tx::GetAccessData { s_id, ai_type } => {
                return Ok(match t.get(r, access_info_key(s_id, ai_type))? {
                    Some(v) => Outcome::Read(vec![word(&v, 9, 8), word(&v, 17, 2)]),
                    None => Outcome::Aborted,
                })
            }
            Tx::UpdateSubscriberData {
                s_id,
                sf_type,
                bit_1,
                data_a,
            } => {
                let (Some(sub), Some(sf)) = (
                    t.get(r, subscriber_key(s_id))?,
                    t.get(r, special_facility_key(s_id, sf_type))?,
                ) else {
                    return Ok(Outcome::Aborted);
                };
                let mut sub: [u8; VALUE] = sub.try_into().unwrap();
                let mut sf: [u8; VALUE] = sf.try_into().unwrap();
                sub[SUB_BITS] = sub[SUB_BITS] & !1 | bit_1 & 1;
                sf[SF_DATA_A] = data_a;
                (
                    tx_log(
                        OP_UPDATE_SUBSCRIBER_DATA,
                        &[s_id, sf_type as u64, bit_1 as u64, data_a as u64],
                    ),
                    vec![(subscriber_key(s_id), sub), (special_facility_key(s_id, sf_type), sf)],
                    None,
                )
            }
            Tx::UpdateLocation { sub_nbr, vlr_location } => {
                let Some(s_id) = s_id_of(t, r, sub_nbr)? else {
                    return Ok(Outcome::Aborted);
                };
                let Some(sub) = t.get(r, subscriber_key(s_id))? else {
                    return Ok(Outcome::Aborted);
                };
                let mut sub: [u8; VALUE] = sub.try_into().unwrap();
                sub[SUB_VLR..SUB_VLR + 4].copy_from_slice(&vlr_location.to_le_bytes());
                (
                    tx_log(OP_UPDATE_LOCATION, &[sub_nbr, vlr_location as u64]),
                    vec![(subscriber_key(s_id), sub)],
                    None,
                )
            }
            Tx::InsertCallForwarding {
                sub_nbr,
                sf_type,
                start_time,
                end_time,
                numberx,
            } => {
                let Some(s_id) = s_id_of(t, r, sub_nbr)? else {
                    return Ok(Outcome::Aborted);
                };
                // The facility must exist, the forwarding must not (its primary key).
                if t.get(r, special_facility_key(s_id, sf_type))?.is_none()
                    || t.get(r, call_forwarding_key(s_id, sf_type, start_time))?.is_some()
                {
                    return Ok(Outcome::Aborted);
                }
                (
                    tx_log(
                        OP_INSERT_CALL_FORWARDING,
                        &[sub_nbr, sf_type as u64, start_time as u64, end_time as u64, numberx],
                    ),
                    vec![(
                        call_forwarding_key(s_id, sf_type, start_time),
                        cf_row(s_id, sf_type, start_time, end_time, numberx),
                    )],
                    None,
                )
            }
            Tx::DeleteCallForwarding {
                sub_nbr,
                sf_type,
                start_time,
            } => {
                let Some(s_id) = s_id_of(t, r, sub_nbr)? else {
                    return Ok(Outcome::Aborted);
                };
                let key = call_forwarding_key(s_id, sf_type, start_time);
                if t.get(r, key)?.is_none() {
                    return Ok(Outcome::Aborted);
                }
                (
                    tx_log(OP_DELETE_CALL_FORWARDING, &[sub_nbr, sf_type as u64, start_time as u64]),
                    vec![],
                    Some(key),
                )
            }
        };
        if logged {
            r.begin(&op);
        }
        for (k, v) in puts {
            t.put_in_op(r, k, &v)?;
        }
        if let Some(k) = delete {
            t.remove_in_op(r, k)?;
        }
        if logged {
            r.commit()?;
        }
        Ok(Outcome::Committed)
    }

    /// Every row, by key.
    pub fn rows(&self, r: &mut Remote) -> Result<BTreeMap<u64, Vec<u8>>> {
        self.tree.scan(r)
    }
}

/// `sub_nbr`'s `s_id` through the index.
fn s_id_of(t: &BpTree, r: &mut Remote, sub_nbr: u64) -> Result<Option<u64>> {
    Ok(t.get(r, sub_nbr_key(sub_nbr))?.map(|v| word(&v, 0, 8)))
}

impl Replay for Tatp {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        let w = |n| tx_words(op, n, "TATP");
        let tx = match op.first() {
            Some(&OP_LOAD) => {
                let w = w(2)?;
                return self.do_load(r, w[0], w[1]);
            }
            Some(&OP_UPDATE_SUBSCRIBER_DATA) => {
                let w = w(4)?;
                Tx::UpdateSubscriberData {
                    s_id: w[0],
                    sf_type: w[1] as u8,
                    bit_1: w[2] as u8,
                    data_a: w[3] as u8,
                }
            }
            Some(&OP_UPDATE_LOCATION) => {
                let w = w(2)?;
                Tx::UpdateLocation {
                    sub_nbr: w[0],
                    vlr_location: w[1] as u32,
                }
            }
            Some(&OP_INSERT_CALL_FORWARDING) => {
                let w = w(5)?;
                Tx::InsertCallForwarding {
                    sub_nbr: w[0],
                    sf_type: w[1] as u8,
                    start_time: w[2] as u8,
                    end_time: w[3] as u8,
                    numberx: w[4],
                }
            }
            Some(&OP_DELETE_CALL_FORWARDING) => {
                let w = w(3)?;
                Tx::DeleteCallForwarding {
                    sub_nbr: w[0],
                    sf_type: w[1] as u8,
                    start_time: w[2] as u8,
                }
            }
            _ => return Err(Error::Protocol(format!("not a TATP transaction: {op:?}"))),
        };
        self.run(r, &tx, false).map(|_| ())
    }
}
