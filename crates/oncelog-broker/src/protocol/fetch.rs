//! Fetch (with long poll) and ListOffsets, in both modes over
//! [`crate::backend::Logs`].
//!
//! Reads never go past the high watermark (the durable prefix);
//! read_committed reads stop at the last stable offset (the first offset of
//! the earliest open transaction, capped at the high watermark) and get the
//! aborted transactions overlapping what they read. read_uncommitted gets no
//! aborted-transaction list (null), as Kafka sends. Control batches are
//! always delivered; clients skip them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchResponse, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::ProducerId;
use tokio::time::Instant;

use crate::backend::local::partition::ReadError;
use crate::backend::{Budget, FetchAsk, PartitionError};
use crate::error::ErrorCode;
use crate::Broker;

/// Longest long poll we honour, whatever the client asks.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// What Fetch did: rounds of reads (each reads every partition of its
/// request) and long-poll wake-ups that read nothing because none of the
/// poll's partitions had moved.
#[derive(Default)]
pub struct FetchStats {
    pub rounds: AtomicU64,
    pub wakeups_skipped: AtomicU64,
}

struct Round {
    resp: FetchResponse,
    bytes: usize,
    has_error: bool,
    /// Each partition read and the high watermark its read returned.
    ends: Vec<(String, i32, i64)>,
}

impl Round {
    /// Did any partition of this round move past what the round read
    /// ([`crate::backend::Logs::known_end`], no storage read)? A long poll
    /// woken by another partition's data reads nothing again.
    async fn moved(&self, logs: &crate::backend::Logs<'_>) -> bool {
        for (topic, partition, hw) in &self.ends {
            match logs.known_end(topic, *partition).await {
                Some(end) if end <= *hw => {}
                _ => return true,
            }
        }
        false
    }
}

async fn fetch_once(b: &Arc<Broker>, req: &FetchRequest, version: i16) -> Round {
    let read_committed = req.isolation_level == 1;
    let logs = b.logs();
    let mut budget = Budget::new((req.max_bytes.max(0) as usize).min(b.config.fetch_max_bytes));
    let asks: Vec<FetchAsk<'_>> = req
        .topics
        .iter()
        .flat_map(|ft| {
            ft.partitions.iter().map(|fp| FetchAsk {
                topic: ft.topic.0.as_str(),
                partition: fp.partition,
                offset: fp.fetch_offset,
                max_bytes: fp.partition_max_bytes.max(0) as usize,
            })
        })
        .collect();
    let mut reads = logs
        .read_many(&asks, &mut budget, read_committed)
        .await
        .into_iter();
    let mut has_error = false;
    let mut ends = Vec::new();
    let mut topics = Vec::with_capacity(req.topics.len());
    for ft in &req.topics {
        let mut parts = Vec::with_capacity(ft.partitions.len());
        for fp in &ft.partitions {
            let mut pd = PartitionData::default()
                .with_partition_index(fp.partition)
                .with_records(Some(Bytes::new()));
            let read = match reads.next().unwrap_or(Err(PartitionError::Unknown)) {
                Ok(read) => read,
                Err(e) => {
                    pd.error_code = match e {
                        PartitionError::Unknown => ErrorCode::UnknownTopicOrPartition,
                        PartitionError::Storage => ErrorCode::KafkaStorageError,
                    }
                    .code();
                    has_error = true;
                    parts.push(pd);
                    continue;
                }
            };
            pd.high_watermark = read.high_watermark;
            pd.last_stable_offset = read.last_stable_offset;
            ends.push((ft.topic.0.to_string(), fp.partition, read.high_watermark));
            if version >= 5 {
                pd.log_start_offset = read.log_start_offset;
            }
            if read_committed {
                pd.aborted_transactions = Some(
                    read.aborted
                        .into_iter()
                        .map(|a| {
                            AbortedTransaction::default()
                                .with_producer_id(ProducerId(a.producer_id))
                                .with_first_offset(a.first_offset)
                        })
                        .collect(),
                );
            }
            match read.data {
                Ok(data) if data.is_empty() => {}
                Ok(data) => pd.records = Some(Bytes::from(data)),
                Err(ReadError::OutOfRange) => {
                    pd.error_code = ErrorCode::OffsetOutOfRange.code();
                    has_error = true;
                }
                // logged by the log that failed
                Err(ReadError::Storage(_)) => {
                    pd.error_code = ErrorCode::KafkaStorageError.code();
                    has_error = true;
                }
            }
            parts.push(pd);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(ft.topic.clone())
                .with_partitions(parts),
        );
    }
    Round {
        resp: FetchResponse::default().with_responses(topics),
        bytes: budget.total(),
        has_error,
        ends,
    }
}

