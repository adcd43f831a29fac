//! A small blocking client of the Redis protocol (RESP2): commands go out as
//! arrays of bulk strings, replies are parsed into [`Reply`]. One connection
//! per benchmark thread, no pipelining, as YCSB's Jedis binding does.
//!
//! Written here rather than taken from the `redis` crate: the benchmark needs
//! five commands and one reply parser (~150 lines), while the crate brings a
//! dozen dependencies and an async-capable connection layer the benchmark
//! would not use.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;

use nvstore::{Error, Result};

/// A parsed RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The elements of an array reply (nil and non-arrays give none).
    pub fn into_array(self) -> Vec<Reply> {
        match self {
            Reply::Array(Some(v)) => v,
            _ => Vec::new(),
        }
    }

    pub fn into_bulk(self) -> Option<Vec<u8>> {
        match self {
            Reply::Bulk(b) => b,
            _ => None,
        }
    }
}

/// One connection.
pub struct RespConn {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    addr: String,
}

fn io_err(addr: &str, e: std::io::Error) -> Error {
    Error::io(format!("resp://{addr}"), e)
}

fn proto_err(addr: &str, what: &str) -> Error {
    Error::io(
        format!("resp://{addr}"),
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    )
}

impl RespConn {
    /// Connects to `host:port`.
    pub fn connect(addr: &str) -> Result<RespConn> {
        let s = TcpStream::connect(addr).map_err(|e| io_err(addr, e))?;
        s.set_nodelay(true).map_err(|e| io_err(addr, e))?;
        let s2 = s.try_clone().map_err(|e| io_err(addr, e))?;
        Ok(RespConn {
            r: BufReader::with_capacity(64 * 1024, s),
            w: BufWriter::with_capacity(64 * 1024, s2),
            addr: addr.to_string(),
        })
    }

    /// Sends one command and reads its reply; a server error is an `Err`.
    pub fn cmd(&mut self, args: &[&[u8]]) -> Result<Reply> {
        self.send(args)?;
        match self.read_reply()? {
            Reply::Error(e) => Err(proto_err(
                &self.addr,
                &format!("{}: {e}", String::from_utf8_lossy(args[0])),
            )),
            r => Ok(r),
        }
    }

    fn send(&mut self, args: &[&[u8]]) -> Result<()> {
        let w = &mut self.w;
        let res = (|| -> std::io::Result<()> {
            write!(w, "*{}\r\n", args.len())?;
            for a in args {
                write!(w, "${}\r\n", a.len())?;
                w.write_all(a)?;
                w.write_all(b"\r\n")?;
            }
            w.flush()
        })();
        res.map_err(|e| io_err(&self.addr, e))
    }

    fn line(&mut self) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.r.read_until(b'\n', &mut buf).map_err(|e| io_err(&self.addr, e))?;
        if buf.len() < 2 || buf[buf.len() - 2] != b'\r' {
            return Err(proto_err(&self.addr, "connection closed or malformed line"));
        }
        buf.truncate(buf.len() - 2);
        Ok(buf)
    }

    fn int_of(&self, b: &[u8]) -> Result<i64> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| proto_err(&self.addr, "bad integer"))
    }

    fn read_reply(&mut self) -> Result<Reply> {
        let line = self.line()?;
        let (&t, rest) = line.split_first().ok_or_else(|| proto_err(&self.addr, "empty reply"))?;
        Ok(match t {
            b'+' => Reply::Status(String::from_utf8_lossy(rest).into_owned()),
            b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
            b':' => Reply::Int(self.int_of(rest)?),
            b'$' => {
                let n = self.int_of(rest)?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut b = vec![0u8; n as usize + 2];
                    self.r.read_exact(&mut b).map_err(|e| io_err(&self.addr, e))?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            }
            b'*' => {
                let n = self.int_of(rest)?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut v = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        v.push(self.read_reply()?);
                    }
                    Reply::Array(Some(v))
                }
            }
            _ => return Err(proto_err(&self.addr, "unknown reply type")),
        })
    }
}
