//! Tests of the crash simulator.

use super::*;
use crate::pmem::ThreadCounters;

const F: Point = Point::new("test.flush");
const N: Point = Point::new("test.fence");

fn word(img: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(img[off..off + 8].try_into().unwrap())
}

fn capture_cfg(torn: usize) -> Option<CaptureConfig> {
    Some(CaptureConfig {
        seed: 7,
        random_subsets: 8,
        torn,
    })
}

fn of_kind(imgs: &[CrashImage], kind: ImageKind) -> Vec<&CrashImage> {
    imgs.iter().filter(|i| i.kind == kind).collect()
}

#[test]
fn space_is_send_and_sync() {
    fn check<T: Space>() {}
    check::<SimSpace>();
}

#[test]
fn unpersisted_store_is_only_in_all_in_flight() {
    let s = SimSpace::new(4096);
    s.set_capture(capture_cfg(0));
    s.store(128, 42);
    assert_eq!(s.load(128), 42);
    assert_eq!(s.in_flight_lines(), 1);
    s.op_boundary();
    let imgs = s.take_images();
    let p = of_kind(&imgs, ImageKind::Persisted);
    let a = of_kind(&imgs, ImageKind::AllInFlight);
    assert_eq!((p.len(), a.len()), (1, 1), "{imgs:?}");
    assert_eq!(word(&p[0].data, 128), 0);
    assert_eq!(word(&a[0].data, 128), 42);
    assert_eq!(a[0].data, s.current_image());
    assert_eq!(p[0].data, s.persisted_image());
    assert!(imgs.iter().all(|i| i.point == OP_BOUNDARY && i.seq == 1));
    assert_eq!(word(&s.persisted_image(), 128), 0);
}

#[test]
fn flush_and_fence_by_same_thread_persists() {
    let s = SimSpace::new(4096);
    s.store(64, 7);
    s.write(200, &[1, 2, 3]);
    s.persist(64, 8, F, N);
    assert_eq!(word(&s.persisted_image(), 64), 7);
    assert_eq!(&s.persisted_image()[200..203], &[0, 0, 0]);
    s.persist(200, 3, F, N);
    assert_eq!(&s.persisted_image()[200..203], &[1, 2, 3]);
    assert_eq!(s.in_flight_lines(), 0);
    assert_eq!(s.persisted_image(), s.current_image());
}

#[test]
fn fence_alone_or_flush_alone_does_not_persist() {
    let s = SimSpace::new(4096);
    s.store(64, 7);
    s.fence(N);
    assert_eq!(word(&s.persisted_image(), 64), 0);
    s.flush(64, 8, F);
    assert_eq!(word(&s.persisted_image(), 64), 0);
    s.fence(N);
    assert_eq!(word(&s.persisted_image(), 64), 7);
}

#[test]
fn fence_by_other_thread_does_not_persist() {
    let s = SimSpace::new(4096);
    s.store(64, 7);
    s.flush(64, 8, F);
    std::thread::scope(|sc| {
        sc.spawn(|| s.fence(N)).join().unwrap();
    });
    assert_eq!(word(&s.persisted_image(), 64), 0);
    assert_eq!(s.in_flight_lines(), 1);
    s.fence(N);
    assert_eq!(word(&s.persisted_image(), 64), 7);
}

#[test]
fn other_thread_flush_and_fence_persists_its_snapshot() {
    let s = SimSpace::new(4096);
    s.store(64, 7);
    std::thread::scope(|sc| {
        sc.spawn(|| s.persist(64, 8, F, N)).join().unwrap();
    });
    assert_eq!(word(&s.persisted_image(), 64), 7);
    assert_eq!(s.in_flight_lines(), 0);
}

#[test]
fn older_snapshot_never_overwrites_newer_persisted_one() {
    let s = SimSpace::new(4096);
    s.store(64, 1);
    s.flush(64, 8, F); // this thread: snapshot with 1
    std::thread::scope(|sc| {
        sc.spawn(|| {
            s.store(72, 2);
            s.persist(64, 16, F, N); // snapshot with 1 and 2, persisted
        })
        .join()
        .unwrap();
    });
    let p = s.persisted_image();
    assert_eq!((word(&p, 64), word(&p, 72)), (1, 2));
    // The stale snapshot (72 = 0) is gone: nothing is in flight and no
    // crash image can hold it.
    assert_eq!(s.in_flight_lines(), 0);
    s.set_capture(capture_cfg(4));
    s.op_boundary();
    let imgs = s.take_images();
    assert!(imgs.iter().all(|i| i.data == p), "{imgs:?}");
    s.fence(N); // and it must not land
    let p = s.persisted_image();
    assert_eq!((word(&p, 64), word(&p, 72)), (1, 2));
    assert_eq!(s.in_flight_lines(), 0);
}

