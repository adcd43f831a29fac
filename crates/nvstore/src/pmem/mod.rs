//! The persistent address space (docs/design.md, "Layers").
//!
//! Every access to persistent bytes goes through [`Space`]: 8-byte aligned
//! atomic words, byte ranges, `flush` and `fence`, all addressed by offset
//! from the pool start. Three implementations share it:
//!
//! - [`FileSpace`]: a pool file mapped into a reserved virtual range
//!   (`MAP_SYNC` where the file system offers DAX, else `MAP_SHARED`);
//! - [`SimSpace`]: the crash simulator's shadow memory (README, "How crash safety is shown");
//! - `RemoteSpace` (crate nvstore-asym): the data area of an AsymNVM back-end.
//!
//! The engine is generic over `Space`, so the file implementation compiles to
//! plain loads, stores and `clwb`.
//!
//! Every flush and fence names a [`Point`]. The crash simulator can be told to
//! drop one named point, which is how the crash tests prove they would catch a
//! missing flush or fence (README, "How crash safety is shown", "checking the checker").

pub mod counters;
#[allow(
    unsafe_code,
    reason = "maps the pool file (mmap, flock, fallocate, msync) and reads and writes it through raw pointers; every access is bounds-checked, each block says why it holds"
)]
pub mod file;
#[allow(
    unsafe_code,
    reason = "cache-line write-back and fence instructions (clwb, clflushopt, clflush, sfence) and CPUID, chosen at run time"
)]
pub mod flush;
#[allow(
    unsafe_code,
    reason = "allocator tuning (mallopt) for the crash campaigns; takes no pointers"
)]
pub mod os;
pub mod points;
pub mod sim;

pub use counters::{Counters, ThreadCounters};
pub use file::{FileSpace, MappingKind, OpenMode};
pub use flush::FlushKind;
pub use points::Point;
pub use sim::SimSpace;

use crate::error::Result;

/// Size of a cache line: the unit of flushing and of crash atomicity
/// tracking. Persistent structures align to it.
pub const LINE: u64 = 64;

