//! Runs the real `nvstore` binary: commands, output formats, exit codes and
//! error messages (one line on stderr naming the problem and the file, with
//! the file left byte-identical).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rand::{Rng, SeedableRng};
use tempfile::TempDir;

fn tmpdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("nvstore-cli-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::Builder::new().prefix("nvstore-cli-").tempdir())
        .expect("temporary directory")
}

struct Run {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn out(&self) -> String {
        String::from_utf8(self.stdout.clone()).expect("stdout is UTF-8")
    }
    fn ok(self) -> Run {
        assert_eq!(self.code, 0, "expected success; stderr: {}", self.stderr);
        self
    }
    /// Asserts an error: exit 2, one `nvstore: ` line naming `path` and saying `what`.
    fn error(self, path: Option<&Path>, what: &str) -> Run {
        assert_eq!(self.code, 2, "expected exit 2; stderr: {:?}", self.stderr);
        assert_one_line(&self.stderr);
        if let Some(p) = path {
            assert!(
                self.stderr.contains(&p.display().to_string()),
                "stderr does not name {}: {:?}",
                p.display(),
                self.stderr
            );
        }
        assert!(
            self.stderr.contains(what),
            "stderr does not say {what:?}: {:?}",
            self.stderr
        );
        self
    }
}

fn assert_one_line(stderr: &str) {
    assert!(stderr.starts_with("nvstore: "), "stderr: {stderr:?}");
    assert!(stderr.ends_with('\n'), "stderr: {stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "more than one line on stderr: {stderr:?}");
}

fn cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nvstore"))
}

fn finish(o: Output) -> Run {
    Run {
        code: o.status.code().expect("exited normally"),
        stdout: o.stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn nv<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    finish(cmd().args(args).output().expect("run nvstore"))
}

fn os(p: &Path) -> &OsStr {
    p.as_os_str()
}

fn create(dir: &TempDir, name: &str) -> PathBuf {
    let p = dir.path().join(name);
    nv([OsStr::new("create"), os(&p)]).ok();
    p
}

fn json(r: &Run) -> serde_json::Value {
    serde_json::from_slice(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.out()))
}

fn put(p: &Path, k: &str, v: &str) {
    nv([OsStr::new("put"), os(p), OsStr::new(k), OsStr::new(v)]).ok();
}

// ---------------------------------------------------------------- create, stat

#[test]
fn create_then_stat_json_has_the_required_fields() {
    let d = tmpdir();
    let p = d.path().join("a.nvs");
    let r = nv([OsStr::new("create"), os(&p)]).ok();
    let out = r.out();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with("created ") && out.contains(&p.display().to_string()),
        "{out}"
    );

    let r = nv([OsStr::new("stat"), os(&p), OsStr::new("--json")]).ok();
    assert_eq!(r.out().trim_end().lines().count(), 1, "one JSON object on one line");
    let v = json(&r);
    assert_eq!(v["format_version"], 6);
    assert_eq!(v["size_bytes"], 64 << 20);
    assert!(v["used_bytes"].as_u64().unwrap() > 0);
    assert!(["map_sync", "shared"].contains(&v["mapping"].as_str().unwrap()), "{v}");
    assert!(
        ["clwb", "clflushopt", "clflush", "none"].contains(&v["flush"].as_str().unwrap()),
        "{v}"
    );
    assert_eq!(v["clean_shutdown"], true);
    assert_eq!(v["keys"], 0);
    assert!(v["leaves"].as_u64().is_some());
    assert_eq!(v["leaf_format"], "nv");
    assert_eq!(v["node_size"], 1024);
    assert_eq!(v["last_recovery"]["kind"], "instant");
    assert!(v["last_recovery"]["millis"].as_f64().is_some());
}

