//! Cluster mode's storage backend against a real PostgreSQL server and a
//! real S3-compatible server (s3proxy), and against a `file://` directory.
//!
//! The services come from `scripts/services.sh` (test.sh starts them and
//! exports `ONCELOG_TEST_PG` and `ONCELOG_TEST_S3_*`). Each test makes a
//! database of its own on that server, so the tests run in parallel.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use oncelog_broker::backend::cluster::collector::collect;
use oncelog_broker::backend::cluster::flusher::Flusher;
use oncelog_broker::backend::cluster::groups::{self as cluster_groups, Claim, Ownership};
use oncelog_broker::backend::cluster::reader::{read_many, Ask, ClusterRead, ReadRefusal, Source};
use oncelog_broker::backend::cluster::sequencer::{self, BatchOutcome};
use oncelog_broker::backend::cluster::{catalogue, session, Cluster, ClusterConfig, ClusterError};
use oncelog_broker::coordinators::groups::OffsetMeta;
use oncelog_broker::machines::producer_state::ProduceReject;

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| {
        panic!(
            "{k} is not set: these tests need PostgreSQL and s3proxy; run them through test.sh, \
             or first `eval \"$(bash scripts/services.sh start /tmp/oncelog-services)\"`"
        )
    })
}

/// A new, empty database on the test server; its URL.
async fn fresh_db() -> String {
    let admin = env("ONCELOG_TEST_PG");
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(conn);
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// `s3://bucket/<fresh prefix>` on the test s3proxy (credentials through
/// the AWS_* variables object_store reads).
fn s3_url() -> String {
    std::env::set_var("AWS_ENDPOINT", env("ONCELOG_TEST_S3_ENDPOINT"));
    std::env::set_var("AWS_ACCESS_KEY_ID", env("ONCELOG_TEST_S3_KEY"));
    std::env::set_var("AWS_SECRET_ACCESS_KEY", env("ONCELOG_TEST_S3_SECRET"));
    std::env::set_var("AWS_REGION", "us-east-1");
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    format!(
        "s3://{}/t-{}",
        env("ONCELOG_TEST_S3_BUCKET"),
        uuid::Uuid::new_v4().simple()
    )
}

fn file_url(dir: &tempfile::TempDir) -> String {
    format!("file://{}", dir.path().display())
}

async fn broker(db: &str, store: &str, id: i32) -> Arc<Cluster> {
    let mut c = ClusterConfig::new(db, store, id);
    c.flush_interval = Duration::from_millis(3);
    Cluster::connect(c)
        .await
        .expect("connect the cluster backend")
}

/// A batch of `n` records `"{tag}-{i}"`, with a producer when `pid >= 0`.
fn batch(tag: &str, n: usize, pid: i64, epoch: i16, seq: i32) -> Bytes {
    let recs: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: pid,
            producer_epoch: if pid >= 0 { epoch } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: if pid >= 0 {
                seq + i as i32
            } else {
                i as i32 - 1
            },
            timestamp: 1_700_000_000_000 + i as i64,
            key: None,
            value: Some(Bytes::from(format!("{tag}-{i}"))),
            headers: Default::default(),
        })
        .collect();
    encode(&recs)
}

/// A batch without a producer of (key, value) records (None: a tombstone).
fn keyed_batch(kvs: &[(String, Option<String>)]) -> Bytes {
    let recs: Vec<Record> = kvs
        .iter()
        .enumerate()
        .map(|(i, (k, v))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // as `batch` does: the encoder splits a batch where sequences break
            sequence: i as i32 - 1,
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from(k.clone())),
            value: v.clone().map(Bytes::from),
            headers: Default::default(),
        })
        .collect();
    encode(&recs)
}

fn encode(recs: &[Record]) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        recs.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encode");
    buf.freeze()
}

/// Every (offset, value) of a partition, read through `c`.
async fn read_all(c: &Cluster, t: &uuid::Uuid, p: i32) -> Vec<(i64, String)> {
    read_records(c, t, p)
        .await
        .into_iter()
        .map(|(o, _, v)| (o, v.expect("a value")))
        .collect()
}

/// One partition's Fetch read through `c` ([`read_many`] with one ask):
/// from `offset`, up to `max_bytes` (one batch at least).
async fn read(
    c: &Cluster,
    topic_id: &uuid::Uuid,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    read_committed: bool,
) -> Result<Option<ClusterRead>, oncelog_broker::backend::cluster::ClusterError> {
    let ask = Ask {
        topic_id: *topic_id,
        partition,
        offset,
        max_bytes,
    };
    let mut budget = oncelog_broker::backend::Budget::new(max_bytes);
    let mut answers = read_many(c, &[ask], &mut budget, read_committed, Source::Cache).await?;
    answers.pop().expect("one answer")
}

