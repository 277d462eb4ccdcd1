//! TCP server: accepts connections, splits frames, and keeps each
//! connection's responses in request order while later requests are read
//! (clients pipeline produce requests; their syncs are grouped).
//!
//! A frame that cannot be served (too large, unknown API, unsupported
//! version, undecodable) closes the connection with a log line naming why;
//! it never takes the broker down.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};

use crate::protocol::{decode_request, dispatch, encode_response, Conn, Decoded, Pending};
use crate::security::{Auth, Session, Verdict};
use crate::Broker;

/// Requests read ahead of their responses on one connection.
const MAX_IN_FLIGHT: usize = 64;

/// The largest frame read before a connection on a SASL listener has
/// authenticated (ApiVersions and the SASL exchange are small).
const MAX_UNAUTHENTICATED_FRAME: usize = 64 * 1024;

/// How long a TLS listener waits for a connection's handshake.
#[cfg(feature = "tls")]
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Bytes read from a TLS connection's socket at once.
#[cfg(feature = "tls")]
const TLS_READ_AHEAD: usize = 64 * 1024;

/// Accepts connections on `config.listeners[listener]` until shutdown.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    index: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let c = &broker.config;
                    match broker.connections.admit(peer.ip(), c.max_connections, c.max_connections_per_ip) {
                        Ok(slot) => {
                            let b = broker.clone();
                            tokio::spawn(async move {
                                connection(b, stream, peer, index).await;
                                drop(slot);
                            });
                        }
                        Err(why) => {
                            if broker.connections.warn_now() {
                                tracing::warn!(%peer, reason = why, open = broker.connections.open(),
                                    "connection refused: over the connection limit (counted in oncelog_connections_refused_total)");
                            }
                            drop(stream);
                        }
                    }
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

async fn connection(broker: Arc<Broker>, stream: TcpStream, peer: SocketAddr, index: usize) {
    let _ = stream.set_nodelay(true);
    let Some(listener) = broker.config.listeners.get(index).cloned() else {
        return;
    };
    tracing::debug!(%peer, listener = %listener.name, "connection opened");
    #[cfg(feature = "tls")]
    if listener.protocol.tls() {
        let Some(acceptor) = broker.tls.as_ref().map(|t| t.acceptor()) else {
            return;
        };
        // rustls reads the socket 4 KiB at a time; a read-ahead buffer
        // makes that one system call per TLS_READ_AHEAD bytes.
        let stream = tokio::io::BufReader::with_capacity(TLS_READ_AHEAD, stream);
        let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                broker.connections.count_refused("tls_handshake");
                tracing::warn!(%peer, listener = %listener.name, error = %e, "TLS handshake failed; closing connection");
                return;
            }
            Err(_) => {
                broker.connections.count_refused("tls_handshake");
                tracing::warn!(%peer, listener = %listener.name, "no TLS handshake in time; closing connection");
                return;
            }
        };
        let dn = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(crate::security::tls::subject_dn);
        let principal = match dn {
            None => None,
            Some(dn) => match broker.config.ssl_principal_mapping.map(&dn) {
                Some(name) => Some(format!("User:{name}")),
                None => {
                    broker.connections.count_refused("ssl_principal_mapping");
                    tracing::warn!(%peer, listener = %listener.name, subject = %dn,
                        "no ssl.principal.mapping.rules rule applies to the client certificate's subject; closing connection");
                    return;
                }
            },
        };
        let (rd, wr) = tokio::io::split(tls);
        return serve_connection(broker, rd, wr, peer, index, listener, principal).await;
    }
    let (rd, wr) = stream.into_split();
    serve_connection(broker, rd, wr, peer, index, listener, None).await
}

