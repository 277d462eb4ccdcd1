//! A producer of one topic: idempotent (acks=all, a producer id and
//! per-partition sequences) unless acks=1, optionally transactional. The
//! caller batches records per partition; [`Producer::send`] writes a batch
//! to every partition's leader and waits for the acknowledgements.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
};
use kafka_protocol::messages::add_partitions_to_txn_response::AddPartitionsToTxnResponse;
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::ProduceResponse;
use kafka_protocol::messages::{ApiKey, ProducerId, TopicName, TransactionalId};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions};

use crate::cluster::{s, Cluster, CoordinatorType, Leaders};
use crate::error::{check, retriable, ClientError};

/// How many acknowledgements a write waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// Every in-sync replica (`acks=all`, -1): the producer is idempotent.
    All,
    /// The leader only (`acks=1`): no producer id, no sequences.
    Leader,
}

impl Acks {
    fn code(self) -> i16 {
        match self {
            Acks::All => -1,
            Acks::Leader => 1,
        }
    }
}

/// What a [`Producer`] writes and how.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub topic: String,
    pub acks: Acks,
    pub compression: Compression,
    /// Write inside transactions of this transactional id (only with
    /// [`Acks::All`]: with [`Acks::Leader`] there is no producer id).
    pub transactional_id: Option<String>,
}

/// One acknowledged record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub partition: i32,
    pub offset: i64,
    /// The broker's log append time, or the record's own timestamp.
    pub timestamp: i64,
}

pub struct Producer {
    topic: String,
    leaders: Leaders,
    acks: i16,
    compression: Compression,
    producer_id: i64,
    epoch: i16,
    sequences: HashMap<i32, i32>,
    txn: Option<(String, i32)>,
    in_txn: BTreeSet<i32>,
}

impl Producer {
    /// Looks up the topic's leaders (auto-creating it where the cluster
    /// allows) and, for acks=all, gets a producer id (from the transaction
    /// coordinator for a transactional producer).
    pub async fn init(c: &mut Cluster, config: ProducerConfig) -> Result<Self, ClientError> {
        let leaders = c.leaders(&config.topic, true).await?;
        let mut p = Self {
            topic: config.topic,
            leaders,
            acks: config.acks.code(),
            compression: config.compression,
            producer_id: -1,
            epoch: -1,
            sequences: HashMap::new(),
            txn: None,
            in_txn: BTreeSet::new(),
        };
        if config.acks == Acks::All {
            let (node, tid) = match config.transactional_id {
                Some(t) => (
                    c.coordinator(&t, CoordinatorType::Transaction).await?,
                    Some(t),
                ),
                None => (*p.leaders.values().next().unwrap_or(&-1), None),
            };
            let req = InitProducerIdRequest::default()
                .with_transactional_id(tid.as_ref().map(|t| TransactionalId(s(t))))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            let mut last = 0;
            for attempt in 0..30 {
                let (r, _) = c
                    .node(node)
                    .await?
                    .call_max::<_, InitProducerIdResponse>(ApiKey::InitProducerId, &req, 4)
                    .await?;
                last = r.error_code;
                if r.error_code == 0 {
                    p.producer_id = r.producer_id.0;
                    p.epoch = r.producer_epoch;
                    break;
                }
                if !retriable(r.error_code) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            }
            check(last, "init producer id")?;
            if let Some(t) = tid {
                p.txn = Some((t, node));
            }
        }
        Ok(p)
    }

    /// The topic's partitions and their leaders.
    pub fn leaders(&self) -> &Leaders {
        &self.leaders
    }

    /// The producer id (-1 for acks=1).
    pub fn producer_id(&self) -> i64 {
        self.producer_id
    }

    /// The producer epoch (-1 for acks=1). With [`Producer::producer_id`],
    /// the identity the open transaction is ended under.
    pub fn epoch(&self) -> i16 {
        self.epoch
    }

    pub fn is_transactional(&self) -> bool {
        self.txn.is_some()
    }

