//! Where YCSB's operations go: the embedded nvstore pool or a Redis-protocol
//! server. A [`Target`] hands each client thread its own [`Client`].
//!
//! **Embedded** (`--target embedded`): one nvstore `Db` in this process, one
//! key per record (`user<hash>`) whose value is the whole record serialized
//! as `fieldcount` times `{ u32 length (LE) | bytes }` in field order (the
//! field names `field0..` are implied by position). One value per record
//! rather than one key per field because then an insert, a read and each
//! record of a scan are one tree operation each (YCSB's common operations),
//! a record is inserted atomically (one durable put, so a crash never leaves
//! half a record), and it is the same unit as the redis binding's hash per
//! record. The price is the update of one field: a read-modify-write of the
//! ~1 KB value, serialised per record by a striped lock so two threads
//! updating different fields of one record never lose either update.
//! `--engine hash` creates the pool with the hash engine instead of the tree:
//! the same calls, point operations in its persistent hash table and scans
//! (workload E) in its ordered DRAM index.
//!
//! **RESP** (`--target resp://HOST:PORT`): YCSB's redis binding
//! (`site.ycsb.db.RedisClient`): a record is a hash, written with `HMSET key
//! field0 v0 ..`, read with `HGETALL key`, a field updated with `HMSET key
//! fieldN v`; every inserted key is also added to the sorted set `_indices`
//! with score `hash(key)` (Java's `String.hashCode`), and a scan is
//! `ZRANGEBYSCORE _indices hash(start) +inf LIMIT 0 len` followed by
//! `HGETALL` of each key returned.
//!
//! **redis** (`--target redis`): the same client against a `redis-server`
//! this benchmark starts with `appendonly yes`, `appendfsync always`, its
//! files on /dev/shm ([`RedisServer`]), stopped when the run ends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::resp::{Reply, RespConn};
use super::{CoreWorkload, YcsbArgs};
use crate::external::redis_server::RedisServer;
use nvstore::pmem::file::FileOptions;
use nvstore::pmem::{FileSpace, OpenMode};
use nvstore::{Db, EngineKind, Error, LeafKind, Options, Result};

/// One client thread's connection or handle.
pub trait Client: Send {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<()>;
    /// Reads every field; false if the record is absent.
    fn read(&mut self, key: &str) -> Result<bool>;
    /// Writes field number `field`.
    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<()>;
    /// Reads up to `len` records from `start` on; returns how many.
    fn scan(&mut self, start: &str, len: usize) -> Result<usize>;
}

/// A benchmark target.
pub trait Target: Send + Sync {
    fn client(&self) -> Result<Box<dyn Client>>;
    /// As given on the command line.
    fn name(&self) -> String;
    /// How records are stored, for reports.
    fn layout(&self) -> &'static str;
    /// The engine of an embedded pool; `-` for a server.
    fn engine(&self) -> &'static str {
        "-"
    }
}

/// Opens the target named by `args.target`.
pub fn open(args: &YcsbArgs, w: &CoreWorkload) -> Result<Box<dyn Target>> {
    if args.target == "embedded" {
        return Ok(Box::new(Embedded::create(args, w)?));
    }
    if args.engine != EngineKind::Tree {
        return Err(Error::InvalidOption(format!(
            "--engine {} applies to the embedded target only",
            args.engine.as_str()
        )));
    }
    if args.target == "redis" {
        let server = RedisServer::start()?;
        let addr = server.addr().to_string();
        return Ok(Box::new(Resp {
            addr,
            fields: field_names(w.field_count),
            server: Some(server),
        }));
    }
    if let Some(addr) = args.target.strip_prefix("resp://") {
        let addr = addr.trim_end_matches('/');
        // Fail early, before any thread starts, if nobody listens.
        RespConn::connect(addr)?;
        return Ok(Box::new(Resp {
            addr: addr.to_string(),
            fields: field_names(w.field_count),
            server: None,
        }));
    }
    Err(Error::InvalidOption(format!(
        "unknown target '{}' (expected embedded, redis or resp://HOST:PORT)",
        args.target
    )))
}

