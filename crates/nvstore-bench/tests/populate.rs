//! `bench micro` and `bench compare` map every page of each engine's pool
//! before they measure (`EngineConfig::populate`, on unless `--lazy-pages`).
//! One test in its own binary: it reads the process's resident shared
//! memory, which other tests running beside it would move.

use nvstore_bench::micro::{CompareArgs, MicroArgs};
use nvstore_bench::registry::{open_engine, EngineConfig};

/// The process's resident shared memory (tmpfs pages it maps), in bytes.
fn rss_shmem() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("RssShmem:"))
        .expect("RssShmem in /proc/self/status");
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

#[test]
fn pools_are_mapped_before_the_clock_unless_lazy_pages() {
    assert!(!MicroArgs::default().lazy_pages && !CompareArgs::default().lazy_pages);
    let size = 64u64 << 20;
    for engine in ["tree", "fptree", "fastfair"] {
        for populate in [true, false] {
            let cfg = EngineConfig {
                pool_size: size,
                populate,
                ..EngineConfig::new(1024)
            };
            let before = rss_shmem();
            let e = open_engine(engine, &cfg).unwrap();
            let grew = rss_shmem().saturating_sub(before);
            if populate {
                assert!(
                    grew >= size - (1 << 20),
                    "{engine}: {grew} bytes mapped of a {size}-byte pool"
                );
            } else {
                assert!(grew < size / 4, "{engine}: lazy pool mapped {grew} bytes at open");
            }
            drop(e);
        }
    }
}
