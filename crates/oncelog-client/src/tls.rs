//! Client-side TLS (feature `tls`) for SSL and SASL_SSL listeners, with
//! rustls: the broker's certificate is verified against the CA file given
//! (`--ca-cert`, or the system's bundle), its name against the host of the
//! address connected to; an optional client certificate and key for
//! listeners with `ssl.client.auth`. Set once per process ([`set`]) like
//! SASL; every new connection then starts with a TLS handshake.

#[cfg(feature = "tls")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::error::ClientError;

/// A connection's byte stream: TCP, or TLS over TCP.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}
pub type Stream = Box<dyn Io>;

/// How this process's connections use TLS.
#[derive(Debug, Clone, Default)]
pub struct TlsConfig {
    /// PEM CA certificates the broker's certificate must chain to; `None`:
    /// the system's bundle (`SSL_CERT_FILE`, or the usual places).
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate chain (may also hold the key).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert` (default: looked for in `cert`'s file).
    pub key: Option<PathBuf>,
}

#[cfg(feature = "tls")]
static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
#[cfg(not(feature = "tls"))]
static CONFIG: OnceLock<Arc<()>> = OnceLock::new();

fn bad(why: String) -> ClientError {
    ClientError::Tls {
        addr: String::new(),
        why,
    }
}

/// The system's CA bundle, where Debian, Fedora and Alpine keep it.
fn system_bundle() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
        return Some(p.into());
    }
    [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

#[cfg(feature = "tls")]
fn pem_certs(path: &Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, ClientError> {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("{}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(bad(format!("{}: no PEM certificate in it", path.display())));
    }
    Ok(certs)
}

/// Makes every connection of this process use TLS as `c` says. The first
/// call wins.
#[cfg(feature = "tls")]
pub fn set(c: TlsConfig) -> Result<(), ClientError> {
    let cfg = build(&c)?;
    let _ = CONFIG.set(Arc::new(cfg));
    Ok(())
}

#[cfg(feature = "tls")]
fn build(c: &TlsConfig) -> Result<rustls::ClientConfig, ClientError> {
    use rustls_pki_types::pem::PemObject;
    let ca = c.ca_cert.clone().or_else(system_bundle).ok_or_else(|| {
        bad(
            "no CA certificates: give --ca-cert (the CA that signed the broker's certificate)"
                .into(),
        )
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in pem_certs(&ca)? {
        roots
            .add(cert)
            .map_err(|e| bad(format!("{}: {e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots);
    let cfg = match (&c.cert, &c.key) {
        (None, None) => builder.with_no_client_auth(),
        (None, Some(_)) => return Err(bad("--cert-key needs --cert".into())),
        (Some(cert), key) => {
            let key_path = key.as_ref().unwrap_or(cert);
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
                bad(format!(
                    "{}: no usable PEM private key: {e}",
                    key_path.display()
                ))
            })?;
            builder
                .with_client_auth_cert(pem_certs(cert)?, key)
                .map_err(|e| bad(format!("{}: {e}", cert.display())))?
        }
    };
    Ok(cfg)
}

#[cfg(not(feature = "tls"))]
pub fn set(_c: TlsConfig) -> Result<(), ClientError> {
    let _ = system_bundle;
    Err(bad(
        "this build has no TLS (built without the `tls` feature)".into(),
    ))
}

/// Whether connections use TLS.
pub fn enabled() -> bool {
    CONFIG.get().is_some()
}

/// Starts TLS on `tcp` to `addr` (`host:port`), the host naming the
/// certificate's expected subject (a DNS name or an IP address).
#[cfg(feature = "tls")]
pub(crate) async fn wrap(tcp: tokio::net::TcpStream, addr: &str) -> Result<Stream, ClientError> {
    let cfg = CONFIG.get().cloned().ok_or_else(|| ClientError::Tls {
        addr: addr.to_string(),
        why: "TLS is not set up".into(),
    })?;
    handshake(cfg, tcp, addr).await
}

/// Starts TLS on `tcp` to `addr` for a connection of the caller's own (the
/// CLI's `https://` to a broker's HTTP endpoint): with this process's TLS
/// settings when set ([`set`]), else against the system's CA bundle.
#[cfg(feature = "tls")]
pub async fn connect_https(tcp: tokio::net::TcpStream, addr: &str) -> Result<Stream, ClientError> {
    let cfg = match CONFIG.get() {
        Some(cfg) => cfg.clone(),
        None => Arc::new(build(&TlsConfig::default()).map_err(|e| match e {
            ClientError::Tls { why, .. } => ClientError::Tls {
                addr: addr.to_string(),
                why,
            },
            other => other,
        })?),
    };
    handshake(cfg, tcp, addr).await
}

#[cfg(not(feature = "tls"))]
pub async fn connect_https(_tcp: tokio::net::TcpStream, addr: &str) -> Result<Stream, ClientError> {
    wrap(_tcp, addr).await
}

#[cfg(feature = "tls")]
async fn handshake(
    cfg: Arc<rustls::ClientConfig>,
    tcp: tokio::net::TcpStream,
    addr: &str,
) -> Result<Stream, ClientError> {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name =
        rustls_pki_types::ServerName::try_from(host.to_string()).map_err(|e| ClientError::Tls {
            addr: addr.to_string(),
            why: format!("{host:?} is not a name a certificate can have: {e}"),
        })?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| ClientError::Tls {
            addr: addr.to_string(),
            why: format!("TLS handshake failed: {e}"),
        })?;
    Ok(Box::new(tls))
}

#[cfg(not(feature = "tls"))]
pub(crate) async fn wrap(_tcp: tokio::net::TcpStream, addr: &str) -> Result<Stream, ClientError> {
    Err(ClientError::Tls {
        addr: addr.to_string(),
        why: "this build has no TLS".into(),
    })
}
