//! The model side of checking one image: which states an image may recover
//! to, and what each operation must return and change.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::op::Outcome;
use super::workload::{show, Model, Op, Val};

/// Where an image comes from, for violation reports.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) op: u64,
    pub(super) what: String,
    pub(super) point: &'static str,
    pub(super) kind: String,
}

impl Ctx {
    pub(super) fn main(op: u64, what: &str, kind: &str) -> Ctx {
        Ctx {
            op,
            what: what.into(),
            point: "-",
            kind: kind.into(),
        }
    }
}

/// The states an image may recover to: `base` with any subset of the
/// in-flight effects applied (they touch distinct keys).
#[derive(Clone)]
pub(super) struct Allowed {
    pub(super) base: Arc<Model>,
    /// Per in-flight op, the keys it wrote with their values before it:
    /// each op is undone whole or not at all.
    pub(super) inflight: Vec<Vec<(Vec<u8>, Option<Val>)>>,
    /// The pool's creation was not acknowledged yet: "not a pool" is fine.
    pub(super) creating: bool,
    /// A clean close was acknowledged: recovery must be instant.
    pub(super) instant: bool,
}

impl Allowed {
    /// Exactly `base`.
    pub(super) fn exactly(base: Arc<Model>) -> Allowed {
        Allowed {
            base,
            inflight: Vec::new(),
            creating: false,
            instant: false,
        }
    }

    pub(super) fn candidates(&self) -> usize {
        1 << self.inflight.len()
    }

    /// Expected value of `k` in candidate `mask`.
    pub(super) fn get(&self, mask: usize, k: &[u8]) -> Option<&[u8]> {
        for (i, group) in self.inflight.iter().enumerate() {
            if mask & (1 << i) == 0 {
                continue;
            }
            if let Some((_, v)) = group.iter().find(|(ik, _)| ik.as_slice() == k) {
                return v.as_ref().map(|v| v.as_slice());
            }
        }
        self.base.get(k).map(|v| v.as_slice())
    }

    pub(super) fn len(&self, mask: usize) -> usize {
        let mut n = self.base.len() as i64;
        for (i, group) in self.inflight.iter().enumerate() {
            if mask & (1 << i) != 0 {
                for (k, v) in group {
                    n += v.is_some() as i64 - self.base.contains_key(k) as i64;
                }
            }
        }
        n as usize
    }

    /// Whether sorted, distinct `pairs` are exactly candidate `mask`.
    pub(super) fn matches(&self, mask: usize, pairs: &[(Vec<u8>, Vec<u8>)]) -> bool {
        pairs.len() == self.len(mask) && pairs.iter().all(|(k, v)| self.get(mask, k) == Some(v.as_slice()))
    }

    pub(super) fn materialize(&self, mask: usize) -> Model {
        let mut m = (*self.base).clone();
        for (i, group) in self.inflight.iter().enumerate() {
            if mask & (1 << i) != 0 {
                for (k, v) in group {
                    match v {
                        Some(v) => m.insert(k.clone(), v.clone()),
                        None => m.remove(k),
                    };
                }
            }
        }
        m
    }

    /// A short account of how `pairs` differ from the base model.
    pub(super) fn diff(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> String {
        let got: BTreeMap<&[u8], &[u8]> = pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
        let mut out = Vec::new();
        for (k, v) in self.base.iter() {
            match got.get(k.as_slice()) {
                None => out.push(format!("missing {}", show(k))),
                Some(g) if *g != v.as_slice() => out.push(format!(
                    "{} has a {} B value, not the model's {} B",
                    show(k),
                    g.len(),
                    v.len()
                )),
                _ => {}
            }
            if out.len() >= 3 {
                break;
            }
        }
        for k in got.keys() {
            if out.len() >= 5 {
                break;
            }
            if !self.base.contains_key(*k) {
                out.push(format!("extra {}", show(k)));
            }
        }
        let infl: Vec<String> = self.inflight.iter().flatten().map(|(k, _)| show(k)).collect();
        format!(
            "{} pairs, model has {} (+/- in flight [{}]): {}",
            pairs.len(),
            self.base.len(),
            infl.join(", "),
            out.join("; ")
        )
    }
}

/// What `op` must return against `model`.
pub(super) fn expected(op: &Op, model: &Model) -> Outcome {
    match op {
        Op::Put(..) | Op::PutPinned(..) | Op::Batch(_) | Op::Txn(_) => Outcome::Put,
        Op::Del(k) | Op::DelPinned(k) => Outcome::Deleted(model.contains_key(k)),
        Op::Get(k) => Outcome::Got(model.get(k).map(|v| v.to_vec())),
    }
}

/// Applies `op` to `model`; returns the keys it wrote with their previous
/// values (`None` if it writes nothing).
pub(super) fn apply(model: &mut Model, op: &Op) -> Option<Vec<(Vec<u8>, Option<Val>)>> {
    let effect = op.effect();
    if effect.is_empty() {
        return None;
    }
    Some(
        effect
            .into_iter()
            .map(|(k, v)| {
                let old = match v {
                    Some(v) => model.insert(k.clone(), v),
                    None => model.remove(&k),
                };
                (k, old)
            })
            .collect(),
    )
}
