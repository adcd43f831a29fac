//! Salvage: every readable record of a damaged pool, read without trusting
//! anything the damage may have touched (`nvstore salvage`, in the spirit
//! of `mdb_dump -a` and `sqlite3 .recover`).
//!
//! - The pool is opened read-only and nothing of it is written.
//! - Leaves come from the chain, walked tolerantly: the walk stops at a
//!   link that leaves the data area or returns to a leaf already seen (so a
//!   cycle cannot hang it). When it stops before its end, the leaves it
//!   did not reach are looked for in the chunk headers: every block of a
//!   slab or run that passes the leaf checks of `format::validate` is read
//!   too, after the chain's leaves, and only for keys the chain did not
//!   hold (such a block may be a leaf freed by a split, so it may hold older
//!   values; the report says how many records came from there).
//! - Each element is checked on its own (metadata, blob reference, blob
//!   lengths); a damaged one is skipped and counted, the rest of its leaf
//!   is still read. A leaf whose header words are damaged is read as far
//!   as its count and size can be trusted (the count is capped at the
//!   capacity of the size, or of the pool's node size when the size is bad).
//! - Per key, the newest element wins (version, then position in the leaf);
//!   a NEGATIVE one means deleted. Elements of a transaction without a
//!   commit record do not count.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use crate::error::Result;
use crate::format::chunk::{ChunkHeader, FIRST_BLOCK};
use crate::format::header::{self, Header, LeafKind};
use crate::format::leaf_isle::{self as il, IsleLeaf, Kind};
use crate::format::leaf_nv::{self as nv, Layout, Meta, NvLeaf};
use crate::format::{blob, validate};
use crate::pmem::file::FileOptions;
use crate::pmem::{FileSpace, OpenMode, Space, LINE};
use crate::recovery;
use crate::tree::isle::Isle;
use crate::tree::nv::Nv;

/// What a salvage read and what it skipped.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SalvageReport {
    /// Leaves read from the chain, and whether the chain was whole.
    pub chain_leaves: u64,
    pub chain_whole: bool,
    /// Why the chain walk stopped early, if it did.
    pub chain_break: Option<String>,
    /// Leaves found by scanning chunk headers (off the chain).
    pub scanned_leaves: u64,
    /// Records recovered, and those of them that came from scanned leaves.
    pub records: u64,
    pub records_off_chain: u64,
    /// Elements skipped as damaged, and leaves skipped whole.
    pub skipped_elements: u64,
    pub skipped_leaves: u64,
    /// The first problems met, for the user (at most [`MAX_NOTES`]).
    pub notes: Vec<String>,
}

/// Key-ordered live pairs.
pub type Records = Vec<(Vec<u8>, Vec<u8>)>;

/// What [`read`] found: the pool's leaf format and node size, its records
/// and the report.
pub struct Salvaged {
    pub leaf: LeafKind,
    pub node_size: u32,
    pub records: Records,
    pub report: SalvageReport,
}

/// Problems listed in a report; the rest are only counted.
pub const MAX_NOTES: usize = 20;

impl SalvageReport {
    fn note(&mut self, what: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(what);
        }
    }
}

/// One element's claim on a key: `(version, order)` decides the newest;
/// `None` value: deleted.
struct Claim {
    rank: (u64, u64),
    value: Option<Vec<u8>>,
    off_chain: bool,
}

/// The records of the pool at `path` (its leaf format and node size, the
/// key-ordered live pairs) and a report of what was skipped.
pub fn read(path: &Path) -> Result<Salvaged> {
    let opts = FileOptions {
        mode: OpenMode::ReadOnly,
        ..FileOptions::default()
    };
    let s = FileSpace::open(path, &opts)?;
    let h = Header::read(&s).map_err(|e| e.at(path))?;
    if h.engine == header::EngineKind::Hash {
        return Err(crate::Error::Unsupported(
            "salvage reads leaves; a hash pool has none (dump or scan it instead)".into(),
        ));
    }
    let (records, report) = read_space(&s, &h);
    Ok(Salvaged {
        leaf: h.leaf_format,
        node_size: h.node_size,
        records,
        report,
    })
}

