//! The space the server's pool lives in: a local pool file, or the data
//! area of an AsymNVM back-end (`nvstore serve --remote ADDR`,
//! docs/asym-protocol.md, "The NV-Tree on a back-end"). One type for both,
//! so the server is not generic: every call is a match on two variants.

use nvstore::pmem::{FileSpace, FlushKind, MappingKind, Operation, Point, Space};
use nvstore::Result;
use nvstore_asym::RemoteSpace;

/// A pool file or a back-end's data area.
pub enum ServerSpace {
    File(FileSpace),
    Remote(RemoteSpace),
}

/// Runs `$e` with `$s` bound to the space, whatever its kind.
macro_rules! each {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            ServerSpace::File($s) => $e,
            ServerSpace::Remote($s) => $e,
        }
    };
}

impl Space for ServerSpace {
    #[inline]
    fn size(&self) -> u64 {
        each!(self, s => s.size())
    }

    #[inline]
    fn load(&self, off: u64) -> u64 {
        each!(self, s => s.load(off))
    }

    #[inline]
    fn store(&self, off: u64, val: u64) {
        each!(self, s => s.store(off, val))
    }

    #[inline]
    fn read(&self, off: u64, buf: &mut [u8]) {
        each!(self, s => s.read(off, buf))
    }

    #[inline]
    fn with_bytes<R>(&self, off: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R {
        each!(self, s => s.with_bytes(off, len, f))
    }

    #[inline]
    fn write(&self, off: u64, data: &[u8]) {
        each!(self, s => s.write(off, data))
    }

    #[inline]
    fn zero(&self, off: u64, len: u64) {
        each!(self, s => s.zero(off, len))
    }

    #[inline]
    fn flush(&self, off: u64, len: u64, point: Point) {
        each!(self, s => s.flush(off, len, point))
    }

    #[inline]
    fn fence(&self, point: Point) {
        each!(self, s => s.fence(point))
    }

    fn grow(&self, new_size: u64) -> Result<()> {
        each!(self, s => s.grow(new_size))
    }

    #[inline]
    fn op_boundary(&self) {
        each!(self, s => s.op_boundary())
    }

    #[inline]
    fn logged<R>(&self, op: Operation<'_>, f: impl FnOnce() -> Result<R>) -> Result<R> {
        each!(self, s => s.logged(op, f))
    }

    fn writable(&self) -> bool {
        each!(self, s => s.writable())
    }

    fn flush_kind(&self) -> FlushKind {
        each!(self, s => s.flush_kind())
    }

    fn mapping(&self) -> MappingKind {
        each!(self, s => s.mapping())
    }

    fn sync(&self) -> Result<()> {
        each!(self, s => s.sync())
    }

    #[inline]
    fn read_u64(&self, off: u64) -> u64 {
        each!(self, s => s.read_u64(off))
    }

    #[inline]
    fn prefetch(&self, off: u64) {
        each!(self, s => s.prefetch(off))
    }

    #[inline]
    fn prefetch_write(&self, off: u64) {
        each!(self, s => s.prefetch_write(off))
    }

    #[inline]
    fn drain(&self) {
        each!(self, s => s.drain())
    }
}
