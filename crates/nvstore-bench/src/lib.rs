//! Benchmarks (DESIGN §14): the papers' experiments on one persistent-memory
//! layer, so flush counts compare honestly across engines.

#![deny(unsafe_code)]

pub mod baselines;
pub mod engine;
