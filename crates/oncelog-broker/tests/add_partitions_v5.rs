//! AddPartitionsToTxn v4/v5 (the batched form Kafka brokers send each other,
//! with `verify_only`), over a real socket to an in-process server. No
//! third-party client sends these versions, so the requests are encoded
//! with the wire codec crate here.

use std::collections::BTreeMap;

use bytes::BytesMut;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::add_partitions_to_txn_response::AddPartitionsToTxnResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::{ApiKey, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use oncelog_broker::error::ErrorCode;
use oncelog_broker::{Broker, BrokerConfig};
use oncelog_client::frame::{decode_response, encode_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request at an exact `version` (these are broker-to-broker versions
/// that a client's version negotiation would not pick), framed by the
/// project's client library.
async fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    req: &Req,
) -> Resp {
    let mut buf = BytesMut::new();
    encode_request(&mut buf, key, version, 7, "test", req).unwrap();
    s.write_all(&buf).await.unwrap();
    let n = s.read_i32().await.unwrap() as usize;
    let mut resp = vec![0u8; n];
    s.read_exact(&mut resp).await.unwrap();
    decode_response(bytes::Bytes::from(resp), key, version, 7).unwrap()
}

fn txn(
    id: &str,
    pid: i64,
    epoch: i16,
    topic: &str,
    parts: Vec<i32>,
    verify_only: bool,
) -> AddPartitionsToTxnTransaction {
    AddPartitionsToTxnTransaction::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(id.into())))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_verify_only(verify_only)
        .with_topics(vec![AddPartitionsToTxnTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partitions(parts)])
}

const NONE: i16 = ErrorCode::None.code();
const INVALID_TXN_STATE: i16 = ErrorCode::InvalidTxnState.code();
const INVALID_PRODUCER_EPOCH: i16 = ErrorCode::InvalidProducerEpoch.code();
const UNKNOWN_TOPIC_OR_PARTITION: i16 = ErrorCode::UnknownTopicOrPartition.code();

fn codes(r: &AddPartitionsToTxnResponse) -> Vec<Vec<i16>> {
    r.results_by_transaction
        .iter()
        .map(|t| {
            t.topic_results
                .iter()
                .flat_map(|x| {
                    x.results_by_partition
                        .iter()
                        .map(|p| p.partition_error_code)
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_add_and_verify_only() {
    let d = tempfile::tempdir().unwrap();
    let mut m = BTreeMap::new();
    m.insert("data.dir".to_string(), d.path().display().to_string());
    m.insert("listen".to_string(), "127.0.0.1:0".to_string());
    let broker = Broker::open(BrokerConfig::from_map(&m).unwrap()).unwrap();
    broker
        .topics
        .create("t", 3, BTreeMap::new(), false)
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(oncelog_broker::protocol::server::serve(
        broker.clone(),
        listener,
        0,
        stop_rx,
    ));
    let mut s = TcpStream::connect(addr).await.unwrap();

    let init: InitProducerIdResponse = call(
        &mut s,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("a"))))
            .with_transaction_timeout_ms(60000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )
    .await;
    assert_eq!(init.error_code, NONE);
    let (pid, epoch) = (init.producer_id.0, init.producer_epoch);

    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![
        txn("a", pid, epoch, "t", vec![0], true),
        txn("a", pid, epoch, "t", vec![1, 2], false),
    ]);
    let r: AddPartitionsToTxnResponse = call(&mut s, ApiKey::AddPartitionsToTxn, 5, &req).await;
    assert_eq!(r.error_code, NONE);
    // Partition 0 was never added: verification fails (INVALID_TXN_STATE);
    // 1 and 2 are added.
    assert_eq!(codes(&r), vec![vec![INVALID_TXN_STATE], vec![NONE, NONE]]);

    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![
        txn("a", pid, epoch, "t", vec![1, 2], true),
        txn("a", pid, epoch - 1, "t", vec![1], true),
        txn("a", pid, epoch, "missing", vec![0], false),
    ]);
    let r: AddPartitionsToTxnResponse = call(&mut s, ApiKey::AddPartitionsToTxn, 4, &req).await;
    // Verified; an older epoch is stale (INVALID_PRODUCER_EPOCH); an unknown topic fails.
    assert_eq!(
        codes(&r),
        vec![
            vec![NONE, NONE],
            vec![INVALID_PRODUCER_EPOCH],
            vec![UNKNOWN_TOPIC_OR_PARTITION]
        ]
    );

    // A new producer with the same id fences the open transaction. The old
    // epoch is now stale everywhere — reported as such, never as
    // INVALID_TXN_STATE — and the new epoch has nothing open yet.
    let init2: InitProducerIdResponse = call(
        &mut s,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("a"))))
            .with_transaction_timeout_ms(60000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )
    .await;
    assert_eq!(
        (init2.error_code, init2.producer_id.0, init2.producer_epoch),
        (NONE, pid, epoch + 1)
    );
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![
        txn("a", pid, epoch, "t", vec![1], true),
        txn("a", pid, epoch + 1, "t", vec![1], true),
    ]);
    let r: AddPartitionsToTxnResponse = call(&mut s, ApiKey::AddPartitionsToTxn, 5, &req).await;
    assert_eq!(
        codes(&r),
        vec![vec![INVALID_PRODUCER_EPOCH], vec![INVALID_TXN_STATE]]
    );
}