/// Every (offset, key, value) of a partition, read through `c`.
async fn read_records(
    c: &Cluster,
    t: &uuid::Uuid,
    p: i32,
) -> Vec<(i64, Option<String>, Option<String>)> {
    let text = |b: Option<Bytes>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let r = read(c, t, p, at, 64 << 10, false)
            .await
            .expect("read")
            .expect("partition exists");
        if at < r.log_start_offset {
            at = r.log_start_offset;
            continue;
        }
        let data = r.data.expect("in range");
        if data.is_empty() {
            assert_eq!(
                at, r.high_watermark,
                "an empty read below the high watermark"
            );
            return out;
        }
        let mut buf = Bytes::from(data);
        let before = at;
        for set in RecordBatchDecoder::decode_all(&mut buf).expect("decode what was served") {
            for rec in set.records {
                out.push((rec.offset, text(rec.key), text(rec.value)));
                at = rec.offset + 1;
            }
        }
        assert!(at > before, "a read at {before} served nothing past it");
    }
}

fn appended(o: &BatchOutcome) -> i64 {
    match o {
        BatchOutcome::Appended { base_offset, .. } => *base_offset,
        other => panic!("expected Appended, got {other:?}"),
    }
}

async fn round_trip(store: String) {
    let db = fresh_db().await;
    let b1 = broker(&db, &store, 1).await;
    let topic = catalogue::create_topic(&b1.pool, "orders", 3, &BTreeMap::new(), 1000)
        .await
        .expect("create topic");
    let again = catalogue::create_topic(&b1.pool, "orders", 3, &BTreeMap::new(), 1000).await;
    assert!(
        again.is_err(),
        "a second create of the same name is refused"
    );
    let f = Flusher::start(b1.clone());

    // Plain batches on every partition, concurrently: they share flushes.
    let mut tasks = Vec::new();
    let f = Arc::new(f);
    for p in 0..3 {
        for i in 0..10 {
            let f = f.clone();
            let id = topic.id;
            tasks.push(tokio::spawn(async move {
                f.produce(id, "t", p, batch(&format!("p{p}b{i}"), 3, -1, -1, 0))
                    .await
            }));
        }
    }
    for t in tasks {
        appended(&t.await.unwrap().expect("committed"));
    }
    assert!(
        f.stats.flushes.load(std::sync::atomic::Ordering::Relaxed) < 30,
        "30 concurrent batches were gathered into fewer flushes"
    );

    // An idempotent producer: in order, a retry, a gap, an old epoch.
    let pid = 4242;
    let a = appended(
        &f.produce(topic.id, "t", 0, batch("idem0", 2, pid, 3, 0))
            .await
            .unwrap(),
    );
    let b = appended(
        &f.produce(topic.id, "t", 0, batch("idem1", 2, pid, 3, 2))
            .await
            .unwrap(),
    );
    assert_eq!(b, a + 2);
    match f
        .produce(topic.id, "t", 0, batch("idem0", 2, pid, 3, 0))
        .await
        .unwrap()
    {
        BatchOutcome::Duplicate { base_offset, .. } => assert_eq!(base_offset, a),
        o => panic!("a retry must be answered as a duplicate, got {o:?}"),
    }
    match f
        .produce(topic.id, "t", 0, batch("gap", 1, pid, 3, 9))
        .await
        .unwrap()
    {
        BatchOutcome::Rejected(ProduceReject::OutOfOrderSequence {
            got: 9,
            expected: 4,
        }) => {}
        o => panic!("a sequence gap must be refused, got {o:?}"),
    }
    match f
        .produce(topic.id, "t", 0, batch("zombie", 1, pid, 2, 4))
        .await
        .unwrap()
    {
        BatchOutcome::Rejected(ProduceReject::InvalidProducerEpoch { got: 2, current: 3 }) => {}
        o => panic!("an older epoch must be refused, got {o:?}"),
    }
    // Unknown partition: refused, nothing else disturbed.
    assert_eq!(
        f.produce(topic.id, "t", 7, batch("nowhere", 1, -1, -1, 0))
            .await
            .unwrap(),
        BatchOutcome::UnknownPartition
    );

    // Every partition reads back complete and in order, through this broker
    // (its cache) and through a second broker (object GETs).
    let b2 = broker(&db, &store, 2).await;
    for p in 0..3 {
        let mine = read_all(&b1, &topic.id, p).await;
        let theirs = read_all(&b2, &topic.id, p).await;
        assert_eq!(mine, theirs, "two brokers serve partition {p} alike");
        let offsets: Vec<i64> = mine.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, (0..offsets.len() as i64).collect::<Vec<_>>());
        let want = 30 + if p == 0 { 4 } else { 0 };
        assert_eq!(mine.len(), want, "partition {p}");
        let values: BTreeSet<&str> = mine.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(values.len(), want, "no record twice");
        assert!(!values.contains("gap-0") && !values.contains("zombie-0"));
    }
    assert!(
        b2.objects
            .stats
            .gets
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    // Beyond the high watermark: out of range.
    let r = read(&b2, &topic.id, 1, 31, 1 << 20, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.data.unwrap_err(), ReadRefusal::OutOfRange);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_s3() {
    round_trip(s3_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_a_shared_directory() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(file_url(&dir)).await;
}

/// Two brokers writing one partition at once (the strongest "take-over":
/// neither waits for the other) never acknowledge the same offset, and the
/// partition holds exactly what was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_racing_on_one_partition_never_ack_the_same_offset() {
    let db = fresh_db().await;
    let store = s3_url();
    let b1 = broker(&db, &store, 1).await;
    let b2 = broker(&db, &store, 2).await;
    let topic = catalogue::create_topic(&b1.pool, "race", 1, &BTreeMap::new(), 1000)
        .await
        .unwrap();
    let flushers = [
        Arc::new(Flusher::start(b1.clone())),
        Arc::new(Flusher::start(b2.clone())),
    ];
    let mut tasks = Vec::new();
    for (bi, f) in flushers.iter().enumerate() {
        for i in 0..150 {
            let f = f.clone();
            let id = topic.id;
            tasks.push(tokio::spawn(async move {
                let tag = format!("b{bi}-{i}");
                let o = f.produce(id, "t", 0, batch(&tag, 2, -1, -1, 0)).await;
                (tag, o)
            }));
        }
    }
    let mut acked: BTreeMap<i64, String> = BTreeMap::new();
    for t in tasks {
        let (tag, o) = t.await.unwrap();
        let base = appended(&o.expect("committed"));
        assert!(
            acked.insert(base, tag.clone()).is_none(),
            "offset {base} acknowledged twice"
        );
    }
    // Acknowledged ranges tile [0, 600) with no overlap.
    let bases: Vec<i64> = acked.keys().copied().collect();
    assert_eq!(bases, (0..300).map(|i| i * 2).collect::<Vec<_>>());
    let log = read_all(&b1, &topic.id, 0).await;
    assert_eq!(log.len(), 600);
    for (base, tag) in &acked {
        assert_eq!(log[*base as usize], (*base, format!("{tag}-0")));
        assert_eq!(log[*base as usize + 1], (*base + 1, format!("{tag}-1")));
    }
}

/// A broker whose lease ran out (paused past it), or whose id registered a
/// newer session, gets nothing committed; what it wrote is invisible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_past_its_lease_or_session_is_fenced() {
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let store = file_url(&dir);
    let mut cfg = ClusterConfig::new(&db, &store, 1);
    cfg.lease = Duration::from_millis(400);
    cfg.flush_interval = Duration::from_millis(2);
    let paused = Cluster::connect(cfg).await.unwrap();
    let topic = catalogue::create_topic(&paused.pool, "fares", 1, &BTreeMap::new(), 1000)
        .await
        .unwrap();
    let f = Flusher::start(paused.clone());
    appended(
        &f.produce(topic.id, "t", 0, batch("before", 1, -1, -1, 0))
            .await
            .unwrap(),
    );
    // No renewal (the broker is "paused") past the lease: PostgreSQL's clock
    // says the lease ended, whatever this broker believes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // PostgreSQL's fencing check refuses the session by itself...
    {
        let client = paused.pool.get().await.unwrap();
        let fenced = session::check_fence(&**client, 1, paused.session.session()).await;
        assert!(
            matches!(fenced, Err(ClusterError::Fenced { .. })),
            "{fenced:?}"
        );
    }
    // ...and the broker's own deadline (3/4 of the lease since its last
    // renewal, on its monotonic clock) has passed too: it stops by itself.
    assert!(
        !paused.session.is_live(),
        "the broker's local deadline did not pass"
    );
    match f
        .produce(topic.id, "t", 0, batch("late", 1, -1, -1, 0))
        .await
    {
        Err(e) => assert!(
            matches!(
                *e,
                ClusterError::Fenced { .. } | ClusterError::LeaseUnproven { .. }
            ),
            "{e}"
        ),
        Ok(o) => panic!("a write past the lease was committed: {o:?}"),
    }
    // Renewing now fails too: the session is over.
    assert!(paused.session.renew(&paused.pool).await.is_err());
    assert!(!paused.session.is_live());

    // The same id starts again elsewhere (a new session); the old session's
    // commits fail even though the id is live again.
    let old_session = paused.session.session();
    let again = broker(&db, &store, 1).await;
    assert!(again.session.session() > old_session);
    let client = paused.pool.get().await.unwrap();
    let fenced = session::check_fence(&**client, 1, old_session).await;
    assert!(matches!(fenced, Err(ClusterError::Fenced { .. })));
    let g = Flusher::start(again.clone());
    appended(
        &g.produce(topic.id, "t", 0, batch("after", 1, -1, -1, 0))
            .await
            .unwrap(),
    );
    let log = read_all(&again, &topic.id, 0).await;
    assert_eq!(
        log,
        vec![(0, "before-0".to_string()), (1, "after-0".to_string())],
        "the fenced write left no trace"
    );
    let live = session::live_brokers(&again.pool).await.unwrap();
    assert_eq!(live.len(), 1);
}

