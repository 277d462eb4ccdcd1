//! A small async client for the Kafka admin calls the `oncelog` CLI makes.
//! It speaks the wire protocol, so the CLI works against any Kafka-compatible
//! cluster. One connection, requests one at a time; every request is sent at
//! the highest version both sides support (as ApiVersions tells).

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out waiting for {0:?}")]
    Timeout(ApiKey),
    #[error("the broker does not support {0:?}")]
    Unsupported(ApiKey),
    #[error("protocol: {0}")]
    Codec(String),
}

pub struct Client {
    stream: TcpStream,
    correlation: i32,
    versions: HashMap<i16, (i16, i16)>,
    timeout: Duration,
}

impl Client {
    /// Connects and learns the broker's API versions.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Connect {
                addr: addr.to_string(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            })?
            .map_err(|e| ClientError::Connect {
                addr: addr.to_string(),
                source: e,
            })?;
        let mut c = Self {
            stream,
            correlation: 0,
            versions: HashMap::new(),
            timeout: Duration::from_secs(30),
        };
        let av: ApiVersionsResponse = c
            .send(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
            .await?;
        c.versions = av
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(c)
    }

    /// The broker's (min, max) version of every API it advertises.
    pub fn api_versions(&self) -> &HashMap<i16, (i16, i16)> {
        &self.versions
    }

    /// The version to use for `key`: the highest both sides know.
    pub fn version(&self, key: ApiKey, ours: (i16, i16)) -> Result<i16, ClientError> {
        let (lo, hi) = self
            .versions
            .get(&(key as i16))
            .copied()
            .ok_or(ClientError::Unsupported(key))?;
        let v = hi.min(ours.1);
        if v < lo.max(ours.0) {
            return Err(ClientError::Unsupported(key));
        }
        Ok(v)
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
        let ours = (
            Req::VERSIONS.min.max(Resp::VERSIONS.min),
            Req::VERSIONS.max.min(Resp::VERSIONS.max),
        );
        let v = self.version(key, ours)?;
        Ok((self.send(key, v, req).await?, v))
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
        buf.put_i32(0);
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(corr)
            .with_client_id(Some(StrBytes::from_static_str("oncelog-cli")))
            .encode(&mut buf, key.request_header_version(version))
            .map_err(|e| ClientError::Codec(e.to_string()))?;
        req.encode(&mut buf, version)
            .map_err(|e| ClientError::Codec(e.to_string()))?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let io = async {
            self.stream.write_all(&buf).await?;
            let n = self.stream.read_i32().await?;
            if !(0..=256 << 20).contains(&n) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("response of {n} bytes"),
                ));
            }
            let mut body = vec![0u8; n as usize];
            self.stream.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        let body = tokio::time::timeout(self.timeout, io)
            .await
            .map_err(|_| ClientError::Timeout(key))??;
        let mut b = Bytes::from(body);
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version))
            .map_err(|e| ClientError::Codec(e.to_string()))?;
        if h.correlation_id != corr {
            return Err(ClientError::Codec(format!(
                "correlation id {} for request {corr}",
                h.correlation_id
            )));
        }
        let resp = Resp::decode(&mut b, version).map_err(|e| ClientError::Codec(e.to_string()))?;
        if b.has_remaining() {
            return Err(ClientError::Codec(format!(
                "{} trailing bytes in {key:?} response",
                b.remaining()
            )));
        }
        Ok(resp)
    }
}
