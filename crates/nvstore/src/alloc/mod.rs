//! Block allocator (NV-Tree §3).
//!
//! Persistent state is only the chunk headers (`format::chunk`): a slab's
//! size class is persisted before any of its blocks is handed out. Free lists
//! are DRAM only. After a crash they are rebuilt by reachability: the caller
//! reports every block reachable from the leaf chain, and every other block
//! of an assigned chunk is free. So a crash can neither leak a block nor hand
//! one out twice, and allocation needs no log. A clean shutdown saves the free
//! lists ([`Allocator::save`]) so the next open skips the walk.
//!
//! Size classes are multiples of 64 bytes from 64 B to 64 KiB; larger
//! requests get a run of whole chunks. One mutex guards the lists: the tree
//! allocates only on splits and for out-of-line values, so it has not shown
//! up as contention (revisit with per-thread caches if a benchmark says so).

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::format::chunk::{ChunkHeader, FIRST_BLOCK};
use crate::format::header;
use crate::pmem::{points, Space, LINE};

/// Largest size served from a slab; larger requests get a chunk run.
pub const MAX_CLASS: u64 = 64 * 1024;

/// Block sizes: 64 B steps to 1 KiB, then 4 classes per doubling up to 64 KiB.
pub fn classes() -> &'static [u64] {
    use std::sync::OnceLock;
    static C: OnceLock<Vec<u64>> = OnceLock::new();
    C.get_or_init(|| {
        let mut v: Vec<u64> = (1..=16).map(|i| i * 64).collect();
        let mut base = 1024;
        while base < MAX_CLASS {
            for i in 1..=4 {
                v.push(base + i * base / 4);
            }
            base *= 2;
        }
        v
    })
}

/// Index of the smallest class holding `size` bytes.
pub fn class_index(size: u64) -> usize {
    let c = classes();
    c.partition_point(|&s| s < size)
}

/// A slab of class `class` spans enough chunks for at least 4 blocks.
fn slab_chunks(class: u64, chunk: u64) -> u64 {
    (4 * class + FIRST_BLOCK).div_ceil(chunk)
}

#[derive(Default)]
struct State {
    /// End of the data area (the header's pool size).
    pool_end: u64,
    /// Free chunk runs, coalesced: start -> number of chunks.
    free_chunks: BTreeMap<u64, u64>,
    /// Free blocks per size class.
    free_blocks: Vec<Vec<u64>>,
    /// Assigned slabs and runs: start -> header.
    assigned: BTreeMap<u64, ChunkHeader>,
    /// Blocks no longer reachable but maybe still read (epoch pending).
    retired: BTreeSet<u64>,
    used_bytes: u64,
    /// Debug builds: every block handed out and not freed (catches double
    /// allocation and double free where they happen).
    #[cfg(debug_assertions)]
    live: BTreeSet<u64>,
}

/// The allocator of one pool.
pub struct Allocator {
    chunk: u64,
    data_start: u64,
    state: Mutex<State>,
}

/// What `verify` found wrong.
pub type Problems = Vec<String>;

impl Allocator {
    /// Allocator of a freshly created pool: every chunk free.
    pub fn fresh(chunk: u64, data_start: u64, pool_end: u64) -> Allocator {
        let mut st = State {
            pool_end,
            free_blocks: vec![Vec::new(); classes().len()],
            ..State::default()
        };
        if pool_end > data_start {
            st.free_chunks.insert(data_start, (pool_end - data_start) / chunk);
        }
        Allocator {
            chunk,
            data_start,
            state: Mutex::new(st),
        }
    }