#[test]
fn stat_text_is_an_aligned_listing() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    put(&p, "k", "v");
    let out = nv([OsStr::new("stat"), os(&p)]).ok().out();
    let lines: Vec<&str> = out.lines().collect();
    for name in [
        "format_version",
        "size_bytes",
        "mapping",
        "flush",
        "clean_shutdown",
        "keys",
        "leaves",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{name}:"))),
            "{name} missing:\n{out}"
        );
    }
    // Values start in the same column.
    let cols: Vec<usize> = lines
        .iter()
        .map(|l| {
            let colon = l.find(':').unwrap();
            colon + 1 + l[colon + 1..].find(|c: char| c != ' ').unwrap()
        })
        .collect();
    assert!(cols.windows(2).all(|w| w[0] == w[1]), "not aligned:\n{out}");
    let keys = lines.iter().find(|l| l.starts_with("keys:")).unwrap();
    assert_eq!(keys.split_whitespace().nth(1), Some("1"));
}

#[test]
fn create_options_and_sizes() {
    let d = tmpdir();
    let p = d.path().join("b.nvs");
    nv([
        OsStr::new("create"),
        os(&p),
        OsStr::new("--size"),
        OsStr::new("1MiB"),
        OsStr::new("--node-size"),
        OsStr::new("512"),
        OsStr::new("--leaf"),
        OsStr::new("nv"),
        OsStr::new("--flush"),
        OsStr::new("none"),
    ])
    .ok();
    let v = json(&nv([OsStr::new("stat"), os(&p), OsStr::new("--json")]).ok());
    assert_eq!(v["size_bytes"], 1 << 20);
    assert_eq!(v["node_size"], 512);

    let p2 = d.path().join("c.nvs");
    nv([OsStr::new("create"), os(&p2), OsStr::new("--size"), OsStr::new("2M")]).ok();
    let v = json(&nv([OsStr::new("stat"), os(&p2), OsStr::new("--json")]).ok());
    assert_eq!(v["size_bytes"], 2 << 20);

    // Argument errors: one line, nothing created.
    let p3 = d.path().join("d.nvs");
    nv([OsStr::new("create"), os(&p3), OsStr::new("--size"), OsStr::new("12XB")]).error(None, "unknown size unit");
    nv([OsStr::new("create"), os(&p3), OsStr::new("--flush"), OsStr::new("fast")])
        .error(None, "unknown flush instruction");
    nv([
        OsStr::new("create"),
        os(&p3),
        OsStr::new("--leaf"),
        OsStr::new("fptree"),
    ])
    .error(None, "unknown leaf format");
    nv([
        OsStr::new("create"),
        os(&p3),
        OsStr::new("--node-size"),
        OsStr::new("100"),
    ])
    .error(Some(&p3), "node size");
    nv([OsStr::new("create"), os(&p3), OsStr::new("--size"), OsStr::new("4KiB")])
        .error(Some(&p3), "pool size must be at least");
    assert!(!p3.exists());
}

#[test]
fn create_fails_if_the_file_exists() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    let before = std::fs::read(&p).unwrap();
    nv([OsStr::new("create"), os(&p)]).error(Some(&p), "already exists");
    assert_eq!(std::fs::read(&p).unwrap(), before);
}

/// Runs `args` against a damaged file and checks the error and that the
/// file is byte-identical afterwards.
fn rejects_unchanged(p: &Path, args: &[&str], what: &str) {
    let before = std::fs::read(p).unwrap();
    let mut full: Vec<OsString> = vec![args[0].into(), p.as_os_str().into()];
    full.extend(args[1..].iter().map(OsString::from));
    nv(&full).error(Some(p), what);
    assert!(
        std::fs::read(p).unwrap() == before,
        "{} changed by {args:?}",
        p.display()
    );
}

#[test]
fn stat_on_random_bytes_is_not_a_pool() {
    let d = tmpdir();
    let p = d.path().join("random.bin");
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let bytes: Vec<u8> = (0..200_000).map(|_| rng.gen()).collect();
    std::fs::write(&p, &bytes).unwrap();
    for args in [
        &["stat"][..],
        &["stat", "--json"],
        &["check"],
        &["get", "k"],
        &["put", "k", "v"],
        &["del", "k"],
        &["dump"],
        &["scan"],
    ] {
        rejects_unchanged(&p, args, "not an nvstore pool (bad magic number)");
    }
    let empty = d.path().join("empty.nvs");
    std::fs::write(&empty, b"").unwrap();
    rejects_unchanged(&empty, &["stat"], "not an nvstore pool");
}

