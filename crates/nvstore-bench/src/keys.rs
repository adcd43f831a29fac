//! The benchmark keys and values: the i-th key of a seeded run and the value
//! a key holds in a given round, the same in every benchmark.

/// splitmix64's finalizer: a bijection on u64.
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The i-th benchmark key: distinct for distinct i (a bijection of i).
#[inline]
pub fn key_at(seed: u64, i: u64) -> u64 {
    mix(i.wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// A non-zero value for `key` in round `round` (0 = the load; measured
/// updates use later rounds, so they change every value).
#[inline]
pub fn value_of(seed: u64, key: u64, round: u64) -> u64 {
    mix(key ^ mix(round ^ seed.rotate_left(17) ^ 0x5555_0000_aaaa)) | 1
}
