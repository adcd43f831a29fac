//! The back-end's TCP server: length-delimited frames (tokio-util codec),
//! one blocking thread per connection (accepted on a tokio runtime), every
//! frame answered by the shared back-end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};

use bytes::{Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::transport::SharedBackend;
use crate::wire::MAX_FRAME;

/// Serves `backend` on `listener` until the process ends. Blocks.
pub fn serve(listener: TcpListener, backend: SharedBackend) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let backend = backend.clone();
            let std = stream.into_std()?;
            std.set_nonblocking(false)?;
            tokio::task::spawn_blocking(move || connection(std, backend));
        }
    })
}

/// Answers one connection's frames in order, on a thread of its own from
/// the runtime's blocking pool, with blocking reads and writes. A front-end
/// waits for each response, so a connection is a strict ping-pong, and a
/// thread blocked in `read` is woken straight by the arriving frame; an
/// async task on the runtime's two workers added the I/O driver's
/// wake-up and hand-off to every round trip (their p99 was milliseconds
/// on a loaded 2-core machine; BENCHMARKS.md).
fn connection(mut stream: std::net::TcpStream, backend: SharedBackend) {
    let mut codec = LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_codec();
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut out = BytesMut::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let frame = loop {
            match codec.decode(&mut buf) {
                Ok(Some(f)) => break f,
                Ok(None) => {}
                Err(_) => return,
            }
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        };
        if crate::mirror::is_subscribe(&frame) {
            // A mirror: the node keeps its connection.
            backend.lock().attach_mirror(&frame, stream);
            return;
        }
        let resp = backend.lock().handle_frame(&frame);
        out.clear();
        if codec.encode(Bytes::from(resp), &mut out).is_err() || stream.write_all(&out).is_err() {
            return;
        }
    }
}

/// Binds `addr` (port 0: any free port) and returns the listener and its address.
pub fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)?;
    let a = l.local_addr()?;
    Ok((l, a))
}