#[test]
fn stat_on_a_truncated_pool() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    put(&p, "k", "v");
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(1 << 20).unwrap();
    drop(f);
    for args in [&["stat"][..], &["check"], &["put", "k", "w"], &["get", "k"]] {
        rejects_unchanged(&p, args, "pool is truncated");
    }
}

#[test]
fn stat_on_a_flipped_header_byte() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    let mut b = std::fs::read(&p).unwrap();
    b[40] ^= 0x5a;
    std::fs::write(&p, &b).unwrap();
    for args in [&["stat"][..], &["check", "--json"], &["put", "k", "v"], &["del", "k"]] {
        rejects_unchanged(&p, args, "header checksum mismatch");
    }
}

#[test]
fn stat_on_a_newer_version() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    let mut b = std::fs::read(&p).unwrap();
    b[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    for args in [&["stat"][..], &["put", "k", "v"], &["dump"]] {
        rejects_unchanged(&p, args, "pool format version 99 is not supported");
    }
}

#[test]
fn a_pool_open_in_another_process_is_refused_unchanged() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    put(&p, "k", "v");
    let db = nvstore::Db::open(
        &p,
        nvstore::Options {
            create: false,
            ..nvstore::Options::default()
        },
    )
    .unwrap();
    for args in [
        &["put", "k2", "v2"][..],
        &["del", "k"],
        &["stat"],
        &["check"],
        &["get", "k"],
        &["load", "/dev/null"],
    ] {
        rejects_unchanged(&p, args, "already open in another process");
    }
    drop(db);
    // Released: works again.
    assert_eq!(nv([OsStr::new("get"), os(&p), OsStr::new("k")]).ok().out(), "v\n");
}

#[test]
fn permission_denied() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Root ignores file modes, so as root the commands run as `nobody`
    // (setpriv, from util-linux).
    let root = std::fs::metadata("/proc/self").expect("procfs").uid() == 0;
    let run = |args: &[&OsStr]| {
        let mut c = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(env!("CARGO_BIN_EXE_nvstore"));
            c
        } else {
            cmd()
        };
        finish(c.args(args).output().expect("run nvstore"))
    };
    let d = tmpdir();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = create(&d, "a.nvs");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    for args in [&["stat"][..], &["put", "k", "v"], &["get", "k"]] {
        let argv: Vec<&OsStr> = [OsStr::new(args[0]), os(&p)]
            .into_iter()
            .chain(args[1..].iter().map(OsStr::new))
            .collect();
        run(&argv).error(Some(&p), "permission denied");
    }
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
    // Read-only access is enough for reading commands, not for writing ones.
    run(&[OsStr::new("stat"), os(&p)]).ok();
    run(&[OsStr::new("put"), os(&p), OsStr::new("k"), OsStr::new("v")]).error(Some(&p), "permission denied");
}

#[test]
fn a_missing_pool_is_an_error_and_is_not_created() {
    let d = tmpdir();
    let p = d.path().join("missing.nvs");
    for args in [
        &["stat"][..],
        &["put", "k", "v"],
        &["get", "k"],
        &["del", "k"],
        &["scan"],
        &["dump"],
        &["check"],
    ] {
        nv([args[0]]
            .iter()
            .map(OsStr::new)
            .chain([os(&p)])
            .chain(args[1..].iter().map(OsStr::new)))
        .error(Some(&p), "no such pool file");
        assert!(!p.exists(), "{args:?} created the pool");
    }
}

// ---------------------------------------------------------------- put/get/del

