//! Crash simulator (DESIGN §13): placeholder, being written.
use super::{FlushKind, MappingKind, Point, Space};
use crate::error::Result;
use parking_lot::Mutex;

pub struct SimSpace {
    mem: Mutex<Vec<u8>>,
}

impl SimSpace {
    pub fn new(size: u64) -> SimSpace {
        SimSpace { mem: Mutex::new(vec![0; size as usize]) }
    }
    pub fn from_image(image: Vec<u8>) -> SimSpace {
        SimSpace { mem: Mutex::new(image) }
    }
}

impl Space for SimSpace {
    fn size(&self) -> u64 {
        self.mem.lock().len() as u64
    }
    fn load(&self, off: u64) -> u64 {
        let m = self.mem.lock();
        u64::from_le_bytes(m[off as usize..off as usize + 8].try_into().unwrap())
    }
    fn store(&self, off: u64, val: u64) {
        self.mem.lock()[off as usize..off as usize + 8].copy_from_slice(&val.to_le_bytes());
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        buf.copy_from_slice(&self.mem.lock()[off as usize..off as usize + buf.len()]);
    }
    fn write(&self, off: u64, data: &[u8]) {
        self.mem.lock()[off as usize..off as usize + data.len()].copy_from_slice(data);
    }
    fn zero(&self, off: u64, len: u64) {
        self.mem.lock()[off as usize..(off + len) as usize].fill(0);
    }
    fn flush(&self, _off: u64, _len: u64, _point: Point) {}
    fn fence(&self, _point: Point) {}
    fn grow(&self, new_size: u64) -> Result<()> {
        let mut m = self.mem.lock();
        if (new_size as usize) > m.len() {
            m.resize(new_size as usize, 0);
        }
        Ok(())
    }
    fn flush_kind(&self) -> FlushKind {
        FlushKind::None
    }
    fn mapping(&self) -> MappingKind {
        MappingKind::Simulated
    }
}
