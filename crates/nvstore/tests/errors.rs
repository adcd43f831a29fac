//! Typed errors from real files; none of them changes the file.
//! Pool full, growth, size limits, and `check` on deliberately corrupted pools.

use std::path::{Path, PathBuf};

use nvstore::pmem::FlushKind;
use nvstore::{Db, Error, Options, RecoveryKind};

fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-err")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn ro() -> Options {
    Options {
        read_only: true,
        create: false,
        ..Options::default()
    }
}

fn make_pool(d: &Path) -> PathBuf {
    let p = d.join("p.nvs");
    let db = Db::open(
        &p,
        Options {
            size: 1 << 20,
            ..Options::default()
        },
    )
    .unwrap();
    for i in 0..2000u64 {
        db.put(&i.to_be_bytes(), &(i * 3).to_le_bytes()).unwrap();
    }
    db.close().unwrap();
    p
}

/// Opens with `opts`, expects an error matching `pred`, and checks the file is unchanged.
fn expect_err(p: &Path, opts: Options, pred: impl Fn(&Error) -> bool) -> String {
    let before = std::fs::read(p).unwrap();
    let msg = match Db::open(p, opts) {
        Ok(_) => panic!("open succeeded"),
        Err(e) => {
            assert!(pred(&e), "unexpected error: {e}");
            e.to_string()
        }
    };
    assert!(std::fs::read(p).unwrap() == before, "the failed open changed the file");
    assert!(
        msg.contains(&p.display().to_string()),
        "message does not name the file: {msg}"
    );
    msg
}

#[test]
fn random_bytes_are_not_a_pool() {
    let d = dir();
    let p = d.path().join("random.bin");
    let bytes: Vec<u8> = (0..1 << 20).map(|_| rand::random::<u8>()).collect();
    std::fs::write(&p, &bytes).unwrap();
    for opts in [ro(), Options::default()] {
        expect_err(&p, opts, |e| matches!(e, Error::NotAPool { .. }));
    }
    let tiny = d.path().join("tiny");
    std::fs::write(&tiny, b"hello").unwrap();
    expect_err(&tiny, ro(), |e| matches!(e, Error::NotAPool { .. }));
}

#[test]
fn flipped_header_byte_fails_the_checksum() {
    let d = dir();
    let p = make_pool(d.path());
    let mut b = std::fs::read(&p).unwrap();
    b[36] ^= 0x40; // node size field
    std::fs::write(&p, &b).unwrap();
    expect_err(&p, Options::default(), |e| matches!(e, Error::BadChecksum { .. }));
}

#[test]
fn newer_version_is_refused() {
    let d = dir();
    let p = make_pool(d.path());
    let mut b = std::fs::read(&p).unwrap();
    b[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let msg = expect_err(&p, Options::default(), |e| {
        matches!(e, Error::WrongVersion { found: 99, .. })
    });
    assert!(msg.contains("version 99"));
}

#[test]
fn truncated_pool_is_refused() {
    let d = dir();
    let p = make_pool(d.path());
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len / 2).unwrap();
    drop(f);
    expect_err(&p, Options::default(), |e| matches!(e, Error::Truncated { .. }));
}

#[test]
fn missing_pool_without_create() {
    let d = dir();
    let p = d.path().join("absent.nvs");
    assert!(matches!(
        Db::open(
            &p,
            Options {
                create: false,
                ..Options::default()
            }
        ),
        Err(Error::NotFound { .. })
    ));
    assert!(!p.exists());
}

#[test]
fn permission_denied() {
    if euid() == 0 {
        // Root ignores file modes: run the check again as `nobody`.
        as_nobody("permission_denied_unprivileged");
    } else {
        permission_denied_unprivileged();
    }
}

/// Run by [`permission_denied`], directly or as `nobody`.
#[test]
#[ignore = "run by permission_denied, as an unprivileged user"]
fn permission_denied_unprivileged() {
    assert_ne!(euid(), 0, "file modes mean nothing to root");
    let d = dir();
    let p = make_pool(d.path());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    assert!(matches!(
        Db::open(&p, Options::default()),
        Err(Error::PermissionDenied { .. })
    ));
}