#[test]
fn put_get_del_semantics() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    put(&p, "apple", "red");
    put(&p, "banana", "yellow");
    let r = nv([OsStr::new("get"), os(&p), OsStr::new("apple")]).ok();
    assert_eq!(r.stdout, b"red\n");
    assert!(r.stderr.is_empty());

    // Absent: exit 1, no output at all.
    let r = nv([OsStr::new("get"), os(&p), OsStr::new("cherry")]);
    assert_eq!((r.code, r.stdout.len(), r.stderr.as_str()), (1, 0, ""));

    // Update.
    put(&p, "apple", "green");
    assert_eq!(
        nv([OsStr::new("get"), os(&p), OsStr::new("apple")]).ok().stdout,
        b"green\n"
    );

    // Delete: 0 and silent if it was there, 1 and silent if absent.
    let r = nv([OsStr::new("del"), os(&p), OsStr::new("apple")]);
    assert_eq!((r.code, r.stdout.len(), r.stderr.as_str()), (0, 0, ""));
    let r = nv([OsStr::new("del"), os(&p), OsStr::new("apple")]);
    assert_eq!((r.code, r.stdout.len(), r.stderr.as_str()), (1, 0, ""));
    assert_eq!(nv([OsStr::new("get"), os(&p), OsStr::new("apple")]).code, 1);
    assert_eq!(
        nv([OsStr::new("get"), os(&p), OsStr::new("banana")]).ok().stdout,
        b"yellow\n"
    );

    // Raw bytes: non-UTF-8 keys and values, values with tabs and newlines, leading dashes.
    let key = OsString::from_vec(vec![0xff, 0xfe, b'k']);
    let val = OsString::from_vec(vec![b'a', b'\t', 0x80, b'\n', b'z']);
    nv([OsStr::new("put"), os(&p), &key, &val]).ok();
    assert_eq!(nv([OsStr::new("get"), os(&p), &key]).ok().stdout, b"a\t\x80\nz\n");
    nv([OsStr::new("put"), os(&p), OsStr::new("-k"), OsStr::new("--v")]).ok();
    assert_eq!(nv([OsStr::new("get"), os(&p), OsStr::new("-k")]).ok().stdout, b"--v\n");
    // Empty value.
    nv([OsStr::new("put"), os(&p), OsStr::new("empty"), OsStr::new("")]).ok();
    assert_eq!(nv([OsStr::new("get"), os(&p), OsStr::new("empty")]).ok().stdout, b"\n");

    // Each command closed the pool cleanly.
    let v = json(&nv([OsStr::new("stat"), os(&p), OsStr::new("--json")]).ok());
    assert_eq!(v["clean_shutdown"], true);
    assert_eq!(v["keys"], 4);
}

#[test]
fn oversized_keys_are_errors_naming_the_pool() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    let big = "k".repeat(64 * 1024 + 1);
    nv([OsStr::new("put"), os(&p), OsStr::new(&big), OsStr::new("v")]).error(Some(&p), "key is 65537 bytes");
}

// ---------------------------------------------------------------- scan

fn scan(p: &Path, extra: &[&str]) -> Run {
    nv([OsStr::new("scan"), os(p)]
        .into_iter()
        .chain(extra.iter().map(OsStr::new)))
}

fn keys_of(out: &str) -> Vec<String> {
    out.lines().map(|l| l.split('\t').next().unwrap().to_string()).collect()
}

