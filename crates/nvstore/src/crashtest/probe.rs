//! Probe: the simulator plus publish-first images.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::error::Result;
use crate::pmem::sim::CaptureConfig;
use crate::pmem::{FlushKind, MappingKind, Point, SimSpace, Space};

/// One crash image to check.
#[derive(Clone)]
pub struct Image {
    pub kind: &'static str,
    /// Fence the image was captured before, `op-boundary`, or a campaign
    /// label (`acked`, `closed`).
    pub point: &'static str,
    pub data: Vec<u8>,
}

#[derive(Default)]
struct ProbeState {
    /// Offset of each thread's latest atomic store since its last fence.
    last_store: HashMap<std::thread::ThreadId, u64>,
    queue: Vec<Image>,
}

/// A [`SimSpace`] that also generates publish-first images: at a fence,
/// when more lines are in flight than the simulator images exhaustively,
/// the persisted image plus the current value of the fencing thread's latest
/// atomic store (a legal crash state: that word reached memory first).
pub struct Probe {
    pub sim: SimSpace,
    publish_first: bool,
    capture: std::sync::atomic::AtomicBool,
    /// Reports the space read-only, so dropping a checked Db does not
    /// write a clean shutdown (nothing would look at it).
    read_only: std::sync::atomic::AtomicBool,
    state: Mutex<ProbeState>,
}

impl Probe {
    pub fn new(sim: SimSpace, publish_first: bool) -> Probe {
        Probe {
            sim,
            publish_first,
            capture: Default::default(),
            read_only: Default::default(),
            state: Mutex::new(ProbeState::default()),
        }
    }

    /// Turns capture on or off, in the simulator and here.
    pub fn set_capture(&self, cfg: Option<CaptureConfig>) {
        self.capture.store(cfg.is_some(), Ordering::SeqCst);
        self.sim.set_capture(cfg);
        if cfg.is_none() {
            self.state.lock().last_store.clear();
        }
    }

    /// Drains the simulator's images and the publish-first ones.
    pub fn take_images(&self) -> Vec<Image> {
        let mut out: Vec<Image> = self
            .sim
            .take_images()
            .into_iter()
            .map(|i| Image {
                kind: i.kind.as_str(),
                point: i.point,
                data: i.data,
            })
            .collect();
        out.append(&mut self.state.lock().queue);
        out
    }

    /// Makes [`Space::writable`] false from now on.
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Relaxed);
    }

    fn capturing(&self) -> bool {
        self.publish_first && self.capture.load(Ordering::Relaxed)
    }
}

impl Space for Probe {
    fn size(&self) -> u64 {
        self.sim.size()
    }
    fn load(&self, off: u64) -> u64 {
        self.sim.load(off)
    }
    fn store(&self, off: u64, val: u64) {
        self.sim.store(off, val);
        if self.capturing() {
            self.state.lock().last_store.insert(std::thread::current().id(), off);
        }
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        self.sim.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) {
        self.sim.write(off, data)
    }
    fn zero(&self, off: u64, len: u64) {
        self.sim.zero(off, len)
    }
    fn flush(&self, off: u64, len: u64, point: Point) {
        self.sim.flush(off, len, point)
    }
    fn fence(&self, point: Point) {
        if self.capturing() {
            let last = self.state.lock().last_store.remove(&std::thread::current().id());
            // With four lines or fewer in flight the simulator images every
            // combination already.
            if let Some(off) = last.filter(|_| self.sim.in_flight_lines() > 4) {
                let mut data = self.sim.persisted_image();
                let cur = self.sim.load(off);
                data[off as usize..off as usize + 8].copy_from_slice(&cur.to_le_bytes());
                self.state.lock().queue.push(Image {
                    kind: "publish-first",
                    point: point.name,
                    data,
                });
            }
        }
        self.sim.fence(point)
    }
    fn grow(&self, new_size: u64) -> Result<()> {
        self.sim.grow(new_size)
    }
    fn op_boundary(&self) {
        self.sim.op_boundary()
    }
    fn writable(&self) -> bool {
        !self.read_only.load(Ordering::Relaxed) && self.sim.writable()
    }
    fn flush_kind(&self) -> FlushKind {
        self.sim.flush_kind()
    }
    fn mapping(&self) -> MappingKind {
        self.sim.mapping()
    }
    fn sync(&self) -> Result<()> {
        self.sim.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_adds_publish_first_image() {
        let p = Probe::new(SimSpace::new(4096), true);
        p.set_capture(Some(CaptureConfig::new(1)));
        // Six lines of payload, flushed but not fenced, then the publishing word.
        p.write(64, &[7; 6 * 64]);
        p.flush(64, 6 * 64, Point::new("t.flush"));
        p.store(1024, 42);
        p.flush(1024, 8, Point::new("t.flush"));
        p.fence(Point::new("t.fence"));
        let imgs = p.take_images();
        let pf: Vec<&Image> = imgs.iter().filter(|i| i.kind == "publish-first").collect();
        assert_eq!(pf.len(), 1);
        let d = &pf[0].data;
        assert_eq!(u64::from_le_bytes(d[1024..1032].try_into().unwrap()), 42);
        assert!(d[64..64 + 6 * 64].iter().all(|&b| b == 0), "payload not persisted yet");
        assert_eq!(pf[0].point, "t.fence");
        // After the fence everything is persisted: nothing more to add.
        p.fence(Point::new("t.fence"));
        assert!(p.take_images().iter().all(|i| i.kind != "publish-first"));
    }
}
