//! Cache-line write-back and fences (docs/design.md, "The durability promise").
//!
//! The instruction is chosen at run time from CPUID: `clwb`, else
//! `clflushopt`, else `clflush`; `none` skips write-back (eADR platforms,
//! volatile runs) but keeps fences. `core::arch` has no stable intrinsics for
//! `clwb`/`clflushopt`, so they are issued with inline assembly.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::LINE;

/// Which cache-line write-back instruction a space uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushKind {
    Clwb,
    Clflushopt,
    Clflush,
    None,
}

impl FlushKind {
    /// The best instruction this CPU offers.
    pub fn detect() -> FlushKind {
        let (clwb, clflushopt) = cpu_features();
        if clwb {
            FlushKind::Clwb
        } else if clflushopt {
            FlushKind::Clflushopt
        } else if cfg!(target_arch = "x86_64") {
            FlushKind::Clflush
        } else {
            FlushKind::None
        }
    }

    /// Whether this CPU can execute the instruction.
    pub fn supported(self) -> bool {
        let (clwb, clflushopt) = cpu_features();
        match self {
            FlushKind::Clwb => clwb,
            FlushKind::Clflushopt => clflushopt,
            FlushKind::Clflush => cfg!(target_arch = "x86_64"),
            FlushKind::None => true,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FlushKind::Clwb => "clwb",
            FlushKind::Clflushopt => "clflushopt",
            FlushKind::Clflush => "clflush",
            FlushKind::None => "none",
        }
    }
}

impl fmt::Display for FlushKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FlushKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "clwb" => Ok(FlushKind::Clwb),
            "clflushopt" => Ok(FlushKind::Clflushopt),
            "clflush" => Ok(FlushKind::Clflush),
            "none" => Ok(FlushKind::None),
            _ => Err(format!(
                "unknown flush instruction '{s}' (expected clwb, clflushopt, clflush or none)"
            )),
        }
    }
}

/// (clwb, clflushopt) from CPUID leaf 7, sub-leaf 0, EBX bits 24 and 23.
#[cfg(target_arch = "x86_64")]
fn cpu_features() -> (bool, bool) {
    use std::sync::OnceLock;
    static F: OnceLock<(bool, bool)> = OnceLock::new();
    *F.get_or_init(|| {
        // CPUID is available on every x86_64 CPU; leaf 7 is valid when the
        // maximum basic leaf (leaf 0, EAX) is at least 7.
        let max = core::arch::x86_64::__cpuid(0).eax;
        if max < 7 {
            return (false, false);
        }
        let r = core::arch::x86_64::__cpuid_count(7, 0);
        (r.ebx & (1 << 24) != 0, r.ebx & (1 << 23) != 0)
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_features() -> (bool, bool) {
    (false, false)
}

/// Writes back every line overlapping `[addr, addr+len)`; returns the number
/// of lines.
///
/// # Safety
/// `addr..addr+len` must be mapped memory of this process.
#[inline]
pub unsafe fn flush_range(kind: FlushKind, addr: *const u8, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let start = (addr as usize) & !(LINE as usize - 1);
    let end = addr as usize + len;
    let mut p = start;
    let mut n = 0;
    while p < end {
        // SAFETY: the caller guarantees the range is mapped; p lies in it.
        unsafe { flush_line(kind, p as *const u8) };
        p += LINE as usize;
        n += 1;
    }
    n
}

#[inline]
unsafe fn flush_line(kind: FlushKind, p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: p points into mapped memory (caller's contract); the
    // instruction was checked to exist on this CPU when the kind was chosen.
    unsafe {
        match kind {
            FlushKind::Clwb => core::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags)),
            FlushKind::Clflushopt => {
                core::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushKind::Clflush => core::arch::x86_64::_mm_clflush(p),
            FlushKind::None => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kind, p);
}

/// Store fence: orders earlier write-backs before later stores.
#[inline]
pub fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no memory operands and is available on all x86_64.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Busy-waits `ns` nanoseconds: emulated write latency of slower media
/// (the papers' PCM / STT-RAM / 300 ns settings). A spin, not a sleep, so the
/// thread stays on its core as a stalled store would.
#[inline]
pub fn spin_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let start = Instant::now();
    let d = Duration::from_nanos(ns);
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Asks for the cache line holding `p` to be loaded into the caches
/// without waiting for it (DRAM structures a lookup is about to read).
#[inline]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults, whatever the address, and
        // changes no memory.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_picks_a_supported_instruction() {
        let k = FlushKind::detect();
        assert!(k.supported());
        if cfg!(target_arch = "x86_64") {
            assert_ne!(k, FlushKind::None);
        }
    }

    #[test]
    fn names_round_trip() {
        for k in [
            FlushKind::Clwb,
            FlushKind::Clflushopt,
            FlushKind::Clflush,
            FlushKind::None,
        ] {
            assert_eq!(k.as_str().parse::<FlushKind>().unwrap(), k);
        }
        assert!("clflushx".parse::<FlushKind>().is_err());
    }

    #[test]
    fn flushing_counts_lines() {
        let buf = vec![0u8; 4096];
        let k = FlushKind::detect();
        // SAFETY: buf is a live allocation of 4096 bytes.
        let base = buf.as_ptr();
        let aligned = ((base as usize + 63) & !63) as *const u8;
        assert_eq!(unsafe { flush_range(k, aligned, 64) }, 1);
        assert_eq!(unsafe { flush_range(k, aligned, 65) }, 2);
        assert_eq!(unsafe { flush_range(k, aligned.add(60), 8) }, 2);
        assert_eq!(unsafe { flush_range(k, aligned, 0) }, 0);
        sfence();
    }
}
