//! Setup shared by the flush-count tests (`flushes.rs`, `isle.rs`).

use nvstore::pmem::SimSpace;
use nvstore::tree::adaptive::Strategy;
use nvstore::{Db, LeafFormat, Options};

/// A fresh db on a simulated space of `size` bytes with 4 KB nodes, `leaf`
/// leaves and adaptivity off: flush counts are measured at a fixed node
/// size.
pub fn sim_db_4k(size: u64, leaf: LeafFormat) -> Db<SimSpace> {
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
