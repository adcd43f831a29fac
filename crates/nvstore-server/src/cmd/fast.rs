//! The hottest single-key reads, answered straight into the connection's
//! output buffer: GET, HGET and HGETALL of a small hash. The engine lends
//! the stored value in place ([`Kv::get_with`]) and the reply is encoded
//! from it once, with no copy of the value out of the pool, no decoded
//! [`crate::keys::Meta`] and no [`Reply`](crate::resp::Reply) tree. Any other
//! case (a large hash, another type, damaged metadata, MULTI, no AUTH yet)
//! is left to [`super::execute`], so the replies are exactly its replies.

use std::sync::atomic::Ordering;

use bytes::BytesMut;

use super::{Conn, Req};
use crate::keys::{check_small_hash, MetaKey, SmallPairs, SMALL_HASH_TAG, STRING_TAG};
use crate::resp::{bulk, map_head, nil};
use crate::shared::Shared;
use crate::store::{Kv, PointView};

/// Answers `args` into `out` if it is one of the reads served here and the
/// stored value is of the expected kind; false (nothing written) otherwise.
pub fn read_into(sh: &Shared, c: &Conn, req: &Req, out: &mut BytesMut) -> bool {
    if !c.authed || c.multi.is_some() {
        return false;
    }
    let Some(spec) = req.spec else {
        return false;
    };
    let args = &req.args;
    let done = match (spec.name, args.len()) {
        ("get", 2) => get(sh, &args[1], c.proto, out),
        ("hgetall", 2) => hgetall(sh, &args[1], c.proto, out),
        ("hget", 3) => hget(sh, &args[1], &args[2], c.proto, out),
        _ => false,
    };
    if done {
        sh.stats.commands.fetch_add(1, Ordering::Relaxed);
    }
    done
}

/// Runs `f` on the metadata value of `key` (a point read, no snapshot);
/// `f` returns whether it answered. Absent: `absent` answers.
fn with_meta(
    sh: &Shared,
    key: &[u8],
    out: &mut BytesMut,
    absent: impl FnOnce(&mut BytesMut),
    mut f: impl FnMut(&[u8], &mut BytesMut) -> bool,
) -> bool {
    let view = PointView::new(&sh.store);
    let mut answered = false;
    match view.get_with(&MetaKey::new(key), &mut |v| answered = f(v, out)) {
        Ok(true) => answered,
        Ok(false) => {
            absent(out);
            true
        }
        // The general path reports the engine error.
        Err(_) => false,
    }
}

fn get(sh: &Shared, key: &[u8], proto: u8, out: &mut BytesMut) -> bool {
    with_meta(
        sh,
        key,
        out,
        |out| nil(out, proto),
        |v, out| {
            if v.first() != Some(&STRING_TAG) {
                return false;
            }
            bulk(out, &v[1..]);
            true
        },
    )
}

fn hgetall(sh: &Shared, key: &[u8], proto: u8, out: &mut BytesMut) -> bool {
    with_meta(
        sh,
        key,
        out,
        |out| map_head(out, proto, 0),
        |v, out| {
            if v.first() != Some(&SMALL_HASH_TAG) {
                return false;
            }
            let Some(n) = check_small_hash(v) else {
                return false;
            };
            map_head(out, proto, n);
            for (f, val) in SmallPairs::new(v) {
                bulk(out, f);
                bulk(out, val);
            }
            true
        },
    )
}

fn hget(sh: &Shared, key: &[u8], field: &[u8], proto: u8, out: &mut BytesMut) -> bool {
    with_meta(
        sh,
        key,
        out,
        |out| nil(out, proto),
        |v, out| {
            if v.first() != Some(&SMALL_HASH_TAG) || check_small_hash(v).is_none() {
                return false;
            }
            match SmallPairs::new(v).find(|(f, _)| *f == field) {
                Some((_, val)) => bulk(out, val),
                None => nil(out, proto),
            }
            true
        },
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::cmd::{execute, Conn, Req};
    use crate::store::Store;
    use crate::Config;

    /// A small deterministic generator for the command tests: each call
    /// gives a number below its argument (xorshift from `seed`).
    pub(crate) fn below(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// A server state over a fresh pool in `dir`, with `cfg`'s limits.
    pub(crate) fn shared(dir: &tempfile::TempDir, cfg: Config) -> Arc<Shared> {
        let store = Store::open(&dir.path().join("p.nvs"), nvstore::Options::default()).unwrap();
        Arc::new(Shared::new(Arc::new(store), cfg, 0, "0".repeat(40)))
    }

    pub(crate) fn args(words: &[&str]) -> crate::resp::Args {
        words.iter().map(|w| Bytes::from(w.as_bytes().to_vec())).collect()
    }

    /// What the general path answers, encoded.
    fn general(sh: &Arc<Shared>, c: &mut Conn, a: &[&str]) -> BytesMut {
        let mut out = BytesMut::new();
        execute(sh, c, args(a)).encode(c.proto, &mut out);
        out
    }

    #[test]
    fn fast_replies_are_the_general_replies() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            compact: crate::keys::CompactLimits {
                entries: 3,
                ..Default::default()
            },
            ..Config::default()
        };
        let sh = shared(&dir, cfg);
        let mut c = Conn::new(1, true);
        for w in [
            &["set", "s", "hello\r\nworld"][..],
            &["set", "e", ""],
            &["hset", "h", "b", "2", "a", "1", "c", ""],
            &["hset", "big", "a", "1", "b", "2", "c", "3", "d", "4"],
            &["zadd", "z", "1", "m"],
        ] {
            general(&sh, &mut c, w);
        }
        let reads: &[&[&str]] = &[
            &["get", "s"],
            &["GET", "e"],
            &["get", "missing"],
            &["hgetall", "h"],
            &["HGETALL", "missing"],
            &["hget", "h", "a"],
            &["hget", "h", "c"],
            &["hget", "h", "zz"],
            &["hget", "missing", "a"],
        ];
        // Served here, with the general path's exact bytes.
        for proto in [2, 3] {
            c.proto = proto;
            for r in reads {
                let mut fast = BytesMut::new();
                assert!(
                    read_into(&sh, &c, &Req::new(args(r)), &mut fast),
                    "{r:?} is served fast"
                );
                assert_eq!(fast, general(&sh, &mut c, r), "{r:?} in RESP{proto}");
            }
        }
        // Left to the general path, writing nothing: other types, a large
        // hash, wrong arity, MULTI, no AUTH.
        let others: &[&[&str]] = &[
            &["get", "h"],
            &["get", "z"],
            &["hgetall", "s"],
            &["hgetall", "big"],
            &["hget", "big", "a"],
            &["hget", "z", "m"],
            &["get", "s", "x"],
        ];
        for r in others {
            let mut out = BytesMut::new();
            assert!(!read_into(&sh, &c, &Req::new(args(r)), &mut out), "{r:?}");
            assert!(out.is_empty());
        }
        let mut out = BytesMut::new();
        assert!(!read_into(
            &sh,
            &Conn::new(2, false),
            &Req::new(args(&["get", "s"])),
            &mut out
        ));
        c.multi = Some(Vec::new());
        assert!(!read_into(&sh, &c, &Req::new(args(&["get", "s"])), &mut out));
        assert!(out.is_empty());
    }
}
