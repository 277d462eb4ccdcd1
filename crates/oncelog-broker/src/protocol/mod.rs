//! Request handlers, one module per API family, and the table of API
//! versions we serve. Only what is really implemented is advertised.

mod admin;
mod admin_txn;
mod authz;
mod fetch;
pub use fetch::FetchStats;
mod group;
mod meta;
mod produce;
pub mod server;
mod txn;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::Broker;

/// A response still being produced (waiting for a sync or a long poll).
/// `None` means no response is sent (acks=0 produce).
pub type Pending = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

/// The APIs and version ranges we serve.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 12),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 8),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    // v6 (KIP-939) is decoded always, advertised only when enabled (meta.rs).
    (ApiKey::InitProducerId, 0, 6),
    (ApiKey::AddPartitionsToTxn, 0, 5),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 5),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::EndTxn, 0, 5),
    // Answered by the connection's security session (`crate::security`).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    // No client quotas are kept: the answer is always empty (kafka-configs
    // asks for them when it describes users).
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
];

/// What ApiVersions answers (docs/protocol.md), with or without KIP-939's
/// InitProducerId v6.
pub use meta::served_api_keys as api_keys;

/// The APIs and versions this broker's ApiVersions answers with, alike in
/// both modes (docs/protocol.md).
pub fn served_apis(
    b: &crate::Broker,
) -> Vec<kafka_protocol::messages::api_versions_response::ApiVersion> {
    api_keys(b.config.two_phase_commit_enable)
}

pub fn supported_range(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, lo, hi)| (*lo, *hi))
}

/// Why a frame closes its connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is shorter than a request header")]
    Short(usize),
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("API {0:?} is not supported")]
    UnsupportedApi(ApiKey),
    #[error("API {key:?} version {version} is not supported (we serve {lo}..={hi})")]
    UnsupportedVersion {
        key: ApiKey,
        version: i16,
        lo: i16,
        hi: i16,
    },
    #[error("malformed {key:?} v{version} request: {why}")]
    Malformed {
        key: ApiKey,
        version: i16,
        why: String,
    },
}

/// Encodes a framed response (length prefix, header, body).
pub fn encode_response(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Option<Bytes> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let res = header
        .encode(&mut buf, key.response_header_version(version))
        .and_then(|_| body.encode(&mut buf, version));
    if let Err(e) = res {
        // Our bug, not the client's: say so loudly and drop the connection.
        tracing::error!(api = ?key, version, error = %e, "could not encode response");
        return None;
    }
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Some(buf.freeze())
}

fn ready(b: Option<Bytes>) -> Pending {
    Box::pin(std::future::ready(b))
}

fn be_i16(b: &[u8]) -> i16 {
    i16::from_be_bytes([b[0], b[1]])
}

/// A request frame, decoded.
// Built once per request and taken apart at once: not worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Decoded {
    /// ApiVersions at a version we do not serve: answered in v0 (KIP-511).
    ApiVersionsFallback {
        version: i16,
        correlation_id: i32,
    },
    Request(DecodedRequest),
}

/// A request whose API and version we serve, with its header and body.
#[derive(Debug)]
pub struct DecodedRequest {
    pub key: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
    pub header: RequestHeader,
    pub body: RequestKind,
}

