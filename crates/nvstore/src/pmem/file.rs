//! A pool file mapped into a reserved virtual range.
//!
//! At open we reserve `max_size` bytes of address space (`PROT_NONE`,
//! `MAP_NORESERVE`) and map the file over its start with `MAP_FIXED`.
//! Growing extends the file (`fallocate`, so a full disk fails here and not
//! on a later store) and maps the new extent right after the old one, so the
//! base address never moves and live offsets stay valid.
//!
//! Mapping follows libpmem: try `MAP_SHARED_VALIDATE | MAP_SYNC` (only DAX
//! file systems accept it), else plain `MAP_SHARED`; `mapping()` reports
//! which. An advisory `flock` keeps a second process out.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::flush::{self, flush_range, sfence, spin_ns, FlushKind};
use super::{counters, Point, Space, LINE};
use crate::error::{Error, Result};

/// How a pool file is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingKind {
    /// `MAP_SYNC`: stores reach persistence with cache write-back alone.
    MapSync,
    /// `MAP_SHARED`: durable against process crashes; power loss only at `sync()`.
    Shared,
    /// Shadow memory of the crash simulator.
    Simulated,
    /// The data area of an AsymNVM back-end, reached over a transport.
    Remote,
}

impl MappingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MappingKind::MapSync => "map_sync",
            MappingKind::Shared => "shared",
            MappingKind::Simulated => "simulated",
            MappingKind::Remote => "remote",
        }
    }
}

/// How to open a pool file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Create a new file of this size; fail if it exists.
    Create { size: u64 },
    /// Open an existing file for reading and writing.
    Open,
    /// Open an existing file read-only (`stat`, `check`): nothing is written.
    ReadOnly,
}

/// Settings for [`FileSpace::open`].
#[derive(Clone, Debug)]
pub struct FileOptions {
    pub mode: OpenMode,
    /// Flush instruction; `None` means detect from CPUID.
    pub flush: Option<FlushKind>,
    /// Emulated extra latency per flushed line, in nanoseconds.
    pub latency_ns: u64,
    /// Largest size the pool may grow to (the virtual reservation).
    pub max_size: u64,
    /// Never try `MAP_SYNC` (tests of the fallback path).
    pub force_shared: bool,
    /// Map every page at once (`MAP_POPULATE`), here and when growing.
    pub populate: bool,
    /// Name used in messages when it differs from the opened path (a pool
    /// being created under a temporary name).
    pub name: Option<PathBuf>,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            mode: OpenMode::Open,
            flush: None,
            latency_ns: 0,
            max_size: 1 << 40,
            force_shared: false,
            populate: false,
            name: None,
        }
    }
}

/// A mapped pool file.
pub struct FileSpace {
    path: PathBuf,
    file: File,
    base: *mut u8,
    reserved: u64,
    size: AtomicU64,
    grow_lock: Mutex<()>,
    flush: FlushKind,
    latency_ns: u64,
    mapping: MappingKind,
    writable: bool,
    /// Map pages at once ([`FileOptions::populate`]).
    populate: bool,
}

// SAFETY: the mapping is shared memory addressed only through the `Space`
// methods, which use atomics for published words; the raw base pointer is
// never handed out. Concurrent byte writes only target unpublished ranges
// owned by one writer (the engine's locking protocol).
unsafe impl Send for FileSpace {}
// SAFETY: see above.
unsafe impl Sync for FileSpace {}

const MAP_SYNC_FLAGS: libc::c_int = libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC;

/// How long `open` waits for a pool's lock before reporting it locked.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

