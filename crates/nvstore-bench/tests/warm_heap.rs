//! `bench micro` and `bench compare` warm each measuring thread's heap
//! before the clock (with `EngineConfig::populate`, on unless `--lazy-pages`).
//! One test in its own binary: it reads the process's peak resident memory,
//! which other tests running beside it would move.

use nvstore_bench::micro::{heap_warm_for, warm_heap};

/// A field of /proc/self/status in bytes (the kernel reports kB).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

#[test]
fn the_heap_is_touched_before_the_clock_unless_lazy_pages() {
    // Sized by keys and threads, within bounds; nothing with --lazy-pages.
    assert_eq!(heap_warm_for(false, 1_000_000, 1), 128_000_000);
    assert_eq!(heap_warm_for(false, 1_000_000, 2), 64_000_000);
    assert_eq!(heap_warm_for(false, 1_000, 1), 16 << 20);
    assert_eq!(heap_warm_for(false, 1 << 40, 1), 1 << 30);
    assert_eq!(heap_warm_for(true, 1_000_000, 1), 0);

    // Nothing warmed: the peak stays where it was.
    let peak = status_bytes("VmHWM:");
    warm_heap(0);
    assert!(status_bytes("VmHWM:") < peak + (8 << 20));

    // Every page of the warmed bytes was resident at once.
    let size = 64u64 << 20;
    let rss = status_bytes("VmRSS:");
    warm_heap(size);
    let grew = status_bytes("VmHWM:").saturating_sub(rss);
    assert!(grew >= size, "{grew} bytes resident at the peak of warming {size}");
}
