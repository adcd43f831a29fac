//! The engine API (docs/design.md, "Layers"): open a pool, `get/put/delete/range/prefix`.

use std::ops::{Bound as RB, ControlFlow, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::alloc::Allocator;
use crate::check::{self, CheckReport};
use crate::error::{Error, Result};
use crate::format::header::{self, EngineKind, Header, LeafKind, VERSION};
use crate::hash::engine::{self as hash_engine, HashEngine, HashIter};
use crate::pmem::{FileSpace, FlushKind, OpenMode, Space};
use crate::recovery::{self, Recovery, RecoveryKind};
use crate::tree::adaptive::{self, Model, Strategy};
use crate::tree::isle::Isle;
use crate::tree::leaf::LeafFormat as _;
use crate::tree::nv::Nv;
use crate::tree::{RangeIter, SplitHook, Tree, TreeStats};

/// Size of an allocation chunk; also the header's reserved area.
pub const CHUNK_SIZE: u64 = 64 * 1024;
/// Smallest pool: the header area and three chunks.
pub const MIN_POOL: u64 = 4 * CHUNK_SIZE;

/// The strategy [`Options::adaptive`] defaults to (README, "Workload-adaptive
/// node sizing", says why).
pub const DEFAULT_ADAPTIVE: Strategy = Strategy::Balanced;

/// How to open or create a pool.
#[derive(Clone, Debug)]
pub struct Options {
    /// Create the pool if the file does not exist.
    pub create: bool,
    /// Initial file size when creating (grows on demand).
    pub size: u64,
    /// Largest size the pool may grow to.
    pub max_size: u64,
    /// Leaf node size in bytes when creating (a multiple of 64).
    pub node_size: u32,
    /// Leaf format when creating a tree pool; an existing pool keeps its own.
    pub leaf: LeafKind,
    /// Engine when creating (the NV-Tree or the hash table with its
    /// ordered index); an existing pool keeps its own.
    pub engine: EngineKind,
    /// Flush instruction; `None` detects the best one.
    pub flush: Option<FlushKind>,
    /// Emulated write latency per flushed line, in nanoseconds.
    pub latency_ns: u64,
    /// Open without writing anything (no recovery writes, no clean flag).
    pub read_only: bool,
    /// Never try `MAP_SYNC`.
    pub force_shared: bool,
    /// Workload-adaptive node sizing (NV-Tree §5): which strategy picks
    /// the size of the leaves that replace a full one. Not stored in the
    /// pool; each open chooses.
    pub adaptive: Strategy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            create: true,
            size: 64 << 20,
            max_size: 1 << 40,
            node_size: 1024,
            leaf: LeafKind::Nv,
            engine: EngineKind::Tree,
            flush: None,
            latency_ns: 0,
            read_only: false,
            force_shared: false,
            adaptive: DEFAULT_ADAPTIVE,
        }
    }
}

impl Options {
    fn validate(&self) -> Result<()> {
        let ns = self.node_size as u64;
        if !ns.is_multiple_of(64) || !(crate::format::leaf_nv::MIN_SIZE..=crate::alloc::MAX_CLASS).contains(&ns) {
            return Err(Error::InvalidOption(format!(
                "node size {ns} must be a multiple of 64 between {} and {}",
                crate::format::leaf_nv::MIN_SIZE,
                crate::alloc::MAX_CLASS
            )));
        }
        if self.size < 2 * CHUNK_SIZE {
            return Err(Error::InvalidOption(format!(
                "pool size must be at least {} bytes",
                2 * CHUNK_SIZE
            )));
        }
        Ok(())
    }
}

/// The engine of a pool: the tree, by its leaf format, or the hash table.
/// The only place `Db` widens: every method dispatches on it.
enum Engine<S: Space> {
    Nv(Arc<Tree<S, Nv>>),
    Isle(Arc<Tree<S, Isle>>),
    Hash(Arc<HashEngine<S>>),
}

