//! The back-end's TCP server: length-delimited frames (tokio-util codec),
//! one task per connection, every frame answered by the shared back-end.

use std::net::{SocketAddr, TcpListener};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

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
            tokio::spawn(async move {
                let codec = LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_codec();
                let mut framed = Framed::new(stream, codec);
                while let Some(Ok(frame)) = framed.next().await {
                    if crate::mirror::is_subscribe(&frame) {
                        // A mirror: hand its connection to the node, off the runtime.
                        let Ok(std) = framed.into_inner().into_std() else {
                            return;
                        };
                        if std.set_nonblocking(false).is_ok() {
                            let _ =
                                tokio::task::spawn_blocking(move || backend.lock().attach_mirror(&frame, std)).await;
                        }
                        return;
                    }
                    let resp = backend.lock().handle_frame(&frame);
                    if framed.send(Bytes::from(resp)).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// Binds `addr` (port 0: any free port) and returns the listener and its address.
pub fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)?;
    let a = l.local_addr()?;
    Ok((l, a))
}