#[test]
fn scan_bounds_prefix_limit_reverse_count() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    let mut input = String::new();
    for i in 0..20 {
        input.push_str(&format!("k{i:03}\tv{i}\n"));
    }
    input.push_str("ka\tA\nkb\tB\nl\tL\nj\tJ\n");
    let inp = d.path().join("in.txt");
    std::fs::write(&inp, &input).unwrap();
    nv([OsStr::new("load"), os(&p), os(&inp)]).ok();
    let k = |r: std::ops::Range<usize>| r.map(|i| format!("k{i:03}")).collect::<Vec<_>>();

    let all = scan(&p, &[]).ok().out();
    assert_eq!(all.lines().count(), 24);
    assert_eq!(all.lines().next(), Some("j\tJ"));
    assert_eq!(all.lines().nth(1), Some("k000\tv0"));
    assert_eq!(all.lines().last(), Some("l\tL"));

    // --from and --to are inclusive.
    assert_eq!(
        keys_of(&scan(&p, &["--from", "k005", "--to", "k008"]).ok().out()),
        k(5..9)
    );
    assert_eq!(
        keys_of(&scan(&p, &["--from", "k0055", "--to", "k0085"]).ok().out()),
        k(6..9)
    );
    assert_eq!(keys_of(&scan(&p, &["--from", "kb"]).ok().out()), vec!["kb", "l"]);
    assert_eq!(
        keys_of(&scan(&p, &["--to", "k001"]).ok().out()),
        vec!["j", "k000", "k001"]
    );
    // --prefix, alone and intersected with --from/--to.
    assert_eq!(keys_of(&scan(&p, &["--prefix", "k01"]).ok().out()), k(10..20));
    assert_eq!(
        keys_of(&scan(&p, &["--prefix", "k01", "--from", "k015"]).ok().out()),
        k(15..20)
    );
    assert_eq!(
        keys_of(&scan(&p, &["--prefix", "k01", "--to", "k012"]).ok().out()),
        k(10..13)
    );
    assert_eq!(
        keys_of(&scan(&p, &["--prefix", "k01", "--from", "a", "--to", "z"]).ok().out()),
        k(10..20)
    );
    assert_eq!(scan(&p, &["--prefix", "k01", "--from", "k5"]).ok().out(), "");
    // An empty range is not an error.
    assert_eq!(scan(&p, &["--from", "z", "--to", "a"]).ok().out(), "");
    // --limit and --reverse.
    assert_eq!(
        keys_of(&scan(&p, &["--limit", "3"]).ok().out()),
        vec!["j", "k000", "k001"]
    );
    assert_eq!(
        keys_of(&scan(&p, &["--reverse", "--limit", "2"]).ok().out()),
        vec!["l", "kb"]
    );
    let mut rev = k(3..7);
    rev.reverse();
    assert_eq!(
        keys_of(&scan(&p, &["--reverse", "--from", "k003", "--to", "k006"]).ok().out()),
        rev
    );
    assert_eq!(
        keys_of(&scan(&p, &["--reverse", "--prefix", "k00", "--limit", "2"]).ok().out()),
        vec!["k009", "k008"]
    );
    assert_eq!(scan(&p, &["--limit", "0"]).ok().out(), "");
    // --count.
    assert_eq!(scan(&p, &["--count"]).ok().out(), "24\n");
    assert_eq!(scan(&p, &["--count", "--prefix", "k"]).ok().out(), "22\n");
    assert_eq!(
        scan(&p, &["--count", "--prefix", "k0", "--limit", "5"]).ok().out(),
        "5\n"
    );
    assert_eq!(
        scan(&p, &["--count", "--from", "k010", "--to", "k019"]).ok().out(),
        "10\n"
    );
    assert_eq!(scan(&p, &["--count", "--prefix", "x"]).ok().out(), "0\n");

    // Escaped output.
    nv([OsStr::new("put"), os(&p), OsStr::new("t\tab"), OsStr::new("x\ny\\")]).ok();
    assert_eq!(scan(&p, &["--prefix", "t"]).ok().out(), "t\\tab\tx\\ny\\\\\n");
}

// ---------------------------------------------------------------- dump, load

