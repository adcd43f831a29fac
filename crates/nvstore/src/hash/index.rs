//! The ordered index in DRAM (KVS B+Tree index §2): a B+-tree over the
//! table's keys that adds range and prefix queries to the hash table, and
//! is rebuilt from it at open ([`Index::rebuild`]).
//!
//! - Proactive top-down rebalancing (KVS B+Tree index §2): on the way down,
//!   a writer splits any child that is full before entering it, and fixes
//!   any child at the minimum (borrowing from a sibling, else merging with
//!   it) before entering it. The parent always has room for the separator
//!   a split adds and keys to spare for a merge, so no split or merge ever
//!   propagates back up: each level is changed at most once, on the way
//!   down, and a node is never revisited.
//! - Readers never block (KVS B+Tree index §2: "search operations and range
//!   queries are not delayed"). Inner nodes are immutable: a writer that
//!   changes the tree's shape (a split, a merge, a borrow) or replaces an
//!   entry copies the nodes on its path (copy-on-write) and publishes a new
//!   root with one atomic pointer swap (`arc-swap`).
//! - A removal whose path needs no merge or borrow (every node below the
//!   root above its minimum) copies nothing either: it marks the entry's
//!   slot dead in its leaf, and the dead entry is dropped when the leaf is
//!   next copied. Only a removal from a node at its minimum copies the path.
//! - An insert of a new key whose path needs no split (most inserts) copies
//!   nothing: leaves are append-only. A leaf holds its entries in slots that
//!   are each set once (before a published count raises past them); the sorted
//!   entries it was built with come first, later ones are appended in
//!   arrival order, and a reader that enters a leaf reads the count once
//!   and orders what it sees. So most inserts cost a descent, one key
//!   allocation and two stores, not a copy of the path with a reference
//!   count update per entry of every node on it.
//! - What a range sees: a reader loads the root once and walks that tree's
//!   nodes; a leaf is read as it is when the reader enters it. A leaf's key
//!   range never changes while it is in the tree (a split, merge or borrow
//!   replaces the leaves it touches, and the replaced ones are never
//!   written again), so a reader yields keys in order, each once, every key
//!   present throughout the range and none that never was. An insert made
//!   during the range may or may not be seen.
//! - Nodes are reference counted, so a node is freed when the last reader
//!   holding it is gone (no epochs, no raw pointers). Writers are
//!   serialised by one mutex; only they wait for each other.
//! - A range query descends once to its first key and then walks the
//!   leaves in order with a stack of the path (KVS B+Tree index §2 chains
//!   leaves for this; copy-on-write nodes cannot hold sibling links, and
//!   the stack visits each node once all the same).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::table::HashTable;
use crate::pmem::Space;

/// Default branching factor of inner nodes: most children per inner node.
/// Copying an inner node on a split's path bumps the reference count of
/// each of its children (a cache miss each when the index is cold), so
/// wider inner nodes make each split dearer.
pub const ORDER: usize = 32;

/// Default leaf capacity: most entries per leaf. A leaf splits (the only
/// time an insert of a new key copies its path) once per `LEAF / 2`
/// inserts into it. A split copies every entry of the leaf, so what it
/// costs per insert hardly depends on the leaf's size, but each split also
/// copies the parent (a reference count update per child) and builds two
/// leaves (their append slots are initialised one by one), and those costs
/// shrink with fewer splits: 256 took about a fifth off what the index
/// adds to a put, against 128 (BENCHMARKS.md, "The ordered index's
/// share of a put"). A reader entering a leaf sorts what was appended
/// since the leaf was built, at most `LEAF / 2` entries, as (head, slot)
/// pairs; a 20-pair range scan measured the same at 128 and 256. Inserts
/// of keys known to be new ([`Index::insert_new`]) do not search the
/// leaf, so its size costs them nothing else.
pub const LEAF: usize = 256;

/// A key as nodes hold it: its first 8 bytes as a number (`head`), then
/// its bytes, inline up to [`INLINE`] bytes, shared beyond.
///
/// - A node also keeps its keys' heads side by side ([`Seps`], a leaf's
///   `base_heads`): a descent compares the probe's head with those words
///   and reads a whole key only where the heads tie.
/// - Copying a node on a writer's path (copy-on-write: a split, a merge)
///   copies its keys. An inline key is copied as plain bytes within the
///   node; a shared one (`Arc`) by a reference count update, which touches
///   the key's own allocation, a cache miss per key when the index is cold.
///   Keys of up to [`INLINE`] bytes (a SHA-1 in hex is 40) thus cost no
///   allocation of their own and no reference counting.
#[derive(Clone, Debug)]
struct Key {
    head: u64,
    bytes: KeyBytes,
}

/// Keys up to this long are kept inside the node.
const INLINE: usize = 46;

#[derive(Clone, Debug)]
enum KeyBytes {
    Inline { len: u8, buf: [u8; INLINE] },
    Shared(Arc<[u8]>),
}

/// The first 8 bytes of `k` as a big-endian number, zeros past its end:
/// heads order as the keys do, except that equal heads leave it open.
#[inline]
fn head(k: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = k.len().min(8);
    b[..n].copy_from_slice(&k[..n]);
    u64::from_be_bytes(b)
}

impl Key {
    fn new(k: &[u8]) -> Key {
        Key::with_head(head(k), k)
    }