/// A persistent address space. Offsets are from the pool start.
///
/// Rules for callers (docs/design.md, "the publish rule"):
/// - a change becomes visible only through one 8-byte aligned atomic store;
/// - everything such a store publishes is written, flushed and fenced first;
/// - the publishing store is flushed and fenced before the operation is
///   acknowledged.
pub trait Space: Send + Sync + 'static {
    /// Current size of the space in bytes (grows with [`Space::grow`]).
    fn size(&self) -> u64;

    /// Atomic 8-byte load with acquire ordering. `off` must be 8-aligned.
    fn load(&self, off: u64) -> u64;

    /// Atomic 8-byte store with release ordering. `off` must be 8-aligned.
    /// The only way to publish a change.
    fn store(&self, off: u64, val: u64);

    /// Copies `buf.len()` bytes starting at `off` into `buf`.
    fn read(&self, off: u64, buf: &mut [u8]);

    /// Runs `f` on the `len` bytes at `off`. The caller promises that no
    /// writer changes them while `f` runs (published bytes, kept from
    /// reclamation by a pinned epoch), so a space that maps the pool lends
    /// them in place; this default copies them (on the stack when short).
    #[inline]
    fn with_bytes<R>(&self, off: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R
    where
        Self: Sized,
    {
        if len <= 256 {
            let mut buf = [0u8; 256];
            self.read(off, &mut buf[..len as usize]);
            f(&buf[..len as usize])
        } else {
            let mut buf = vec![0u8; len as usize];
            self.read(off, &mut buf);
            f(&buf)
        }
    }

    /// Writes `data` at `off`. Not atomic beyond single aligned words; use
    /// only for bytes that are not yet published.
    fn write(&self, off: u64, data: &[u8]);

    /// Sets `len` bytes at `off` to zero.
    fn zero(&self, off: u64, len: u64);

    /// Writes back every cache line overlapping `[off, off+len)`.
    fn flush(&self, off: u64, len: u64, point: Point);

    /// Orders all earlier flushes of this thread before later stores.
    fn fence(&self, point: Point);

    /// Waits until this thread's earlier flushes are written back, with no
    /// meaning for crash consistency: a [`Space::fence`] must still order
    /// them before anything that depends on them, and the crash simulator,
    /// treating a drain as nothing, checks that one does. A drain only
    /// moves where the thread waits: issued before a lock is taken, it
    /// keeps the write-back of flushes made outside the lock from
    /// lengthening the time the lock is held (the fence under the lock
    /// then finds them done). Like the prefetches below, it is there for
    /// speed alone; a space without a write-back to wait for (simulated,
    /// remote) does nothing.
    #[inline]
    fn drain(&self) {}

    /// Grows the space to at least `new_size` bytes; existing offsets and
    /// their contents stay valid. New bytes read as zero.
    fn grow(&self, new_size: u64) -> Result<()>;

    /// Called by the engine when one operation's persistent effects are
    /// complete (acknowledged). The crash simulator uses it as an operation
    /// boundary; elsewhere it does nothing.
    #[inline]
    fn op_boundary(&self) {}

    /// Runs `f`, the persistent effects of one write operation of `Db`,
    /// described by `op`, and answers what `f` answers. A space that keeps
    /// an operation log (the AsymNVM back-end's, AsymNVM §4.3) makes `op`
    /// durable no later than when `f` succeeded (the remote space sends it
    /// with `f`'s first read that leaves the front-end, or at the end if
    /// none does; if `f` then fails, the log is marked applied) and may
    /// defer sending `f`'s flushed ranges to the operation's end,
    /// re-executing logged operations after a crash; everywhere else it
    /// just runs `f`.
    #[inline]
    fn logged<R>(&self, op: Operation<'_>, f: impl FnOnce() -> Result<R>) -> Result<R>
    where
        Self: Sized,
    {
        let _ = op;
        f()
    }

    /// Whether the space accepts writes.
    fn writable(&self) -> bool {
        true
    }

    /// Flush instruction in use.
    fn flush_kind(&self) -> FlushKind;

    /// How the space is mapped (for `stat`).
    fn mapping(&self) -> MappingKind;

    /// Flushes the underlying file to stable storage (`msync`), for media
    /// where cache write-back alone does not reach durability.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Reads a little-endian u64 that is not used for publication (e.g. an
    /// element word covered by an already-loaded count).
    #[inline]
    fn read_u64(&self, off: u64) -> u64 {
        self.load(off)
    }

    /// A hint that the line holding `off` is about to be written, so its
    /// miss overlaps the work before the write. Changes no contents and
    /// no persistence (a no-op where there is no cache to warm).
    #[inline]
    fn prefetch_write(&self, _off: u64) {}

    /// A hint that the line holding `off` is about to be read (see
    /// [`Space::prefetch_write`]).
    #[inline]
    fn prefetch(&self, _off: u64) {}

    /// Flush then fence: the common "persist" step.
    #[inline]
    fn persist(&self, off: u64, len: u64, flush: Point, fence: Point) {
        self.flush(off, len, flush);
        self.fence(fence);
    }

    /// Atomic store of a publishing word followed by its flush and fence.
    #[inline]
    fn publish(&self, off: u64, val: u64, flush: Point, fence: Point) {
        self.store(off, val);
        self.flush(off, 8, flush);
        self.fence(fence);
    }
}

/// A write operation of `Db`, as [`Space::logged`] sees it: enough to
/// execute it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation<'a> {
    Put {
        key: &'a [u8],
        value: &'a [u8],
    },
    /// A put only over a key that exists (`Db::update`).
    Update {
        key: &'a [u8],
        value: &'a [u8],
    },
    Delete {
        key: &'a [u8],
    },
}

/// Rounds `v` up to a multiple of `align` (a power of two).
#[inline]
pub const fn align_up(v: u64, align: u64) -> u64 {
    (v + align - 1) & !(align - 1)
}
