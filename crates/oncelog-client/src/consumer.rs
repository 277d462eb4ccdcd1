//! Reading: log offsets (ListOffsets), fetches from partition leaders, the
//! decoding of fetched record batches with read_committed filtering, and a
//! standalone consumer group's committed offsets (no membership: fetch and
//! commit only).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::{FetchResponse, PartitionData};
use kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
use kafka_protocol::messages::list_offsets_response::ListOffsetsResponse;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponse;
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequest, OffsetFetchRequestTopic};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::{ApiKey, BrokerId, GroupId, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, RecordBatchDecoder};

use crate::cluster::{s, Cluster, CoordinatorType};
use crate::conn::Client;
use crate::error::{check, ClientError};

/// The ListOffsets timestamp that asks for the log start offset.
pub const EARLIEST: i64 = -2;
/// The ListOffsets timestamp that asks for the end of the log: the high
/// watermark, or with `committed` the last stable offset.
pub const LATEST: i64 = -1;

/// The offset of each of `parts` of `topic` for `ts`: [`EARLIEST`],
/// [`LATEST`] or a timestamp (ms: the first offset at or after it, -1 for
/// none); `committed` (read_committed) makes [`LATEST`] the last stable offset.
pub async fn list_offsets(
    c: &mut Client,
    topic: &str,
    parts: &[i32],
    ts: i64,
    committed: bool,
) -> Result<BTreeMap<i32, i64>, ClientError> {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation_level(committed))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(
                parts
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_timestamp(ts)
                    })
                    .collect(),
            )]);
    let (r, _) = c
        .call::<_, ListOffsetsResponse>(ApiKey::ListOffsets, &req)
        .await?;
    Ok(r.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.offset)))
        .collect())
}

/// read_committed is isolation level 1, read_uncommitted 0.
fn isolation_level(committed: bool) -> i8 {
    if committed {
        1
    } else {
        0
    }
}

/// One fetch of `topic` from node `leader`: each of `positions`
/// (partition, offset) up to 4 MiB, waiting up to 500 ms for a first byte.
pub async fn fetch(
    c: &mut Cluster,
    leader: i32,
    topic: &str,
    positions: &[(i32, i64)],
    committed: bool,
) -> Result<FetchResponse, ClientError> {
    let parts = positions
        .iter()
        .map(|(p, o)| {
            FetchPartition::default()
                .with_partition(*p)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(*o)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(4 << 20)
        })
        .collect();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(16 << 20)
        .with_isolation_level(isolation_level(committed))
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(s(topic)))
            .with_partitions(parts)]);
    let (r, _) = c
        .node(leader)
        .await?
        .call_max::<_, FetchResponse>(ApiKey::Fetch, &req, 12)
        .await?;
    check(r.error_code, "fetch")?;
    Ok(r)
}

/// A partition's aborted transactions, for read_committed: those not yet
/// reached (producer id, first offset), and the producers whose aborted
/// transaction is being skipped.
#[derive(Debug, Default)]
pub struct AbortedTxns {
    pending: VecDeque<(i64, i64)>,
    skipping: BTreeSet<i64>,
}

impl AbortedTxns {
    /// Replaces the aborted transactions not yet reached with a fetch's
    /// list of them.
    pub fn set_pending(&mut self, list: impl IntoIterator<Item = (i64, i64)>) {
        let mut l: Vec<(i64, i64)> = list.into_iter().collect();
        l.sort_by_key(|x| x.1);
        self.pending.clear();
        self.pending.extend(l);
    }
}

/// The records of one fetched partition at or after `from` (read_committed
/// filtering applied when `committed`) and the offset to fetch next.
pub fn decode_partition(
    pd: &PartitionData,
    from: i64,
    committed: bool,
    aborted: &mut AbortedTxns,
) -> Result<(Vec<Record>, i64), ClientError> {
    if let Some(list) = &pd.aborted_transactions {
        aborted.set_pending(list.iter().map(|x| (x.producer_id.0, x.first_offset)));
    }
    match &pd.records {
        Some(data) => decode_fetched(data, from, committed, aborted),
        None => Ok((Vec::new(), from)),
    }
}

