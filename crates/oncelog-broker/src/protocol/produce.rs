//! Produce: validate each partition's batch by its header, append it, and
//! answer once it is durable (or, in interval-flush mode, once written).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::BytesMut;
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::protocol::StrBytes;
use oncelog_log::batch::{self, BatchError};

use crate::backend::local::topics::producer_batch;
pub(crate) use crate::backend::Refusal;
use crate::backend::{Appending, Durable};
use crate::error::ErrorCode;
use crate::observe::txn_history::Requester;
use crate::Broker;
use kafka_protocol::messages::produce_response::BatchIndexAndErrorMessage;

enum Outcome {
    Done {
        code: ErrorCode,
        base_offset: i64,
        log_start_offset: i64,
        message: Option<String>,
        /// KIP-467: (index in the batch, why) of each refused record.
        record_errors: Vec<(i32, String)>,
        /// The broker's time stamped on the batch (LogAppendTime), or -1.
        append_time: i64,
    },
    Waiting {
        durable: Durable,
        append_time: i64,
    },
}

fn failed(code: ErrorCode, message: impl Into<String>) -> Outcome {
    Refusal::new(code, message).into()
}

impl From<Refusal> for Outcome {
    fn from(r: Refusal) -> Self {
        Outcome::Done {
            code: r.code,
            base_offset: -1,
            log_start_offset: -1,
            message: Some(r.message),
            record_errors: r.record_errors,
            append_time: -1,
        }
    }
}

/// The KIP-467 answer of a refusal's records (Produce v8+).
pub(crate) fn record_errors(errors: Vec<(i32, String)>) -> Vec<BatchIndexAndErrorMessage> {
    errors
        .into_iter()
        .map(|(i, why)| {
            BatchIndexAndErrorMessage::default()
                .with_batch_index(i)
                .with_batch_index_error_message(Some(StrBytes::from_string(why)))
        })
        .collect()
}

/// What both backends check of a partition's client batch by its header:
/// one whole batch, CRC and magic (`validate_client_batch`), no control
/// records, a producer id on a transactional batch and a base sequence on
/// an idempotent one.
pub(crate) fn check_batch<'a>(
    records: &'a [u8],
    name: &str,
) -> Result<batch::BatchHeader<'a>, Refusal> {
    if records.is_empty() {
        return Err(Refusal::new(ErrorCode::InvalidRecord, "no records"));
    }
    let h = batch::validate_client_batch(records).map_err(|e| {
        tracing::warn!(partition = name, error = %e, "rejected produce batch");
        Refusal::new(batch_error_code(&e), e.to_string())
    })?;
    if h.total_size() != records.len() {
        return Err(Refusal::new(
            ErrorCode::InvalidRecord,
            "a produce request must carry exactly one record batch per partition",
        ));
    }
    if h.is_control() {
        return Err(Refusal::new(
            ErrorCode::InvalidRecord,
            "clients are not allowed to write control records",
        ));
    }
    if h.is_transactional() && h.producer_id() < 0 {
        return Err(Refusal::new(
            ErrorCode::InvalidRecord,
            "transactional batch without a producer id",
        ));
    }
    if h.producer_id() >= 0 && h.base_sequence() < 0 {
        return Err(Refusal::new(
            ErrorCode::InvalidRecord,
            "idempotent batch without a base sequence",
        ));
    }
    Ok(h)
}