/// Runs `$body` with `$t` bound to the pool's tree, whatever its format;
/// on a hash pool runs `$hash` with `$h` bound to its engine.
macro_rules! with_tree {
    ($self:expr, $t:ident => $body:expr, $h:ident => $hash:expr) => {
        match &$self.engine {
            Engine::Nv($t) => $body,
            Engine::Isle($t) => $body,
            Engine::Hash($h) => $hash,
        }
    };
}

/// Declares `Db`'s test hooks: `pub` with the `testing` feature, crate-private
/// (and allowed to be unused) without it.
macro_rules! hooks {
    ($($(#[$m:meta])* fn $name:ident $sig:tt $(-> $ret:ty)? $body:block)*) => {
        $(
            #[cfg(feature = "testing")]
            $(#[$m])*
            pub fn $name $sig $(-> $ret)? $body

            #[cfg(not(feature = "testing"))]
            $(#[$m])*
            #[allow(dead_code, reason = "a test hook, public with the testing feature")]
            pub(crate) fn $name $sig $(-> $ret)? $body
        )*
    };
}

/// An open pool.
pub struct Db<S: Space = FileSpace> {
    engine: Engine<S>,
    header: Header,
    recovery: Recovery,
    /// Whether the pool had been shut down cleanly when it was opened.
    was_clean: bool,
    closed: bool,
}

/// A leaf as [`Db::leaves`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeafInfo {
    /// Offset of the leaf in the pool.
    pub offset: u64,
    /// Its node size in bytes.
    pub size_bytes: u64,
    /// Elements appended to it (live, superseded and deletion markers).
    pub elements: u64,
}

/// What `nvstore stat` reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Stat {
    pub path: String,
    pub format_version: u32,
    pub uuid: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub mapping: &'static str,
    pub flush: &'static str,
    /// Whether the pool was cleanly shut down when this open found it.
    pub clean_shutdown: bool,
    /// "tree" or "hash".
    pub engine: &'static str,
    /// Tree pools: "nv" or "isle"; hash pools: "none".
    pub leaf_format: &'static str,
    /// Tree pools: the leaf size of new leaves; hash pools: 0.
    pub node_size: u32,
    pub keys: u64,
    pub leaves: u64,
    /// Hash pools: the global depth of the table's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_depth: Option<u32>,
    pub last_recovery: Recovery,
    pub splits: u64,
    pub replaces: u64,
    pub merges: u64,
    pub rebuilds: u64,
    pub rebuild_ms: f64,
    /// Adaptivity: leaves rewritten larger / smaller than the leaf they
    /// replaced, and parent-of-leaf nodes given a larger limit at rebuild.
    pub leaves_enlarged: u64,
    pub leaves_shrunk: u64,
    pub hot_plns: u64,
    /// Largest and mean leaf size in bytes (adaptivity changes them).
    pub largest_leaf_bytes: u64,
    pub mean_leaf_bytes: f64,
    /// Newest commit timestamp visible now.
    pub last_commit_ts: u64,
    /// Timestamp of the oldest live snapshot (or transaction), if any:
    /// leaf rewrites keep the versions it reads.
    pub oldest_snapshot: Option<u64>,
    /// Live snapshots and transactions.
    pub snapshots: u64,
    /// Transactions and write batches committed since open, those that
    /// spanned several leaves, and commits refused for a conflict.
    pub commits: u64,
    pub multi_leaf_commits: u64,
    pub conflicts: u64,
}

impl Db<FileSpace> {
    /// Opens the pool at `path`, creating it if missing and `opts.create`.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Db<FileSpace>> {
        let path = path.as_ref();
        opts.validate()?;
        let exists = path.exists();
        let mode = if opts.read_only {
            OpenMode::ReadOnly
        } else if !exists && opts.create {
            OpenMode::Create {
                size: opts.size.max(4 * CHUNK_SIZE),
            }
        } else {
            OpenMode::Open
        };
        if let OpenMode::Create { size } = mode {
            let db = Db::create_file(path, size, &opts)?;
            db.start_adaptive(opts.adaptive, opts.latency_ns);
            return Ok(db);
        }
        let fo = crate::pmem::file::FileOptions {
            mode,
            flush: opts.flush,
            latency_ns: opts.latency_ns,
            max_size: opts.max_size,
            force_shared: opts.force_shared,
            name: None,
        };
        let space = FileSpace::open(path, &fo)?;
        let db = Db::open_space(space, path)?;
        db.start_adaptive(opts.adaptive, opts.latency_ns);
        Ok(db)
    }

    /// Turns adaptivity on with the cost model of this medium: the one
    /// cached in the header for this `latency_ns`, else a fresh
    /// calibration, cached when the pool is writable.
    fn start_adaptive(&self, s: Strategy, latency_ns: u64) {
        if matches!(self.engine, Engine::Hash(_)) {
            return; // no leaves to size
        }
        if s != Strategy::Off {
            let space = self.space();
            let off = header::CALIBRATION_OFF;
            let cached = Model::decode([space.load(off), space.load(off + 8)], latency_ns);
            let model = match cached {
                Some(m) => m,
                // A pool too full for the scratch block still opens.
                None if space.writable() => match adaptive::calibrate(space, self.alloc()) {
                    Ok(m) => {
                        let [a, b] = m.encode(latency_ns);
                        header::set_root(space, off, a);
                        header::set_root(space, off + 8, b);
                        // As the next open will read it back.
                        Model::decode([a, b], latency_ns).unwrap_or(m)
                    }
                    Err(_) => Model::default(),
                },
                None => Model::default(),
            };
            with_tree!(self, t => t.adaptive.set_model(model), _h => ());
        }
        self.set_adaptive(s);
    }

    /// Writes a new pool under a temporary name and renames it into place
    /// once its header and first leaf are durable: a crash during creation
    /// leaves no half-made pool at `path`.
    fn create_file(path: &Path, size: u64, opts: &Options) -> Result<Db<FileSpace>> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".creating-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let fo = crate::pmem::file::FileOptions {
            mode: OpenMode::Create { size },
            flush: opts.flush,
            latency_ns: opts.latency_ns,
            max_size: opts.max_size,
            force_shared: opts.force_shared,
            name: Some(path.to_path_buf()),
        };
        let space = FileSpace::open(&tmp, &fo)?;
        let db = match Db::create_in(space, path, opts) {
            Ok(db) => db,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        db.sync()?;
        // A hard link fails if `path` exists, so a pool that appeared there
        // meanwhile is never replaced; then drop the temporary name.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        linked.map_err(|e| Error::io(path, e))?;
        Ok(db)
    }

    /// Creates a new pool at `path`; fails if the file exists.
    pub fn create(path: impl AsRef<Path>, opts: Options) -> Result<Db<FileSpace>> {
        let path = path.as_ref();
        if path.exists() {
            return Err(Error::AlreadyExists { path: path.into() });
        }
        Db::open(path, Options { create: true, ..opts })
    }
}