/// The records of fetched `data` at or after `from`, read_committed
/// filtering applied; returns them and the offset to fetch next.
pub fn decode_fetched(
    data: &Bytes,
    from: i64,
    committed_only: bool,
    aborted: &mut AbortedTxns,
) -> Result<(Vec<Record>, i64), ClientError> {
    let mut out = Vec::new();
    let mut next = from;
    let mut pos = 0usize;
    while data.len() - pos >= 61 {
        let len =
            i32::from_be_bytes([data[pos + 8], data[pos + 9], data[pos + 10], data[pos + 11]]);
        if len < 49 {
            return Err(ClientError::BadBatch { len, pos });
        }
        let total = 12 + len as usize;
        if data.len() - pos < total {
            break; // a partial batch at the end of a fetch
        }
        let raw = data.slice(pos..pos + total);
        pos += total;
        let base = i64::from_be_bytes(raw[0..8].try_into().unwrap_or([0; 8]));
        let last_delta = i32::from_be_bytes(raw[23..27].try_into().unwrap_or([0; 4]));
        let attrs = i16::from_be_bytes(raw[21..23].try_into().unwrap_or([0; 2]));
        let pid = i64::from_be_bytes(raw[43..51].try_into().unwrap_or([0; 8]));
        let last = base + last_delta as i64;
        if last < next {
            continue;
        }
        next = last + 1;
        let transactional = attrs & 0x10 != 0;
        let control = attrs & 0x20 != 0;
        if committed_only {
            while aborted
                .pending
                .front()
                .is_some_and(|(_, first)| *first <= last)
            {
                if let Some((p, _)) = aborted.pending.pop_front() {
                    aborted.skipping.insert(p);
                }
            }
        }
        let mut buf = raw.clone();
        let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| ClientError::DecodeBatch {
            base,
            why: e.to_string(),
        })?;
        if control {
            if committed_only {
                let abort_marker = set
                    .records
                    .first()
                    .and_then(|r| r.key.as_ref())
                    .is_some_and(|k| k.len() >= 4 && i16::from_be_bytes([k[2], k[3]]) == 0);
                if abort_marker {
                    aborted.skipping.remove(&pid);
                }
            }
            continue;
        }
        if committed_only && transactional && aborted.skipping.contains(&pid) {
            continue;
        }
        out.extend(set.records.into_iter().filter(|r| r.offset >= from));
    }
    Ok((out, next))
}

/// The offsets `group` has committed for `parts` of `topic` (those it has
/// one for), asked of its coordinator; transactional commits still pending
/// are waited for (require_stable).
pub async fn committed_offsets(
    c: &mut Cluster,
    group: &str,
    topic: &str,
    parts: &[i32],
) -> Result<BTreeMap<i32, i64>, ClientError> {
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partition_indexes(parts.to_vec())]))
        .with_require_stable(true);
    let node = c.coordinator(group, CoordinatorType::Group).await?;
    let (r, _) = c
        .node(node)
        .await?
        .call_max::<_, OffsetFetchResponse>(ApiKey::OffsetFetch, &req, 7)
        .await?;
    check(r.error_code, &format!("offsets of group {group}"))?;
    let mut out = BTreeMap::new();
    for t in &r.topics {
        for p in &t.partitions {
            check(p.error_code, &format!("offset of group {group}"))?;
            if p.committed_offset >= 0 {
                out.insert(p.partition_index, p.committed_offset);
            }
        }
    }
    Ok(out)
}

/// An OffsetCommit of `offsets` (partition, offset) of `topic` for `group`
/// as a standalone consumer: no generation, no member id.
pub fn commit_request(
    group: &str,
    topic: &str,
    offsets: impl IntoIterator<Item = (i32, i64)>,
) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::default())
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(
                offsets
                    .into_iter()
                    .map(|(p, o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(p)
                            .with_committed_offset(o)
                    })
                    .collect(),
            )])
}

/// Commits `pos` as the group's offsets (a standalone consumer: no generation).
pub async fn commit_group(
    c: &mut Cluster,
    group: &str,
    topic: &str,
    pos: &BTreeMap<i32, i64>,
) -> Result<(), ClientError> {
    let req = commit_request(group, topic, pos.iter().map(|(p, o)| (*p, *o)));
    let node = c.coordinator(group, CoordinatorType::Group).await?;
    let (r, _) = c
        .node(node)
        .await?
        .call_max::<_, OffsetCommitResponse>(ApiKey::OffsetCommit, &req, 8)
        .await?;
    for t in &r.topics {
        for p in &t.partitions {
            check(p.error_code, &format!("commit offsets of group {group}"))?;
        }
    }
    Ok(())
}

