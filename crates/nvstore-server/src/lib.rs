//! `nvstore serve`: a Redis-protocol server over the nvstore engine
//! (NV-Tree §6.1.1).
//!
//! - `resp.rs`: RESP2/RESP3 request parser and reply encoder;
//! - `config.rs`: what `nvstore serve` was asked to do;
//! - `keys.rs`: how strings, hashes and sorted sets map onto ordered keys;
//! - `store.rs`: the only module that touches the engine (transactions);
//! - `shared.rs`: the state every connection shares (store, counters, clients);
//! - `cmd/`: the command table and the commands;
//! - `server.rs`: listener, connections, shutdown.
//!
//! `docs/server.md` describes the key layout and what differs from Redis.

#![deny(unsafe_code)]

mod args;
pub mod cmd;
mod config;
pub mod keys;
pub mod num;
pub mod resp;
pub mod server;
pub mod shared;
pub mod space;
pub mod store;

use std::sync::Arc;
use std::time::Instant;

pub use args::ServeArgs;
pub use config::{Config, RemotePool};
pub use resp::Limits;

/// Opens the pool, serves until SIGINT, SIGTERM or SHUTDOWN, then closes
/// the pool cleanly. Logs to stderr; prints
/// `nvstore: ready to accept connections on ADDR` once listening.
pub fn serve(cfg: Config) -> Result<(), String> {
    if cfg.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    if cfg.maxclients == 0 {
        return Err("--maxclients must be at least 1".into());
    }
    if cfg.remote.is_none() && !cfg.pool.exists() {
        let parent = cfg.pool.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = parent.filter(|d| !d.is_dir()) {
            return Err(format!(
                "cannot create the pool {}: directory {} does not exist",
                cfg.pool.display(),
                dir.display()
            ));
        }
    }
    let opts = nvstore::Options {
        size: cfg.size,
        max_size: cfg.max_size.max(cfg.size),
        adaptive: cfg.adaptive,
        ..Default::default()
    };
    let t = Instant::now();
    let (store, name) = match &cfg.remote {
        Some(r) => (
            store::Store::open_remote(r, cfg.size, opts).map_err(|e| e.to_string())?,
            format!("{} on the back-end at {}", r.name, r.addr),
        ),
        None => (
            store::Store::open(&cfg.pool, opts).map_err(|e| e.to_string())?,
            cfg.pool.display().to_string(),
        ),
    };
    let store = Arc::new(store);
    let st = store.db().stat();
    eprintln!(
        "nvstore: opened {} ({} keys in the tree, recovery {:?} in {:.1} ms, open took {:.1} ms)",
        name,
        st.keys,
        st.last_recovery.kind,
        st.last_recovery.millis,
        t.elapsed().as_secs_f64() * 1e3
    );
    // One thread: a current-thread runtime, as Redis runs one event loop
    // (no work stealing, no wake-ups between workers, no write conflicts
    // between connections). More: a work-stealing pool of that many.
    let mut rt = if cfg.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(cfg.threads);
        b
    };
    let rt = rt
        .max_blocking_threads(cfg.threads)
        .thread_name("nvstore-serve")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((cfg.bind.as_str(), cfg.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.bind, cfg.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let run_id = format!("{:040x}", rand_id());
        let sh = Arc::new(shared::Shared::new(store.clone(), cfg.clone(), addr.port(), run_id));
        server::run(sh, listener, || {
            eprintln!("nvstore: ready to accept connections on {addr}")
        })
        .await
        .map_err(|e| e.to_string())
    });
    // Blocking tasks still running finish here; then no one else holds the store.
    rt.shutdown_timeout(std::time::Duration::from_secs(30));
    match Arc::try_unwrap(store) {
        Ok(store) => {
            store.close().map_err(|e| format!("closing the pool: {e}"))?;
            eprintln!("nvstore: pool closed cleanly; the next start recovers instantly");
        }
        Err(_) => {
            return Err("an engine call did not finish within 30 s; the pool was not closed cleanly (the next start rebuilds it)".into());
        }
    }
    result
}

/// A run id for INFO: time and pid mixed, no randomness needed.
fn rand_id() -> u128 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    t ^ ((std::process::id() as u128) << 64)
}