impl<S: Space> Db<S> {
    /// Writes a fresh pool into a zeroed space and opens it.
    pub fn create_in(space: S, path: &Path, opts: &Options) -> Result<Db<S>> {
        opts.validate()?;
        let size = space.size() / CHUNK_SIZE * CHUNK_SIZE;
        let h = Header {
            version: VERSION,
            flags: 0,
            uuid: rand::random(),
            engine: opts.engine,
            leaf_format: match opts.engine {
                EngineKind::Tree => opts.leaf,
                EngineKind::Hash => LeafKind::Nv,
            },
            node_size: opts.node_size,
            chunk_size: CHUNK_SIZE,
            data_start: CHUNK_SIZE,
        };
        let space = Arc::new(space);
        let alloc = Arc::new(Allocator::fresh(CHUNK_SIZE, CHUNK_SIZE, size, path.into()));
        let t = std::time::Instant::now();
        if opts.engine == EngineKind::Hash {
            // The table first, then the header: a pool whose creation was
            // cut short is "not a pool" or has a whole, empty table.
            let engine = HashEngine::create(space.clone(), alloc, path)?;
            h.create(&*space, size);
            return Ok(Db {
                engine: Engine::Hash(Arc::new(engine)),
                header: h,
                recovery: Recovery {
                    kind: RecoveryKind::Created,
                    millis: t.elapsed().as_secs_f64() * 1e3,
                },
                was_clean: true,
                closed: false,
            });
        }
        h.create(&*space, size);
        fn fresh<S: Space, L: crate::tree::leaf::LeafFormat>(
            space: Arc<S>,
            alloc: Arc<Allocator>,
            node_size: u64,
            path: &Path,
        ) -> Result<Arc<Tree<S, L>>> {
            let leaf = Tree::<S, L>::create_first_leaf(&*space, &alloc, node_size)?;
            let entries = vec![crate::tree::index::Entry {
                max: crate::tree::index::Bound::PosInf,
                leaf: Arc::new(crate::tree::LeafRef::built(leaf, node_size, 0)),
            }];
            Ok(Arc::new(Tree::assemble(
                space,
                alloc,
                entries,
                node_size,
                0,
                0,
                path.into(),
            )))
        }
        let ns = opts.node_size as u64;
        let engine = match opts.leaf {
            LeafKind::Nv => Engine::Nv(fresh(space, alloc, ns, path)?),
            LeafKind::Isle => Engine::Isle(fresh(space, alloc, ns, path)?),
        };
        let recovery = Recovery {
            kind: RecoveryKind::Created,
            millis: t.elapsed().as_secs_f64() * 1e3,
        };
        match &engine {
            Engine::Nv(t) => t.set_adaptive(opts.adaptive),
            Engine::Isle(t) => t.set_adaptive(opts.adaptive),
            Engine::Hash(_) => {}
        }
        Ok(Db {
            engine,
            header: h,
            recovery,
            was_clean: true,
            closed: false,
        })
    }