/// A broker stopped inside a transaction (here: one that takes a partition's
/// row lock and then does nothing, as SIGSTOP would leave it) does not block
/// the other brokers' commits to that partition for longer than its lease:
/// PostgreSQL ends the idle transaction, and the stopped broker's commit
/// fails instead of landing late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_by_a_stopped_broker_ends_after_the_lease() {
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let store = file_url(&dir);
    let mut cfg = ClusterConfig::new(&db, &store, 1);
    cfg.lease = Duration::from_millis(1000);
    let stopped = Cluster::connect(cfg).await.unwrap();
    let topic = catalogue::create_topic(&stopped.pool, "fares", 1, &BTreeMap::new(), 1000)
        .await
        .unwrap();
    let mut held = stopped.pool.get().await.unwrap();
    let setting: String = held
        .query_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "1s", "the pool's sessions carry the lease");
    let tx = held.transaction().await.unwrap();
    tx.execute(
        "SELECT next_offset FROM partitions WHERE topic_id = $1 AND partition = 0 FOR UPDATE",
        &[&topic.id],
    )
    .await
    .unwrap();

    let other = broker(&db, &store, 2).await;
    let f = Flusher::start(other.clone());
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        f.produce(topic.id, "fares", 0, batch("other", 1, -1, -1, 0)),
    )
    .await
    .expect("the commit waited past three leases")
    .unwrap();
    appended(&out);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the commit did not wait for the lock at all ({:?})",
        started.elapsed()
    );
    // The stopped broker wakes up: its transaction is gone.
    let late = tx
        .execute(
            "UPDATE partitions SET next_offset = next_offset + 100 \
             WHERE topic_id = $1 AND partition = 0",
            &[&topic.id],
        )
        .await;
    assert!(late.is_err(), "an idle transaction outlived the lease");
    drop(tx);
    drop(held);
    let log = read_all(&other, &topic.id, 0).await;
    assert_eq!(log, vec![(0, "other-0".to_string())]);
}

