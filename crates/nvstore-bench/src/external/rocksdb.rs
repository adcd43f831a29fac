//! RocksDB (the system library, through its C API `rocksdb/c.h`) as a
//! benchmark engine: the LSM store a user would pick instead of a
//! persistent-memory tree. Built only with the `rocksdb` cargo feature.
//!
//! Layout: one default column family, keys the 8 big-endian bytes of the
//! u64 (so RocksDB's bytewise order is key order), values the 8
//! little-endian bytes; RocksDB's default options otherwise. The database
//! lives in a fresh directory under `--pool-dir` (/dev/shm by default:
//! DRAM-backed, so `fdatasync` is cheap), removed when the engine is
//! dropped.
//!
//! - `rocksdb`: every insert, update and delete is one write with
//!   `WriteOptions::sync = true`: appended to the write-ahead log and the
//!   log synced before it returns (one durable write per operation, like
//!   every engine here); reads go to the memtable and SST files;
//! - `rocksdb-batch`: writes are buffered and written as one synced
//!   `WriteBatch` every [`BATCH`] operations (as `lmdb-batch`), so an
//!   operation is durable only once its batch is written (reads see
//!   buffered writes).
//!
//! Why a hand-written binding of a dozen C functions rather than the
//! `rocksdb` crate: `librocksdb-sys` generates its bindings with bindgen
//! (libclang at build time) from the RocksDB headers it vendors, a newer
//! release than Debian's `librocksdb-dev` (7.8), and otherwise compiles
//! RocksDB's C++ source (minutes on two cores). The functions used here
//! have had these signatures since RocksDB 5, so linking the system
//! library (`ROCKSDB_LIB_DIR` to pick another, see `build.rs`) builds in
//! seconds and matches any version the system has.
//!
//! RocksDB writes through its own file I/O, not nvstore's `pmem` layer, so
//! its flushes and fences are not counted (reported as 0).

#![allow(
    unsafe_code,
    reason = "bindings to RocksDB's C API: every call crosses the FFI boundary"
)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::ExternalKv;
use crate::engine::BenchIndex;
use nvstore::{Error, Result};

/// Operations per synced write of `rocksdb-batch` (as `lmdb-batch`).
pub const BATCH: usize = 64;

static SEQ: AtomicU64 = AtomicU64::new(0);

mod ffi {
    use std::ffi::{c_char, c_int, c_uchar, c_void};

    // Opaque handles of `rocksdb/c.h`.
    #[repr(C)]
    pub struct Db {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct Options {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct WriteOptions {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct ReadOptions {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct WriteBatch {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct Iter {
        _private: [u8; 0],
    }

