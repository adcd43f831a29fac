//! Proptest strategies shared by the model tests (`model.rs`, `read_with.rs`).

use std::ops::Bound as RB;

use proptest::prelude::*;

/// Keys that collide often: short keys over a 4-letter alphabet, 8-byte
/// keys out of `space` values, and a few long keys (out-of-line storage).
pub fn key(space: u64) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(0u8..4, 0..4),
        2 => any::<u64>().prop_map(move |k| (k % space).to_be_bytes().to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 9..40),
    ]
}

/// A range bound of any kind over [`key`]s.
pub fn bound(space: u64) -> impl Strategy<Value = RB<Vec<u8>>> {
    prop_oneof![
        Just(RB::Unbounded),
        key(space).prop_map(RB::Included),
        key(space).prop_map(RB::Excluded)
    ]
}
