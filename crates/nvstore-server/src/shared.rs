//! State shared by every connection: the store, the configuration, the
//! counters INFO reports, the client list and the SCAN cursors.
//!
//! The network side (`server.rs`) creates it and hands it to every command
//! (`cmd/`); both depend on this module and neither on the other's state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::config::Config;
use crate::store::Store;

/// Server-wide counters for INFO.
#[derive(Default)]
pub struct Stats {
    pub commands: AtomicU64,
    pub connections: AtomicU64,
    pub rejected: AtomicU64,
    pub net_in: AtomicU64,
    pub net_out: AtomicU64,
}

/// What CLIENT LIST shows about a connection.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    pub addr: String,
    pub laddr: String,
    pub name: String,
    pub lib_name: String,
    pub lib_ver: String,
    pub resp: u8,
    pub created: Instant,
}

impl ClientInfo {
    /// A client that just connected from `addr` to `laddr` (RESP2, no name).
    pub fn new(addr: String, laddr: String) -> Self {
        ClientInfo {
            addr,
            laddr,
            name: String::new(),
            lib_name: String::new(),
            lib_ver: String::new(),
            resp: 2,
            created: Instant::now(),
        }
    }
}

/// SCAN cursors: number → last key returned. Bounded; the oldest go first.
#[derive(Default)]
pub struct Cursors {
    next: u64,
    map: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
}

const MAX_CURSORS: usize = 1 << 16;

impl Cursors {
    pub fn insert(&mut self, last: Vec<u8>) -> u64 {
        self.next += 1;
        let id = self.next;
        self.map.insert(id, last);
        self.order.push_back(id);
        if self.order.len() > MAX_CURSORS {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        id
    }

    pub fn get(&self, id: u64) -> Option<Vec<u8>> {
        self.map.get(&id).cloned()
    }
}

/// State shared by every connection.
pub struct Shared {
    pub store: Arc<Store>,
    pub cfg: Config,
    pub stats: Stats,
    pub clients: Mutex<BTreeMap<u64, ClientInfo>>,
    pub connected: AtomicUsize,
    pub next_id: AtomicU64,
    pub cursors: Mutex<Cursors>,
    pub shutdown: watch::Sender<bool>,
    pub started: Instant,
    pub port: u16,
    pub run_id: String,
}

impl Shared {
    /// The state of a server listening on `port`, with no client yet.
    pub fn new(store: Arc<Store>, cfg: Config, port: u16, run_id: String) -> Self {
        let (shutdown, _) = watch::channel(false);
        Shared {
            store,
            cfg,
            stats: Default::default(),
            clients: Default::default(),
            connected: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            cursors: Default::default(),
            shutdown,
            started: Instant::now(),
            port,
            run_id,
        }
    }
}
