//! Connections to a cluster: the bootstrap broker plus one per node that a
//! request must reach (a partition's leader, a group's or transaction's
//! coordinator), and Kafka's default partitioner.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::FindCoordinatorResponse;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::{ApiKey, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::conn::Client;
use crate::error::{check, retriable, ClientError};

pub(crate) fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Partition index → leader node id.
pub type Leaders = BTreeMap<i32, i32>;

/// What a coordinator coordinates (FindCoordinator's key type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorType {
    Group = 0,
    Transaction = 1,
}

/// Connections to a cluster: the bootstrap broker plus one per node asked for.
pub struct Cluster {
    bootstrap: String,
    brokers: HashMap<i32, String>,
    conns: HashMap<i32, Client>,
    boot: Client,
}

impl Cluster {
    pub async fn connect(bootstrap: &str) -> Result<Self, ClientError> {
        Ok(Self {
            bootstrap: bootstrap.to_string(),
            brokers: HashMap::new(),
            conns: HashMap::new(),
            boot: Client::connect(bootstrap).await?,
        })
    }

    /// The connection to the bootstrap broker.
    pub fn bootstrap(&mut self) -> &mut Client {
        &mut self.boot
    }

    /// The ids of the nodes learnt so far (from metadata and coordinator
    /// lookups), in order.
    pub fn node_ids(&self) -> Vec<i32> {
        let mut nodes: Vec<i32> = self.brokers.keys().copied().collect();
        nodes.sort_unstable();
        nodes
    }

    /// Every broker the cluster lists (a Metadata request for no topic), in
    /// order of id; their addresses are learnt for [`Self::node`].
    pub async fn brokers(&mut self) -> Result<Vec<i32>, ClientError> {
        let req = MetadataRequest::default()
            .with_allow_auto_topic_creation(false)
            .with_topics(Some(vec![]));
        let (md, _) = self
            .boot
            .call_max::<_, MetadataResponse>(ApiKey::Metadata, &req, 12)
            .await?;
        let mut ids = Vec::new();
        for b in &md.brokers {
            self.brokers
                .insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
            ids.push(b.node_id.0);
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// The address learnt for node `id`.
    pub fn address(&self, id: i32) -> Option<&str> {
        self.brokers.get(&id).map(String::as_str)
    }

    /// The partitions of `topic` and their leaders; `create` lets the cluster
    /// auto-create it (as producers do). Retries while leaders are unknown.
    pub async fn leaders(&mut self, topic: &str, create: bool) -> Result<Leaders, ClientError> {
        for attempt in 0..20 {
            let req = MetadataRequest::default()
                .with_allow_auto_topic_creation(create)
                .with_topics(Some(vec![
                    MetadataRequestTopic::default().with_name(Some(TopicName(s(topic))))
                ]));
            let (md, _) = self
                .boot
                .call_max::<_, MetadataResponse>(ApiKey::Metadata, &req, 12)
                .await?;
            for b in &md.brokers {
                self.brokers
                    .insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
            }
            let t = md
                .topics
                .first()
                .ok_or_else(|| ClientError::GaveUp(format!("no metadata for topic {topic}")))?;
            if t.error_code == 0 && !t.partitions.is_empty() {
                let leaders: Leaders = t
                    .partitions
                    .iter()
                    .map(|p| (p.partition_index, p.leader_id.0))
                    .collect();
                if leaders.values().all(|l| *l >= 0) {
                    return Ok(leaders);
                }
            } else if !retriable(t.error_code)
                || (t.error_code == ResponseError::UnknownTopicOrPartition.code() && !create)
            {
                check(t.error_code, &format!("topic {topic}"))?;
            }
            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
        }
        Err(ClientError::GaveUp(format!(
            "topic {topic}: no leader for every partition after 20 tries"
        )))
    }

    /// The connection to node `id` (the bootstrap one when the address matches).
    pub async fn node(&mut self, id: i32) -> Result<&mut Client, ClientError> {
        let addr = self.brokers.get(&id).cloned();
        match addr {
            None => Ok(&mut self.boot),
            Some(a) if a == self.bootstrap => Ok(&mut self.boot),
            Some(a) => match self.conns.entry(id) {
                Entry::Occupied(e) => Ok(e.into_mut()),
                Entry::Vacant(v) => {
                    let c = Client::connect(&a).await.map_err(|e| ClientError::Node {
                        id,
                        source: Box::new(e),
                    })?;
                    Ok(v.insert(c))
                }
            },
        }
    }

    /// The node that coordinates `key`.
    pub async fn coordinator(
        &mut self,
        key: &str,
        key_type: CoordinatorType,
    ) -> Result<i32, ClientError> {
        for attempt in 0..20 {
            let req = FindCoordinatorRequest::default()
                .with_key(s(key))
                .with_key_type(key_type as i8);
            let (r, _) = self
                .boot
                .call_max::<_, FindCoordinatorResponse>(ApiKey::FindCoordinator, &req, 3)
                .await?;
            if r.error_code == 0 {
                self.brokers
                    .insert(r.node_id.0, format!("{}:{}", r.host.as_str(), r.port));
                return Ok(r.node_id.0);
            }
            if !retriable(r.error_code) {
                check(r.error_code, &format!("find coordinator for {key}"))?;
            }
            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
        }
        Err(ClientError::GaveUp(format!(
            "no coordinator for {key} after 20 tries"
        )))
    }
}

/// Kafka's default partitioner hash (murmur2, seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition (of `partitions`) Kafka's default partitioner puts `key` in.
pub fn key_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // Values from Kafka's UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn keys_go_where_kafka_puts_them() {
        // toPositive(murmur2) % partitions, as Kafka's BuiltInPartitioner.
        assert_eq!(key_partition(b"21", 3), (-973932308i32 & 0x7fff_ffff) % 3);
        assert_eq!(
            key_partition(b"foobar", 7),
            (-790332482i32 & 0x7fff_ffff) % 7
        );
        assert_eq!(key_partition(b"abc", 1), 0);
        // no partitions known: everything in partition 0
        assert_eq!(key_partition(b"abc", 0), 0);
    }
}
