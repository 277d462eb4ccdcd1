//! Consumer lag: committed offsets against the last stable offset and the
//! high watermark, with an open transaction holding the LSO back.

use std::collections::BTreeMap;

use oncelog_broker::groups::OffsetMeta;
use oncelog_broker::{Broker, BrokerConfig, LagRow};
use oncelog_log::batch::BatchBuilder;

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
    {
        let mut st = p.lock();
        for _ in 0..10 {
            let mut b = BatchBuilder::new(1).record(0, None, Some(b"v")).build();
            st.append(&mut b).unwrap();
        }
        // An open transaction starting at offset 10.
        let mut tb = BatchBuilder::new(1).record(0, None, Some(b"t"));
        tb.producer_id = 5;
        tb.producer_epoch = 0;
        tb.base_sequence = 0;
        tb.attributes = oncelog_log::batch::ATTR_TRANSACTIONAL;
        let mut b = tb.build();
        let info = st.append(&mut b).unwrap();
        let h = oncelog_log::batch::BatchHeader::new(&b).unwrap();
        st.producers.apply_batch(
            &oncelog_broker::topics::producer_batch(&h),
            info.base_offset,
            info.last_offset,
        );
        for _ in 0..3 {
            let mut b = BatchBuilder::new(1).record(0, None, Some(b"v")).build();
            st.append(&mut b).unwrap();
        }
        p.advance_high_watermark(st.next_offset());
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
