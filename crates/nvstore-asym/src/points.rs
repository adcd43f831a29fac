//! Named persistence points of the back-end (every flush and fence it
//! makes), so the crash simulator can drop one and show a campaign catches it.

use nvstore::pmem::Point;

macro_rules! points {
    ($($(#[$doc:meta])* $id:ident = $name:literal;)*) => {
        $($(#[$doc])* pub const $id: Point = Point::new($name);)*
        /// Every point the back-end uses.
        pub const ALL: &[Point] = &[$($id),*];
    };
}

points! {
    /// Pool header written at creation, before the epoch word that makes it a pool.
    HEADER_FLUSH = "asym.header.flush";
    HEADER_FENCE = "asym.header.fence";
    /// The epoch word, bumped at every back-end start (and set at creation).
    EPOCH_FLUSH = "asym.epoch.flush";
    EPOCH_FENCE = "asym.epoch.fence";
    /// An operation log appended to the ring, before it is acknowledged.
    OPLOG_FLUSH = "asym.oplog.flush";
    OPLOG_FENCE = "asym.oplog.fence";
    /// A transaction's memory logs written to the log area, before replay and acknowledgement.
    TXLOG_FLUSH = "asym.txlog.flush";
    TXLOG_FENCE = "asym.txlog.fence";
    /// Replay of a transaction into the data area and allocator bitmap.
    REPLAY_FLUSH = "asym.replay.flush";
    REPLAY_FENCE = "asym.replay.fence";
    /// The log state record (next transaction, last applied operation, ring head).
    STATE_FLUSH = "asym.state.flush";
    STATE_FENCE = "asym.state.fence";
    /// A naming entry's value word, before the name that publishes a new entry.
    NAME_VALUE_FLUSH = "asym.name.value.flush";
    NAME_VALUE_FENCE = "asym.name.value.fence";
    /// A new naming entry's name and checksum.
    NAME_ENTRY_FLUSH = "asym.name.entry.flush";
    NAME_ENTRY_FENCE = "asym.name.entry.fence";
    /// Allocator bitmap words changed by malloc or free.
    BITMAP_FLUSH = "asym.bitmap.flush";
    BITMAP_FENCE = "asym.bitmap.fence";
    /// A plain `write` or `cas` verb into the data area.
    WRITE_FLUSH = "asym.write.flush";
    WRITE_FENCE = "asym.write.fence";
    /// A mirror's replication words (source epoch, last applied batch, dirty bit).
    MIRROR_SEQ_FLUSH = "asym.mirror.seq.flush";
    MIRROR_SEQ_FENCE = "asym.mirror.seq.fence";
    /// A mirror's full copy of its primary's pool, before the words that make it clean.
    MIRROR_COPY_FLUSH = "asym.mirror.copy.flush";
    MIRROR_COPY_FENCE = "asym.mirror.copy.fence";
}