    fn with_head(head: u64, k: &[u8]) -> Key {
        let bytes = if k.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..k.len()].copy_from_slice(k);
            KeyBytes::Inline {
                len: k.len() as u8,
                buf,
            }
        } else {
            KeyBytes::Shared(Arc::from(k))
        };
        Key { head, bytes }
    }

    /// How this key orders against the key `p` looks for.
    #[inline]
    fn cmp_probe(&self, p: &Probe<'_>) -> std::cmp::Ordering {
        self.head.cmp(&p.head).then_with(|| self[..].cmp(p.bytes))
    }

    /// Whether this is the key `p` looks for.
    #[inline]
    fn is(&self, p: &Probe<'_>) -> bool {
        self.head == p.head && self[..] == *p.bytes
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.bytes {
            KeyBytes::Inline { len, buf } => &buf[..*len as usize],
            KeyBytes::Shared(b) => b,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        self.head == o.head && self[..] == o[..]
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Key {
    fn cmp(&self, o: &Key) -> std::cmp::Ordering {
        self.head.cmp(&o.head).then_with(|| self[..].cmp(&o[..]))
    }
}

/// A key looked for, with its head computed once per operation.
#[derive(Clone, Copy)]
struct Probe<'a> {
    head: u64,
    bytes: &'a [u8],
}

impl<'a> Probe<'a> {
    fn new(bytes: &'a [u8]) -> Probe<'a> {
        Probe {
            head: head(bytes),
            bytes,
        }
    }

    fn key(&self) -> Key {
        Key::with_head(self.head, self.bytes)
    }
}

enum Node<V> {
    Leaf(Leaf<V>),
    /// `kids[i]` holds the keys `k` with `keys[i-1] <= k < keys[i]`.
    Inner {
        keys: Seps,
        kids: Vec<Arc<Node<V>>>,
    },
}

/// An inner node's separator keys, with their heads side by side in a
/// vector of their own: a descent counts the heads below the key's (31
/// words, four cache lines, loaded together and compared without a branch
/// per key) and reads a whole key only where the heads tie. A binary
/// search over the keys themselves (56 bytes each) read a line per probe,
/// one after the other, five per node (BENCHMARKS.md, "The hash engine's
/// delete"). Every change goes through the methods below, which keep the
/// two in step; [`Index::check`] verifies they are.
#[derive(Debug)]
struct Seps {
    keys: Vec<Key>,
    heads: Vec<u64>,
}

impl From<Vec<Key>> for Seps {
    fn from(keys: Vec<Key>) -> Seps {
        let heads = keys.iter().map(|k| k.head).collect();
        Seps { keys, heads }
    }
}

impl std::ops::Deref for Seps {
    type Target = [Key];
    #[inline]
    fn deref(&self) -> &[Key] {
        &self.keys
    }
}

impl Seps {
    /// A copy with room for one more separator (a copy on a writer's path
    /// is made to take a split's).
    fn with_spare(&self) -> Seps {
        Seps {
            keys: with_spare(&self.keys),
            heads: with_spare(&self.heads),
        }
    }

    fn insert(&mut self, i: usize, k: Key) {
        self.heads.insert(i, k.head);
        self.keys.insert(i, k);
    }

    fn remove(&mut self, i: usize) -> Key {
        self.heads.remove(i);
        self.keys.remove(i)
    }

    fn push(&mut self, k: Key) {
        self.heads.push(k.head);
        self.keys.push(k);
    }

    fn pop(&mut self) -> Option<Key> {
        self.heads.pop();
        self.keys.pop()
    }

    /// Replaces separator `i`, returning the old one.
    fn set(&mut self, i: usize, k: Key) -> Key {
        self.heads[i] = k.head;
        std::mem::replace(&mut self.keys[i], k)
    }

    fn split_off(&mut self, at: usize) -> Seps {
        Seps {
            keys: self.keys.split_off(at),
            heads: self.heads.split_off(at),
        }
    }

    /// Moves every separator of `other` to the end of these.
    fn append(&mut self, other: &mut Seps) {
        self.keys.append(&mut other.keys);
        self.heads.append(&mut other.heads);
    }

    /// Removes the first `n` separators and returns them.
    fn take_front(&mut self, n: usize) -> Seps {
        let rest = self.split_off(n);
        std::mem::replace(self, rest)
    }

    /// Whether every head is its key's (for [`Index::check`]).
    fn in_step(&self) -> bool {
        heads_in_step(self.keys.iter(), &self.heads)
    }
}

/// Whether `heads` are the heads of `keys`, one each, in order.
fn heads_in_step<'a>(keys: impl ExactSizeIterator<Item = &'a Key>, heads: &[u64]) -> bool {
    keys.len() == heads.len() && keys.zip(heads).all(|(k, &h)| k.head == h)
}

/// An append slot of a [`Leaf`]: set once by the index's writer before the
/// leaf's `len` publishes it, then only read. A plain cell rather than a
/// `OnceLock`: the writer lock and the `len` store already order the set
/// before every read, and `OnceLock::set` spent a locked compare-exchange
/// and a check of its state line on each append (BENCHMARKS.md, "The
/// ordered index on a machine with a small L2"). Uninitialised until set
/// (`MaybeUninit`): building a leaf writes nothing into its free slots (an
/// `Option` per slot wrote a tag into each, every line of the slots), and
/// an append writes its slot without reading it first. Whether a slot is
/// set is the leaf's to know (below its `len`); [`Leaf`]'s `Drop` drops
/// the set ones.
struct TailSlot<T>(UnsafeCell<MaybeUninit<T>>);

// SAFETY: a slot is written only through `TailSlot::set`, whose callers
// (the single writer, under the writer lock) write it while its position
// is at or above the leaf's `len`, which no reader reads past; readers read
// it through `TailSlot::get` only below a `len` they loaded with acquire,
// after the writer's release store of that `len`. No slot is ever read and
// written at once, and a shared read sees a complete value.
#[allow(unsafe_code)]
unsafe impl<T: Send + Sync> Sync for TailSlot<T> {}

impl<T> TailSlot<T> {
    /// `n` unset slots, allocated but not written.
    #[allow(unsafe_code)]
    fn unset(n: usize) -> Box<[TailSlot<T>]> {
        let slots = Box::<[TailSlot<T>]>::new_uninit_slice(n);
        // SAFETY: a `TailSlot` is an `UnsafeCell<MaybeUninit<T>>`, for
        // which uninitialised memory is a valid value.
        unsafe { slots.assume_init() }
    }

    /// Sets the slot.
    ///
    /// # Safety
    /// Only the index's writer calls this, under the writer lock, on an
    /// unset slot at or above its leaf's published `len` (so no reader can
    /// read it), before raising `len` past it with a release store.
    #[allow(unsafe_code)]
    unsafe fn set(&self, v: T) {
        // SAFETY: per this function's contract, nobody else accesses the
        // slot now, and it holds no value to drop.
        unsafe { (*self.0.get()).write(v) };
    }

    /// The slot's value.
    ///
    /// # Safety
    /// The slot is below a `len` of its leaf that the caller loaded with
    /// acquire (so it was set before, and is not written any more).
    #[allow(unsafe_code)]
    unsafe fn get(&self) -> &T {
        // SAFETY: per this function's contract, the slot is set and only
        // read now.
        unsafe { (*self.0.get()).assume_init_ref() }
    }

    /// Moves the value out; the slot counts as unset from then on.
    ///
    /// # Safety
    /// The slot is set, and the caller owns its leaf (`&mut`) and makes
    /// the leaf treat the slot as unset (it is not read or dropped again).
    #[allow(unsafe_code)]
    unsafe fn take(&mut self) -> T {
        // SAFETY: per this function's contract.
        unsafe { self.0.get_mut().assume_init_read() }
    }

    /// Drops the value.
    ///
    /// # Safety
    /// As [`TailSlot::take`].
    #[allow(unsafe_code)]
    unsafe fn drop_value(&mut self) {
        // SAFETY: per this function's contract.
        unsafe { self.0.get_mut().assume_init_drop() }
    }
}

/// An append-only leaf: `slots[..sorted]` ascending (the entries it was
/// built with), `slots[sorted..len]` appended since, in arrival order.
/// Only the writer appends (under the writer lock); a slot is set before
/// `len` is raised past it (release), so a reader that loads `len`
/// (acquire) finds every slot below it set.
///
/// A removal that needs no rebalancing marks its slot dead (`dead`, one
/// bit per slot) instead of copying the leaf; dead slots are skipped by
/// every lookup and dropped when the leaf is next copied. A key removed
/// and inserted again is appended anew, its bit set before the append's
/// `len` store, so a reader that sees the new entry also sees the old one
/// dead (never both live).
///
/// The entries a leaf is built with are a plain boxed slice (`base`); only
/// the slots for appends are set-once cells (`tail`). Building a leaf (a
/// split, borrow or merge builds several) thus costs no per-slot atomic
/// state, and an append costs one store of the entry and one of the
/// key's head.
///
/// The appended entries are in arrival order, so a lookup scans them: it
/// scans their heads (`tail_heads`, eight per cache line) and reads an
/// entry only where the head matches, instead of reading every entry (a
/// line or more each). A split sorts them by the same heads.
struct Leaf<V> {
    /// The sorted entries the leaf was built with (`sorted` of them).
    base: Box<[(Key, V)]>,
    /// The heads of `base`'s keys, side by side: a lookup searches these
    /// (eight to a line) and reads whole keys only where heads tie, as
    /// an inner node's descent does ([`Seps`]).
    base_heads: Box<[u64]>,
    /// Slot `sorted + j` is `tail[j]`.
    tail: Box<[TailSlot<(Key, V)>]>,
    /// `tail_heads[j]` is the head of `tail[j]`'s key, stored before the
    /// append's `len` store publishes the slot.
    tail_heads: Box<[AtomicU64]>,
    sorted: usize,
    cap: usize,
    len: AtomicUsize,
    dead: Box<[AtomicU64]>,
}

impl<V: Clone> Leaf<V> {
    /// A leaf of `cap` slots holding `entries` (ascending, at most `cap`).
    fn new(cap: usize, entries: Vec<(Key, V)>) -> Leaf<V> {
        assert!(
            entries.len() <= cap,
            "a leaf of {cap} slots built with {} entries",
            entries.len()
        );
        let n = entries.len();
        Leaf {
            base_heads: entries.iter().map(|e| e.0.head).collect(),
            base: entries.into_boxed_slice(),
            tail: TailSlot::unset(cap - n),
            tail_heads: (n..cap).map(|_| AtomicU64::new(0)).collect(),
            sorted: n,
            cap,
            len: AtomicUsize::new(n),
            dead: (0..cap.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The head of appended slot `i` (`i >= sorted`, below a `len` the
    /// caller loaded).
    #[inline]
    fn tail_head(&self, i: usize) -> u64 {
        self.tail_heads[i - self.sorted].load(Ordering::Relaxed)
    }

    /// Slots in use, dead ones included.
    fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn cap(&self) -> usize {
        self.cap
    }

    /// Entries not removed (what the tree's occupancy rules count).
    fn live(&self) -> usize {
        self.len() - self.removed()
    }

    /// Whether every slot is used (live or dead): nothing can be appended.
    fn full(&self) -> bool {
        self.len() == self.cap()
    }

    /// Slots marked dead.
    fn removed(&self) -> usize {
        self.dead
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones() as usize)
            .sum()
    }

    fn is_dead(&self, i: usize) -> bool {
        self.dead[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    /// Marks slot `i` removed. Only the writer calls this, under the
    /// writer lock.
    fn kill(&self, i: usize) {
        debug_assert!(!self.is_dead(i));
        self.dead[i / 64].fetch_or(1 << (i % 64), Ordering::Release);
    }

    /// Slot `i`, below a `len` this thread has loaded.
    fn entry(&self, i: usize) -> &(Key, V) {
        match i.checked_sub(self.sorted) {
            None => &self.base[i],
            // SAFETY: `i` is below a `len` this thread loaded (acquire),
            // and the writer sets a slot before its release store of a
            // `len` past it; a published slot is never written again.
            #[allow(unsafe_code)]
            Some(j) => unsafe { self.tail[j].get() },
        }
    }

    /// The slots of the entries published now, in key order: the sorted
    /// ones merged with the appended ones, sorted here. The appended ones
    /// are sorted as (head, slot) pairs, so most comparisons are of two
    /// numbers side by side rather than of two keys behind their slots.
    fn order(&self) -> Vec<usize> {
        // `len` first: the dead bits of what it publishes are then visible.
        let n = self.len();
        // Most leaves have no dead slot: then no slot's bit is looked up.
        let none_dead = self.removed() == 0;
        let live = |i: &usize| none_dead || !self.is_dead(*i);
        if self.sorted == n && none_dead {
            return (0..n).collect();
        }
        let key = |i: usize| &self.entry(i).0;
        // Each appended slot as one number, its head above its slot: a
        // sort of plain numbers orders them by head (the slot only breaks
        // ties), then each run of equal heads (keys that share their first
        // 8 bytes) is sorted by key.
        let mut tail: Vec<u128> = (self.sorted..n)
            .filter(live)
            .map(|i| (self.tail_head(i) as u128) << 64 | i as u128)
            .collect();
        tail.sort_unstable();
        let (th, ts) = (|t: u128| (t >> 64) as u64, |t: u128| t as u64 as usize);
        for run in tail.chunk_by_mut(|&a, &b| th(a) == th(b)).filter(|r| r.len() > 1) {
            run.sort_unstable_by(|&a, &b| key(ts(a)).cmp(key(ts(b))));
        }
        let mut out = Vec::with_capacity(n);
        let mut t = tail.iter().peekable();
        for i in (0..self.sorted).filter(live) {
            let h = self.base_heads[i];
            // Keys are distinct: an appended one goes first iff it is less.
            while let Some(&j) = t.next_if(|&&x| th(x) < h || (th(x) == h && key(ts(x)) < &self.base[i].0)) {
                out.push(ts(j));
            }
            out.push(i);
        }
        out.extend(t.map(|&x| ts(x)));
        out
    }

    /// The slot holding `key`, if published.
    fn find(&self, key: &Probe<'_>) -> Option<usize> {
        let n = self.len();
        let lo = self.base_heads.partition_point(|&h| h < key.head);
        // Counted on from `lo`: a run of tied heads is most often empty
        // or one word, on the line the search just read.
        let ties = self.base_heads[lo..].iter().take_while(|&&h| h == key.head).count();
        let hit = match ties {
            0 => None,
            1 => self.base[lo].0.is(key).then_some(lo),
            _ => self.base[lo..lo + ties]
                .binary_search_by(|e| e.0.cmp_probe(key))
                .ok()
                .map(|i| lo + i),
        };
        hit.filter(|&i| !self.is_dead(i)).or_else(|| {
            (self.sorted..n).find(|&i| self.tail_head(i) == key.head && !self.is_dead(i) && self.entry(i).0.is(key))
        })
    }

    /// Appends an entry whose key the leaf lacks; the leaf has a free
    /// slot. Only the writer calls this, under the writer lock.
    fn append(&self, key: Key, val: V) {
        let i = self.len.load(Ordering::Relaxed);
        self.tail_heads[i - self.sorted].store(key.head, Ordering::Relaxed);
        // SAFETY: only the writer appends (under the writer lock), and slot
        // `i` is at the leaf's `len`: no reader reads it until the release
        // store below publishes it.
        #[allow(unsafe_code)]
        unsafe {
            self.tail[i - self.sorted].set((key, val))
        };
        self.len.store(i + 1, Ordering::Release);
    }

    /// Copies of the entries, in key order.
    fn entries(&self) -> Vec<(Key, V)> {
        self.order().into_iter().map(|i| self.entry(i).clone()).collect()
    }

    /// Moves the entries out, in key order, leaving the leaf empty (a leaf
    /// no reader can see: the writer's own copy).
    fn take(&mut self) -> Vec<(Key, V)> {
        let n = std::mem::take(self.len.get_mut());
        let dead: Vec<u64> = self.dead.iter_mut().map(|w| std::mem::take(w.get_mut())).collect();
        self.base_heads = Box::default();
        let mut e = std::mem::take(&mut self.base).into_vec();
        let mut tail = std::mem::take(&mut self.tail);
        // SAFETY: the slots below `n` are set. `len` is 0 now and the
        // slots are out of the leaf, so none is read or dropped again (a
        // `TailSlot` drops nothing of its own).
        #[allow(unsafe_code)]
        e.extend(tail[..n - self.sorted].iter_mut().map(|t| unsafe { t.take() }));
        if dead.iter().any(|&w| w != 0) {
            let mut i = 0;
            e.retain(|_| {
                i += 1;
                dead[(i - 1) / 64] & (1 << ((i - 1) % 64)) == 0
            });
        }
        if self.sorted < n {
            e.sort_by(|a, b| a.0.cmp(&b.0));
        }
        self.sorted = 0;
        e
    }

    /// Fills an empty leaf (after [`Leaf::take`]) with `entries`, ascending.
    fn put(&mut self, entries: Vec<(Key, V)>) {
        assert!(*self.len.get_mut() == 0, "a leaf is refilled only once emptied");
        *self = Leaf::new(self.cap(), entries);
    }
}

impl<V> Drop for Leaf<V> {
    /// Drops the set append slots (those below `len`); the others hold
    /// nothing.
    fn drop(&mut self) {
        let set = self.len.get_mut().saturating_sub(self.sorted);
        for t in &mut self.tail[..set] {
            // SAFETY: slots below `len` are set, and the leaf is going
            // away: nothing reads them after this.
            #[allow(unsafe_code)]
            unsafe {
                t.drop_value()
            };
        }
    }
}

impl<V: Clone> Clone for Node<V> {
    /// A copy for a writer's path; a leaf's copy has its entries sorted.
    fn clone(&self) -> Self {
        match self {
            Node::Leaf(leaf) => Node::Leaf(Leaf::new(leaf.cap(), leaf.entries())),
            // With room for one more separator and child: a copy on a
            // writer's path is made to take a split's (growing a vector
            // of exactly its length reallocated and copied it).
            Node::Inner { keys, kids } => Node::Inner {
                keys: keys.with_spare(),
                kids: with_spare(kids),
            },
        }
    }
}

/// A copy of `v` with room for one more element.
fn with_spare<T: Clone>(v: &[T]) -> Vec<T> {
    let mut c = Vec::with_capacity(v.len() + 1);
    c.extend_from_slice(v);
    c
}

impl<V: Clone> Node<V> {
    fn size(&self) -> usize {
        match self {
            Node::Leaf(leaf) => leaf.live(),
            Node::Inner { kids, .. } => kids.len(),
        }
    }

    /// The two halves of a full node and the separator between them; the
    /// node itself is left as it is (readers may still be in it).
    fn split(&self) -> (Node<V>, Key, Node<V>) {
        match self {
            Node::Leaf(leaf) => {
                let order = leaf.order();
                let (l, r) = order.split_at(order.len() / 2);
                let copy = |slots: &[usize]| slots.iter().map(|&i| leaf.entry(i).clone()).collect::<Vec<_>>();
                let (left, right) = (copy(l), copy(r));
                let sep = right[0].0.clone();
                (
                    Node::Leaf(Leaf::new(leaf.cap(), left)),
                    sep,
                    Node::Leaf(Leaf::new(leaf.cap(), right)),
                )
            }
            Node::Inner { keys, kids } => {
                let mid = kids.len() / 2;
                let (lkids, rkids) = (kids[..mid].to_vec(), kids[mid..].to_vec());
                let (lkeys, rkeys) = (Seps::from(keys[..mid - 1].to_vec()), Seps::from(keys[mid..].to_vec()));
                (
                    Node::Inner {
                        keys: lkeys,
                        kids: lkids,
                    },
                    keys[mid - 1].clone(),
                    Node::Inner {
                        keys: rkeys,
                        kids: rkids,
                    },
                )
            }
        }
    }
}

/// Index of the child of an inner node whose range holds `key`: the
/// number of separators <= key. Those with a lower head are, those with a
/// higher one are not; where heads tie, the whole keys decide.
#[inline]
fn child(seps: &Seps, key: &Probe<'_>) -> usize {
    let mut i = seps.heads.iter().filter(|&&h| h < key.head).count();
    while i < seps.heads.len() && seps.heads[i] == key.head && seps.keys[i].cmp_probe(key).is_le() {
        i += 1;
    }
    i
}

/// The index's writer lock, held ([`Index::writer`]), and with it the
/// writer's own handle on the root.
pub struct Writer<'a, V> {
    index: &'a Index<V>,
    root: parking_lot::MutexGuard<'a, Arc<Node<V>>>,
}

impl<V: Clone + Send + Sync + 'static> Writer<'_, V> {
    /// Inserts a key the caller knows is absent (the engine inserts only
    /// keys its table reports as new): the leaf is not searched for it
    /// first. A key already present would be listed twice.
    pub fn insert_new(&mut self, key: &[u8], val: V) {
        let key = &Probe::new(key);
        debug_assert!(
            !self.index.contains(&self.root, key),
            "insert_new of a key the index holds"
        );
        let old = self.index.insert_locked(&mut self.root, key, val, true);
        debug_assert!(old.is_none());
    }
}

/// A concurrent ordered map from byte keys to `V`.
pub struct Index<V> {
    /// The root, as readers load it.
    root: ArcSwap<Node<V>>,
    /// The writer lock. It guards the writer's own handle on the root,
    /// always the same node as `root`'s: only the writer replaces the
    /// root, so while it holds this lock the root it holds here cannot go
    /// away, and it reads it without `root`'s load, which takes and gives
    /// back a reader's slot with a locked instruction each.
    writer: Mutex<Arc<Node<V>>>,
    /// Most children of an inner node.
    order: usize,
    /// Most entries of a leaf.
    leaf: usize,
    len: AtomicU64,
}

impl<V: Clone + Send + Sync + 'static> Index<V> {
    /// An empty index with nodes of at most `order` entries (at least 4).
    #[cfg(test)]
    pub fn new(order: usize) -> Index<V> {
        Index::with_leaves(order, order)
    }

    /// An empty index with inner nodes of at most `order` children and
    /// leaves of at most `leaf` entries (each at least 4).
    pub fn with_leaves(order: usize, leaf: usize) -> Index<V> {
        assert!(
            order >= 4 && leaf >= 4,
            "a B+-tree node needs room for at least 4 entries"
        );
        let root = Arc::new(Node::Leaf(Leaf::new(leaf, Vec::new())));
        Index {
            root: ArcSwap::new(root.clone()),
            writer: Mutex::new(root),
            order,
            leaf,
            len: AtomicU64::new(0),
        }
    }

    /// Changes the entry count by `d`. Only the writer calls this, under
    /// the writer lock, so a load and a release store do: no locked add
    /// (as a leaf's `len` when it appends).
    #[inline]
    fn count(&self, d: i64) {
        let n = self.len.load(Ordering::Relaxed);
        self.len.store(n.wrapping_add_signed(d), Ordering::Release);
    }

    /// Most entries `node` may hold.
    fn max(&self, node: &Node<V>) -> usize {
        match node {
            Node::Leaf(_) => self.leaf,
            Node::Inner { .. } => self.order,
        }
    }

    /// Fewest entries `node` may hold unless it is the root: a quarter of
    /// its capacity (an inner node at least two children). A removal that
    /// meets a node at its minimum copies both siblings it rebalances
    /// (copy-on-write, for the readers that may hold them; an inner node's
    /// copy touches every child's reference count), so a lower minimum
    /// makes those copies rarer: `bench micro --engine hash --op delete`
    /// ran about 15% faster at a quarter than at half (BENCHMARKS.md,
    /// thirteenth session). After many removals nodes may be a quarter
    /// full, so a range reads up to twice as many leaves and the tree may
    /// be a level deeper than at half.
    fn min(&self, node: &Node<V>) -> usize {
        match node {
            Node::Leaf(_) => (self.leaf / 4).max(1),
            Node::Inner { .. } => (self.order / 4).max(2),
        }
    }

    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(test)]
    pub fn get(&self, key: &[u8]) -> Option<V> {
        let key = &Probe::new(key);
        let root = self.root.load_full();
        let mut node: &Node<V> = &root;
        loop {
            match node {
                Node::Inner { keys, kids } => node = &kids[child(keys, key)],
                Node::Leaf(leaf) => return leaf.find(key).map(|i| leaf.entry(i).1.clone()),
            }
        }
    }

    /// Inserts or replaces; returns the previous value.
    #[cfg(test)]
    pub fn insert(&self, key: &[u8], val: V) -> Option<V> {
        self.insert_with(&Probe::new(key), val, false)
    }

    /// [`Writer::insert_new`] under its own hold of the writer lock.
    #[cfg(test)]
    pub fn insert_new(&self, key: &[u8], val: V) {
        self.writer().insert_new(key, val)
    }

    /// The writer lock, held: inserts and removals through the returned
    /// [`Writer`] wait for no one else. A caller that must order its index
    /// changes with its own changes elsewhere takes this under its own
    /// lock (the engine does, see `HashEngine::index_writer`).
    pub fn writer(&self) -> Writer<'_, V> {
        let root = self.writer.lock();
        debug_assert!(
            Arc::ptr_eq(&root, &self.root.load()),
            "the writer's root is the readers' root"
        );
        Writer { index: self, root }
    }

    #[cfg(test)]
    fn insert_with(&self, key: &Probe<'_>, val: V, new: bool) -> Option<V> {
        self.insert_locked(&mut self.writer.lock(), key, val, new)
    }

    /// Makes `new` the root: readers load it from `root`, and the writer's
    /// handle `held` (under the writer lock) names it too.
    fn publish(&self, held: &mut Arc<Node<V>>, new: Node<V>) {
        let new = Arc::new(new);
        self.root.store(new.clone());
        *held = new;
    }

    /// [`Index::insert_with`] under the writer lock, which the caller
    /// holds, with `held` its handle on the root.
    fn insert_locked(&self, held: &mut Arc<Node<V>>, key: &Probe<'_>, val: V, new: bool) -> Option<V> {
        // The common case: a new key whose path needs no split goes into
        // its leaf in place; nothing is copied or published.
        if let Some(leaf) = self.room_for(held, key, new) {
            leaf.append(key.key(), val);
            self.count(1);
            return None;
        }
        let mut root = if held.size() >= self.max(held) {
            let (left, sep, right) = held.split();
            Node::Inner {
                keys: Seps::from(vec![sep]),
                kids: vec![Arc::new(left), Arc::new(right)],
            }
        } else {
            (**held).clone()
        };
        let old = self.insert_in(&mut root, key, val, new);
        self.publish(held, root);
        if old.is_none() {
            self.count(1);
        }
        old
    }

    /// The leaf that takes `key` in place: `key` is not in it (`new`: the
    /// caller knows it is not) and no node on its path is full (so
    /// proactive splitting has nothing to do).
    fn room_for<'a>(&self, root: &'a Node<V>, key: &Probe<'_>, new: bool) -> Option<&'a Leaf<V>> {
        if root.size() >= self.max(root) {
            return None;
        }
        let mut node = root;
        loop {
            match node {
                Node::Inner { keys, kids } => {
                    node = &kids[child(keys, key)];
                    // A leaf at its most live entries is full; a full leaf
                    // (live or dead entries) is checked below, without
                    // counting its dead bits here.
                    if matches!(node, Node::Inner { kids, .. } if kids.len() >= self.order) {
                        return None;
                    }
                }
                Node::Leaf(leaf) => return (!leaf.full() && (new || leaf.find(key).is_none())).then_some(leaf),
            }
        }
    }

    /// `node` (the writer's own copy) has room for one more entry; `new`:
    /// the caller knows `key` is absent.
    fn insert_in(&self, mut node: &mut Node<V>, key: &Probe<'_>, val: V, new: bool) -> Option<V> {
        loop {
            match node {
                Node::Leaf(leaf) => {
                    let found = if new { None } else { leaf.find(key) };
                    let Some(i) = found else {
                        leaf.append(key.key(), val);
                        return None;
                    };
                    let old = leaf.entry(i).0.clone();
                    let mut e = leaf.take();
                    let at = e
                        .binary_search_by(|(k, _)| k.cmp(&old))
                        .expect("a found key is among the entries");
                    let prev = std::mem::replace(&mut e[at].1, val);
                    leaf.put(e);
                    return Some(prev);
                }
                Node::Inner { keys, kids } => {
                    let mut i = child(keys, key);
                    if kids[i].size() >= self.max(&kids[i]) {
                        let (left, sep, right) = kids[i].split();
                        let go_right = sep.cmp_probe(key).is_le();
                        kids[i] = Arc::new(left);
                        keys.insert(i, sep);
                        kids.insert(i + 1, Arc::new(right));
                        i += go_right as usize;
                    }
                    // A leaf with room that lacks the key takes it in
                    // place, uncopied (its key range is unchanged).
                    // (A leaf whose slots are used up by dead entries is
                    // copied instead, which drops them.)
                    if let Node::Leaf(leaf) = &*kids[i] {
                        if !leaf.full() && (new || leaf.find(key).is_none()) {
                            leaf.append(key.key(), val);
                            return None;
                        }
                    }
                    node = Arc::make_mut(&mut kids[i]);
                }
            }
        }
    }

    /// Whether `key` is in the tree now (the writer's check before copying).
    fn contains(&self, root: &Node<V>, key: &Probe<'_>) -> bool {
        let mut node = root;
        loop {
            match node {
                Node::Inner { keys, kids } => node = &kids[child(keys, key)],
                Node::Leaf(leaf) => return leaf.find(key).is_some(),
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&self, key: &[u8]) -> Option<V> {
        self.remove_locked(&mut self.writer.lock(), key)
    }

    /// [`Index::remove`] under the writer lock, which the caller holds,
    /// with `held` its handle on the root.
    fn remove_locked(&self, held: &mut Arc<Node<V>>, key: &[u8]) -> Option<V> {
        let key = &Probe::new(key);
        let cur: &Node<V> = held;
        // Every node below the root on the path above its minimum: nothing
        // to rebalance, so the entry is marked dead in place (or is absent);
        // nothing is copied or published.
        if let Some(leaf) = self.above_minimum(cur, key) {
            let i = leaf.find(key)?;
            let old = leaf.entry(i).1.clone();
            leaf.kill(i);
            self.count(-1);
            return Some(old);
        }
        // Absent: nothing is copied or published.
        if !self.contains(cur, key) {
            return None;
        }
        let mut root = (*cur).clone();
        let old = self.remove_in(&mut root, key)?;
        // A root left with one child gives way to it.
        while let Node::Inner { kids, .. } = &root {
            if kids.len() > 1 {
                break;
            }
            root = (*kids[0]).clone();
        }
        self.publish(held, root);
        self.count(-1);
        Some(old)
    }

    /// The leaf `key` routes to, if every node below the root on its path
    /// is above its minimum (a removal then changes no node's shape).
    fn above_minimum<'a>(&self, root: &'a Node<V>, key: &Probe<'_>) -> Option<&'a Leaf<V>> {
        let mut node = root;
        loop {
            match node {
                Node::Inner { keys, kids } => {
                    node = &kids[child(keys, key)];
                    if node.size() <= self.min(node) {
                        return None;
                    }
                }
                Node::Leaf(leaf) => return Some(leaf),
            }
        }
    }

    fn remove_in(&self, mut node: &mut Node<V>, key: &Probe<'_>) -> Option<V> {
        loop {
            match node {
                Node::Leaf(leaf) => {
                    leaf.find(key)?;
                    let mut e = leaf.take();
                    let i = e
                        .binary_search_by(|(k, _)| k.cmp_probe(key))
                        .expect("a found key is among the entries");
                    let (_, old) = e.remove(i);
                    leaf.put(e);
                    return Some(old);
                }
                Node::Inner { keys, kids } => {
                    let mut i = child(keys, key);
                    if kids[i].size() <= self.min(&kids[i]) {
                        i = self.refill(keys, kids, i);
                    }
                    node = Arc::make_mut(&mut kids[i]);
                }
            }
        }
    }

    /// Gives child `i` (at the minimum) an entry to spare: borrows one from
    /// a sibling above the minimum, else merges it with a sibling. Returns
    /// the index of the child now holding `i`'s range.
    fn refill(&self, keys: &mut Seps, kids: &mut Vec<Arc<Node<V>>>, i: usize) -> usize {
        // A borrow evens the two siblings out (half the difference moves),
        // so the next removals from child `i` find it above the minimum
        // and mark in place, instead of borrowing one entry each time.
        let min = self.min(&kids[i]);
        if i > 0 && kids[i - 1].size() > min {
            let k = (kids[i - 1].size() - kids[i].size()).div_ceil(2);
            let (l, r) = kids.split_at_mut(i);
            let (left, me) = (Arc::make_mut(&mut l[i - 1]), Arc::make_mut(&mut r[0]));
            match (left, me) {
                (Node::Leaf(left), Node::Leaf(me)) => {
                    let (mut lk, mk) = (left.take(), me.take());
                    let mut moved = lk.split_off(lk.len() - k);
                    moved.extend(mk);
                    keys.set(i - 1, moved[0].0.clone());
                    left.put(lk);
                    me.put(moved);
                }
                (Node::Inner { keys: lk, kids: lc }, Node::Inner { keys: mk, kids: mc }) => {
                    // The last k children move over; the separator comes
                    // down in front of the keys that move with them, and
                    // the key before them goes up.
                    let mut moved_kids = lc.split_off(lc.len() - k);
                    let mut moved_keys = lk.split_off(lk.len() - (k - 1));
                    let up = lk.pop().expect("above minimum");
                    moved_keys.push(keys.set(i - 1, up));
                    moved_keys.append(mk);
                    moved_kids.append(mc);
                    *mk = moved_keys;
                    *mc = moved_kids;
                }
                _ => unreachable!("siblings are at the same height"),
            }
            return i;
        }
        if i + 1 < kids.len() && kids[i + 1].size() > min {
            let k = (kids[i + 1].size() - kids[i].size()).div_ceil(2);
            let (l, r) = kids.split_at_mut(i + 1);
            let (me, right) = (Arc::make_mut(&mut l[i]), Arc::make_mut(&mut r[0]));
            match (me, right) {
                (Node::Leaf(me), Node::Leaf(right)) => {
                    let (mut mk, mut rk) = (me.take(), right.take());
                    mk.extend(rk.drain(..k));
                    keys.set(i, rk[0].0.clone());
                    me.put(mk);
                    right.put(rk);
                }
                (Node::Inner { keys: mk, kids: mc }, Node::Inner { keys: rk, kids: rc }) => {
                    mc.extend(rc.drain(..k));
                    let up = rk[k - 1].clone();
                    mk.push(keys.set(i, up));
                    mk.append(&mut rk.take_front(k - 1));
                    rk.remove(0);
                }
                _ => unreachable!("siblings are at the same height"),
            }
            return i;
        }
        // Both neighbours at the minimum: merge with one (the result has at
        // most 2 * min <= max entries).
        let j = if i > 0 { i - 1 } else { i };
        let right = kids.remove(j + 1);
        let sep = keys.remove(j);
        let right = Arc::try_unwrap(right).unwrap_or_else(|shared| (*shared).clone());
        match (Arc::make_mut(&mut kids[j]), right) {
            (Node::Leaf(left), Node::Leaf(mut right)) => {
                let mut lk = left.take();
                lk.extend(right.take());
                left.put(lk);
            }
            (Node::Inner { keys: lk, kids: lc }, Node::Inner { keys: mut rk, kids: rc }) => {
                lk.push(sep);
                lk.append(&mut rk);
                lc.extend(rc);
            }
            _ => unreachable!("siblings are at the same height"),
        }
        j
    }

    /// Entries with keys in `(lo, hi)`, ascending (see the module docs for
    /// what a range sees of concurrent writes).
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Iter<V> {
        Iter::new(self.root.load_full(), lo, hi, false)
    }

    /// Entries with keys in `(lo, hi)`, descending.
    pub fn range_rev(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Iter<V> {
        Iter::new(self.root.load_full(), lo, hi, true)
    }

    #[cfg(test)]
    /// Entries whose key starts with `prefix`, ascending.
    pub fn prefix(&self, prefix: &[u8]) -> Iter<V> {
        let end = prefix_end(prefix);
        let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.range(Bound::Included(prefix), hi)
    }

    /// Builds the index from every key of `table` (at open): sorted, then
    /// loaded bottom-up ([`Index::from_sorted`]).
    pub fn rebuild<S: Space>(
        table: &HashTable<S>,
        order: usize,
        leaf: usize,
        mut val: impl FnMut(&[u8], &[u8]) -> V,
    ) -> Index<V> {
        let mut entries = Vec::new();
        table.for_each(|k, v| entries.push((k.to_vec(), val(k, v))));
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Index::from_sorted(order, leaf, entries)
    }

    /// Builds the index bottom-up from entries in strictly ascending key
    /// order (a rebuild's sorted keys, or a saved image): leaves filled to
    /// three quarters, then each level of inner nodes over the one below.
    /// Every node but the root holds between `order / 2` and `order`
    /// entries, as inserts and removes keep them.
    pub fn from_sorted(order: usize, leaf: usize, entries: impl IntoIterator<Item = (Vec<u8>, V)>) -> Index<V> {
        let mut index = Index::with_leaves(order, leaf);
        let entries: Vec<(Key, V)> = entries.into_iter().map(|(k, v)| (Key::new(&k), v)).collect();
        debug_assert!(
            entries.windows(2).all(|w| w[0].0 < w[1].0),
            "from_sorted needs ascending keys"
        );
        let n = entries.len();
        if n == 0 {
            return index;
        }
        // Sizes of `k` nodes of at most `max` over `n` entries: as even as
        // can be, each between `max / 2` and `max` when there is more than
        // one node.
        let split = |n: usize, max: usize| -> Vec<usize> {
            let (min, fill) = (max / 2, (max * 3 / 4).max(max / 2));
            let k = n.div_ceil(fill).min((n / min).max(1));
            (0..k).map(|i| n / k + usize::from(i < n % k)).collect()
        };
        // Each level: the nodes and the smallest key under each.
        let mut level: Vec<(Key, Arc<Node<V>>)> = Vec::new();
        let mut entries = entries.into_iter();
        for size in split(n, leaf) {
            let le: Vec<(Key, V)> = entries.by_ref().take(size).collect();
            let first = le[0].0.clone();
            level.push((first, Arc::new(Node::Leaf(Leaf::new(leaf, le)))));
        }
        while level.len() > 1 {
            let mut up = Vec::new();
            let mut nodes = level.into_iter();
            for size in split(nodes.len(), order) {
                let group: Vec<(Key, Arc<Node<V>>)> = nodes.by_ref().take(size).collect();
                let first = group[0].0.clone();
                let mut seps = Vec::with_capacity(size - 1);
                let mut kids = Vec::with_capacity(size);
                for (i, (k, kid)) in group.into_iter().enumerate() {
                    if i > 0 {
                        seps.push(k);
                    }
                    kids.push(kid);
                }
                up.push((
                    first,
                    Arc::new(Node::Inner {
                        keys: Seps::from(seps),
                        kids,
                    }),
                ));
            }
            level = up;
        }
        let (_, root) = level.pop().expect("one root");
        index.root.store(root.clone());
        *index.writer.get_mut() = root;
        index.len.store(n as u64, Ordering::Release);
        index
    }

    /// Checks the tree's invariants: sorted keys within their separators,
    /// node sizes within bounds, every leaf at the same depth.
    pub fn check(&self) -> Result<(), String> {
        let root = self.root.load_full();
        let mut leaf_depth = None;
        let n = self.check_node(&root, None, None, 0, true, &mut leaf_depth)?;
        if n as u64 != self.len() {
            return Err(format!("{n} entries but len {}", self.len()));
        }
        Ok(())
    }

    fn check_node(
        &self,
        node: &Node<V>,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        depth: usize,
        is_root: bool,
        leaf_depth: &mut Option<usize>,
    ) -> Result<usize, String> {
        let size = node.size();
        if size > self.max(node) || (!is_root && size < self.min(node)) {
            return Err(format!(
                "node of {size} entries at depth {depth} (at most {})",
                self.max(node)
            ));
        }
        let keys: Vec<Key> = match node {
            Node::Leaf(leaf) => {
                if leaf.cap() != self.leaf || leaf.sorted > leaf.len() {
                    return Err(format!("leaf of {} slots at depth {depth}", leaf.cap()));
                }
                if !heads_in_step(leaf.base.iter().map(|e| &e.0), &leaf.base_heads) {
                    return Err(format!("leaf heads out of step with their keys at depth {depth}"));
                }
                leaf.entries().into_iter().map(|(k, _)| k).collect()
            }
            Node::Inner { keys, .. } => {
                if !keys.in_step() {
                    return Err(format!("separator heads out of step with their keys at depth {depth}"));
                }
                keys.to_vec()
            }
        };
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("unsorted or repeated keys at depth {depth}"));
        }
        let outside = |k: &[u8]| lo.is_some_and(|lo| k < lo) || hi.is_some_and(|hi| k >= hi);
        if keys.iter().any(|k| outside(k)) {
            return Err(format!("key outside its separators at depth {depth}"));
        }
        match node {
            Node::Leaf(_) => {
                if *leaf_depth.get_or_insert(depth) != depth {
                    return Err("leaves at different depths".into());
                }
                Ok(size)
            }
            Node::Inner { keys, kids } => {
                if kids.len() != keys.len() + 1 || (is_root && kids.len() < 2) {
                    return Err(format!(
                        "inner node with {} keys and {} children",
                        keys.len(),
                        kids.len()
                    ));
                }
                let mut n = 0;
                for (i, kid) in kids.iter().enumerate() {
                    let klo = if i == 0 { lo } else { Some(&keys[i - 1][..]) };
                    let khi = if i == keys.len() { hi } else { Some(&keys[i][..]) };
                    n += self.check_node(kid, klo, khi, depth + 1, false, leaf_depth)?;
                }
                Ok(n)
            }
        }
    }
}

#[cfg(test)]
/// The least key greater than every key starting with `p` (None: no bound).
fn prefix_end(p: &[u8]) -> Option<Vec<u8>> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The leaf an iterator is in: its entries' slots in key order as they
/// were when the iterator entered it, and the position in that order: of
/// the next entry to yield (ascending) or the count still to yield
/// (descending).
struct LeafCursor<V> {
    node: Arc<Node<V>>,
    order: Vec<usize>,
    pos: usize,
}

/// An iterator over the index (see the module docs for what it sees).
///
/// The stack holds the inner nodes on the path to the next entry, each
/// with the position of its next child to enter (ascending) or the count
/// of children still to enter (descending).
pub struct Iter<V> {
    stack: Vec<(Arc<Node<V>>, usize)>,
    leaf: Option<LeafCursor<V>>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    rev: bool,
}

impl<V: Clone> Iter<V> {
    fn new(root: Arc<Node<V>>, lo: Bound<&[u8]>, hi: Bound<&[u8]>, rev: bool) -> Iter<V> {
        let mut it = Iter {
            stack: Vec::new(),
            leaf: None,
            lo: lo.map(<[u8]>::to_vec),
            hi: hi.map(<[u8]>::to_vec),
            rev,
        };
        // Descend once to the first entry in iteration order.
        let mut node = root;
        loop {
            let start = if rev { &it.hi } else { &it.lo };
            let (kid, idx) = match &*node {
                Node::Inner { keys, kids } => {
                    let i = match (start, rev) {
                        (Bound::Unbounded, false) => 0,
                        (Bound::Unbounded, true) => kids.len() - 1,
                        (Bound::Included(k) | Bound::Excluded(k), false) => child(keys, &Probe::new(k)),
                        (Bound::Included(k), true) => child(keys, &Probe::new(k)),
                        (Bound::Excluded(k), true) => keys.partition_point(|s| s[..] < k[..]),
                    };
                    (kids[i].clone(), if rev { i } else { i + 1 })
                }
                Node::Leaf(leaf) => {
                    let order = leaf.order();
                    let key = |i: &usize| &leaf.entry(*i).0[..];
                    let pos = match start {
                        Bound::Unbounded => {
                            if rev {
                                order.len()
                            } else {
                                0
                            }
                        }
                        Bound::Included(k) => {
                            order.partition_point(|i| if rev { key(i) <= &k[..] } else { key(i) < &k[..] })
                        }
                        Bound::Excluded(k) => {
                            order.partition_point(|i| if rev { key(i) < &k[..] } else { key(i) <= &k[..] })
                        }
                    };
                    it.leaf = Some(LeafCursor {
                        node: node.clone(),
                        order,
                        pos,
                    });
                    return it;
                }
            };
            it.stack.push((node, idx));
            node = kid;
        }
    }

    /// Enters `node` at its first child or entry in iteration order.
    fn enter(&mut self, node: Arc<Node<V>>) {
        match &*node {
            Node::Leaf(leaf) => {
                let order = leaf.order();
                let pos = if self.rev { order.len() } else { 0 };
                self.leaf = Some(LeafCursor { node, order, pos });
            }
            Node::Inner { kids, .. } => {
                let start = if self.rev { kids.len() } else { 0 };
                self.stack.push((node, start));
            }
        }
    }

    fn within_end(&self, k: &[u8]) -> bool {
        if self.rev {
            match &self.lo {
                Bound::Unbounded => true,
                Bound::Included(lo) => k >= lo.as_slice(),
                Bound::Excluded(lo) => k > lo.as_slice(),
            }
        } else {
            match &self.hi {
                Bound::Unbounded => true,
                Bound::Included(hi) => k <= hi.as_slice(),
                Bound::Excluded(hi) => k < hi.as_slice(),
            }
        }
    }
}

impl<V: Clone> Iterator for Iter<V> {
    type Item = (Vec<u8>, V);

    fn next(&mut self) -> Option<(Vec<u8>, V)> {
        loop {
            if let Some(c) = &mut self.leaf {
                let Node::Leaf(leaf) = &*c.node else {
                    unreachable!("a leaf cursor is on a leaf")
                };
                let i = if self.rev {
                    c.pos.checked_sub(1)
                } else {
                    Some(c.pos).filter(|&i| i < c.order.len())
                };
                if let Some(i) = i {
                    c.pos = if self.rev { i } else { i + 1 };
                    let (k, v) = leaf.entry(c.order[i]);
                    let item = (k.to_vec(), v.clone());
                    if !self.within_end(&item.0) {
                        self.stack.clear();
                        self.leaf = None;
                        return None;
                    }
                    return Some(item);
                }
                self.leaf = None;
            }
            let (node, idx) = self.stack.last_mut()?;
            let Node::Inner { kids, .. } = &**node else {
                unreachable!("the stack holds inner nodes")
            };
            let i = if self.rev {
                idx.checked_sub(1)
            } else {
                Some(*idx).filter(|&i| i < kids.len())
            };
            match i {
                Some(i) => {
                    *idx = if self.rev { i } else { i + 1 };
                    let kid = kids[i].clone();
                    self.enter(kid);
                }
                None => {
                    self.stack.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
