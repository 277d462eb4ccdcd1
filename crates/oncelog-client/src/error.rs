//! The client's errors, and its vocabulary for the error codes Kafka
//! responses carry: [`ResponseError`] variants, never raw numbers.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::StrBytes;

/// Every error says its cause once: the variant's message adds what the
/// cause does not say (which peer, which step), and the cause follows it in
/// the chain.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {addr}: no answer within {secs} s")]
    ConnectTimeout { addr: String, secs: u64 },
    #[error("{addr}: {why}")]
    NotKafka { addr: String, why: String },
    #[error("{addr} did not answer as a Kafka broker: {why}")]
    NoAnswer { addr: String, why: String },
    #[error("{addr} closed the connection")]
    Closed { addr: String },
    /// The broker answered ApiVersions, then closed the connection at the
    /// first other request of a client without SASL: what a SASL listener
    /// does to a client that does not authenticate (Kafka's behaviour).
    #[error(
        "{addr}: the broker closed the connection during the first request ({api:?}): \
         does this listener expect SASL? A SASL listener closes the connection of a client \
         that has not authenticated (try --security-protocol {protocol} with --sasl-username \
         and --sasl-password; --sasl-mechanism defaults to SCRAM-SHA-512)"
    )]
    ClosedBeforeAuthentication {
        addr: String,
        api: ApiKey,
        /// The protocol to suggest: SASL_PLAINTEXT, or SASL_SSL over TLS.
        protocol: &'static str,
    },
    #[error("connection to {addr}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out waiting for {0:?}")]
    Timeout(ApiKey),
    #[error("the broker does not support {0:?}")]
    Unsupported(ApiKey),
    #[error("protocol: {0}")]
    Codec(String),
    /// SASL authentication failed or was refused.
    #[error("SASL authentication with {addr}: {why}")]
    Auth { addr: String, why: String },
    /// TLS could not be set up or its handshake failed.
    #[error("TLS with {addr}: {why}")]
    Tls { addr: String, why: String },
    #[error("bad bootstrap address: {0}")]
    Address(String),
    /// An empty list of bootstrap addresses.
    #[error("no address given")]
    NoAddress,
    /// A connection to a node the cluster's metadata named failed.
    #[error("node {id} of the cluster's metadata")]
    Node {
        id: i32,
        #[source]
        source: Box<ClientError>,
    },
    /// A response's error code: `what` was asked, `error` is the answer, and
    /// `message` the broker's reason when it sent one.
    #[error("{what}: {error:?}{}", reason(message))]
    Kafka {
        what: String,
        error: ResponseError,
        message: Option<String>,
    },
    /// A retried request that never succeeded, or an answer that lacks
    /// what was asked for.
    #[error("{0}")]
    GaveUp(String),
    #[error("encoding records: {0}")]
    EncodeRecords(String),
    #[error("fetched batch with length {len} at byte {pos}")]
    BadBatch { len: i32, pos: usize },
    #[error("decoding the batch at offset {base}: {why}")]
    DecodeBatch { base: i64, why: String },
}

fn reason(message: &Option<String>) -> String {
    match message {
        Some(m) => format!(" ({m})"),
        None => String::new(),
    }
}

impl ClientError {
    /// The Kafka error this is (for [`ClientError::Kafka`]).
    pub fn kafka_error(&self) -> Option<ResponseError> {
        match self {
            Self::Kafka { error, .. } => Some(*error),
            _ => None,
        }
    }
}

/// `Ok` for error code 0, else a [`ClientError::Kafka`] that says `what`
/// failed and how (`what: UnknownTopicOrPartition`).
pub fn check(code: i16, what: &str) -> Result<(), ClientError> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(error) => Err(ClientError::Kafka {
            what: what.to_string(),
            error,
            message: None,
        }),
    }
}

/// As [`check`], with the broker's `error_message` (the reason) when it sent one.
pub fn check_msg(code: i16, message: Option<&StrBytes>, what: &str) -> Result<(), ClientError> {
    check(code, what).map_err(|e| match (e, message.map(|m| m.as_str())) {
        (ClientError::Kafka { what, error, .. }, Some(m)) if !m.is_empty() => ClientError::Kafka {
            what,
            error,
            message: Some(m.to_string()),
        },
        (e, _) => e,
    })
}

/// Error codes worth retrying a request for: a leader or coordinator that
/// moves or loads, a busy transaction, a topic that is still being created.
pub fn retriable(code: i16) -> bool {
    use ResponseError::*;
    matches!(
        ResponseError::try_from_code(code),
        Some(
            NotLeaderOrFollower
                | RequestTimedOut
                | NotEnoughReplicas
                | NotEnoughReplicasAfterAppend
                | CoordinatorLoadInProgress
                | CoordinatorNotAvailable
                | NotCoordinator
                | ConcurrentTransactions
                | LeaderNotAvailable
                | UnknownTopicOrPartition
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_errors_name_the_code() {
        assert!(check(0, "x").is_ok());
        let e = check(3, "topic t").unwrap_err();
        assert_eq!(e.to_string(), "topic t: UnknownTopicOrPartition");
        assert_eq!(
            e.kafka_error(),
            Some(ResponseError::UnknownTopicOrPartition)
        );
        assert_eq!(
            check(1000, "x").unwrap_err().to_string(),
            "x: Unknown(1000)"
        );
        let m = StrBytes::from_static_str("no such config");
        assert_eq!(
            check_msg(40, Some(&m), "create t").unwrap_err().to_string(),
            "create t: InvalidConfig (no such config)"
        );
        let empty = StrBytes::from_static_str("");
        assert_eq!(
            check_msg(40, Some(&empty), "create t")
                .unwrap_err()
                .to_string(),
            "create t: InvalidConfig"
        );
    }

    #[test]
    fn the_retried_codes() {
        for code in [3, 5, 6, 7, 14, 15, 16, 19, 20, 51] {
            assert!(retriable(code), "{code}");
        }
        for code in [0, -1, 1, 2, 47, 53, 90, 1000] {
            assert!(!retriable(code), "{code}");
        }
    }
}