/// A group has one live coordinator: a second broker is told where it is;
/// two brokers claiming a new group at once get one owner; once the owner's
/// lease ends another broker takes the group over, and the old owner's
/// offset commits fail from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_has_one_live_coordinator_and_a_stopped_one_commits_nothing() {
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let store = file_url(&dir);
    let mut cfg = ClusterConfig::new(&db, &store, 1);
    cfg.lease = Duration::from_millis(500);
    let first = Cluster::connect(cfg).await.unwrap();
    let second = broker(&db, &store, 2).await;
    let (o1, o2) = (Ownership::default(), Ownership::default());
    assert_eq!(o1.coordinate(&first, "g").await.unwrap(), Claim::Claimed);
    assert_eq!(o1.coordinate(&first, "g").await.unwrap(), Claim::Held);
    assert_eq!(
        o2.coordinate(&second, "g").await.unwrap(),
        Claim::Elsewhere(1)
    );
    assert_eq!(cluster_groups::owner(&second, "g").await.unwrap(), Some(1));
    let meta = |offset| OffsetMeta {
        offset,
        leader_epoch: -1,
        metadata: None,
        commit_ms: 0,
    };
    cluster_groups::commit_offsets(&first, "g", &[("t".into(), 0, meta(5))])
        .await
        .unwrap();
    // The second broker is not the coordinator: it commits nothing.
    assert!(
        cluster_groups::commit_offsets(&second, "g", &[("t".into(), 0, meta(6))])
            .await
            .is_err()
    );

    // The first broker stops renewing; past its lease the group moves.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(cluster_groups::owner(&second, "g").await.unwrap(), None);
    assert_eq!(o2.coordinate(&second, "g").await.unwrap(), Claim::Claimed);
    let late = cluster_groups::commit_offsets(&first, "g", &[("t".into(), 0, meta(99))]).await;
    assert!(late.is_err(), "a former coordinator committed offsets");
    cluster_groups::commit_offsets(
        &second,
        "g",
        &[
            ("t".into(), 0, meta(7)),
            ("t".into(), 1, meta(3)),
            ("t".into(), 0, meta(8)),
        ],
    )
    .await
    .unwrap();
    let got = cluster_groups::fetch_offsets(&second, "g", None, true)
        .await
        .unwrap();
    assert_eq!(
        got.iter()
            .map(|f| (f.topic.as_str(), f.partition, f.offset))
            .collect::<Vec<_>>(),
        vec![("t", 0, 8), ("t", 1, 3)],
        "the last of duplicates wins; the late commit left nothing"
    );
    let asked =
        cluster_groups::fetch_offsets(&second, "g", Some(vec![("t".into(), vec![1, 2])]), false)
            .await
            .unwrap();
    assert_eq!(
        asked.iter().map(|f| f.offset).collect::<Vec<_>>(),
        vec![3, -1]
    );

    // Two brokers claiming one new group at the same moment: one owner.
    let third = broker(&db, &store, 3).await;
    let (o3, o4) = (Ownership::default(), Ownership::default());
    let (a, b) = tokio::join!(o2.coordinate(&second, "h"), o3.coordinate(&third, "h"));
    let mut claims = [a.unwrap(), b.unwrap()];
    claims.sort_by_key(|c| matches!(c, Claim::Elsewhere(_)));
    assert_eq!(claims[0], Claim::Claimed, "{claims:?}");
    assert!(matches!(claims[1], Claim::Elsewhere(_)), "{claims:?}");
    assert!(matches!(
        o4.coordinate(&third, "h").await.unwrap(),
        Claim::Held | Claim::Elsewhere(_)
    ));
}

