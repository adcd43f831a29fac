//! Chunk headers (NV-Tree §3).
//!
//! The data area is a sequence of chunk runs. Each run starts with a header
//! line whose first word describes it:
//!
//! ```text
//! { u64 word = kind:8 | chunks:24 | class_lines:32 | u8 unused[56] }
//! ```
//!
//! - `kind` 0 (`Free`): one free chunk; a zero word, so fresh file extents are free chunks;
//! - `kind` 1 (`Slab`): `chunks` chunks of blocks of `class_lines * 64` bytes at a fixed
//!   stride, the first block right after the header line;
//! - `kind` 2 (`Run`): one large block of `chunks` chunks, starting after the header line;
//! - `kind` 3 (`FreeRun`): `chunks` free chunks.
//!
//! The header is a single word, so it is never torn. A walk from `data_start`
//! that steps `chunks` chunks at a time lands on a valid header at every step
//! up to the pool size: whenever a free run is carved, the header of the
//! remainder is persisted before the header of the carved part (see
//! `alloc`), so the walk never reads stale bytes as a header.

use crate::pmem::LINE;

pub const KIND_FREE: u64 = 0;
pub const KIND_SLAB: u64 = 1;
pub const KIND_RUN: u64 = 2;
pub const KIND_FREE_RUN: u64 = 3;

/// Where blocks begin inside a run: after the header line.
pub const FIRST_BLOCK: u64 = LINE;

/// A decoded chunk header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkHeader {
    Free { chunks: u64 },
    Slab { chunks: u64, class: u64 },
    Run { chunks: u64 },
}

impl ChunkHeader {
    pub fn encode(self) -> u64 {
        match self {
            ChunkHeader::Free { chunks: 1 } => 0,
            ChunkHeader::Free { chunks } => KIND_FREE_RUN | (chunks << 8),
            ChunkHeader::Slab { chunks, class } => KIND_SLAB | (chunks << 8) | ((class / LINE) << 32),
            ChunkHeader::Run { chunks } => KIND_RUN | (chunks << 8),
        }
    }

    /// Decodes a header word; `None` for words no writer produces.
    pub fn decode(w: u64) -> Option<ChunkHeader> {
        let kind = w & 0xff;
        let chunks = (w >> 8) & 0xff_ffff;
        let class = (w >> 32) * LINE;
        match kind {
            KIND_FREE if w == 0 => Some(ChunkHeader::Free { chunks: 1 }),
            KIND_FREE_RUN if chunks >= 1 && class == 0 => Some(ChunkHeader::Free { chunks }),
            KIND_SLAB if chunks >= 1 && class >= LINE => Some(ChunkHeader::Slab { chunks, class }),
            KIND_RUN if chunks >= 1 && class == 0 => Some(ChunkHeader::Run { chunks }),
            _ => None,
        }
    }

    pub fn chunks(self) -> u64 {
        match self {
            ChunkHeader::Free { chunks } | ChunkHeader::Slab { chunks, .. } | ChunkHeader::Run { chunks } => chunks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for h in [
            ChunkHeader::Free { chunks: 1 },
            ChunkHeader::Free { chunks: 9 },
            ChunkHeader::Slab { chunks: 1, class: 64 },
            ChunkHeader::Slab {
                chunks: 5,
                class: 65536,
            },
            ChunkHeader::Run { chunks: 300 },
        ] {
            assert_eq!(ChunkHeader::decode(h.encode()), Some(h));
        }
        assert_eq!(ChunkHeader::decode(0xdead_beef_0000_0007), None);
        assert_eq!(ChunkHeader::decode(KIND_SLAB | (1 << 8)), None, "slab without class");
    }
}
