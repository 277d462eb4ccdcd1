//! TLS for SSL and SASL_SSL listeners (feature `tls`), with rustls.
//!
//! Settings as Kafka names them for PEM stores: `ssl.keystore.location` (a
//! PEM file with the certificate chain and its private key),
//! `ssl.truststore.location` (PEM CA certificates that client certificates
//! must chain to) and `ssl.client.auth` (`none`, `requested`, `required`).
//! TLS 1.2 and 1.3. The files are read again when they change (checked every
//! few seconds); a change that does not load is logged and the old
//! certificates are kept. On an SSL listener a client certificate's subject
//! is the principal: `User:` and what `ssl.principal.mapping.rules` makes of
//! the distinguished name in RFC 2253 form, most specific first (by default
//! the DN itself, `User:CN=alice,O=acme`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

impl ClientAuth {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim() {
            "" | "none" => Self::None,
            "requested" => Self::Requested,
            "required" => Self::Required,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub keystore: PathBuf,
    pub truststore: Option<PathBuf>,
    pub client_auth: ClientAuth,
}

/// The acceptor of the TLS listeners, reloaded when its files change.
pub struct TlsServer {
    settings: TlsSettings,
    current: RwLock<(Arc<TlsAcceptor>, Vec<Option<SystemTime>>)>,
}

fn mtimes(s: &TlsSettings) -> Vec<Option<SystemTime>> {
    std::iter::once(&s.keystore)
        .chain(s.truststore.as_ref())
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

fn build(s: &TlsSettings) -> Result<TlsAcceptor, String> {
    let chain = certs(&s.keystore)?;
    let key = PrivateKeyDer::from_pem_file(&s.keystore)
        .map_err(|e| format!("{}: no usable PEM private key: {e}", s.keystore.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = match (s.client_auth, &s.truststore) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err(
            "ssl.client.auth needs ssl.truststore.location (the CAs client certificates chain to)"
                .into(),
        ),
        (auth, Some(ts)) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ts)? {
                roots.add(c).map_err(|e| format!("{}: {e}", ts.display()))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if auth == ClientAuth::Requested {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(v.build().map_err(|e| e.to_string())?)
        }
    };
    let cfg = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{}: {e}", s.keystore.display()))?;
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

impl TlsServer {
    pub fn load(settings: TlsSettings) -> Result<Self, String> {
        let acceptor = build(&settings)?;
        let seen = mtimes(&settings);
        Ok(Self {
            current: RwLock::new((Arc::new(acceptor), seen)),
            settings,
        })
    }

    pub fn acceptor(&self) -> Arc<TlsAcceptor> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// Loads the files again if they changed; keeps the old acceptor when the
    /// new files do not load.
    pub fn reload_if_changed(&self) {
        let now = mtimes(&self.settings);
        if self.current.read().unwrap_or_else(|p| p.into_inner()).1 == now {
            return;
        }
        match build(&self.settings) {
            Ok(a) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = (Arc::new(a), now);
                tracing::info!(keystore = %self.settings.keystore.display(), "TLS certificates reloaded");
            }
            Err(e) => {
                // Remember the change, so the error is logged once per change.
                self.current.write().unwrap_or_else(|p| p.into_inner()).1 = now;
                tracing::error!(error = %e, "TLS certificates changed but do not load; the previous ones stay in use");
            }
        }
    }
}

/// The subject of a verified client certificate as the distinguished name
/// Kafka's principal rules see (RFC 2253, most specific first:
/// `CN=alice,O=acme`).
pub fn subject_dn(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::prelude::*;
    let (_, c) = X509Certificate::from_der(cert.as_ref()).ok()?;
    let reg = oid_registry();
    let mut parts = Vec::new();
    for rdn in c.subject().iter().collect::<Vec<_>>().into_iter().rev() {
        let attrs: Vec<String> = rdn
            .iter()
            .map(|a| {
                let key = oid2abbrev(a.attr_type(), reg)
                    .map(|s| match s {
                        "commonName" => "CN".to_string(),
                        other => other.to_string(),
                    })
                    .unwrap_or_else(|_| a.attr_type().to_id_string());
                let value = a.as_str().map(escape).unwrap_or_else(|_| "#".to_string());
                format!("{key}={value}")
            })
            .collect();
        parts.push(attrs.join("+"));
    }
    Some(parts.join(","))
}

/// RFC 2253 escaping of an attribute value.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, ch) in v.chars().enumerate() {
        let special = matches!(ch, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (ch == '#' || ch == ' '))
            || (i + 1 == v.chars().count() && ch == ' ');
        if special {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}