impl FileSpace {
    /// Opens or creates `path` as described by `opts`.
    pub fn open(path: &Path, opts: &FileOptions) -> Result<FileSpace> {
        let writable = opts.mode != OpenMode::ReadOnly;
        let mut oo = OpenOptions::new();
        oo.read(true).write(writable).mode(0o644);
        if let OpenMode::Create { .. } = opts.mode {
            oo.create_new(true);
        }
        let file = oo.open(path).map_err(|e| Error::io(path, e))?;

        // Advisory lock: one writer, or any number of readers. A lock held
        // only for a moment is waited for (LOCK_WAIT): a child process
        // this program forks holds a copy of every descriptor, the lock
        // included, until it execs, so a pool closed and reopened while
        // another thread spawns a process can find its own lock still held.
        let lock = if writable { libc::LOCK_EX } else { libc::LOCK_SH };
        let started = std::time::Instant::now();
        loop {
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(Error::io(path, e));
            }
            if started.elapsed() >= LOCK_WAIT {
                return Err(Error::Locked { path: path.into() });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }

        let size = match opts.mode {
            OpenMode::Create { size } => {
                let size = super::align_up(size.max(LINE), 4096);
                if size > opts.max_size {
                    let _ = std::fs::remove_file(path);
                    return Err(Error::InvalidOption(format!(
                        "pool size {size} exceeds the maximum {}",
                        opts.max_size
                    )));
                }
                if let Err(e) = fallocate(&file, 0, size) {
                    let _ = std::fs::remove_file(path);
                    return Err(Error::io(path, e));
                }
                size
            }
            _ => file.metadata().map_err(|e| Error::io(path, e))?.len(),
        };
        let flush = opts.flush.unwrap_or_else(FlushKind::detect);
        if !flush.supported() {
            return Err(Error::InvalidOption(format!(
                "this CPU does not support the {flush} instruction"
            )));
        }
        let reserved = super::align_up(opts.max_size.max(size), 1 << 21);
        // SAFETY: an anonymous PROT_NONE reservation; nothing is accessed
        // through it until file extents are mapped over it with MAP_FIXED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::io(path, std::io::Error::last_os_error()));
        }
        let mapping = if !writable || opts.force_shared || !probe_map_sync(&file) {
            MappingKind::Shared
        } else {
            MappingKind::MapSync
        };
        let space = FileSpace {
            path: opts.name.clone().unwrap_or_else(|| path.into()),
            file,
            base: base as *mut u8,
            reserved,
            size: AtomicU64::new(0),
            grow_lock: Mutex::new(()),
            flush,
            latency_ns: opts.latency_ns,
            mapping,
            writable,
            populate: opts.populate,
        };
        if size > 0 {
            space.map_extent(0, size)?;
        }
        space.size.store(size, Ordering::Release);
        Ok(space)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Maps file bytes `[from, to)` over the reservation at the same offsets.
    fn map_extent(&self, from: u64, to: u64) -> Result<()> {
        let prot = if self.writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let flags = match self.mapping {
            MappingKind::MapSync => MAP_SYNC_FLAGS,
            _ => libc::MAP_SHARED,
        } | libc::MAP_FIXED
            | if self.populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: [from, to) lies inside our reservation (checked by callers
        // against `reserved`), so MAP_FIXED replaces only our own PROT_NONE
        // pages; the file descriptor is open and the file is at least `to`
        // bytes long.
        let p = unsafe {
            libc::mmap(
                self.base.add(from as usize) as *mut libc::c_void,
                (to - from) as usize,
                prot,
                flags,
                self.file.as_raw_fd(),
                from as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(&self.path, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The address of `[off, off+len)`, checked in every build: safe code
    /// can never reach outside the mapping, whatever offset it computes (a
    /// word read from damaged media, for one). A violation is a bug in the
    /// layer above, which must validate media-derived offsets first; it
    /// panics here instead of being undefined behaviour.
    #[inline]
    fn ptr(&self, off: u64, len: u64) -> *mut u8 {
        let size = self.size.load(Ordering::Relaxed);
        if off > size || len > size - off {
            out_of_bounds(off, len, size);
        }
        // SAFETY: [off, off+len) lies inside the mapped size (checked
        // above); the size only grows, and mapped extents stay mapped for
        // the life of `self`.
        unsafe { self.base.add(off as usize) }
    }

    #[inline]
    fn word(&self, off: u64) -> &AtomicU64 {
        if !off.is_multiple_of(8) {
            unaligned(off);
        }
        // SAFETY: 8-aligned (checked above) offset inside the mapping
        // (checked by `ptr`); the page stays mapped for the life of `self`,
        // and AtomicU64 has the same layout as u64.
        unsafe { &*(self.ptr(off, 8) as *const AtomicU64) }
    }
}

#[cold]
#[inline(never)]
fn out_of_bounds(off: u64, len: u64, size: u64) -> ! {
    panic!("pool access [{off}, +{len}) beyond the pool size {size}")
}

#[cold]
#[inline(never)]
fn unaligned(off: u64) -> ! {
    panic!("unaligned atomic pool word at {off}")
}

impl Space for FileSpace {
    #[inline]
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    #[inline]
    fn prefetch(&self, off: u64) {
        flush::prefetch(self.ptr(off, 8));
    }

    #[inline]
    fn prefetch_write(&self, off: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
            // SAFETY: a prefetch never faults and changes no memory; the
            // address is inside the mapping (see `ptr`).
            unsafe { _mm_prefetch::<_MM_HINT_ET0>(self.ptr(off, 8) as *const i8) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    #[inline]
    fn load(&self, off: u64) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }

    #[inline]
    fn store(&self, off: u64, val: u64) {
        debug_assert!(self.writable);
        self.word(off).store(val, Ordering::Release)
    }

    #[inline]
    fn read(&self, off: u64, buf: &mut [u8]) {
        let src = self.ptr(off, buf.len() as u64);
        // SAFETY: src..src+len is mapped (see `ptr`); buf is a distinct
        // allocation. Published bytes are immutable until reclaimed by epoch.
        unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) }
    }

    #[inline]
    fn with_bytes<R>(&self, off: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R {
        let src = self.ptr(off, len);
        // SAFETY: src..src+len is mapped for the life of `self` (see
        // `ptr`), which outlives the borrow `f` gets; the caller promises
        // no writer changes these bytes while `f` runs (published bytes
        // are immutable until epoch reclamation, which its pin holds off).
        f(unsafe { std::slice::from_raw_parts(src, len as usize) })
    }

    #[inline]
    fn write(&self, off: u64, data: &[u8]) {
        debug_assert!(self.writable);
        let dst = self.ptr(off, data.len() as u64);
        // SAFETY: dst..dst+len is mapped writable; the range is unpublished
        // and owned by the calling writer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
    }

    #[inline]
    fn zero(&self, off: u64, len: u64) {
        debug_assert!(self.writable);
        let dst = self.ptr(off, len);
        // SAFETY: as for `write`.
        unsafe { std::ptr::write_bytes(dst, 0, len as usize) }
    }

    #[inline]
    fn flush(&self, off: u64, len: u64, _point: Point) {
        // SAFETY: the range is mapped (see `ptr`).
        let lines = unsafe { flush_range(self.flush, self.ptr(off, len), len as usize) };
        counters::add_flushes(lines);
        if self.latency_ns > 0 {
            spin_ns(self.latency_ns * lines);
        }
    }

    #[inline]
    fn fence(&self, _point: Point) {
        sfence();
        counters::add_fence();
    }

    /// An `sfence`, counted as a fence: what it costs is a fence's cost.
    #[inline]
    fn drain(&self) {
        sfence();
        counters::add_fence();
    }

    fn grow(&self, new_size: u64) -> Result<()> {
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        let _g = self.grow_lock.lock();
        let old = self.size.load(Ordering::Acquire);
        if new_size <= old {
            return Ok(());
        }
        let new_size = super::align_up(new_size, 1 << 21);
        if new_size > self.reserved {
            return Err(Error::PoolFull {
                path: self.path.clone(),
                size: old,
                limit: self.reserved,
            });
        }
        fallocate(&self.file, old, new_size - old).map_err(|e| Error::io(&self.path, e))?;
        self.map_extent(old, new_size)?;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn flush_kind(&self) -> FlushKind {
        self.flush
    }

    fn mapping(&self) -> MappingKind {
        self.mapping
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn sync(&self) -> Result<()> {
        let size = self.size();
        // SAFETY: [base, base+size) is our mapping.
        let r = unsafe { libc::msync(self.base as *mut libc::c_void, size as usize, libc::MS_SYNC) };
        if r != 0 {
            return Err(Error::io(&self.path, std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for FileSpace {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the reservation made in `open`; no
        // references into it outlive `self` (none are ever handed out).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.reserved as usize);
        }
    }
}

/// Reserves real blocks for `[off, off+len)` so a full disk fails now.
fn fallocate(file: &File, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: plain system call on an open descriptor.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), off as libc::off_t, len as libc::off_t) };
    match r {
        0 => Ok(()),
        // Some file systems lack fallocate; fall back to extending the size.
        libc::EOPNOTSUPP | libc::EINVAL => {
            let cur = file.metadata()?.len();
            if cur < off + len {
                file.set_len(off + len)?;
            }
            Ok(())
        }
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Whether the file accepts a `MAP_SYNC` mapping (DAX).
fn probe_map_sync(file: &File) -> bool {
    // SAFETY: a temporary one-page mapping of our own descriptor, unmapped
    // right away; the file is at least one page long or mmap fails cleanly.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            MAP_SYNC_FLAGS,
            file.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(p, 4096);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KiB of `space`'s mapping resident in this process (the `Rss` of
    /// every mapping inside its reservation, from `/proc/self/smaps`).
    fn resident_kib(space: &FileSpace) -> u64 {
        let (lo, hi) = (space.base as u64, space.base as u64 + space.reserved);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut kib = 0;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            match range.and_then(|(a, b)| Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?))) {
                Some((a, b)) => inside = a >= lo && b <= hi,
                None if inside => {
                    if let Some(v) = line.strip_prefix("Rss:") {
                        kib += v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap();
                    }
                }
                None => {}
            }
        }
        kib
    }

    /// `populate` maps every page when the pool is opened and when it
    /// grows; without it, pages are mapped as they are touched.
    #[test]
    fn populate_maps_every_page_at_open_and_on_growth() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str, populate: bool| {
            let opts = FileOptions {
                mode: OpenMode::Create { size: 8 << 20 },
                populate,
                ..FileOptions::default()
            };
            FileSpace::open(&dir.path().join(name), &opts).unwrap()
        };
        let lazy = open("lazy.pool", false);
        let eager = open("eager.pool", true);
        assert!(resident_kib(&lazy) < 1024, "lazy: {} KiB", resident_kib(&lazy));
        assert!(resident_kib(&eager) >= 8 << 10, "eager: {} KiB", resident_kib(&eager));
        eager.grow(16 << 20).unwrap();
        assert!(resident_kib(&eager) >= 16 << 10, "grown: {} KiB", resident_kib(&eager));
        // The populated pages are the file's: a write is read back.
        eager.write((12 << 20) + 8, b"populated");
        let mut back = [0u8; 9];
        eager.read((12 << 20) + 8, &mut back);
        assert_eq!(&back, b"populated");
    }
}
