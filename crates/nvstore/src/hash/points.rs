//! Named persistence points of the hash table: every flush and fence it
//! issues. They are defined with every other point in `pmem/points.rs` (so
//! `crashtest --list-points` and the dropped-point self-test see them);
//! here under their short names.

use crate::pmem::points as pp;
#[cfg(test)]
use crate::pmem::Point;

pub use pp::{
    HASH_BLOB_FLUSH as BLOB_FLUSH, HASH_BUCKET_FENCE as BUCKET_FENCE, HASH_BUCKET_FLUSH as BUCKET_FLUSH,
    HASH_DIRENTRY_FENCE as DIRENTRY_FENCE, HASH_DIRENTRY_FLUSH as DIRENTRY_FLUSH, HASH_DIR_FLUSH as DIR_FLUSH,
    HASH_GROUP_BLOB_FLUSH as GROUP_BLOB_FLUSH, HASH_GROUP_BUCKET_FENCE as GROUP_BUCKET_FENCE,
    HASH_GROUP_BUCKET_FLUSH as GROUP_BUCKET_FLUSH, HASH_GROUP_SLOT_FENCE as GROUP_SLOT_FENCE,
    HASH_GROUP_SLOT_FLUSH as GROUP_SLOT_FLUSH, HASH_IMAGE_FLUSH as IMAGE_FLUSH, HASH_ROOT_FENCE as ROOT_FENCE,
    HASH_ROOT_FLUSH as ROOT_FLUSH, HASH_SEGMENT_FLUSH as SEGMENT_FLUSH, HASH_SLOT_FENCE as SLOT_FENCE,
    HASH_SLOT_FLUSH as SLOT_FLUSH, HASH_SPLIT_FENCE as SPLIT_FENCE,
};

/// The hash table's points. The engine's clean close adds
/// [`IMAGE_FLUSH`], which the crash campaign (`crashtest`) covers.
#[cfg(test)]
pub const ALL: &[Point] = &[
    BLOB_FLUSH,
    SLOT_FLUSH,
    SLOT_FENCE,
    BUCKET_FLUSH,
    BUCKET_FENCE,
    SEGMENT_FLUSH,
    DIR_FLUSH,
    SPLIT_FENCE,
    DIRENTRY_FLUSH,
    DIRENTRY_FENCE,
    ROOT_FLUSH,
    ROOT_FENCE,
];

/// The points of a group of puts ([`super::table::HashTable::put_group`]).
#[cfg(test)]
pub const GROUP: &[Point] = &[
    GROUP_BLOB_FLUSH,
    GROUP_SLOT_FLUSH,
    GROUP_SLOT_FENCE,
    GROUP_BUCKET_FLUSH,
    GROUP_BUCKET_FENCE,
];
