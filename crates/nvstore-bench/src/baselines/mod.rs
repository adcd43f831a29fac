//! Baseline trees, each a crash-consistent implementation of its paper's
//! insert, search, delete and update write paths on nvstore's `pmem` layer
//! (so flushes and fences are counted exactly as for the tree), plus the
//! adapter for nvstore itself. Each file opens with its paper and node layout
//! and lists where it simplifies.

pub mod fastfair;
pub mod fptree;
pub mod pool;
pub mod tree;
pub mod volatile;
pub mod wbtree;

pub use fastfair::FastFair;
pub use fptree::FpTree;
pub use tree::TreeEngine;
pub use volatile::Volatile;
pub use wbtree::WbTree;