/// Fetch, in both modes: reads until `min_bytes` are found, an error, or
/// the client's wait (at most [`MAX_WAIT`]) is over. While it waits, a
/// wake-up (any partition's new data) reads again only when one of its own
/// partitions moved; at the end of the wait it answers with its last read.
pub async fn fetch(b: Arc<Broker>, req: FetchRequest, version: i16) -> FetchResponse {
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    let deadline = Instant::now() + wait;
    let min_bytes = req.min_bytes.max(1) as usize;
    let logs = b.logs();
    loop {
        // Register for wake-ups before reading, so no append slips between.
        let notified = logs.data_notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let round = fetch_once(&b, &req, version).await;
        b.fetch_stats.rounds.fetch_add(1, Ordering::Relaxed);
        if round.bytes >= min_bytes || round.has_error || Instant::now() >= deadline {
            return round.resp;
        }
        loop {
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => return round.resp,
            }
            // registered again before looking, as above
            notified.set(logs.data_notify().notified());
            notified.as_mut().enable();
            if round.moved(&logs).await {
                break;
            }
            b.fetch_stats
                .wakeups_skipped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// ListOffsets, in both modes: -1 latest (the LSO for read_committed), -2
/// earliest (and KIP-405's -4, earliest local: every offset here is
/// local), -3 the largest timestamp (KIP-734), else the first offset whose
/// timestamp reaches the one asked. Other negative specs are
/// INVALID_REQUEST.
pub async fn list_offsets(
    b: &Arc<Broker>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let read_committed = version >= 2 && req.isolation_level == 1;
    let logs = b.logs();
    let mut topics = Vec::with_capacity(req.topics.len());
    for lt in req.topics {
        let mut parts = Vec::with_capacity(lt.partitions.len());
        for lp in lt.partitions {
            let mut r = ListOffsetsPartitionResponse::default()
                .with_partition_index(lp.partition_index)
                .with_timestamp(-1)
                .with_offset(-1);
            let spec = match lp.timestamp {
                -4 => Some(-2),
                s if s >= -3 => Some(s),
                _ => None,
            };
            let found = match spec {
                Some(spec) => {
                    logs.offset_for(lt.name.0.as_str(), lp.partition_index, spec, read_committed)
                        .await
                }
                None => Err(PartitionError::Unknown),
            };
            if spec.is_some() && found != Err(PartitionError::Unknown) && version >= 4 {
                r.leader_epoch = 0;
            }
            match (spec, found) {
                (None, _) => r.error_code = ErrorCode::InvalidRequest.code(),
                (_, Ok(Some((off, ts)))) => {
                    r.offset = off;
                    r.timestamp = ts;
                }
                (_, Ok(None)) => {}
                (_, Err(PartitionError::Unknown)) => {
                    r.error_code = ErrorCode::UnknownTopicOrPartition.code()
                }
                (_, Err(PartitionError::Storage)) => {
                    r.error_code = ErrorCode::KafkaStorageError.code()
                }
            }
            parts.push(r);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(lt.name)
                .with_partitions(parts),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}
