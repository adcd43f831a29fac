//! Opening a pool: instant recovery after a clean shutdown, rebuild from the
//! leaves after a crash (NV-Tree §4.6).
//!
//! - Clean: the header's `clean_state` word points at the saved index and
//!   free lists; load them, clear the word (persisted) before any other
//!   write, free the saved block.
//! - Otherwise (rebuild-from-LN): walk the leaf chain, scan every leaf on
//!   both cores for its largest key, its valid keys and the blobs it
//!   references, build the inner index from the leaves and the allocator by
//!   reachability. NV leaves need no repair, with one exception: a
//!   multi-leaf transaction cut short by the crash left elements flagged TXN,
//!   newer than the header's commit record, at the end of some leaves;
//!   recovery lowers those leaves' counts below them, or in a sealed leaf
//!   spoils the first one's check bits (flushed and fenced before the pool is used,
//!   so no later commit record can make them count). A sealed leaf's count
//!   word is left alone: its valid elements decide until a clean shutdown.
//!   Lowering a count or zeroing again is harmless, so recovery stays idempotent: a
//!   crash during it is just another crash.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use crate::alloc::Allocator;
use crate::error::{Error, Result};
use crate::format::leaf_nv;
use crate::format::{header, saved};
use crate::pmem::{points, Space, LINE};
use crate::tree::index::{Bound, Entry};
use crate::tree::leaf::LeafFormat;
use crate::tree::{Leaf, Tree};

/// How the last open recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryKind {
    /// A new pool.
    Created,
    /// Loaded the state saved at clean shutdown.
    Instant,
    /// Rebuilt from the leaves (after a crash); on a hash pool, the
    /// ordered index rebuilt by sorting the table's keys.
    Rebuild,
    /// A hash pool: the ordered index loaded from the image its clean close
    /// saved (the table is scanned and validated all the same).
    Loaded,
}

#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Recovery {
    pub kind: RecoveryKind,
    pub millis: f64,
}

/// One leaf's facts gathered by a recovery scan.
struct LeafScan {
    off: u64,
    size: u64,
    count: u64,
    /// The persistent count was higher: elements of an uncommitted transaction follow.
    undo: bool,
    max: Option<Vec<u8>>,
    max_version: u64,
    valid: u64,
    blobs: Vec<u64>,
}

