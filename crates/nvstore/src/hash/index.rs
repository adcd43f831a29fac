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
//!   queries are not delayed"): writers copy the nodes on their path
//!   (copy-on-write) and publish a new root with one atomic pointer swap
//!   (`arc-swap`); a reader loads the root once and works on that
//!   immutable snapshot. Nodes are reference counted, so a node is freed
//!   when the last snapshot holding it is dropped (no epochs, no raw pointers).
//!   Writers are serialised by one mutex; only they wait for each other.
//! - A range query descends once to its first key and then walks the
//!   leaves in order with a stack of the path (KVS B+Tree index §2 chains
//!   leaves for this; copy-on-write nodes cannot hold sibling links, and
//!   the stack visits each node once all the same).

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::table::HashTable;
use crate::pmem::Space;

/// Default branching factor (most entries or children per node). Small,
/// because every insert copies the nodes on its path (copy-on-write): a
/// copy costs a pointer per entry, so 16 entries over a taller path copy
/// about a third of what 64 entries over a shorter one do, while a range
/// still reads whole nodes.
pub const ORDER: usize = 16;

/// A key as nodes hold it: shared, so copying a node on a writer's path
/// (copy-on-write) copies pointers, not key bytes.
type Key = Arc<[u8]>;

#[derive(Clone, Debug)]
enum Node<V> {
    /// Sorted keys and their values.
    Leaf { keys: Vec<Key>, vals: Vec<V> },
    /// `kids[i]` holds the keys `k` with `keys[i-1] <= k < keys[i]`.
    Inner { keys: Vec<Key>, kids: Vec<Arc<Node<V>>> },
}

impl<V: Clone> Node<V> {
    fn size(&self) -> usize {
        match self {
            Node::Leaf { keys, .. } => keys.len(),
            Node::Inner { kids, .. } => kids.len(),
        }
    }

    /// Splits a full node in two halves and returns the separator.
    fn split(&mut self) -> (Key, Node<V>) {
        match self {
            Node::Leaf { keys, vals } => {
                let mid = keys.len() / 2;
                let rk = keys.split_off(mid);
                let rv = vals.split_off(mid);
                (rk[0].clone(), Node::Leaf { keys: rk, vals: rv })
            }
            Node::Inner { keys, kids } => {
                let mid = kids.len() / 2;
                let rkids = kids.split_off(mid);
                let rkeys = keys.split_off(mid);
                let sep = keys.pop().expect("an inner node has a separator per extra child");
                (
                    sep,
                    Node::Inner {
                        keys: rkeys,
                        kids: rkids,
                    },
                )
            }
        }
    }
}

/// Index of the child of an inner node whose range holds `key`.
fn child(keys: &[Key], key: &[u8]) -> usize {
    keys.partition_point(|s| &s[..] <= key)
}

/// A concurrent ordered map from byte keys to `V`.
pub struct Index<V> {
    root: ArcSwap<Node<V>>,
    writer: Mutex<()>,
    order: usize,
    len: AtomicU64,
}

