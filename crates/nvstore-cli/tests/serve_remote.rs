//! `nvstore serve --remote ADDR`: the Redis-protocol server on a pool that
//! lives on an AsymNVM back-end process (`nvstore backend`), over loopback.
//! What it acknowledged survives a clean restart of the server and a
//! SIGKILL of it (the back-end keeps the pool; the next server recovers).

mod server_support;

use std::net::SocketAddr;
use std::path::Path;

use server_support::{backend, pool_dir, Server, R};

fn serve(dir: &Path, addr: SocketAddr, mode: &str) -> Server {
    let a = addr.to_string();
    let args = [
        "--remote",
        &a,
        "--remote-mode",
        mode,
        "--size",
        "8MiB",
        "--remote-batch",
        "16",
    ];
    // --pool names no file here: the pool is on the back-end.
    Server::start(&dir.join("unused.nvs"), &args)
}

#[test]
fn a_server_on_a_back_end_keeps_what_it_acknowledged() {
    for mode in ["naive", "rcb"] {
        let dir = pool_dir();
        let (mut be, addr) = backend(&dir.path().join("be.pool"));
        let s = serve(dir.path(), addr, mode);
        let mut c = s.client();
        for i in 0..100 {
            assert_eq!(c.cmd(&["set", &format!("k{i}"), &format!("v{i}")]), R::ok());
        }
        assert_eq!(c.cmd(&["hset", "h", "f", "x"]), R::Int(1));
        assert_eq!(c.cmd(&["incr", "n"]), R::Int(1));
        assert_eq!(c.cmd(&["get", "k7"]), R::s("v7"));
        assert_eq!(c.cmd(&["dbsize"]), R::Int(102));
        // A clean stop; the next server opens the pool on the back-end.
        assert!(s.signal_and_wait(libc::SIGTERM).success());
        assert!(!dir.path().join("unused.nvs").exists(), "{mode}: a pool file was made");
        let s = serve(dir.path(), addr, mode);
        let mut c = s.client();
        assert_eq!(c.cmd(&["get", "k99"]), R::s("v99"), "{mode}");
        assert_eq!(c.cmd(&["hget", "h", "f"]), R::s("x"), "{mode}");
        for i in 100..150 {
            assert_eq!(c.cmd(&["set", &format!("k{i}"), &format!("v{i}")]), R::ok());
        }
        assert_eq!(c.cmd(&["incr", "n"]), R::Int(2));
        // SIGKILL: every acknowledged write is on the back-end already.
        s.kill9();
        let s = serve(dir.path(), addr, mode);
        let mut c = s.client();
        for i in 0..150 {
            assert_eq!(c.cmd(&["get", &format!("k{i}")]), R::s(&format!("v{i}")), "{mode}");
        }
        assert_eq!(c.cmd(&["get", "n"]), R::s("2"), "{mode}");
        assert_eq!(c.cmd(&["dbsize"]), R::Int(152), "{mode}");
        s.kill9();
        let _ = be.kill();
        let _ = be.wait();
    }
}
