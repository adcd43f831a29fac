//! Command dispatch: the command table, authentication, MULTI queueing, and
//! how each command meets the engine.
//!
//! Every data command is a function over [`Kv`] (a snapshot or a
//! transaction). Outside MULTI a read runs on a snapshot and a write runs in
//! its own engine transaction (so read-modify-write commands are atomic
//! against other clients, and multi-key writes are atomic across crashes);
//! EXEC runs every queued command in one transaction. The reply is built
//! only after the commit returned, i.e. after the writes are durable.

mod conn;
pub mod fast;
mod hash;
mod keyspace;
mod strings;
mod zset;

use std::sync::Arc;

use bytes::Bytes;

use crate::keys::{self, Meta};
use crate::resp::{Args, Reply};
use crate::shared::Shared;
use crate::store::{self, Kv};

/// A command's failure: a Redis error reply, or an engine error.
#[derive(Debug)]
pub enum CmdError {
    Reply(Reply),
    Store(store::Error),
}

impl From<store::Error> for CmdError {
    fn from(e: store::Error) -> Self {
        CmdError::Store(e)
    }
}

pub type CmdResult = Result<Reply, CmdError>;

pub(crate) fn fail<T>(msg: impl Into<String>) -> Result<T, CmdError> {
    Err(CmdError::Reply(Reply::Error(msg.into())))
}

pub(crate) const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub(crate) const SYNTAX: &str = "ERR syntax error";
pub(crate) const NOT_INT: &str = "ERR value is not an integer or out of range";
pub(crate) const NOT_FLOAT: &str = "ERR value is not a valid float";
pub(crate) const OVERFLOW: &str = "ERR increment or decrement would overflow";

/// The reply for an engine error. A full pool answers like Redis over its
/// memory limit (`-OOM`), so clients treat it as "write refused"; reads go on.
pub fn store_error_reply(e: &store::Error) -> Reply {
    match e {
        store::Error::Engine(nvstore::Error::PoolFull { .. })
        | store::Error::Engine(nvstore::Error::DiskFull { .. }) => {
            Reply::Error(format!("OOM command not allowed: {e}"))
        }
        _ => Reply::Error(format!("ERR {e}")),
    }
}

/// How a command meets the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Reads data: runs on a snapshot.
    Read,
    /// Writes data: runs in a transaction.
    Write,
    /// Connection and server commands: no data.
    Conn,
}

/// The data-command signature.
pub type DataFn = fn(&mut dyn Kv, &Cx, &[Bytes]) -> CmdResult;

/// One row of the command table.
pub struct Spec {
    pub name: &'static str,
    /// Redis' arity: `n` exactly n words (name included), `-n` at least n.
    pub arity: i32,
    pub kind: Kind,
    pub first_key: i32,
    pub last_key: i32,
    pub step: i32,
    pub data: Option<DataFn>,
    /// Whether it may walk the whole key space (or close the pool), so the
    /// server runs it on the blocking pool ([`walks_keyspace`]). Set from
    /// the name when the table is built, not compared per request.
    pub walks: bool,
}

/// Commands that may walk the whole key space or close the pool.
const WALKERS: [&str; 8] = [
    "keys", "scan", "dbsize", "info", "flushdb", "flushall", "shutdown", "exec",
];

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn walks(name: &str) -> bool {
    let mut i = 0;
    while i < WALKERS.len() {
        if same(WALKERS[i], name) {
            return true;
        }
        i += 1;
    }
    false
}

const fn spec(name: &'static str, arity: i32, kind: Kind, keys: (i32, i32, i32), data: Option<DataFn>) -> Spec {
    Spec {
        name,
        arity,
        kind,
        first_key: keys.0,
        last_key: keys.1,
        step: keys.2,
        data,
        walks: walks(name),
    }
}

