//! The engine API (docs/design.md, "Layers"): open a pool, `get/put/delete/range/prefix`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::alloc::Allocator;
use crate::check::{self, CheckReport};
use crate::error::{Error, Result};
use crate::format::header::{self, EngineKind, Header, LeafKind, VERSION};
use crate::hash::engine::{self as hash_engine, HashEngine};
use crate::pmem::{FileSpace, FlushKind, OpenMode, Operation, Space};
use crate::recovery::{self, Recovery, RecoveryKind};
use crate::tree::adaptive::{self, Model, Strategy};
use crate::tree::isle::Isle;
use crate::tree::leaf::LeafFormat as _;
use crate::tree::nv::Nv;
use crate::tree::{SplitHook, Tree, TreeStats};

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
    /// Map every page of the pool when it is opened or grown
    /// (`MAP_POPULATE`), instead of on first touch: opening takes longer
    /// (the kernel maps the whole pool up front), and no write or read
    /// later stops for a page fault. For servers that want steady latency from
    /// the first request, and benchmarks that time the engine rather than
    /// the kernel's first-touch faults. Not stored in the pool.
    pub populate: bool,
    /// Workload-adaptive node sizing (NV-Tree §5): which strategy picks
    /// the size of the leaves that replace a full one. Not stored in the
    /// pool; each open chooses.
    pub adaptive: Strategy,
    /// Keep the hash engine's ordered index (KVS B+Tree index §2): a B+-tree
    /// in DRAM over the keys, for range and prefix queries. Off, a hash
    /// pool answers point operations only (ranges and prefixes fail with
    /// [`Error::Unsupported`]) and saves the index's upkeep. Not stored in
    /// the pool; each open chooses. Tree pools ignore it.
    pub ordered_index: bool,
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
            populate: false,
            adaptive: DEFAULT_ADAPTIVE,
            ordered_index: true,
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

mod read;
mod stat;

pub(crate) use read::owned;
pub use read::{prefix_bounds, CheckedIter, Iter};
pub use stat::{LeafInfo, Stat};

/// An open pool.
pub struct Db<S: Space = FileSpace> {
    engine: Engine<S>,
    /// The pool file's path: the engine reports errors without it, and
    /// `Db` attaches it once, at open and in its public methods.
    pub(crate) path: Arc<Path>,
    header: Header,
    recovery: Recovery,
    /// Whether the pool had been shut down cleanly when it was opened.
    was_clean: bool,
    closed: bool,
}

impl Db<FileSpace> {
    /// Opens the pool at `path`, creating it if missing and `opts.create`.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Db<FileSpace>> {
        Db::open_file_as(path.as_ref(), opts, |f| f)
    }
}