/// The collector, going by PostgreSQL's rows (no bucket listing), removes
/// an object whose commit never happened once its key slab is closed for
/// the grace period or its session is over (and then that commit cannot
/// happen), leaves a live session's open slab alone, keeps committed
/// objects, and removes objects of a deleted topic once no batch row names
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_removes_only_what_no_commit_can_name() {
    let db = fresh_db().await;
    let store = s3_url();
    let b = broker(&db, &store, 1).await;
    let topic = catalogue::create_topic(&b.pool, "gc", 1, &BTreeMap::new(), 1000)
        .await
        .unwrap();
    let f = Flusher::start(b.clone());
    appended(
        &f.produce(topic.id, "t", 0, batch("kept", 1, -1, -1, 0))
            .await
            .unwrap(),
    );

    // A flush that wrote its object but was never committed.
    let session = b.session.session();
    let key = b.keys.next(&b.pool, session).await.unwrap();
    let data = batch("orphan", 1, -1, -1, 0);
    b.objects.put(&key.key, data.clone()).await.unwrap();

    // The broker's open slab of a live session is left alone, whatever the
    // grace.
    let r = collect(&b, Duration::ZERO).await.unwrap();
    assert_eq!(
        (r.waiting, r.slabs, r.removed_uncommitted),
        (1, 0, 0),
        "{r:?}"
    );
    assert_eq!(b.objects.list_data().await.unwrap().len(), 2);
    // Closed (the broker moved on to a new slab): left alone inside the
    // grace period, collected after it.
    let c = b.pool.get().await.unwrap();
    c.execute(
        "UPDATE object_slabs SET closed_at = clock_timestamp() WHERE broker_id = 1",
        &[],
    )
    .await
    .unwrap();
    let r = collect(&b, Duration::from_secs(3600)).await.unwrap();
    assert_eq!((r.waiting, r.slabs), (1, 0), "{r:?}");
    let r = collect(&b, Duration::ZERO).await.unwrap();
    // Every key of the slab but the committed one had no objects row.
    let unused = oncelog_broker::backend::cluster::keys::SLAB_KEYS as usize - 1;
    assert_eq!((r.slabs, r.removed_uncommitted), (1, unused), "{r:?}");
    assert_eq!(b.objects.list_data().await.unwrap().len(), 1);
    // The late commit of the collected object fails: no half-visible batch.
    let h = oncelog_log::batch::BatchHeader::new(&data).unwrap();
    let late = sequencer::commit_flush(
        &b.pool,
        &|t, p, n| b.check_next(t, p, n),
        true,
        &key,
        data.len() as u64,
        &[sequencer::FlushBatch {
            topic_id: topic.id,
            topic: Arc::from("gc"),
            partition: 0,
            position: 0,
            length: data.len() as u32,
            last_offset_delta: h.last_offset_delta(),
            max_timestamp: h.max_timestamp(),
            producer: None,
        }],
    )
    .await;
    assert!(matches!(late, Err(ClusterError::IntentGone(_))), "{late:?}");
    assert_eq!(read_all(&b, &topic.id, 0).await.len(), 1);
    // Running it again changes nothing.
    let r = collect(&b, Duration::ZERO).await.unwrap();
    assert_eq!(r, Default::default(), "{r:?}");
    assert_eq!(b.objects.list_data().await.unwrap().len(), 1);

    // A session that is over: its slab is collected at once (no commit of
    // it can pass the fence any more).
    let other = broker(&db, &store, 2).await;
    let s2 = other.session.session();
    let k2 = other.keys.next(&other.pool, s2).await.unwrap();
    other.objects.put(&k2.key, data.clone()).await.unwrap();
    c.execute(
        "UPDATE brokers SET lease_expires_at = clock_timestamp() WHERE id = 2",
        &[],
    )
    .await
    .unwrap();
    let r = collect(&b, Duration::from_secs(3600)).await.unwrap();
    assert_eq!((r.slabs, r.removed_uncommitted), (1, unused + 1), "{r:?}");
    assert_eq!(b.objects.list_data().await.unwrap().len(), 1);

    // A deleted topic's objects go once no batch row has named them for
    // the grace period (a fetch that read the index a moment before the
    // delete still finds its object).
    catalogue::delete_topic(&b.pool, "gc", None).await.unwrap();
    let r = collect(&b, Duration::from_secs(3600)).await.unwrap();
    assert_eq!((r.waiting, r.removed_unreferenced), (1, 0), "{r:?}");
    assert_eq!(b.objects.list_data().await.unwrap().len(), 1);
    let r = collect(&b, Duration::ZERO).await.unwrap();
    assert_eq!(r.removed_unreferenced, 1, "{r:?}");
    assert!(b.objects.list_data().await.unwrap().is_empty());
}