    #[link(name = "rocksdb")]
    extern "C" {
        pub fn rocksdb_options_create() -> *mut Options;
        pub fn rocksdb_options_destroy(o: *mut Options);
        pub fn rocksdb_options_set_create_if_missing(o: *mut Options, v: c_uchar);
        pub fn rocksdb_open(o: *const Options, name: *const c_char, err: *mut *mut c_char) -> *mut Db;
        pub fn rocksdb_close(db: *mut Db);
        pub fn rocksdb_writeoptions_create() -> *mut WriteOptions;
        pub fn rocksdb_writeoptions_destroy(o: *mut WriteOptions);
        pub fn rocksdb_writeoptions_set_sync(o: *mut WriteOptions, v: c_uchar);
        pub fn rocksdb_readoptions_create() -> *mut ReadOptions;
        pub fn rocksdb_readoptions_destroy(o: *mut ReadOptions);
        pub fn rocksdb_put(
            db: *mut Db,
            o: *const WriteOptions,
            key: *const c_char,
            klen: usize,
            val: *const c_char,
            vlen: usize,
            err: *mut *mut c_char,
        );
        pub fn rocksdb_delete(
            db: *mut Db,
            o: *const WriteOptions,
            key: *const c_char,
            klen: usize,
            err: *mut *mut c_char,
        );
        pub fn rocksdb_write(db: *mut Db, o: *const WriteOptions, b: *mut WriteBatch, err: *mut *mut c_char);
        pub fn rocksdb_get(
            db: *mut Db,
            o: *const ReadOptions,
            key: *const c_char,
            klen: usize,
            vlen: *mut usize,
            err: *mut *mut c_char,
        ) -> *mut c_char;
        pub fn rocksdb_writebatch_create() -> *mut WriteBatch;
        pub fn rocksdb_writebatch_destroy(b: *mut WriteBatch);
        pub fn rocksdb_writebatch_count(b: *mut WriteBatch) -> c_int;
        pub fn rocksdb_writebatch_put(
            b: *mut WriteBatch,
            key: *const c_char,
            klen: usize,
            val: *const c_char,
            vlen: usize,
        );
        pub fn rocksdb_writebatch_delete(b: *mut WriteBatch, key: *const c_char, klen: usize);
        pub fn rocksdb_create_iterator(db: *mut Db, o: *const ReadOptions) -> *mut Iter;
        pub fn rocksdb_iter_destroy(it: *mut Iter);
        pub fn rocksdb_iter_valid(it: *const Iter) -> c_uchar;
        pub fn rocksdb_iter_seek(it: *mut Iter, key: *const c_char, klen: usize);
        pub fn rocksdb_iter_next(it: *mut Iter);
        pub fn rocksdb_iter_key(it: *const Iter, klen: *mut usize) -> *const c_char;
        pub fn rocksdb_iter_value(it: *const Iter, vlen: *mut usize) -> *const c_char;
        pub fn rocksdb_iter_get_error(it: *const Iter, err: *mut *mut c_char);
        pub fn rocksdb_free(p: *mut c_void);
    }
}

/// Turns a C API error out-parameter into a message (and frees it).
fn take_err(err: *mut c_char) -> std::result::Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null error from the C API is a NUL-terminated string
    // allocated by RocksDB, which we own and free with `rocksdb_free`.
    let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    // SAFETY: as above; freed once.
    unsafe { ffi::rocksdb_free(err as *mut c_void) };
    Err(msg)
}

/// The 8 bytes the C API returned at `p` (keys and values are all 8 bytes).
fn bytes8(p: *const c_char, len: usize, what: &str) -> [u8; 8] {
    assert_eq!(len, 8, "rocksdb: {what} of {len} bytes");
    let mut b = [0u8; 8];
    // SAFETY: the C API returned `len` (= 8) readable bytes at `p`.
    unsafe { ptr::copy_nonoverlapping(p as *const u8, b.as_mut_ptr(), 8) };
    b
}

/// A RocksDB database as a benchmark engine.
pub struct RocksDb {
    db: *mut ffi::Db,
    write: *mut ffi::WriteOptions,
    read: *mut ffi::ReadOptions,
    dir: PathBuf,
    batched: bool,
    /// `rocksdb-batch`: key -> Some(value) / None (deleted), not yet written.
    pending: Mutex<HashMap<u64, Option<u64>>>,
}

// SAFETY: a `rocksdb_t` is safe for concurrent use from many threads (the
// C++ `DB` is); the read and write options are only read after `create`.
unsafe impl Send for RocksDb {}
// SAFETY: as above.
unsafe impl Sync for RocksDb {}

impl RocksDb {
    /// A fresh database in a new directory under `parent`.
    pub fn create(parent: &Path, batched: bool) -> Result<RocksDb> {
        let dir = parent.join(format!(
            "nvstore-bench-rocksdb-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let name = CString::new(dir.to_string_lossy().as_bytes())
            .map_err(|_| Error::InvalidOption(format!("rocksdb: path {} has a NUL byte", dir.display())))?;
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: plain constructor calls; `name` outlives `rocksdb_open`,
        // the options are destroyed after it (RocksDB copies them), and
        // `err` is a valid out-parameter.
        let (db, write, read) = unsafe {
            let opts = ffi::rocksdb_options_create();
            ffi::rocksdb_options_set_create_if_missing(opts, 1);
            let db = ffi::rocksdb_open(opts, name.as_ptr(), &mut err);
            ffi::rocksdb_options_destroy(opts);
            let write = ffi::rocksdb_writeoptions_create();
            ffi::rocksdb_writeoptions_set_sync(write, 1);
            (db, write, ffi::rocksdb_readoptions_create())
        };
        let engine = RocksDb {
            db,
            write,
            read,
            dir,
            batched,
            pending: Mutex::new(HashMap::new()),
        };
        take_err(err).map_err(|e| Error::InvalidOption(format!("rocksdb: open: {e}")))?;
        if db.is_null() {
            return Err(Error::InvalidOption("rocksdb: open returned no database".into()));
        }
        Ok(engine)
    }

    fn committed(&self, key: u64) -> Option<u64> {
        let k = key.to_be_bytes();
        let mut len = 0usize;
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: `self.db` and `self.read` are live until drop; `k` is 8
        // readable bytes; `len` and `err` are valid out-parameters.
        let v = unsafe { ffi::rocksdb_get(self.db, self.read, k.as_ptr() as *const c_char, 8, &mut len, &mut err) };
        take_err(err).expect("rocksdb get");
        if v.is_null() {
            return None;
        }
        let value = u64::from_le_bytes(bytes8(v, len, "value"));
        // SAFETY: `v` was allocated by RocksDB for us; freed once.
        unsafe { ffi::rocksdb_free(v as *mut c_void) };
        Some(value)
    }
}

impl ExternalKv for RocksDb {
    /// One write: synced on its own, or into the batch.
    fn write(&self, key: u64, value: Option<u64>) {
        let mut err: *mut c_char = ptr::null_mut();
        if !self.batched {
            let k = key.to_be_bytes();
            // SAFETY: live handles, 8-byte buffers, valid out-parameter.
            unsafe {
                match value {
                    Some(v) => {
                        let v = v.to_le_bytes();
                        ffi::rocksdb_put(
                            self.db,
                            self.write,
                            k.as_ptr() as *const c_char,
                            8,
                            v.as_ptr() as *const c_char,
                            8,
                            &mut err,
                        )
                    }
                    None => ffi::rocksdb_delete(self.db, self.write, k.as_ptr() as *const c_char, 8, &mut err),
                }
            }
            take_err(err).expect("rocksdb write");
            return;
        }
        let mut p = self.pending.lock();
        p.insert(key, value);
        if p.len() >= BATCH {
            // SAFETY: the batch is created, filled from 8-byte buffers
            // (copied into it), written with the live handles and destroyed.
            unsafe {
                let b = ffi::rocksdb_writebatch_create();
                for (k, v) in p.drain() {
                    let k = k.to_be_bytes();
                    match v {
                        Some(v) => {
                            let v = v.to_le_bytes();
                            ffi::rocksdb_writebatch_put(
                                b,
                                k.as_ptr() as *const c_char,
                                8,
                                v.as_ptr() as *const c_char,
                                8,
                            )
                        }
                        None => ffi::rocksdb_writebatch_delete(b, k.as_ptr() as *const c_char, 8),
                    }
                }
                debug_assert_eq!(ffi::rocksdb_writebatch_count(b) as usize, BATCH);
                ffi::rocksdb_write(self.db, self.write, b, &mut err);
                ffi::rocksdb_writebatch_destroy(b);
            }
            take_err(err).expect("rocksdb batch write");
        }
    }

    fn lookup(&self, key: u64) -> Option<u64> {
        if self.batched {
            if let Some(&v) = self.pending.lock().get(&key) {
                return v;
            }
        }
        self.committed(key)
    }
}

impl RocksDb {
    /// Up to `n` committed pairs from `start` on, in key order.
    fn range(&self, start: u64, n: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let from = start.to_be_bytes();
        // SAFETY: the iterator is created from the live handles, read only
        // while valid (key and value pointers are used before the next
        // move), and destroyed before returning.
        unsafe {
            let it = ffi::rocksdb_create_iterator(self.db, self.read);
            ffi::rocksdb_iter_seek(it, from.as_ptr() as *const c_char, 8);
            while out.len() < n && ffi::rocksdb_iter_valid(it) != 0 {
                let (mut kl, mut vl) = (0usize, 0usize);
                let k = ffi::rocksdb_iter_key(it, &mut kl);
                let v = ffi::rocksdb_iter_value(it, &mut vl);
                out.push((
                    u64::from_be_bytes(bytes8(k, kl, "key")),
                    u64::from_le_bytes(bytes8(v, vl, "value")),
                ));
                ffi::rocksdb_iter_next(it);
            }
            let mut err: *mut c_char = ptr::null_mut();
            ffi::rocksdb_iter_get_error(it, &mut err);
            ffi::rocksdb_iter_destroy(it);
            take_err(err).expect("rocksdb iterator");
        }
        out
    }
}

impl Drop for RocksDb {
    fn drop(&mut self) {
        // SAFETY: each handle was created in `create` and is destroyed once;
        // no iterator outlives `range`.
        unsafe {
            if !self.db.is_null() {
                ffi::rocksdb_close(self.db);
            }
            ffi::rocksdb_writeoptions_destroy(self.write);
            ffi::rocksdb_readoptions_destroy(self.read);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl BenchIndex for RocksDb {
    fn name(&self) -> &'static str {
        if self.batched {
            "rocksdb-batch"
        } else {
            "rocksdb"
        }
    }
    fn insert(&self, key: u64, value: u64) {
        self.write(key, Some(value));
    }
    fn update(&self, key: u64, value: u64) -> bool {
        self.update_existing(key, value)
    }
    fn delete(&self, key: u64) -> bool {
        self.delete_existing(key)
    }
    fn search(&self, key: u64) -> Option<u64> {
        self.lookup(key)
    }
    fn scan(&self, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        if n == 0 {
            return;
        }
        if !self.batched {
            out.extend(self.range(start, n));
            return;
        }
        // Merge the committed range with the batch, as `lmdb-batch` does:
        // enough committed pairs that buffered deletes cannot leave fewer
        // than `n`, and buffered keys only up to the last committed key
        // read (unless none is left).
        let p = self.pending.lock();
        let want = n.saturating_add(p.len());
        let window = self.range(start, want);
        let bound = if window.len() < want {
            u64::MAX
        } else {
            window.last().map_or(u64::MAX, |&(k, _)| k)
        };
        let mut merged: BTreeMap<u64, Option<u64>> = window.into_iter().map(|(k, v)| (k, Some(v))).collect();
        for (&k, &v) in p.iter().filter(|(&k, _)| k >= start && k <= bound) {
            merged.insert(k, v);
        }
        out.extend(merged.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).take(n));
    }
    fn leaf(&self) -> &'static str {
        "lsm"
    }
}
