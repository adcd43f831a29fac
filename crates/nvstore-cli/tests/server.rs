//! `nvstore serve` driven over TCP by a minimal RESP client: Redis' error
//! texts, protocol errors, pipelining, RESP3, transactions, atomicity under
//! concurrency, limits, clean shutdown, a full pool, and SIGKILL under load.

mod server_support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use server_support::{encode, pool_dir, Client, Server, R};

fn start() -> (tempfile::TempDir, Server) {
    let dir = pool_dir();
    let s = Server::start(&dir.path().join("p.nvs"), &[]);
    (dir, s)
}

#[test]
fn error_texts_match_redis() {
    let (_d, s) = start();
    let mut c = s.client();
    assert_eq!(
        c.cmd(&["foo", "a", "b"]),
        R::Err("ERR unknown command 'foo', with args beginning with: 'a' 'b' ".into())
    );
    assert_eq!(
        c.cmd(&["FOO"]),
        R::Err("ERR unknown command 'FOO', with args beginning with: ".into())
    );
    assert_eq!(
        c.cmd(&["GET"]),
        R::Err("ERR wrong number of arguments for 'get' command".into())
    );
    assert_eq!(
        c.cmd(&["mset", "a"]),
        R::Err("ERR wrong number of arguments for 'mset' command".into())
    );
    assert_eq!(
        c.cmd(&["mset", "a", "1", "b"]),
        R::Err("ERR wrong number of arguments for 'mset' command".into())
    );
    assert_eq!(c.cmd(&["hset", "h", "f", "v"]), R::Int(1));
    let wrongtype = R::Err("WRONGTYPE Operation against a key holding the wrong kind of value".into());
    assert_eq!(c.cmd(&["get", "h"]), wrongtype);
    assert_eq!(c.cmd(&["incr", "h"]), wrongtype);
    assert_eq!(c.cmd(&["zadd", "h", "1", "m"]), wrongtype);
    assert_eq!(c.cmd(&["set", "s", "abc"]), R::ok());
    assert_eq!(c.cmd(&["hget", "s", "f"]), wrongtype);
    assert_eq!(
        c.cmd(&["incr", "s"]),
        R::Err("ERR value is not an integer or out of range".into())
    );
    assert_eq!(
        c.cmd(&["incrby", "n", "1x"]),
        R::Err("ERR value is not an integer or out of range".into())
    );
    assert_eq!(c.cmd(&["set", "n", "9223372036854775807"]), R::ok());
    assert_eq!(
        c.cmd(&["incr", "n"]),
        R::Err("ERR increment or decrement would overflow".into())
    );
    assert_eq!(c.cmd(&["set", "k", "v", "nx", "xx"]), R::Err("ERR syntax error".into()));
    assert!(c
        .cmd(&["set", "k", "v", "ex", "10"])
        .err_text()
        .starts_with("ERR expiry is not supported"));
    assert_eq!(
        c.cmd(&["zadd", "z", "abc", "m"]),
        R::Err("ERR value is not a valid float".into())
    );
    assert_eq!(
        c.cmd(&["zadd", "z", "nx", "xx", "1", "m"]),
        R::Err("ERR XX and NX options at the same time are not compatible".into())
    );
    assert_eq!(
        c.cmd(&["zrangebyscore", "z", "a", "1"]),
        R::Err("ERR min or max is not a float".into())
    );
    assert_eq!(
        c.cmd(&["zrangebylex", "z", "a", "b"]),
        R::Err("ERR min or max not valid string range item".into())
    );
    assert_eq!(c.cmd(&["select", "1"]), R::Err("ERR DB index is out of range".into()));
    assert_eq!(c.cmd(&["select", "0"]), R::ok());
    assert_eq!(c.cmd(&["exec"]), R::Err("ERR EXEC without MULTI".into()));
    assert_eq!(
        c.cmd(&["hello", "4"]),
        R::Err("NOPROTO unsupported protocol version".into())
    );
    assert!(c
        .cmd(&["auth", "x"])
        .err_text()
        .starts_with("ERR AUTH <password> called without any password"));
    // OBJECT: Redis' texts for arity and unknown subcommands, nil for a
    // missing key, Redis' names for the layouts.
    assert_eq!(
        c.cmd(&["object", "encoding"]),
        R::Err("ERR wrong number of arguments for 'object|encoding' command".into())
    );
    assert_eq!(
        c.cmd(&["object", "foo", "k"]),
        R::Err("ERR unknown subcommand 'foo'. Try OBJECT HELP.".into())
    );
    assert_eq!(
        c.cmd(&["object"]),
        R::Err("ERR wrong number of arguments for 'object' command".into())
    );
    assert_eq!(c.cmd(&["object", "encoding", "missing"]), R::Nil);
    assert!(c
        .cmd(&["object", "freq", "s"])
        .err_text()
        .starts_with("ERR An LFU maxmemory policy is not selected"));
    assert!(c.cmd(&["object", "idletime", "s"]).err_text().starts_with("ERR "));
    assert_eq!(c.cmd(&["object", "refcount", "s"]), R::Int(1));
    assert!(matches!(c.cmd(&["object", "help"]), R::Array(v) if v.len() > 5));
    assert_eq!(c.cmd(&["set", "long", &"x".repeat(45)]), R::ok());
    for (k, want) in [("n", "int"), ("s", "embstr"), ("long", "raw"), ("h", "listpack")] {
        assert_eq!(c.cmd(&["object", "encoding", k]), R::s(want), "{k}");
    }
    // Not as string2ll reads an integer: a leading zero.
    assert_eq!(c.cmd(&["set", "n", "012"]), R::ok());
    assert_eq!(c.cmd(&["zadd", "z", "1", "m"]), R::Int(1));
    assert_eq!(c.cmd(&["object", "encoding", "n"]), R::s("embstr"));
    assert_eq!(c.cmd(&["object", "encoding", "z"]), R::s("listpack"));
}

