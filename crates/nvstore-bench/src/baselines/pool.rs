//! What the persistent baselines share: a pool over any [`Space`], with
//! nvstore's own [`Allocator`] for node blocks, so node allocation costs the
//! baselines exactly what it costs the tree (chunk headers flushed once per
//! slab, free lists in DRAM).
//!
//! Pool layout (the first 64 KiB chunk is the baseline's root area; blocks
//! are carved from the chunks after it):
//!
//! ```text
//! [0, 64)        unused (line 0)
//! [64, 72)       pool size: written by the allocator when it grows the pool
//! [128, 192)     ROOT line: u64 root words of the engine (root node / head leaf)
//! [192, 1024)    LOG area: the engine's micro-log or redo log records
//! [65536, ...)   chunks: 8-byte chunk header + blocks (64-byte aligned)
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;

use nvstore::alloc::Allocator;
use nvstore::pmem::{Point, Space, LINE};
use nvstore::{Error, Result};

const POOL_FLUSH: Point = Point::new("baseline.pool.flush");
const POOL_FENCE: Point = Point::new("baseline.pool.fence");
/// Offset of the pool size word (the allocator's, as in nvstore's header).
pub const POOL_SIZE: u64 = LINE;

/// Size of an allocation chunk; the first one is the root area.
pub const CHUNK: u64 = 64 * 1024;
/// Offset of the engine's root words.
pub const ROOT: u64 = 2 * LINE;
/// Offset of the engine's log area.
pub const LOG: u64 = 3 * LINE;
/// Bytes of log area.
pub const LOG_SIZE: u64 = 1024 - LOG;

/// A fresh pool for one baseline.
pub struct Pool<S: Space> {
    pub space: Arc<S>,
    pub alloc: Allocator,
}

impl<S: Space> Pool<S> {
    /// Takes a zeroed space (a new pool file or a `SimSpace`).
    pub fn new(space: Arc<S>) -> Result<Pool<S>> {
        let size = space.size() / CHUNK * CHUNK;
        if size < 2 * CHUNK {
            return Err(Error::InvalidOption(format!(
                "a baseline pool needs at least {} bytes, the space has {}",
                2 * CHUNK,
                space.size()
            )));
        }
        let alloc = Allocator::fresh(CHUNK, CHUNK, size);
        // The pool size word lets recovery walk the chunk headers.
        space.store(POOL_SIZE, size);
        space.persist(POOL_SIZE, 8, POOL_FLUSH, POOL_FENCE);
        Ok(Pool { space, alloc })
    }

    /// Reopens a pool after a crash: the allocator is rebuilt from the chunk
    /// headers by reachability (every block not in `reachable` is free).
    pub fn recover(space: Arc<S>, reachable: &BTreeSet<u64>) -> Result<Pool<S>> {
        let alloc = Allocator::rebuild(&*space, CHUNK, CHUNK, reachable)?;
        Ok(Pool { space, alloc })
    }

    /// A block of `size` bytes (64-byte aligned, contents unspecified).
    pub fn alloc(&self, size: u64) -> u64 {
        self.alloc
            .alloc(&*self.space, size)
            .unwrap_or_else(|e| panic!("baseline pool allocation failed: {e}"))
    }

    pub fn free(&self, off: u64) {
        self.alloc.free(off)
    }

    #[inline]
    pub fn load(&self, off: u64) -> u64 {
        self.space.load(off)
    }

    #[inline]
    pub fn store(&self, off: u64, v: u64) {
        self.space.store(off, v)
    }

    /// Flush then fence.
    #[inline]
    pub fn persist(&self, off: u64, len: u64, flush: Point, fence: Point) {
        self.space.flush(off, len, flush);
        self.space.fence(fence);
    }
}

/// Validates a node size for a baseline.
pub fn check_node_size(engine: &str, node_size: u64, min: u64) -> Result<()> {
    if !node_size.is_multiple_of(LINE) || node_size < min || node_size > nvstore::alloc::MAX_CLASS {
        return Err(Error::InvalidOption(format!(
            "{engine}: node size {node_size} must be a multiple of 64 between {min} and {}",
            nvstore::alloc::MAX_CLASS
        )));
    }
    Ok(())
}

/// First line of `off`.
#[inline]
pub fn line_of(off: u64) -> u64 {
    off & !(LINE - 1)
}

/// Rounds up to a multiple of 64.
#[inline]
pub const fn align_line(v: u64) -> u64 {
    (v + LINE - 1) & !(LINE - 1)
}