/// A consumer-protocol assignment (version, then the fields of that
/// version; a newer version than we know is read as our newest, whose
/// fields it starts with): topic-partitions sorted. `None` when the bytes do
/// not decode (or there are none: the member has no assignment yet).
pub fn decode_assignment(raw: &Bytes) -> Option<Vec<(String, Vec<i32>)>> {
    use bytes::Buf;
    use kafka_protocol::messages::consumer_protocol_assignment::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::{Decodable, Message};
    if raw.len() < 2 {
        return None;
    }
    let mut buf = raw.clone();
    let version = buf.get_i16();
    if version < 0 {
        return None;
    }
    let version = version.min(ConsumerProtocolAssignment::VERSIONS.max);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).ok()?;
    let mut out: Vec<(String, Vec<i32>)> = a
        .assigned_partitions
        .iter()
        .map(|tp| {
            let mut ps = tp.partitions.clone();
            ps.sort_unstable();
            (tp.topic.0.to_string(), ps)
        })
        .collect();
    out.sort();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::messages::consumer_protocol_assignment::{
        ConsumerProtocolAssignment, TopicPartition,
    };
    use kafka_protocol::protocol::Encodable;
    use kafka_protocol::records::{
        Compression, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn encoded(version: i16, a: &ConsumerProtocolAssignment) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(version);
        a.encode(&mut b, version.min(3)).unwrap();
        b.freeze()
    }

    #[test]
    fn assignments_decode_in_every_version() {
        let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
            TopicPartition::default()
                .with_topic(TopicName(s("b")))
                .with_partitions(vec![2, 0]),
            TopicPartition::default()
                .with_topic(TopicName(s("a")))
                .with_partitions(vec![1]),
        ]);
        let want = vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0, 2])];
        for v in 0..=3 {
            assert_eq!(
                decode_assignment(&encoded(v, &a)),
                Some(want.clone()),
                "v{v}"
            );
        }
        // A newer version starts with the fields we know.
        assert_eq!(decode_assignment(&encoded(7, &a)), Some(want));
        assert_eq!(decode_assignment(&Bytes::new()), None);
        assert_eq!(
            decode_assignment(&Bytes::from_static(b"\x00\x00\xff")),
            None
        );
    }

    /// A batch of `values` from `offset` on: plain (`pid` < 0), or
    /// transactional records of producer `pid`, or (`marker`) one control
    /// record of it: an abort (0) or commit (1) marker.
    fn batch(buf: &mut BytesMut, offset: i64, pid: i64, values: &[&str], marker: Option<i16>) {
        let recs: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: pid >= 0,
                control: marker.is_some(),
                partition_leader_epoch: 0,
                producer_id: pid,
                producer_epoch: if pid >= 0 { 0 } else { -1 },
                timestamp_type: TimestampType::Creation,
                offset: offset + i as i64,
                sequence: if pid >= 0 {
                    offset as i32 + i as i32
                } else {
                    -1
                },
                timestamp: 1_000,
                key: marker.map(|m| {
                    let mut k = BytesMut::new();
                    k.put_i16(0);
                    k.put_i16(m);
                    k.freeze()
                }),
                value: Some(Bytes::from(v.to_string())),
                headers: IndexMap::new(),
                delete_horizon: false,
            })
            .collect();
        RecordBatchEncoder::encode(
            buf,
            recs.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
    }

    fn values(recs: &[Record]) -> Vec<(i64, String)> {
        recs.iter()
            .map(|r| {
                let v = r.value.as_deref().unwrap_or_default();
                (r.offset, String::from_utf8_lossy(v).into_owned())
            })
            .collect()
    }

    #[test]
    fn read_committed_skips_aborted_transactions_and_markers() {
        let mut data = BytesMut::new();
        batch(&mut data, 0, -1, &["a", "b"], None);
        batch(&mut data, 2, 7, &["aborted-1", "aborted-2"], None);
        batch(&mut data, 4, 8, &["committed"], None);
        batch(&mut data, 5, 7, &[""], Some(0));
        batch(&mut data, 6, 8, &[""], Some(1));
        batch(&mut data, 7, -1, &["c"], None);
        let data = data.freeze();

        let mut aborted = AbortedTxns::default();
        aborted.set_pending([(7, 2)]);
        let (recs, next) = decode_fetched(&data, 0, true, &mut aborted).unwrap();
        assert_eq!(next, 8);
        assert_eq!(
            values(&recs),
            vec![
                (0, "a".into()),
                (1, "b".into()),
                (4, "committed".into()),
                (7, "c".into())
            ]
        );
        // the abort marker ended producer 7's skipping
        assert!(aborted.skipping.is_empty() && aborted.pending.is_empty());

        // read_uncommitted sees every data record, no markers
        let (recs, next) = decode_fetched(&data, 0, false, &mut AbortedTxns::default()).unwrap();
        assert_eq!(next, 8);
        assert_eq!(
            recs.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4, 7]
        );

        // from the middle of a batch: its earlier records are left out
        let (recs, _) = decode_fetched(&data, 1, false, &mut AbortedTxns::default()).unwrap();
        assert_eq!(recs.first().map(|r| r.offset), Some(1));
    }

    #[test]
    fn a_partial_batch_at_the_end_waits_for_the_next_fetch() {
        let mut data = BytesMut::new();
        batch(&mut data, 0, -1, &["a"], None);
        let whole = data.len();
        batch(&mut data, 1, -1, &["b"], None);
        let cut = data.freeze().slice(..whole + 30);
        let (recs, next) = decode_fetched(&cut, 0, true, &mut AbortedTxns::default()).unwrap();
        assert_eq!((values(&recs), next), (vec![(0, "a".into())], 1));
    }

    #[test]
    fn a_batch_too_short_to_be_one_is_an_error() {
        let mut data = BytesMut::new();
        batch(&mut data, 0, -1, &["a"], None);
        let mut raw = data.to_vec();
        raw[8..12].copy_from_slice(&10i32.to_be_bytes());
        let e =
            decode_fetched(&Bytes::from(raw), 0, true, &mut AbortedTxns::default()).unwrap_err();
        assert_eq!(e.to_string(), "fetched batch with length 10 at byte 0");
    }
}
