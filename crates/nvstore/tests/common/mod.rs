//! Setup and keys shared by the flush-count tests (`flushes.rs`, `isle.rs`).

use nvstore::pmem::SimSpace;
use nvstore::tree::adaptive::Strategy;
use nvstore::{Db, LeafKind, Options};

/// A fresh db on a simulated space of `size` bytes with 4 KB nodes, `leaf`
/// leaves and adaptivity off: flush counts are measured at a fixed node
/// size.
pub fn sim_db_4k(size: u64, leaf: LeafKind) -> Db<SimSpace> {
    Db::create_in(
        SimSpace::new(size),
        "f".as_ref(),
        &Options {
            node_size: 4096,
            leaf,
            adaptive: Strategy::Off,
            ..Options::default()
        },
    )
    .unwrap()
}

/// Pseudo-random 8-byte keys: xorshift64 (shifts 13, 7, 17) from `seed`,
/// each step's state in turn (distinct for 2^64 - 1 steps).
pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed;
    std::iter::from_fn(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Some(x)
    })
}