use Kind::{Conn as C, Read as R, Write as W};
const NK: (i32, i32, i32) = (0, 0, 0);
const K1: (i32, i32, i32) = (1, 1, 1);
const KALL: (i32, i32, i32) = (1, -1, 1);
const KPAIRS: (i32, i32, i32) = (1, -1, 2);

/// Every command the server knows, with Redis' arity.
pub static COMMANDS: &[Spec] = &[
    // connection and server
    spec("ping", -1, C, NK, None),
    spec("echo", 2, C, NK, None),
    spec("hello", -1, C, NK, None),
    spec("auth", -2, C, NK, None),
    spec("select", 2, C, NK, None),
    spec("quit", -1, C, NK, None),
    spec("reset", 1, C, NK, None),
    spec("client", -2, C, NK, None),
    spec("command", -1, C, NK, None),
    spec("info", -1, C, NK, None),
    spec("config", -2, C, NK, None),
    spec("shutdown", -1, C, NK, None),
    spec("multi", 1, C, NK, None),
    spec("exec", 1, C, NK, None),
    spec("discard", 1, C, NK, None),
    spec("watch", -2, C, KALL, None),
    spec("unwatch", 1, C, NK, None),
    spec("dbsize", 1, R, NK, Some(keyspace::dbsize)),
    spec("flushdb", -1, W, NK, Some(keyspace::flushdb)),
    spec("flushall", -1, W, NK, Some(keyspace::flushdb)),
    // keys
    spec("del", -2, W, KALL, Some(keyspace::del)),
    spec("unlink", -2, W, KALL, Some(keyspace::del)),
    spec("exists", -2, R, KALL, Some(keyspace::exists)),
    spec("type", 2, R, K1, Some(keyspace::type_)),
    spec("object", -2, R, (2, 2, 1), Some(keyspace::object)),
    spec("keys", 2, R, NK, Some(keyspace::keys)),
    spec("scan", -2, R, NK, Some(keyspace::scan)),
    spec("nv.range", -3, R, NK, Some(keyspace::nv_range)),
    spec("nv.prefix", -2, R, NK, Some(keyspace::nv_prefix)),
    // strings
    spec("get", 2, R, K1, Some(strings::get)),
    spec("set", -3, W, K1, Some(strings::set)),
    spec("setnx", 3, W, K1, Some(strings::setnx)),
    spec("getset", 3, W, K1, Some(strings::getset)),
    spec("getdel", 2, W, K1, Some(strings::getdel)),
    spec("mget", -2, R, KALL, Some(strings::mget)),
    spec("mset", -3, W, KPAIRS, Some(strings::mset)),
    spec("msetnx", -3, W, KPAIRS, Some(strings::msetnx)),
    spec("incr", 2, W, K1, Some(strings::incr)),
    spec("decr", 2, W, K1, Some(strings::decr)),
    spec("incrby", 3, W, K1, Some(strings::incrby)),
    spec("decrby", 3, W, K1, Some(strings::decrby)),
    spec("append", 3, W, K1, Some(strings::append)),
    spec("strlen", 2, R, K1, Some(strings::strlen)),
    spec("getrange", 4, R, K1, Some(strings::getrange)),
    // hashes
    spec("hset", -4, W, K1, Some(hash::hset)),
    spec("hmset", -4, W, K1, Some(hash::hmset)),
    spec("hsetnx", 4, W, K1, Some(hash::hsetnx)),
    spec("hget", 3, R, K1, Some(hash::hget)),
    spec("hmget", -3, R, K1, Some(hash::hmget)),
    spec("hgetall", 2, R, K1, Some(hash::hgetall)),
    spec("hdel", -3, W, K1, Some(hash::hdel)),
    spec("hlen", 2, R, K1, Some(hash::hlen)),
    spec("hexists", 3, R, K1, Some(hash::hexists)),
    spec("hkeys", 2, R, K1, Some(hash::hkeys)),
    spec("hvals", 2, R, K1, Some(hash::hvals)),
    spec("hincrby", 4, W, K1, Some(hash::hincrby)),
    // sorted sets
    spec("zadd", -4, W, K1, Some(zset::zadd)),
    spec("zincrby", 4, W, K1, Some(zset::zincrby)),
    spec("zrem", -3, W, K1, Some(zset::zrem)),
    spec("zscore", 3, R, K1, Some(zset::zscore)),
    spec("zcard", 2, R, K1, Some(zset::zcard)),
    spec("zcount", 4, R, K1, Some(zset::zcount)),
    spec("zrank", -3, R, K1, Some(zset::zrank)),
    spec("zrevrank", -3, R, K1, Some(zset::zrevrank)),
    spec("zrange", -4, R, K1, Some(zset::zrange)),
    spec("zrevrange", -4, R, K1, Some(zset::zrevrange)),
    spec("zrangebyscore", -4, R, K1, Some(zset::zrangebyscore)),
    spec("zrevrangebyscore", -4, R, K1, Some(zset::zrevrangebyscore)),
    spec("zrangebylex", -4, R, K1, Some(zset::zrangebylex)),
    spec("zrevrangebylex", -4, R, K1, Some(zset::zrevrangebylex)),
];

