//! Damaged pools through the public API.
//!
//! The target builds small valid pools once (one per leaf format in
//! `LEAVES`, each cleanly closed and as if crashed), picks one by the first input byte and
//! applies the rest of the input to it as patches, so the fuzzer damages
//! real structures instead of guessing a header. Each patch is a 3-byte
//! little-endian offset (taken modulo the pool size), a length byte and that
//! many bytes (fewer at the end of the input).
//!
//! The damaged pool is then opened read-only, checked, read by key and
//! scanned in full; a copy is opened for writing, written and closed.
//! Every step may fail with an error; none may panic, crash or hang.
//! Adaptive node sizing is off: it measures time, and the fuzzer needs base
//! pools and runs that repeat exactly.
//!
//! To craft an input by hand, `NVSTORE_FUZZ_BASES=DIR` writes the base
//! pools to DIR (`0.nvs`, `1.nvs`, ..., chosen by the first input byte
//! modulo their number).

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nvstore::{Adaptive, Db, LeafKind, Options};

/// Keys of the base pools: `key0000`..; every fifth one deleted again.
const KEYS: u32 = 300;
/// Offset of the clean-shutdown word in the pool header (docs/format.md).
const CLEAN_STATE_OFF: usize = 80;
/// Pools may not grow beyond this while fuzzing.
const MAX_SIZE: u64 = 4 << 20;

fn key(i: u32) -> Vec<u8> {
    format!("key{i:04}").into_bytes()
}

/// Values of several sizes, some beyond a leaf (stored as blobs).
fn value(i: u32) -> Vec<u8> {
    let len = match i % 7 {
        0 => 0,
        1 => 700,
        2 => 2000,
        _ => (i % 50) as usize,
    };
    (0..len).map(|j| (i as usize + j) as u8).collect()
}

/// A scratch file of this process (memory-backed where /dev/shm exists);
/// each run removes its files unless it crashed.
fn scratch(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("nvstore-fuzz-{}-{name}.nvs", std::process::id()))
}

fn base_pool(leaf: LeafKind) -> Vec<u8> {
    let path = scratch("base");
    let _ = std::fs::remove_file(&path);
    let opts = Options {
        size: 256 << 10,
        max_size: MAX_SIZE,
        node_size: 256,
        leaf,
        adaptive: Adaptive::Off,
        ..Options::default()
    };
    let db = Db::open(&path, opts).expect("create the base pool");
    for i in 0..KEYS {
        db.put(&key(i), &value(i)).expect("fill the base pool");
    }
    for i in (0..KEYS).step_by(5) {
        db.delete(&key(i)).expect("delete from the base pool");
    }
    db.close().expect("close the base pool");
    let bytes = std::fs::read(&path).expect("read the base pool");
    let _ = std::fs::remove_file(&path);
    bytes
}

/// Leaf formats of the base pools: the first input byte picks nv (0 clean,
/// 1 crashed) or isle (2 clean, 3 crashed), modulo 4.
const LEAVES: &[LeafKind] = &[LeafKind::Nv, LeafKind::Isle];

/// The base pools: clean and crashed, for each of [`LEAVES`].
fn bases() -> &'static [Vec<u8>] {
    static BASES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut out = Vec::new();
        for &leaf in LEAVES {
            let clean = base_pool(leaf);
            let mut crashed = clean.clone();
            crashed[CLEAN_STATE_OFF..CLEAN_STATE_OFF + 8].fill(0);
            out.push(clean);
            out.push(crashed);
        }
        if let Some(dir) = std::env::var_os("NVSTORE_FUZZ_BASES") {
            for (i, pool) in out.iter().enumerate() {
                std::fs::write(Path::new(&dir).join(format!("{i}.nvs")), pool).expect("write a base pool");
            }
        }
        out
    })
}

fn patch(pool: &mut [u8], mut input: &[u8]) {
    while input.len() >= 4 {
        let off = u32::from_le_bytes([input[0], input[1], input[2], 0]) as usize % pool.len();
        let len = (input[3] as usize).min(input.len() - 4).min(pool.len() - off);
        pool[off..off + len].copy_from_slice(&input[4..4 + len]);
        input = &input[4 + len..];
    }
}

fn read_only(path: &Path) {
    let opts = Options {
        create: false,
        read_only: true,
        adaptive: Adaptive::Off,
        ..Options::default()
    };
    let Ok(db) = Db::open(path, opts) else {
        return;
    };
    let _ = db.stat();
    let _ = db.check();
    for i in (0..KEYS).step_by(7) {
        let _ = db.get(&key(i));
    }
    let _ = db.get(b"");
    let _ = db.get(b"zzzz");
    let _ = db.iter().count();
    let _ = db.range_rev(key(100)..key(200)).count();
    let _ = db.prefix(b"key01").count();
}

fn writable(path: &Path) {
    let opts = Options {
        create: false,
        max_size: MAX_SIZE,
        adaptive: Adaptive::Off,
        ..Options::default()
    };
    let Ok(db) = Db::open(path, opts) else {
        return;
    };
    for i in (0..KEYS).step_by(11) {
        let _ = db.put(&key(i), b"new");
    }
    let _ = db.put(b"fresh", &[7; 900]);
    let _ = db.delete(&key(3));
    let _ = db.get(&key(11));
    let _ = db.iter().count();
    let _ = db.check();
    let _ = db.close();
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, patches)) = data.split_first() else {
        return;
    };
    let bases = bases();
    let mut pool = bases[which as usize % bases.len()].clone();
    patch(&mut pool, patches);
    let ro = scratch("ro");
    let rw = scratch("rw");
    std::fs::write(&ro, &pool).expect("write the pool");
    std::fs::write(&rw, &pool).expect("write the pool");
    read_only(&ro);
    writable(&rw);
    let _ = std::fs::remove_file(&ro);
    let _ = std::fs::remove_file(&rw);
});
