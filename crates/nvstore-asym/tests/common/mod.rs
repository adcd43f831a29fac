//! Shared setup of the front-end tests: an in-process back-end on simulated
//! memory and the front-end options each mode runs with.

use std::time::Duration;

use nvstore::pmem::SimSpace;
use nvstore_asym::backend::Backend;
use nvstore_asym::transport::{share, Fault, FaultyTransport, LocalTransport, SharedBackend};
use nvstore_asym::{Layout, Mode, Remote, RemoteOptions};

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