impl<V: Clone + Send + Sync + 'static> Index<V> {
    /// An empty index with nodes of at most `order` entries (at least 4).
    pub fn new(order: usize) -> Index<V> {
        assert!(order >= 4, "a B+-tree node needs room for at least 4 entries");
        Index {
            root: ArcSwap::from_pointee(Node::Leaf {
                keys: Vec::new(),
                vals: Vec::new(),
            }),
            writer: Mutex::new(()),
            order,
            len: AtomicU64::new(0),
        }
    }

    fn min(&self) -> usize {
        self.order / 2
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
        let root = self.root.load_full();
        let mut node: &Node<V> = &root;
        loop {
            match node {
                Node::Inner { keys, kids } => node = &kids[child(keys, key)],
                Node::Leaf { keys, vals } => {
                    return keys.binary_search_by(|k| k[..].cmp(key)).ok().map(|i| vals[i].clone());
                }
            }
        }
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(&self, key: &[u8], val: V) -> Option<V> {
        let _w = self.writer.lock();
        let mut root = (*self.root.load_full()).clone();
        if root.size() >= self.order {
            let (sep, right) = root.split();
            root = Node::Inner {
                keys: vec![sep],
                kids: vec![Arc::new(root), Arc::new(right)],
            };
        }
        let old = self.insert_in(&mut root, key, val);
        self.root.store(Arc::new(root));
        if old.is_none() {
            self.len.fetch_add(1, Ordering::AcqRel);
        }
        old
    }

    /// `node` has room for one more entry.
    fn insert_in(&self, mut node: &mut Node<V>, key: &[u8], val: V) -> Option<V> {
        loop {
            match node {
                Node::Leaf { keys, vals } => {
                    return match keys.binary_search_by(|k| k[..].cmp(key)) {
                        Ok(i) => Some(std::mem::replace(&mut vals[i], val)),
                        Err(i) => {
                            keys.insert(i, Key::from(key));
                            vals.insert(i, val);
                            None
                        }
                    };
                }
                Node::Inner { keys, kids } => {
                    let mut i = child(keys, key);
                    if kids[i].size() >= self.order {
                        let kid = Arc::make_mut(&mut kids[i]);
                        let (sep, right) = kid.split();
                        let go_right = key >= &sep[..];
                        keys.insert(i, sep);
                        kids.insert(i + 1, Arc::new(right));
                        i += go_right as usize;
                    }
                    node = Arc::make_mut(&mut kids[i]);
                }
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&self, key: &[u8]) -> Option<V> {
        let _w = self.writer.lock();
        let mut root = (*self.root.load_full()).clone();
        // Absent: nothing is published (the copy with its rebalancing is dropped).
        let old = self.remove_in(&mut root, key)?;
        // A root left with one child gives way to it.
        while let Node::Inner { kids, .. } = &root {
            if kids.len() > 1 {
                break;
            }
            root = (*kids[0]).clone();
        }
        self.root.store(Arc::new(root));
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some(old)
    }

    fn remove_in(&self, mut node: &mut Node<V>, key: &[u8]) -> Option<V> {
        loop {
            match node {
                Node::Leaf { keys, vals } => {
                    let i = keys.binary_search_by(|k| k[..].cmp(key)).ok()?;
                    keys.remove(i);
                    return Some(vals.remove(i));
                }
                Node::Inner { keys, kids } => {
                    let mut i = child(keys, key);
                    if kids[i].size() <= self.min() {
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
    fn refill(&self, keys: &mut Vec<Key>, kids: &mut Vec<Arc<Node<V>>>, i: usize) -> usize {
        let min = self.min();
        if i > 0 && kids[i - 1].size() > min {
            let (l, r) = kids.split_at_mut(i);
            let (left, me) = (Arc::make_mut(&mut l[i - 1]), Arc::make_mut(&mut r[0]));
            match (left, me) {
                (Node::Leaf { keys: lk, vals: lv }, Node::Leaf { keys: mk, vals: mv }) => {
                    mk.insert(0, lk.pop().expect("above minimum"));
                    mv.insert(0, lv.pop().expect("above minimum"));
                    keys[i - 1] = mk[0].clone();
                }
                (Node::Inner { keys: lk, kids: lc }, Node::Inner { keys: mk, kids: mc }) => {
                    mc.insert(0, lc.pop().expect("above minimum"));
                    let sep = lk.pop().expect("above minimum");
                    mk.insert(0, std::mem::replace(&mut keys[i - 1], sep));
                }
                _ => unreachable!("siblings are at the same height"),
            }
            return i;
        }
        if i + 1 < kids.len() && kids[i + 1].size() > min {
            let (l, r) = kids.split_at_mut(i + 1);
            let (me, right) = (Arc::make_mut(&mut l[i]), Arc::make_mut(&mut r[0]));
            match (me, right) {
                (Node::Leaf { keys: mk, vals: mv }, Node::Leaf { keys: rk, vals: rv }) => {
                    mk.push(rk.remove(0));
                    mv.push(rv.remove(0));
                    keys[i] = rk[0].clone();
                }
                (Node::Inner { keys: mk, kids: mc }, Node::Inner { keys: rk, kids: rc }) => {
                    mc.push(rc.remove(0));
                    let sep = rk.remove(0);
                    mk.push(std::mem::replace(&mut keys[i], sep));
                }
                _ => unreachable!("siblings are at the same height"),
            }
            return i;
        }
        // Both neighbours at the minimum: merge with one (the result has at
        // most 2 * min <= order entries).
        let j = if i > 0 { i - 1 } else { i };
        let right = kids.remove(j + 1);
        let sep = keys.remove(j);
        let right = Arc::try_unwrap(right).unwrap_or_else(|shared| (*shared).clone());
        match (Arc::make_mut(&mut kids[j]), right) {
            (Node::Leaf { keys: lk, vals: lv }, Node::Leaf { keys: rk, vals: rv }) => {
                lk.extend(rk);
                lv.extend(rv);
            }
            (Node::Inner { keys: lk, kids: lc }, Node::Inner { keys: rk, kids: rc }) => {
                lk.push(sep);
                lk.extend(rk);
                lc.extend(rc);
            }
            _ => unreachable!("siblings are at the same height"),
        }
        j
    }

    /// Entries with keys in `(lo, hi)`, ascending, from one snapshot.
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Iter<V> {
        Iter::new(self.root.load_full(), lo, hi, false)
    }

    /// Entries with keys in `(lo, hi)`, descending, from one snapshot.
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
    pub fn rebuild<S: Space>(table: &HashTable<S>, order: usize, mut val: impl FnMut(&[u8], &[u8]) -> V) -> Index<V> {
        let mut entries = Vec::new();
        table.for_each(|k, v| entries.push((k.to_vec(), val(k, v))));
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Index::from_sorted(order, entries)
    }

    /// Builds the index bottom-up from entries in strictly ascending key
    /// order (a rebuild's sorted keys, or a saved image): leaves filled to
    /// three quarters, then each level of inner nodes over the one below.
    /// Every node but the root holds between `order / 2` and `order`
    /// entries, as inserts and removes keep them.
    pub fn from_sorted(order: usize, entries: impl IntoIterator<Item = (Vec<u8>, V)>) -> Index<V> {
        let index = Index::new(order);
        let (keys, vals): (Vec<Key>, Vec<V>) = entries.into_iter().map(|(k, v)| (Key::from(k), v)).unzip();
        debug_assert!(keys.windows(2).all(|w| w[0] < w[1]), "from_sorted needs ascending keys");
        let n = keys.len();
        if n == 0 {
            return index;
        }
        let (min, fill) = (index.min(), (order * 3 / 4).max(index.min()));
        // Sizes of `k` nodes over `n` entries: as even as can be, each
        // between `min` and `order` when there is more than one node.
        let split = |n: usize| -> Vec<usize> {
            let k = n.div_ceil(fill).min((n / min).max(1));
            (0..k).map(|i| n / k + usize::from(i < n % k)).collect()
        };
        // Each level: the nodes and the smallest key under each.
        let mut level: Vec<(Key, Arc<Node<V>>)> = Vec::new();
        let (mut keys, mut vals) = (keys.into_iter(), vals.into_iter());
        for size in split(n) {
            let lk: Vec<Key> = keys.by_ref().take(size).collect();
            let lv: Vec<V> = vals.by_ref().take(size).collect();
            level.push((lk[0].clone(), Arc::new(Node::Leaf { keys: lk, vals: lv })));
        }
        while level.len() > 1 {
            let mut up = Vec::new();
            let mut nodes = level.into_iter();
            for size in split(nodes.len()) {
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
                up.push((first, Arc::new(Node::Inner { keys: seps, kids })));
            }
            level = up;
        }
        let (_, root) = level.pop().expect("one root");
        index.root.store(root);
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
        if size > self.order || (!is_root && size < self.min()) {
            return Err(format!(
                "node of {size} entries at depth {depth} (order {})",
                self.order
            ));
        }
        let keys = match node {
            Node::Leaf { keys, .. } | Node::Inner { keys, .. } => keys,
        };
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("unsorted keys at depth {depth}"));
        }
        let outside = |k: &[u8]| lo.is_some_and(|lo| k < lo) || hi.is_some_and(|hi| k >= hi);
        if keys.iter().any(|k| outside(k)) {
            return Err(format!("key outside its separators at depth {depth}"));
        }
        match node {
            Node::Leaf { .. } => {
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

/// An iterator over one snapshot of the index.
///
/// The stack holds the path to the next entry: for a leaf, the position of
/// the next entry to yield (ascending) or the count of entries still to
/// yield (descending); for an inner node, likewise for its children.
pub struct Iter<V> {
    stack: Vec<(Arc<Node<V>>, usize)>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    rev: bool,
}

impl<V: Clone> Iter<V> {
    fn new(root: Arc<Node<V>>, lo: Bound<&[u8]>, hi: Bound<&[u8]>, rev: bool) -> Iter<V> {
        let mut it = Iter {
            stack: Vec::new(),
            lo: lo.map(<[u8]>::to_vec),
            hi: hi.map(<[u8]>::to_vec),
            rev,
        };
        // Descend once to the first entry in iteration order.
        let mut node = root;
        loop {
            let start = if rev { &it.hi } else { &it.lo };
            let next = match &*node {
                Node::Inner { keys, kids } => {
                    let i = match (start, rev) {
                        (Bound::Unbounded, false) => 0,
                        (Bound::Unbounded, true) => kids.len() - 1,
                        (Bound::Included(k) | Bound::Excluded(k), false) => child(keys, k),
                        (Bound::Included(k), true) => child(keys, k),
                        (Bound::Excluded(k), true) => keys.partition_point(|s| s[..] < k[..]),
                    };
                    Some((kids[i].clone(), if rev { i } else { i + 1 }))
                }
                Node::Leaf { keys, .. } => {
                    let pos = match start {
                        Bound::Unbounded => {
                            if rev {
                                keys.len()
                            } else {
                                0
                            }
                        }
                        Bound::Included(k) => {
                            keys.partition_point(|x| if rev { x[..] <= k[..] } else { x[..] < k[..] })
                        }
                        Bound::Excluded(k) => {
                            keys.partition_point(|x| if rev { x[..] < k[..] } else { x[..] <= k[..] })
                        }
                    };
                    it.stack.push((node.clone(), pos));
                    None
                }
            };
            match next {
                Some((kid, idx)) => {
                    it.stack.push((node, idx));
                    node = kid;
                }
                None => return it,
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
            let (node, idx) = self.stack.last_mut()?;
            let step = match &**node {
                Node::Leaf { keys, vals } => {
                    let i = if self.rev {
                        idx.checked_sub(1)
                    } else {
                        Some(*idx).filter(|&i| i < keys.len())
                    };
                    match i {
                        Some(i) => {
                            *idx = if self.rev { i } else { i + 1 };
                            let item = (keys[i].to_vec(), vals[i].clone());
                            if !self.within_end(&item.0) {
                                self.stack.clear();
                                return None;
                            }
                            return Some(item);
                        }
                        None => None,
                    }
                }
                Node::Inner { kids, .. } => {
                    let i = if self.rev {
                        idx.checked_sub(1)
                    } else {
                        Some(*idx).filter(|&i| i < kids.len())
                    };
                    i.map(|i| {
                        *idx = if self.rev { i } else { i + 1 };
                        let kid = kids[i].clone();
                        let start = if self.rev { kid.size() } else { 0 };
                        (kid, start)
                    })
                }
            };
            match step {
                Some(entry) => self.stack.push(entry),
                None => {
                    self.stack.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