/// What both backends check of a batch against its topic's configs, and
/// the bytes to store: `max.message.bytes`; a compacted topic's records
/// need keys (KIP-467 errors); KIP-937's timestamp bounds with CreateTime
/// (KIP-467 errors); with `message.timestamp.type=LogAppendTime` the batch
/// stamped with the broker's time (returned, for the answer), else -1.
pub(crate) fn check_contents(
    b: &Broker,
    meta: &crate::backend::topic::TopicMeta,
    name: &str,
    records: &[u8],
    h: &batch::BatchHeader<'_>,
) -> Result<(BytesMut, i64), Refusal> {
    let max = b.topics.max_message_bytes(meta);
    if records.len() as i64 > max {
        return Err(Refusal::new(
            ErrorCode::MessageTooLarge,
            format!(
                "batch of {} bytes exceeds max.message.bytes {max}",
                records.len()
            ),
        ));
    }
    if b.topics.cleanup_policy(meta).compact {
        check_keys(records, name).map_err(|r| Refusal {
            code: r.code,
            message: r.message,
            record_errors: r.record_errors,
        })?;
    }
    let mut data = BytesMut::from(records);
    let log_append_time = b
        .topics
        .topic_config(meta, "message.timestamp.type")
        .is_some_and(|v| v == "LogAppendTime");
    if log_append_time {
        let now = crate::now_ms();
        batch::set_log_append_time(&mut data, now);
        return Ok((data, now));
    }
    let limit = |k: &str| {
        b.topics
            .topic_config(meta, k)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(i64::MAX)
    };
    let (before, after) = (
        limit("message.timestamp.before.max.ms"),
        limit("message.timestamp.after.max.ms"),
    );
    check_timestamps(records, h, before, after, name)?;
    Ok((data, -1))
}

/// KIP-937: with CreateTime, a record whose timestamp is more than `before`
/// ms behind the broker's clock or more than `after` ms ahead of it is
/// refused with INVALID_TIMESTAMP, naming each such record. The batch
/// header's timestamps decide when nothing can be out of range; the records
/// are read only when something may be.
fn check_timestamps(
    records: &[u8],
    h: &batch::BatchHeader<'_>,
    before: i64,
    after: i64,
    name: &str,
) -> Result<(), Refusal> {
    let now = crate::now_ms();
    let (lo, hi) = (now.saturating_sub(before), now.saturating_add(after));
    // The header's max timestamp bounds every record from above; nothing
    // bounds them from below (a record may be older than the first), so a
    // `before` limit reads the records.
    if h.max_timestamp() <= hi && before == i64::MAX {
        return Ok(());
    }
    let recs = oncelog_log::records::batch_records(records).map_err(|e| {
        Refusal::new(
            ErrorCode::CorruptMessage,
            format!("records do not decode: {e}"),
        )
    })?;
    let bad: Vec<(i32, String)> = recs
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| !(lo..=hi).contains(&r.timestamp(h.base_timestamp())))
        .map(|(i, r)| {
            let ts = r.timestamp(h.base_timestamp());
            (
                i as i32,
                format!("Timestamp {ts} of message with offset {i} is out of range. The timestamp should be within [{lo}, {hi}]"),
            )
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        partition = name,
        records = bad.len(),
        "produce refused: record timestamps out of range (message.timestamp.before/after.max.ms)"
    );
    Err(Refusal {
        code: ErrorCode::InvalidTimestamp,
        message: bad[0].1.clone(),
        record_errors: bad,
    })
}

/// Why a batch was refused for records without a key (KIP-467: each one's
/// index and reason).
pub(crate) struct KeyRefusal {
    pub code: ErrorCode,
    pub message: String,
    pub record_errors: Vec<(i32, String)>,
}

/// A compacted topic keeps the last record per key, so a record without a
/// key is refused (Kafka's rule): INVALID_RECORD naming each such record.
pub(crate) fn check_keys(records: &[u8], name: &str) -> Result<(), KeyRefusal> {
    let recs = oncelog_log::records::batch_records(records).map_err(|e| {
        tracing::warn!(partition = name, error = %e, "rejected produce batch: records do not decode");
        KeyRefusal {
            code: ErrorCode::CorruptMessage,
            message: format!("records do not decode: {e}"),
            record_errors: Vec::new(),
        }
    })?;
    let why =
        format!("Compacted topic cannot accept message without key in topic partition {name}.");
    let missing: Vec<(i32, String)> = recs
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.key.is_none())
        .map(|(i, _)| (i as i32, why.clone()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        partition = name,
        records = missing.len(),
        "produce refused: records without a key in a compacted topic"
    );
    Err(KeyRefusal {
        code: ErrorCode::InvalidRecord,
        message: why,
        record_errors: missing,
    })
}