    async fn add_partitions(&mut self, c: &mut Cluster, parts: &[i32]) -> Result<(), ClientError> {
        let Some((tid, node)) = self.txn.clone() else {
            return Ok(());
        };
        let new: Vec<i32> = parts
            .iter()
            .copied()
            .filter(|p| !self.in_txn.contains(p))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(&tid)))
            .with_v3_and_below_producer_id(ProducerId(self.producer_id))
            .with_v3_and_below_producer_epoch(self.epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(s(&self.topic)))
                .with_partitions(new.clone())]);
        for attempt in 0..30 {
            let (r, _) = c
                .node(node)
                .await?
                .call_max::<_, AddPartitionsToTxnResponse>(ApiKey::AddPartitionsToTxn, &req, 3)
                .await?;
            let code = r
                .results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| {
                    t.results_by_partition
                        .iter()
                        .map(|p| p.partition_error_code)
                })
                .find(|e| *e != 0)
                .unwrap_or(r.error_code);
            if code == 0 {
                self.in_txn.extend(new);
                return Ok(());
            }
            if !retriable(code) {
                check(code, "add partitions to transaction")?;
            }
            tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
        }
        Err(ClientError::GaveUp(
            "add partitions to transaction: still busy after 30 tries".into(),
        ))
    }

    /// Commits (or aborts) the open transaction, if there is one.
    pub async fn end_txn(&mut self, c: &mut Cluster, commit: bool) -> Result<(), ClientError> {
        self.end_txn_at(c, commit, 4).await.map(|_| ())
    }

    /// Commits (or aborts) the open transaction with EndTxn at the highest
    /// version both sides support up to `max_version`, and returns that
    /// version (`None`: no transaction was open, nothing was sent). From
    /// version 5 (KIP-890 transaction version 2) every end bumps the epoch:
    /// the producer takes the identity the answer hands out, and its
    /// sequences start again at 0. Retriable answers are retried; a lost
    /// connection is returned as an error with the transaction still open
    /// here, so a call after reconnecting sends the same end again.
    pub async fn end_txn_at(
        &mut self,
        c: &mut Cluster,
        commit: bool,
        max_version: i16,
    ) -> Result<Option<i16>, ClientError> {
        let Some((tid, node)) = self.txn.clone() else {
            return Ok(None);
        };
        if self.in_txn.is_empty() {
            return Ok(None);
        }
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&tid)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(self.epoch)
            .with_committed(commit);
        for attempt in 0..30 {
            let (r, version) = c
                .node(node)
                .await?
                .call_max::<_, EndTxnResponse>(ApiKey::EndTxn, &req, max_version)
                .await?;
            if r.error_code == 0 {
                self.in_txn.clear();
                let next = (r.producer_id.0, r.producer_epoch);
                if version >= 5 && next.0 >= 0 && next != (self.producer_id, self.epoch) {
                    (self.producer_id, self.epoch) = next;
                    self.sequences.clear();
                }
                return Ok(Some(version));
            }
            if !retriable(r.error_code) {
                check(
                    r.error_code,
                    if commit {
                        "commit transaction"
                    } else {
                        "abort transaction"
                    },
                )?;
            }
            tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
        }
        Err(ClientError::GaveUp(
            "end transaction: still busy after 30 tries".into(),
        ))
    }

    /// Sends `pending` (partition → records) and waits for the
    /// acknowledgements; returns each record's partition, offset and timestamp.
    pub async fn send(
        &mut self,
        c: &mut Cluster,
        pending: BTreeMap<i32, Vec<Record>>,
    ) -> Result<Vec<Acked>, ClientError> {
        let parts: Vec<i32> = pending.keys().copied().collect();
        self.add_partitions(c, &parts).await?;
        let mut by_leader: BTreeMap<i32, Vec<PartitionProduceData>> = BTreeMap::new();
        let mut stamps: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        let mut acked = Vec::new();
        for (p, mut recs) in pending {
            stamps.insert(p, recs.iter().map(|r| r.timestamp).collect());
            let seq = self.sequences.entry(p).or_insert(0);
            for (i, r) in recs.iter_mut().enumerate() {
                r.offset = i as i64;
                if self.producer_id >= 0 {
                    r.producer_id = self.producer_id;
                    r.producer_epoch = self.epoch;
                    r.sequence = seq.wrapping_add(i as i32);
                    r.transactional = self.txn.is_some();
                } else {
                    // no producer: the batch's base sequence must be -1 (the
                    // encoder keeps records in one batch while offset - sequence
                    // stays constant)
                    r.sequence = i as i32 - 1;
                }
            }
            if self.producer_id >= 0 {
                *seq = seq.wrapping_add(recs.len() as i32);
            }
            let mut buf = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut buf,
                recs.iter(),
                &RecordEncodeOptions {
                    version: 2,
                    compression: self.compression,
                },
            )
            .map_err(|e| ClientError::EncodeRecords(e.to_string()))?;
            let leader = *self.leaders.get(&p).unwrap_or(&-1);
            by_leader.entry(leader).or_default().push(
                PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(buf.freeze())),
            );
        }
        for (leader, parts) in by_leader {
            let req = ProduceRequest::default()
                .with_transactional_id(self.txn.as_ref().map(|(t, _)| TransactionalId(s(t))))
                .with_acks(self.acks)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(s(&self.topic)))
                    .with_partition_data(parts)]);
            let mut attempt = 0;
            loop {
                let (r, _) = c
                    .node(leader)
                    .await?
                    .call_max::<_, ProduceResponse>(ApiKey::Produce, &req, 11)
                    .await?;
                let err = r
                    .responses
                    .iter()
                    .flat_map(|t| t.partition_responses.iter())
                    .find(|p| p.error_code != 0)
                    .map(|p| {
                        (
                            p.index,
                            p.error_code,
                            p.error_message.as_ref().map(|m| m.to_string()),
                        )
                    });
                match err {
                    None => {
                        for pr in r
                            .responses
                            .iter()
                            .flat_map(|t| t.partition_responses.iter())
                        {
                            let Some(ts) = stamps.get(&pr.index) else {
                                continue;
                            };
                            for (i, t) in ts.iter().enumerate() {
                                acked.push(Acked {
                                    partition: pr.index,
                                    offset: pr.base_offset + i as i64,
                                    timestamp: if pr.log_append_time_ms >= 0 {
                                        pr.log_append_time_ms
                                    } else {
                                        *t
                                    },
                                });
                            }
                        }
                        break;
                    }
                    Some((_, code, _)) if retriable(code) && attempt < 5 => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                    }
                    Some((p, code, msg)) => {
                        let what = match msg {
                            Some(m) => format!("produce to {}-{p} ({m})", self.topic),
                            None => format!("produce to {}-{p}", self.topic),
                        };
                        check(code, &what)?;
                    }
                }
            }
        }
        Ok(acked)
    }
}
