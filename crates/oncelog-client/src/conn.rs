//! One connection to a Kafka-compatible broker: requests one at a time,
//! each sent at the highest version both sides support (as ApiVersions
//! tells); bootstrap address parsing.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::ClientError;
use crate::frame::{
    common_version, decode_response, encode_request, version_ranges, ApiVersionRanges,
};
use crate::tls::Stream;

/// The port a bootstrap address without one gets, as every Kafka tool assumes.
pub const DEFAULT_PORT: u16 = 9092;

/// The client id of every request.
const CLIENT_ID: &str = "oncelog-cli";

/// How long the first exchange (ApiVersions) may take before the peer is
/// judged not to be a Kafka broker.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Normalises one bootstrap address: `host` gets the default port 9092,
/// `host:port` stays, IPv6 literals get brackets (`::1` → `[::1]:9092`).
pub fn with_default_port(addr: &str) -> Result<String, ClientError> {
    let a = addr.trim();
    let bad = |why: &str| ClientError::Address(format!("{a:?}: {why}"));
    if a.is_empty() {
        return Err(bad("empty"));
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("no closing ] after an IPv6 address"))?;
        match after {
            "" => (format!("[{h}]"), None),
            p => (
                format!("[{h}]"),
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected :PORT after ]"))?,
                ),
            ),
        }
    } else {
        match a.matches(':').count() {
            0 => (a.to_string(), None),
            1 => {
                let (h, p) = a.split_once(':').unwrap_or((a, ""));
                (h.to_string(), Some(p))
            }
            _ => (format!("[{a}]"), None), // a bare IPv6 address
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("no host"));
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| bad(&format!("port {p:?} is not a number from 0 to 65535")))?,
    };
    Ok(format!("{host}:{port}"))
}

/// Normalises a comma-separated list of bootstrap addresses (for clap).
pub fn parse_bootstrap(list: &str) -> Result<String, ClientError> {
    let addrs: Vec<String> = list
        .split(',')
        .filter(|a| !a.trim().is_empty())
        .map(with_default_port)
        .collect::<Result<_, _>>()?;
    if addrs.is_empty() {
        return Err(ClientError::NoAddress);
    }
    Ok(addrs.join(","))
}

/// Says what a reply that is not a Kafka frame most likely came from.
fn not_kafka(first: [u8; 4]) -> String {
    match first {
        // A status line, or (an HTTP/0.9-style answer to a request line
        // that is not HTTP, as Python's http.server sends) an HTML page.
        [b'H', b'T', b'T', b'P'] | [b'<', b'!' | b'h' | b'H', _, _] => {
            "this looks like an HTTP server, not a Kafka broker".into()
        }
        [0x15 | 0x16, 0x03, _, _] => {
            "this looks like a TLS server (an SSL listener?): use --security-protocol SSL or SASL_SSL".into()
        }
        [b'S', b'S', b'H', b'-'] => "this looks like an SSH server, not a Kafka broker".into(),
        b => format!(
            "not a Kafka broker? its reply starts with {:02x} {:02x} {:02x} {:02x} ({:?}), \
             not a Kafka frame length",
            b[0],
            b[1],
            b[2],
            b[3],
            String::from_utf8_lossy(&b)
        ),
    }
}

/// One connection to a broker.
pub struct Client {
    addr: String,
    stream: Stream,
    correlation: i32,
    versions: ApiVersionRanges,
    timeout: Duration,
    /// Whether a request other than ApiVersions has been answered here.
    answered: bool,
}