#[test]
fn protocol_error_closes_only_that_connection() {
    let (_d, s) = start();
    let mut other = s.client();
    assert_eq!(other.cmd(&["set", "k", "v"]), R::ok());
    for (bad, msg) in [
        (&b"*abc\r\n"[..], "ERR Protocol error: invalid multibulk length"),
        (b"*1\r\n$-3\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*2\r\n+a\r\n", "ERR Protocol error: expected '$', got '+'"),
        (b"set \"k v\r\n", "ERR Protocol error: unbalanced quotes in request"),
    ] {
        let mut c = s.client();
        c.send_raw(b"PING\r\n");
        c.send_raw(bad);
        assert_eq!(c.read().unwrap(), R::Simple("PONG".into()));
        assert_eq!(c.read().unwrap(), R::Err(msg.into()));
        assert!(c.read().is_err(), "connection must be closed after a protocol error");
    }
    assert_eq!(other.cmd(&["get", "k"]), R::s("v"));
}

#[test]
fn pipelining_inline_and_split_writes() {
    let (_d, s) = start();
    let mut c = s.client();
    let mut batch = Vec::new();
    for i in 0..2000 {
        batch.extend(encode(&[
            b"SET",
            format!("k{i}").as_bytes(),
            format!("v{i}").as_bytes(),
        ]));
    }
    batch.extend_from_slice(b"GET k1999\r\nset spaced \"a b\\x41\"\r\nget spaced\r\n");
    // Delivered in odd-sized pieces: the parser must resume anywhere.
    for chunk in batch.chunks(777) {
        c.send_raw(chunk);
    }
    for _ in 0..2000 {
        assert_eq!(c.read().unwrap(), R::ok());
    }
    assert_eq!(c.read().unwrap(), R::s("v1999"));
    assert_eq!(c.read().unwrap(), R::ok());
    assert_eq!(c.read().unwrap(), R::s("a bA"));
    assert_eq!(c.cmd(&["dbsize"]), R::Int(2001));
}

#[test]
fn hello_3_and_resp3_types() {
    let (_d, s) = start();
    let mut c = s.client();
    let R::Map(m) = c.cmd(&["HELLO", "3"]) else {
        panic!("HELLO 3 must answer a map")
    };
    let keys: Vec<R> = m.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        keys,
        ["server", "version", "proto", "id", "mode", "role", "modules"]
            .map(R::s)
            .to_vec()
    );
    assert_eq!(m[2].1, R::Int(3));
    assert_eq!(c.cmd(&["hset", "h", "a", "1", "b", "2"]), R::Int(2));
    assert_eq!(
        c.cmd(&["hgetall", "h"]),
        R::Map(vec![(R::s("a"), R::s("1")), (R::s("b"), R::s("2"))])
    );
    assert_eq!(c.cmd(&["zadd", "z", "1.5", "a", "-inf", "b"]), R::Int(2));
    assert_eq!(c.cmd(&["zscore", "z", "a"]), R::Double("1.5".into()));
    assert_eq!(c.cmd(&["get", "nokey"]), R::Nil);
    assert_eq!(
        c.cmd(&["zrange", "z", "0", "-1", "withscores"]),
        R::Array(vec![
            R::Array(vec![R::s("b"), R::Double("-inf".into())]),
            R::Array(vec![R::s("a"), R::Double("1.5".into())]),
        ])
    );
    // Under RESP2 the same map is a flat array.
    let R::Array(m) = c.cmd(&["HELLO", "2"]) else { panic!() };
    assert_eq!(m.len(), 14);
    assert_eq!((&m[4], &m[5]), (&R::s("proto"), &R::Int(2)));
    assert_eq!(c.cmd(&["zscore", "z", "a"]), R::s("1.5"));
    assert_eq!(c.cmd(&["hgetall", "h"]), R::arr(&["a", "1", "b", "2"]));
}

#[test]
fn multi_exec_discard_and_watch() {
    let (_d, s) = start();
    let mut c = s.client();
    let mut o = s.client();
    assert_eq!(c.cmd(&["multi"]), R::ok());
    assert_eq!(c.cmd(&["set", "a", "1"]), R::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["incr", "a"]), R::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["hset", "a", "f", "v"]), R::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["get", "a"]), R::Simple("QUEUED".into()));
    // Not visible to others before EXEC.
    assert_eq!(o.cmd(&["get", "a"]), R::Nil);
    assert_eq!(
        c.cmd(&["exec"]),
        R::Array(vec![
            R::ok(),
            R::Int(2),
            R::Err("WRONGTYPE Operation against a key holding the wrong kind of value".into()),
            R::s("2")
        ])
    );
    assert_eq!(o.cmd(&["get", "a"]), R::s("2"));
    // Queue-time errors abort the whole transaction.
    assert_eq!(c.cmd(&["multi"]), R::ok());
    assert_eq!(c.cmd(&["multi"]), R::Err("ERR MULTI calls can not be nested".into()));
    assert_eq!(c.cmd(&["set", "a", "9"]), R::Simple("QUEUED".into()));
    assert!(c
        .cmd(&["nosuch"])
        .err_text()
        .starts_with("ERR unknown command 'nosuch'"));
    assert_eq!(
        c.cmd(&["exec"]),
        R::Err("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(o.cmd(&["get", "a"]), R::s("2"));
    // DISCARD.
    assert_eq!(c.cmd(&["multi"]), R::ok());
    assert_eq!(c.cmd(&["set", "a", "9"]), R::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["discard"]), R::ok());
    assert_eq!(c.cmd(&["discard"]), R::Err("ERR DISCARD without MULTI".into()));
    assert_eq!(o.cmd(&["get", "a"]), R::s("2"));
    // WATCH: another client's write makes EXEC answer nil and apply nothing.
    assert_eq!(c.cmd(&["watch", "a"]), R::ok());
    assert_eq!(o.cmd(&["set", "a", "other"]), R::ok());
    assert_eq!(c.cmd(&["multi"]), R::ok());
    assert_eq!(c.cmd(&["set", "b", "x"]), R::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["exec"]), R::Nil);
    assert_eq!(o.cmd(&["exists", "b"]), R::Int(0));
    // WATCH without interference commits.
    assert_eq!(c.cmd(&["watch", "a"]), R::ok());
    assert_eq!(c.cmd(&["multi"]), R::ok());
    assert_eq!(
        c.cmd(&["watch", "a"]),
        R::Err("ERR WATCH inside MULTI is not allowed".into())
    );
    assert_eq!(c.cmd(&["set", "b", "x"]), R::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["exec"]), R::Array(vec![R::ok()]));
    assert_eq!(o.cmd(&["get", "b"]), R::s("x"));
}

