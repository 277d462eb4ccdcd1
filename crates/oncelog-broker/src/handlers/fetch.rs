//! Fetch (with long poll) and ListOffsets.
//!
//! Reads never go past the high watermark (the durable prefix);
//! read_committed reads stop at the last stable offset (the first offset of
//! the earliest open transaction, capped at the high watermark) and get the
//! aborted transactions overlapping what they read. read_uncommitted gets no
//! aborted-transaction list (null), as Kafka sends. Control batches are
//! always delivered; clients skip them.

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

use crate::error::ErrorCode;
use crate::partition::{OffsetLookupError, ReadError};
use crate::Broker;

/// Longest long poll we honour, whatever the client asks.
const MAX_WAIT: Duration = Duration::from_secs(60);

struct Round {
    resp: FetchResponse,
    bytes: usize,
    has_error: bool,
}

fn fetch_once(b: &Broker, req: &FetchRequest, version: i16) -> Round {
    let read_committed = req.isolation_level == 1;
    let mut remaining = (req.max_bytes.max(0) as usize).min(b.config.fetch_max_bytes);
    let mut total = 0usize;
    let mut has_error = false;
    let mut topics = Vec::with_capacity(req.topics.len());
    for ft in &req.topics {
        let topic = b.topics.get(ft.topic.0.as_str());
        let mut parts = Vec::with_capacity(ft.partitions.len());
        for fp in &ft.partitions {
            let mut pd = PartitionData::default().with_partition_index(fp.partition);
            let Some(p) = topic.as_ref().and_then(|t| t.store(fp.partition)) else {
                pd.error_code = ErrorCode::UnknownTopicOrPartition.code();
                has_error = true;
                parts.push(pd);
                continue;
            };
            let offset = fp.fetch_offset;
            let limit = (fp.partition_max_bytes.max(0) as usize).min(remaining);
            let read = p.read(offset, limit, read_committed, total == 0);
            pd.high_watermark = read.high_watermark;
            pd.last_stable_offset = read.last_stable_offset;
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
                Ok(data) => {
                    total += data.len();
                    remaining = remaining.saturating_sub(data.len());
                    pd.records = Some(Bytes::from(data));
                }
                Err(ReadError::OutOfRange) => {
                    pd.error_code = ErrorCode::OffsetOutOfRange.code();
                    has_error = true;
                }
                Err(e) => {
                    tracing::error!(partition = %p.name(), error = %e, "read failed");
                    pd.error_code = ErrorCode::KafkaStorageError.code();
                    has_error = true;
                }
            }
            if pd.records.is_none() {
                pd.records = Some(Bytes::new());
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
        bytes: total,
        has_error,
    }
}

pub async fn fetch(b: Arc<Broker>, req: FetchRequest, version: i16) -> FetchResponse {
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    let deadline = Instant::now() + wait;
    let min_bytes = req.min_bytes.max(1) as usize;
    loop {
        // Register for wake-ups before reading, so no append slips between.
        let notified = b.data_notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let round = fetch_once(&b, &req, version);
        if round.bytes >= min_bytes || round.has_error || Instant::now() >= deadline {
            return round.resp;
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

pub fn list_offsets(b: &Arc<Broker>, req: ListOffsetsRequest, version: i16) -> ListOffsetsResponse {
    let read_committed = version >= 2 && req.isolation_level == 1;
    let topics = req
        .topics
        .into_iter()
        .map(|lt| {
            let topic = b.topics.get(lt.name.0.as_str());
            let parts = lt
                .partitions
                .into_iter()
                .map(|lp| {
                    let mut r = ListOffsetsPartitionResponse::default()
                        .with_partition_index(lp.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1);
                    let Some(p) = topic.as_ref().and_then(|t| t.store(lp.partition_index)) else {
                        r.error_code = ErrorCode::UnknownTopicOrPartition.code();
                        return r;
                    };
                    if version >= 4 {
                        r.leader_epoch = 0;
                    }
                    match p.offset_for(lp.timestamp, read_committed) {
                        Ok(Some((off, ts))) => {
                            r.offset = off;
                            r.timestamp = ts;
                        }
                        Ok(None) => {}
                        Err(OffsetLookupError::InvalidSpec) => {
                            r.error_code = ErrorCode::InvalidRequest.code()
                        }
                        Err(e) => {
                            tracing::error!(partition = %p.name(), error = %e, "timestamp lookup failed");
                            r.error_code = ErrorCode::KafkaStorageError.code();
                        }
                    }
                    r
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(lt.name)
                .with_partitions(parts)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}
