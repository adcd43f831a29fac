//! Benchmarks (NV-Tree §6, Isle-Tree §V): the papers' experiments on one persistent-memory
//! layer, so flush counts compare honestly across engines.
//!
//! Entry points for the CLI (`nvstore bench micro|compare|ycsb|adaptive|plot|asym|kvindex`):
//! [`micro::MicroArgs`] / [`micro::micro_main`] and [`micro::CompareArgs`] /
//! [`micro::compare_main`]; [`micro::run_micro`] and [`micro::run_compare`]
//! return the results without printing.
//!
//! The engines by name live in [`registry`], the seeded keys and values in
//! [`keys`], and what every benchmark does with its results (JSON lines,
//! `--out DIR`) in [`output`].

#![deny(unsafe_code)]

pub mod adaptive;
pub mod args;
pub mod asym;
pub mod asym_part;
pub mod baselines;
pub mod engine;
pub mod external;
pub mod keys;
pub mod kvindex;
pub mod micro;
pub mod output;
pub mod plot;
pub mod registry;
pub mod ycsb;

pub use adaptive::{adaptive_main, run_adaptive, AdaptiveArgs, AdaptiveResult, AdaptiveWorkload};
pub use asym::{asym_main, run_asym, AsymArgs, AsymResult};
pub use engine::{BenchIndex, EngineStats, KeyKind};
pub use kvindex::{kvindex_main, run_kvindex, KvIndexArgs, KvIndexResult};
pub use micro::{
    compare_main, micro_main, run_compare, run_micro, CompareArgs, CompareResult, MicroArgs, MicroResult, Op,
};
pub use plot::{plot_main, PlotArgs};
pub use ycsb::{ycsb_main, YcsbArgs, YcsbResult};
