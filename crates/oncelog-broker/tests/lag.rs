//! Consumer lag: committed offsets against the last stable offset and the
//! high watermark, with an open transaction holding the LSO back.

use std::collections::BTreeMap;
use std::sync::Arc;

use oncelog_broker::backend::local::partition::{producer_batch, Partition};
use oncelog_broker::coordinators::groups::OffsetMeta;
use oncelog_broker::{Broker, BrokerConfig, LagRow};
use oncelog_log::batch::BatchBuilder;

/// Appends `data` as a client's produce would (a transactional batch is
/// taken as verified) and waits until it is durable.
async fn append(p: &Arc<Partition>, mut data: Vec<u8>) {
    let h = oncelog_log::batch::BatchHeader::new(&data).unwrap();
    let pb = (h.producer_id() >= 0).then(|| producer_batch(&h));
    let done = p.append(&mut data, pb.as_ref(), &|_| Ok(())).unwrap();
    if let Some(rx) = done.durable {
        rx.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_is_measured_against_lso_and_high_watermark() {
    let d = tempfile::tempdir().unwrap();
    let mut m = BTreeMap::new();
    m.insert("data.dir".to_string(), d.path().display().to_string());
    let broker = Broker::open(BrokerConfig::from_map(&m).unwrap()).unwrap();
    let topic = broker
        .topics
        .create("t", 1, BTreeMap::new(), false)
        .unwrap();
    let p = topic.partition(0).unwrap();
    for _ in 0..10 {
        append(&p, BatchBuilder::new(1).record(0, None, Some(b"v")).build()).await;
    }
    // An open transaction starting at offset 10.
    let mut tb = BatchBuilder::new(1).record(0, None, Some(b"t"));
    tb.producer_id = 5;
    tb.producer_epoch = 0;
    tb.base_sequence = 0;
    tb.attributes = oncelog_log::batch::ATTR_TRANSACTIONAL;
    append(&p, tb.build()).await;
    for _ in 0..3 {
        append(&p, BatchBuilder::new(1).record(0, None, Some(b"v")).build()).await;
    }
    let code = broker
        .groups
        .commit(
            "g",
            -1,
            "",
            None,
            vec![(
                "t".to_string(),
                0,
                OffsetMeta {
                    offset: 4,
                    leader_epoch: -1,
                    metadata: None,
                    commit_ms: 0,
                },
            )],
        )
        .await;
    assert_eq!(code, oncelog_broker::error::ErrorCode::None);
    assert_eq!(
        broker.group_lag("g").await,
        vec![LagRow {
            topic: "t".into(),
            partition: 0,
            committed: 4,
            last_stable_offset: 10,
            high_watermark: 14,
            lag_committed: 6,
            lag_uncommitted: 10,
        }]
    );
    assert!(broker.group_lag("nobody").await.is_empty());
}
