//! Hash pools through files: the saved index across clean closes and
//! read-only opens, and a pool opened without its ordered index.

use nvstore::{Db, EngineKind, Error, Options, RecoveryKind};

fn hash_opts() -> Options {
    Options {
        engine: EngineKind::Hash,
        size: 16 << 20,
        ..Options::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{:06}", (i * 7919) % 100_000).into_bytes()
}

#[test]
fn saved_index_is_loaded_and_counted_by_a_read_only_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.pool");
    let db = Db::create(&path, hash_opts()).unwrap();
    for i in 0..2000 {
        db.put(&key(i), b"v").unwrap();
    }
    db.close().unwrap();
    // Read-only: the image stays where it is, and check counts its block.
    let ro = Db::open(
        &path,
        Options {
            read_only: true,
            create: false,
            ..hash_opts()
        },
    )
    .unwrap();
    assert_eq!(ro.recovery().kind, RecoveryKind::Loaded);
    let r = ro.check();
    assert!(r.ok, "{:?}", r.problems);
    assert_eq!(
        ro.prefix(b"key-0").count(),
        ro.iter().filter(|(k, _)| k.starts_with(b"key-0")).count()
    );
    drop(ro);
    // Writable: loaded, the image's block is free again (no leak).
    let db = Db::open(&path, hash_opts()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Loaded);
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    let keys: Vec<Vec<u8>> = db.iter().map(|(k, _)| k).collect();
    let mut want: Vec<Vec<u8>> = (0..2000).map(key).collect();
    want.sort();
    assert_eq!(keys, want);
    // Many clean closes in a row do not grow the pool's used bytes.
    db.close().unwrap();
    let used = |p: &std::path::Path| {
        let db = Db::open(p, hash_opts()).unwrap();
        let u = db.check().used_bytes;
        db.close().unwrap();
        u
    };
    let first = used(&path);
    for _ in 0..5 {
        used(&path);
    }
    assert_eq!(used(&path), first);
}

#[test]
fn without_the_ordered_index_ranges_are_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.pool");
    let no_index = Options {
        ordered_index: false,
        ..hash_opts()
    };
    let db = Db::create(&path, no_index.clone()).unwrap();
    db.put(b"a", b"1").unwrap();
    assert_eq!(db.get(b"a").unwrap(), Some(b"1".to_vec()));
    let got: Vec<_> = db.iter().checked().collect();
    assert!(matches!(got.as_slice(), [Err(Error::Unsupported(_))]), "{got:?}");
    assert!(db.check().ok);
    db.close().unwrap();
    // Nothing was saved; an open with the index rebuilds it.
    let db = Db::open(&path, hash_opts()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Rebuild);
    assert_eq!(db.iter().count(), 1);
}

/// Writers racing on the same few keys (puts, grouped puts, deletes) leave
/// the ordered index holding exactly the table's keys: a put hands its
/// table lock over to the index's lock, so a delete that follows it in the
/// table also follows it in the index. Checked while the writers run
/// (`check` holds both locks) and after.
#[test]
fn racing_writers_of_the_same_keys_keep_the_index_equal_to_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::create(dir.path().join("race.pool"), hash_opts()).unwrap();
    let db = std::sync::Arc::new(db);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                for _ in 0..30_000 {
                    if std::time::Instant::now() > deadline {
                        break;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = format!("k{:02}", x % 24).into_bytes();
                    match (x >> 8) % 4 {
                        0 | 1 => {
                            db.delete(&k).unwrap();
                        }
                        2 => db.put(&k, b"v").unwrap(),
                        _ => {
                            let k2 = format!("k{:02}", (x >> 16) % 24).into_bytes();
                            for r in db.put_many(&[(&k, b"w"), (&k2, b"w")]) {
                                r.unwrap();
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let mut checks = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        let r = db.check();
        assert!(r.ok, "while writing: {:?}", r.problems);
        checks += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    assert!(checks > 0);
    let listed: Vec<Vec<u8>> = db.iter().map(|(k, _)| k).collect();
    let present: Vec<Vec<u8>> = (0..24)
        .map(|i| format!("k{i:02}").into_bytes())
        .filter(|k| db.get(k).unwrap().is_some())
        .collect();
    assert_eq!(listed, present);
}