/// Small objects are merged per partition: a partition's batches move into
/// one object of its own, every record at its offset; a second run changes
/// nothing; the other partition is left until its own turn; and the old
/// objects go with the collector once no row names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_objects_are_merged_per_partition() {
    use oncelog_broker::backend::cluster::merger::{merge, Merged};
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let store = file_url(&dir);
    let b = broker(&db, &store, 1).await;
    let topic = catalogue::create_topic(&b.pool, "m", 2, &BTreeMap::new(), 1000)
        .await
        .unwrap();
    let f = Flusher::start(b.clone());
    // One flush, one object, for each batch.
    for i in 0..40 {
        appended(
            &f.produce(topic.id, "m", i % 2, batch(&format!("r{i}"), 1, -1, -1, 0))
                .await
                .unwrap(),
        );
    }
    let before: Vec<_> = [
        read_all(&b, &topic.id, 0).await,
        read_all(&b, &topic.id, 1).await,
    ]
    .to_vec();
    assert_eq!(before[0].len(), 20);
    assert_eq!(b.objects.list_data().await.unwrap().len(), 40);

    let t = catalogue::topic(&b.pool, "m").await.unwrap().unwrap();
    let m = merge(&b, &t, 0, Duration::ZERO).await.unwrap();
    assert_eq!((m.objects_written, m.batches_moved), (1, 20), "{m:?}");
    assert_eq!(
        merge(&b, &t, 0, Duration::ZERO).await.unwrap(),
        Merged::default()
    );
    // Too young to merge: left alone.
    assert_eq!(
        merge(&b, &t, 1, Duration::from_secs(3600)).await.unwrap(),
        Merged::default()
    );
    assert_eq!(read_all(&b, &topic.id, 0).await, before[0]);
    assert_eq!(read_all(&b, &topic.id, 1).await, before[1]);
    let m = merge(&b, &t, 1, Duration::ZERO).await.unwrap();
    assert_eq!((m.objects_written, m.batches_moved), (1, 20), "{m:?}");
    assert_eq!(read_all(&b, &topic.id, 1).await, before[1]);

    // No row names the 40 flush objects any more.
    let mut removed = 0;
    for _ in 0..2 {
        removed += collect(&b, Duration::ZERO)
            .await
            .unwrap()
            .removed_unreferenced;
    }
    assert_eq!(removed, 40);
    assert_eq!(b.objects.list_data().await.unwrap().len(), 2);
    // Read from the merged objects alone (a fresh broker has nothing cached).
    let other = broker(&db, &store, 2).await;
    assert_eq!(read_all(&other, &topic.id, 0).await, before[0]);
    assert_eq!(read_all(&other, &topic.id, 1).await, before[1]);
}