fn batch_error_code(e: &BatchError) -> ErrorCode {
    match e {
        BatchError::BadMagic(_) => ErrorCode::InvalidRecord,
        _ => ErrorCode::CorruptMessage,
    }
}

/// Checks one partition's batch and appends it (both modes): the checks
/// here and in [`check_batch`]/[`check_contents`], the append and its
/// producer's checks in [`crate::backend::Logs::append`].
async fn append_one(
    b: &Arc<Broker>,
    topic: &str,
    index: i32,
    records: Option<bytes::Bytes>,
    transactional_id: Option<&str>,
    who: &Requester,
) -> Outcome {
    if crate::machines::names::is_internal_topic(topic) {
        tracing::warn!(topic, "produce to an internal topic refused");
        return failed(
            ErrorCode::InvalidTopicException,
            format!("cannot append to internal topic {topic}: it belongs to the broker"),
        );
    }
    let meta = match b.catalogue().topic(topic).await {
        Ok(Some(meta)) => meta,
        Ok(None) => {
            return failed(
                ErrorCode::UnknownTopicOrPartition,
                format!("unknown topic {topic}"),
            )
        }
        // logged by the catalogue
        Err(e) => return failed(ErrorCode::KafkaStorageError, e.to_string()),
    };
    if !(0..meta.partitions).contains(&index) {
        return failed(
            ErrorCode::UnknownTopicOrPartition,
            format!("unknown partition {topic}-{index}"),
        );
    }
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return failed(ErrorCode::InvalidRecord, "no records");
    };
    let name = format!("{topic}-{index}");
    let h = match check_batch(&records, &name) {
        Ok(h) => h,
        Err(r) => return r.into(),
    };
    if h.is_transactional() {
        // The add to the transaction was gated (a cut-over's old writer
        // may not add the topic); here only the writer itself is checked.
        if let Err(why) = b
            .catalogue()
            .write_gate(topic, transactional_id.unwrap_or(""))
        {
            tracing::warn!(partition = %name, transactional_id = transactional_id.unwrap_or(""),
                reason = %why, "second transactional writer refused");
            return failed(
                ErrorCode::TransactionalIdAuthorizationFailed,
                why.to_string(),
            );
        }
    }
    let (data, append_time) = match check_contents(b, &meta, &name, &records, &h) {
        Ok(x) => x,
        Err(r) => return r.into(),
    };
    let producer = (h.producer_id() >= 0).then(|| producer_batch(&h));
    match b
        .logs()
        .append(&meta, index, data, producer.as_ref(), transactional_id, who)
        .await
    {
        Ok(Appending::Now(a)) => Outcome::Done {
            code: ErrorCode::None,
            base_offset: a.base_offset,
            log_start_offset: a.log_start_offset,
            message: None,
            record_errors: Vec::new(),
            append_time,
        },
        Ok(Appending::Later(durable)) => Outcome::Waiting {
            durable,
            append_time,
        },
        Err(r) => r.into(),
    }
}

/// The (producer id, epoch) of a produce request's batch when it is a
/// transactional one (both modes' implicit add reads it).
pub(super) fn transactional_identity(records: Option<&[u8]>) -> Option<(i64, i16)> {
    let h = batch::BatchHeader::new(records?).ok()?;
    (h.is_transactional() && h.producer_id() >= 0).then(|| (h.producer_id(), h.producer_epoch()))
}

/// KIP-890 part 2 (Produce v12): a transactional batch adds its partition
/// to its producer's transaction on the client's behalf (both modes, by
/// [`crate::backend::Txns::implicit_add`]). Returns the partitions that
/// could not be added, with the code and message to answer.
async fn implicit_add(
    b: &Arc<Broker>,
    req: &ProduceRequest,
    version: i16,
    who: &Requester,
) -> Vec<(String, i32, ErrorCode, String)> {
    let Some(id) = req.transactional_id.as_ref().filter(|_| version >= 12) else {
        return Vec::new();
    };
    let catalogue = b.catalogue();
    let mut ident = None;
    let mut parts = Vec::new();
    for td in &req.topic_data {
        let Ok(Some(meta)) = catalogue.topic(td.name.0.as_str()).await else {
            continue;
        };
        for pd in &td.partition_data {
            let Some(who) = transactional_identity(pd.records.as_deref()) else {
                continue;
            };
            if (0..meta.partitions).contains(&pd.index) {
                ident = Some(who);
                parts.push((meta.name.clone(), pd.index));
            }
        }
    }
    let Some((pid, epoch)) = ident else {
        return Vec::new();
    };
    let tid = id.0.as_str();
    tracing::debug!(transactional_id = tid, producer_id = pid, epoch, partitions = ?parts, "implicit add to transaction");
    match b.txns().implicit_add(tid, pid, epoch, &parts, who).await {
        Ok(()) => Vec::new(),
        Err((code, why)) => parts
            .into_iter()
            .map(|(t, i)| (t, i, code, why.clone()))
            .collect(),
    }
}