/// [`read`] over any space whose header has been read.
pub fn read_space<S: Space>(s: &S, h: &Header) -> (Records, SalvageReport) {
    let mut rep = SalvageReport::default();
    let pool = header::pool_size(s).min(s.size());
    // A clean close sealed the leaf chain and the commit record, both
    // outside the header's unchecked root words.
    let sealed = match h.leaf_format {
        LeafKind::Nv => recovery::sealed::<S, Nv>(s, h),
        LeafKind::Isle => recovery::sealed::<S, Isle>(s, h),
    };
    let committed = header::txn_committed(s).max(sealed.as_ref().and_then(|x| x.commit).unwrap_or(0));
    let mut claims: BTreeMap<Vec<u8>, Claim> = BTreeMap::new();
    let mut order = 0u64;

    // The chain, tolerantly.
    let mut seen = HashSet::new();
    let mut at = header::leaf_head(s);
    let next_off = |s: &S, leaf: u64| match h.leaf_format {
        LeafKind::Nv => s.load(NvLeaf::at(leaf).next_word()),
        LeafKind::Isle => s.load(IsleLeaf::at(leaf).next_word()) & !il::STALE,
    };
    rep.chain_whole = true;
    while at != 0 {
        if !validate::leaf_offset_ok(at, h.data_start, pool) {
            rep.chain_break = Some(format!("the leaf chain links to invalid offset {at}"));
            break;
        }
        if !seen.insert(at) {
            rep.chain_break = Some(format!("the leaf chain returns to leaf {at} (a cycle)"));
            break;
        }
        rep.chain_leaves += 1;
        read_leaf(s, h, at, pool, committed, false, &mut claims, &mut order, &mut rep);
        at = next_off(s, at);
    }
    if let Some(b) = &rep.chain_break {
        rep.chain_whole = false;
        rep.note(b.clone());
    }
    // The leaves a clean close saved that the chain did not reach (a
    // damaged leaf head or link): that list is the live leaves, so they
    // are read as the chain's, and no chunk scan (which would bring back
    // records that splits dropped) is needed.
    let mut bridged = false;
    if let Some(sealed) = &sealed {
        let missed: Vec<u64> = sealed.leaves.iter().copied().filter(|o| !seen.contains(o)).collect();
        if let Some(first) = missed.first() {
            rep.chain_whole = false;
            rep.note(format!(
                "the leaf chain misses {} of the {} leaves the clean close saved (first: leaf {first}); \
                 read from the saved list",
                missed.len(),
                sealed.leaves.len()
            ));
            for off in missed {
                seen.insert(off);
                rep.chain_leaves += 1;
                read_leaf(s, h, off, pool, committed, false, &mut claims, &mut order, &mut rep);
            }
        }
        bridged = true;
    }

    // Leaves off the chain, from the chunk headers.
    if !rep.chain_whole && !bridged {
        let chain_keys: BTreeSet<Vec<u8>> = claims.keys().cloned().collect();
        let mut found: BTreeMap<Vec<u8>, Claim> = BTreeMap::new();
        for off in block_candidates(s, h, pool) {
            if seen.contains(&off) {
                continue;
            }
            let ok = match h.leaf_format {
                LeafKind::Nv => validate::nv_leaf(s, off, h.data_start).is_ok(),
                LeafKind::Isle => validate::isle_leaf(s, off, h.data_start).is_ok(),
            };
            if !ok {
                continue;
            }
            seen.insert(off);
            rep.scanned_leaves += 1;
            read_leaf(s, h, off, pool, committed, true, &mut found, &mut order, &mut rep);
        }
        for (k, c) in found {
            if !chain_keys.contains(&k) {
                claims.insert(k, c);
            }
        }
    }

    let mut out = Vec::new();
    for (k, c) in claims {
        if let Some(v) = c.value {
            rep.records += 1;
            rep.records_off_chain += c.off_chain as u64;
            out.push((k, v));
        }
    }
    (out, rep)
}