/// Two brokers compacting one partition at once, while a third writes on
/// and DeleteRecords moves the log start: no pass ever drops a record that
/// is some key's latest, every record keeps its offset, and once writing
/// stops a last pass leaves exactly one record per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_compaction_passes_never_lose_a_keys_latest_record() {
    use oncelog_broker::backend::cluster::compactor::{compact, Settings};
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let store = file_url(&dir);
    let b1 = broker(&db, &store, 1).await;
    let b2 = broker(&db, &store, 2).await;
    let b3 = broker(&db, &store, 3).await;
    let configs: BTreeMap<String, String> = [("cleanup.policy".into(), "compact".into())].into();
    let topic = catalogue::create_topic(&b1.pool, "compact-race", 1, &configs, 1000)
        .await
        .unwrap();
    let writer = Arc::new(Flusher::start(b3.clone()));
    let s = Settings {
        min_cleanable_ratio: 0.0,
        delete_retention_ms: 0,
        min_compaction_lag_ms: 0,
        max_compaction_lag_ms: -1,
        map_entries: 1 << 16,
    };
    let now = || oncelog_log::now_ms();
    // offset → (key, value) as written
    let mut written: BTreeMap<i64, (String, Option<String>)> = BTreeMap::new();
    let write_round = |round: usize| {
        let w = writer.clone();
        let id = topic.id;
        async move {
            let kvs: Vec<(String, Option<String>)> = (0..10)
                .map(|k| {
                    let v = (round % 7 != 3 || k != 4).then(|| format!("r{round}-k{k}"));
                    (format!("k{k}"), v)
                })
                .collect();
            let o = w
                .produce(id, "compact-race", 0, keyed_batch(&kvs))
                .await
                .expect("committed");
            (appended(&o), kvs)
        }
    };
    for round in 0..30 {
        let (base, kvs) = write_round(round).await;
        for (i, kv) in kvs.into_iter().enumerate() {
            written.insert(base + i as i64, kv);
        }
    }
    let mut passes = 0;
    for round in 30..60 {
        let (p1, p2, (base, kvs)) = tokio::join!(
            compact(&b1, &topic, 0, s, now()),
            compact(&b2, &topic, 0, s, now()),
            write_round(round)
        );
        passes += p1.expect("pass on broker 1").is_some() as usize;
        passes += p2.expect("pass on broker 2").is_some() as usize;
        for (i, kv) in kvs.into_iter().enumerate() {
            written.insert(base + i as i64, kv);
        }
        if round == 45 {
            let r =
                oncelog_broker::backend::cluster::records::delete_records(&b3, topic.id, 0, 100)
                    .await
                    .unwrap();
            assert_eq!(r, Ok(100));
        }
        // What is served is always a subset of what was written, at the
        // same offsets, holding every key's latest record.
        let log = read_records(&b1, &topic.id, 0).await;
        let mut latest: BTreeMap<String, i64> = BTreeMap::new();
        for (off, (k, _)) in &written {
            latest.insert(k.clone(), *off);
        }
        for (off, k, v) in &log {
            assert_eq!(
                written.get(off),
                Some(&(k.clone().unwrap(), v.clone())),
                "offset {off} serves what was not written there"
            );
        }
        let served: BTreeSet<i64> = log.iter().map(|r| r.0).collect();
        for (k, off) in &latest {
            // A tombstone may go once past the horizon (0 ms here).
            let tomb = written[off].1.is_none();
            assert!(
                served.contains(off) || tomb,
                "key {k}'s latest record at {off} is gone (round {round})"
            );
            if tomb && !served.contains(off) {
                assert!(
                    log.iter().all(|r| r.1.as_deref() != Some(k.as_str())),
                    "key {k} came back after its tombstone went (round {round})"
                );
            }
        }
    }
    assert!(passes > 0, "no compaction pass ran");
    // Writing stopped: passes until there is nothing left to clean.
    while compact(&b1, &topic, 0, s, now()).await.unwrap().is_some() {}
    let log = read_records(&b1, &topic.id, 0).await;
    let mut expect: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
    for (off, (k, v)) in &written {
        expect.insert(k.clone(), (*off, v.clone()));
    }
    let got: BTreeMap<String, (i64, Option<String>)> = log
        .iter()
        .map(|(o, k, v)| (k.clone().unwrap(), (*o, v.clone())))
        .collect();
    assert_eq!(
        got.len(),
        log.len(),
        "one record per key after the last pass"
    );
    for (k, (off, v)) in &expect {
        if v.is_some() {
            assert_eq!(got.get(k), Some(&(*off, v.clone())), "key {k}");
        }
    }
}

