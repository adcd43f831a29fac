//! Baseline trees, each a crash-consistent implementation of its paper's
//! insert, search, delete and update write paths on nvstore's `pmem` layer
//! (so flushes and fences are counted exactly as for the tree), plus the
//! adapter for nvstore itself. Each file opens with its paper and node layout
//! and lists where it simplifies.

/// `BenchIndex` for a baseline that keeps its mutable state behind one lock
/// (`self.st`) and implements `put(st, key, value, update) -> bool`,
/// `remove`, `get` and `scan_from`: every mutating call is one operation
/// boundary of the pool's space (the crash simulator's unit).
macro_rules! single_lock_bench_index {
    ($ty:ident, $name:literal, $leaf:literal) => {
        impl<S: nvstore::pmem::Space> $crate::engine::BenchIndex for $ty<S> {
            fn name(&self) -> &'static str {
                $name
            }
            fn insert(&self, key: u64, value: u64) {
                let mut st = self.st.lock();
                self.put(&mut st, key, value, false);
                self.pool.space.op_boundary();
            }
            fn update(&self, key: u64, value: u64) -> bool {
                let mut st = self.st.lock();
                let r = self.put(&mut st, key, value, true);
                self.pool.space.op_boundary();
                r
            }
            fn delete(&self, key: u64) -> bool {
                let mut st = self.st.lock();
                let r = self.remove(&mut st, key);
                self.pool.space.op_boundary();
                r
            }
            fn search(&self, key: u64) -> Option<u64> {
                let st = self.st.lock();
                self.get(&st, key)
            }
            fn scan(&self, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
                let st = self.st.lock();
                self.scan_from(&st, start, n, out)
            }
            fn stats(&self) -> $crate::engine::EngineStats {
                $crate::engine::EngineStats {
                    splits: self.st.lock().splits,
                    ..Default::default()
                }
            }
            fn leaf(&self) -> &'static str {
                $leaf
            }
        }
    };
}

pub mod cdds;
pub mod fastfair;
pub mod fptree;
pub mod lcb;
pub mod pool;
pub mod tree;
pub mod volatile;
pub mod wbtree;

pub use cdds::Cdds;
pub use fastfair::FastFair;
pub use fptree::FpTree;
pub use lcb::Lcb;
pub use tree::TreeEngine;
pub use volatile::Volatile;
pub use wbtree::WbTree;
