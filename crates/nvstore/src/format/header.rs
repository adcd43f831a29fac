//! Pool header at offset 0 (docs/format.md).
//!
//! ```text
//! line 0: written once at creation, covered by the checksum
//!   { u64 magic | u32 version | u32 flags | u8 uuid[16] | u32 leaf_format | u32 node_size
//!     | u64 chunk_size | u64 data_start | u64 checksum }
//! line 1: root words, each changed by one 8-byte atomic store, then flushed and fenced
//!   { u64 pool_size | u64 leaf_head | u64 clean_state | u64 last_ts | u64 txn_commit
//!     | u64 reserved | u64 calibration[2] }
//! ```
//!
//! - `magic` is stored last at creation: a file whose creation crashed is "not a pool".
//! - `pool_size` is raised after the file has grown; a file shorter than it is truncated.
//! - `clean_state` is 0 while the pool is open (or after a crash); a clean
//!   shutdown stores the offset of the saved state (inner index and free lists)
//!   in it with one atomic store: flag and pointer together, as NV-Tree §4.6 does.
//! - `last_ts` is the commit-timestamp clock saved at clean shutdown (after a
//!   crash the clock restarts above every element's version instead).
//! - `txn_commit` is the commit record of multi-leaf transactions: the
//!   timestamp of the last one committed (NV-Tree §6.1.1). Such transactions
//!   commit one at a time, so elements flagged TXN with a newer version
//!   belong to the one that was cut short by a crash. A clean close seals a
//!   copy in its saved state; a writable open restores a lowered word from it
//!   (`recovery::open_tree`).
//! - `calibration` caches the adaptive model's `T_r`/`T_w` measured at open
//!   (`tree::adaptive::Model::encode`): a hint, never needed for recovery;
//!   the second word, stored last, carries a check of the first.
//! - The first `data_start` bytes belong to the header; chunks follow.

use crate::error::{Error, Result};
use crate::pmem::{points, Space, LINE};
use std::path::PathBuf;

pub const MAGIC: u64 = u64::from_le_bytes(*b"NVSTPOOL");
/// The format this build writes. Version 2 marks pools that may hold MVCC
/// versions, transaction flags and compact leaf prefixes. Version 1 pools
/// (written before those) are a subset this build reads unchanged; a
/// writable open upgrades their header to 2 first (see [`Header::upgrade`]),
/// so a build that only knows version 1 refuses them from then on instead
/// of misreading elements it has no notion of. Version 3 marks pools that
/// may hold sealed nv leaves (self-validating elements whose count is not
/// flushed by appends: `format/leaf_nv.rs`); a version-2 build would trust
/// those counts and reject their check bits, so the same upgrade raises a
/// version 1 or 2 pool to 3 before this build appends to it. Its unsealed
/// leaves keep the count protocol until a split, replace or merge rewrites
/// them sealed. Version 4 marks pools whose nv leaves may hold more
/// elements than a leaf without a compact prefix does (the bytes the prefix
/// saves take appends: `leaf_nv::capacity_at`); a version-3 build would
/// report such a leaf's count as beyond its capacity, so the upgrade raises
/// older pools to 4 before this build appends to them. Version 5 marks
/// pools whose nv leaves may mark compact entries deleted in place (the
/// leaf's `gone` words, zero before); a version-4 build would ignore them and
/// bring deleted keys back, so the upgrade raises older pools to 5 first.
/// Version 6 marks pools whose hash table may place its keys by XXH3 (a
/// new hash pool's table does; its directory's tag says so:
/// `hash/layout.rs`, `KeyHash`); a version-5 build knows only FNV-1a and
/// would call such a table corrupt, so it is refused by version instead.
/// A table keeps the hash it was created with, so an older hash pool
/// reads unchanged.
pub const VERSION: u32 = 6;
/// The oldest format this build opens.
pub const OLDEST_READABLE: u32 = 1;