/// Opens the tree of a pool whose header has been validated.
pub fn open_tree<S: Space, L: LeafFormat>(space: Arc<S>, h: &header::Header) -> Result<(Tree<S, L>, Recovery)> {
    let t = Instant::now();
    let s = &*space;
    let clean = header::clean_state(s);
    let node_size = h.node_size as u64;
    if clean != 0 {
        if let Some(loaded) = load_saved::<S, L>(&space, h, clean)? {
            let (tree, saved_block, sealed_commit) = loaded;
            if s.writable() {
                // The commit record is a root word no checksum covers. Lowered
                // by damage, it would let the next crash's rebuild take the
                // committed transactions' elements for a cut-short one and drop
                // them: restore the sealed copy, durably, while the clean word
                // still names the state that holds it.
                if let Some(c) = sealed_commit.filter(|&c| c > header::txn_committed(s)) {
                    header::set_txn_committed(s, c);
                }
                // Cleared before any other write: from here on a crash means rebuild.
                header::set_clean_state(s, 0);
            }
            // DRAM only: a read-only open must count the saved block as free too.
            tree.alloc.free(saved_block);
            return Ok((
                tree,
                Recovery {
                    kind: RecoveryKind::Instant,
                    millis: ms(t),
                },
            ));
        }
    }
    if clean != 0 && s.writable() {
        header::set_clean_state(s, 0);
    }
    let tree = rebuild_from_leaves::<S, L>(space, h, node_size)?;
    Ok((
        tree,
        Recovery {
            kind: RecoveryKind::Rebuild,
            millis: ms(t),
        },
    ))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Walks the chain from the header's leaf head, validating each link.
pub fn walk_chain<S: Space, L: LeafFormat>(s: &S, h: &header::Header) -> Result<Vec<u64>> {
    let pool = header::pool_size(s);
    let mut offs = Vec::new();
    let mut seen = BTreeSet::new();
    let mut at = header::leaf_head(s);
    while at != 0 {
        if !at.is_multiple_of(LINE) || at < h.data_start || at > pool.saturating_sub(leaf_nv::MIN_SIZE) {
            return Err(Error::corrupt(format!("leaf chain points at invalid offset {at}")));
        }
        if !seen.insert(at) {
            return Err(Error::corrupt(format!("leaf chain has a cycle at {at}")));
        }
        offs.push(at);
        at = L::next(s, at);
    }
    Ok(offs)
}

fn scan_leaf<S: Space, L: LeafFormat>(s: &S, off: u64, committed: u64) -> Result<LeafScan> {
    let sc = L::scan(s, off, committed).map_err(Error::corrupt)?;
    Ok(LeafScan {
        off,
        size: sc.size,
        count: sc.count,
        undo: sc.undo,
        max: sc.max,
        max_version: sc.max_version,
        valid: sc.live,
        blobs: sc.blobs,
    })
}

fn rebuild_from_leaves<S: Space, L: LeafFormat>(
    space: Arc<S>,
    h: &header::Header,
    node_size: u64,
) -> Result<Tree<S, L>> {
    let s = &*space;
    let offs = walk_chain::<S, L>(s, h)?;
    let committed = header::txn_committed(s);
    // Scan leaves on both cores (NV-Tree §4.6).
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(offs.len().max(1));
    let per = offs.len().div_ceil(threads.max(1)).max(1);
    let scans: Vec<Result<Vec<LeafScan>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = offs
            .chunks(per)
            .map(|part| {
                sc.spawn(move || {
                    part.iter()
                        .map(|&o| scan_leaf::<S, L>(s, o, committed))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("recovery scan thread panicked"))
            .collect()
    });
    let mut leaves = Vec::with_capacity(offs.len());
    for r in scans {
        leaves.extend(r?);
    }
    // Undo the transaction the crash cut short, durably, before anything
    // else can commit.
    if s.writable() {
        let mut undone = false;
        for l in &leaves {
            undone |= L::recovered(s, l.off, l.count, l.undo);
        }
        if undone {
            s.fence(points::TXN_UNDO_FENCE);
        }
    }
    let last_ts = leaves.iter().map(|l| l.max_version).max().unwrap_or(0).max(committed);
    let mut reachable: BTreeSet<u64> = BTreeSet::new();
    let mut entries = Vec::with_capacity(leaves.len());
    let mut keys = 0;
    let mut prev = Bound::NegInf;
    let n = leaves.len();
    for (i, l) in leaves.into_iter().enumerate() {
        reachable.insert(l.off);
        reachable.extend(l.blobs.iter().copied());
        keys += l.valid;
        let max = if i + 1 == n {
            Bound::PosInf
        } else {
            match l.max {
                Some(m) => Bound::Key(m.into()),
                None => prev.clone(),
            }
        };
        if max < prev {
            return Err(Error::corrupt(format!("leaf chain out of order at leaf {}", l.off)));
        }
        prev = max.clone();
        entries.push(Entry {
            max,
            leaf: Arc::new(Leaf::<L>::with(l.off, l.size, l.count)),
        });
    }
    let alloc = Arc::new(Allocator::rebuild(s, h.chunk_size, h.data_start, &reachable)?);
    if entries.is_empty() {
        if s.writable() {
            let off = Tree::<S, L>::create_first_leaf(s, &alloc, node_size)?;
            entries.push(Entry {
                max: Bound::PosInf,
                leaf: Arc::new(Leaf::<L>::built(off, node_size, 0)),
            });
        } else {
            // Read-only view of a pool whose first leaf was never written.
            entries.push(Entry {
                max: Bound::PosInf,
                leaf: Arc::new(Leaf::<L>::with(0, 0, 0)),
            });
        }
    }
    Ok(Tree::assemble(space, alloc, entries, node_size, keys, last_ts))
}

/// A saved clean state: live keys, the index entries, the allocated blocks.
/// Key count, index entries, free-list words, and the clock and the
/// multi-leaf commit record when saved.
type SavedTree<St> = (u64, Vec<Entry<St>>, Vec<u64>, Option<u64>, Option<u64>);

/// A loaded clean state: the tree, the saved block (free once loaded), and
/// the multi-leaf commit record sealed with it (`None` from older builds).
type Loaded<S, L> = (Tree<S, L>, u64, Option<u64>);

/// Reads the state the clean word names, with its offset; `None` when it
/// does not verify (magic, length, checksum, the clean word's tag, every
/// leaf's size and count).
fn read_saved<S: Space, L: LeafFormat>(
    s: &S,
    h: &header::Header,
    clean_word: u64,
) -> Option<(SavedTree<L::State>, u64)> {
    let pool = header::pool_size(s);
    let (at, tag) = saved::clean_parts(clean_word);
    if !at.is_multiple_of(LINE) || at < h.data_start || at > pool.saturating_sub(16) {
        return None;
    }
    let words = saved::words_at(s, at) as usize;
    if words < saved::BODY_W || words as u64 > (pool - at) / 8 {
        return None;
    }
    let mut bytes = vec![0u8; words * 8];
    s.read(at, &mut bytes);
    let all: Vec<u64> = bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let body = saved::open(&all)?;
    // A stale saved state left at the same offset by an earlier close has another checksum.
    if saved::tag(&all) != tag {
        return None;
    }
    let mut it = body.iter().copied();
    let parse = |it: &mut dyn Iterator<Item = u64>| -> Option<SavedTree<L::State>> {
        let keys = it.next()?;
        let n = it.next()? as usize;
        let mut entries = Vec::with_capacity(n.min(1 << 24));
        for _ in 0..n {
            let off = it.next()?;
            let tag = it.next()?;
            let key = saved::get_bytes(&mut *it)?;
            let max = match tag {
                0 => Bound::NegInf,
                1 => Bound::Key(key.into()),
                2 => Bound::PosInf,
                _ => return None,
            };
            // The same checks as a rebuild makes: a saved state is trusted
            // only as far as the leaves it names are sound.
            if !off.is_multiple_of(LINE) || off < h.data_start || off > pool.saturating_sub(leaf_nv::MIN_SIZE) {
                return None;
            }
            let size = L::size(s, off);
            let count = L::count(s, off);
            if size < leaf_nv::MIN_SIZE
                || !size.is_multiple_of(LINE)
                || size > pool - off
                || count > L::max_count(size)
                || !L::layout_ok(s, off, size, count)
            {
                return None;
            }
            entries.push(Entry {
                max,
                leaf: Arc::new(Leaf::<L>::with(off, size, count)),
            });
        }
        let na = it.next()? as usize;
        let alloc: Vec<u64> = (&mut *it).take(na).collect();
        // The clock and the commit record, under the checksum (saved states
        // from before they were kept here end earlier: the header's words
        // stand in).
        let clock = it.next();
        let commit = it.next();
        (alloc.len() == na && !entries.is_empty()).then_some((keys, entries, alloc, clock, commit))
    };
    parse(&mut it).map(|t| (t, at))
}

/// What a clean close sealed, read without building anything.
pub struct Sealed {
    /// The leaf chain it saved, in order.
    pub leaves: Vec<u64>,
    /// The multi-leaf commit record (`None` from older builds).
    pub commit: Option<u64>,
}

/// The sealed facts of a cleanly closed pool, when its saved state
/// verifies; `None` for a pool that is open, crashed, or whose state does
/// not verify. For readers that do not open the tree (`salvage`).
pub fn sealed<S: Space, L: LeafFormat>(s: &S, h: &header::Header) -> Option<Sealed> {
    let clean = header::clean_state(s);
    if clean == 0 {
        return None;
    }
    let ((_, entries, _, _, commit), _) = read_saved::<S, L>(s, h, clean)?;
    Some(Sealed {
        leaves: entries.iter().map(|e| e.leaf.off).collect(),
        commit,
    })
}

/// Loads the clean-shutdown state; `None` when it does not verify (then
/// the caller rebuilds from the leaves). A state that verifies but names
/// other leaves than the persistent chain is damage to the chain (a leaf
/// head or sibling link): `Error::Corrupt`, since a rebuild would follow the
/// damaged chain and silently drop the leaves it no longer reaches.
fn load_saved<S: Space, L: LeafFormat>(
    space: &Arc<S>,
    h: &header::Header,
    clean_word: u64,
) -> Result<Option<Loaded<S, L>>> {
    let s = &**space;
    let Some(((keys, entries, alloc_words, saved_clock, saved_commit), at)) = read_saved::<S, L>(s, h, clean_word)
    else {
        return Ok(None);
    };
    // The saved leaves must be exactly the persistent chain, in order.
    match walk_chain::<S, L>(s, h) {
        Ok(chain) if chain.len() == entries.len() && chain.iter().zip(&entries).all(|(&c, e)| c == e.leaf.off) => {}
        Ok(chain) => {
            let at = chain.iter().zip(&entries).position(|(&c, e)| c != e.leaf.off);
            let at = at.unwrap_or(chain.len().min(entries.len()));
            let saved = entries
                .get(at)
                .map_or("its end".to_string(), |e| format!("leaf {}", e.leaf.off));
            let found = chain.get(at).map_or("its end".to_string(), |o| format!("leaf {o}"));
            return Err(Error::corrupt(format!(
                "the leaf chain ({} leaves) is not the one the clean close saved ({} leaves): at position {at} \
                 it reaches {found} where the saved state has {saved} (a damaged leaf head or sibling link); \
                 `nvstore salvage` also reads the leaves off the chain",
                chain.len(),
                entries.len(),
            )));
        }
        // A bad link: the rebuild reports it.
        Err(_) => return Ok(None),
    }
    let Ok(alloc) = Allocator::load(s, h.chunk_size, h.data_start, &alloc_words) else {
        return Ok(None);
    };
    // The state's own block is freed once loaded: it must be one.
    if !alloc.is_allocated_block(at) {
        return Ok(None);
    }
    let alloc = Arc::new(alloc);
    // The header's clock word is a root word no checksum covers: a damaged
    // one below the stored versions would hand out timestamps older than
    // them. The sealed copy is trusted instead wherever there is one.
    let last_ts = saved_clock
        .unwrap_or_else(|| header::last_ts(s))
        .max(header::txn_committed(s))
        .max(saved_commit.unwrap_or(0));
    let tree = Tree::assemble(space.clone(), alloc, entries, h.node_size as u64, keys, last_ts);
    Ok(Some((tree, at, saved_commit)))
}

/// Saves the inner index and free lists and marks the pool clean (NV-Tree
/// §4.6): write and flush the state, then one atomic store of its offset.
pub fn save_clean<S: Space, L: LeafFormat>(tree: &Tree<S, L>) -> Result<()> {
    let s = &*tree.space;
    let mut head = vec![tree.len()];
    let entries = tree.index.load().entries();
    head.push(entries.len() as u64);
    for e in &entries {
        head.push(e.leaf.off);
        match &e.max {
            Bound::NegInf => {
                head.push(0);
                saved::put_bytes(&mut head, &[]);
            }
            Bound::Key(k) => {
                head.push(1);
                saved::put_bytes(&mut head, k);
            }
            Bound::PosInf => {
                head.push(2);
                saved::put_bytes(&mut head, &[]);
            }
        }
    }
    // Appends do not store a sealed leaf's count: its DRAM count is persisted here.
    for e in &entries {
        L::settle(s, &e.leaf);
    }
    let mut room = (head.len() + tree.alloc.save().len() + saved::BODY_W) * 2 + 1024;
    loop {
        let block = tree.alloc.alloc(s, room as u64 * 8)?;
        let mut body = head.clone();
        let a = tree.alloc.save();
        body.push(a.len() as u64);
        body.extend(a);
        body.push(tree.clock.last());
        body.push(header::txn_committed(s));
        let sealed = saved::seal(&body);
        if sealed.len() > room {
            tree.alloc.free(block);
            room = sealed.len() * 2;
            continue;
        }
        let bytes: Vec<u8> = sealed.iter().flat_map(|w| w.to_le_bytes()).collect();
        s.write(block, &bytes);
        s.flush(block, bytes.len() as u64, crate::pmem::points::SHUTDOWN_STATE_FLUSH);
        // No fence of its own: the clean word's fence below (same thread)
        // orders this flush too, and a clean word that reaches the media
        // before the state does is harmless: the state fails its checksum or
        // its tag, and the next open rebuilds from the leaves.
        // Also in the header, for builds that read the clock from there.
        header::set_last_ts(s, tree.clock.last());
        header::set_clean_state(s, saved::clean_word(block, &sealed));
        return s.sync();
    }
}