/// The documented escaping, written independently of the binary's.
fn esc(bytes: &[u8]) -> String {
    let mut s = String::new();
    for &b in bytes {
        match b {
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

#[test]
fn dump_load_round_trips_every_byte() {
    let d = tmpdir();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut records: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = Default::default();
    for b in 0..=255u8 {
        records.insert(vec![b], vec![b, b'\t', b'\n', b'\\', b]);
        records.insert(vec![b'k', b, b'\t'], (0..=255u8).collect());
    }
    records.insert(b"tab\tkey".to_vec(), b"new\nline".to_vec());
    records.insert(b"back\\slash".to_vec(), b"\\x41 is not A".to_vec());
    records.insert(b"empty value".to_vec(), Vec::new());
    records.insert(Vec::new(), b"empty key".to_vec());
    records.insert(b"big".to_vec(), (0..100_000).map(|_| rng.gen()).collect());
    for _ in 0..500 {
        let k: Vec<u8> = (0..rng.gen_range(1..40)).map(|_| rng.gen()).collect();
        let v: Vec<u8> = (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect();
        records.insert(k, v);
    }
    let mut input = String::new();
    for (k, v) in &records {
        input.push_str(&format!("{}\t{}\n", esc(k), esc(v)));
    }
    let inp = d.path().join("in.txt");
    std::fs::write(&inp, &input).unwrap();

    // load creates the pool when missing.
    let a = d.path().join("a.nvs");
    let r = nv([OsStr::new("load"), os(&a), os(&inp)]).ok();
    assert_eq!(
        r.out(),
        format!("loaded {} records into {}\n", records.len(), a.display())
    );
    let dump_a = nv([OsStr::new("dump"), os(&a)]).ok().stdout;
    // Keys are unique and sorted, so the dump is exactly the input.
    assert!(dump_a == input.as_bytes(), "dump differs from the loaded input");
    assert!(dump_a
        .iter()
        .all(|&b| (0x20..=0x7e).contains(&b) || b == b'\t' || b == b'\n'));

    // Into a second pool through stdin.
    let b = d.path().join("b.nvs");
    let child = cmd()
        .args([OsStr::new("load"), os(&b), OsStr::new("-")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.as_ref().unwrap();
        stdin.write_all(&dump_a).unwrap();
    }
    let mut child = child;
    drop(child.stdin.take());
    let r = finish(child.wait_with_output().unwrap()).ok();
    assert!(r.out().starts_with(&format!("loaded {} records", records.len())));
    let dump_b = nv([OsStr::new("dump"), os(&b)]).ok().stdout;
    assert!(dump_a == dump_b, "dumps of the two pools differ");

    // Values come back raw through get.
    assert_eq!(
        nv([OsStr::new("get"), os(&b), OsStr::new("tab\tkey")]).ok().stdout,
        b"new\nline\n"
    );

    // Loading again overwrites: same contents, same count.
    nv([OsStr::new("load"), os(&b), os(&inp)]).ok();
    assert!(nv([OsStr::new("dump"), os(&b)]).ok().stdout == dump_a);
    assert_eq!(
        json(&nv([OsStr::new("stat"), os(&b), OsStr::new("--json")]).ok())["keys"],
        records.len() as u64
    );
}

#[test]
fn load_rejects_a_malformed_line_naming_it() {
    let d = tmpdir();
    let p = d.path().join("a.nvs");
    let inp = d.path().join("in.txt");
    for (bad, why) in [
        ("no tab here", "missing the tab"),
        ("a\tb\tc", "2 tabs"),
        ("bad\\q\tescape", "unknown escape"),
        ("short\t\\x4", "two hex digits"),
        ("crlf\tline\r", "0x0d"),
        ("", "missing the tab"),
    ] {
        let _ = std::fs::remove_file(&p);
        std::fs::write(&inp, format!("k1\tv1\nk2\tv2\n{bad}\nk4\tv4\n")).unwrap();
        let r = nv([OsStr::new("load"), os(&p), os(&inp)]).error(Some(&inp), why);
        assert!(
            r.stderr.contains(&format!("{}:3:", inp.display())),
            "no line number: {}",
            r.stderr
        );
        assert!(r.stdout.is_empty());
        // The records before it are loaded, nothing after it.
        assert_eq!(nv([OsStr::new("dump"), os(&p)]).ok().out(), "k1\tv1\nk2\tv2\n");
    }
    // A missing input creates nothing.
    let q = d.path().join("q.nvs");
    nv([OsStr::new("load"), os(&q), os(&d.path().join("nope.txt"))])
        .error(Some(&d.path().join("nope.txt")), "no such file");
    assert!(!q.exists());
    // A final line without a newline is fine.
    std::fs::write(&inp, "x\t1\ny\t2").unwrap();
    assert!(nv([OsStr::new("load"), os(&q), os(&inp)])
        .ok()
        .out()
        .starts_with("loaded 2 records"));
}

// ---------------------------------------------------------------- check

#[test]
fn check_json_is_ok_on_a_healthy_pool() {
    let d = tmpdir();
    let p = create(&d, "a.nvs");
    let r = nv([OsStr::new("check"), os(&p), OsStr::new("--json")]).ok();
    let v = json(&r);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["keys"], 0);

    let mut input = String::new();
    for i in 0..5000 {
        input.push_str(&format!("key{i:05}\t{}\n", "v".repeat(i % 50)));
    }
    let inp = d.path().join("in.txt");
    std::fs::write(&inp, &input).unwrap();
    nv([OsStr::new("load"), os(&p), os(&inp)]).ok();
    nv([OsStr::new("del"), os(&p), OsStr::new("key00007")]).ok();
    let before = std::fs::read(&p).unwrap();
    let v = json(&nv([OsStr::new("check"), os(&p), OsStr::new("--json")]).ok());
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["keys"], 4999);
    assert!(v["leaves"].as_u64().unwrap() > 1);
    assert_eq!(v["problems"], serde_json::json!([]));
    assert!(std::fs::read(&p).unwrap() == before, "check wrote to the pool");

    let out = nv([OsStr::new("check"), os(&p)]).ok().out();
    for name in ["leaves:", "elements:", "keys:", "blobs:", "used_bytes:", "problems:"] {
        assert!(out.lines().any(|l| l.starts_with(name)), "{name} missing:\n{out}");
    }
    assert_eq!(out.lines().last(), Some("ok"));
}

// ---------------------------------------------------------------- engines

/// A hash pool answers put, get, del, scan --prefix, dump and check as a
/// tree pool does, and stat names each pool's engine.
#[test]
fn a_hash_pool_answers_like_a_tree_pool() {
    let d = tmpdir();
    let tree = create(&d, "t.nvs");
    let hash = d.path().join("h.nvs");
    nv([
        OsStr::new("create"),
        os(&hash),
        OsStr::new("--engine"),
        OsStr::new("hash"),
    ])
    .ok();
    let pairs = [
        ("apple", "red"),
        ("apricot", "orange"),
        ("banana", "yellow"),
        ("a-key-longer-than-eight-bytes", "and a value longer than eight bytes"),
        ("", "empty key"),
    ];
    for p in [&tree, &hash] {
        for (k, v) in pairs {
            put(p, k, v);
        }
        put(p, "apple", "green");
        nv([OsStr::new("del"), os(p), OsStr::new("banana")]).ok();
    }
    let same = |args: &[&str]| {
        let run = |p: &Path| {
            let mut a: Vec<&OsStr> = vec![OsStr::new(args[0]), os(p)];
            a.extend(args[1..].iter().map(OsStr::new));
            let r = nv(a);
            (r.code, r.out())
        };
        let (t, h) = (run(&tree), run(&hash));
        assert_eq!(t, h, "{args:?} differs between the engines");
        t.1
    };
    assert_eq!(same(&["get", "apple"]), "green\n");
    same(&["get", "banana"]);
    assert_eq!(keys_of(&same(&["scan", "--prefix", "ap"])), ["apple", "apricot"]);
    same(&["scan", "--reverse"]);
    same(&["scan", "--from", "a", "--to", "b", "--count"]);
    let dump = same(&["dump"]);
    assert_eq!(dump.lines().count(), 4, "{dump}");
    nv([OsStr::new("check"), os(&hash)]).ok();
    let engine = |p: &Path| json(&nv([OsStr::new("stat"), os(p), OsStr::new("--json")]).ok())["engine"].clone();
    assert_eq!(engine(&tree), "tree");
    assert_eq!(engine(&hash), "hash");
    nv([
        OsStr::new("create"),
        os(&d.path().join("x.nvs")),
        OsStr::new("--engine"),
        OsStr::new("btree"),
    ])
    .error(None, "unknown engine");
}

// ---------------------------------------------------------------- crashtest

#[test]
fn crashtest_lists_points_and_wires_the_campaign() {
    let out = nv(["crashtest", "--list-points"]).ok().out();
    let names: Vec<&str> = out.lines().collect();
    assert!(!names.is_empty());
    assert_eq!(names, nvstore::crashtest::list_points());

    nv(["crashtest", "--leaf", "fptree"]).error(None, "unknown leaf format");
    nv(["crashtest", "--leaf", "isle", "--txn"]).error(None, "--txn needs --leaf nv");
    nv(["crashtest", "--drop", "no.such.point"]).error(None, "unknown persistence point");
    nv(["crashtest", "--engine", "hash", "--txn"]).error(None, "--txn needs a tree pool");

    let r = nv(["crashtest", "--ops", "20", "--seed", "3", "--json"]);
    let v = json(&r);
    assert_eq!(v["ops"], 20);
    assert_eq!(v["seed"], 3);
    let violations = v["violations"].as_u64().unwrap();
    assert_eq!(r.code, if violations > 0 { 1 } else { 0 }, "stderr: {}", r.stderr);
    if violations > 0 {
        assert!(r.stderr.contains("violation"));
    }
}

// ---------------------------------------------------------------- demo, help

#[test]
fn demo_runs_in_a_fresh_directory() {
    let d = tmpdir();
    let r = finish(
        cmd()
            .args(["demo", "--keys", "20000"])
            .current_dir(d.path())
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, 0, "demo failed: {}\n{}", r.out(), r.stderr);
    let out = r.out();
    assert!(out.contains("demo passed"), "{out}");
    for word in [
        "put",
        "get",
        "scan",
        "delete",
        "check",
        "reopen",
        "flushes/put",
        "ops/s",
        "instant recovery",
    ] {
        assert!(out.contains(word), "{word} missing:\n{out}");
    }
    let p = d.path().join("nvstore.nvs");
    let v = json(&nv([OsStr::new("stat"), os(&p), OsStr::new("--json")]).ok());
    assert_eq!(v["keys"], 18000);
    assert_eq!(v["clean_shutdown"], true);
}

#[test]
fn every_command_has_help() {
    let top = nv(["--help"]).ok().out();
    for c in [
        "create",
        "stat",
        "put",
        "get",
        "del",
        "scan",
        "dump",
        "load",
        "check",
        "crashtest",
        "demo",
    ] {
        assert!(top.contains(c), "{c} missing from --help");
        let h = nv([c, "--help"]).ok().out();
        assert!(
            h.lines().next().is_some_and(|l| l.len() > 20),
            "{c} --help says nothing:\n{h}"
        );
        assert!(h.contains("Usage: nvstore"), "{h}");
    }
}

#[test]
fn argument_errors_are_one_line() {
    nv(["get"]).error(None, "required arguments were not provided");
    nv(["frobnicate"]).error(None, "unrecognized subcommand");
    nv(["scan", "x", "--limit", "many"]).error(None, "--limit");
}

// ---------------------------------------------------------------- bench kvindex

#[test]
fn bench_kvindex_json_has_exactly_the_five_fields() {
    let dir = tmpdir();
    let r = nv([
        OsStr::new("bench"),
        OsStr::new("kvindex"),
        OsStr::new("--json"),
        OsStr::new("--keys"),
        OsStr::new("200"),
        OsStr::new("--sectors"),
        OsStr::new("1,2048"),
        OsStr::new("--max-mib"),
        OsStr::new("1"),
        OsStr::new("--pool-dir"),
        os(dir.path()),
    ])
    .ok();
    let rows: Vec<serde_json::Value> = r
        .out()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let seen: Vec<_> = rows
        .iter()
        .map(|o| {
            let mut keys: Vec<_> = o.as_object().expect("an object").keys().cloned().collect();
            keys.sort();
            assert_eq!(
                keys,
                ["engine", "index_overhead_pct", "mode", "ops_per_sec", "value_sectors"],
                "{o}"
            );
            assert!(o["ops_per_sec"].as_f64().unwrap() > 0.0, "{o}");
            (
                o["mode"].as_str().unwrap().to_string(),
                o["value_sectors"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<_> = [("sync", 1), ("async", 1), ("sync", 2048), ("async", 2048)]
        .iter()
        .map(|&(m, s)| (m.to_string(), s))
        .collect();
    assert_eq!(seen, want);
    // The default engine is the hash table with its ordered index.
    assert!(rows.iter().all(|o| o["engine"] == "hash"));
    // The capped size is named on stderr, not in the JSON.
    assert!(
        r.stderr.contains("2048 sectors: N = 1 of the 200 records asked"),
        "stderr: {}",
        r.stderr
    );
    nv(["bench", "kvindex", "--engine", "nope"]).error(None, "unknown engine 'nope'");
}
