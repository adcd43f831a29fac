//! Named persistence points of the hash table (see `pmem/points.rs`): every
//! flush and fence it issues. [`ALL`] joins `pmem::points::ALL` when the
//! table is wired into the pool.

use crate::pmem::Point;

/// Out-of-line key/value bytes, flushed before the slot that refers to them
/// (the slot's fence orders both).
pub const BLOB_FLUSH: Point = Point::new("hash.blob.flush");
/// A new entry written into a free slot, before the bucket header names it.
pub const SLOT_FLUSH: Point = Point::new("hash.slot.flush");
pub const SLOT_FENCE: Point = Point::new("hash.slot.fence");
/// The bucket header word: the one 8-byte store that publishes an insert,
/// an update (new slot set, old slot cleared) or a delete.
pub const BUCKET_FLUSH: Point = Point::new("hash.bucket.flush");
pub const BUCKET_FENCE: Point = Point::new("hash.bucket.fence");
/// Split: the two new segments and the new directory, before the root swap.
pub const SEGMENT_FLUSH: Point = Point::new("hash.segment.flush");
pub const DIR_FLUSH: Point = Point::new("hash.dir.flush");
pub const SPLIT_FENCE: Point = Point::new("hash.split.fence");
/// The root word that swaps a new directory in (creation and every split).
pub const ROOT_FLUSH: Point = Point::new("hash.root.flush");
pub const ROOT_FENCE: Point = Point::new("hash.root.fence");

pub const ALL: &[Point] = &[
    BLOB_FLUSH,
    SLOT_FLUSH,
    SLOT_FENCE,
    BUCKET_FLUSH,
    BUCKET_FENCE,
    SEGMENT_FLUSH,
    DIR_FLUSH,
    SPLIT_FENCE,
    ROOT_FLUSH,
    ROOT_FENCE,
];