/// The table row of command `name` (any case). A hash lookup of the
/// lowercased name (Fx, not SipHash: the names are ours, not a client's):
/// every request looks its command up a few times.
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    static BY_NAME: std::sync::OnceLock<rustc_hash::FxHashMap<&'static [u8], &'static Spec>> =
        std::sync::OnceLock::new();
    let mut buf = [0u8; 32];
    let lower = buf.get_mut(..name.len())?;
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    BY_NAME
        .get_or_init(|| COMMANDS.iter().map(|s| (s.name.as_bytes(), s)).collect())
        .get(&*lower)
        .copied()
}

/// What data commands may read about their caller.
pub struct Cx<'a> {
    pub proto: u8,
    pub sh: &'a Shared,
}

/// Per-connection state.
pub struct Conn {
    pub id: u64,
    pub proto: u8,
    pub authed: bool,
    /// Queued commands while in MULTI.
    pub multi: Option<Vec<Args>>,
    /// A command failed to queue: EXEC answers EXECABORT.
    pub multi_error: bool,
    /// WATCHed metadata keys with the commit timestamp seen at WATCH time.
    pub watches: Vec<(Vec<u8>, u64)>,
    /// Close after sending the replies so far.
    pub close: bool,
}

impl Conn {
    pub fn new(id: u64, authed: bool) -> Conn {
        Conn {
            id,
            proto: 2,
            authed,
            multi: None,
            multi_error: false,
            watches: Vec::new(),
            close: false,
        }
    }
}

/// Redis' unknown-command text: the name and up to 128 characters of
/// arguments, each quoted and followed by a space.
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let name = String::from_utf8_lossy(&args[0]);
    let name: String = name.chars().take(128).collect();
    let mut rest = String::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        let s = String::from_utf8_lossy(a);
        let s: String = s.chars().take(room).collect();
        rest.push_str(&format!("'{s}' "));
    }
    Reply::Error(format!(
        "ERR unknown command '{name}', with args beginning with: {rest}"
    ))
}

pub fn wrong_arity(name: &str) -> Reply {
    Reply::Error(format!("ERR wrong number of arguments for '{name}' command"))
}

fn arity_ok(s: &Spec, n: usize) -> bool {
    if s.arity >= 0 {
        n == s.arity as usize
    } else {
        n >= (-s.arity) as usize
    }
}

/// A parsed request with its command looked up once, when it was parsed
/// (the batch, the group commit and the fast reads all ask which command
/// it is).
pub struct Req {
    pub spec: Option<&'static Spec>,
    pub args: Args,
}

impl Req {
    pub fn new(args: Args) -> Req {
        Req {
            spec: lookup(&args[0]),
            args,
        }
    }
}

/// Runs one request; the reply is final (durable).
pub fn execute(sh: &Arc<Shared>, c: &mut Conn, args: Args) -> Reply {
    execute_req(sh, c, Req::new(args))
}

