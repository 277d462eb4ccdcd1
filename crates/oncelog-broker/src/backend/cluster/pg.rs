//! How a broker reaches PostgreSQL: the connection URL, in either of
//! libpq's forms (`postgres://…?k=v` or `host=… k=v`), with libpq's TLS
//! settings, which tokio-postgres alone does not read:
//!
//! | `sslmode`     | TLS                         | server certificate checked       |
//! |---------------|-----------------------------|----------------------------------|
//! | `disable`     | never                       | —                                |
//! | `allow`, `prefer` (default) | if the server offers it | only with `sslrootcert`  |
//! | `require`     | always                      | only with `sslrootcert` (chain)  |
//! | `verify-ca`   | always                      | chains to `sslrootcert`          |
//! | `verify-full` | always                      | chains to `sslrootcert`, and names the host |
//!
//! As in libpq, `require` with a root certificate checks the chain, and
//! `allow` is served as `prefer` (TLS first when offered; either way the
//! connection is made). Client certificates (`sslcert`/`sslkey`) are not
//! offered yet: a URL that names them is refused rather than half-served.
//! The pool, the LISTEN connection and `oncelog cluster info` all connect
//! through [`Target`].

use super::ClusterError;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Option<Self> {
        Some(match v {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// The TLS side of a connection: rustls when the build has TLS.
#[cfg(feature = "tls")]
pub type Connector = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "tls"))]
pub type Connector = tokio_postgres::NoTls;

/// A PostgreSQL server to connect to, and how.
#[derive(Clone)]
pub struct Target {
    pub config: tokio_postgres::Config,
    pub tls: Connector,
    pub ssl_mode: SslMode,
    /// The URL with its password hidden, for messages.
    pub shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.shown)
            .field("sslmode", &self.ssl_mode)
            .finish()
    }
}

/// The TLS settings taken out of a URL before tokio-postgres parses the rest.
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    /// Client-certificate settings, which are refused.
    client_cert: Vec<String>,
}

const TAKEN: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword"];

impl TlsParams {
    fn take(&mut self, key: &str, value: String) {
        match key {
            "sslmode" => self.sslmode = Some(value),
            "sslrootcert" => self.sslrootcert = Some(value),
            _ => self.client_cert.push(key.to_string()),
        }
    }
}

fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// Splits the TLS parameters off `url`: the rest, and the parameters.
fn split_tls(url: &str) -> (String, TlsParams) {
    let mut p = TlsParams::default();
    if is_url(url) {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_string(), p);
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_encoding::percent_decode_str(k).decode_utf8_lossy();
            if TAKEN.contains(&key.as_ref()) {
                let value = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
                p.take(&key, value.into_owned());
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, p);
    }
    // key=value form: values may be 'quoted' with \-escapes.
    let mut kept = Vec::new();
    for (key, value, raw) in key_values(url) {
        if TAKEN.contains(&key.as_str()) {
            p.take(&key, value);
        } else {
            kept.push(raw);
        }
    }
    (kept.join(" "), p)
}

/// The `key = value` pairs of libpq's key/value form, each with its raw text.
fn key_values(s: &str) -> Vec<(String, String, String)> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= chars.len() {
            return out;
        }
        let start = i;
        let mut key = String::new();
        while i < chars.len() && chars[i] != '=' && !chars[i].is_whitespace() {
            key.push(chars[i]);
            i += 1;
        }
        skip_ws(&mut i);
        if i < chars.len() && chars[i] == '=' {
            i += 1;
        }
        skip_ws(&mut i);
        let mut value = String::new();
        if i < chars.len() && chars[i] == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
            i += 1;
        } else {
            while i < chars.len() && !chars[i].is_whitespace() {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
        }
        let raw: String = chars[start..i.min(chars.len())].iter().collect();
        out.push((key, value, raw));
    }
}