#[test]
fn store_after_flush_is_not_covered() {
    let s = SimSpace::new(4096);
    s.store(64, 1);
    s.flush(64, 8, F);
    s.store(64, 2);
    s.store(80, 3);
    s.fence(N);
    let p = s.persisted_image();
    assert_eq!((word(&p, 64), word(&p, 80)), (1, 0));
    assert_eq!(s.load(64), 2);
    assert_eq!(s.in_flight_lines(), 1);
    s.persist(64, 64, F, N);
    let p = s.persisted_image();
    assert_eq!((word(&p, 64), word(&p, 80)), (2, 3));
    assert_eq!(s.in_flight_lines(), 0);
}

#[test]
fn reflush_before_fence_takes_the_newer_snapshot() {
    let s = SimSpace::new(4096);
    s.store(64, 1);
    s.flush(64, 8, F);
    s.store(64, 2);
    s.flush(64, 8, F);
    s.fence(N);
    assert_eq!(word(&s.persisted_image(), 64), 2);
    assert_eq!(s.in_flight_lines(), 0);
}

#[test]
fn flushing_a_clean_line_is_harmless() {
    let s = SimSpace::new(4096);
    s.persist(0, 4096, F, N);
    assert_eq!(s.in_flight_lines(), 0);
    assert_eq!(s.persisted_image(), vec![0; 4096]);
}

#[test]
fn dropped_flush_leaves_line_unpersisted_and_counts_hit() {
    let s = SimSpace::new(4096);
    s.set_drop(Some("test.flush".into()));
    s.store(64, 9);
    s.persist(64, 8, F, N);
    assert_eq!(word(&s.persisted_image(), 64), 0);
    assert_eq!(s.drop_hits(), 1);
    // Another flush point still works.
    s.persist(64, 8, Point::new("other.flush"), N);
    assert_eq!(word(&s.persisted_image(), 64), 9);
    assert_eq!(s.drop_hits(), 1);
    let seen = s.points_seen();
    assert!(seen.contains("test.flush") && seen.contains("other.flush"));
    assert!(seen.contains("test.fence"));
    s.set_drop(None);
    assert_eq!(s.drop_hits(), 0);
}

#[test]
fn dropped_fence_does_not_persist() {
    let s = SimSpace::new(4096);
    s.set_drop(Some("test.fence".into()));
    s.store(64, 9);
    s.persist(64, 8, F, N);
    assert_eq!(word(&s.persisted_image(), 64), 0);
    assert_eq!(s.drop_hits(), 1);
    s.fence(Point::new("other.fence"));
    assert_eq!(word(&s.persisted_image(), 64), 9);
}

#[test]
fn counters_count_lines_and_fences() {
    let s = SimSpace::new(4096);
    let before = ThreadCounters::get();
    s.flush(60, 8, F); // two lines
    s.fence(N);
    s.set_drop(Some("test.flush".into()));
    s.flush(0, 64, F); // dropped: not counted
    let d = ThreadCounters::get().since(before);
    assert_eq!((d.flushes, d.fences), (2, 1));
}

#[test]
fn three_lines_give_all_eight_subsets() {
    let s = SimSpace::new(4096);
    s.set_capture(capture_cfg(0));
    for l in 0..3u64 {
        s.store(l * 64 + 8, l + 1);
    }
    s.op_boundary();
    let imgs = s.take_images();
    assert!(of_kind(&imgs, ImageKind::Torn).is_empty());
    let distinct: HashSet<&Vec<u8>> = imgs.iter().map(|i| &i.data).collect();
    assert_eq!(distinct.len(), 8);
    assert_eq!(imgs.len(), 8, "dedup must leave only distinct images");
    for mask in 0..8u64 {
        let found = imgs.iter().any(|i| {
            (0..3u64).all(|l| {
                let want = if mask & (1 << l) != 0 { l + 1 } else { 0 };
                word(&i.data, (l * 64 + 8) as usize) == want
            })
        });
        assert!(found, "combination {mask:03b} missing");
    }
}

#[test]
fn many_lines_give_seeded_random_subsets() {
    let run = |seed| {
        let s = SimSpace::new(8192);
        s.set_capture(Some(CaptureConfig {
            seed,
            random_subsets: 8,
            torn: 4,
        }));
        for l in 0..10u64 {
            s.store(l * 64, !0);
        }
        s.op_boundary();
        s.take_images()
    };
    let a = run(1);
    assert_eq!(a, run(1), "same seed, same images");
    assert_ne!(a, run(2));
    let subsets = of_kind(&a, ImageKind::Subset);
    assert!(!subsets.is_empty() && subsets.len() <= 8);
    assert!(a.len() <= 2 + 8 + 4);
}

#[test]
fn flushed_snapshot_is_a_subset_choice() {
    let s = SimSpace::new(4096);
    s.set_capture(capture_cfg(0));
    s.store(64, 1);
    s.flush(64, 8, F);
    s.store(64, 2);
    s.op_boundary();
    let vals: BTreeSet<u64> = s.take_images().iter().map(|i| word(&i.data, 64)).collect();
    assert_eq!(vals, BTreeSet::from([0, 1, 2]));
}

