//! Connection and server commands: PING, ECHO, HELLO, AUTH, SELECT, QUIT,
//! RESET, CLIENT, COMMAND, INFO, CONFIG, SHUTDOWN, MULTI/EXEC/DISCARD,
//! WATCH/UNWATCH. None of them touches data except through a snapshot
//! (INFO's key count) or EXEC's transaction.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{eq, wrong_arity, Conn, Kind, Spec, COMMANDS, NOT_INT};
use crate::keys::META;
use crate::resp::Reply;
use crate::shared::Shared;

/// The Redis version HELLO and INFO report: the command set and replies
/// follow Redis 7.2 (clients gate features on this number).
pub const REDIS_VERSION: &str = "7.2.0";

pub fn run(sh: &Arc<Shared>, c: &mut Conn, spec: &Spec, a: &[Bytes]) -> Reply {
    match spec.name {
        "ping" => match a.len() {
            1 => Reply::Status("PONG"),
            2 => Reply::bulk(&a[1][..]),
            _ => wrong_arity("ping"),
        },
        "echo" => Reply::bulk(&a[1][..]),
        "hello" => hello(sh, c, a),
        "auth" => auth(sh, c, a),
        "select" => match crate::num::parse_i64(&a[1]) {
            Some(0) => Reply::ok(),
            Some(_) => Reply::err("ERR DB index is out of range"),
            None => Reply::err(NOT_INT),
        },
        "quit" => {
            c.close = true;
            Reply::ok()
        }
        "reset" => {
            c.multi = None;
            c.multi_error = false;
            c.watches.clear();
            c.proto = 2;
            c.authed = sh.cfg.requirepass.is_none();
            update_client(sh, c.id, |i| {
                i.name.clear();
                i.resp = 2;
            });
            Reply::Status("RESET")
        }
        "client" => client(sh, c, a),
        "command" => command(a),
        "info" => Reply::bulk(info(sh, &a[1..])),
        "config" => config(sh, a),
        "shutdown" => {
            let _ = sh.shutdown.send(true);
            c.close = true;
            // Redis closes the connection without a reply when it shuts down.
            Reply::Raw(b"")
        }
        "multi" => {
            if c.multi.is_some() {
                return Reply::err("ERR MULTI calls can not be nested");
            }
            c.multi = Some(Vec::new());
            Reply::ok()
        }
        "exec" => super::exec(sh, c),
        "discard" => {
            if c.multi.take().is_none() {
                return Reply::err("ERR DISCARD without MULTI");
            }
            c.multi_error = false;
            c.watches.clear();
            Reply::ok()
        }
        "watch" => {
            if c.multi.is_some() {
                return Reply::err("ERR WATCH inside MULTI is not allowed");
            }
            let ts = sh.store.last_commit_ts();
            for k in &a[1..] {
                c.watches.push((crate::keys::meta_key(k), ts));
            }
            Reply::ok()
        }
        "unwatch" => {
            c.watches.clear();
            Reply::ok()
        }
        other => Reply::err(format!("ERR internal: no handler for '{other}'")),
    }
}

fn update_client(sh: &Shared, id: u64, f: impl FnOnce(&mut crate::shared::ClientInfo)) {
    if let Some(i) = sh.clients.lock().get_mut(&id) {
        f(i);
    }
}

fn check_password(sh: &Shared, user: &[u8], pass: &[u8]) -> bool {
    user == b"default" && sh.cfg.requirepass.as_deref().is_none_or(|p| p.as_bytes() == pass)
}