    /// Where the data area starts: no leaf or blob lies below it.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// Bytes in allocated blocks.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes
    }

    /// Allocates a block of at least `size` bytes (64-byte aligned). May grow
    /// the pool. The block's contents are unspecified.
    pub fn alloc<S: Space>(&self, space: &S, size: u64) -> Result<u64> {
        let mut st = self.state.lock();
        if size <= MAX_CLASS {
            let ci = class_index(size.max(1));
            let class = classes()[ci];
            if st.free_blocks[ci].is_empty() {
                let n = slab_chunks(class, self.chunk);
                let start = self.carve(space, &mut st, n, ChunkHeader::Slab { chunks: n, class })?;
                let count = (n * self.chunk - FIRST_BLOCK) / class;
                let list = &mut st.free_blocks[ci];
                // Pushed in reverse so blocks are handed out in address order.
                for i in (0..count).rev() {
                    list.push(start + FIRST_BLOCK + i * class);
                }
            }
            let off = st.free_blocks[ci].pop().expect("slab just filled");
            st.used_bytes += class;
            #[cfg(debug_assertions)]
            assert!(st.live.insert(off), "block {off} handed out twice");
            Ok(off)
        } else {
            let n = (size + FIRST_BLOCK).div_ceil(self.chunk);
            let start = self.carve(space, &mut st, n, ChunkHeader::Run { chunks: n })?;
            st.used_bytes += n * self.chunk - FIRST_BLOCK;
            #[cfg(debug_assertions)]
            assert!(st.live.insert(start + FIRST_BLOCK), "run {start} handed out twice");
            Ok(start + FIRST_BLOCK)
        }
    }

    /// Whether `off` is the start of a block of an assigned chunk (a slab
    /// block or a run's one block) and on no free list: what a saved
    /// state's own block must be before it is freed at open.
    pub fn is_allocated_block(&self, off: u64) -> bool {
        let st = self.state.lock();
        let Some((&start, &h)) = st.assigned.range(..=off).next_back() else {
            return false;
        };
        let end = start + h.chunks() * self.chunk;
        match h {
            ChunkHeader::Slab { class, .. } => {
                off >= start + FIRST_BLOCK
                    && (off - start - FIRST_BLOCK).is_multiple_of(class)
                    && off + class <= end
                    && !st.free_blocks[class_index(class)].contains(&off)
            }
            ChunkHeader::Run { .. } => off == start + FIRST_BLOCK,
            ChunkHeader::Free { .. } => false,
        }
    }

    /// Returns a block to the free lists. The caller guarantees that nothing
    /// persistent refers to it and no reader can still hold it (epochs).
    pub fn free(&self, off: u64) {
        let mut st = self.state.lock();
        self.free_locked(&mut st, off);
    }

    fn free_locked(&self, st: &mut State, off: u64) {
        #[cfg(debug_assertions)]
        if !st.live.is_empty() || off == 0 {
            // Only checked for blocks this process handed out (not rebuilt ones).
            let _ = st.live.remove(&off);
        }
        // A block the pool's own structures name, so on damaged media it may
        // be no block at all: such a free is dropped (the space leaks, which
        // `check` reports) rather than handing out memory twice.
        let Some((&start, &h)) = st.assigned.range(..=off).next_back() else {
            return;
        };
        match h {
            ChunkHeader::Slab { class, chunks } => {
                if off < start + FIRST_BLOCK
                    || !(off - start - FIRST_BLOCK).is_multiple_of(class)
                    || off + class > start + chunks * self.chunk
                {
                    return;
                }
                st.free_blocks[class_index(class)].push(off);
                st.used_bytes -= class;
            }
            ChunkHeader::Run { chunks } => {
                if off != start + FIRST_BLOCK {
                    return;
                }
                st.assigned.remove(&start);
                st.used_bytes -= chunks * self.chunk - FIRST_BLOCK;
                insert_free(&mut st.free_chunks, start, chunks, self.chunk);
            }
            ChunkHeader::Free { .. } => unreachable!("assigned map holds no free runs"),
        }
    }

    /// Marks blocks unreachable from the pool while readers may still hold
    /// them; [`Allocator::release`] frees them once the epoch has passed.
    /// `verify` and `save` count retired blocks as free.
    pub fn retire(&self, offs: &[u64]) {
        self.state.lock().retired.extend(offs.iter().copied());
    }

    /// Frees retired blocks. A block [`Allocator::save`] already counted as
    /// free (clean shutdown before the epoch passed) is skipped.
    pub fn release(&self, offs: &[u64]) {
        // One lock for both steps: deferred releases run on whatever thread
        // pins next, and a concurrent `verify` must never see a block that is
        // neither retired nor free.
        let mut st = self.state.lock();
        for &o in offs {
            if st.retired.remove(&o) {
                self.free_locked(&mut st, o);
            }
        }
    }

    /// Usable size of the block at `off`.
    pub fn block_size(&self, off: u64) -> u64 {
        let st = self.state.lock();
        match st.assigned.range(..=off).next_back() {
            Some((_, ChunkHeader::Slab { class, .. })) => *class,
            Some((_, ChunkHeader::Run { chunks })) => chunks * self.chunk - FIRST_BLOCK,
            _ => 0,
        }
    }

    /// Takes `n` contiguous free chunks, growing the pool if needed, and
    /// persists `h` as their header. The header of any remainder is persisted
    /// first, so a crash in between leaves a walkable sequence.
    fn carve<S: Space>(&self, space: &S, st: &mut State, n: u64, h: ChunkHeader) -> Result<u64> {
        let found = st.free_chunks.iter().find(|(_, &len)| len >= n).map(|(&s, &l)| (s, l));
        let (start, len) = match found {
            Some(x) => x,
            None => {
                self.grow(space, st, n)?;
                st.free_chunks
                    .iter()
                    .find(|(_, &len)| len >= n)
                    .map(|(&s, &l)| (s, l))
                    .expect("grown pool has room")
            }
        };
        st.free_chunks.remove(&start);
        if len > n {
            let rest = start + n * self.chunk;
            space.store(rest, ChunkHeader::Free { chunks: len - n }.encode());
            space.flush(rest, 8, points::CHUNK_HEADER_FLUSH);
            space.fence(points::CHUNK_HEADER_FENCE);
            st.free_chunks.insert(rest, len - n);
        }
        space.store(start, h.encode());
        space.flush(start, 8, points::CHUNK_HEADER_FLUSH);
        space.fence(points::CHUNK_HEADER_FENCE);
        st.assigned.insert(start, h);
        Ok(start)
    }

    /// Grows the pool by at least `n` chunks (doubling, to amortise).
    fn grow<S: Space>(&self, space: &S, st: &mut State, n: u64) -> Result<()> {
        let old = st.pool_end;
        let want = old + n * self.chunk;
        let doubled = (old * 2).max(want);
        if space.grow(doubled).is_err() {
            space.grow(want).map_err(|e| match e {
                Error::PoolFull { path, limit, .. } => Error::PoolFull { path, size: old, limit },
                e => e,
            })?;
        }
        // The file may have grown by more than asked (alignment); use whole chunks of it.
        let new_end = old + (space.size() - old) / self.chunk * self.chunk;
        // The new extent reads as zero: free chunks. Publish the size after the file grew.
        header::set_pool_size(space, new_end);
        insert_free(&mut st.free_chunks, old, (new_end - old) / self.chunk, self.chunk);
        st.pool_end = new_end;
        Ok(())
    }

    /// Rebuilds the allocator by reachability (NV-Tree §3): walks the chunk
    /// headers; every block not in `reachable` is free. Slabs and runs with
    /// no reachable block become free chunks. Writes nothing.
    pub fn rebuild<S: Space>(space: &S, chunk: u64, data_start: u64, reachable: &BTreeSet<u64>) -> Result<Allocator> {
        let pool_end = header::pool_size(space);
        let mut st = State {
            pool_end,
            free_blocks: vec![Vec::new(); classes().len()],
            ..State::default()
        };
        let runs = walk(space, chunk, data_start, pool_end).map_err(Error::corrupt)?;
        for (start, h) in runs {
            let end = start + h.chunks() * chunk;
            let inside: Vec<u64> = reachable.range(start..end).copied().collect();
            match h {
                ChunkHeader::Free { chunks } => {
                    if let Some(b) = inside.first() {
                        return Err(Error::corrupt(format!(
                            "reachable block {b} lies in a free chunk at {start}"
                        )));
                    }
                    insert_free(&mut st.free_chunks, start, chunks, chunk);
                }
                _ if inside.is_empty() => insert_free(&mut st.free_chunks, start, h.chunks(), chunk),
                ChunkHeader::Slab { chunks, class } => {
                    let count = (chunks * chunk - FIRST_BLOCK) / class;
                    for b in &inside {
                        if (b - start) < FIRST_BLOCK
                            || !(b - start - FIRST_BLOCK).is_multiple_of(class)
                            || (b - start - FIRST_BLOCK) / class >= count
                        {
                            return Err(Error::corrupt(format!(
                                "reference {b} is not a block boundary of the slab at {start}"
                            )));
                        }
                    }
                    let ci = class_index(class);
                    for i in (0..count).rev() {
                        let b = start + FIRST_BLOCK + i * class;
                        if !reachable.contains(&b) {
                            st.free_blocks[ci].push(b);
                        }
                    }
                    st.used_bytes += inside.len() as u64 * class;
                    st.assigned.insert(start, h);
                }
                ChunkHeader::Run { chunks } => {
                    if inside != [start + FIRST_BLOCK] {
                        return Err(Error::corrupt(format!(
                            "bad reference into the run at {start}: {inside:?}"
                        )));
                    }
                    st.used_bytes += chunks * chunk - FIRST_BLOCK;
                    st.assigned.insert(start, h);
                }
            }
        }
        Ok(Allocator {
            chunk,
            data_start,
            state: Mutex::new(st),
        })
    }

    /// Serialises the free lists for a clean shutdown.
    pub fn save(&self) -> Vec<u64> {
        let mut st = self.state.lock();
        for o in std::mem::take(&mut st.retired) {
            self.free_locked(&mut st, o);
        }
        let mut out = vec![st.pool_end, st.used_bytes, st.free_chunks.len() as u64];
        for (&s, &n) in &st.free_chunks {
            out.extend([s, n]);
        }
        for list in &st.free_blocks {
            out.push(list.len() as u64);
            out.extend(list.iter().copied());
        }
        out
    }

    /// Restores free lists saved by [`Allocator::save`]; the assigned map is
    /// re-read from the chunk headers (cheap: one word per run).
    pub fn load<S: Space>(space: &S, chunk: u64, data_start: u64, saved: &[u64]) -> Result<Allocator> {
        let bad = |what: &str| Error::corrupt(format!("saved allocator state: {what}"));
        let mut it = saved.iter().copied();
        let mut next = || it.next().ok_or_else(|| bad("truncated"));
        let pool_end = next()?;
        let used_bytes = next()?;
        let mut st = State {
            pool_end,
            used_bytes,
            free_blocks: vec![Vec::new(); classes().len()],
            ..State::default()
        };
        for _ in 0..next()? {
            let (s, n) = (next()?, next()?);
            st.free_chunks.insert(s, n);
        }
        for ci in 0..classes().len() {
            let n = next()?;
            let list = &mut st.free_blocks[ci];
            for _ in 0..n {
                list.push(next()?);
            }
        }
        if pool_end != header::pool_size(space) {
            return Err(bad("pool size differs"));
        }
        let runs = walk(space, chunk, data_start, pool_end).map_err(Error::corrupt)?;
        for (start, h) in runs {
            let in_free = st
                .free_chunks
                .range(..=start)
                .next_back()
                .is_some_and(|(&s, &n)| start < s + n * chunk);
            if !matches!(h, ChunkHeader::Free { .. }) && !in_free {
                st.assigned.insert(start, h);
            }
        }
        Ok(Allocator {
            chunk,
            data_start,
            state: Mutex::new(st),
        })
    }

    /// Checks coverage: every block of every assigned chunk is exactly one of
    /// reachable or free, and nothing reachable lies outside a block.
    pub fn verify<S: Space>(&self, space: &S, reachable: &BTreeSet<u64>) -> Problems {
        let st = self.state.lock();
        let mut problems = Vec::new();
        let runs = match walk(space, self.chunk, self.data_start, st.pool_end) {
            Ok(r) => r,
            Err(e) => return vec![e],
        };
        let mut free: BTreeSet<u64> = BTreeSet::new();
        free.extend(st.retired.iter().copied());
        for list in &st.free_blocks {
            for &b in list {
                if !free.insert(b) {
                    problems.push(format!("block {b} is on a free list twice"));
                }
            }
        }
        let in_free_chunks = |off: u64| {
            st.free_chunks
                .range(..=off)
                .next_back()
                .is_some_and(|(&s, &n)| off < s + n * self.chunk)
        };
        let mut all_blocks = BTreeSet::new();
        for (start, h) in runs {
            if in_free_chunks(start) {
                for b in reachable.range(start..start + h.chunks() * self.chunk) {
                    problems.push(format!("reachable block {b} lies in free chunk space"));
                }
                continue;
            }
            let blocks: Vec<u64> = match h {
                ChunkHeader::Free { .. } => {
                    problems.push(format!(
                        "free chunk run at {start} is not on the free chunk list (leak)"
                    ));
                    continue;
                }
                ChunkHeader::Slab { chunks, class } => (0..(chunks * self.chunk - FIRST_BLOCK) / class)
                    .map(|i| start + FIRST_BLOCK + i * class)
                    .collect(),
                ChunkHeader::Run { .. } => vec![start + FIRST_BLOCK],
            };
            for b in blocks {
                all_blocks.insert(b);
                match (reachable.contains(&b), free.contains(&b)) {
                    (true, true) => problems.push(format!("block {b} is both reachable and free (double use)")),
                    (false, false) => problems.push(format!("block {b} is neither reachable nor free (leak)")),
                    _ => {}
                }
            }
        }
        for b in reachable {
            if !all_blocks.contains(b) && !problems.iter().any(|p| p.contains(&b.to_string())) {
                problems.push(format!("reachable offset {b} is not a block"));
            }
        }
        for b in &free {
            if !all_blocks.contains(b) {
                problems.push(format!("free-list entry {b} is not a block"));
            }
        }
        if problems.len() > 20 {
            let n = problems.len();
            problems.truncate(20);
            problems.push(format!("... and {} more problems", n - 20));
        }
        problems
    }
}