/// [`execute`] of a request whose command was looked up already.
pub fn execute_req(sh: &Arc<Shared>, c: &mut Conn, req: Req) -> Reply {
    sh.stats.commands.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Req { spec, args } = req;
    let Some(spec) = spec else {
        if c.multi.is_some() {
            c.multi_error = true;
        }
        return unknown_command(&args);
    };
    if !arity_ok(spec, args.len()) {
        if c.multi.is_some() {
            c.multi_error = true;
        }
        return wrong_arity(spec.name);
    }
    if !c.authed && !matches!(spec.name, "auth" | "hello" | "quit" | "reset") {
        return Reply::err("NOAUTH Authentication required.");
    }
    if let Some(q) = &mut c.multi {
        if !matches!(spec.name, "exec" | "discard" | "multi" | "watch" | "quit" | "reset") {
            q.push(args);
            return Reply::Status("QUEUED");
        }
    }
    match spec.kind {
        Kind::Conn => conn::run(sh, c, spec, &args),
        // One user key: the first point read needs no snapshot (see PointView).
        Kind::Read if spec.first_key == 1 && spec.last_key == 1 => {
            let cx = Cx { proto: c.proto, sh };
            let mut view = store::PointView::new(&sh.store);
            finish(spec.data.unwrap()(&mut view, &cx, &args))
        }
        Kind::Read => {
            let snap = sh.store.snapshot();
            let cx = Cx { proto: c.proto, sh };
            let mut view = snap;
            finish(spec.data.unwrap()(&mut view, &cx, &args))
        }
        Kind::Write if matches!(spec.name, "flushdb" | "flushall") => keyspace::flush_in_chunks(sh, &args),
        Kind::Write => {
            let cx = Cx { proto: c.proto, sh };
            if one_key(spec) {
                let mk = keys::MetaKey::new(&args[1]);
                match sh.store.write_one(&mk, |v| spec.data.unwrap()(v, &cx, &args)) {
                    Ok(Some(r)) => return finish(r),
                    Ok(None) => {} // touched another key: a real transaction
                    Err(e) => return store_error_reply(&e),
                }
            }
            write_txn(sh, |t| spec.data.unwrap()(t, &cx, &args))
        }
    }
}

/// Whether a write command of one user key may touch only that key's
/// metadata (a string, a small hash or sorted set), so that it is tried as
/// a one-key read-modify-write first ([`store::Store::write_one`]: no
/// snapshot, no transaction buffer, one leaf lookup). One that touches
/// more (a large hash's fields, a large sorted set's members, a layout
/// change, DEL of a large hash) falls back to a transaction, having
/// written nothing.
fn one_key(spec: &Spec) -> bool {
    spec.first_key == 1 && spec.last_key == 1
}

/// Most pipelined write commands committed together by [`execute_group`].
pub const MAX_GROUP: usize = 64;

/// Whether `args` is a write command that [`execute_group`] may commit
/// together with its neighbours: known, right arity, authenticated, not
/// queued by MULTI, and not FLUSHDB (which commits in chunks of its own).
pub fn groupable(c: &Conn, r: &Req) -> bool {
    c.authed
        && c.multi.is_none()
        && r.spec.is_some_and(|s| {
            s.kind == Kind::Write
                && s.data.is_some()
                && arity_ok(s, r.args.len())
                && !matches!(s.name, "flushdb" | "flushall")
        })
}

/// Whether a request may walk the whole key space (or close the pool), so
/// the server runs it on the blocking pool rather than a reactor thread.
pub fn walks_keyspace(r: &Req) -> bool {
    r.spec.is_some_and(|s| s.walks)
}

