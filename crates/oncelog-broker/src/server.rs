//! TCP server: accepts connections, splits frames, and keeps each
//! connection's responses in request order while later requests are read
//! (clients pipeline produce requests; their syncs are grouped).
//!
//! A frame that cannot be served (too large, unknown API, unsupported
//! version, undecodable) closes the connection with a log line naming why;
//! it never takes the broker down.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::handlers::{dispatch, Pending};
use crate::Broker;

/// Requests read ahead of their responses on one connection.
const MAX_IN_FLIGHT: usize = 64;

pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let b = broker.clone();
                    tokio::spawn(async move { connection(b, stream, peer).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

async fn connection(broker: Arc<Broker>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    tracing::debug!(%peer, "connection opened");
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Pending>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        while let Some(pending) = rx.recv().await {
            if let Some(bytes) = pending.await {
                if wr.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        }
        let _ = wr.shutdown().await;
    });
    let max = broker.config.max_frame_bytes;
    while let Ok(len) = rd.read_i32().await {
        if len < 0 || len as usize > max {
            tracing::warn!(%peer, frame_bytes = len, max_bytes = max, "frame size out of bounds; closing connection");
            break;
        }
        let len = len as usize;
        // Grow with the data actually received, not with the declared size.
        let mut buf = BytesMut::with_capacity(len.min(64 * 1024));
        let mut short = false;
        while buf.len() < len {
            let want = (len - buf.len()).min(1 << 20);
            buf.reserve(want);
            let mut chunk = (&mut rd).take(want as u64);
            match chunk.read_buf(&mut buf).await {
                Ok(0) | Err(_) => {
                    short = true;
                    break;
                }
                Ok(_) => {}
            }
        }
        if short {
            tracing::debug!(%peer, "connection closed mid-frame");
            break;
        }
        match dispatch(&broker, buf.freeze(), peer).await {
            Ok(pending) => {
                if tx.send(pending).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "bad request; closing connection");
                break;
            }
        }
    }
    drop(tx);
    let _ = writer.await;
    tracing::debug!(%peer, "connection closed");
}
