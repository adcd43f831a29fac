//! Content hashes of crash images, per line so that a candidate image's
//! hash follows from the persisted image's and the few lines it changes.

use super::{LINE_BYTES, WORD};

/// The 64-bit content hash used to deduplicate crash images: a wrapping sum
/// of per-line hashes (each mixing the line index), finished with the length.
pub fn image_hash(data: &[u8]) -> u64 {
    finish_hash(lines_sum(data), data.len())
}

pub(super) fn lines_sum(data: &[u8]) -> u64 {
    data.chunks(LINE_BYTES)
        .enumerate()
        .fold(0u64, |sum, (idx, line)| sum.wrapping_add(line_hash(idx as u64, line)))
}

/// FxHash-style word mixer over the line's eight words (a short last line
/// is zero padded, so growing the space leaves its hash unchanged), seeded
/// with the line index and finished with a strong avalanche so that sums of
/// line hashes do not collide structurally.
pub(super) fn line_hash(idx: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    debug_assert!(bytes.len() <= LINE_BYTES);
    let mut h = fmix64(idx ^ 0x2545_f491_4f6c_dd1d);
    for i in 0..LINE_BYTES / WORD {
        let mut w = [0u8; WORD];
        if let Some(chunk) = bytes.get(i * WORD..) {
            let n = chunk.len().min(WORD);
            w[..n].copy_from_slice(&chunk[..n]);
        }
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    fmix64(h)
}

pub(super) fn finish_hash(sum: u64, len: usize) -> u64 {
    fmix64(sum ^ fmix64(len as u64 ^ 0x6a09_e667_f3bc_c908))
}

/// MurmurHash3's 64-bit finalizer.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