fn field_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("field{i}")).collect()
}

// ---------------------------------------------------------------- embedded

/// Stripes of the per-record update lock.
const STRIPES: usize = 256;

static POOL_SEQ: AtomicU64 = AtomicU64::new(0);

/// An nvstore pool holding one serialized value per record.
pub struct Embedded {
    db: Arc<Db<FileSpace>>,
    stripes: Arc<Vec<Mutex<()>>>,
    fields: usize,
}

impl Embedded {
    fn create(args: &YcsbArgs, w: &CoreWorkload) -> Result<Embedded> {
        let (path, keep) = match &args.pool {
            Some(p) => (p.clone(), true),
            None => (
                PathBuf::from(format!(
                    "/dev/shm/nvstore-ycsb-{}-{}.pool",
                    std::process::id(),
                    POOL_SEQ.fetch_add(1, Ordering::Relaxed)
                )),
                false,
            ),
        };
        let records = args.records + (args.ops as f64 * w.insert) as u64;
        let record_bytes = (w.field_count * (w.field_length + 4) + 64) as u64;
        let size = (records * record_bytes * 3 / 2).max(64 << 20).next_multiple_of(2 << 20);
        Embedded::create_at(&path, keep, size, args.node_size, args.engine, w.field_count)
    }

    /// A fresh pool of `engine` at `path` (unlinked once mapped unless `keep`).
    pub fn create_at(
        path: &Path,
        keep: bool,
        size: u64,
        node_size: u64,
        engine: EngineKind,
        fields: usize,
    ) -> Result<Embedded> {
        let fo = FileOptions {
            mode: OpenMode::Create { size },
            ..FileOptions::default()
        };
        let space = FileSpace::open(path, &fo)?;
        if !keep {
            let _ = std::fs::remove_file(path);
        }
        let opts = Options {
            node_size: u32::try_from(node_size)
                .map_err(|_| Error::InvalidOption(format!("node size {node_size} is too large")))?,
            leaf: LeafKind::Nv,
            engine,
            size,
            ..Options::default()
        };
        let db = Db::create_in(space, path, &opts)?;
        Ok(Embedded {
            db: Arc::new(db),
            stripes: Arc::new((0..STRIPES).map(|_| Mutex::new(())).collect()),
            fields,
        })
    }

    pub fn db(&self) -> &Db<FileSpace> {
        &self.db
    }
}

impl Target for Embedded {
    fn client(&self) -> Result<Box<dyn Client>> {
        Ok(Box::new(EmbeddedClient {
            db: self.db.clone(),
            stripes: self.stripes.clone(),
            fields: self.fields,
            buf: Vec::new(),
        }))
    }
    fn name(&self) -> String {
        "embedded".into()
    }
    fn layout(&self) -> &'static str {
        "nvstore Db, one serialized value per record"
    }
    fn engine(&self) -> &'static str {
        self.db.engine().as_str()
    }
}

struct EmbeddedClient {
    db: Arc<Db<FileSpace>>,
    stripes: Arc<Vec<Mutex<()>>>,
    fields: usize,
    buf: Vec<u8>,
}

