//! Shared setup of the front-end tests: an in-process back-end on simulated
//! memory, the front-end options each mode runs with, a back-end that can
//! be swapped under a transport, and a snapshot of a back-end's pool.

use std::sync::Arc;
use std::time::Duration;

use nvstore::pmem::{SimSpace, Space};
use nvstore_asym::backend::Backend;
use nvstore_asym::transport::{share, Fault, FaultyTransport, LocalTransport, SharedBackend, Transport};
use nvstore_asym::{Layout, Mode, Remote, RemoteOptions};
use parking_lot::Mutex;

/// Every front-end mode, in the paper's order.
pub const MODES: [Mode; 4] = [Mode::Naive, Mode::R, Mode::Rc, Mode::Rcb];

/// A fresh 8 MiB back-end.
pub fn backend() -> SharedBackend {
    share(Backend::create(SimSpace::new(8 << 20), Layout::default_for(8 << 20)).unwrap())
}

/// Options for `mode` with batches of `batch`, flushed by count only.
pub fn opts(mode: Mode, batch: usize) -> RemoteOptions {
    RemoteOptions {
        mode,
        batch,
        flush_after: Duration::from_secs(3600),
        ..RemoteOptions::default()
    }
}

/// A 64-byte value that names `i`.
pub fn val(i: u64) -> Vec<u8> {
    (0..64).map(|j| (i as u8).wrapping_add(j)).collect()
}

/// An rcb writer (batches of 8) on `b` whose transport dies after
/// `kill_after` round trips: each later request fails, as if the
/// front-end had crashed there.
pub fn doomed_writer(b: &SharedBackend, kill_after: u64) -> Remote {
    let fault = Fault {
        kill_after: Some(kill_after),
        ..Fault::default()
    };
    Remote::open(
        FaultyTransport::new(LocalTransport::new(b.clone()), fault),
        opts(Mode::Rcb, 8),
    )
    .unwrap()
}

/// A transport whose back-end can be replaced, as a restarted back-end
/// process at the same address.
#[allow(dead_code, reason = "not every test file that includes common uses it")]
#[derive(Clone)]
pub struct Switch(pub Arc<Mutex<SharedBackend>>);

impl Transport for Switch {
    fn round_trip(&mut self, frame: &[u8]) -> std::io::Result<Vec<u8>> {
        let b = self.0.lock().clone();
        LocalTransport::new(b).round_trip(frame)
    }
}

/// Everything a back-end's pool says: data area, names, live operation
/// logs, slab bits and log positions (crash images are compared by it).
#[allow(dead_code, reason = "not every test file that includes common uses it")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snap {
    pub data: Vec<u8>,
    pub names: Vec<(String, u64)>,
    pub ops: Vec<(u64, Vec<u8>)>,
    pub bits: Vec<bool>,
    pub op_applied: u64,
    pub op_next: u64,
}

#[allow(dead_code, reason = "not every test file that includes common uses it")]
pub fn snap<S: Space>(b: &Backend<S>) -> Snap {
    let g = b.geometry();
    Snap {
        data: b.peek(g.data_off, (g.slabs * g.slab) as usize),
        names: b.names(),
        ops: b.live_ops(),
        bits: (0..g.slabs).map(|i| b.slab_allocated(i)).collect(),
        op_applied: b.op_applied(),
        op_next: b.op_next(),
    }
}