#[test]
fn read_modify_write_commands_are_atomic_across_clients() {
    let (_d, s) = start();
    let port = s.port;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(port);
                for _ in 0..300 {
                    assert!(matches!(c.cmd(&["incr", "n"]), R::Int(_)));
                    assert!(matches!(c.cmd(&["hincrby", "h", "f", "2"]), R::Int(_)));
                    assert!(matches!(c.cmd(&["append", "s", "x"]), R::Int(_)));
                    assert!(matches!(c.cmd(&["zincrby", "z", "1", "m"]), R::Bulk(_)));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut c = s.client();
    assert_eq!(c.cmd(&["get", "n"]), R::s("1200"));
    assert_eq!(c.cmd(&["hget", "h", "f"]), R::s("2400"));
    assert_eq!(c.cmd(&["strlen", "s"]), R::Int(1200));
    assert_eq!(c.cmd(&["zscore", "z", "m"]), R::s("1200"));
}

#[test]
fn strings_hashes_and_sorted_sets() {
    let (_d, s) = start();
    let mut c = s.client();
    assert_eq!(c.cmd(&["set", "k", "v", "get"]), R::Nil);
    assert_eq!(c.cmd(&["set", "k", "w", "nx"]), R::Nil);
    assert_eq!(c.cmd(&["set", "k", "w", "xx", "get"]), R::s("v"));
    assert_eq!(c.cmd(&["setnx", "k", "z"]), R::Int(0));
    assert_eq!(c.cmd(&["getset", "k", "y"]), R::s("w"));
    assert_eq!(c.cmd(&["append", "k", "yy"]), R::Int(3));
    assert_eq!(c.cmd(&["getrange", "k", "-2", "-1"]), R::s("yy"));
    assert_eq!(c.cmd(&["getrange", "k", "5", "9"]), R::s(""));
    assert_eq!(c.cmd(&["mset", "a", "1", "b", "2"]), R::ok());
    assert_eq!(c.cmd(&["msetnx", "b", "3", "c", "3"]), R::Int(0));
    assert_eq!(
        c.cmd(&["mget", "a", "b", "c"]),
        R::Array(vec![R::s("1"), R::s("2"), R::Nil])
    );
    assert_eq!(c.cmd(&["decrby", "a", "5"]), R::Int(-4));
    assert_eq!(c.cmd(&["getdel", "a"]), R::s("-4"));
    assert_eq!(c.cmd(&["exists", "a", "b", "b"]), R::Int(2));
    assert_eq!(c.cmd(&["type", "b"]), R::Simple("string".into()));
    // hashes
    assert_eq!(c.cmd(&["hmset", "h", "f1", "1", "f2", "2", "f3", "3"]), R::ok());
    assert_eq!(c.cmd(&["hsetnx", "h", "f1", "x"]), R::Int(0));
    assert_eq!(c.cmd(&["hlen", "h"]), R::Int(3));
    assert_eq!(c.cmd(&["hmget", "h", "f1", "nope"]), R::Array(vec![R::s("1"), R::Nil]));
    assert_eq!(c.cmd(&["hkeys", "h"]), R::arr(&["f1", "f2", "f3"]));
    assert_eq!(c.cmd(&["hvals", "h"]), R::arr(&["1", "2", "3"]));
    assert_eq!(c.cmd(&["hdel", "h", "f1", "f2", "nope"]), R::Int(2));
    assert_eq!(c.cmd(&["hexists", "h", "f3"]), R::Int(1));
    assert_eq!(c.cmd(&["type", "h"]), R::Simple("hash".into()));
    assert_eq!(c.cmd(&["hdel", "h", "f3"]), R::Int(1));
    assert_eq!(c.cmd(&["exists", "h"]), R::Int(0));
    // A key of another type is replaced whole by SET.
    assert_eq!(c.cmd(&["hset", "h2", "f", "v"]), R::Int(1));
    assert_eq!(c.cmd(&["set", "h2", "plain"]), R::ok());
    assert_eq!(c.cmd(&["hset", "h2x", "f", "v"]), R::Int(1));
    assert_eq!(c.cmd(&["hgetall", "h2x"]), R::arr(&["f", "v"]));
    // sorted sets
    assert_eq!(c.cmd(&["zadd", "z", "1", "a", "2", "b", "3", "c", "3", "d"]), R::Int(4));
    assert_eq!(c.cmd(&["zadd", "z", "ch", "5", "a", "2", "b"]), R::Int(1));
    assert_eq!(c.cmd(&["zadd", "z", "xx", "incr", "1", "a"]), R::s("6"));
    assert_eq!(c.cmd(&["zadd", "z", "nx", "incr", "1", "a"]), R::Nil);
    assert_eq!(c.cmd(&["zadd", "z", "gt", "1", "a"]), R::Int(0));
    assert_eq!(c.cmd(&["zscore", "z", "a"]), R::s("6"));
    assert_eq!(c.cmd(&["zcard", "z"]), R::Int(4));
    assert_eq!(c.cmd(&["zrange", "z", "0", "-1"]), R::arr(&["b", "c", "d", "a"]));
    assert_eq!(
        c.cmd(&["zrange", "z", "-2", "-1", "withscores"]),
        R::arr(&["d", "3", "a", "6"])
    );
    assert_eq!(
        c.cmd(&["zrange", "z", "(2", "+inf", "byscore", "limit", "1", "2"]),
        R::arr(&["d", "a"])
    );
    assert_eq!(
        c.cmd(&["zrange", "z", "+inf", "(2", "byscore", "rev"]),
        R::arr(&["a", "d", "c"])
    );
    assert_eq!(
        c.cmd(&["zrangebyscore", "z", "-inf", "3", "withscores"]),
        R::arr(&["b", "2", "c", "3", "d", "3"])
    );
    assert_eq!(c.cmd(&["zrevrangebyscore", "z", "3", "(2"]), R::arr(&["d", "c"]));
    assert_eq!(c.cmd(&["zrangebyscore", "z", "1.2E9", "+inf"]), R::arr(&[]));
    assert_eq!(c.cmd(&["zcount", "z", "(2", "3"]), R::Int(2));
    assert_eq!(c.cmd(&["zrank", "z", "d"]), R::Int(2));
    assert_eq!(c.cmd(&["zrevrank", "z", "d"]), R::Int(1));
    assert_eq!(c.cmd(&["zrank", "z", "nope"]), R::Nil);
    assert_eq!(c.cmd(&["zrem", "z", "a", "nope"]), R::Int(1));
    assert_eq!(
        c.cmd(&["zadd", "lex", "0", "a", "0", "b", "0", "c", "0", "d"]),
        R::Int(4)
    );
    assert_eq!(c.cmd(&["zrangebylex", "lex", "[b", "(d"]), R::arr(&["b", "c"]));
    assert_eq!(
        c.cmd(&["zrangebylex", "lex", "-", "+", "limit", "1", "2"]),
        R::arr(&["b", "c"])
    );
    assert_eq!(
        c.cmd(&["zrange", "lex", "+", "(b", "bylex", "rev"]),
        R::arr(&["d", "c"])
    );
    assert_eq!(
        c.cmd(&["zrange", "lex", "0", "1", "limit", "0", "1"]),
        R::Err("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX".into())
    );
    assert_eq!(c.cmd(&["del", "z", "lex", "b", "nope"]), R::Int(3));
    assert_eq!(c.cmd(&["zcard", "z"]), R::Int(0));
}

#[test]
fn scan_keys_and_ordered_reads() {
    let (_d, s) = start();
    let mut c = s.client();
    for i in 0..25 {
        assert_eq!(c.cmd(&["set", &format!("user:{i:02}"), &format!("v{i}")]), R::ok());
    }
    assert_eq!(c.cmd(&["hset", "user:hash", "f", "v"]), R::Int(1));
    assert_eq!(c.cmd(&["set", "other", "x"]), R::ok());
    // SCAN with a small COUNT returns every key exactly once, in key order.
    let mut seen = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let R::Array(r) = c.cmd(&["scan", &cursor, "count", "4"]) else {
            panic!()
        };
        let R::Bulk(next) = &r[0] else { panic!() };
        let R::Array(keys) = &r[1] else { panic!() };
        seen.extend(keys.iter().cloned());
        cursor = String::from_utf8(next.clone()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    let seen: Vec<Vec<u8>> = seen
        .into_iter()
        .map(|r| match r {
            R::Bulk(b) => b,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(seen.len(), 27);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "SCAN must return each key once, in key order");
    let R::Array(r) = c.cmd(&["scan", "0", "match", "user:1*", "count", "100"]) else {
        panic!()
    };
    assert_eq!(r[0], R::s("0"));
    assert_eq!(
        r[1],
        R::arr(&[
            "user:10", "user:11", "user:12", "user:13", "user:14", "user:15", "user:16", "user:17", "user:18",
            "user:19"
        ])
    );
    let R::Array(r) = c.cmd(&["scan", "0", "type", "hash", "count", "1000"]) else {
        panic!()
    };
    assert_eq!(r[1], R::arr(&["user:hash"]));
    assert_eq!(c.cmd(&["scan", "x"]), R::Err("ERR invalid cursor".into()));
    assert_eq!(
        c.cmd(&["keys", "user:2?"]),
        R::arr(&["user:20", "user:21", "user:22", "user:23", "user:24"])
    );
    // NV.RANGE / NV.PREFIX: string keys in key order.
    assert_eq!(
        c.cmd(&["nv.range", "user:03", "user:05", "withvalues"]),
        R::arr(&["user:03", "v3", "user:04", "v4", "user:05", "v5"])
    );
    assert_eq!(
        c.cmd(&["nv.range", "user:22", "+", "limit", "2", "rev"]),
        R::arr(&["user:24", "user:23"])
    );
    assert_eq!(c.cmd(&["nv.range", "-", "p", "limit", "1"]), R::arr(&["other"]));
    assert_eq!(
        c.cmd(&["nv.prefix", "user:0", "limit", "3"]),
        R::arr(&["user:00", "user:01", "user:02"])
    );
    assert_eq!(c.cmd(&["flushdb"]), R::ok());
    assert_eq!(c.cmd(&["dbsize"]), R::Int(0));
}

#[test]
fn server_commands_answer() {
    let (_d, s) = start();
    let mut c = s.client();
    let R::Bulk(info) = c.cmd(&["info"]) else { panic!() };
    let info = String::from_utf8(info).unwrap();
    for section in [
        "# Server",
        "# Clients",
        "# Memory",
        "# Persistence",
        "# Stats",
        "# Keyspace",
        "# Nvstore",
    ] {
        assert!(info.contains(section), "INFO lacks {section}:\n{info}");
    }
    for field in [
        "leaf_format:nv",
        "flushes:",
        "fences:",
        "splits:",
        "rebuilds:",
        "last_recovery:created",
    ] {
        assert!(info.contains(field), "INFO lacks {field}:\n{info}");
    }
    assert_eq!(
        c.cmd(&["config", "get", "save"]),
        R::Array(vec![R::s("save"), R::s("")])
    );
    assert_eq!(c.cmd(&["config", "get", "appendonly"]), R::arr(&["appendonly", "no"]));
    assert!(matches!(c.cmd(&["command", "count"]), R::Int(n) if n > 60));
    assert!(matches!(c.cmd(&["command", "docs", "get"]), R::Array(v) if v.len() == 2));
    assert!(matches!(c.cmd(&["command", "info", "get"]), R::Array(v) if v.len() == 1));
    assert!(matches!(c.cmd(&["command"]), R::Array(v) if v.len() > 60));
    assert_eq!(c.cmd(&["client", "setname", "me"]), R::ok());
    assert_eq!(c.cmd(&["client", "getname"]), R::s("me"));
    assert_eq!(c.cmd(&["client", "setinfo", "lib-name", "tests"]), R::ok());
    assert!(matches!(c.cmd(&["client", "id"]), R::Int(_)));
    let R::Bulk(list) = c.cmd(&["client", "list"]) else {
        panic!()
    };
    assert!(String::from_utf8(list).unwrap().contains("name=me"));
    assert_eq!(
        c.cmd(&["client", "setname", "a b"]),
        R::Err("ERR Client names cannot contain spaces, newlines or special characters.".into())
    );
    assert_eq!(c.cmd(&["ping"]), R::Simple("PONG".into()));
    assert_eq!(c.cmd(&["ping", "x"]), R::s("x"));
    assert_eq!(c.cmd(&["echo", "hi"]), R::s("hi"));
    assert_eq!(c.cmd(&["quit"]), R::ok());
    assert!(c.read().is_err());
}

#[test]
fn auth_and_maxclients() {
    let dir = pool_dir();
    let s = Server::start(
        &dir.path().join("p.nvs"),
        &["--requirepass", "sekret", "--maxclients", "2"],
    );
    let mut a = s.client();
    assert_eq!(a.cmd(&["get", "k"]), R::Err("NOAUTH Authentication required.".into()));
    assert_eq!(
        a.cmd(&["auth", "wrong"]),
        R::Err("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(a.cmd(&["auth", "sekret"]), R::ok());
    assert_eq!(a.cmd(&["set", "k", "v"]), R::ok());
    let mut b = s.client();
    assert!(matches!(b.cmd(&["hello", "3", "auth", "default", "sekret"]), R::Map(_)));
    assert_eq!(b.cmd(&["get", "k"]), R::s("v"));
    let mut third = s.client();
    assert_eq!(
        third.read().unwrap(),
        R::Err("ERR max number of clients reached".into())
    );
    drop(b);
    // The slot frees once the server notices the close.
    let mut ok = false;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let mut c = s.client();
        c.send_raw(b"AUTH sekret\r\n");
        if c.read().unwrap() == R::ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "a freed client slot must be reusable");
}

#[test]
fn shutdown_and_sigterm_close_cleanly_and_restart_is_instant() {
    let dir = pool_dir();
    let pool = dir.path().join("p.nvs");
    let mut s = Server::start(&pool, &[]);
    let mut c = s.client();
    assert_eq!(c.cmd(&["hset", "h", "f", "v"]), R::Int(1));
    c.send_raw(b"SHUTDOWN\r\n");
    assert!(c.read().is_err(), "SHUTDOWN closes the connection without a reply");
    assert!(s.wait().success(), "log:\n{}", s.log());
    assert!(s.log().contains("pool closed cleanly"), "log:\n{}", s.log());

    let s = Server::start(&pool, &[]);
    let mut c = s.client();
    assert_eq!(c.cmd(&["hget", "h", "f"]), R::s("v"));
    let R::Bulk(info) = c.cmd(&["info", "nvstore"]) else {
        panic!()
    };
    assert!(String::from_utf8(info).unwrap().contains("last_recovery:instant"));
    assert_eq!(c.cmd(&["set", "after", "1"]), R::ok());
    let st = s.signal_and_wait(15);
    assert!(st.success());

    let s = Server::start(&pool, &[]);
    let mut c = s.client();
    assert_eq!(c.cmd(&["get", "after"]), R::s("1"));
    let R::Bulk(info) = c.cmd(&["info", "nvstore"]) else {
        panic!()
    };
    assert!(String::from_utf8(info).unwrap().contains("last_recovery:instant"));
    let st = s.signal_and_wait(2);
    assert!(st.success());
}

#[test]
fn full_pool_answers_oom_and_keeps_serving_reads() {
    let dir = pool_dir();
    let s = Server::start(&dir.path().join("p.nvs"), &["--size", "1MiB", "--max-size", "1MiB"]);
    let mut c = s.client();
    let value = "x".repeat(4000);
    let mut stored = 0;
    let err = loop {
        match c.cmd(&["set", &format!("k{stored}"), &value]) {
            R::Simple(_) => stored += 1,
            R::Err(e) => break e,
            other => panic!("{other:?}"),
        }
        assert!(stored < 10_000, "a 1 MiB pool cannot hold 40 MB");
    };
    assert!(err.starts_with("OOM command not allowed"), "{err}");
    assert!(err.contains("pool is full"), "{err}");
    assert!(stored > 10);
    for i in 0..stored {
        assert_eq!(c.cmd(&["get", &format!("k{i}")]), R::Bulk(value.clone().into_bytes()));
    }
    // Still serving: reads above, and a fresh connection.
    let mut c2 = s.client();
    assert_eq!(c2.cmd(&["strlen", "k0"]), R::Int(4000));
    // A delete appends to a leaf, so in a full pool it may be refused too; either way, cleanly.
    match c2.cmd(&["del", "k0", "k2"]) {
        R::Int(2) => assert_eq!(c2.cmd(&["exists", "k0", "k2"]), R::Int(0)),
        R::Err(e) => assert!(e.starts_with("OOM"), "{e}"),
        other => panic!("{other:?}"),
    }
    match c2.cmd(&["del", "k0"]) {
        R::Int(0 | 1) => assert_eq!(c2.cmd(&["exists", "k0"]), R::Int(0)),
        R::Err(e) => assert!(e.starts_with("OOM"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c2.cmd(&["get", "k1"]), R::Bulk(value.into_bytes()));
}

#[test]
fn limits_on_bulk_size_and_engine_value_size() {
    let dir = pool_dir();
    let s = Server::start(&dir.path().join("p.nvs"), &["--max-bulk", "1MiB"]);
    let mut c = s.client();
    let big = vec![b'v'; 1 << 20];
    c.send(&[b"SET", b"big", &big]);
    assert_eq!(c.read().unwrap(), R::ok());
    let mut c2 = s.client();
    c2.send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1048577\r\n");
    assert_eq!(
        c2.read().unwrap(),
        R::Err("ERR Protocol error: invalid bulk length".into())
    );
    assert_eq!(c.cmd(&["strlen", "big"]), R::Int(1 << 20));
    drop(s);
    // Past the engine's 16 MiB value limit: an error reply, nothing stored.
    let s = Server::start(&dir.path().join("p.nvs"), &[]);
    let mut c = s.client();
    let huge = vec![b'v'; 17 << 20];
    c.send(&[b"SET", b"huge", &huge]);
    let r = c.read().unwrap();
    assert!(r.err_text().contains("limit"), "{r:?}");
    assert_eq!(c.cmd(&["exists", "huge"]), R::Int(0));
}

/// SIGKILL under pipelined load: every acknowledged write is there after a
/// restart, and every MSET/HSET is all-or-nothing. Two reactor threads (the
/// work-stealing runtime) whatever the machine's default.
#[test]
fn kill_under_pipelined_load_keeps_every_acknowledged_write() {
    kill_under_pipelined_load(&["--threads", "2"]);
}

/// The same on one thread: the current-thread runtime, EXEC on the
/// blocking pool beside it.
#[test]
fn kill_under_pipelined_load_on_one_thread_keeps_every_acknowledged_write() {
    kill_under_pipelined_load(&["--threads", "1"]);
}

fn kill_under_pipelined_load(extra: &[&str]) {
    let dir = pool_dir();
    let pool = dir.path().join("p.nvs");
    let s = Server::start(&pool, extra);
    let port = s.port;
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let acked = acked.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(port);
                let mut i = w << 40;
                while !stop.load(Ordering::Relaxed) {
                    // A window of 32 operations: SET, MSET of three keys, HSET of two
                    // fields, MULTI/SET/HSET/EXEC.
                    let mut batch = Vec::new();
                    let first = i;
                    for _ in 0..32 {
                        let (k, v) = (format!("s{i}"), format!("v{i}"));
                        batch.extend(match i % 4 {
                            0 => encode(&[b"SET", k.as_bytes(), v.as_bytes()]),
                            1 => encode(&[
                                b"MSET",
                                format!("m{i}a").as_bytes(),
                                v.as_bytes(),
                                format!("m{i}b").as_bytes(),
                                v.as_bytes(),
                                format!("m{i}c").as_bytes(),
                                v.as_bytes(),
                            ]),
                            2 => encode(&[
                                b"HSET",
                                format!("h{i}").as_bytes(),
                                b"f1",
                                v.as_bytes(),
                                b"f2",
                                v.as_bytes(),
                            ]),
                            _ => [
                                encode(&[b"MULTI"]),
                                encode(&[b"SET", format!("e{i}a").as_bytes(), v.as_bytes()]),
                                encode(&[b"HSET", format!("e{i}b").as_bytes(), b"f", v.as_bytes()]),
                                encode(&[b"EXEC"]),
                            ]
                            .concat(),
                        });
                        i += 1;
                    }
                    c.send_raw(&batch);
                    for n in first..i {
                        // MULTI, two QUEUED and EXEC's array for a transaction.
                        let replies = if n % 4 == 3 { 4 } else { 1 };
                        let mut last = R::Nil;
                        for _ in 0..replies {
                            match c.read() {
                                Ok(R::Err(e)) => panic!("write {n} failed: {e}"),
                                Ok(r) => last = r,
                                Err(_) => return,
                            }
                        }
                        if n % 4 == 3 {
                            assert_eq!(last, R::Array(vec![R::ok(), R::Int(1)]), "EXEC of {n}");
                        }
                        acked.lock().unwrap().push(n);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    s.kill9();
    stop.store(true, Ordering::Relaxed);
    writers.into_iter().for_each(|t| t.join().unwrap());
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 100, "only {} writes were acknowledged", acked.len());

    let s = Server::start(&pool, &[]);
    let mut c = s.client();
    let R::Bulk(info) = c.cmd(&["info", "nvstore"]) else {
        panic!()
    };
    assert!(String::from_utf8(info).unwrap().contains("last_recovery:rebuild"));
    let acked_set: HashSet<u64> = acked.iter().copied().collect();
    for &i in &acked {
        let v = R::s(&format!("v{i}"));
        match i % 4 {
            0 => assert_eq!(c.cmd(&["get", &format!("s{i}")]), v, "acknowledged SET {i} lost"),
            1 => assert_eq!(
                c.cmd(&["mget", &format!("m{i}a"), &format!("m{i}b"), &format!("m{i}c")]),
                R::Array(vec![v.clone(), v.clone(), v]),
                "acknowledged MSET {i} lost"
            ),
            2 => assert_eq!(
                c.cmd(&["hgetall", &format!("h{i}")]),
                R::Array(vec![R::s("f1"), v.clone(), R::s("f2"), v])
            ),
            _ => {
                assert_eq!(c.cmd(&["get", &format!("e{i}a")]), v, "acknowledged EXEC {i} lost");
                assert_eq!(
                    c.cmd(&["hget", &format!("e{i}b"), "f"]),
                    v,
                    "acknowledged EXEC {i} lost"
                );
            }
        }
    }
    // Unacknowledged multi-key writes are all-or-nothing.
    let R::Array(keys) = c.cmd(&["keys", "m*"]) else {
        panic!()
    };
    let mut groups = std::collections::HashMap::<String, usize>::new();
    for k in keys {
        let R::Bulk(k) = k else { panic!() };
        let k = String::from_utf8(k).unwrap();
        *groups.entry(k[..k.len() - 1].to_string()).or_default() += 1;
    }
    for (g, n) in &groups {
        assert_eq!(*n, 3, "MSET {g} is partially applied");
    }
    let R::Array(keys) = c.cmd(&["keys", "e*"]) else {
        panic!()
    };
    let mut txns = std::collections::HashMap::<String, usize>::new();
    for k in keys {
        let R::Bulk(k) = k else { panic!() };
        let k = String::from_utf8(k).unwrap();
        *txns.entry(k[..k.len() - 1].to_string()).or_default() += 1;
    }
    for (g, n) in &txns {
        assert_eq!(*n, 2, "transaction {g} is partially applied");
    }
    let R::Array(hashes) = c.cmd(&["keys", "h*"]) else {
        panic!()
    };
    for h in hashes {
        let R::Bulk(h) = h else { panic!() };
        assert_eq!(c.cmd(&["hlen", std::str::from_utf8(&h).unwrap()]), R::Int(2));
    }
    eprintln!(
        "{} acknowledged writes checked after SIGKILL ({} in the set)",
        acked.len(),
        acked_set.len()
    );
}

/// SIGKILL while pipelined HSETs move hashes from the small layout (whole
/// in one value) to one key per field: after a restart every acknowledged
/// field is there, each hash holds a prefix of the fields its connection
/// sent (commits are in order), HLEN agrees with HGETALL, and no field
/// key is left without its hash.
#[test]
fn kill_while_hashes_change_layout_keeps_every_acknowledged_field() {
    // Small up to 5 fields: every hash changes layout at its sixth field.
    kill_while_layout_changes(&LayoutKill {
        what: "hashes",
        opts: ["--hash-max-listpack-entries", "5"],
        write: |key, f| {
            vec![
                b"HSET".to_vec(),
                key.into(),
                format!("f{f}").into(),
                format!("{key}:{f}").into(),
            ]
        },
        present: |c, h| {
            let R::Array(all) = c.cmd(&["hgetall", h]) else {
                panic!()
            };
            let n = all.len() as u64 / 2;
            assert_eq!(
                c.cmd(&["hlen", h]),
                R::Int(n as i64),
                "{h}: HLEN disagrees with HGETALL"
            );
            // Fields f0..f{n-1} with their values, in field order.
            let mut want: Vec<u64> = (0..n).collect();
            want.sort_by_key(|f| format!("f{f}"));
            let want: Vec<R> = want
                .iter()
                .flat_map(|f| [R::s(&format!("f{f}")), R::s(&format!("{h}:{f}"))])
                .collect();
            assert_eq!(all, want, "{h}: not a prefix of the fields sent");
            // Compact exactly while within the limit: the move and the write
            // that caused it commit together.
            let layout = match n {
                0 => R::Nil,
                1..=5 => R::s("listpack"),
                _ => R::s("hashtable"),
            };
            assert_eq!(c.cmd(&["object", "encoding", h]), layout, "{h}: {n} fields");
            n
        },
    });
}

/// The same for sorted sets: pipelined ZADDs move them from the small
/// layout to one key pair per member while the kill lands. Every
/// acknowledged member is there with its score, each set holds a prefix
/// of the members sent, ZCARD, ZRANGE, ZRANGEBYLEX and ZRANK agree, and no
/// member or score key is left without its set.
#[test]
fn kill_while_sorted_sets_change_layout_keeps_every_acknowledged_member() {
    kill_while_layout_changes(&LayoutKill {
        what: "sorted sets",
        opts: ["--zset-max-listpack-entries", "5"],
        // Member m{f} scores f: score order is send order.
        write: |key, f| {
            vec![
                b"ZADD".to_vec(),
                key.into(),
                f.to_string().into(),
                format!("m{f}").into(),
            ]
        },
        present: |c, z| {
            let R::Array(all) = c.cmd(&["zrange", z, "0", "-1", "withscores"]) else {
                panic!()
            };
            let n = all.len() as u64 / 2;
            let want: Vec<R> = (0..n)
                .flat_map(|f| [R::s(&format!("m{f}")), R::s(&f.to_string())])
                .collect();
            assert_eq!(all, want, "{z}: not a prefix of the members sent");
            assert_eq!(
                c.cmd(&["zcard", z]),
                R::Int(n as i64),
                "{z}: ZCARD disagrees with ZRANGE"
            );
            let R::Array(lex) = c.cmd(&["zrangebylex", z, "-", "+"]) else {
                panic!()
            };
            assert_eq!(lex.len() as u64, n, "{z}: the member keys disagree with the score keys");
            if n > 0 {
                let last = format!("m{}", n - 1);
                assert_eq!(c.cmd(&["zrank", z, &last]), R::Int(n as i64 - 1), "{z}");
                let layout = if n <= 5 { "listpack" } else { "skiplist" };
                assert_eq!(c.cmd(&["object", "encoding", z]), R::s(layout), "{z}: {n} members");
            }
            n
        },
    });
}

/// A kill test of a type whose values change layout under load.
struct LayoutKill {
    what: &'static str,
    /// Server options that make a value change layout after 5 items.
    opts: [&'static str; 2],
    /// The command that adds item `f` to key `key` (answers `:1`).
    write: fn(&str, u64) -> Vec<Vec<u8>>,
    /// Checks `key` after the restart and returns how many items it holds.
    present: fn(&mut Client, &str) -> u64,
}

/// Two connections write the 12 items of three keys at a time,
/// interleaved (one pipelines them, one sends them one by one), while the
/// server is SIGKILLed; after a restart every key
/// holds at least its acknowledged items ([`LayoutKill::present`] checks
/// their shape), and deleting every key leaves no tree key behind.
fn kill_while_layout_changes(t: &LayoutKill) {
    const ITEMS: u64 = 12;
    let dir = pool_dir();
    let pool = dir.path().join("p.nvs");
    let s = Server::start(&pool, &t.opts);
    let port = s.port;
    // Per key: how many of its items were acknowledged.
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let write = t.write;
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let acked = acked.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(port);
                let mut h = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Three keys at a time, their items interleaved in one pipeline.
                    let names: Vec<String> = (0..3).map(|j| format!("g{w}_{}", h + j)).collect();
                    h += 3;
                    let mut batch = Vec::new();
                    for f in 0..ITEMS {
                        for n in &names {
                            let cmd = write(n, f);
                            let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
                            batch.push(encode(&args));
                        }
                    }
                    // Writer 0 pipelines the batch (the server commits it as
                    // groups); writer 1 sends one command at a time (each
                    // commits alone, a small value as a one-key write).
                    if w == 0 {
                        c.send_raw(&batch.concat());
                    }
                    let mut cmds = batch.iter();
                    let mut done = vec![0u64; names.len()];
                    for _ in 0..ITEMS {
                        for (j, n) in names.iter().enumerate() {
                            let cmd = cmds.next().unwrap();
                            let sent = w == 0 || c.try_send_raw(cmd).is_ok();
                            match c.read().ok().filter(|_| sent) {
                                Some(R::Int(1)) => done[j] += 1,
                                Some(r) => panic!("write to {n} answered {r:?}"),
                                None => {
                                    let mut a = acked.lock().unwrap();
                                    a.extend(names.iter().cloned().zip(done.iter().copied()));
                                    return;
                                }
                            }
                        }
                    }
                    acked.lock().unwrap().extend(names.into_iter().zip(done));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    s.kill9();
    stop.store(true, Ordering::Relaxed);
    writers.into_iter().for_each(|t| t.join().unwrap());
    let acked = acked.lock().unwrap().clone();
    let whole = acked.iter().filter(|(_, n)| *n == ITEMS).count();
    assert!(whole > 10, "only {whole} {} were fully acknowledged", t.what);

    let s = Server::start(&pool, &t.opts);
    let mut c = s.client();
    let acked: std::collections::HashMap<String, u64> = acked.into_iter().collect();
    let R::Array(keys) = c.cmd(&["keys", "g*"]) else {
        panic!()
    };
    let mut present = HashSet::new();
    for k in keys {
        let R::Bulk(k) = k else { panic!() };
        present.insert(String::from_utf8(k).unwrap());
    }
    for h in present.iter().chain(acked.keys()) {
        let n = (t.present)(&mut c, h);
        assert!(
            n >= acked.get(h).copied().unwrap_or(0),
            "{h}: acknowledged items lost ({n} left)"
        );
    }
    // No sub-key outlives its key: deleting each key leaves nothing.
    for h in &present {
        c.cmd(&["del", h]);
    }
    assert_eq!(c.cmd(&["dbsize"]), R::Int(0));
    let R::Bulk(info) = c.cmd(&["info", "nvstore"]) else {
        panic!()
    };
    let info = String::from_utf8(info).unwrap();
    assert!(info.contains("last_recovery:rebuild"), "{info}");
    assert!(info.contains("tree_keys:0\r\n"), "sub-keys left behind: {info}");
    eprintln!(
        "{} {} checked after SIGKILL, {whole} fully acknowledged",
        present.len(),
        t.what
    );
}

/// A client that pipelines large replies and does not read them, and one
/// that connects and stays idle, block no one else; the slow client gets
/// every reply, in order, once it reads.
#[test]
fn slow_and_idle_clients_do_not_block_others() {
    let (_d, s) = start();
    let mut c = s.client();
    let big = vec![b'x'; 1 << 20];
    c.send(&[b"SET", b"big", &big]);
    assert_eq!(c.read().unwrap(), R::ok());
    let _idle = s.client();
    let mut slow = s.client();
    let mut req = Vec::new();
    for i in 0..100 {
        req.extend(encode(&[b"GET", b"big"]));
        req.extend(encode(&[b"ECHO", format!("{i}").as_bytes()]));
    }
    slow.send_raw(&req);
    std::thread::sleep(Duration::from_millis(200));
    let t = std::time::Instant::now();
    for i in 0..50 {
        assert_eq!(c.cmd(&["set", &format!("k{i}"), "v"]), R::ok());
        assert_eq!(c.cmd(&["ping"]), R::Simple("PONG".into()));
    }
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "others were held up: {:?}",
        t.elapsed()
    );
    for i in 0..100 {
        assert_eq!(slow.read().unwrap(), R::Bulk(big.clone()));
        assert_eq!(slow.read().unwrap(), R::s(&i.to_string()));
    }
}

/// Random bytes (and random RESP-shaped junk) on many connections never
/// take the server down: each connection gets replies or a protocol error.
#[test]
fn random_input_never_takes_the_server_down() {
    use rand::{Rng, SeedableRng};
    let (_d, s) = start();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let pieces: [&[u8]; 12] = [
        b"*",
        b"$",
        b"\r\n",
        b"3",
        b"-1",
        b"SET",
        b"GET",
        b"\"",
        b"'",
        b" ",
        b"99999999999",
        b"\x00\xff",
    ];
    for _ in 0..200 {
        let mut junk = Vec::new();
        for _ in 0..rng.gen_range(1..40) {
            if rng.gen_bool(0.5) {
                junk.extend_from_slice(pieces[rng.gen_range(0..pieces.len())]);
            } else {
                junk.push(rng.gen());
            }
        }
        let mut c = s.client();
        c.w.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.send_raw(&junk);
        // End of input: the server answers what was complete and closes.
        c.w.shutdown(std::net::Shutdown::Write).unwrap();
        loop {
            match c.read_lenient() {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(e) => panic!("the server neither answered nor closed: {e}; input {junk:?}"),
            }
        }
    }
    let mut c = s.client();
    assert_eq!(c.cmd(&["ping"]), R::Simple("PONG".into()));
    assert_eq!(c.cmd(&["set", "still", "here"]), R::ok());
}

/// Startup failures exit 2 with one clear line and leave no pool behind.
#[test]
fn startup_errors_are_one_clear_line() {
    let bin = env!("CARGO_BIN_EXE_nvstore");
    let out = std::process::Command::new(bin)
        .args(["serve", "--pool", "/nonexistent-dir/x.nvs", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("directory /nonexistent-dir does not exist"), "{err}");

    let (d, s) = start();
    let taken = s.port.to_string();
    let other = d.path().join("other.nvs");
    let out = std::process::Command::new(bin)
        .args(["serve", "--pool", other.to_str().unwrap(), "--port", &taken])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on 127.0.0.1:{taken}")), "{err}");
    // The same pool cannot be served twice.
    let out = std::process::Command::new(bin)
        .args(["serve", "--pool", s.pool.to_str().unwrap(), "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already open"));
}

/// YCSB workloads A-F, through the YCSB redis binding's layout (a hash per
/// record, keys in the `_indices` zset, scans by ZRANGEBYSCORE), run against
/// `nvstore serve` with `nvstore bench ycsb --target resp://...`: every
/// operation succeeds and every read finds its record.
#[test]
fn ycsb_workloads_run_against_serve() {
    let (_d, s) = start();
    for w in ["a", "b", "c", "d", "e", "f"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nvstore"))
            .args([
                "bench",
                "ycsb",
                "--workload",
                w,
                "--records",
                "500",
                "--ops",
                "1000",
                "--threads",
                "2",
            ])
            .args(["--target", &format!("resp://127.0.0.1:{}", s.port), "--json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "workload {w}: {}\n{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let ops = v["operations"].as_object().unwrap();
        let total: u64 = ops.values().map(|o| o["count"].as_u64().unwrap()).sum();
        assert_eq!(total, 1000, "workload {w}: {text}");
        for (name, o) in ops {
            assert_eq!(o["not_found"].as_u64(), Some(0), "workload {w} {name}: {text}");
        }
    }
}
