//! Named persistence points: every flush and fence in the engine.
//!
//! The crash simulator can drop one point by name (`nvstore crashtest --drop
//! NAME`); a campaign with a point dropped must find violations, or the point
//! is unnecessary or the workload has a hole (README, "How crash safety is shown").

/// A named flush or fence site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Point {
    pub name: &'static str,
}

impl Point {
    pub const fn new(name: &'static str) -> Point {
        Point { name }
    }
}

macro_rules! points {
    ($($(#[$doc:meta])* $id:ident = $name:literal;)*) => {
        $($(#[$doc])* pub const $id: Point = Point::new($name);)*
        /// Every point the engine uses, for `crashtest --list-points`.
        pub const ALL: &[Point] = &[$($id),*];
    };
}

points! {
    /// Pool header written at creation, before the file is considered a pool.
    HEADER_INIT_FLUSH = "header.init.flush";
    HEADER_INIT_FENCE = "header.init.fence";
    /// Header root words (leaf-chain head, pool size, clean flag).
    HEADER_ROOT_FLUSH = "header.root.flush";
    HEADER_ROOT_FENCE = "header.root.fence";
    /// Chunk header persisted before any block of the chunk is handed out.
    CHUNK_HEADER_FLUSH = "chunk.header.flush";
    CHUNK_HEADER_FENCE = "chunk.header.fence";
    /// Out-of-line key/value bytes, flushed before the element that refers to them.
    BLOB_FLUSH = "blob.flush";
    /// Sealed nv leaf: an append whose new element refers to a new blob
    /// fences the blob first (the element alone publishes it after a crash).
    BLOB_FENCE = "blob.fence";
    /// NV leaf: the appended element(s), self-validating in a sealed leaf,
    /// flushed and fenced: an append's one barrier (format/leaf_nv.rs).
    NV_ELEMENT_FLUSH = "nv.element.flush";
    NV_ELEMENT_FENCE = "nv.element.fence";
    /// NV leaf: a compact entry's value word replaced in place (an update
    /// of an 8-byte value while no snapshot is live).
    NV_COMPACT_FLUSH = "nv.compact.flush";
    NV_COMPACT_FENCE = "nv.compact.fence";
    /// NV leaf: a compact entry's deletion bit set in place (a delete while
    /// no snapshot is live).
    NV_GONE_FLUSH = "nv.gone.flush";
    NV_GONE_FENCE = "nv.gone.fence";
    /// Isle leaf: a pair written into a free slot, before its line's code names it.
    ISLE_SLOT_FLUSH = "isle.slot.flush";
    ISLE_SLOT_FENCE = "isle.slot.fence";
    /// Isle leaf: a header word of line codes (insert, delete, a pair moved
    /// between lines, and recovery dropping the older copy a move left).
    ISLE_CODE_FLUSH = "isle.code.flush";
    ISLE_CODE_FENCE = "isle.code.fence";
    /// Isle leaf: a compact pair's value word replaced in place (update).
    ISLE_VALUE_FLUSH = "isle.value.flush";
    ISLE_VALUE_FENCE = "isle.value.fence";
    /// Split/replace/merge: the new leaves, flushed and fenced before they are linked.
    NV_NEWLEAF_FLUSH = "nv.newleaf.flush";
    NV_NEWLEAF_FENCE = "nv.newleaf.fence";
    /// Split/replace/merge: the sibling pointer that swaps the new leaves in.
    NV_LINK_FLUSH = "nv.link.flush";
    NV_LINK_FENCE = "nv.link.fence";
    /// Multi-leaf transaction: the header's commit record, after every leaf's
    /// append; also a writable open restoring the record a clean close sealed,
    /// before the clean word is cleared (`tests/crash.rs` covers that use).
    TXN_COMMIT_FLUSH = "txn.commit.flush";
    TXN_COMMIT_FENCE = "txn.commit.fence";
    /// Recovery: a leaf's count lowered below the elements of a transaction
    /// that never committed, durable before any new commit record.
    TXN_UNDO_FLUSH = "txn.undo.flush";
    TXN_UNDO_FENCE = "txn.undo.fence";
    /// Clean shutdown: the saved index and free lists, before the clean flag
    /// (whose own fence orders this flush).
    SHUTDOWN_STATE_FLUSH = "shutdown.state.flush";
    /// Hash pools (`hash/table.rs`): out-of-line key/value bytes, flushed
    /// before the slot that refers to them (the slot's fence orders both).
    HASH_BLOB_FLUSH = "hash.blob.flush";
    /// Hash: a new entry written into a free slot, before the bucket header names it.
    HASH_SLOT_FLUSH = "hash.slot.flush";
    HASH_SLOT_FENCE = "hash.slot.fence";
    /// Hash: the bucket header word, the one 8-byte store that publishes an
    /// insert, an update (new slot set, old slot cleared) or a delete.
    HASH_BUCKET_FLUSH = "hash.bucket.flush";
    HASH_BUCKET_FENCE = "hash.bucket.fence";
    /// Hash split: the two new segments (and, when the directory doubles, the
    /// new directory), before the directory names them.
    HASH_SEGMENT_FLUSH = "hash.segment.flush";
    HASH_DIR_FLUSH = "hash.dir.flush";
    HASH_SPLIT_FENCE = "hash.split.fence";
    /// Hash split that keeps the directory's depth: the directory entries
    /// of the split segment, each rewritten in place to name one of its two
    /// halves, after the halves' fence; the fence orders them before the
    /// old segment's block can be reused. Recovery rolls back a split whose
    /// entries were only partly persisted (see `HashTable::recover`).
    HASH_DIRENTRY_FLUSH = "hash.direntry.flush";
    HASH_DIRENTRY_FENCE = "hash.direntry.fence";
    /// Hash: the root word that swaps a new directory in (creation and every
    /// split that doubles the directory).
    HASH_ROOT_FLUSH = "hash.root.flush";
    HASH_ROOT_FENCE = "hash.root.fence";
    /// Hash clean close: the saved image of the ordered index, before the
    /// clean word that names it (whose own fence orders this flush).
    HASH_IMAGE_FLUSH = "hash.image.flush";
    /// Clean shutdown: every sealed nv leaf's count (stored but never
    /// flushed by appends), before the clean flag whose fence orders it, so
    /// instant recovery can trust the counts.
    SHUTDOWN_COUNTS_FLUSH = "shutdown.counts.flush";
}

/// NV leaf of a format-2 pool (unsealed: `stamp` 0): the element count that
/// publishes an append, after the element's own barrier. New pools never
/// reach it, so it is not in [`ALL`] (the campaigns create their pools);
/// `tests/crash.rs` (`unsealed_leaves_keep_the_count_protocol`) covers it.
pub const NV_COUNT_FLUSH: Point = Point::new("nv.count.flush");
pub const NV_COUNT_FENCE: Point = Point::new("nv.count.fence");

/// Hash pools, a group of puts (`HashTable::put_group`, which `AsyncDb`'s
/// workers use for the puts they drain together): every blob and slot of
/// the group flushed, one fence, then every bucket header the group
/// changes stored and flushed, one fence; the group is acknowledged after
/// it. Not in [`ALL`]: the `Db` campaigns of `crashtest` run one operation
/// at a time and never form a group; the hash table's own campaign
/// (`hash/tests.rs`) crashes at each of them and drops each in turn.
pub const HASH_GROUP_BLOB_FLUSH: Point = Point::new("hash.group.blob.flush");
pub const HASH_GROUP_SLOT_FLUSH: Point = Point::new("hash.group.slot.flush");
pub const HASH_GROUP_SLOT_FENCE: Point = Point::new("hash.group.slot.fence");
pub const HASH_GROUP_BUCKET_FLUSH: Point = Point::new("hash.group.bucket.flush");
pub const HASH_GROUP_BUCKET_FENCE: Point = Point::new("hash.group.bucket.fence");

/// Calibration of the adaptive model (`tree::adaptive::calibrate`): writes
/// to an unlinked scratch block, timed, not persisted state; so not in
/// [`ALL`] (no crash can depend on them).
pub const CALIBRATE_FLUSH: Point = Point::new("calibrate.flush");
pub const CALIBRATE_FENCE: Point = Point::new("calibrate.fence");