/// Decodes one request frame (without its length prefix): checks the API
/// and version against [`SUPPORTED`], then decodes the header and the body.
/// Touches no broker state, so it can be tested and fuzzed on its own.
pub fn decode_request(frame: Bytes) -> Result<Decoded, FrameError> {
    if frame.len() < 8 {
        return Err(FrameError::Short(frame.len()));
    }
    let raw_key = be_i16(&frame[0..2]);
    let version = be_i16(&frame[2..4]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let key = ApiKey::try_from(raw_key).map_err(|_| FrameError::UnknownApi(raw_key))?;
    let Some((lo, hi)) = supported_range(key) else {
        return Err(FrameError::UnsupportedApi(key));
    };
    if key == ApiKey::ApiVersions && !(lo..=hi).contains(&version) {
        return Ok(Decoded::ApiVersionsFallback {
            version,
            correlation_id,
        });
    }
    if !(lo..=hi).contains(&version) {
        return Err(FrameError::UnsupportedVersion {
            key,
            version,
            lo,
            hi,
        });
    }
    let malformed = |why: String| FrameError::Malformed { key, version, why };
    let mut buf = frame;
    let header = RequestHeader::decode(&mut buf, key.request_header_version(version))
        .map_err(|e| malformed(format!("header: {e}")))?;
    let body = if key == ApiKey::InitProducerId && version == 6 {
        RequestKind::InitProducerId(decode_init_producer_id_v6(&mut buf).map_err(malformed)?)
    } else {
        RequestKind::decode(key, &mut buf, version).map_err(|e| malformed(e.to_string()))?
    };
    Ok(Decoded::Request(DecodedRequest {
        key,
        version,
        correlation_id,
        header,
        body,
    }))
}

/// InitProducerId v6 (KIP-939): v5's fields, then `Enable2Pc` and
/// `KeepPreparedTxn`. Our protocol crate knows the fields but no version
/// that carries them (Kafka marks v6 unstable), so it is read here.
fn decode_init_producer_id_v6(
    buf: &mut Bytes,
) -> Result<kafka_protocol::messages::InitProducerIdRequest, String> {
    use bytes::Buf;
    fn uvarint(buf: &mut Bytes) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            if !buf.has_remaining() {
                return Err("truncated varint".into());
            }
            let b = buf.get_u8();
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }
    fn need(buf: &Bytes, n: usize, what: &str) -> Result<(), String> {
        if buf.remaining() < n {
            Err(format!("truncated {what}"))
        } else {
            Ok(())
        }
    }
    let len = uvarint(buf)?;
    let transactional_id = match len {
        0 => None,
        n => {
            let n = usize::try_from(n - 1).map_err(|_| "transactional id too long")?;
            need(buf, n, "transactional id")?;
            let raw = buf.split_to(n);
            let s = kafka_protocol::protocol::StrBytes::from_utf8(raw)
                .map_err(|_| "transactional id is not UTF-8".to_string())?;
            Some(kafka_protocol::messages::TransactionalId(s))
        }
    };
    need(buf, 4 + 8 + 2 + 1 + 1, "fields")?;
    let timeout = buf.get_i32();
    let producer_id = buf.get_i64();
    let producer_epoch = buf.get_i16();
    let enable_2_pc = buf.get_u8() != 0;
    let keep_prepared_txn = buf.get_u8() != 0;
    for _ in 0..uvarint(buf)? {
        let _tag = uvarint(buf)?;
        let size = usize::try_from(uvarint(buf)?).map_err(|_| "tagged field too long")?;
        need(buf, size, "tagged field")?;
        buf.advance(size);
    }
    let mut req = kafka_protocol::messages::InitProducerIdRequest::default()
        .with_transaction_timeout_ms(timeout)
        .with_producer_id(kafka_protocol::messages::ProducerId(producer_id))
        .with_producer_epoch(producer_epoch);
    req.transactional_id = transactional_id;
    req.enable_2_pc = enable_2_pc;
    req.keep_prepared_txn = keep_prepared_txn;
    Ok(req)
}

/// Handles one request frame (without its length prefix). Work that must
/// happen in arrival order (appends) is done before this returns; waits are
/// left in the returned future.
pub async fn dispatch(
    broker: &Arc<Broker>,
    frame: Bytes,
    conn: &Conn,
) -> Result<Pending, FrameError> {
    let DecodedRequest {
        key,
        version,
        correlation_id,
        header,
        body: req,
    } = match decode_request(frame)? {
        Decoded::Request(r) => r,
        Decoded::ApiVersionsFallback {
            version,
            correlation_id,
        } => {
            // KIP-511: answer in v0 with UNSUPPORTED_VERSION and our ranges, so
            // the client can retry with a version we know.
            tracing::debug!(version, "ApiVersions version unsupported, answering v0");
            let body = ResponseKind::ApiVersions(meta::api_versions(broker, 0, true));
            return Ok(ready(encode_response(
                ApiKey::ApiVersions,
                0,
                correlation_id,
                &body,
            )));
        }
    };
    tracing::debug!(api = ?key, version, correlation_id, client = ?header.client_id, "request");
    let b = broker.clone();
    let started = std::time::Instant::now();
    let (req, fixup) = match authz::guard(broker, conn, version, req) {
        Ok(x) => x,
        Err(denied) => {
            return Ok(ready(encode_response(
                key,
                version,
                correlation_id,
                &denied,
            )))
        }
    };
    let respond = move |mut body: ResponseKind| {
        fixup.apply(&mut body);
        encode_response(key, version, correlation_id, &body)
    };
    let pending = handle(b, key, req, header, conn, version, respond).await?;
    let b = broker.clone();
    Ok(Box::pin(async move {
        let out = pending.await;
        if let Some(h) = b.request_latency.get(key as i16 as usize) {
            h.observe_duration(started.elapsed());
        }
        out
    }))
}

