//! Transports: how request frames reach a back-end.
//!
//! A [`Transport`] moves one request frame to the back-end and brings its
//! response back: one round trip. [`Client`] sits on top: it numbers
//! requests, carries the back-end's epoch, checks responses, retransmits a
//! frame whose request or response was lost or torn (the back-end answers a
//! retransmission from its session cache, so nothing runs twice), and
//! counts round trips, verbs by kind and bytes. `Client::post(&[Verb])` is
//! one round trip unless a fault forces a retransmission (counted too).
//!
//! Implementations: [`TcpTransport`] (length-delimited frames on a TCP
//! stream; the back-end side uses tokio's codec), [`LocalTransport`]
//! (in-process, through the same encoding) and [`FaultyTransport`], which
//! wraps another and injects delay, dropped requests or responses, torn
//! frames and death after N round trips. TCP's reads split into small
//! pieces are injected with [`TcpTransport::split_io`].

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::wire::{self, HelloInfo, Reply, Request, Status, Verb, VERB_KINDS};
use crate::{Error, Result};

/// Moves one request frame to a back-end and returns its response frame.
pub trait Transport: Send {
    fn round_trip(&mut self, frame: &[u8]) -> io::Result<Vec<u8>>;
}

impl Transport for Box<dyn Transport> {
    fn round_trip(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        (**self).round_trip(frame)
    }
}

/// Anything that answers request frames (a back-end).
pub trait FrameHandler: Send {
    fn handle_frame(&mut self, frame: &[u8]) -> Vec<u8>;

    /// A mirror subscribed on `stream` with `subscribe` (see `mirror`):
    /// a handler that keeps no mirrors closes the stream.
    fn attach_mirror(&mut self, _subscribe: &[u8], _stream: std::net::TcpStream) {}
}

impl<S: nvstore::pmem::Space> FrameHandler for crate::Backend<S> {
    fn handle_frame(&mut self, frame: &[u8]) -> Vec<u8> {
        crate::Backend::handle_frame(self, frame)
    }
}

/// A back-end shared between transports and server connections.
pub type SharedBackend = Arc<Mutex<dyn FrameHandler>>;

/// Wraps a back-end for sharing.
pub fn share<H: FrameHandler + 'static>(h: H) -> SharedBackend {
    Arc::new(Mutex::new(h))
}

/// In-process transport: the frame is handed to the back-end directly.
#[derive(Clone)]
pub struct LocalTransport {
    backend: SharedBackend,
}

impl LocalTransport {
    pub fn new(backend: SharedBackend) -> LocalTransport {
        LocalTransport { backend }
    }
}

impl Transport for LocalTransport {
    fn round_trip(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        Ok(self.backend.lock().handle_frame(frame))
    }
}

/// TCP transport: each frame is preceded by its length as 4 big-endian
/// bytes (tokio-util's `LengthDelimitedCodec` default).
pub struct TcpTransport {
    stream: TcpStream,
    split: Option<usize>,
}

impl TcpTransport {
    pub fn connect(addr: SocketAddr) -> io::Result<TcpTransport> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(TcpTransport { stream, split: None })
    }

    /// Writes every frame and reads every response in pieces of at most
    /// `n` bytes, as a fault: the far side must reassemble them.
    pub fn split_io(mut self, n: usize) -> TcpTransport {
        self.split = Some(n.max(1));
        self
    }
}

impl Transport for TcpTransport {
    fn round_trip(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(frame.len() + 4);
        out.extend_from_slice(&(frame.len() as u32).to_be_bytes());
        out.extend_from_slice(frame);
        match self.split {
            None => self.stream.write_all(&out)?,
            Some(n) => {
                for c in out.chunks(n) {
                    self.stream.write_all(c)?;
                    self.stream.flush()?;
                }
            }
        }
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > wire::MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "response frame too large"));
        }
        let mut buf = vec![0; len];
        self.read_exact(&mut buf)?;
        Ok(buf)
    }
}

impl TcpTransport {
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match self.split {
            None => self.stream.read_exact(buf),
            Some(n) => {
                for c in buf.chunks_mut(n) {
                    self.stream.read_exact(c)?;
                }
                Ok(())
            }
        }
    }
}

/// Faults a [`FaultyTransport`] injects. Counts are of round trips through
/// the wrapper, starting at 1; `0` turns a fault off.
#[derive(Clone, Debug, Default)]
pub struct Fault {
    /// Added to every round trip.
    pub delay: Duration,
    /// Every n-th request is lost before it reaches the back-end.
    pub drop_request_every: u64,
    /// Every n-th response is lost after the back-end ran the request.
    pub drop_response_every: u64,
    /// Every n-th request arrives with one byte flipped.
    pub tear_every: u64,
    /// After this many round trips the link is dead: every later one fails.
    pub kill_after: Option<u64>,
}