/// `url` with its password replaced by `***`, for messages and logs.
pub fn hide_password(url: &str) -> String {
    if is_url(url) {
        let scheme_end = url.find("://").map_or(0, |i| i + 3);
        let rest = &url[scheme_end..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(at) = authority.rfind('@') {
            if let Some(colon) = authority[..at].find(':') {
                return format!(
                    "{}{}:***{}",
                    &url[..scheme_end],
                    &authority[..colon],
                    &rest[at..]
                );
            }
        }
        return url.to_string();
    }
    key_values(url)
        .into_iter()
        .map(|(k, _, raw)| {
            if k == "password" {
                "password=***".to_string()
            } else {
                raw
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads `url` and its TLS settings.
pub fn target(url: &str) -> Result<Target, ClusterError> {
    let shown = hide_password(url);
    let bad = |what: String| ClusterError::Config(format!("PostgreSQL URL {shown}: {what}"));
    let (rest, params) = split_tls(url);
    if let Some(k) = params.client_cert.first() {
        return Err(bad(format!(
            "{k}: client certificates are not supported yet (use a password or SCRAM)"
        )));
    }
    let ssl_mode = match params.sslmode.as_deref() {
        None => SslMode::Prefer,
        Some(v) => SslMode::parse(v).ok_or_else(|| {
            bad(format!(
                "sslmode={v} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ))
        })?,
    };
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| bad(format!("{e}")))?;
    let tls = connector(ssl_mode, params.sslrootcert.as_deref()).map_err(bad)?;
    config.ssl_mode(match ssl_mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Allow | SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    Ok(Target {
        config,
        tls,
        ssl_mode,
        shown,
    })
}

#[cfg(not(feature = "tls"))]
fn connector(mode: SslMode, _root: Option<&str>) -> Result<Connector, String> {
    match mode {
        SslMode::Disable | SslMode::Allow | SslMode::Prefer => Ok(tokio_postgres::NoTls),
        m => Err(format!(
            "sslmode={} needs TLS, and this build has none (build with the `tls` feature)",
            m.as_str()
        )),
    }
}

#[cfg(feature = "tls")]
fn connector(mode: SslMode, root: Option<&str>) -> Result<Connector, String> {
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use rustls::ClientConfig;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match root {
        None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
            return Err(format!(
                "sslmode={} needs sslrootcert=FILE (the CA the server's certificate chains to)",
                mode.as_str()
            ))
        }
        None => None,
        Some("system") => {
            return Err(
                "sslrootcert=system is not supported: give the CA's PEM file (for a managed \
                 service, its published CA bundle)"
                    .into(),
            )
        }
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert={path}: {e}"))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("sslrootcert={path}: {e}"))?;
            if certs.is_empty() {
                return Err(format!("sslrootcert={path}: no PEM certificate in it"));
            }
            let mut store = rustls::RootCertStore::empty();
            for c in certs {
                store
                    .add(c)
                    .map_err(|e| format!("sslrootcert={path}: {e}"))?;
            }
            Some(Arc::new(store))
        }
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let chain = match roots {
        None => None,
        Some(roots) => Some(
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| e.to_string())?,
        ),
    };
    let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> = match chain {
        Some(webpki) if mode == SslMode::VerifyFull => webpki,
        chain => Arc::new(verify::Lenient { chain, provider }),
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The server-certificate checks libpq makes short of `verify-full`.
#[cfg(feature = "tls")]
mod verify {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

    /// With `chain` (`verify-ca`, or `require` with a root certificate): the
    /// certificate must chain to the root; the name in it is not compared.
    /// Without (`prefer`, `require`): the certificate is taken as it comes
    /// (libpq's behaviour; say `verify-full` to check it). Either way the
    /// handshake's signatures are checked.
    #[derive(Debug)]
    pub struct Lenient {
        pub chain: Option<Arc<WebPkiServerVerifier>>,
        pub provider: Arc<CryptoProvider>,
    }

    impl ServerCertVerifier for Lenient {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            let Some(chain) = &self.chain else {
                return Ok(ServerCertVerified::assertion());
            };
            match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
                Err(Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            let algs = &self.provider.signature_verification_algorithms;
            rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            let algs = &self.provider.signature_verification_algorithms;
            rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_form_loses_only_its_tls_parameters() {
        let (rest, p) = split_tls(
            "postgres://u:pw@db.example:5432/oncelog?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(
            rest,
            "postgres://u:pw@db.example:5432/oncelog?application_name=x"
        );
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/tmp/ca.pem"));
        let (rest, p) = split_tls("postgresql://h/db?sslmode=require");
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!(p.sslmode.as_deref(), Some("require"));
        assert_eq!(split_tls("postgres://h/db").0, "postgres://h/db");
    }

    #[test]
    fn key_value_form_keeps_quoted_values() {
        let (rest, p) = split_tls(
            "host=db user=me password='a b\\'c' sslmode = verify-ca sslrootcert='/x y/ca.pem' dbname=d",
        );
        assert_eq!(rest, "host=db user=me password='a b\\'c' dbname=d");
        assert_eq!(p.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/x y/ca.pem"));
        let c: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(c.get_password(), Some(&b"a b'c"[..]));
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            hide_password("postgres://u:secret@h:5/db?sslmode=require"),
            "postgres://u:***@h:5/db?sslmode=require"
        );
        assert_eq!(hide_password("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            hide_password("host=h password='s e' user=u"),
            "host=h password=*** user=u"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let e = target("postgres://u:pw@h/db?sslmode=verify-everything").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("sslmode=verify-everything") && !s.contains("pw@"),
            "{s}"
        );
        let e = target("postgres://h/db?sslcert=/c.pem").unwrap_err();
        assert!(e.to_string().contains("client certificates"), "{e}");
        let t = target("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!(t.ssl_mode, SslMode::Disable);
        assert_eq!(target("postgres://h/db").unwrap().ssl_mode, SslMode::Prefer);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn verification_needs_a_root() {
        let e = target("postgres://h/db?sslmode=verify-full").unwrap_err();
        assert!(e.to_string().contains("sslrootcert"), "{e}");
        let e =
            target("postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent.pem").unwrap_err();
        assert!(e.to_string().contains("/nonexistent.pem"), "{e}");
        assert!(target("postgres://h/db?sslmode=require").is_ok());
    }
}