pub const MAGIC_OFF: u64 = 0;
pub const VERSION_OFF: u64 = 8;
pub const FLAGS_OFF: u64 = VERSION_OFF + 4;
pub const UUID_OFF: u64 = FLAGS_OFF + 4;
pub const LEAF_FORMAT_OFF: u64 = UUID_OFF + 16;
pub const NODE_SIZE_OFF: u64 = LEAF_FORMAT_OFF + 4;
pub const CHUNK_SIZE_OFF: u64 = NODE_SIZE_OFF + 4;
pub const DATA_START_OFF: u64 = CHUNK_SIZE_OFF + 8;
pub const CHECKSUM_OFF: u64 = DATA_START_OFF + 8;
const _: () = assert!(CHECKSUM_OFF + 8 == LINE);

pub const POOL_SIZE_OFF: u64 = LINE;
pub const LEAF_HEAD_OFF: u64 = POOL_SIZE_OFF + 8;
pub const CLEAN_STATE_OFF: u64 = LEAF_HEAD_OFF + 8;
pub const LAST_TS_OFF: u64 = CLEAN_STATE_OFF + 8;
pub const TXN_COMMIT_OFF: u64 = LAST_TS_OFF + 8;
/// Two words: see `tree::adaptive::Model::encode`.
pub const CALIBRATION_OFF: u64 = TXN_COMMIT_OFF + 16;
const _: () = assert!(CALIBRATION_OFF + 16 == 2 * LINE);

/// Smallest file that can hold a header.
pub const MIN_FILE: u64 = 2 * LINE;

/// Hash pools: the root word of the hash table (the offset of its
/// directory), the first word of line 2, inside the header area.
pub const HASH_ROOT_OFF: u64 = 2 * LINE;

/// The value of the leaf-format word that marks a pool of the hash engine
/// (no leaves). Builds from before the hash engine refuse such a pool as
/// having an unknown leaf format instead of misreading it.
pub const HASH_ENGINE_WORD: u32 = 3;

/// The engine a pool is created with: the NV-Tree (leaves of one
/// [`LeafKind`]) or the hash table with its ordered DRAM index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    #[default]
    Tree,
    Hash,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Tree => "tree",
            EngineKind::Hash => "hash",
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "tree" => Ok(EngineKind::Tree),
            "hash" => Ok(EngineKind::Hash),
            _ => Err(format!("unknown engine '{s}' (expected tree or hash)")),
        }
    }
}

/// Leaf formats a pool can be created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeafKind {
    Nv = 1,
    Isle = 2,
}

impl LeafKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LeafKind::Nv => "nv",
            LeafKind::Isle => "isle",
        }
    }
    pub fn from_u32(v: u32) -> Option<LeafKind> {
        match v {
            1 => Some(LeafKind::Nv),
            2 => Some(LeafKind::Isle),
            _ => None,
        }
    }
}

impl std::str::FromStr for LeafKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "nv" => Ok(LeafKind::Nv),
            "isle" => Ok(LeafKind::Isle),
            _ => Err(format!("unknown leaf format '{s}' (expected nv or isle)")),
        }
    }
}

/// The immutable part of the header, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub flags: u32,
    pub uuid: [u8; 16],
    /// The engine: a hash pool stores [`HASH_ENGINE_WORD`] in the
    /// leaf-format word.
    pub engine: EngineKind,
    /// Tree pools: the leaf format. Hash pools have no leaves; it reads as
    /// [`LeafKind::Nv`] there and nothing uses it.
    pub leaf_format: LeafKind,
    pub node_size: u32,
    pub chunk_size: u64,
    pub data_start: u64,
}

impl Header {
    fn line0(&self) -> [u8; LINE as usize] {
        let mut b = [0u8; LINE as usize];
        let put = |b: &mut [u8], off: u64, v: &[u8]| b[off as usize..off as usize + v.len()].copy_from_slice(v);
        put(&mut b, MAGIC_OFF, &MAGIC.to_le_bytes());
        put(&mut b, VERSION_OFF, &self.version.to_le_bytes());
        put(&mut b, FLAGS_OFF, &self.flags.to_le_bytes());
        put(&mut b, UUID_OFF, &self.uuid);
        let word = match self.engine {
            EngineKind::Tree => self.leaf_format as u32,
            EngineKind::Hash => HASH_ENGINE_WORD,
        };
        put(&mut b, LEAF_FORMAT_OFF, &word.to_le_bytes());
        put(&mut b, NODE_SIZE_OFF, &self.node_size.to_le_bytes());
        put(&mut b, CHUNK_SIZE_OFF, &self.chunk_size.to_le_bytes());
        put(&mut b, DATA_START_OFF, &self.data_start.to_le_bytes());
        let sum = checksum(&b[..CHECKSUM_OFF as usize]);
        put(&mut b, CHECKSUM_OFF, &sum.to_le_bytes());
        b
    }