impl<S: Space> Db<S> {
    /// [`Db::open`] on a pool file whose mapping `wrap` turns into the space
    /// the engine runs on (a server that runs on files or on other spaces
    /// through one space type).
    pub fn open_file_as(path: &Path, opts: Options, wrap: impl Fn(FileSpace) -> S) -> Result<Db<S>> {
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
            let db = Db::create_file(path, size, &opts, &wrap)?;
            db.start_adaptive(opts.adaptive, opts.latency_ns);
            return Ok(db);
        }
        let fo = crate::pmem::file::FileOptions {
            mode,
            flush: opts.flush,
            latency_ns: opts.latency_ns,
            max_size: opts.max_size,
            force_shared: opts.force_shared,
            populate: opts.populate,
            name: None,
        };
        let space = FileSpace::open(path, &fo)?;
        let db = Db::open_space_with(wrap(space), path, opts.ordered_index)?;
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
            let cached = Model::decode(header::calibration(space), latency_ns);
            let model = match cached {
                Some(m) => m,
                // A pool too full for the scratch block still opens.
                None if space.writable() => match adaptive::calibrate(space, self.alloc()) {
                    Ok(m) => {
                        let [a, b] = m.encode(latency_ns);
                        header::set_calibration(space, [a, b]);
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
    fn create_file(path: &Path, size: u64, opts: &Options, wrap: &impl Fn(FileSpace) -> S) -> Result<Db<S>> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".creating-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let fo = crate::pmem::file::FileOptions {
            mode: OpenMode::Create { size },
            flush: opts.flush,
            latency_ns: opts.latency_ns,
            max_size: opts.max_size,
            force_shared: opts.force_shared,
            populate: opts.populate,
            name: Some(path.to_path_buf()),
        };
        let space = FileSpace::open(&tmp, &fo)?;
        let db = match Db::create_in(wrap(space), path, opts) {
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
}

impl Db<FileSpace> {
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
    /// Writes a fresh pool into a zeroed space and opens it (`path` names
    /// it in errors).
    pub fn create_in(space: S, path: &Path, opts: &Options) -> Result<Db<S>> {
        Db::create_unnamed(space, path, opts).map_err(|e| e.at(path))
    }

    fn create_unnamed(space: S, path: &Path, opts: &Options) -> Result<Db<S>> {
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
        let alloc = Arc::new(Allocator::fresh(CHUNK_SIZE, CHUNK_SIZE, size));
        let t = std::time::Instant::now();
        if opts.engine == EngineKind::Hash {
            // The table first, then the header: a pool whose creation was
            // cut short is "not a pool" or has a whole, empty table.
            let engine = HashEngine::create(space.clone(), alloc, opts.ordered_index)?;
            h.create(&*space, size);
            return Ok(Db {
                engine: Engine::Hash(Arc::new(engine)),
                path: path.into(),
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
        ) -> Result<Arc<Tree<S, L>>> {
            let leaf = Tree::<S, L>::create_first_leaf(&*space, &alloc, node_size)?;
            let entries = vec![crate::tree::index::Entry {
                max: crate::tree::index::Bound::PosInf,
                leaf: Arc::new(crate::tree::Leaf::<L>::built(leaf, node_size, 0)),
            }];
            Ok(Arc::new(Tree::assemble(space, alloc, entries, node_size, 0, 0)))
        }
        let ns = opts.node_size as u64;
        let engine = match opts.leaf {
            LeafKind::Nv => Engine::Nv(fresh(space, alloc, ns)?),
            LeafKind::Isle => Engine::Isle(fresh(space, alloc, ns)?),
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
            path: path.into(),
            header: h,
            recovery,
            was_clean: true,
            closed: false,
        })
    }

    /// Opens an existing pool in `space` (`path` names it in messages).
    pub fn open_space(space: S, path: &Path) -> Result<Db<S>> {
        Db::open_space_with(space, path, true)
    }

    /// [`Db::open_space`], with or without the hash engine's ordered index
    /// ([`Options::ordered_index`]).
    fn open_space_with(space: S, path: &Path, ordered_index: bool) -> Result<Db<S>> {
        Db::open_unnamed(space, path, ordered_index).map_err(|e| e.at(path))
    }

    fn open_unnamed(space: S, path: &Path, ordered_index: bool) -> Result<Db<S>> {
        let mut h = Header::read(&space)?;
        let was_clean = header::clean_state(&space) != 0;
        let space = Arc::new(space);
        let (engine, recovery) = match (h.engine, h.leaf_format) {
            (EngineKind::Hash, _) => {
                let (e, r) = HashEngine::open(space.clone(), &h, ordered_index)?;
                (Engine::Hash(Arc::new(e)), r)
            }
            (EngineKind::Tree, LeafKind::Nv) => {
                let (t, r) = recovery::open_tree::<S, Nv>(space.clone(), &h)?;
                (Engine::Nv(Arc::new(t)), r)
            }
            (EngineKind::Tree, LeafKind::Isle) => {
                let (t, r) = recovery::open_tree::<S, Isle>(space.clone(), &h)?;
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
            path: path.into(),
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

    /// `r` with the pool's path attached to its error ([`Error::at`]): how
    /// every public method reports what the engine found.
    #[inline]
    pub(crate) fn named<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| e.at(&self.path))
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.space().writable() {
            Ok(())
        } else {
            Err(Error::ReadOnly)
        }
    }

    /// Stores `value` under `key`; durable when it returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.named(self.space().logged(Operation::Put { key, value }, || {
            self.writable()?;
            with_tree!(self, t => t.put(key, value), h => h.put(key, value))
        }))
    }

    /// Stores every pair of `pairs`, each as [`Db::put`] would, and
    /// returns one result per pair, in order; every put that succeeded is
    /// durable when this returns. It is not a transaction: each put is
    /// atomic on its own, and a crash before this returns may keep any of
    /// them. On a hash pool the puts are made durable in groups of up to
    /// 64 (one fence for all their slots, one for all their bucket
    /// headers), which is what `AsyncDb`'s workers use for the puts they
    /// take off the queue together; elsewhere (tree pools, a remote space
    /// that logs each operation) they run one by one.
    pub fn put_many(&self, pairs: &[(&[u8], &[u8])]) -> Vec<Result<()>> {
        match &self.engine {
            Engine::Hash(h) if pairs.len() > 1 && self.space().mapping() != crate::pmem::MappingKind::Remote => {
                if self.writable().is_err() {
                    return pairs.iter().map(|_| self.named(self.writable())).collect();
                }
                h.put_group(pairs).into_iter().map(|r| self.named(r)).collect()
            }
            _ => pairs.iter().map(|(k, v)| self.put(k, v)).collect(),
        }
    }

    /// Replaces the value of `key` only if it exists (`SET key value XX`):
    /// returns whether it did; writes nothing when the key is absent.
    /// Durable when it returns. On a tree pool the check and the write
    /// are one descent of the tree, cheaper than `get` then `put`.
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.named(self.space().logged(Operation::Update { key, value }, || {
            self.writable()?;
            with_tree!(self, t => t.update(key, value), h => h.update(key, value))
        }))
    }

    /// Removes `key`; returns whether it was there. Durable when it returns.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.named(self.space().logged(Operation::Delete { key }, || {
            self.writable()?;
            with_tree!(self, t => t.delete(key), h => h.delete(key))
        }))
    }

    /// Checks every leaf the index names against its format's rules
    /// (sizes, counts, element metadata, blob references, chain links),
    /// without collating any: cheaper than [`Db::check`], and enough to
    /// know no read of the pool will meet damage. The first damage found
    /// is an [`Error::Corrupt`] with its offset; from then on this `Db`
    /// refuses writes.
    pub fn validate(&self) -> Result<()> {
        self.named(with_tree!(self, t => t.validate_leaves(), h => h.validate()))
    }

    /// Verifies every invariant without writing (`nvstore check`).
    pub fn check(&self) -> CheckReport {
        with_tree!(self, t => check::check(t, &self.header, &self.path), h => h.check(&self.header, &self.path))
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
        self.named(self.space().sync())
    }

    /// Closes cleanly: saves the index and free lists and sets the clean
    /// flag, so the next open is instant.
    pub fn close(mut self) -> Result<()> {
        let r = self.close_inner();
        self.named(r)
    }

    /// Closes cleanly and hands back the space (tests and tools that reopen
    /// the same bytes).
    pub fn close_into_space(mut self) -> Result<Arc<S>> {
        let r = self.close_inner();
        self.named(r)?;
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

/// Path of a pool for messages.
pub fn display_path(p: &Path) -> PathBuf {
    p.to_path_buf()
}