/// Group commit: consecutive pipelined write commands of one connection run
/// in one transaction, in order, and their replies are released together
/// after the one commit returned (so after all of them are durable). Each
/// command still sees the ones before it, and each stays all-or-nothing.
/// If any command answers an error, or the commit fails for a reason other
/// than a conflict, the group is dropped and every command runs alone, so
/// errors land exactly where they would without grouping.
pub fn execute_group(sh: &Arc<Shared>, c: &mut Conn, group: Vec<Req>) -> Vec<Reply> {
    if group.len() > 1 {
        for attempt in 0..8 {
            let mut t = sh.store.begin();
            let cx = Cx { proto: c.proto, sh };
            let mut replies = Vec::with_capacity(group.len());
            let mut clean = true;
            for r in &group {
                let spec = r.spec.expect("groupable commands are known");
                match spec.data.unwrap()(&mut t, &cx, &r.args) {
                    Ok(r) if !r.is_error() => replies.push(r),
                    _ => {
                        clean = false;
                        break;
                    }
                }
            }
            if !clean {
                t.abort();
                break;
            }
            match t.commit().map_err(store::Error::from) {
                Ok(_) => {
                    sh.stats
                        .commands
                        .fetch_add(group.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    return replies;
                }
                Err(store::Error::Conflict) => backoff(attempt),
                Err(_) => break,
            }
        }
    }
    group.into_iter().map(|r| execute_req(sh, c, r)).collect()
}

fn finish(r: CmdResult) -> Reply {
    match r {
        Ok(r) => r,
        Err(CmdError::Reply(r)) => r,
        Err(CmdError::Store(e)) => store_error_reply(&e),
    }
}

/// Re-runs of a command whose commit lost a race before it answers an error.
const MAX_ATTEMPTS: u32 = 1000;

/// Backs off before re-running a command that lost a write-write race.
fn backoff(attempt: u32) {
    if attempt > 4 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Runs `f` in its own transaction, committing unless it failed; re-runs it
/// from a fresh snapshot on a conflict (another client committed a key it
/// wrote first).
fn write_txn(sh: &Shared, mut f: impl FnMut(&mut dyn Kv) -> CmdResult) -> Reply {
    for attempt in 0..MAX_ATTEMPTS {
        let mut t = sh.store.begin();
        match f(&mut t) {
            Ok(r) => match t.commit().map_err(store::Error::from) {
                Ok(_) => return r,
                Err(store::Error::Conflict) => backoff(attempt),
                Err(e) => return store_error_reply(&e),
            },
            Err(CmdError::Store(store::Error::Conflict)) => {
                t.abort();
                backoff(attempt);
            }
            Err(e) => {
                t.abort();
                return finish(Err(e));
            }
        }
    }
    Reply::err("ERR the command kept conflicting with concurrent writers; retry it")
}

/// EXEC: every queued command in one transaction, WATCHes checked at commit.
pub fn exec(sh: &Arc<Shared>, c: &mut Conn) -> Reply {
    let Some(queue) = c.multi.take() else {
        return Reply::err("ERR EXEC without MULTI");
    };
    let watches = std::mem::take(&mut c.watches);
    if std::mem::take(&mut c.multi_error) {
        return Reply::err("EXECABORT Transaction discarded because of previous errors.");
    }
    loop {
        let mut t = sh.store.begin();
        for (k, ts) in &watches {
            t.watch(k, *ts);
        }
        let mut replies = Vec::with_capacity(queue.len());
        for args in &queue {
            let spec = lookup(&args[0]).expect("queued commands are known");
            let r = match spec.kind {
                Kind::Conn => conn::run(sh, c, spec, args),
                _ => {
                    let cx = Cx { proto: c.proto, sh };
                    finish(spec.data.unwrap()(&mut t, &cx, args))
                }
            };
            replies.push(r);
        }
        match t.commit().map_err(store::Error::from) {
            Ok(_) => return Reply::Array(replies),
            Err(store::Error::Conflict) if !watches.is_empty() => return Reply::NilArray,
            // Without WATCH, EXEC behaves as if it ran alone: re-run it.
            Err(store::Error::Conflict) => std::thread::yield_now(),
            Err(e) => return store_error_reply(&e),
        }
    }
}

// ---- helpers shared by the data commands ----

/// The metadata of `user`, if the key exists.
pub(crate) fn meta(kv: &dyn Kv, user: &[u8]) -> Result<Option<Meta>, CmdError> {
    match kv.get(&keys::meta_key(user))? {
        None => Ok(None),
        Some(v) => match Meta::decode(v) {
            Some(m) => Ok(Some(m)),
            None => fail("ERR corrupt metadata for this key (not written by nvstore serve)"),
        },
    }
}

/// Deletes `user` and everything stored under it.
pub(crate) fn delete_key(kv: &mut dyn Kv, user: &[u8], m: &Meta) -> Result<(), CmdError> {
    let spaces: &[u8] = match m {
        Meta::String(_) | Meta::SmallHash(_) | Meta::SmallZSet(_) => &[],
        Meta::Hash { .. } => &[keys::HASH],
        Meta::ZSet { .. } => &[keys::ZMEMBER, keys::ZSCORE],
    };
    for &ns in spaces {
        let p = keys::sub_prefix(ns, user);
        let sub: Vec<Vec<u8>> = prefix_scan(kv, &p, false).map(|(k, _)| k).collect();
        for k in sub {
            kv.delete(&k)?;
        }
    }
    kv.delete(&keys::meta_key(user))?;
    Ok(())
}

/// Pairs whose key starts with `p`.
pub(crate) fn prefix_scan<'a>(
    kv: &'a dyn Kv,
    p: &[u8],
    rev: bool,
) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + 'a> {
    use std::ops::Bound;
    let hi = match keys::prefix_end(p) {
        Some(e) => Bound::Excluded(e),
        None => Bound::Unbounded,
    };
    kv.scan(Bound::Included(p.to_vec()), hi, rev)
}