    /// Writes a new header into a zeroed space: every field, then the magic
    /// word last, so a crash mid-creation leaves "not a pool".
    pub fn create<S: Space>(&self, space: &S, pool_size: u64) {
        let line = self.line0();
        space.write(8, &line[8..]);
        space.store(POOL_SIZE_OFF, pool_size);
        space.store(LEAF_HEAD_OFF, 0);
        space.store(CLEAN_STATE_OFF, 0);
        space.flush(0, 2 * LINE, points::HEADER_INIT_FLUSH);
        space.fence(points::HEADER_INIT_FENCE);
        space.publish(MAGIC_OFF, MAGIC, points::HEADER_INIT_FLUSH, points::HEADER_INIT_FENCE);
    }

    /// Reads and validates the header; the space's size is the backing
    /// file's real length (truncation check). Errors name no path: the
    /// caller that opened the pool attaches it ([`Error::at`]).
    pub fn read<S: Space>(space: &S) -> Result<Header> {
        let size = space.size();
        if size < MIN_FILE {
            return Err(Error::NotAPool { path: PathBuf::new() });
        }
        let mut b = [0u8; LINE as usize];
        space.read(0, &mut b);
        let u64_at = |off: u64| u64::from_le_bytes(b[off as usize..off as usize + 8].try_into().unwrap());
        let u32_at = |off: u64| u32::from_le_bytes(b[off as usize..off as usize + 4].try_into().unwrap());
        if u64_at(MAGIC_OFF) != MAGIC {
            return Err(Error::NotAPool { path: PathBuf::new() });
        }
        // Version before checksum: another version may lay the line out differently.
        let version = u32_at(VERSION_OFF);
        if !(OLDEST_READABLE..=VERSION).contains(&version) {
            return Err(Error::WrongVersion {
                path: PathBuf::new(),
                found: version,
                supported: VERSION,
            });
        }
        if !checksum_ok(&b) {
            return Err(Error::BadChecksum { path: PathBuf::new() });
        }
        let corrupt = |what: String| Error::corrupt(what);
        let (engine, leaf_format) = match u32_at(LEAF_FORMAT_OFF) {
            HASH_ENGINE_WORD => (EngineKind::Hash, LeafKind::Nv),
            w => (
                EngineKind::Tree,
                LeafKind::from_u32(w).ok_or_else(|| corrupt(format!("unknown leaf format {w}")))?,
            ),
        };
        let h = Header {
            version,
            flags: u32_at(FLAGS_OFF),
            uuid: b[UUID_OFF as usize..UUID_OFF as usize + 16].try_into().unwrap(),
            engine,
            leaf_format,
            node_size: u32_at(NODE_SIZE_OFF),
            chunk_size: u64_at(CHUNK_SIZE_OFF),
            data_start: u64_at(DATA_START_OFF),
        };
        if !h.chunk_size.is_power_of_two() || h.chunk_size < 4096 || !h.data_start.is_multiple_of(h.chunk_size) {
            return Err(corrupt("invalid chunk geometry in header".into()));
        }
        let pool_size = space.load(POOL_SIZE_OFF);
        if pool_size > size {
            return Err(Error::Truncated {
                path: PathBuf::new(),
                expected: pool_size,
                actual: size,
            });
        }
        if pool_size < h.data_start || !(pool_size - h.data_start).is_multiple_of(h.chunk_size) {
            return Err(corrupt(format!(
                "pool size {pool_size} does not fit the chunk geometry"
            )));
        }
        Ok(h)
    }

