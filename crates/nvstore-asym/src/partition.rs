//! Partitioning (AsymNVM §8.3 "Data Structure Partition", evaluated in §9.5,
//! Fig. 10): one data structure spread over several back-ends.
//!
//! A partition is one back-end pool, so it has its own writer lock and its
//! own log pair (operation-log ring and memory-log area): writers of
//! different partitions never wait for each other, and a writer that dies
//! is recovered from its own partition's logs alone. A key belongs to one
//! partition, chosen by a [`PartitionMap`]: key hashing for the hash table
//! and the queue, key ranges for the ordered structures (trees, skiplist),
//! so that a scan of the partitions in order is a scan in key order.
//!
//! [`Partitioned`] is a front-end over the partitions: it routes each
//! operation to the partition of its key. It may hold the writer lock of
//! every partition ([`Partitioned::open_writers`]), of one only
//! ([`Partitioned::open_writer_of`]: many front-ends, one writer per
//! partition), or read all of them without a lock
//! ([`Partitioned::open_readers`]).
//!
//! Each partition records its place in the map in its own naming space, as
//! a 48-byte object named `<structure>/part`: `{magic, kind, count, index,
//! first key, last key}` (AsymNVM §5.1 keeps "the mapping table between key
//! range and partition" in the naming space). A front-end checks it at
//! open, so back-ends listed in another order, or with another map, are
//! refused instead of answering for keys they do not hold.

use crate::remote::Remote;
use crate::structures::{recover, Queue, Replay};
use crate::transport::{Counters, Transport};
use crate::{Error, RemoteOptions, Result};

const MAGIC: u64 = u64::from_le_bytes(*b"ANVPART1");
const RECORD: usize = 48;
const KIND_HASH: u64 = 1;
const KIND_RANGE: u64 = 2;

/// Which partition holds which key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionMap {
    /// Key hashing over `n` partitions (hash table, queue).
    Hash { n: usize },
    /// Key ranges: partition `i` holds the keys from `starts[i]` up to
    /// `starts[i + 1]` (exclusive; the last one up to `u64::MAX`).
    /// `starts[0]` is 0 and the starts increase.
    Range { starts: Vec<u64> },
}

impl PartitionMap {
    /// Key hashing over `n` partitions.
    pub fn hash(n: usize) -> PartitionMap {
        PartitionMap::Hash { n: n.max(1) }
    }

    /// `n` ranges of equal width over the keys `0..key_space` (the last
    /// range also holds every key above).
    pub fn range_even(n: usize, key_space: u64) -> PartitionMap {
        let n = n.max(1) as u128;
        let starts = (0..n).map(|i| (key_space as u128 * i / n) as u64).collect();
        PartitionMap::Range { starts }
    }