/// Runs the ignored test `name` of this test binary as user `nobody`
/// (`setpriv`, from util-linux) and requires it to pass.
fn as_nobody(name: &str) {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name])
        .output()
        .expect("setpriv (util-linux) runs the test as nobody");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} as nobody: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn euid() -> u32 {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn full_pool_fails_the_write_and_harms_nothing() {
    let d = dir();
    let p = d.path().join("full.nvs");
    let opts = Options {
        size: 256 << 10,
        max_size: 2 << 20,
        ..Options::default()
    };
    let db = Db::open(&p, opts.clone()).unwrap();
    let mut acked = Vec::new();
    let big = vec![0x5au8; 3000];
    let err = loop {
        let k = (acked.len() as u64).to_be_bytes();
        match db.put(&k, &big) {
            Ok(()) => acked.push(k),
            Err(e) => break e,
        }
        assert!(acked.len() < 100_000, "pool never filled");
    };
    assert!(matches!(err, Error::PoolFull { .. }), "{err}");
    assert!(err.to_string().contains("full.nvs"));
    // Everything acknowledged is intact, reads keep working, the tree is sound.
    for k in &acked {
        assert_eq!(db.get(k).unwrap().as_deref(), Some(&big[..]));
    }
    assert!(db.check().ok, "{:?}", db.check().problems);
    // Small inline writes may still fit in existing leaves; deletes free space.
    for k in acked.iter().take(100) {
        assert!(db.delete(k).unwrap());
    }
    drop(db);
    let db = Db::open(&p, opts).unwrap();
    assert_eq!(db.len(), acked.len() as u64 - 100);
    assert!(db.check().ok);
}

#[test]
fn pool_grows_and_keeps_data() {
    let d = dir();
    let p = d.path().join("grow.nvs");
    let db = Db::open(
        &p,
        Options {
            size: 256 << 10,
            ..Options::default()
        },
    )
    .unwrap();
    let initial = db.pool_size();
    for i in 0..50_000u64 {
        db.put(&i.to_be_bytes(), &[i as u8; 40]).unwrap();
    }
    assert!(db.pool_size() > initial * 4, "pool did not grow: {}", db.pool_size());
    for i in (0..50_000u64).step_by(97) {
        assert_eq!(db.get(&i.to_be_bytes()).unwrap(), Some(vec![i as u8; 40]));
    }
    assert!(std::fs::metadata(&p).unwrap().len() >= db.pool_size());
    drop(db);
    let db = Db::open(&p, Options::default()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Instant);
    assert_eq!(db.len(), 50_000);
    assert!(db.check().ok);
}

#[test]
fn key_and_value_limits() {
    let d = dir();
    let db = Db::open(d.path().join("lim.nvs"), Options::default()).unwrap();
    let k = vec![7u8; 64 * 1024];
    let v = vec![9u8; 16 * 1024 * 1024];
    db.put(&k, &v).unwrap();
    assert_eq!(db.get(&k).unwrap().map(|x| x.len()), Some(v.len()));
    assert!(matches!(
        db.put(&vec![0; 64 * 1024 + 1], b"x"),
        Err(Error::KeyTooLarge { .. })
    ));
    assert!(matches!(
        db.put(b"x", &vec![0; 16 * 1024 * 1024 + 1]),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(matches!(
        db.get(&vec![0; 64 * 1024 + 1]),
        Err(Error::KeyTooLarge { .. })
    ));
    db.put(b"", b"").unwrap();
    assert_eq!(db.get(b"").unwrap(), Some(vec![]));
    assert_eq!(db.len(), 2);
    assert!(db.check().ok);
}

#[test]
fn flush_override_and_read_only() {
    let d = dir();
    let p = d.path().join("ovr.nvs");
    let db = Db::open(
        &p,
        Options {
            flush: Some(FlushKind::None),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(db.stat().flush, "none");
    db.put(b"a", b"1").unwrap();
    drop(db);
    let db = Db::open(
        &p,
        Options {
            flush: Some(FlushKind::Clflush),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(db.stat().flush, "clflush");
    assert!(["map_sync", "shared"].contains(&db.stat().mapping));
    drop(db);
    let before = std::fs::read(&p).unwrap();
    let db = Db::open(&p, ro()).unwrap();
    assert_eq!(db.get(b"a").unwrap(), Some(b"1".to_vec()));
    assert!(matches!(db.put(b"b", b"2"), Err(Error::ReadOnly)));
    assert!(db.stat().clean_shutdown);
    drop(db);
    assert!(std::fs::read(&p).unwrap() == before, "read-only open changed the file");
}

/// Offset of the first leaf on the chain of the nv pool image `b` that
/// holds a full element (leaves a split built may hold compact entries
/// only, which have no meta word).
fn first_leaf_with_a_full_element(b: &[u8]) -> usize {
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let mut head = word(72) as usize;
    while word(head) == word(head + 24) {
        head = word(head + 8) as usize; // count == compact: next leaf
        assert_ne!(head, 0, "no leaf with a full element");
    }
    head
}

#[test]
fn check_reports_corruption() {
    let d = dir();
    let p = make_pool(d.path());
    // Damage the metadata of the first full element of the first leaf
    // that has one.
    let mut b = std::fs::read(&p).unwrap();
    let head = first_leaf_with_a_full_element(&b);
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let meta = head + nvstore::format::leaf_nv::full_start(word(&b, head + 24)) as usize + 24;
    let kept = b[meta + 7];
    b[meta + 7] = 0x7f; // invalid length nibbles
    std::fs::write(&p, &b).unwrap();
    // Clean pool: instant open succeeds, check finds the damage: in a sealed
    // leaf the element fails its check bits, in an unsealed one its
    // metadata is invalid.
    let db = Db::open(&p, ro()).unwrap();
    let r = db.check();
    assert!(!r.ok);
    assert!(
        (r.problems.iter()).any(|x| x.contains("invalid metadata") || x.contains("fails its check")),
        "{:?}",
        r.problems
    );
    drop(db);
    // A damaged leaf count beyond capacity, in a cleanly closed pool.
    let mut b = std::fs::read(&p).unwrap();
    b[meta + 7] = kept;
    b[head..head + 8].copy_from_slice(&10_000u64.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    // Instant recovery validates the leaves it saved, falls back to a
    // rebuild, and the rebuild refuses the pool, naming the problem.
    let e = Db::open(&p, ro()).err().expect("corrupt pool opened");
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("exceeds capacity"),
        "{e}"
    );
}

/// Unmounts the tiny file system when the test ends, however it ends.
struct TinyFs(PathBuf);

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn full_disk_fails_the_write_and_harms_nothing() {
    // A 2 MiB tmpfs: needs permission to mount; skipped where there is none.
    let dir = std::env::temp_dir().join(format!("nvstore-tinyfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        let _ = std::fs::remove_dir(&dir);
        // CI sets NVSTORE_REQUIRE_TOOLS and runs as root: there the test must run.
        assert!(
            std::env::var_os("NVSTORE_REQUIRE_TOOLS").is_none(),
            "cannot mount a 2 MiB tmpfs, so the full-disk test cannot run"
        );
        eprintln!("cannot mount a tmpfs here (needs root): skipping the full-disk test");
        return;
    }
    let _fs = TinyFs(dir.clone());
    let p = dir.join("disk.nvs");
    let opts = Options {
        size: 256 << 10,
        ..Options::default()
    };
    let db = Db::open(&p, opts.clone()).unwrap();
    let big = vec![0x3cu8; 5000];
    let mut acked = Vec::new();
    let err = loop {
        let k = (acked.len() as u64).to_be_bytes();
        match db.put(&k, &big) {
            Ok(()) => acked.push(k),
            Err(e) => break e,
        }
        assert!(acked.len() < 10_000, "disk never filled");
    };
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("disk.nvs"), "{err}");
    for k in &acked {
        assert_eq!(db.get(k).unwrap().as_deref(), Some(&big[..]));
    }
    assert!(db.check().ok);
    drop(db);
    let db = Db::open(&p, opts).unwrap();
    assert_eq!(db.len(), acked.len() as u64);
    assert!(db.check().ok);
}

/// Rewrites a pool's header as the previous format version wrote it.
fn downgrade_header(p: &Path, version: u32) {
    let mut b = std::fs::read(p).unwrap();
    b[8..12].copy_from_slice(&version.to_le_bytes());
    let sum = nvstore::format::header::checksum(&b[..56]);
    b[56..64].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(p, &b).unwrap();
}

fn header_version(p: &Path) -> u32 {
    u32::from_le_bytes(std::fs::read(p).unwrap()[8..12].try_into().unwrap())
}

#[test]
fn version_1_pool_opens_read_only_unchanged_and_is_upgraded_by_a_writable_open() {
    let d = dir();
    let p = make_pool(d.path());
    downgrade_header(&p, 1);
    let before = std::fs::read(&p).unwrap();

    let db = Db::open(&p, ro()).unwrap();
    assert_eq!(db.get(&7u64.to_be_bytes()).unwrap(), Some(21u64.to_le_bytes().to_vec()));
    assert_eq!(db.len(), 2000);
    drop(db);
    assert!(
        std::fs::read(&p).unwrap() == before,
        "a read-only open changed the file"
    );

    let db = Db::open(&p, Options::default()).unwrap();
    assert_eq!(db.len(), 2000);
    db.put(b"new", b"key").unwrap();
    db.close().unwrap();
    assert_eq!(header_version(&p), nvstore::format::header::VERSION);
    let db = Db::open(&p, ro()).unwrap();
    assert_eq!(db.get(b"new").unwrap(), Some(b"key".to_vec()));
    assert!(db.check().ok);
}

#[test]
fn version_0_is_refused_as_not_written_by_nvstore() {
    let d = dir();
    let p = make_pool(d.path());
    downgrade_header(&p, 0);
    let msg = expect_err(&p, Options::default(), |e| {
        matches!(e, Error::WrongVersion { found: 0, .. })
    });
    assert!(msg.contains("not written by nvstore"), "{msg}");
}

/// The multi-leaf commit record (offset 96) of a cleanly closed pool,
/// lowered below the last committed batch: a read-only open leaves it so,
/// and its `check` names the word (not the batch's elements, which are
/// committed); a writable open restores it from the saved state.
#[test]
fn lowered_commit_record_is_named_by_a_read_only_check() {
    let d = dir();
    let p = d.path().join("t.nvs");
    let opts = Options {
        node_size: 256,
        size: 1 << 20,
        ..Options::default()
    };
    let db = Db::open(&p, opts).unwrap();
    for i in 0..40u64 {
        db.put(&i.to_be_bytes(), b"old").unwrap();
    }
    let mut batch = nvstore::WriteBatch::new();
    for i in (0..40u64).step_by(3) {
        batch.put(&i.to_be_bytes(), b"new");
    }
    db.write_batch(batch).unwrap();
    assert_eq!(db.stat().multi_leaf_commits, 1);
    db.close().unwrap();
    let mut b = std::fs::read(&p).unwrap();
    let sealed = u64::from_le_bytes(b[96..104].try_into().unwrap());
    assert_ne!(sealed, 0);
    b[96..104].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let db = Db::open(&p, ro()).unwrap();
    let r = db.check();
    assert!(!r.ok);
    assert_eq!(
        r.problems,
        vec![format!(
            "header word txn_commit (0) is below the commit record the clean close sealed ({sealed}); a writable \
             open restores it"
        )]
    );
    assert_eq!(db.get(&3u64.to_be_bytes()).unwrap().as_deref(), Some(&b"new"[..]));
    drop(db);
    assert_eq!(std::fs::read(&p).unwrap(), b, "a read-only open wrote");
    let rw = Options {
        create: false,
        ..Options::default()
    };
    let db = Db::open(&p, rw).unwrap();
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
}

/// The leaf head (offset 72) is a root word outside every checksum. In a
/// cleanly closed pool it is pointed past the first leaf, at the second: a
/// rebuild would follow that chain and drop the first leaf's keys (and free
/// its block) without a word. The saved state names the chain the close
/// left, so the open refuses with `Corrupt` instead, read-only or not, and
/// changes nothing; `salvage` reads every key back from the saved list.
#[test]
fn damaged_leaf_head_of_a_clean_pool_is_refused_not_followed() {
    let d = dir();
    let p = make_pool(d.path());
    let mut b = std::fs::read(&p).unwrap();
    let word = |b: &[u8], off: u64| u64::from_le_bytes(b[off as usize..off as usize + 8].try_into().unwrap());
    let first = word(&b, 72);
    let second = word(&b, first + nvstore::format::leaf_nv::NEXT_OFF);
    assert_ne!(second, 0, "one leaf only");
    b[72..80].copy_from_slice(&second.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    for opts in [ro(), Options::default()] {
        let msg = expect_err(&p, opts, |e| matches!(e, Error::Corrupt { .. }));
        assert!(
            msg.contains("not the one the clean close saved") && msg.contains(&format!("leaf {first}")),
            "{msg}"
        );
    }
    let got = nvstore::salvage::read(&p).unwrap();
    assert_eq!(got.records.len(), 2000, "{:?}", got.report);
    for (k, v) in &got.records {
        let i = u64::from_be_bytes(k.as_slice().try_into().unwrap());
        assert_eq!(v, &(i * 3).to_le_bytes());
    }
    assert!(
        got.report.notes.iter().any(|n| n.contains("misses 1 of the")),
        "{:?}",
        got.report
    );
    assert_eq!(got.report.scanned_leaves, 0, "no chunk scan needed");
}

/// The header's clock word (offset 88) is a root word outside every
/// checksum. A cleanly closed pool whose word was lowered below the stored
/// versions still opens with the clock it was closed with (the saved state
/// keeps a sealed copy), so later writes sort after the stored ones.
#[test]
fn lowered_clock_word_of_a_clean_pool_is_not_trusted() {
    let d = dir();
    let p = make_pool(d.path());
    let mut b = std::fs::read(&p).unwrap();
    let clock = u64::from_le_bytes(b[88..96].try_into().unwrap());
    assert!(clock >= 2000, "one timestamp per put: {clock}");
    b[88..96].copy_from_slice(&1u64.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let rw = Options {
        create: false,
        ..Options::default()
    };
    let db = Db::open(&p, rw.clone()).unwrap();
    assert_eq!(db.recovery().kind, RecoveryKind::Instant);
    let snap = db.snapshot().unwrap();
    assert!(
        snap.ts() >= clock,
        "clock {} below the stored versions ({clock})",
        snap.ts()
    );
    drop(snap);
    // Overwrites and new keys, enough for splits and replaces.
    for round in 1..4u64 {
        for i in (0..4000u64).step_by(3) {
            db.put(&i.to_be_bytes(), &(i * round).to_le_bytes()).unwrap();
        }
    }
    let r = db.check();
    assert!(r.ok, "{:?}", r.problems);
    for i in (0..4000u64).step_by(3) {
        assert_eq!(db.get(&i.to_be_bytes()).unwrap(), Some((i * 3).to_le_bytes().to_vec()));
    }
    db.close().unwrap();
    let db = Db::open(&p, rw).unwrap();
    assert!(db.check().ok);
    assert_eq!(db.get(&3u64.to_be_bytes()).unwrap(), Some(9u64.to_le_bytes().to_vec()));
}

/// A damaged version word in a cleanly closed pool, far above the clock
/// (no write in this test reaches it) and resealed so that its element's
/// check bits still hold: the rewrite
/// that would carry it into a new leaf (where later writes of its key would
/// sort below it) fails with `Corrupt` instead, and `check` names it.
#[test]
fn version_above_the_clock_is_refused_by_a_rewrite() {
    use nvstore::format::leaf_nv::{full_start, seal, unseal, SealAt, CONT, VERSION_MASK};
    let d = dir();
    let p = make_pool(d.path());
    let mut b = std::fs::read(&p).unwrap();
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let clock = word(&b, 88);
    let head = first_leaf_with_a_full_element(&b);
    // Its last element (no element after it chains on its words), resealed.
    let (count, compact, stamp) = (word(&b, head), word(&b, head + 24), word(&b, head + 40));
    assert_ne!(stamp, 0, "a sealed leaf");
    let last = count - 1;
    let at = head + full_start(compact) as usize + (last - compact) as usize * 32;
    let stored: [u64; 4] = std::array::from_fn(|j| word(&b, at + 8 * j));
    let chain = if last > compact {
        [word(&b, at - 32 + 8), word(&b, at - 32 + 24)]
    } else {
        [0, 0]
    };
    let seal_at = SealAt {
        leaf: head as u64,
        stamp,
        slot: last,
        chain,
    };
    let mut w = unseal(stored);
    w[3] = (w[3] & !VERSION_MASK) | (clock + (1 << 40));
    let damaged = seal(w, stored[3] & CONT != 0, &seal_at);
    for (j, x) in damaged.iter().enumerate() {
        b[at + 8 * j..at + 8 * j + 8].copy_from_slice(&x.to_le_bytes());
    }
    std::fs::write(&p, &b).unwrap();
    let db = Db::open(
        &p,
        Options {
            create: false,
            ..Options::default()
        },
    )
    .unwrap();
    let r = db.check();
    assert!(
        (r.problems.iter()).any(|x| x.contains("newer than the clock")),
        "{:?}",
        r.problems
    );
    // New keys next to every old one (an overwrite of the damaged key would
    // drop its element instead), until a split reaches the damaged leaf.
    let mut refused = None;
    'out: for round in 1..20u8 {
        for i in 0..2000u64 {
            let mut k = i.to_be_bytes().to_vec();
            k.push(round);
            if let Err(e) = db.put(&k, &i.to_le_bytes()) {
                refused = Some(e);
                break 'out;
            }
        }
    }
    let e = refused.expect("no write reached the damaged element");
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("newer than the clock"),
        "{e}"
    );
}