impl Client {
    /// Connects to the first of the comma-separated `bootstrap` addresses
    /// that answers (`host` alone means port 9092) and learns its API
    /// versions.
    pub async fn connect(bootstrap: &str) -> Result<Self, ClientError> {
        let mut last = None;
        for addr in bootstrap.split(',').filter(|a| !a.trim().is_empty()) {
            match Self::connect_one(&with_default_port(addr)?).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Address("no address given".into())))
    }

    async fn connect_one(addr: &str) -> Result<Self, ClientError> {
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::ConnectTimeout {
                addr: addr.to_string(),
                secs: HANDSHAKE_TIMEOUT.as_secs(),
            })?
            .map_err(|e| ClientError::Connect {
                addr: addr.to_string(),
                source: e,
            })?;
        let _ = stream.set_nodelay(true);
        let stream: Stream = if crate::tls::enabled() {
            tokio::time::timeout(HANDSHAKE_TIMEOUT, crate::tls::wrap(stream, addr))
                .await
                .map_err(|_| ClientError::Tls {
                    addr: addr.to_string(),
                    why: format!("no TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
                })??
        } else {
            Box::new(stream)
        };
        let mut c = Self {
            addr: addr.to_string(),
            stream,
            // The first request's correlation id is 10: its bytes end in 0x0a,
            // a newline, so a line-oriented server (HTTP) that is reached by
            // mistake sees a complete line and answers, and the answer tells
            // what it is instead of a silent wait.
            correlation: 9,
            versions: ApiVersionRanges::new(),
            timeout: HANDSHAKE_TIMEOUT,
            answered: false,
        };
        let av: ApiVersionsResponse = match c
            .send(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
            .await
        {
            Ok(av) => av,
            Err(ClientError::Timeout(_)) => {
                return Err(ClientError::NoAnswer {
                    addr: addr.to_string(),
                    why: format!(
                        "no reply to ApiVersions within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ),
                })
            }
            Err(ClientError::Closed { .. }) => {
                return Err(ClientError::NoAnswer {
                    addr: addr.to_string(),
                    why: "it closed the connection before replying to ApiVersions \
                          (a TLS or SASL listener, or not Kafka at all?)"
                        .into(),
                })
            }
            Err(e) => return Err(e),
        };
        c.timeout = Duration::from_secs(30);
        c.versions = version_ranges(&av);
        if let Some(cfg) = crate::sasl::configured() {
            sasl_authenticate(&mut c, cfg).await?;
        }
        Ok(c)
    }

    /// The address this client is connected to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The broker's (min, max) version of every API it advertises.
    pub fn api_versions(&self) -> &ApiVersionRanges {
        &self.versions
    }

    /// The version to use for `key`: the highest both sides know.
    pub fn version(&self, key: ApiKey, ours: (i16, i16)) -> Result<i16, ClientError> {
        common_version(&self.versions, key, ours)
    }

    /// Sends `req` at the best common version; returns the response and that version.
    pub async fn call<Req, Resp>(
        &mut self,
        key: ApiKey,
        req: &Req,
    ) -> Result<(Resp, i16), ClientError>
    where
        Req: Encodable + Message,
        Resp: Decodable + Message,
    {
        self.call_max(key, req, i16::MAX).await
    }

    /// Like [`Client::call`], but never above version `max` (for requests
    /// whose newer versions are meant for brokers, not clients).
    pub async fn call_max<Req, Resp>(
        &mut self,
        key: ApiKey,
        req: &Req,
        max: i16,
    ) -> Result<(Resp, i16), ClientError>
    where
        Req: Encodable + Message,
        Resp: Decodable + Message,
    {
        let ours = (
            Req::VERSIONS.min.max(Resp::VERSIONS.min),
            Req::VERSIONS.max.min(Resp::VERSIONS.max).min(max),
        );
        let v = self.version(key, ours)?;
        Ok((self.send(key, v, req).await?, v))
    }

    /// Sets how long one request may wait for its response.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    async fn send<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp, ClientError> {
        self.correlation += 1;
        let corr = self.correlation;
        let mut buf = BytesMut::with_capacity(256);
        encode_request(&mut buf, key, version, corr, CLIENT_ID, req)?;
        let addr = &self.addr;
        let stream = &mut self.stream;
        let io_err = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                ClientError::Closed { addr: addr.clone() }
            } else {
                ClientError::Io {
                    addr: addr.clone(),
                    source: e,
                }
            }
        };
        let io = async {
            stream.write_all(&buf).await.map_err(io_err)?;
            // TLS may hold back what the socket did not take until a flush.
            stream.flush().await.map_err(io_err)?;
            let mut len = [0u8; 4];
            stream.read_exact(&mut len).await.map_err(io_err)?;
            let n = i32::from_be_bytes(len);
            if !(0..=256 << 20).contains(&n) {
                return Err(ClientError::NotKafka {
                    addr: addr.clone(),
                    why: not_kafka(len),
                });
            }
            let mut body = vec![0u8; n as usize];
            stream.read_exact(&mut body).await.map_err(io_err)?;
            Ok::<_, ClientError>(body)
        };
        let body = match tokio::time::timeout(self.timeout, io).await {
            Err(_) => return Err(ClientError::Timeout(key)),
            Ok(Err(e)) => return Err(self.closed_before_authentication(key, e)),
            Ok(Ok(body)) => body,
        };
        if key != ApiKey::ApiVersions {
            self.answered = true;
        }
        decode_response(Bytes::from(body), key, version, corr)
    }

    /// A connection closed at the first request after ApiVersions of a
    /// client without SASL: most likely a SASL listener (it answers
    /// ApiVersions, then closes the connection of a client that does not
    /// authenticate), which the error then says.
    fn closed_before_authentication(&self, key: ApiKey, e: ClientError) -> ClientError {
        let closed = match &e {
            ClientError::Closed { .. } => true,
            ClientError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ),
            _ => false,
        };
        if !closed
            || self.answered
            || key == ApiKey::ApiVersions
            || crate::sasl::configured().is_some()
        {
            return e;
        }
        ClientError::ClosedBeforeAuthentication {
            addr: self.addr.clone(),
            api: key,
            protocol: if crate::tls::enabled() {
                "SASL_SSL"
            } else {
                "SASL_PLAINTEXT"
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_addresses_get_the_default_port() {
        let n = |a: &str| with_default_port(a).map_err(|e| e.to_string());
        assert_eq!(n("localhost").as_deref(), Ok("localhost:9092"));
        assert_eq!(n("kafka1:19092").as_deref(), Ok("kafka1:19092"));
        assert_eq!(n("host:").as_deref(), Ok("host:9092"));
        assert_eq!(n("::1").as_deref(), Ok("[::1]:9092"));
        assert_eq!(n("[::1]").as_deref(), Ok("[::1]:9092"));
        assert_eq!(n("[::1]:9093").as_deref(), Ok("[::1]:9093"));
        assert!(n("host:99999").is_err());
        assert!(n(":9092").is_err());
        let list = |a: &str| parse_bootstrap(a).map_err(|e| e.to_string());
        assert_eq!(list("a, b:1,").as_deref(), Ok("a:9092,b:1"));
        assert_eq!(list(" , ").unwrap_err(), "no address given");
        assert_eq!(
            list("a,host:x").unwrap_err(),
            "bad bootstrap address: \"host:x\": port \"x\" is not a number from 0 to 65535"
        );
    }

    #[test]
    fn foreign_replies_are_named() {
        assert!(not_kafka(*b"HTTP").contains("HTTP server"));
        assert!(not_kafka(*b"<!DO").contains("HTTP server"));
        assert!(not_kafka([0x15, 0x03, 0x03, 0x00]).contains("TLS"));
        assert!(not_kafka(*b"\xff\xff\xff\xff").contains("ff ff ff ff"));
    }
}

// ------------------------------------------------------------ SASL

fn fail(c: &Client, why: impl Into<String>) -> ClientError {
    ClientError::Auth {
        addr: c.addr().to_string(),
        why: why.into(),
    }
}

/// Runs the SASL exchange on a fresh connection.
pub(crate) async fn sasl_authenticate(
    c: &mut Client,
    cfg: &crate::sasl::SaslConfig,
) -> Result<(), ClientError> {
    let hs: kafka_protocol::messages::SaslHandshakeResponse = c
        .call_max::<_, kafka_protocol::messages::SaslHandshakeResponse>(
            ApiKey::SaslHandshake,
            &kafka_protocol::messages::SaslHandshakeRequest::default().with_mechanism(
                kafka_protocol::protocol::StrBytes::from_string(cfg.mechanism.clone()),
            ),
            1,
        )
        .await?
        .0;
    if hs.error_code != 0 {
        let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
        return Err(fail(
            c,
            format!(
                "the broker refused SASL mechanism {} (error {}); it offers {offered:?}",
                cfg.mechanism, hs.error_code
            ),
        ));
    }
    if cfg.mechanism == "PLAIN" {
        step(
            c,
            oncelog_auth::PlainMessage::encode(&cfg.username, &cfg.password),
        )
        .await?;
        return Ok(());
    }
    let mech = oncelog_auth::Mechanism::from_name(&cfg.mechanism)
        .ok_or_else(|| fail(c, format!("unknown SASL mechanism {}", cfg.mechanism)))?;
    let mut scram = oncelog_auth::ScramClient::new(mech, &cfg.username, &cfg.password)
        .map_err(|e| fail(c, e.to_string()))?;
    let server_first = step(c, scram.client_first()).await?;
    let client_final = scram
        .client_final(&server_first)
        .map_err(|e| fail(c, e.to_string()))?;
    let server_final = step(c, client_final).await?;
    scram
        .verify_server_final(&server_final)
        .map_err(|e| fail(c, e.to_string()))
}

/// One SaslAuthenticate: sends `token`, returns the broker's bytes.
async fn step(c: &mut Client, token: Vec<u8>) -> Result<Vec<u8>, ClientError> {
    let req = kafka_protocol::messages::SaslAuthenticateRequest::default()
        .with_auth_bytes(bytes::Bytes::from(token));
    let r: kafka_protocol::messages::SaslAuthenticateResponse = c
        .call::<_, kafka_protocol::messages::SaslAuthenticateResponse>(
            ApiKey::SaslAuthenticate,
            &req,
        )
        .await?
        .0;
    if r.error_code != 0 {
        let why = r.error_message.map(|m| m.to_string()).unwrap_or_default();
        return Err(fail(
            c,
            format!("authentication failed (error {}): {why}", r.error_code),
        ));
    }
    Ok(r.auth_bytes.to_vec())
}
