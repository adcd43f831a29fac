//! Process-wide settings of the operating system's services that the
//! persistent-memory tooling relies on.

use std::sync::Once;

/// Keeps memory freed by the process in the process instead of returning it
/// to the kernel.
///
/// A crash campaign allocates and frees several pool-sized buffers per crash
/// image. glibc returns freed memory above 2x the last mmap threshold to
/// the kernel (a thread arena even with `madvise` on every free), so every
/// image paid page faults for fresh zeroed pages: half the run time. This
/// raises the mmap and trim thresholds instead (process-wide, set once;
/// affects only how much memory glibc caches, not behaviour). Does nothing
/// where the C library is not glibc.
pub fn keep_freed_memory() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator tuning parameters; it takes
        // no pointers and is safe to call from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        }
    });
}