fn auth(sh: &Shared, c: &mut Conn, a: &[Bytes]) -> Reply {
    let (user, pass): (&[u8], &[u8]) = match a.len() {
        2 => (b"default", &a[1]),
        3 => (&a[1], &a[2]),
        _ => return Reply::err(super::SYNTAX),
    };
    if a.len() == 2 && sh.cfg.requirepass.is_none() {
        return Reply::err(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    if check_password(sh, user, pass) {
        c.authed = true;
        Reply::ok()
    } else {
        Reply::err("WRONGPASS invalid username-password pair or user is disabled.")
    }
}

fn valid_name(n: &[u8]) -> bool {
    n.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

const BAD_NAME: &str = "ERR Client names cannot contain spaces, newlines or special characters.";

/// HELLO [protover [AUTH user pass] [SETNAME name]]
fn hello(sh: &Shared, c: &mut Conn, a: &[Bytes]) -> Reply {
    let mut proto = c.proto;
    if a.len() > 1 {
        match crate::num::parse_i64(&a[1]) {
            Some(v @ 2..=3) => proto = v as u8,
            Some(_) => return Reply::err("NOPROTO unsupported protocol version"),
            None => return Reply::err("ERR Protocol version is not an integer or out of range"),
        }
    }
    let mut name = None;
    let mut i = 2;
    while i < a.len() {
        if eq(&a[i], "auth") && i + 2 < a.len() {
            if !check_password(sh, &a[i + 1], &a[i + 2]) {
                return Reply::err("WRONGPASS invalid username-password pair or user is disabled.");
            }
            c.authed = true;
            i += 3;
        } else if eq(&a[i], "setname") && i + 1 < a.len() {
            if !valid_name(&a[i + 1]) {
                return Reply::err(BAD_NAME);
            }
            name = Some(String::from_utf8_lossy(&a[i + 1]).into_owned());
            i += 2;
        } else {
            return Reply::err(format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(&a[i])
            ));
        }
    }
    if !c.authed {
        return Reply::err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    c.proto = proto;
    update_client(sh, c.id, |i| {
        i.resp = proto;
        if let Some(n) = name {
            i.name = n;
        }
    });
    let s = |x: &str| Reply::bulk(x.as_bytes());
    Reply::Map(vec![
        (s("server"), s("redis")),
        (s("version"), s(REDIS_VERSION)),
        (s("proto"), Reply::Int(proto as i64)),
        (s("id"), Reply::Int(c.id as i64)),
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (s("modules"), Reply::Array(Vec::new())),
    ])
}

fn client_line(id: u64, i: &crate::shared::ClientInfo) -> String {
    let age = i.created.elapsed().as_secs();
    format!(
        "id={id} addr={} laddr={} fd=0 name={} age={age} idle=0 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 user=default lib-name={} lib-ver={} resp={}\n",
        i.addr, i.laddr, i.name, i.lib_name, i.lib_ver, i.resp
    )
}

fn client(sh: &Shared, c: &mut Conn, a: &[Bytes]) -> Reply {
    let sub = String::from_utf8_lossy(&a[1]).to_lowercase();
    let n = a.len();
    match sub.as_str() {
        "id" if n == 2 => Reply::Int(c.id as i64),
        "getname" if n == 2 => {
            let name = sh.clients.lock().get(&c.id).map(|i| i.name.clone()).unwrap_or_default();
            if name.is_empty() {
                Reply::Nil
            } else {
                Reply::bulk(name)
            }
        }
        "setname" if n == 3 => {
            if !valid_name(&a[2]) {
                return Reply::err(BAD_NAME);
            }
            let name = String::from_utf8_lossy(&a[2]).into_owned();
            update_client(sh, c.id, |i| i.name = name);
            Reply::ok()
        }
        "setinfo" if n == 4 => {
            let v = String::from_utf8_lossy(&a[3]).into_owned();
            if v.bytes().any(|b| !(b'!'..=b'~').contains(&b)) {
                return Reply::err(format!("ERR {} cannot contain spaces, newlines or special characters.", String::from_utf8_lossy(&a[2])));
            }
            if eq(&a[2], "lib-name") {
                update_client(sh, c.id, |i| i.lib_name = v);
            } else if eq(&a[2], "lib-ver") {
                update_client(sh, c.id, |i| i.lib_ver = v);
            } else {
                return Reply::err(format!("ERR Unrecognized option '{}'", String::from_utf8_lossy(&a[2])));
            }
            Reply::ok()
        }
        "list" => {
            let clients = sh.clients.lock();
            Reply::bulk(clients.iter().map(|(id, i)| client_line(*id, i)).collect::<String>())
        }
        "info" if n == 2 => {
            let clients = sh.clients.lock();
            Reply::bulk(clients.get(&c.id).map(|i| client_line(c.id, i)).unwrap_or_default())
        }
        "no-evict" | "no-touch" if n == 3 => Reply::ok(),
        "help" => Reply::Array(
            ["CLIENT <subcommand>: ID, GETNAME, SETNAME <name>, SETINFO <LIB-NAME|LIB-VER> <value>, LIST, INFO, HELP"]
                .iter()
                .map(|s| Reply::StatusOwned(s.to_string()))
                .collect(),
        ),
        "id" | "getname" | "setname" | "setinfo" | "info" | "no-evict" | "no-touch" => wrong_arity(&format!("client|{sub}")),
        _ => Reply::err(format!("ERR unknown subcommand '{}'. Try CLIENT HELP.", String::from_utf8_lossy(&a[1]))),
    }
}

fn command_info(s: &Spec) -> Reply {
    let flag = match s.kind {
        Kind::Write => "write",
        Kind::Read => "readonly",
        Kind::Conn => "fast",
    };
    Reply::Array(vec![
        Reply::bulk(s.name),
        Reply::Int(s.arity as i64),
        Reply::Set(vec![Reply::Status(flag)]),
        Reply::Int(s.first_key as i64),
        Reply::Int(s.last_key as i64),
        Reply::Int(s.step as i64),
        Reply::Set(Vec::new()),
        Reply::Set(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

fn group(s: &Spec) -> &'static str {
    match s.name.as_bytes()[0] {
        _ if s.kind == Kind::Conn => "connection",
        b'h' => "hash",
        b'z' => "sorted-set",
        b'n' => "nvstore",
        _ => "generic",
    }
}

/// COMMAND [COUNT | LIST | INFO name... | DOCS name...]
fn command(a: &[Bytes]) -> Reply {
    if a.len() == 1 {
        return Reply::Array(COMMANDS.iter().map(command_info).collect());
    }
    let names = &a[2..];
    let pick = |f: &dyn Fn(&Spec) -> Reply| -> Vec<Reply> {
        if names.is_empty() {
            COMMANDS.iter().map(f).collect()
        } else {
            names.iter().map(|n| super::lookup(n).map_or(Reply::Nil, f)).collect()
        }
    };
    if eq(&a[1], "count") {
        Reply::Int(COMMANDS.len() as i64)
    } else if eq(&a[1], "list") {
        Reply::Array(COMMANDS.iter().map(|s| Reply::bulk(s.name)).collect())
    } else if eq(&a[1], "info") {
        Reply::Array(pick(&command_info))
    } else if eq(&a[1], "docs") {
        let specs: Vec<&Spec> = if names.is_empty() {
            COMMANDS.iter().collect()
        } else {
            names.iter().filter_map(|n| super::lookup(n)).collect()
        };
        Reply::Map(
            specs
                .into_iter()
                .map(|s| {
                    let doc = Reply::Map(vec![
                        (
                            Reply::bulk("summary"),
                            Reply::bulk(format!("{} (nvstore serve)", s.name.to_uppercase())),
                        ),
                        (Reply::bulk("since"), Reply::bulk("1.0.0")),
                        (Reply::bulk("group"), Reply::bulk(group(s))),
                    ]);
                    (Reply::bulk(s.name), doc)
                })
                .collect(),
        )
    } else {
        Reply::err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(&a[1])
        ))
    }
}

/// Resident set size of this process, from /proc.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2}{}", U[i])
}

/// INFO [section ...]: server, clients, memory, persistence, stats,
/// keyspace, nvstore; `all`/`everything`/`default` (or none) for every one.
pub fn info(sh: &Shared, sections: &[Bytes]) -> String {
    let want = |s: &str| {
        sections.is_empty()
            || sections
                .iter()
                .any(|x| eq(x, s) || eq(x, "all") || eq(x, "everything") || eq(x, "default"))
    };
    let db = sh.store.db();
    let st = db.stat();
    let mut o = String::new();
    let up = sh.started.elapsed().as_secs();
    if want("server") {
        let _ = write!(
            o,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nnvstore_version:{}\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:64\r\n\
             multiplexing_api:epoll (tokio)\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{up}\r\nuptime_in_days:{}\r\n\
             executable:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH,
            std::process::id(),
            sh.run_id,
            sh.port,
            up / 86400,
            std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
        );
    }
    if want("clients") {
        let _ = write!(
            o,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:0\r\n\r\n",
            sh.connected.load(Ordering::Relaxed),
            sh.cfg.maxclients
        );
    }
    if want("memory") {
        let rss = rss_bytes();
        let _ = write!(
            o,
            "# Memory\r\nused_memory:{rss}\r\nused_memory_human:{}\r\nused_memory_rss:{rss}\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n\
             nvstore_pool_size:{}\r\nnvstore_pool_used:{}\r\nnvstore_pool_used_human:{}\r\n\r\n",
            human(rss),
            st.size_bytes,
            st.used_bytes,
            human(st.used_bytes),
        );
    }
    if want("persistence") {
        let _ = write!(
            o,
            "# Persistence\r\nloading:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:0\r\nrdb_last_save_time:0\r\n\
             rdb_last_bgsave_status:ok\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n\
             nvstore_durable_on_ack:1\r\nnvstore_mapping:{}\r\nnvstore_flush_instruction:{}\r\nnvstore_pool:{}\r\n\r\n",
            st.mapping, st.flush, st.path
        );
    }
    if want("stats") {
        let s = &sh.stats;
        let _ = write!(
            o,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:0\r\n\
             total_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nrejected_connections:{}\r\nexpired_keys:0\r\nevicted_keys:0\r\n\r\n",
            s.connections.load(Ordering::Relaxed),
            s.commands.load(Ordering::Relaxed),
            s.net_in.load(Ordering::Relaxed),
            s.net_out.load(Ordering::Relaxed),
            s.rejected.load(Ordering::Relaxed),
        );
    }
    if want("keyspace") {
        let snap = sh.store.snapshot();
        let n = snap.range(vec![META]..vec![META + 1]).count();
        o.push_str("# Keyspace\r\n");
        if n > 0 {
            let _ = write!(o, "db0:keys={n},expires=0,avg_ttl=0\r\n");
        }
        o.push_str("\r\n");
    }
    if want("nvstore") {
        let c = nvstore::pmem::Counters::sum();
        let _ = write!(
            o,
            "# Nvstore\r\nleaf_format:{}\r\nnode_size:{}\r\ntree_keys:{}\r\nleaves:{}\r\nflushes:{}\r\nfences:{}\r\nsplits:{}\r\n\
             replaces:{}\r\nmerges:{}\r\nrebuilds:{}\r\nrebuild_ms:{:.3}\r\nlast_recovery:{}\r\nlast_recovery_ms:{:.3}\r\n\
             clean_shutdown_found:{}\r\nlast_commit_ts:{}\r\n",
            st.leaf_format,
            st.node_size,
            st.keys,
            st.leaves,
            c.flushes,
            c.fences,
            st.splits,
            st.replaces,
            st.merges,
            st.rebuilds,
            st.rebuild_ms,
            recovery_kind(st.last_recovery.kind),
            st.last_recovery.millis,
            st.clean_shutdown as u8,
            sh.store.last_commit_ts(),
        );
    }
    while o.ends_with("\r\n\r\n") {
        o.truncate(o.len() - 2);
    }
    o
}

fn recovery_kind(k: nvstore::RecoveryKind) -> &'static str {
    match k {
        nvstore::RecoveryKind::Created => "created",
        nvstore::RecoveryKind::Instant => "instant",
        nvstore::RecoveryKind::Rebuild => "rebuild",
        nvstore::RecoveryKind::Loaded => "loaded",
    }
}

/// CONFIG GET pattern... over the few parameters that mean something here.
fn config(sh: &Shared, a: &[Bytes]) -> Reply {
    if eq(&a[1], "get") {
        if a.len() < 3 {
            return wrong_arity("config|get");
        }
        let c = &sh.cfg;
        let params: Vec<(&str, String)> = vec![
            // No RDB snapshots and no AOF: every acknowledged write is already in the pool.
            ("save", String::new()),
            ("appendonly", "no".into()),
            ("databases", "1".into()),
            ("maxclients", c.maxclients.to_string()),
            ("maxmemory", "0".into()),
            ("maxmemory-policy", "noeviction".into()),
            ("port", sh.port.to_string()),
            ("bind", c.bind.clone()),
            ("timeout", "0".into()),
            ("requirepass", c.requirepass.clone().unwrap_or_default()),
            ("proto-max-bulk-len", c.limits.max_bulk.to_string()),
            ("io-threads", c.threads.to_string()),
            ("hash-max-listpack-entries", c.compact.entries.to_string()),
            ("hash-max-listpack-value", c.compact.value.to_string()),
            ("hash-max-listpack-bytes", c.compact.bytes.to_string()),
            ("zset-max-listpack-entries", c.zcompact.entries.to_string()),
            ("zset-max-listpack-value", c.zcompact.value.to_string()),
            ("zset-max-listpack-bytes", c.zcompact.bytes.to_string()),
        ];
        let mut out = Vec::new();
        for (k, v) in &params {
            if a[2..]
                .iter()
                .any(|p| super::keyspace::glob(&p.to_ascii_lowercase(), k.as_bytes()))
            {
                out.push((Reply::bulk(*k), Reply::bulk(v.as_bytes())));
            }
        }
        return Reply::Map(out);
    }
    if eq(&a[1], "set") {
        return Reply::err("ERR CONFIG SET is not supported by nvstore serve: its settings come from the command line");
    }
    if eq(&a[1], "resetstat") && a.len() == 2 {
        let s = &sh.stats;
        for x in [&s.commands, &s.connections, &s.rejected, &s.net_in, &s.net_out] {
            x.store(0, Ordering::Relaxed);
        }
        return Reply::ok();
    }
    Reply::err(format!(
        "ERR unknown subcommand '{}'. Try CONFIG HELP.",
        String::from_utf8_lossy(&a[1])
    ))
}
