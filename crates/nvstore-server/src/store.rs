//! Every engine access of the server goes through this module: the engine's
//! snapshots and snapshot-isolation transactions (NV-Tree §6.1.1), plus the
//! [`Kv`] trait the commands are written against.
//!
//! - Reads outside MULTI run on a [`Snapshot`]: a stable view, so a
//!   multi-key read (HGETALL, ZRANGE, SCAN) never sees half a commit.
//! - Each write command runs in a [`Txn`]: reads at its start snapshot plus
//!   its own writes, commit all-or-nothing (also across crashes), first
//!   committer wins. A read-modify-write command that loses a race gets
//!   [`Error::Conflict`] and is re-run from a fresh snapshot, so INCR and the
//!   like are atomic against other clients.
//! - WATCH is `Txn::watch(key, ts)` with the commit timestamp seen at WATCH.

use std::ops::Bound;
use std::path::Path;

use nvstore::{Db, Options};
use nvstore_asym::{RemoteOptions, RemoteSpace, SpaceOptions, TcpTransport};

use crate::config::RemotePool;
use crate::space::ServerSpace;

pub use nvstore::WriteBatch;

/// A stable read view.
pub type Snapshot<'a> = nvstore::Snapshot<'a, ServerSpace>;
/// A snapshot-isolation transaction.
pub type Txn<'a> = nvstore::Txn<'a, ServerSpace>;

/// Engine errors, with the transaction outcome the server acts on apart.
#[derive(Debug)]
pub enum Error {
    Engine(nvstore::Error),
    /// A watched key changed, or a write-write conflict: re-run or give up.
    Conflict,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Engine(e) => write!(f, "{e}"),
            Error::Conflict => write!(f, "transaction conflict"),
        }
    }
}

