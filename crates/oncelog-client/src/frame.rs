//! Kafka request framing, the one copy of it: a request is a 4-byte length,
//! the request header and the body; a response is a 4-byte length, the
//! response header (whose correlation id must match) and the body. Also the
//! choice of a version both sides support, from an ApiVersions answer.
//!
//! These functions do no I/O and keep no state, so a blocking load
//! generator can use them on its hot path as well as the async [`Client`]:
//! [`encode_request`] appends to a buffer the caller may reuse.
//!
//! [`Client`]: crate::conn::Client

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use crate::error::ClientError;

/// The broker's (min, max) version of every API it advertises, by API key.
pub type ApiVersionRanges = HashMap<i16, (i16, i16)>;

/// Appends one request frame to `buf`: the length, the header for `key` at
/// `version` with `correlation` and `client_id`, and `req`.
pub fn encode_request<R: Encodable>(
    buf: &mut BytesMut,
    key: ApiKey,
    version: i16,
    correlation: i32,
    client_id: &'static str,
    req: &R,
) -> Result<(), ClientError> {
    let start = buf.len();
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str(client_id)))
        .encode(buf, key.request_header_version(version))
        .map_err(|e| ClientError::Codec(e.to_string()))?;
    req.encode(buf, version)
        .map_err(|e| ClientError::Codec(e.to_string()))?;
    let n = buf.len() - start - 4;
    let len = i32::try_from(n)
        .map_err(|_| ClientError::Codec(format!("a {key:?} request of {n} bytes is too large")))?;
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// Decodes the `body` of a response frame (what follows its length): the
/// header, which must answer `correlation`, then the response to `key` at
/// `version`, which must use every byte.
pub fn decode_response<R: Decodable>(
    mut body: Bytes,
    key: ApiKey,
    version: i16,
    correlation: i32,
) -> Result<R, ClientError> {
    let h = ResponseHeader::decode(&mut body, key.response_header_version(version))
        .map_err(|e| ClientError::Codec(e.to_string()))?;
    if h.correlation_id != correlation {
        return Err(ClientError::Codec(format!(
            "correlation id {} for request {correlation}",
            h.correlation_id
        )));
    }
    let resp = R::decode(&mut body, version).map_err(|e| ClientError::Codec(e.to_string()))?;
    if body.has_remaining() {
        return Err(ClientError::Codec(format!(
            "{} trailing bytes in {key:?} response",
            body.remaining()
        )));
    }
    Ok(resp)
}

/// The version ranges an ApiVersions response advertises.
pub fn version_ranges(av: &ApiVersionsResponse) -> ApiVersionRanges {
    av.api_keys
        .iter()
        .map(|k| (k.api_key, (k.min_version, k.max_version)))
        .collect()
}

/// The version to use for `key`: the highest that both the broker
/// (`ranges`) and we (`ours`, min and max) know.
pub fn common_version(
    ranges: &ApiVersionRanges,
    key: ApiKey,
    ours: (i16, i16),
) -> Result<i16, ClientError> {
    let (lo, hi) = ranges
        .get(&(key as i16))
        .copied()
        .ok_or(ClientError::Unsupported(key))?;
    let v = hi.min(ours.1);
    if v < lo.max(ours.0) {
        return Err(ClientError::Unsupported(key));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
    use kafka_protocol::messages::api_versions_response::ApiVersion;

    #[test]
    fn a_request_frame_starts_with_its_length_and_header() {
        let mut buf = BytesMut::from(&b"xy"[..]);
        encode_request(
            &mut buf,
            ApiKey::ApiVersions,
            0,
            10,
            "t",
            &ApiVersionsRequest::default(),
        )
        .unwrap();
        // after what was there: length, key 18, version 0, correlation 10,
        // client id "t" (a string of length 1), and the empty v0 body
        assert_eq!(
            &buf[..],
            &[b'x', b'y', 0, 0, 0, 11, 0, 18, 0, 0, 0, 0, 0, 10, 0, 1, b't']
        );
    }

    fn response(corr: i32, av: &ApiVersionsResponse, extra: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i32(corr);
        av.encode(&mut b, 0).unwrap();
        b.put_slice(extra);
        b.freeze()
    }

    #[test]
    fn a_response_must_answer_its_request_and_use_every_byte() {
        let av = ApiVersionsResponse::default().with_api_keys(vec![ApiVersion::default()
            .with_api_key(0)
            .with_min_version(3)
            .with_max_version(11)]);
        let got: ApiVersionsResponse =
            decode_response(response(7, &av, b""), ApiKey::ApiVersions, 0, 7).unwrap();
        assert_eq!(got, av);
        let e = decode_response::<ApiVersionsResponse>(
            response(8, &av, b""),
            ApiKey::ApiVersions,
            0,
            7,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "protocol: correlation id 8 for request 7");
        let e = decode_response::<ApiVersionsResponse>(
            response(7, &av, b"zz"),
            ApiKey::ApiVersions,
            0,
            7,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "protocol: 2 trailing bytes in ApiVersions response"
        );
    }

    #[test]
    fn the_common_version_is_the_highest_both_know() {
        let av = ApiVersionsResponse::default().with_api_keys(vec![ApiVersion::default()
            .with_api_key(0)
            .with_min_version(3)
            .with_max_version(11)]);
        let r = version_ranges(&av);
        assert_eq!(common_version(&r, ApiKey::Produce, (0, 9)).unwrap(), 9);
        assert_eq!(common_version(&r, ApiKey::Produce, (0, 12)).unwrap(), 11);
        assert!(common_version(&r, ApiKey::Produce, (0, 2)).is_err());
        assert!(common_version(&r, ApiKey::Fetch, (0, 12)).is_err());
    }
}