    /// Raises an older pool's header to [`VERSION`] before anything of this
    /// build is written to it. Two root stores, each persisted before the
    /// next: the word holding version and flags, then the checksum. A crash
    /// between them leaves a header [`Header::read`] still accepts (see
    /// `checksum_ok`), already marked with the new version.
    pub fn upgrade<S: Space>(&mut self, space: &S) {
        if self.version >= VERSION {
            return;
        }
        self.version = VERSION;
        let line = self.line0();
        let word = |off: u64| u64::from_le_bytes(line[off as usize..off as usize + 8].try_into().unwrap());
        set_root(space, VERSION_OFF, word(VERSION_OFF));
        set_root(space, CHECKSUM_OFF, word(CHECKSUM_OFF));
    }
}

/// Whether line 0's checksum holds. An upgrade stores the new version word
/// before the checksum that covers it, so a crash between the two leaves the
/// new version under the old version's checksum: accepted too, since the
/// old version differs from it only in that field.
fn checksum_ok(line: &[u8; LINE as usize]) -> bool {
    let stored = u64::from_le_bytes(line[CHECKSUM_OFF as usize..].try_into().unwrap());
    if checksum(&line[..CHECKSUM_OFF as usize]) == stored {
        return true;
    }
    let mut older = *line;
    (OLDEST_READABLE..VERSION).any(|v| {
        older[VERSION_OFF as usize..FLAGS_OFF as usize].copy_from_slice(&v.to_le_bytes());
        checksum(&older[..CHECKSUM_OFF as usize]) == stored
    })
}

/// Address of the root word naming the first leaf of the chain.
#[inline]
pub const fn leaf_head_word() -> u64 {
    LEAF_HEAD_OFF
}

/// The first leaf of the chain (0 before the pool has one).
#[inline]
pub fn leaf_head<S: Space>(space: &S) -> u64 {
    space.load(LEAF_HEAD_OFF)
}

/// The clean-shutdown word: 0 while the pool is open for writing or after
/// a crash; otherwise where the saved state is (`format/saved.rs`).
#[inline]
pub fn clean_state<S: Space>(space: &S) -> u64 {
    space.load(CLEAN_STATE_OFF)
}

/// Stores and persists the clean-shutdown word.
pub fn set_clean_state<S: Space>(space: &S, word: u64) {
    set_root(space, CLEAN_STATE_OFF, word);
}

/// The newest commit timestamp saved at clean shutdown.
#[inline]
pub fn last_ts<S: Space>(space: &S) -> u64 {
    space.load(LAST_TS_OFF)
}

/// Stores and persists the newest commit timestamp (clean shutdown).
pub fn set_last_ts<S: Space>(space: &S, ts: u64) {
    set_root(space, LAST_TS_OFF, ts);
}

/// The two words of the cached adaptive cost model.
pub fn calibration<S: Space>(space: &S) -> [u64; 2] {
    [space.load(CALIBRATION_OFF), space.load(CALIBRATION_OFF + 8)]
}

/// Stores and persists the cached adaptive cost model, one word after the
/// other.
pub fn set_calibration<S: Space>(space: &S, words: [u64; 2]) {
    set_root(space, CALIBRATION_OFF, words[0]);
    set_root(space, CALIBRATION_OFF + 8, words[1]);
}

/// Address of the hash engine's root word (the table's directory).
#[inline]
pub const fn hash_root_word() -> u64 {
    HASH_ROOT_OFF
}

/// Stores and persists the pool size (the allocator grew the pool).
pub fn set_pool_size<S: Space>(space: &S, size: u64) {
    set_root(space, POOL_SIZE_OFF, size);
}

/// Address of the pool-size root word (tests build headers by hand).
#[cfg(test)]
pub const fn pool_size_word() -> u64 {
    POOL_SIZE_OFF
}

/// Address of the word saying where allocation starts (tests build
/// headers by hand).
#[cfg(test)]
pub const fn data_start_word() -> u64 {
    DATA_START_OFF
}

/// Where allocation starts, as the header records it.
pub fn data_start<S: Space>(space: &S) -> u64 {
    space.load(DATA_START_OFF)
}

/// The newest multi-leaf commit record (`txn_commit`).
pub fn txn_committed<S: Space>(space: &S) -> u64 {
    space.load(TXN_COMMIT_OFF)
}