    /// Opens an existing pool in `space` (`path` names it in messages).
    pub fn open_space(space: S, path: &Path) -> Result<Db<S>> {
        let mut h = Header::read(&space, path)?;
        let was_clean = space.load(header::CLEAN_STATE_OFF) != 0;
        let space = Arc::new(space);
        let (engine, recovery) = match (h.engine, h.leaf_format) {
            (EngineKind::Hash, _) => {
                let (e, r) = HashEngine::open(space.clone(), &h, path)?;
                (Engine::Hash(Arc::new(e)), r)
            }
            (EngineKind::Tree, LeafKind::Nv) => {
                let (t, r) = recovery::open_tree::<S, Nv>(space.clone(), &h, path)?;
                (Engine::Nv(Arc::new(t)), r)
            }
            (EngineKind::Tree, LeafKind::Isle) => {
                let (t, r) = recovery::open_tree::<S, Isle>(space.clone(), &h, path)?;
                (Engine::Isle(Arc::new(t)), r)
            }
        };
        // Recovery read the older format as it is; what this build writes
        // from now on belongs to the current one.
        if space.writable() {
            h.upgrade(&*space);
        }
        Ok(Db {
            engine,
            header: h,
            recovery,
            was_clean,
            closed: false,
        })
    }

    /// Selects the adaptive strategy from now on. Pools opened from a file
    /// get it from [`Options::adaptive`] with a calibrated model; this keeps
    /// the model in use (the default one on simulated spaces).
    pub fn set_adaptive(&self, s: Strategy) {
        with_tree!(self, t => t.set_adaptive(s), _h => ())
    }

    /// The cost model adaptivity uses.
    pub fn adaptive_model(&self) -> Model {
        with_tree!(self, t => t.adaptive.model(), _h => Model::default())
    }

    /// Pool facts and engine counters.
    pub fn stat(&self) -> Stat {
        with_tree!(self, t => self.stat_of(t), h => self.stat_of_hash(h))
    }