/// Serves one connection's requests, in order, over `rd` and `wr` (a TCP
/// stream's halves, or a TLS session's).
async fn serve_connection<R, W>(
    broker: Arc<Broker>,
    mut rd: R,
    mut wr: W,
    peer: SocketAddr,
    index: usize,
    listener: crate::security::Listener,
    certificate_principal: Option<String>,
) where
    R: AsyncRead + Unpin + Send,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Pending>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        while let Some(pending) = rx.recv().await {
            if let Some(bytes) = pending.await {
                // TLS keeps what the socket did not take in its own buffer
                // until a flush (a no-op on TCP): without it a response's
                // tail could wait there for the next response.
                if wr.write_all(&bytes).await.is_err() || wr.flush().await.is_err() {
                    break;
                }
            }
        }
        let _ = wr.shutdown().await;
    });
    let max = broker.config.max_frame_bytes;
    let mut session = Session::new(&listener, peer);
    if let Some(p) = certificate_principal {
        session.set_certificate_principal(p);
    }
    let mut conn = Conn::new(peer, index);
    conn.principal = session.principal().map(str::to_string);
    let failed_delay = std::time::Duration::from_millis(broker.config.failed_auth_delay_ms);
    let auth_deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(broker.config.unauthenticated_timeout_ms);
    loop {
        // Before authentication a frame may be no larger than a SASL
        // exchange needs: an unauthenticated peer cannot make us buffer more.
        let limit = if session.principal().is_some() {
            max
        } else {
            max.min(MAX_UNAUTHENTICATED_FRAME)
        };
        let read = if session.principal().is_some() {
            read_frame(&mut rd, limit).await
        } else {
            // Before authentication the connection has a deadline.
            match tokio::time::timeout_at(auth_deadline, read_frame(&mut rd, limit)).await {
                Ok(r) => r,
                Err(_) => {
                    broker.connections.count_refused("authentication_timeout");
                    tracing::warn!(%peer, listener = %listener.name,
                        timeout_ms = broker.config.unauthenticated_timeout_ms,
                        "closing connection: not authenticated in time (connections.max.unauthenticated.ms)");
                    break;
                }
            }
        };
        let frame = match read {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(FrameReadError::SizeOutOfBounds { len, max }) => {
                tracing::warn!(%peer, listener = %listener.name, frame_bytes = len, max_bytes = max,
                    authenticated = session.principal().is_some(), "frame size out of bounds; closing connection");
                break;
            }
            Err(FrameReadError::Truncated) => {
                tracing::debug!(%peer, "connection closed mid-frame");
                break;
            }
        };
        let auth = Auth {
            users: &broker.users,
            stats: &broker.auth_stats,
            mechanisms: &broker.config.sasl_mechanisms,
            reauth_ms: broker.config.reauth_ms,
        };
        match judge(&mut session, &frame, &auth) {
            Verdict::Request => {}
            Verdict::Reply(bytes) => {
                conn.principal = session.principal().map(str::to_string);
                if tx
                    .send(Box::pin(std::future::ready(Some(bytes))))
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
            Verdict::Fail(bytes) => {
                // Slows password guessing; the answer goes out, then the
                // connection closes.
                tokio::time::sleep(failed_delay).await;
                if !bytes.is_empty() {
                    let _ = tx.send(Box::pin(std::future::ready(Some(bytes)))).await;
                }
                break;
            }
            Verdict::Close(why) => {
                tracing::warn!(%peer, listener = %listener.name, reason = %why, "closing connection");
                break;
            }
        }
        match dispatch(&broker, frame, &conn).await {
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

/// What the connection's authentication makes of one frame: a raw token
/// after a v0 handshake, a SASL request (answered here), or a request to
/// dispatch if the session lets it through.
pub fn judge(session: &mut Session, frame: &Bytes, auth: &Auth<'_>) -> Verdict {
    if session.expects_raw_token() {
        return session.raw_token(frame, auth);
    }
    if frame.len() < 4 {
        return Verdict::Request;
    }
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    if key != ApiKey::SaslHandshake as i16 && key != ApiKey::SaslAuthenticate as i16 {
        return session.gate(key);
    }
    let req = match decode_request(frame.clone()) {
        Ok(Decoded::Request(r)) => r,
        Ok(Decoded::ApiVersionsFallback { .. }) => {
            return Verdict::Close("unexpected ApiVersions".into())
        }
        Err(e) => return Verdict::Close(e.to_string()),
    };
    let (key, version, cid) = (req.key, req.version, req.correlation_id);
    let (body, failed) = match req.body {
        RequestKind::SaslHandshake(r) => {
            let resp = session.handshake(r, version, auth);
            (ResponseKind::SaslHandshake(resp), !session.exchanging())
        }
        RequestKind::SaslAuthenticate(r) => {
            let (resp, failed) = session.authenticate(r, version, auth);
            (ResponseKind::SaslAuthenticate(resp), failed)
        }
        _ => return Verdict::Request,
    };
    match encode_response(key, version, cid, &body) {
        Some(b) if failed => Verdict::Fail(b),
        Some(b) => Verdict::Reply(b),
        None => Verdict::Close(format!("could not encode the {key:?} answer")),
    }
}

/// Why [`read_frame`] gave up on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameReadError {
    #[error("frame size {len} out of bounds (max {max})")]
    SizeOutOfBounds { len: i32, max: usize },
    #[error("connection closed mid-frame")]
    Truncated,
}

/// The size a frame's length prefix declares, if it is acceptable:
/// not negative and at most `max` bytes.
pub fn frame_size(len: i32, max: usize) -> Result<usize, FrameReadError> {
    match usize::try_from(len) {
        Ok(n) if n <= max => Ok(n),
        _ => Err(FrameReadError::SizeOutOfBounds { len, max }),
    }
}

/// Reads one length-prefixed request frame (without its prefix) from `rd`.
/// `Ok(None)` when the stream ends (or fails) before a whole length prefix.
/// The buffer grows with the data actually received, never up front to the
/// declared size, so a lying prefix costs nothing until its bytes arrive.
pub async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    max: usize,
) -> Result<Option<Bytes>, FrameReadError> {
    let Ok(len) = rd.read_i32().await else {
        return Ok(None);
    };
    let len = frame_size(len, max)?;
    let mut buf = BytesMut::with_capacity(len.min(64 * 1024));
    while buf.len() < len {
        let want = (len - buf.len()).min(1 << 20);
        buf.reserve(want);
        let mut chunk = (&mut *rd).take(want as u64);
        match chunk.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return Err(FrameReadError::Truncated),
            Ok(_) => {}
        }
    }
    Ok(Some(buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(&(p.len() as i32).to_be_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    #[tokio::test]
    async fn frames_split_and_end_cleanly() {
        let mut s = framed(&[b"abc", b"", b"defg"]);
        s.extend_from_slice(&[0, 0]); // a partial length prefix: the peer left
        let mut rd = &s[..];
        for want in [&b"abc"[..], b"", b"defg"] {
            assert_eq!(read_frame(&mut rd, 16).await.unwrap().unwrap(), want);
        }
        assert_eq!(read_frame(&mut rd, 16).await, Ok(None));
    }

    #[tokio::test]
    async fn bad_sizes_and_cut_frames_are_errors() {
        let mut rd = &framed(&[b"0123456789"])[..];
        assert_eq!(
            read_frame(&mut rd, 9).await,
            Err(FrameReadError::SizeOutOfBounds { len: 10, max: 9 })
        );
        let mut rd = &(-1i32).to_be_bytes()[..];
        assert!(matches!(
            read_frame(&mut rd, 9).await,
            Err(FrameReadError::SizeOutOfBounds { len: -1, .. })
        ));
        let s = framed(&[b"0123456789"]);
        let mut rd = &s[..s.len() - 1];
        assert_eq!(
            read_frame(&mut rd, 100).await,
            Err(FrameReadError::Truncated)
        );
    }
}