/// Walks the chunk-header sequence; fails on a word no writer produces or a
/// run that overruns the pool.
pub fn walk<S: Space>(
    space: &S,
    chunk: u64,
    data_start: u64,
    pool_end: u64,
) -> std::result::Result<Vec<(u64, ChunkHeader)>, String> {
    let mut out = Vec::new();
    let mut at = data_start;
    while at < pool_end {
        let w = space.load(at);
        let h = ChunkHeader::decode(w).ok_or_else(|| format!("invalid chunk header {w:#x} at offset {at}"))?;
        if let ChunkHeader::Slab { class, .. } = h {
            if classes().get(class_index(class)) != Some(&class) {
                return Err(format!(
                    "slab at offset {at} has block size {class}, which is not a size class"
                ));
            }
        }
        let end = at + h.chunks() * chunk;
        if end > pool_end {
            return Err(format!(
                "chunk run at {at} ({} chunks) overruns the pool end {pool_end}",
                h.chunks()
            ));
        }
        out.push((at, h));
        at = end;
    }
    Ok(out)
}

fn insert_free(map: &mut BTreeMap<u64, u64>, mut start: u64, mut n: u64, chunk: u64) {
    if let Some((&ps, &pn)) = map.range(..start).next_back() {
        if ps + pn * chunk == start {
            map.remove(&ps);
            start = ps;
            n += pn;
        }
    }
    if let Some(&nn) = map.get(&(start + n * chunk)) {
        map.remove(&(start + n * chunk));
        n += nn;
    }
    map.insert(start, n);
}

/// Lines a byte count covers (for flush accounting in tests).
pub fn lines(len: u64) -> u64 {
    len.div_ceil(LINE)
}

#[cfg(test)]
mod tests;