    fn stat_of_hash(&self, h: &HashEngine<S>) -> Stat {
        Stat {
            path: h.path.display().to_string(),
            format_version: self.header.version,
            uuid: self.uuid(),
            size_bytes: self.pool_size(),
            used_bytes: self.used_bytes(),
            mapping: self.space().mapping().as_str(),
            flush: self.space().flush_kind().as_str(),
            clean_shutdown: self.was_clean,
            engine: EngineKind::Hash.as_str(),
            leaf_format: "none",
            node_size: 0,
            keys: self.len(),
            leaves: 0,
            hash_depth: Some(h.table.depth()),
            last_recovery: self.recovery,
            // Segment splits of the table since open.
            splits: h.table.splits(),
            replaces: 0,
            merges: 0,
            rebuilds: 0,
            rebuild_ms: 0.0,
            leaves_enlarged: 0,
            leaves_shrunk: 0,
            hot_plns: 0,
            largest_leaf_bytes: 0,
            mean_leaf_bytes: 0.0,
            last_commit_ts: 0,
            oldest_snapshot: None,
            snapshots: 0,
            commits: 0,
            multi_leaf_commits: 0,
            conflicts: 0,
        }
    }

    fn uuid(&self) -> String {
        self.header.uuid.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn stat_of<L: crate::tree::leaf::LeafFormat>(&self, tree: &Tree<S, L>) -> Stat {
        use std::sync::atomic::Ordering::Relaxed;
        let st = &tree.stats;
        let ad = &tree.adaptive;
        let sizes: Vec<u64> = (tree.index.load().entries().iter())
            .filter(|e| e.leaf.off != 0)
            .map(|e| e.leaf.size)
            .collect();
        Stat {
            path: tree.path.display().to_string(),
            format_version: self.header.version,
            uuid: self.uuid(),
            size_bytes: self.pool_size(),
            used_bytes: self.used_bytes(),
            mapping: self.space().mapping().as_str(),
            flush: self.space().flush_kind().as_str(),
            clean_shutdown: self.was_clean,
            engine: EngineKind::Tree.as_str(),
            leaf_format: self.header.leaf_format.as_str(),
            node_size: self.header.node_size,
            keys: self.len(),
            leaves: sizes.len() as u64,
            hash_depth: None,
            last_recovery: self.recovery,
            splits: st.splits.load(Relaxed),
            replaces: st.replaces.load(Relaxed),
            merges: st.merges.load(Relaxed),
            rebuilds: st.rebuilds.load(Relaxed),
            rebuild_ms: st.rebuild_ns.load(Relaxed) as f64 / 1e6,
            leaves_enlarged: ad.enlarged.load(Relaxed),
            leaves_shrunk: ad.shrunk.load(Relaxed),
            hot_plns: ad.hot_plns.load(Relaxed),
            largest_leaf_bytes: sizes.iter().copied().max().unwrap_or(0),
            mean_leaf_bytes: sizes.iter().sum::<u64>() as f64 / sizes.len().max(1) as f64,
            last_commit_ts: tree.clock.last(),
            oldest_snapshot: tree.clock.oldest_snapshot(),
            snapshots: tree.clock.snapshots() as u64,
            commits: st.commits.load(Relaxed),
            multi_leaf_commits: st.multi_leaf_commits.load(Relaxed),
            conflicts: st.conflicts.load(Relaxed),
        }
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.space().writable() {
            Ok(())
        } else {
            Err(Error::ReadOnly)
        }
    }

    /// The value stored for `key` (a copy: [`Db::get_with`] reads it in place).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_with(key, <[u8]>::to_vec)
    }