    /// Ranges starting at `starts` (`starts[0]` must be 0, increasing).
    pub fn range(starts: Vec<u64>) -> Result<PartitionMap> {
        if starts.first() != Some(&0) || starts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::Partition(format!(
                "range starts must begin at 0 and increase: {starts:?}"
            )));
        }
        Ok(PartitionMap::Range { starts })
    }

    /// Number of partitions.
    pub fn len(&self) -> usize {
        match self {
            PartitionMap::Hash { n } => *n,
            PartitionMap::Range { starts } => starts.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The partition of `key`.
    pub fn of(&self, key: u64) -> usize {
        match self {
            PartitionMap::Hash { n } => (mix(key) % *n as u64) as usize,
            PartitionMap::Range { starts } => starts.partition_point(|s| *s <= key) - 1,
        }
    }

    /// Partition `i`'s record: `{magic, kind, count, index, first, last}`.
    fn record(&self, i: usize) -> [u64; 6] {
        let n = self.len() as u64;
        match self {
            PartitionMap::Hash { .. } => [MAGIC, KIND_HASH, n, i as u64, 0, u64::MAX],
            PartitionMap::Range { starts } => {
                let last = starts.get(i + 1).map_or(u64::MAX, |s| s - 1);
                [MAGIC, KIND_RANGE, n, i as u64, starts[i], last]
            }
        }
    }
}

/// A hash of the key independent of the hash table's bucket hash (which
/// takes the high half of a Fibonacci product): the splitmix64 finaliser.
/// With the same bits, every partition's keys would crowd into a fraction
/// of its buckets.
fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn encode(words: &[u64; 6]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn decode(b: &[u8]) -> [u64; 6] {
    std::array::from_fn(|i| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()))
}

/// Checks partition `i`'s record on `r` against `map`, writing it first
/// if missing (a writer only). A record is written whole and flushed
/// before it is named, so a named record is complete.
fn check_record(r: &mut Remote, name: &str, map: &PartitionMap, i: usize, writer: bool) -> Result<()> {
    let key = format!("{name}/part");
    let want = map.record(i);
    let addr = match r.name_get(&key)? {
        Some(a) => a,
        None if writer => {
            let a = r.alloc(RECORD as u64)?;
            r.write_new(a, &encode(&want), 0)?;
            r.flush()?;
            r.name_set(&key, a)?;
            return Ok(());
        }
        None => {
            return Err(Error::Partition(format!(
                "partition {i} has no {key:?}: no writer has opened it yet"
            )))
        }
    };
    let got = decode(&r.read(addr, RECORD, 0)?);
    if got != want {
        return Err(Error::Partition(format!(
            "the back-end given as partition {i} of {name:?} holds {} (kind {}, index {} of {}, keys {}..={}); \
             the map asks for kind {}, index {} of {}, keys {}..={}",
            if got[0] == MAGIC {
                "another partition"
            } else {
                "no partition record"
            },
            got[1],
            got[3],
            got[2],
            got[4],
            got[5],
            want[1],
            want[3],
            want[2],
            want[4],
            want[5],
        )));
    }
    Ok(())
}

/// One partition a front-end holds: its link and its structure.
pub struct Part<S> {
    pub remote: Remote,
    pub structure: S,
}

/// How a front-end holds one partition.
pub enum Link<T> {
    /// Not at all (another front-end writes it).
    Absent,
    /// As its single writer.
    Writer(T),
    /// As a reader (no lock).
    Reader(T),
}

/// A data structure spread over the partitions of a [`PartitionMap`],
/// seen from one front-end.
pub struct Partitioned<S> {
    map: PartitionMap,
    parts: Vec<Option<Part<S>>>,
    /// Where the next cross-partition `dequeue` starts looking.
    cursor: usize,
}

impl<S> Partitioned<S> {
    /// Opens the structure `name` on each partition as `links` say
    /// (partition `i` through `links[i]`): takes the writer locks, checks
    /// (a writer: records) each partition's place in the map, then opens
    /// the structure with `open(partition, remote)`. Recovery is the
    /// caller's: [`Partitioned::recover`].
    pub fn open<T: Transport + 'static>(
        map: PartitionMap,
        name: &str,
        links: Vec<Link<T>>,
        opts: &RemoteOptions,
        mut open: impl FnMut(usize, &mut Remote) -> Result<S>,
    ) -> Result<Partitioned<S>> {
        if links.len() != map.len() {
            return Err(Error::Partition(format!(
                "{} back-ends for {} partitions",
                links.len(),
                map.len()
            )));
        }
        let mut parts = Vec::with_capacity(links.len());
        for (i, link) in links.into_iter().enumerate() {
            let (mut remote, writer) = match link {
                Link::Absent => {
                    parts.push(None);
                    continue;
                }
                Link::Writer(t) => (Remote::open(t, opts.clone())?, true),
                Link::Reader(t) => (Remote::open_reader(t, opts.clone())?, false),
            };
            check_record(&mut remote, name, &map, i, writer)?;
            let structure = open(i, &mut remote)?;
            parts.push(Some(Part { remote, structure }));
        }
        Ok(Partitioned { map, parts, cursor: 0 })
    }

    /// One front-end writing every partition.
    pub fn open_writers<T: Transport + 'static>(
        map: PartitionMap,
        name: &str,
        transports: Vec<T>,
        opts: &RemoteOptions,
        open: impl FnMut(usize, &mut Remote) -> Result<S>,
    ) -> Result<Partitioned<S>> {
        let links = transports.into_iter().map(Link::Writer).collect();
        Self::open(map, name, links, opts, open)
    }

    /// A front-end writing partition `i` only, through `t`.
    pub fn open_writer_of<T: Transport + 'static>(
        map: PartitionMap,
        name: &str,
        i: usize,
        t: T,
        opts: &RemoteOptions,
        open: impl FnMut(usize, &mut Remote) -> Result<S>,
    ) -> Result<Partitioned<S>> {
        let mut t = Some(t);
        let links = (0..map.len())
            .map(|j| match (j == i).then(|| t.take()).flatten() {
                Some(t) => Link::Writer(t),
                None => Link::Absent,
            })
            .collect();
        Self::open(map, name, links, opts, open)
    }

    /// A front-end reading every partition (no locks, no cache).
    pub fn open_readers<T: Transport + 'static>(
        map: PartitionMap,
        name: &str,
        transports: Vec<T>,
        opts: &RemoteOptions,
        open: impl FnMut(usize, &mut Remote) -> Result<S>,
    ) -> Result<Partitioned<S>> {
        let links = transports.into_iter().map(Link::Reader).collect();
        Self::open(map, name, links, opts, open)
    }

    pub fn map(&self) -> &PartitionMap {
        &self.map
    }

    /// The partition of `key`.
    pub fn partition_of(&self, key: u64) -> usize {
        self.map.of(key)
    }

    /// Whether this front-end holds partition `i`.
    pub fn holds(&self, i: usize) -> bool {
        self.parts.get(i).is_some_and(Option::is_some)
    }

    /// Partition `i`, if this front-end holds it.
    pub fn part_mut(&mut self, i: usize) -> Option<&mut Part<S>> {
        self.parts.get_mut(i).and_then(Option::as_mut)
    }

    /// Runs `f` on the partition of `key`: the routing of one operation.
    pub fn with_key<R>(&mut self, key: u64, f: impl FnOnce(&mut S, &mut Remote) -> Result<R>) -> Result<R> {
        let i = self.map.of(key);
        match self.parts[i].as_mut() {
            Some(p) => f(&mut p.structure, &mut p.remote),
            None => Err(Error::Partition(format!(
                "key {key} belongs to partition {i}, which this front-end does not hold"
            ))),
        }
    }

    /// Runs `f` on every partition this front-end holds, in partition
    /// order (with range partitioning: key order), and collects the answers.
    pub fn each<R>(&mut self, mut f: impl FnMut(usize, &mut S, &mut Remote) -> Result<R>) -> Result<Vec<R>> {
        let mut out = Vec::new();
        for (i, p) in self.parts.iter_mut().enumerate() {
            if let Some(p) = p {
                out.push(f(i, &mut p.structure, &mut p.remote)?);
            }
        }
        Ok(out)
    }

    /// Round trips, verbs and bytes of each partition held (`None`: not held).
    pub fn counters(&self) -> Vec<Option<Counters>> {
        self.parts
            .iter()
            .map(|p| p.as_ref().map(|p| p.remote.counters().clone()))
            .collect()
    }

    /// Sends every partition's pending batch.
    pub fn flush(&mut self) -> Result<()> {
        self.each(|_, _, r| r.flush()).map(|_| ())
    }

    /// Flushes and releases every writer lock held.
    pub fn close(self) -> Result<()> {
        for p in self.parts.into_iter().flatten() {
            p.remote.close()?;
        }
        Ok(())
    }
}