/// A database of schema version 1 is brought up to date by the next
/// broker (its added columns only when missing, twice is harmless); a
/// database newer than this build is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_upgraded_and_a_newer_one_refused() {
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let b = broker(&db, &file_url(&dir), 1).await;
    // back to what a version-1 broker left
    b.pool
        .get()
        .await
        .unwrap()
        .batch_execute(
            "ALTER TABLE brokers DROP COLUMN listeners; \
             ALTER TABLE objects DROP COLUMN unreferenced_since; \
             DROP TABLE security_docs; \
             UPDATE oncelog_meta SET value = '1' WHERE key = 'schema_version'",
        )
        .await
        .unwrap();
    let pool = b.pool.clone();
    for _ in 0..2 {
        oncelog_broker::backend::cluster::schema::migrate(&pool)
            .await
            .unwrap();
    }
    let client = pool.get().await.unwrap();
    let v: String = client
        .query_one(
            "SELECT value FROM oncelog_meta WHERE key = 'schema_version'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        v,
        oncelog_broker::backend::cluster::schema::SCHEMA_VERSION.to_string()
    );
    for (table, column) in [
        ("brokers", "listeners"),
        ("objects", "unreferenced_since"),
        ("security_docs", "version"),
    ] {
        let n = client
            .query(
                "SELECT 1 FROM information_schema.columns WHERE table_name = $1 AND column_name = $2",
                &[&table, &column],
            )
            .await
            .unwrap()
            .len();
        assert_eq!(n, 1, "{table}.{column}");
    }
    client
        .execute(
            "UPDATE oncelog_meta SET value = '99' WHERE key = 'schema_version'",
            &[],
        )
        .await
        .unwrap();
    let e = oncelog_broker::backend::cluster::schema::migrate(&pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("schema version 99"), "{e}");
}

/// A broker starting beside brokers that write takes none of the table
/// locks their commits conflict with: with a writer's transaction open
/// (ROW EXCLUSIVE on `batches`, as every flush commit holds) a second
/// broker connects at once. Its schema DDL once ran at every start, and
/// `CREATE INDEX IF NOT EXISTS` waited for `batches`' SHARE lock (and
/// deadlocked with a flush under a running Flink job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_starting_beside_writers_takes_no_table_lock() {
    let db = fresh_db().await;
    let dir = tempfile::tempdir().unwrap();
    let store = file_url(&dir);
    let first = broker(&db, &store, 1).await;
    let mut client = first.pool.get().await.unwrap();
    let writer = client.transaction().await.unwrap();
    writer
        .batch_execute(
            "LOCK TABLE batches IN ROW EXCLUSIVE MODE; \
             LOCK TABLE producers IN ROW EXCLUSIVE MODE; \
             LOCK TABLE transactions IN ROW EXCLUSIVE MODE; \
             LOCK TABLE group_pending_offsets IN ROW EXCLUSIVE MODE",
        )
        .await
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), broker(&db, &store, 2))
        .await
        .expect("a broker's start waited for a lock the writers hold");
    writer.rollback().await.unwrap();
    drop(second);
}
