//! `nvstore serve` driven by real Redis clients: redis-cli (one-shot and
//! `--pipe`), redis-py (RESP3, its default, and RESP2) and redis-benchmark.
//! A missing tool skips its test with a reason, or fails it under
//! `NVSTORE_REQUIRE_TOOLS=1` (CI).

mod server_support;

use std::io::Write;
use std::process::{Command, Stdio};

use server_support::{encode, have_tool, pool_dir, Server, R};

fn start() -> (tempfile::TempDir, Server) {
    let dir = pool_dir();
    let s = Server::start(&dir.path().join("p.nvs"), &[]);
    (dir, s)
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn redis_cli_one_shot_and_pipe() {
    if !have_tool("redis-cli", &["--version"]) {
        return;
    }
    let (_d, s) = start();
    let p = s.port;
    assert_eq!(redis_cli(p, &["ping"]), "PONG\n");
    assert_eq!(redis_cli(p, &["set", "greeting", "hello world"]), "OK\n");
    assert_eq!(redis_cli(p, &["get", "greeting"]), "hello world\n");
    assert_eq!(redis_cli(p, &["hset", "h", "a", "1", "b", "2"]), "2\n");
    assert_eq!(redis_cli(p, &["hgetall", "h"]), "a\n1\nb\n2\n");
    assert_eq!(redis_cli(p, &["zadd", "z", "1", "x", "2", "y"]), "2\n");
    assert_eq!(redis_cli(p, &["zrange", "z", "0", "-1", "withscores"]), "x\n1\ny\n2\n");
    assert_eq!(
        redis_cli(p, &["nosuch", "a"]),
        "ERR unknown command 'nosuch', with args beginning with: 'a' \n\n"
    );
    // RESP3 (a map reply), printed as redis-cli prints maps to a pipe.
    assert_eq!(redis_cli(p, &["-3", "hgetall", "h"]), "a 1\nb 2\n");

    // --pipe: 10 000 SETs and HSETs in raw RESP on stdin.
    let mut input = Vec::new();
    for i in 0..5000 {
        input.extend(encode(&[
            b"SET",
            format!("pk{i}").as_bytes(),
            format!("{i}").as_bytes(),
        ]));
        input.extend(encode(&[b"HSET", b"ph", format!("f{i}").as_bytes(), b"v"]));
    }
    let mut child = Command::new("redis-cli")
        .args(["-p", &p.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("errors: 0, replies: 10000"), "{text}");
    assert_eq!(redis_cli(p, &["get", "pk4999"]), "4999\n");
    assert_eq!(redis_cli(p, &["hlen", "ph"]), "5000\n");
}

#[test]
fn redis_py_resp3_and_resp2() {
    let probe = "import redis, sys; sys.exit(0 if int(redis.__version__.split('.')[0]) >= 8 else 1)";
    if !have_tool("python3", &["-c", probe]) {
        return;
    }
    let (_d, s) = start();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/server_scripts/redis_py_check.py");
    for proto in ["3", "2"] {
        let out = Command::new("python3")
            .arg(script)
            .arg(s.port.to_string())
            .arg(proto)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-py protocol {proto} failed:\n{}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            s.log()
        );
        eprint!("{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// Runs redis-benchmark; returns (test name, requests per second) per test.
fn benchmark(port: u16, extra: &[&str]) -> Vec<(String, f64)> {
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-q"])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "redis-benchmark {extra:?} failed:\n{text}");
    assert!(!text.contains("rror"), "redis-benchmark saw errors:\n{text}");
    text.split(['\r', '\n'])
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(": ")?;
            let rps = rest
                .strip_suffix(" requests per second")
                .or_else(|| rest.split(" requests per second").next())?;
            Some((name.to_string(), rps.trim().parse::<f64>().ok()?))
        })
        .filter(|(_, rps)| *rps > 0.0)
        .collect()
}

#[test]
fn redis_benchmark_plain_and_pipelined() {
    if !have_tool("redis-benchmark", &["--version"]) {
        return;
    }
    let (_d, s) = start();
    let tests = "set,get,incr,hset,zadd,mset";
    let expect = ["SET", "GET", "INCR", "HSET", "ZADD", "MSET (10 keys)"];
    for extra in [
        &["-t", tests, "-n", "20000"][..],
        &["-t", tests, "-n", "20000", "-P", "16"][..],
    ] {
        let results = benchmark(s.port, extra);
        for name in expect {
            assert!(
                results.iter().any(|(n, _)| n == name),
                "no result line for {name} with {extra:?}: {results:?}"
            );
        }
        eprintln!("redis-benchmark {extra:?}: {results:?}");
    }
    // INCR ran 20 000 times per run on one counter from 50 connections: atomic.
    let mut c = s.client();
    assert_eq!(c.cmd(&["get", "counter:__rand_int__"]), R::s("40000"));
    assert_eq!(c.cmd(&["type", "myhash"]), R::Simple("hash".into()));
    assert_eq!(c.cmd(&["zcard", "myzset"]), R::Int(1));
}