/// Starts of the blocks of every slab and run, by the chunk headers; where
/// a header is damaged, the walk goes on at the next chunk.
fn block_candidates<S: Space>(s: &S, h: &Header, pool: u64) -> Vec<u64> {
    let chunk = h.chunk_size;
    let mut out = Vec::new();
    let mut at = h.data_start;
    while at.saturating_add(chunk) <= pool {
        let hdr = ChunkHeader::decode(s.load(at));
        let chunks = hdr.map_or(1, |x| x.chunks()).clamp(1, (pool - at) / chunk);
        match hdr {
            Some(ChunkHeader::Slab { class, .. }) => {
                let end = at + chunks * chunk;
                let mut b = at + FIRST_BLOCK;
                while b + class <= end {
                    out.push(b);
                    b += class;
                }
            }
            Some(ChunkHeader::Run { .. }) => out.push(at + FIRST_BLOCK),
            _ => {}
        }
        at += chunks * chunk;
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn read_leaf<S: Space>(
    s: &S,
    h: &Header,
    off: u64,
    pool: u64,
    committed: u64,
    off_chain: bool,
    claims: &mut BTreeMap<Vec<u8>, Claim>,
    order: &mut u64,
    rep: &mut SalvageReport,
) {
    match h.leaf_format {
        LeafKind::Nv => read_nv(s, h, off, pool, committed, off_chain, claims, order, rep),
        LeafKind::Isle => read_isle(s, h, off, pool, off_chain, claims, order, rep),
    }
}

/// The size to trust for a leaf: its own if sound, else the node size
/// (cut at the pool end); `None` when not even that fits.
fn leaf_size<S: Space>(s: &S, h: &Header, off: u64, size_word: u64, min: u64, pool: u64) -> Option<u64> {
    let size = s.load(size_word);
    if size >= min && size.is_multiple_of(LINE) && size <= pool - off {
        return Some(size);
    }
    let fallback = (h.node_size as u64).min(pool - off) / LINE * LINE;
    (fallback >= min).then_some(fallback)
}

#[allow(clippy::too_many_arguments)]
fn read_nv<S: Space>(
    s: &S,
    h: &Header,
    off: u64,
    pool: u64,
    committed: u64,
    off_chain: bool,
    claims: &mut BTreeMap<Vec<u8>, Claim>,
    order: &mut u64,
    rep: &mut SalvageReport,
) {
    let Some(size) = leaf_size(s, h, off, NvLeaf::at(off).size_word(), nv::MIN_SIZE, pool) else {
        rep.skipped_leaves += 1;
        rep.note(format!("leaf {off}: no usable size"));
        return;
    };
    let mut layout = Layout::read(s, off);
    // The leaf's capacity with its prefix, or without one when the prefix
    // word itself cannot be right (it would not fit the leaf).
    let cap = nv::capacity_at(size, layout.compact).max(nv::capacity(size));
    let mut count = s.load(NvLeaf::at(off).count_word());
    if count > cap {
        rep.note(format!(
            "leaf {off}: count {count} exceeds capacity {cap}; reading {cap}"
        ));
        count = cap;
    }
    if !layout.valid(size, count) {
        rep.note(format!(
            "leaf {off}: invalid compact prefix {}; skipped it",
            layout.compact
        ));
        rep.skipped_elements += layout.compact.min(count);
        // Read the full elements where a prefix-less leaf keeps them.
        layout.compact = 0;
    }
    // A sealed leaf's count word is written when the leaf is built and at
    // clean shutdown only: after a crash its valid elements go further.
    let stamp = s.load(NvLeaf::at(off).stamp_word());
    if stamp != 0 {
        count = count.max(nv::valid_end(s, &layout, stamp, nv::capacity_at(size, layout.compact)));
    }
    if !layout.gone_ok(count) {
        // Deletion bits past the leaf's elements name nothing: ignored.
        rep.note(format!(
            "leaf {off}: deletion bits past its {count} elements; ignored them"
        ));
        layout.gone = layout.gone_below(count);
    }
    for i in 0..count {
        let words = layout.words(s, i);
        let at = if i < layout.compact { off } else { layout.elem(i) };
        if at + nv::ELEM_SIZE > off + size {
            break;
        }
        match element(s, &words, pool) {
            Ok((key, value, meta)) => {
                if meta.txn && meta.version > committed {
                    continue;
                }
                *order += 1;
                let c = Claim {
                    rank: (meta.version, *order),
                    value: (!meta.negative).then_some(value),
                    off_chain,
                };
                match claims.get(&key) {
                    Some(old) if old.rank > c.rank => {}
                    _ => {
                        claims.insert(key, c);
                    }
                }
            }
            Err(w) => {
                rep.skipped_elements += 1;
                rep.note(format!("leaf {off} element {i}: {w}"));
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn read_isle<S: Space>(
    s: &S,
    h: &Header,
    off: u64,
    pool: u64,
    off_chain: bool,
    claims: &mut BTreeMap<Vec<u8>, Claim>,
    order: &mut u64,
    rep: &mut SalvageReport,
) {
    let Some(size) = leaf_size(s, h, off, IsleLeaf::at(off).size_word(), il::MIN_SIZE, pool) else {
        rep.skipped_leaves += 1;
        rep.note(format!("leaf {off}: no usable size"));
        return;
    };
    for line in 0..il::data_lines(size) {
        let code = (s.load(il::code_word(off, line)) >> il::code_shift(off, line)) as u8;
        if !il::valid(code) {
            rep.skipped_elements += 1;
            rep.note(format!("leaf {off} line {line}: invalid code {code:#x}"));
            continue;
        }
        let c = il::decode(code);
        let lo = il::line(off, size, line);
        for &slot in c.live() {
            let words = match c.kind {
                Kind::Compact => [
                    s.load(il::c_key(lo, slot)),
                    0,
                    s.load(il::c_value(lo, slot)),
                    nv::compact_meta(0),
                ],
                Kind::General => {
                    let e = il::g_elem(lo, slot);
                    [s.load(e), s.load(e + 8), s.load(e + 16), s.load(e + 24)]
                }
                Kind::Empty => continue,
            };
            match element(s, &words, pool) {
                Ok((key, value, meta)) if !meta.negative => {
                    *order += 1;
                    // Isle keeps no versions: the first copy met wins (chain order).
                    claims.entry(key).or_insert(Claim {
                        rank: (0, *order),
                        value: Some(value),
                        off_chain,
                    });
                }
                Ok(_) => {
                    rep.skipped_elements += 1;
                    rep.note(format!("leaf {off} line {line}: a NEGATIVE element"));
                }
                Err(w) => {
                    rep.skipped_elements += 1;
                    rep.note(format!("leaf {off} line {line} slot {slot}: {w}"));
                }
            }
        }
    }
}

/// Key, value and metadata of one element, every reference checked.
fn element<S: Space>(s: &S, words: &[u64; 4], pool: u64) -> std::result::Result<(Vec<u8>, Vec<u8>, Meta), String> {
    let meta = Meta::decode(words[3]).ok_or_else(|| format!("invalid metadata {:#x}", words[3]))?;
    let (mut key, mut value) = (Vec::new(), Vec::new());
    if let Some(l) = meta.key_inline {
        key = nv::word_key(words[0], l as usize);
    }
    if let Some(l) = meta.value_inline {
        value = words[2].to_le_bytes()[..l as usize].to_vec();
    }
    if meta.needs_blob() {
        let b = words[1];
        crate::format::element::validate_blob(s, b, meta, pool)?;
        let (kl, vl) = blob::lens(s.read_u64(b));
        if meta.key_inline.is_none() {
            key = vec![0; kl as usize];
            s.read(blob::key_at(b), &mut key);
            if nv::key_word(&key) != words[0] {
                return Err(format!("blob {b} holds a key that does not match the element"));
            }
        }
        if meta.value_inline.is_none() {
            value = vec![0; vl as usize];
            s.read(blob::value_at(b, kl), &mut value);
        }
    }
    Ok((key, value, meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::SimSpace;
    use crate::{Db, Options};

    fn pool(leaf: LeafKind) -> (std::sync::Arc<SimSpace>, Records) {
        let opts = Options {
            leaf,
            node_size: if leaf == LeafKind::Isle { 640 } else { 512 },
            ..Options::default()
        };
        let db = Db::create_in(SimSpace::new(1 << 20), Path::new("t.nvs"), &opts).unwrap();
        let mut want = BTreeMap::new();
        for i in 0..600u32 {
            let k = if i % 5 == 0 {
                format!("key-{i:05}-long-enough-for-a-blob")
            } else {
                format!("k{i:05}")
            };
            let v = format!("v{i}").repeat(1 + (i % 4) as usize);
            db.put(k.as_bytes(), v.as_bytes()).unwrap();
            want.insert(k.into_bytes(), v.into_bytes());
        }
        for i in (0..600u32).step_by(7) {
            let k = format!("k{i:05}");
            if db.delete(k.as_bytes()).unwrap() {
                want.remove(k.as_bytes());
            }
        }
        let s = db.close_into_space().unwrap();
        (s, want.into_iter().collect())
    }

    #[test]
    fn an_undamaged_pool_salvages_whole() {
        for leaf in [LeafKind::Nv, LeafKind::Isle] {
            let (s, want) = pool(leaf);
            let h = Header::read(&*s).unwrap();
            let (got, rep) = read_space(&*s, &h);
            assert!(rep.chain_whole && rep.skipped_elements == 0, "{leaf:?}: {rep:?}");
            assert_eq!(got, want, "{leaf:?}");
        }
    }

    /// A broken chain in a pool without a saved state (as after a crash).
    #[test]
    fn a_broken_chain_is_bridged_by_the_chunk_headers() {
        let (s, want) = pool(LeafKind::Nv);
        let h = Header::read(&*s).unwrap();
        let first = header::leaf_head(&*s);
        s.store(NvLeaf::at(first).next_word(), 12345);
        s.store(header::CLEAN_STATE_OFF, 0);
        let (got, rep) = read_space(&*s, &h);
        assert!(
            !rep.chain_whole && rep.chain_leaves == 1 && rep.scanned_leaves > 0,
            "{rep:?}"
        );
        // Every live record is back (stale leaves may add old ones).
        let got: BTreeMap<_, _> = got.into_iter().collect();
        for (k, v) in &want {
            assert_eq!(got.get(k), Some(v));
        }
    }

    /// The same break in a cleanly closed pool: the leaves the saved state
    /// lists are read as the chain's, exactly the live records, no scan.
    #[test]
    fn a_broken_chain_of_a_clean_pool_is_bridged_by_the_saved_list() {
        for leaf in [LeafKind::Nv, LeafKind::Isle] {
            let (s, want) = pool(leaf);
            let h = Header::read(&*s).unwrap();
            let first = header::leaf_head(&*s);
            let next = match leaf {
                LeafKind::Nv => NvLeaf::at(first).next_word(),
                LeafKind::Isle => IsleLeaf::at(first).next_word(),
            };
            s.store(next, 12345);
            let (got, rep) = read_space(&*s, &h);
            assert!(
                !rep.chain_whole && rep.chain_leaves > 1 && rep.scanned_leaves == 0,
                "{leaf:?}: {rep:?}"
            );
            assert_eq!(got, want, "{leaf:?}");
        }
    }

    /// A cleanly closed pool whose commit record (header word `txn_commit`)
    /// was lowered: the record sealed with the saved state stands in, so
    /// the committed batch is salvaged, not skipped as cut short.
    #[test]
    fn a_lowered_commit_record_is_read_from_the_saved_state() {
        let opts = Options {
            node_size: 256,
            ..Options::default()
        };
        let db = Db::create_in(SimSpace::new(1 << 20), Path::new("t.nvs"), &opts).unwrap();
        for i in 0..40u64 {
            db.put(&i.to_be_bytes(), b"old").unwrap();
        }
        let mut batch = crate::WriteBatch::new();
        for i in (0..40u64).step_by(3) {
            batch.put(&i.to_be_bytes(), b"new");
        }
        db.write_batch(batch).unwrap();
        assert_eq!(db.stat().multi_leaf_commits, 1);
        let s = db.close_into_space().unwrap();
        s.store(header::TXN_COMMIT_OFF, 0);
        let h = Header::read(&*s).unwrap();
        let (got, rep) = read_space(&*s, &h);
        assert_eq!(rep.skipped_elements, 0, "{rep:?}");
        assert_eq!(got.len(), 40);
        for (k, v) in got {
            let i = u64::from_be_bytes(k.try_into().unwrap());
            let want: &[u8] = if i.is_multiple_of(3) { b"new" } else { b"old" };
            assert_eq!(v, want, "key {i}");
        }
    }

    #[test]
    fn a_damaged_element_is_skipped_alone() {
        let (s, want) = pool(LeafKind::Nv);
        let h = Header::read(&*s).unwrap();
        let first = header::leaf_head(&*s);
        let layout = Layout::read(&*s, first);
        let count = s.load(NvLeaf::at(first).count_word());
        assert!(count > layout.compact, "a full element to damage");
        let e = layout.elem(count - 1);
        s.store(e + nv::E_META, 0xffff_ffff_ffff_ffff);
        let (got, rep) = read_space(&*s, &h);
        assert_eq!(rep.skipped_elements, 1, "{rep:?}");
        assert!(got.len() >= want.len() - 2, "{} of {}", got.len(), want.len());
    }

    #[test]
    fn a_damaged_count_keeps_the_compact_prefix() {
        let opts = Options {
            node_size: 256,
            adaptive: crate::tree::adaptive::Strategy::Off,
            ..Options::default()
        };
        let db = Db::create_in(SimSpace::new(1 << 20), Path::new("t.nvs"), &opts).unwrap();
        let mut want = BTreeMap::new();
        for i in 0..200u64 {
            let k = (i * 7919 % 1009).to_be_bytes();
            db.put(&k, &i.to_le_bytes()).unwrap();
            want.insert(k.to_vec(), i.to_le_bytes().to_vec());
        }
        let s = db.close_into_space().unwrap();
        let h = Header::read(&*s).unwrap();
        let mut leaf = header::leaf_head(&*s);
        while Layout::read(&*s, leaf).compact == 0 {
            leaf = s.load(NvLeaf::at(leaf).next_word());
            assert_ne!(leaf, 0, "no leaf with a compact prefix");
        }
        s.store(NvLeaf::at(leaf).count_word(), u64::MAX);
        let (got, rep) = read_space(&*s, &h);
        assert_eq!(rep.skipped_elements, 0, "{rep:?}");
        assert_eq!(got, want.into_iter().collect::<Records>());
    }

    #[test]
    fn a_cycle_in_the_chain_ends_the_walk() {
        let (s, _) = pool(LeafKind::Isle);
        let h = Header::read(&*s).unwrap();
        let first = header::leaf_head(&*s);
        let second = s.load(IsleLeaf::at(first).next_word()) & !il::STALE;
        s.store(IsleLeaf::at(second).next_word(), first);
        let (_, rep) = read_space(&*s, &h);
        assert!(rep.chain_break.as_deref().unwrap_or("").contains("cycle"), "{rep:?}");
    }
}