    /// Runs `f` on the value stored for `key` without copying it out of
    /// the pool (no allocation): `Ok(None)` when `key` has no value.
    /// `f` runs inside the read, which holds back the reclamation of
    /// replaced values meanwhile, so keep it short and do not block in it.
    ///
    /// ```no_run
    /// # let db = nvstore::Db::open("/dev/shm/doc.pool", nvstore::Options::default())?;
    /// let len = db.get_with(b"user:1", |v| v.len())?;
    /// let starts = db.get_with(b"user:1", |v| v.starts_with(b"{"))?.unwrap_or(false);
    /// # Ok::<(), nvstore::Error>(())
    /// ```
    #[inline]
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        crate::tree::check_key(key)?;
        with_tree!(self, t => t.get_with(key, f), h => Ok(h.get(key)?.map(|v| f(&v))))
    }

    /// Calls `f` on each pair with a key in `range`, in key order, lending
    /// key and value without copying them, until `f` returns
    /// [`ControlFlow::Break`]. The scan reads one leaf at a time (as
    /// [`Db::range`] does) and `f` runs while that leaf's read is in
    /// progress: keep it short. Stops at the first damaged leaf with its
    /// [`Error::Corrupt`].
    ///
    /// ```no_run
    /// # use std::ops::ControlFlow;
    /// # let db = nvstore::Db::open("/dev/shm/doc.pool", nvstore::Options::default())?;
    /// let mut bytes = 0;
    /// db.range_with(&b"a"[..]..&b"b"[..], |_k, v| {
    ///     bytes += v.len();
    ///     ControlFlow::Continue(())
    /// })?;
    /// # Ok::<(), nvstore::Error>(())
    /// ```
    pub fn range_with<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (lo, hi) = owned_bounds(&range);
        with_tree!(self, t => t.scan_with(lo, hi, false, u64::MAX, f), h => h.scan_with(lo, hi, false, f))
    }

    /// [`Db::range_with`] in reverse key order.
    pub fn range_rev_with<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (lo, hi) = owned_bounds(&range);
        with_tree!(self, t => t.scan_with(lo, hi, true, u64::MAX, f), h => h.scan_with(lo, hi, true, f))
    }

    /// [`Db::range_with`] over the pairs whose key starts with `prefix`.
    pub fn prefix_with(&self, prefix: &[u8], f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>) -> Result<()> {
        let (lo, hi) = prefix_bounds(prefix);
        with_tree!(self, t => t.scan_with(lo, hi, false, u64::MAX, f), h => h.scan_with(lo, hi, false, f))
    }

    /// [`Db::range_with`] over every pair.
    pub fn for_each(&self, f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>) -> Result<()> {
        with_tree!(self, t => t.scan_with(RB::Unbounded, RB::Unbounded, false, u64::MAX, f), h => h.scan_with(RB::Unbounded, RB::Unbounded, false, f))
    }

    /// Stores `value` under `key`; durable when it returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.writable()?;
        with_tree!(self, t => t.put(key, value), h => h.put(key, value))
    }

    /// Removes `key`; returns whether it was there. Durable when it returns.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.writable()?;
        with_tree!(self, t => t.delete(key), h => h.delete(key))
    }

    /// Pairs with keys in `range`, in key order.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter<S> {
        let (lo, hi) = owned_bounds(&range);
        self.iter_over(lo, hi, false)
    }

    /// Pairs with keys in `range`, in reverse key order.
    pub fn range_rev<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter<S> {
        let (lo, hi) = owned_bounds(&range);
        self.iter_over(lo, hi, true)
    }

    /// Every pair, in key order.
    pub fn iter(&self) -> Iter<S> {
        self.iter_over(RB::Unbounded, RB::Unbounded, false)
    }

    /// Pairs whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Iter<S> {
        let (lo, hi) = prefix_bounds(prefix);
        self.iter_over(lo, hi, false)
    }

    /// Pairs whose key starts with `prefix`, in reverse key order.
    pub fn prefix_rev(&self, prefix: &[u8]) -> Iter<S> {
        let (lo, hi) = prefix_bounds(prefix);
        self.iter_over(lo, hi, true)
    }

    fn iter_over(&self, lo: RB<Vec<u8>>, hi: RB<Vec<u8>>, reverse: bool) -> Iter<S> {
        match &self.engine {
            Engine::Nv(t) => Iter::Nv(t.range(lo, hi, reverse)),
            Engine::Isle(t) => Iter::Isle(t.range(lo, hi, reverse)),
            Engine::Hash(h) => Iter::Hash(h.range(lo, hi, reverse)),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> u64 {
        with_tree!(self, t => t.len(), h => h.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks every leaf the index names against its format's rules
    /// (sizes, counts, element metadata, blob references, chain links),
    /// without collating any: cheaper than [`Db::check`], and enough to
    /// know no read of the pool will meet damage. The first damage found
    /// is an [`Error::Corrupt`] with its offset; from then on this `Db`
    /// refuses writes.
    pub fn validate(&self) -> Result<()> {
        with_tree!(self, t => t.validate_leaves(), h => h.validate())
    }

    /// Verifies every invariant without writing (`nvstore check`).
    pub fn check(&self) -> CheckReport {
        with_tree!(self, t => check::check(t, &self.header), h => h.check(&self.header))
    }

    /// The pool's engine.
    pub fn engine(&self) -> EngineKind {
        self.header.engine
    }

    /// The pool's leaf format ([`LeafKind::Nv`] on a hash pool, which has
    /// no leaves: check [`Db::engine`] first).
    pub fn leaf_format(&self) -> LeafKind {
        self.header.leaf_format
    }

    /// How the pool was recovered when opened.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// `Ok` when the pool keeps versions, so snapshots, transactions and
    /// write batches work on it; otherwise `Error::Unsupported` saying why.
    pub fn supports_versions(&self) -> Result<()> {
        self.nv_tree().map(|_| ())
    }

    /// Every leaf the inner index routes to, in key order.
    pub fn leaves(&self) -> Vec<LeafInfo> {
        self.index_leaves()
            .into_iter()
            .filter(|&(off, _, _)| off != 0)
            .map(|(offset, size_bytes, elements)| LeafInfo {
                offset,
                size_bytes,
                elements,
            })
            .collect()
    }

    // Test hooks: the tree, its clock and counters, the raw space, the
    // header and the split hook. Public under the `testing` feature (this
    // crate's integration tests), crate-private otherwise.
    hooks! {
        /// The tree of an nv pool; snapshots and transactions work on it.
        fn nv_tree(&self) -> Result<&Arc<Tree<S, Nv>>> {
            match &self.engine {
                Engine::Nv(t) => Ok(t),
                Engine::Isle(_) => Err(Error::Unsupported(format!(
                    "{} leaves keep no versions: snapshots, transactions and write batches need an nv pool \
                     (nvstore create POOL --leaf nv)",
                    Isle::NAME
                ))),
                Engine::Hash(_) => Err(hash_engine::unsupported("snapshots, transactions and write batches")),
            }
        }

        /// The commit-timestamp clock.
        fn clock(&self) -> &crate::tree::mvcc::Clock {
            with_tree!(self, t => &t.clock, h => &h.clock)
        }

        /// Structural counters of the tree.
        fn tree_stats(&self) -> &TreeStats {
            with_tree!(self, t => &t.stats, h => &h.stats)
        }

        /// Every leaf offset in chain order, with its element count.
        fn leaf_offsets(&self) -> Vec<(u64, u64)> {
            with_tree!(self, t => t.leaf_offsets(), _h => Vec::new())
        }

        /// The leaves the inner index routes to: offset, size, element count.
        fn index_leaves(&self) -> Vec<(u64, u64, u64)> {
            use std::sync::atomic::Ordering::Acquire;
            with_tree!(self, t => t
                .index
                .load()
                .entries()
                .iter()
                .map(|e| (e.leaf.off, e.leaf.size, e.leaf.durable.load(Acquire)))
                .collect(), _h => Vec::new())
        }

        /// Installs (or removes) the split hook. For crash tests only.
        fn set_split_hook(&self, hook: Option<SplitHook>) {
            with_tree!(self, t => t.set_split_hook(hook), _h => drop(hook))
        }

        /// The pool header as read at open.
        fn header(&self) -> &Header {
            &self.header
        }

        /// The tree of an nv pool.
        ///
        /// # Panics
        /// On a pool of another leaf format ([`Db::nv_tree`] says why).
        fn tree(&self) -> &Arc<Tree<S, Nv>> {
            match self.nv_tree() {
                Ok(t) => t,
                Err(e) => panic!("{e}"),
            }
        }

        /// The space the pool lives in.
        fn space(&self) -> &S {
            self.space_arc()
        }
    }

    fn space_arc(&self) -> &Arc<S> {
        with_tree!(self, t => &t.space, h => &h.space)
    }

    fn alloc(&self) -> &Allocator {
        with_tree!(self, t => &t.alloc, h => &h.alloc)
    }

    /// Bytes of the pool in allocated blocks (plus the header area).
    pub fn used_bytes(&self) -> u64 {
        self.alloc().used_bytes() + self.header.data_start
    }

    pub fn pool_size(&self) -> u64 {
        header::pool_size(self.space())
    }

    /// Flushes the file to stable storage (`msync`): the power-loss point on
    /// media without `MAP_SYNC`.
    pub fn sync(&self) -> Result<()> {
        self.space().sync()
    }

    /// Closes cleanly: saves the index and free lists and sets the clean
    /// flag, so the next open is instant.
    pub fn close(mut self) -> Result<()> {
        self.close_inner()
    }

    /// Closes cleanly and hands back the space (tests and tools that reopen
    /// the same bytes).
    pub fn close_into_space(mut self) -> Result<Arc<S>> {
        self.close_inner()?;
        Ok(self.space_arc().clone())
    }

    fn close_inner(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        if !self.space().writable() {
            return Ok(());
        }
        // Let deferred frees run where they can; unreclaimed ones are saved as free.
        with_tree!(self, t => recovery::save_clean(t), h => h.close_clean())
    }
}

impl<S: Space> Drop for Db<S> {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

/// A range iterator over a pool of any engine.
pub enum Iter<S: Space> {
    Nv(RangeIter<S, Nv>),
    Isle(RangeIter<S, Isle>),
    Hash(HashIter<S>),
}

/// As an `Iterator` of pairs, an `Iter` ends early at a damaged leaf and
/// keeps the error ([`Iter::error`]); [`Iter::checked`] turns it into an
/// iterator of `Result`s that yields that error once, then stops.
impl<S: Space> Iterator for Iter<S> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Nv(i) => i.next(),
            Iter::Isle(i) => i.next(),
            Iter::Hash(i) => i.next(),
        }
    }
}

impl<S: Space> Iter<S> {
    /// The damage that ended the iteration early, if any.
    pub fn error(&self) -> Option<&Error> {
        match self {
            Iter::Nv(i) => i.error(),
            Iter::Isle(i) => i.error(),
            Iter::Hash(_) => None,
        }
    }

    /// The next pair, or the damage that stops the iteration (once).
    pub fn next_checked(&mut self) -> Option<Result<(Vec<u8>, Vec<u8>)>> {
        match self {
            Iter::Nv(i) => i.next_checked(),
            Iter::Isle(i) => i.next_checked(),
            Iter::Hash(i) => i.next().map(Ok),
        }
    }

    /// This iterator as one of `Result`s: every pair, then at most one
    /// [`Error::Corrupt`] naming the damaged leaf, then nothing.
    pub fn checked(self) -> CheckedIter<S> {
        CheckedIter(self)
    }
}

/// See [`Iter::checked`].
pub struct CheckedIter<S: Space>(Iter<S>);

impl<S: Space> Iterator for CheckedIter<S> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_checked()
    }
}

pub(crate) fn owned(b: RB<&impl AsRef<[u8]>>) -> RB<Vec<u8>> {
    match b {
        RB::Included(k) => RB::Included(k.as_ref().to_vec()),
        RB::Excluded(k) => RB::Excluded(k.as_ref().to_vec()),
        RB::Unbounded => RB::Unbounded,
    }
}

fn owned_bounds<K: AsRef<[u8]>, R: RangeBounds<K>>(r: &R) -> (RB<Vec<u8>>, RB<Vec<u8>>) {
    (owned(r.start_bound()), owned(r.end_bound()))
}

/// `[prefix, successor(prefix))`; unbounded above when the prefix is all 0xff.
pub fn prefix_bounds(prefix: &[u8]) -> (RB<Vec<u8>>, RB<Vec<u8>>) {
    let mut end = prefix.to_vec();
    while let Some(&b) = end.last() {
        if b == 0xff {
            end.pop();
        } else {
            *end.last_mut().unwrap() += 1;
            return (RB::Included(prefix.to_vec()), RB::Excluded(end));
        }
    }
    (RB::Included(prefix.to_vec()), RB::Unbounded)
}

/// Path of a pool for messages.
pub fn display_path(p: &Path) -> PathBuf {
    p.to_path_buf()
}