/// Produce, in both modes: appends now, in arrival order; the returned
/// future waits for durability and yields the response (`None` for
/// acks=0, which gets no response).
pub async fn produce(
    b: &Arc<Broker>,
    req: ProduceRequest,
    version: i16,
    who: &Requester,
) -> Pin<Box<dyn Future<Output = Option<ProduceResponse>> + Send>> {
    let implicit = implicit_add(b, &req, version, who).await;
    let txn_id = req.transactional_id.as_ref().map(|t| t.0.to_string());
    let acks = req.acks;
    let valid_acks = (-1..=1).contains(&acks);
    let mut results: Vec<(StrBytes, Vec<(i32, Outcome)>)> =
        Vec::with_capacity(req.topic_data.len());
    for td in req.topic_data {
        let name = td.name.0.clone();
        let mut parts = Vec::with_capacity(td.partition_data.len());
        for pd in td.partition_data {
            let refused = implicit
                .iter()
                .find(|(t, i, _, _)| t == name.as_str() && *i == pd.index);
            let out = if !valid_acks {
                failed(
                    ErrorCode::InvalidRequiredAcks,
                    format!("acks={acks} is not 0, 1 or -1"),
                )
            } else if let Some((_, _, code, why)) = refused {
                failed(*code, why.clone())
            } else {
                append_one(b, &name, pd.index, pd.records, txn_id.as_deref(), who).await
            };
            parts.push((pd.index, out));
        }
        results.push((name, parts));
    }
    Box::pin(async move {
        let mut topics = Vec::with_capacity(results.len());
        for (name, parts) in results {
            let mut responses = Vec::with_capacity(parts.len());
            for (index, out) in parts {
                let (code, base_offset, log_start, message, record_errors_of, append_time) =
                    match out {
                        Outcome::Done {
                            code,
                            base_offset,
                            log_start_offset,
                            message,
                            record_errors,
                            append_time,
                        } => (
                            code,
                            base_offset,
                            log_start_offset,
                            message,
                            record_errors,
                            append_time,
                        ),
                        Outcome::Waiting {
                            durable,
                            append_time,
                        } => match durable.await {
                            Ok(a) => {
                                // Durable but not yet answered: a crash here loses the ack.
                                crate::faults::fail_point("produce-before-ack");
                                (
                                    ErrorCode::None,
                                    a.base_offset,
                                    a.log_start_offset,
                                    None,
                                    Vec::new(),
                                    append_time,
                                )
                            }
                            Err(r) => (r.code, -1, -1, Some(r.message), r.record_errors, -1),
                        },
                    };
                let mut r = PartitionProduceResponse::default()
                    .with_index(index)
                    .with_error_code(code.code())
                    .with_base_offset(base_offset)
                    .with_log_append_time_ms(append_time);
                if version >= 5 {
                    r.log_start_offset = log_start;
                }
                if version >= 8 {
                    r.error_message = message.map(StrBytes::from_string);
                    r.record_errors = record_errors(record_errors_of);
                }
                responses.push(r);
            }
            topics.push(
                TopicProduceResponse::default()
                    .with_name(kafka_protocol::messages::TopicName(name))
                    .with_partition_responses(responses),
            );
        }
        if acks == 0 {
            return None;
        }
        Some(ProduceResponse::default().with_responses(topics))
    })
}