impl From<nvstore::Error> for Error {
    fn from(e: nvstore::Error) -> Self {
        match e {
            nvstore::Error::Conflict => Error::Conflict,
            e => Error::Engine(e),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The server's handle on an open pool.
pub struct Store {
    db: Db<ServerSpace>,
    /// The back-end's front-end, when the pool is remote.
    remote: Option<RemoteSpace>,
}

impl Store {
    /// Opens (creating if missing) the pool; recovery runs inside. The
    /// pool must keep versions (nv leaves): every command runs on
    /// snapshots and transactions.
    ///
    /// An existing pool is first opened read-only and every leaf validated
    /// (one pass, no collation): a damaged pool is refused before anything
    /// is written to it, and a scan never stops early at damage.
    pub fn open(path: &Path, opts: Options) -> Result<Store> {
        if path.exists() && !opts.read_only {
            let ro = Options {
                read_only: true,
                create: false,
                adaptive: nvstore::Adaptive::Off,
                ..opts.clone()
            };
            let db = Db::open_file_as(path, ro, ServerSpace::File)?;
            db.validate()?;
        }
        let db = Db::open_file_as(path, opts, ServerSpace::File)?;
        db.supports_versions()?;
        Ok(Store { db, remote: None })
    }

    /// Opens (creating with `size` bytes of the back-end's data area if
    /// missing) the pool on an AsymNVM back-end; a writer that died there
    /// is recovered first (its logged operations re-executed once).
    pub fn open_remote(r: &RemotePool, size: u64, opts: Options) -> Result<Store> {
        let io = |e: nvstore_asym::Error| {
            Error::Engine(nvstore::Error::Io {
                path: format!("asym:{}", r.addr).into(),
                source: std::io::Error::other(e.to_string()),
            })
        };
        let t = TcpTransport::connect(r.addr).map_err(|e| io(e.into()))?;
        let so = SpaceOptions {
            remote: RemoteOptions {
                mode: r.mode,
                batch: r.batch,
                cache_bytes: r.cache as usize,
                ..RemoteOptions::default()
            },
            name: r.name.clone(),
            size,
            ..SpaceOptions::default()
        };
        let o = nvstore_asym::open_db_as(t, &so, &opts, ServerSpace::Remote).map_err(io)?;
        o.db.validate()?;
        o.db.supports_versions()?;
        Ok(Store {
            db: o.db,
            remote: Some(o.space),
        })
    }

    /// The engine, for statistics.
    pub fn db(&self) -> &Db<ServerSpace> {
        &self.db
    }

    /// Closes the pool cleanly (the next open is instant); a remote pool
    /// sends what is left and releases the back-end's writer lock.
    pub fn close(self) -> Result<()> {
        self.db.close()?;
        if let Some(r) = self.remote {
            r.close().map_err(|e| {
                Error::Engine(nvstore::Error::Io {
                    path: r.path().into(),
                    source: std::io::Error::other(e.to_string()),
                })
            })?;
        }
        Ok(())
    }

    pub fn snapshot(&self) -> Snapshot<'_> {
        self.db.snapshot().expect("an nv pool, checked at open")
    }

    pub fn begin(&self) -> Txn<'_> {
        self.db.begin().expect("an nv pool, checked at open")
    }

    /// Runs `f` in a transaction and commits it, retrying on conflict.
    pub fn transaction<T>(&self, f: impl FnMut(&mut Txn<'_>) -> nvstore::Result<T>) -> Result<T> {
        Ok(self.db.transaction(f)?)
    }

    /// Applies blind writes atomically; returns the commit timestamp.
    pub fn write_batch(&self, batch: WriteBatch) -> Result<u64> {
        Ok(self.db.write_batch(batch)?)
    }

    /// The newest commit timestamp visible now.
    pub fn last_commit_ts(&self) -> u64 {
        self.db.last_commit_ts()
    }
}

impl Store {
    /// Runs `f` as a one-key read-modify-write of `key` (see
    /// [`OneKey`]): `f` gets a view that holds `key`'s newest value and
    /// records the command's write of it, and the engine commits that
    /// write under the leaf lock it read under ([`Db::write_one`]):
    /// atomic, durable before this returns, without a snapshot or a
    /// conflict. `None` when `f` touched another key (the command needs a
    /// real transaction; nothing was written).
    pub fn write_one<T>(&self, key: &[u8], mut f: impl FnMut(&mut OneKey<'_>) -> T) -> Result<Option<T>> {
        Ok(self.db.write_one(key, |cur| {
            let mut view = OneKey {
                key,
                cur,
                write: None,
                escaped: std::cell::Cell::new(false),
            };
            let r = f(&mut view);
            match (view.escaped.get(), view.write) {
                (true, _) => (nvstore::OneWrite::Keep, None),
                (false, w) => (w.unwrap_or(nvstore::OneWrite::Keep), Some(r)),
            }
        })?)
    }
}

/// The view of a command run by [`Store::write_one`]: reads and writes of
/// its one key; any other key or a scan marks it escaped (and answers
/// [`Error::Conflict`] or nothing), and its result is thrown away.
pub struct OneKey<'a> {
    key: &'a [u8],
    cur: Option<&'a [u8]>,
    write: Option<nvstore::OneWrite>,
    escaped: std::cell::Cell<bool>,
}

impl OneKey<'_> {
    /// The key's value as the command sees it: its own write, else the stored one.
    fn value(&self) -> Option<&[u8]> {
        match &self.write {
            Some(nvstore::OneWrite::Put(v)) => Some(v),
            Some(nvstore::OneWrite::Delete) => None,
            Some(nvstore::OneWrite::Keep) | None => self.cur,
        }
    }

    /// Marks the command as one that needs a real transaction.
    fn escape(&self) -> Error {
        self.escaped.set(true);
        Error::Conflict
    }

    fn other(&self, k: &[u8]) -> bool {
        k != self.key
    }
}

impl Kv for OneKey<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        if self.other(k) {
            return Err(self.escape());
        }
        Ok(self.value().map(<[u8]>::to_vec))
    }

    fn get_with(&self, k: &[u8], f: &mut dyn FnMut(&[u8])) -> Result<bool> {
        if self.other(k) {
            return Err(self.escape());
        }
        Ok(self.value().map(f).is_some())
    }

    fn put(&mut self, k: &[u8], v: &[u8]) -> Result<()> {
        self.put_owned(k, v.to_vec())
    }

    fn put_owned(&mut self, k: &[u8], v: Vec<u8>) -> Result<()> {
        if self.other(k) {
            return Err(self.escape());
        }
        self.write = Some(nvstore::OneWrite::Put(v));
        Ok(())
    }

    fn delete(&mut self, k: &[u8]) -> Result<()> {
        if self.other(k) {
            return Err(self.escape());
        }
        self.write = Some(nvstore::OneWrite::Delete);
        Ok(())
    }

    fn scan<'s>(
        &'s self,
        _lo: Bound<Vec<u8>>,
        _hi: Bound<Vec<u8>>,
        _rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's> {
        self.escape();
        Box::new(std::iter::empty())
    }
}

/// A read view for a command that reads one user key: its first point read
/// goes straight to the newest committed state (no snapshot registration,
/// no wait for writers in flight; every published element is durable), and
/// only a second read or a scan pins a snapshot, which serves every read
/// after it. A GET, an HGET or an HGETALL of a small hash is one point read.
///
/// The first read (a command's metadata) and the snapshot may be at
/// different instants; the commands read the metadata first and only take
/// the type and the layout from it, so the reply is still one the key had
/// at some instant during the command.
pub struct PointView<'a> {
    store: &'a Store,
    first_done: std::cell::Cell<bool>,
    snap: std::cell::OnceCell<Snapshot<'a>>,
}

impl<'a> PointView<'a> {
    pub fn new(store: &'a Store) -> Self {
        PointView {
            store,
            first_done: std::cell::Cell::new(false),
            snap: std::cell::OnceCell::new(),
        }
    }

    fn snap(&self) -> &Snapshot<'a> {
        self.snap.get_or_init(|| self.store.snapshot())
    }
}

impl Kv for PointView<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        if self.first_done.replace(true) {
            Kv::get(self.snap(), k)
        } else {
            Ok(self.store.db.get(k)?)
        }
    }

    fn get_with(&self, k: &[u8], f: &mut dyn FnMut(&[u8])) -> Result<bool> {
        if self.first_done.replace(true) {
            Kv::get_with(self.snap(), k, f)
        } else {
            Ok(self.store.db.get_with(k, f)?.is_some())
        }
    }

    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's> {
        self.first_done.set(true);
        self.snap().scan(lo, hi, rev)
    }
}