impl<S: Replay> Partitioned<S> {
    /// Re-executes, on each partition this front-end writes, the operation
    /// logs its last transaction does not cover (AsymNVM §7 case 2), each
    /// exactly once; answers how many per partition held. Only the
    /// partitions held are touched.
    pub fn recover(&mut self) -> Result<Vec<(usize, u64)>> {
        self.each(|i, s, r| Ok((i, recover(r, s)?)))
    }
}

impl Partitioned<Queue> {
    /// Removes the oldest item of some partition: the partitions are tried
    /// in turn, starting after the one that answered last, so a steady
    /// consumer drains them evenly. FIFO holds within a partition, not
    /// across them. `None` when every partition held is empty.
    pub fn dequeue(&mut self) -> Result<Option<(u64, Vec<u8>)>> {
        let n = self.parts.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            if let Some(p) = self.parts[i].as_mut() {
                if let Some(item) = p.structure.dequeue(&mut p.remote)? {
                    self.cursor = (i + 1) % n;
                    return Ok(Some(item));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_maps_route_by_start_and_cover_every_key() {
        let m = PartitionMap::range(vec![0, 10, 20]).unwrap();
        assert_eq!([0, 9, 10, 19, 20, u64::MAX].map(|k| m.of(k)), [0, 0, 1, 1, 2, 2]);
        assert_eq!(m.record(0)[4..], [0, 9]);
        assert_eq!(m.record(2)[4..], [20, u64::MAX]);
        assert!(PartitionMap::range(vec![1, 5]).is_err());
        assert!(PartitionMap::range(vec![0, 5, 5]).is_err());
        let e = PartitionMap::range_even(3, 300);
        assert_eq!(
            e,
            PartitionMap::Range {
                starts: vec![0, 100, 200]
            }
        );
    }

    #[test]
    fn hash_maps_spread_sequential_keys_evenly() {
        for n in 1..=4 {
            let m = PartitionMap::hash(n);
            let mut counts = vec![0u32; n];
            for k in 0..30_000 {
                counts[m.of(k)] += 1;
            }
            let want = 30_000 / n as u32;
            assert!(
                counts.iter().all(|c| c.abs_diff(want) < want / 20),
                "{n} partitions: {counts:?}"
            );
        }
    }
}