pub(crate) fn int_arg(b: &[u8]) -> Result<i64, CmdError> {
    crate::num::parse_i64(b).map_or_else(|| fail(NOT_INT), Ok)
}

pub(crate) fn float_arg(b: &[u8]) -> Result<f64, CmdError> {
    crate::num::parse_f64(b).map_or_else(|| fail(NOT_FLOAT), Ok)
}

pub(crate) fn eq(a: &[u8], lit: &str) -> bool {
    a.eq_ignore_ascii_case(lit.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_command_text_matches_redis() {
        let a: Args = ["foo", "a", "b"].iter().map(|s| Bytes::from(s.to_string())).collect();
        assert_eq!(
            unknown_command(&a),
            Reply::err("ERR unknown command 'foo', with args beginning with: 'a' 'b' ")
        );
        let a: Args = smallvec::smallvec![Bytes::from_static(b"FOO")];
        assert_eq!(
            unknown_command(&a),
            Reply::err("ERR unknown command 'FOO', with args beginning with: ")
        );
    }

    #[test]
    fn lookup_ignores_case_and_knows_every_command() {
        for s in COMMANDS {
            assert!(std::ptr::eq(lookup(s.name.as_bytes()).unwrap(), s));
            assert!(std::ptr::eq(lookup(s.name.to_uppercase().as_bytes()).unwrap(), s));
        }
        assert!(lookup(b"HgetAll").is_some());
        assert!(lookup(b"nosuch").is_none());
        assert!(lookup(b"").is_none());
        assert!(lookup(&[b'x'; 100]).is_none());
    }

    #[test]
    fn key_space_walkers_are_flagged_in_the_table() {
        for name in WALKERS {
            assert!(
                lookup(name.as_bytes()).is_some_and(|s| s.walks),
                "{name} is not flagged"
            );
        }
        let flagged = COMMANDS.iter().filter(|s| s.walks).count();
        assert_eq!(flagged, WALKERS.len());
        assert!(!lookup(b"get").unwrap().walks);
    }

    #[test]
    fn table_has_no_duplicates() {
        let mut names: Vec<_> = COMMANDS.iter().map(|s| s.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
    }
}