/// What the commands need from a snapshot or a transaction.
pub trait Kv {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>>;
    /// [`Kv::get`] lending the value to `f` in place (no copy); false,
    /// without calling `f`, when `k` has no value. `f` runs inside the
    /// engine's read: keep it short.
    fn get_with(&self, k: &[u8], f: &mut dyn FnMut(&[u8])) -> Result<bool>;
    /// Writes; a read-only view (snapshot, point view) refuses them.
    fn put(&mut self, _k: &[u8], _v: &[u8]) -> Result<()> {
        Err(Error::Engine(nvstore::Error::ReadOnly))
    }
    /// [`Kv::put`] of a value the caller built and gives away: a one-key
    /// write keeps it as is instead of copying it.
    fn put_owned(&mut self, k: &[u8], v: Vec<u8>) -> Result<()> {
        self.put(k, &v)
    }
    fn delete(&mut self, _k: &[u8]) -> Result<()> {
        Err(Error::Engine(nvstore::Error::ReadOnly))
    }
    /// Pairs with keys in `(lo, hi)`, ascending or (`rev`) descending.
    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's>;
}

impl Kv for Snapshot<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(Snapshot::get(self, k)?)
    }

    fn get_with(&self, k: &[u8], f: &mut dyn FnMut(&[u8])) -> Result<bool> {
        Ok(Snapshot::get_with(self, k, f)?.is_some())
    }

    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's> {
        if rev {
            Box::new(self.range_rev((lo, hi)))
        } else {
            Box::new(self.range((lo, hi)))
        }
    }
}

impl Kv for Txn<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(Txn::get(self, k)?)
    }

    fn get_with(&self, k: &[u8], f: &mut dyn FnMut(&[u8])) -> Result<bool> {
        Ok(Txn::get_with(self, k, f)?.is_some())
    }

    fn put(&mut self, k: &[u8], v: &[u8]) -> Result<()> {
        Ok(Txn::put(self, k, v)?)
    }

    fn delete(&mut self, k: &[u8]) -> Result<()> {
        Ok(Txn::delete(self, k)?)
    }

    fn scan<'s>(
        &'s self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 's> {
        let v = self.range((lo, hi));
        if rev {
            Box::new(v.into_iter().rev())
        } else {
            Box::new(v.into_iter())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &tempfile::TempDir) -> Store {
        Store::open(&dir.path().join("p.nvs"), Options::default()).unwrap()
    }

    #[test]
    fn txn_reads_own_writes_and_commits_all() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        let mut t = s.begin();
        t.put(b"a", b"1").unwrap();
        t.put(b"b", b"2").unwrap();
        t.delete(b"a").unwrap();
        assert_eq!(Kv::get(&t, b"a").unwrap(), None);
        assert_eq!(
            t.scan(Bound::Included(b"a".to_vec()), Bound::Unbounded, false).count(),
            1
        );
        t.commit().unwrap();
        assert_eq!(s.db().get(b"b").unwrap(), Some(b"2".to_vec()));
    }

    #[test]
    fn watch_conflicts_after_a_newer_commit() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        let since = s.last_commit_ts();
        let mut b = WriteBatch::new();
        b.put(b"k", b"v");
        s.write_batch(b).unwrap();
        let mut t = s.begin();
        t.watch(b"k", since);
        t.put(b"x", b"y").unwrap();
        assert!(matches!(t.commit().map_err(Error::from), Err(Error::Conflict)));
        let mut t = s.begin();
        t.watch(b"k", s.last_commit_ts());
        t.put(b"x", b"y").unwrap();
        assert!(t.commit().is_ok());
    }

    #[test]
    fn point_view_pins_only_after_its_first_read() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        s.db().put(b"a", b"1").unwrap();
        let v = PointView::new(&s);
        assert_eq!(Kv::get(&v, b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(s.db().stat().snapshots, 0, "one point read pins nothing");
        assert_eq!(Kv::get(&v, b"b").unwrap(), None);
        assert_eq!(s.db().stat().snapshots, 1);
        s.db().put(b"b", b"2").unwrap();
        // Later reads stay on the snapshot taken at the second read.
        assert_eq!(Kv::get(&v, b"b").unwrap(), None);
        assert_eq!(v.scan(Bound::Unbounded, Bound::Unbounded, false).count(), 1);
        drop(v);
        assert_eq!(s.db().stat().snapshots, 0);
    }

    #[test]
    fn snapshot_scan_is_stable_while_others_commit() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        s.db().put(b"a", b"1").unwrap();
        let snap = s.snapshot();
        s.db().put(b"b", b"2").unwrap();
        assert_eq!(snap.scan(Bound::Unbounded, Bound::Unbounded, false).count(), 1);
        assert_eq!(s.snapshot().scan(Bound::Unbounded, Bound::Unbounded, true).count(), 2);
    }
}
