//! Request framing inside TLS, as an SSL listener runs it: the broker's own
//! acceptor (`oncelog_broker::security::tls::TlsServer`, loaded from PEM files as
//! `ssl.keystore.location` names them), `tokio::io::split` of the session
//! and `read_frame` over its plaintext, against a rustls client in memory.
//!
//! * A client writes an arbitrary stream in arbitrary write sizes (so TLS
//!   records of every size, frames cut across records): the server must
//!   read exactly the frames a one-shot split of that stream finds, and end
//!   the same way.
//! * One byte of what the client sent is flipped on the way (handshake or
//!   records): the server may lose the connection, but every frame it read
//!   is one the client sent, in order — nothing forged, nothing reordered.
//! * The input is the client's raw bytes (no real client, so no keys): no
//!   frame may ever come out.
//!
//! Never a panic. Input: `[mode][max][tamper offset: u16][xor][n][n write
//! sizes][stream...]`.
#![no_main]

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use libfuzzer_sys::fuzz_target;
use oncelog_broker::protocol::server::read_frame;
use oncelog_broker::security::tls::{ClientAuth, TlsServer, TlsSettings};
use oncelog_fuzz::{reference_split, End};
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

const MAXES: [usize; 4] = [0, 61, 4096, 1 << 20];
/// The listener's TLS handshake deadline (as in `server.rs`).
const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);
/// How long this model waits for a stalled connection at all (what Kafka
/// calls connections.max.idle.ms): a stall with nothing tampered fails.
const IDLE: std::time::Duration = std::time::Duration::from_secs(600);

struct Fixture {
    server: TlsServer,
    client: Arc<rustls::ClientConfig>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tls");
        let server = TlsServer::load(TlsSettings {
            keystore: dir.join("server-bundle.pem"),
            truststore: None,
            client_auth: ClientAuth::None,
        })
        .expect("the fuzz target's server certificate loads");
        let mut roots = rustls::RootCertStore::empty();
        for c in
            rustls_pki_types::CertificateDer::pem_file_iter(dir.join("ca.pem")).expect("ca.pem")
        {
            roots
                .add(c.expect("a CA certificate"))
                .expect("a CA certificate");
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Fixture {
            server,
            client: Arc::new(client),
        }
    })
}

/// The server's side of the wire: what the client sent, one byte flipped
/// (at `at`, if the stream gets that long).
struct Tampered {
    inner: DuplexStream,
    pos: usize,
    at: Option<(usize, u8)>,
    applied: Arc<AtomicBool>,
}

impl AsyncRead for Tampered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let n = buf.filled().len() - before;
            if let Some((at, xor)) = self.at {
                if at >= self.pos && at < self.pos + n {
                    buf.filled_mut()[before + at - self.pos] ^= xor;
                    self.applied.store(true, Ordering::Relaxed);
                }
            }
            self.pos += n;
        }
        r
    }
}

impl AsyncWrite for Tampered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the server read: its frames, and how the stream ended (`None`: the
/// handshake failed).
async fn serve(io: Tampered, max: usize) -> (Vec<bytes::Bytes>, Option<End>) {
    let acceptor = fixture().server.acceptor();
    let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(io)).await {
        Ok(Ok(tls)) => tls,
        Err(_) => return (Vec::new(), None),
        Ok(Err(e)) => {
            if std::env::var_os("TLS_FRAMING_DEBUG").is_some() {
                eprintln!("handshake: {e}");
            }
            return (Vec::new(), None);
        }
    };
    let (mut rd, _wr) = tokio::io::split(tls);
    let mut frames = Vec::new();
    loop {
        match read_frame(&mut rd, max).await {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => return (frames, Some(End::Clean)),
            Err(e) => return (frames, Some(End::Error(e))),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let (mode, max) = (data[0], MAXES[data[1] as usize % MAXES.len()]);
    let at = u16::from_be_bytes([data[2], data[3]]) as usize;
    let xor = data[4];
    let n = (data[5] as usize).min(data.len() - 6);
    let (sizes, stream) = data[6..].split_at(n);
    // Time paused: it jumps ahead whenever both sides wait, so a peer that
    // stalls (a flipped length byte makes the server wait for bytes that
    // never come) meets the deadline at once.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let applied = Arc::new(AtomicBool::new(false));
    let server_io = Tampered {
        inner: server_io,
        pos: 0,
        at: (mode & 1 == 1 && xor != 0).then_some((at, xor)),
        applied: applied.clone(),
    };
    let raw = mode & 2 == 2;
    let client_stream = stream.to_vec();
    let write_sizes = sizes.to_vec();
    let (frames, end) = rt.block_on(async move {
        let client = tokio::spawn(async move {
            let mut io = client_io;
            if raw {
                // No client at all: the input is what arrives on the wire.
                let _ = io.write_all(&client_stream).await;
                let _ = io.shutdown().await;
                return;
            }
            let connector = tokio_rustls::TlsConnector::from(fixture().client.clone());
            let name = rustls_pki_types::ServerName::try_from("localhost").expect("a name");
            let mut tls = match connector.connect(name, io).await {
                Ok(tls) => tls,
                Err(e) => {
                    if std::env::var_os("TLS_FRAMING_DEBUG").is_some() {
                        eprintln!("client handshake: {e}");
                    }
                    return;
                }
            };
            let mut rest = &client_stream[..];
            let mut i = 0;
            while !rest.is_empty() {
                let s = write_sizes
                    .get(i % write_sizes.len().max(1))
                    .copied()
                    .unwrap_or(0xff);
                i += 1;
                let want = if s & 0x80 == 0 {
                    s as usize + 1
                } else {
                    ((s & 0x7f) as usize + 1) * 512
                };
                let (now, after) = rest.split_at(want.min(rest.len()));
                if tls.write_all(now).await.is_err() || tls.flush().await.is_err() {
                    return;
                }
                rest = after;
            }
            let _ = tls.shutdown().await;
            // Stay connected (reading what the server still sends, its
            // session tickets) until the server is done, as a real client's
            // socket would.
            let _ = tokio::io::copy(&mut tls, &mut tokio::io::sink()).await;
        });
        let served = tokio::time::timeout(IDLE, serve(server_io, max))
            .await
            .unwrap_or((Vec::new(), None));
        client.abort();
        served
    });
    let (want, want_end) = reference_split(stream, max);
    if raw {
        assert!(frames.is_empty(), "a frame from a client that has no keys");
        return;
    }
    assert!(
        frames.len() <= want.len(),
        "more frames than the client sent"
    );
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(&f[..], want[i], "frame {i} is not the one the client sent");
    }
    if !applied.load(Ordering::Relaxed) {
        assert!(end.is_some(), "the handshake failed with nothing tampered");
        assert_eq!(
            frames.len(),
            want.len(),
            "frames lost with nothing tampered"
        );
        assert_eq!(end, Some(want_end), "the stream ended differently");
    }
});