#[test]
fn fence_captures_before_taking_effect() {
    let s = SimSpace::new(4096);
    s.set_capture(capture_cfg(0));
    s.store(64, 5);
    s.flush(64, 8, F);
    s.fence(N);
    let imgs = s.take_images();
    let p = of_kind(&imgs, ImageKind::Persisted);
    assert_eq!(p.len(), 1);
    assert_eq!(word(&p[0].data, 64), 0);
    assert_eq!(p[0].point, "test.fence");
    assert!(imgs.iter().any(|i| word(&i.data, 64) == 5));
    assert_eq!(word(&s.persisted_image(), 64), 5);
}

#[test]
fn torn_images_mix_words_within_a_line() {
    let s = SimSpace::new(4096);
    s.set_capture(capture_cfg(16));
    s.write(128, &[0xFF; 64]);
    s.op_boundary();
    let imgs = s.take_images();
    let torn = of_kind(&imgs, ImageKind::Torn);
    assert!(!torn.is_empty());
    let mixed = torn.iter().any(|i| {
        let words: Vec<u64> = (0..8).map(|w| word(&i.data, 128 + w * 8)).collect();
        words.contains(&0) && words.contains(&!0)
    });
    assert!(mixed, "no torn image mixes persisted and current words");
    for i in &torn {
        for w in 0..8 {
            assert!(matches!(word(&i.data, 128 + w * 8), 0 | u64::MAX));
        }
    }
}

#[test]
fn capturing_twice_without_changes_adds_nothing() {
    let s = SimSpace::new(4096);
    s.set_capture(capture_cfg(4));
    s.store(0, 1);
    s.store(640, 2);
    s.op_boundary();
    let first = s.images_generated();
    assert!(first >= 4);
    assert_eq!(s.take_images().len() as u64, first);
    s.op_boundary();
    assert!(s.take_images().is_empty());
    assert_eq!(s.images_generated(), first);
    assert!(s.images_duplicate() > 0);
    s.reset_dedup();
    s.op_boundary();
    assert!(!s.take_images().is_empty());
}

#[test]
fn incremental_hash_matches_full_hash() {
    let s = SimSpace::new(1000); // partial last line
    s.set_capture(capture_cfg(4));
    s.op_boundary(); // compute the persisted sum now, then keep it up to date
    s.store(64, 3);
    s.persist(64, 8, F, N);
    s.write(990, &[7; 10]);
    s.flush(960, 40, F);
    s.store(0, 1);
    s.grow(1500).unwrap();
    s.store(1400, 4);
    s.op_boundary();
    let imgs = s.take_images();
    let st = s.state.lock();
    assert_eq!(st.persisted_sum, Some(lines_sum(&st.persisted)));
    assert_eq!(st.seen.len(), imgs.len());
    for i in &imgs {
        assert!(st.seen.contains(&image_hash(&i.data)), "{i:?}");
    }
}

#[test]
fn grow_keeps_content_and_persisted_state() {
    let s = SimSpace::new(1000);
    s.store(64, 1);
    s.persist(64, 8, F, N);
    s.store(128, 2);
    s.grow(5000).unwrap();
    assert_eq!(s.size(), 5000);
    s.grow(10).unwrap();
    assert_eq!(s.size(), 5000);
    assert_eq!((s.load(64), s.load(128)), (1, 2));
    let p = s.persisted_image();
    assert_eq!(p.len(), 5000);
    assert_eq!((word(&p, 64), word(&p, 128)), (1, 0));
    assert!(p[1000..].iter().all(|&b| b == 0));
    assert!(s.current_image()[1000..].iter().all(|&b| b == 0));
    assert_eq!(s.in_flight_lines(), 1);
    s.store(4992, 9);
    s.persist(128, 8, F, N);
    s.persist(4992, 8, F, N);
    let p = s.persisted_image();
    assert_eq!((word(&p, 128), word(&p, 4992)), (2, 9));
}

#[test]
fn from_image_is_current_and_persisted() {
    let img: Vec<u8> = (0..256u32).map(|b| b as u8).collect();
    let s = SimSpace::from_image(img.clone());
    assert_eq!(s.persisted_image(), img);
    assert_eq!(s.current_image(), img);
    assert_eq!(s.in_flight_lines(), 0);
    let mut buf = [0u8; 4];
    s.read(10, &mut buf);
    assert_eq!(buf, [10, 11, 12, 13]);
    assert_eq!(s.flush_kind(), FlushKind::None);
    assert_eq!(s.mapping(), MappingKind::Simulated);
}

#[test]
fn zero_marks_lines_in_flight() {
    let s = SimSpace::from_image(vec![0xAB; 256]);
    s.zero(60, 10);
    assert_eq!(s.in_flight_lines(), 2);
    assert_eq!(s.persisted_image()[60], 0xAB);
    s.persist(60, 10, F, N);
    assert_eq!(&s.persisted_image()[58..72], &s.current_image()[58..72]);
    assert_eq!(s.persisted_image()[60], 0);
    assert_eq!(s.in_flight_lines(), 0);
}

#[test]
#[should_panic(expected = "not 8-byte aligned")]
fn unaligned_store_panics() {
    SimSpace::new(64).store(4, 1);
}

#[test]
#[should_panic(expected = "beyond the space size")]
fn out_of_bounds_load_panics() {
    SimSpace::new(64).load(64);
}