/// Stores the multi-leaf commit record and persists it: a commit, or an
/// open restoring the copy a clean close sealed (`recovery::open_tree`).
pub fn set_txn_committed<S: Space>(space: &S, ts: u64) {
    space.publish(TXN_COMMIT_OFF, ts, points::TXN_COMMIT_FLUSH, points::TXN_COMMIT_FENCE);
}

/// Header checksum: CRC-32 (crc32fast) widened to a word.
pub fn checksum(bytes: &[u8]) -> u64 {
    crc32fast::hash(bytes) as u64
}

/// Pool size recorded in the header.
pub fn pool_size<S: Space>(space: &S) -> u64 {
    space.load(POOL_SIZE_OFF)
}

/// Stores a root word and persists it.
pub fn set_root<S: Space>(space: &S, off: u64, val: u64) {
    space.publish(off, val, points::HEADER_ROOT_FLUSH, points::HEADER_ROOT_FENCE);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::SimSpace;

    fn sample() -> Header {
        Header {
            version: VERSION,
            flags: 0,
            uuid: [7; 16],
            engine: EngineKind::Tree,
            leaf_format: LeafKind::Nv,
            node_size: 1024,
            chunk_size: 65536,
            data_start: 65536,
        }
    }

    #[test]
    fn round_trip() {
        let s = SimSpace::new(4 * 65536);
        sample().create(&s, 4 * 65536);
        assert_eq!(Header::read(&s).unwrap(), sample());
        assert_eq!(pool_size(&s), 4 * 65536);
    }

    #[test]
    fn flipped_byte_fails_checksum() {
        let s = SimSpace::new(4 * 65536);
        sample().create(&s, 4 * 65536);
        let mut b = [0u8; 1];
        s.read(NODE_SIZE_OFF, &mut b);
        s.write(NODE_SIZE_OFF, &[b[0] ^ 1]);
        assert!(matches!(Header::read(&s), Err(Error::BadChecksum { .. })));
    }

    #[test]
    fn older_version_opens_and_upgrades_through_a_crash_between_its_stores() {
        let s = SimSpace::new(4 * 65536);
        let old = Header { version: 1, ..sample() };
        old.create(&s, 4 * 65536);
        let mut h = Header::read(&s).unwrap();
        assert_eq!(h.version, 1);
        // The state a crash between the upgrade's two stores leaves.
        let line = sample().line0();
        s.store(VERSION_OFF, u64::from_le_bytes(line[8..16].try_into().unwrap()));
        assert_eq!(Header::read(&s).unwrap().version, VERSION);
        h.upgrade(&s);
        assert_eq!(h.version, VERSION);
        assert_eq!(Header::read(&s).unwrap(), sample());
        // The checksum is really checked in the mixed state: a flipped byte
        // elsewhere in the line still fails.
        s.store(
            VERSION_OFF,
            u64::from_le_bytes(line[8..16].try_into().unwrap()) ^ (1 << 40),
        );
        assert!(matches!(Header::read(&s), Err(Error::BadChecksum { .. })));
    }

    #[test]
    fn versions_outside_the_readable_range_are_refused() {
        for v in [0, VERSION + 1] {
            let s = SimSpace::new(4 * 65536);
            Header { version: v, ..sample() }.create(&s, 4 * 65536);
            assert!(matches!(
                Header::read(&s),
                Err(Error::WrongVersion { found, .. }) if found == v
            ));
        }
    }

    #[test]
    fn hash_engine_round_trips_in_the_leaf_format_word() {
        let s = SimSpace::new(4 * 65536);
        let h = Header {
            engine: EngineKind::Hash,
            ..sample()
        };
        h.create(&s, 4 * 65536);
        assert_eq!(s.read_u64(LEAF_FORMAT_OFF) as u32, HASH_ENGINE_WORD);
        assert_eq!(Header::read(&s).unwrap(), h);
    }

    #[test]
    fn zero_file_is_not_a_pool() {
        let s = SimSpace::new(4 * 65536);
        assert!(matches!(Header::read(&s), Err(Error::NotAPool { .. })));
    }
}