/// The connection a request came on.
#[derive(Debug, Clone)]
pub struct Conn {
    pub peer: std::net::SocketAddr,
    /// Index into `config.listeners`.
    pub listener: usize,
    /// `User:NAME` once authenticated (`User:ANONYMOUS` on PLAINTEXT).
    pub principal: Option<String>,
}

impl Conn {
    pub fn new(peer: std::net::SocketAddr, listener: usize) -> Self {
        Self {
            peer,
            listener,
            principal: None,
        }
    }
}

/// Who sent a request, for the transaction history.
fn requester(
    header: &RequestHeader,
    peer: std::net::SocketAddr,
) -> crate::observe::txn_history::Requester {
    crate::observe::txn_history::Requester::new(header.client_id.as_ref().map(|c| c.as_str()), peer)
}

/// Runs the handler of one decoded request: one handler per API, over
/// [`crate::backend`], in both modes.
async fn handle(
    b: Arc<Broker>,
    key: ApiKey,
    req: RequestKind,
    header: RequestHeader,
    conn: &Conn,
    version: i16,
    respond: impl Fn(ResponseKind) -> Option<Bytes> + Send + Sync + 'static,
) -> Result<Pending, FrameError> {
    let peer = conn.peer;
    // The response to a request whose handler is one future.
    macro_rules! answer {
        ($kind:ident, $fut:expr) => {
            Box::pin(async move { respond(ResponseKind::$kind($fut.await)) })
        };
    }
    Ok(match req {
        RequestKind::ApiVersions(_) => ready(respond(ResponseKind::ApiVersions(
            meta::api_versions(&b, version, false),
        ))),
        RequestKind::Metadata(r) => {
            let listener = conn.listener;
            answer!(Metadata, meta::metadata(&b, r, version, listener))
        }
        RequestKind::FindCoordinator(r) => {
            let listener = conn.listener;
            answer!(
                FindCoordinator,
                meta::find_coordinator(&b, r, version, listener)
            )
        }
        RequestKind::InitProducerId(r) => {
            let who = requester(&header, peer);
            answer!(InitProducerId, txn::init_producer_id(b, r, version, who))
        }
        RequestKind::DescribeProducers(r) => {
            answer!(DescribeProducers, admin_txn::describe_producers(&b, r))
        }
        RequestKind::DescribeTransactions(r) => {
            answer!(DescribeTransactions, admin_txn::describe_transactions(b, r))
        }
        RequestKind::WriteTxnMarkers(r) => {
            let who = requester(&header, peer);
            answer!(WriteTxnMarkers, admin_txn::write_txn_markers(b, r, who))
        }
        RequestKind::ListTransactions(r) => answer!(
            ListTransactions,
            admin_txn::list_transactions(b, r, version)
        ),
        RequestKind::JoinGroup(r) => {
            let client_id = header
                .client_id
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_default();
            let host = format!("/{}", peer.ip());
            answer!(JoinGroup, group::join_group(b, r, version, client_id, host))
        }
        RequestKind::SyncGroup(r) => answer!(SyncGroup, group::sync_group(b, r, version)),
        RequestKind::Heartbeat(r) => answer!(Heartbeat, group::heartbeat(b, r)),
        RequestKind::LeaveGroup(r) => answer!(LeaveGroup, group::leave_group(b, r, version)),
        RequestKind::OffsetCommit(r) => answer!(OffsetCommit, group::offset_commit(b, r, version)),
        RequestKind::OffsetFetch(r) => answer!(OffsetFetch, group::offset_fetch(b, r, version)),
        RequestKind::ListGroups(r) => answer!(ListGroups, group::list_groups(b, r, version)),
        RequestKind::DescribeGroups(r) => {
            answer!(DescribeGroups, group::describe_groups(b, r, version))
        }
        RequestKind::DeleteGroups(r) => answer!(DeleteGroups, group::delete_groups(b, r)),
        RequestKind::OffsetDelete(r) => answer!(OffsetDelete, group::offset_delete(b, r)),
        RequestKind::AddOffsetsToTxn(r) => {
            answer!(AddOffsetsToTxn, group::add_offsets_to_txn(b, r, version))
        }
        RequestKind::TxnOffsetCommit(r) => {
            answer!(TxnOffsetCommit, group::txn_offset_commit(b, r, version))
        }
        RequestKind::AddPartitionsToTxn(r) => {
            let who = requester(&header, peer);
            answer!(
                AddPartitionsToTxn,
                txn::add_partitions_to_txn(b, r, version, who)
            )
        }
        RequestKind::EndTxn(r) => {
            let who = requester(&header, peer);
            answer!(EndTxn, txn::end_txn(b, r, version, who))
        }
        RequestKind::CreateTopics(r) => answer!(CreateTopics, admin::create_topics(&b, r, version)),
        RequestKind::DeleteTopics(r) => answer!(DeleteTopics, admin::delete_topics(&b, r, version)),
        RequestKind::DeleteRecords(r) => answer!(DeleteRecords, admin::delete_records(&b, r)),
        RequestKind::CreatePartitions(r) => {
            answer!(CreatePartitions, admin::create_partitions(&b, r))
        }
        RequestKind::DescribeConfigs(r) => {
            answer!(DescribeConfigs, admin::describe_configs(&b, r, version))
        }
        RequestKind::IncrementalAlterConfigs(r) => answer!(
            IncrementalAlterConfigs,
            admin::incremental_alter_configs(&b, r)
        ),
        RequestKind::AlterConfigs(r) => answer!(AlterConfigs, admin::alter_configs(&b, r)),
        RequestKind::ListOffsets(r) => answer!(ListOffsets, fetch::list_offsets(&b, r, version)),
        RequestKind::Produce(r) => {
            let wait = produce::produce(&b, r, version, &requester(&header, peer)).await;
            Box::pin(async move {
                let resp = wait.await?;
                respond(ResponseKind::Produce(resp))
            })
        }
        RequestKind::Fetch(r) => answer!(Fetch, fetch::fetch(b, r, version)),
        RequestKind::DescribeUserScramCredentials(r) => answer!(
            DescribeUserScramCredentials,
            admin::describe_user_scram_credentials(&b, r)
        ),
        RequestKind::AlterUserScramCredentials(r) => answer!(
            AlterUserScramCredentials,
            admin::alter_user_scram_credentials(&b, r)
        ),
        RequestKind::CreateAcls(r) => answer!(CreateAcls, admin::create_acls(&b, r)),
        RequestKind::DescribeAcls(r) => answer!(DescribeAcls, admin::describe_acls(&b, r)),
        RequestKind::DeleteAcls(r) => answer!(DeleteAcls, admin::delete_acls(&b, r)),
        // No client quotas are kept, in either mode.
        RequestKind::DescribeClientQuotas(_) => ready(respond(ResponseKind::DescribeClientQuotas(
            kafka_protocol::messages::DescribeClientQuotasResponse::default()
                .with_entries(Some(Vec::new())),
        ))),
        _ => return Err(FrameError::UnsupportedApi(key)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(key: i16, version: i16, rest: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(key);
        b.put_i16(version);
        b.put_i32(42);
        b.extend_from_slice(rest);
        b.freeze()
    }

    #[test]
    fn decodes_a_request_and_checks_api_and_version() {
        // ApiVersions v0: header v1 (client id "c"), empty body.
        match decode_request(frame(18, 0, b"\x00\x01c")).unwrap() {
            Decoded::Request(r) => {
                assert_eq!(
                    (r.key, r.version, r.correlation_id),
                    (ApiKey::ApiVersions, 0, 42)
                );
                assert!(matches!(r.body, RequestKind::ApiVersions(_)));
            }
            d => panic!("unexpected {d:?}"),
        }
        assert!(matches!(
            decode_request(frame(18, 99, b"")).unwrap(),
            Decoded::ApiVersionsFallback {
                version: 99,
                correlation_id: 42
            }
        ));
        assert!(matches!(
            decode_request(Bytes::from_static(b"\x00\x12")),
            Err(FrameError::Short(2))
        ));
        assert!(matches!(
            decode_request(frame(-7, 0, b"")),
            Err(FrameError::UnknownApi(-7))
        ));
        assert!(matches!(
            decode_request(frame(0, 2, b"")),
            Err(FrameError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            decode_request(frame(3, 1, b"\x00\x01c\xff")),
            Err(FrameError::Malformed { .. })
        ));
    }
}