/// Wraps a transport and injects [`Fault`]s. A lost frame surfaces as a
/// `TimedOut` error (the client retransmits); a dead link as `ConnectionAborted`.
pub struct FaultyTransport<T: Transport> {
    inner: T,
    fault: Fault,
    n: u64,
}

impl<T: Transport> FaultyTransport<T> {
    pub fn new(inner: T, fault: Fault) -> FaultyTransport<T> {
        FaultyTransport { inner, fault, n: 0 }
    }
}

fn every(n: u64, k: u64) -> bool {
    k != 0 && n.is_multiple_of(k)
}

impl<T: Transport> Transport for FaultyTransport<T> {
    fn round_trip(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        self.n += 1;
        let n = self.n;
        if self.fault.kill_after.is_some_and(|k| n > k) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "link killed by fault injection",
            ));
        }
        if !self.fault.delay.is_zero() {
            std::thread::sleep(self.fault.delay);
        }
        if every(n, self.fault.drop_request_every) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request dropped by fault injection",
            ));
        }
        let resp = if every(n, self.fault.tear_every) {
            let mut torn = frame.to_vec();
            let i = (n as usize * 7919) % torn.len();
            torn[i] ^= 0x40;
            self.inner.round_trip(&torn)?
        } else {
            self.inner.round_trip(frame)?
        };
        if every(n, self.fault.drop_response_every) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "response dropped by fault injection",
            ));
        }
        Ok(resp)
    }
}

/// Round trips, verbs by kind and bytes moved by a [`Client`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub round_trips: u64,
    /// Indexed like [`VERB_KINDS`].
    pub verbs: [u64; VERB_KINDS.len()],
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Round trips that were retransmissions after a fault.
    pub retransmits: u64,
}

impl Counters {
    pub fn verbs_of(&self, kind: &str) -> u64 {
        VERB_KINDS.iter().position(|k| *k == kind).map_or(0, |i| self.verbs[i])
    }

    pub fn bytes(&self) -> u64 {
        self.bytes_sent + self.bytes_received
    }

    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &Counters) -> Counters {
        let mut verbs = [0; VERB_KINDS.len()];
        for (i, v) in verbs.iter_mut().enumerate() {
            *v = self.verbs[i] - earlier.verbs[i];
        }
        Counters {
            round_trips: self.round_trips - earlier.round_trips,
            verbs,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_received: self.bytes_received - earlier.bytes_received,
            retransmits: self.retransmits - earlier.retransmits,
        }
    }
}

/// A session with one back-end over a transport.
pub struct Client {
    t: Box<dyn Transport>,
    id: u64,
    seq: u64,
    epoch: u64,
    counters: Counters,
    /// Retransmissions allowed per request.
    pub max_retransmits: u32,
}

impl Client {
    /// Opens a session: one round trip (`hello`).
    pub fn connect(t: impl Transport + 'static) -> Result<(Client, HelloInfo)> {
        let mut c = Client {
            t: Box::new(t),
            id: rand::random::<u64>() | 1,
            seq: 0,
            epoch: 0,
            counters: Counters::default(),
            max_retransmits: 8,
        };
        let h = c.hello()?;
        Ok((c, h))
    }

    /// Starts the session again (after the back-end restarted: a new epoch).
    pub fn hello(&mut self) -> Result<HelloInfo> {
        match self.post(&[Verb::Hello])?.pop() {
            Some(Reply::Hello(h)) => {
                self.epoch = h.epoch;
                Ok(h)
            }
            other => Err(Error::Protocol(format!("hello answered {other:?}"))),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Sends `verbs` in one request frame: one round trip (plus
    /// retransmissions of the same frame after a lost or torn frame).
    pub fn post(&mut self, verbs: &[Verb]) -> Result<Vec<Reply>> {
        self.seq += 1;
        let req = Request {
            epoch: self.epoch,
            client: self.id,
            seq: self.seq,
            verbs: verbs.to_vec(),
        };
        let frame = wire::encode_request(&req);
        for v in verbs {
            self.counters.verbs[v.kind()] += 1;
        }
        let mut attempt = 0;
        loop {
            self.counters.round_trips += 1;
            self.counters.bytes_sent += frame.len() as u64 + 4;
            if attempt > 0 {
                self.counters.retransmits += 1;
            }
            attempt += 1;
            let retry = attempt <= self.max_retransmits;
            let bytes = match self.t.round_trip(&frame) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::TimedOut && retry => continue,
                Err(e) => return Err(Error::Io(e)),
            };
            self.counters.bytes_received += bytes.len() as u64 + 4;
            let resp = match wire::decode_response(&bytes) {
                Ok(r) => r,
                Err(_) if retry => continue,
                Err(e) => return Err(e),
            };
            match resp.status {
                Status::Ok => {}
                Status::Torn if retry => continue,
                s => return Err(Error::Rejected(s)),
            }
            if resp.client != self.id || resp.seq != self.seq || resp.replies.len() != verbs.len() {
                return Err(Error::Protocol("response does not match the request".into()));
            }
            return Ok(resp.replies);
        }
    }
}