/// `{ u32 len | bytes }` per field.
pub fn encode_record(fields: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    for f in fields {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
}

/// The fields of an encoded record (`None` if it is malformed).
pub fn decode_record(mut b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(super::FIELD_COUNT);
    while !b.is_empty() {
        let n = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        out.push(b.get(4..4 + n)?.to_vec());
        b = &b[4 + n..];
    }
    Some(out)
}

fn corrupt(key: &str) -> Error {
    Error::InvalidOption(format!("ycsb: record {key} does not decode"))
}

impl EmbeddedClient {
    fn stripe(&self, key: &str) -> usize {
        let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        (h % STRIPES as u64) as usize
    }
}

impl Client for EmbeddedClient {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<()> {
        encode_record(fields, &mut self.buf);
        self.db.put(key.as_bytes(), &self.buf)
    }

    fn read(&mut self, key: &str) -> Result<bool> {
        match self.db.get(key.as_bytes())? {
            None => Ok(false),
            Some(v) => {
                let rec = decode_record(&v).ok_or_else(|| corrupt(key))?;
                Ok(rec.len() == self.fields)
            }
        }
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<()> {
        let stripes = self.stripes.clone();
        let _g = stripes[self.stripe(key)].lock();
        let Some(v) = self.db.get(key.as_bytes())? else {
            return Err(Error::InvalidOption(format!("ycsb: update of absent record {key}")));
        };
        let mut rec = decode_record(&v).ok_or_else(|| corrupt(key))?;
        if field >= rec.len() {
            return Err(corrupt(key));
        }
        rec[field] = value.to_vec();
        encode_record(&rec, &mut self.buf);
        self.db.put(key.as_bytes(), &self.buf)
    }

    fn scan(&mut self, start: &str, len: usize) -> Result<usize> {
        let mut n = 0;
        for (k, v) in self.db.range(start.as_bytes()..).take(len) {
            decode_record(&v).ok_or_else(|| corrupt(&String::from_utf8_lossy(&k)))?;
            n += 1;
        }
        Ok(n)
    }
}

// ---------------------------------------------------------------- resp

/// YCSB's redis binding's sorted set of every key.
pub const INDEX_KEY: &str = "_indices";

/// Java's `String.hashCode` (the binding's `hash(key)`): the zset score.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

/// A Redis-protocol server (`server`: one this benchmark started).
pub struct Resp {
    addr: String,
    fields: Vec<String>,
    server: Option<RedisServer>,
}

impl Target for Resp {
    fn client(&self) -> Result<Box<dyn Client>> {
        Ok(Box::new(RespClient {
            conn: RespConn::connect(&self.addr)?,
            fields: self.fields.clone(),
        }))
    }
    fn name(&self) -> String {
        match self.server {
            Some(_) => "redis".into(),
            None => format!("resp://{}", self.addr),
        }
    }
    fn layout(&self) -> &'static str {
        match self.server {
            Some(_) => {
                "YCSB redis binding: a hash per record, keys in the _indices zset; \
                 redis-server started here: appendonly yes, appendfsync always, files on /dev/shm"
            }
            None => "YCSB redis binding: a hash per record, keys in the _indices zset",
        }
    }
}

struct RespClient {
    conn: RespConn,
    fields: Vec<String>,
}

impl RespClient {
    fn hgetall(&mut self, key: &str) -> Result<bool> {
        let r = self.conn.cmd(&[b"HGETALL", key.as_bytes()])?;
        Ok(!r.into_array().is_empty())
    }
}

impl Client for RespClient {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<()> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 2 * fields.len());
        args.push(b"HMSET");
        args.push(key.as_bytes());
        for (name, v) in self.fields.iter().zip(fields) {
            args.push(name.as_bytes());
            args.push(v);
        }
        self.conn.cmd(&args)?;
        let score = java_string_hash(key).to_string();
        self.conn
            .cmd(&[b"ZADD", INDEX_KEY.as_bytes(), score.as_bytes(), key.as_bytes()])?;
        Ok(())
    }

    fn read(&mut self, key: &str) -> Result<bool> {
        self.hgetall(key)
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<()> {
        let name = self.fields[field].clone();
        self.conn.cmd(&[b"HMSET", key.as_bytes(), name.as_bytes(), value])?;
        Ok(())
    }

    fn scan(&mut self, start: &str, len: usize) -> Result<usize> {
        let score = java_string_hash(start).to_string();
        let count = len.to_string();
        let keys = self
            .conn
            .cmd(&[
                b"ZRANGEBYSCORE",
                INDEX_KEY.as_bytes(),
                score.as_bytes(),
                b"+inf",
                b"LIMIT",
                b"0",
                count.as_bytes(),
            ])?
            .into_array();
        let mut n = 0;
        for k in keys {
            if let Some(k) = Reply::into_bulk(k) {
                let k = String::from_utf8_lossy(&k).into_owned();
                self.hgetall(&k)?;
                n += 1;
            }
        }
        Ok(n)
    }
}
