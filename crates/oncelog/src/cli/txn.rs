//! `oncelog txn`: list (with parked transactions), describe (with fences
//! and history), history, producers, find-hanging, commit, abort.

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use kafka_protocol::messages::describe_producers_response::ProducerState;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::ListTransactionsResponse;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
};
use kafka_protocol::messages::write_txn_markers_response::WriteTxnMarkersResponse;
use kafka_protocol::messages::{ApiKey, ProducerId, TopicName, TransactionalId};
use oncelog_client::admin::{describe_producers, open_transaction_in};
use oncelog_client::{check, Cluster, CoordinatorType, ResponseError};
use serde_json::{json, Value};

use super::{emit, history, s, table};

#[derive(Subcommand)]
pub enum TxnCmd {
    /// List transactional ids and their state.
    List {
        /// Only these states (e.g. Ongoing, or Parked), repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
        /// The broker's HTTP endpoint, asked which open transactions are
        /// parked past their timeout; default http://<bootstrap host>:9644.
        /// Without an answer, parked transactions show as Ongoing.
        #[arg(long, value_name = "URL", env = "ONCELOG_ADMIN")]
        admin: Option<String>,
    },
    /// Describe one transactional id: its state (Kafka protocol), and from
    /// the broker's HTTP port the epochs, fences (when, cause, old -> new
    /// epoch, the fencing client's client.id and address) and recent events.
    Describe {
        transactional_id: String,
        /// The broker's HTTP endpoint (`metrics.listen`); default
        /// http://<bootstrap host>:9644.
        #[arg(long, value_name = "URL", env = "ONCELOG_ADMIN")]
        admin: Option<String>,
    },
    /// The recent events of one transactional id (from the broker's HTTP port).
    History {
        transactional_id: String,
        /// The broker's HTTP endpoint; default http://<bootstrap host>:9644.
        #[arg(long, value_name = "URL", env = "ONCELOG_ADMIN")]
        admin: Option<String>,
    },
    /// The producers a partition knows (epoch, last sequence, open transaction).
    Producers { topic: String, partition: i32 },
    /// Open transactions older than --min-age-ms, with the partitions they pin.
    FindHanging {
        #[arg(long, default_value_t = 60_000)]
        min_age_ms: i64,
    },
    /// Commit a transactional id's open (e.g. parked) transaction as its
    /// producer would, naming the producer id and epoch it was prepared
    /// under (as a Flink checkpoint holds them); a mismatch is refused. The
    /// producer is fenced by it (epoch + 1). Committing again answers
    /// success; committing an aborted transaction fails.
    Commit {
        transactional_id: String,
        #[arg(long)]
        producer_id: i64,
        #[arg(long)]
        producer_epoch: i16,
    },
    /// `abort ID --producer-id P --producer-epoch E`: abort a transactional
    /// id's open transaction as its producer would (like `commit`).
    /// `abort TOPIC PARTITION --producer-id P --producer-epoch E`: abort the
    /// open transaction a partition shows for a producer (through the
    /// coordinator when it knows the transaction); fails with "nothing
    /// open" when neither the partition nor the coordinator has one.
    Abort {
        /// A transactional id, or a topic when PARTITION follows.
        target: String,
        partition: Option<i32>,
        #[arg(long)]
        producer_id: i64,
        #[arg(long)]
        producer_epoch: i16,
        #[arg(long, default_value_t = 0)]
        coordinator_epoch: i32,
    },
}

pub async fn txn(bootstrap: &str, json_out: bool, cmd: TxnCmd) -> Result<()> {
    match cmd {
        TxnCmd::Commit {
            transactional_id,
            producer_id,
            producer_epoch,
        } => {
            return end(
                bootstrap,
                json_out,
                &transactional_id,
                producer_id,
                producer_epoch,
                true,
            )
            .await
        }
        TxnCmd::Abort {
            target,
            partition: None,
            producer_id,
            producer_epoch,
            ..
        } => {
            return end(
                bootstrap,
                json_out,
                &target,
                producer_id,
                producer_epoch,
                false,
            )
            .await
        }
        _ => {}
    }
    let mut cl = Cluster::connect(bootstrap).await?;
    let cl = &mut cl;
    match cmd {
        TxnCmd::Commit { .. }
        | TxnCmd::Abort {
            partition: None, ..
        } => Ok(()),
        TxnCmd::List { states, admin } => list(cl, bootstrap, json_out, states, admin).await,
        TxnCmd::Describe {
            transactional_id,
            admin,
        } => describe(cl, bootstrap, json_out, transactional_id, admin).await,
        TxnCmd::History {
            transactional_id,
            admin,
        } => history_of(bootstrap, json_out, transactional_id, admin).await,
        TxnCmd::Producers { topic, partition } => producers(cl, json_out, topic, partition).await,
        TxnCmd::FindHanging { min_age_ms } => find_hanging(cl, json_out, min_age_ms).await,
        TxnCmd::Abort {
            target,
            partition: Some(partition),
            producer_id,
            producer_epoch,
            coordinator_epoch,
        } => {
            abort_at(
                cl,
                json_out,
                target,
                partition,
                producer_id,
                producer_epoch,
                coordinator_epoch,
            )
            .await
        }
    }
}

/// `txn list`: every coordinator's ids, with the parked ones named.
async fn list(
    cl: &mut Cluster,
    bootstrap: &str,
    json_out: bool,
    states: Vec<String>,
    admin: Option<String>,
) -> Result<()> {
    // Parked is Ongoing on the wire (its transaction is open).
    let parked_wanted = states.iter().any(|x| x == "Parked");
    let wire_states: Vec<&String> = states.iter().filter(|x| *x != "Parked").collect();
    let mut filters: Vec<_> = wire_states.iter().map(|x| s(x)).collect();
    if parked_wanted && !wire_states.is_empty() {
        filters.push(s("Ongoing"));
    } else if parked_wanted {
        filters = vec![s("Ongoing")];
    }
    let req = ListTransactionsRequest::default()
        .with_state_filters(filters)
        .with_duration_filter(-1);
    let mut listed: Vec<_> = list_everywhere(cl, &req)
        .await?
        .into_iter()
        .flat_map(|(_, r)| r.transaction_states)
        .collect();
    listed.sort_by(|a, b| a.transactional_id.0.cmp(&b.transactional_id.0));
    listed.dedup_by(|a, b| a.transactional_id == b.transactional_id);
    let admin = history::admin_for(bootstrap, admin);
    let parked: std::collections::HashMap<String, i64> = history::parked(&admin)
        .await
        .ok()
        .and_then(|v| v["parked"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            Some((
                p["transactional_id"].as_str()?.to_string(),
                p["parked_since_ms"].as_i64()?,
            ))
        })
        .collect();
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|t| {
            let id = t.transactional_id.0.to_string();
            let state = if parked.contains_key(&id) {
                "Parked".to_string()
            } else {
                t.transaction_state.to_string()
            };
            vec![id, t.producer_id.0.to_string(), state]
        })
        .filter(|r| {
            states.is_empty()
                || states.iter().any(|x| *x == r[2])
                || (r[2] == "Parked" && wire_states.iter().any(|x| *x == "Ongoing"))
        })
        .collect();
    let v = json!(rows.iter().map(|r| json!({"transactional_id": r[0], "producer_id": r[1].parse::<i64>().unwrap_or(-1), "state": r[2],
        "parked_since_ms": parked.get(&r[0])})).collect::<Vec<_>>());
    emit(
        json_out,
        &v,
        &["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE"],
        rows,
    );
    Ok(())
}

/// `txn describe`: the protocol's answer and the broker's history.
async fn describe(
    cl: &mut Cluster,
    bootstrap: &str,
    json_out: bool,
    transactional_id: String,
    admin: Option<String>,
) -> Result<()> {
    let admin = history::admin_for(bootstrap, admin);
    let req = DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(s(&transactional_id))]);
    let coordinator = cl
        .coordinator(&transactional_id, CoordinatorType::Transaction)
        .await?;
    let (r, _) = cl
        .node(coordinator)
        .await?
        .call::<_, DescribeTransactionsResponse>(ApiKey::DescribeTransactions, &req)
        .await?;
    let t = r
        .transaction_states
        .first()
        .ok_or_else(|| anyhow!("empty answer"))?;
    check(t.error_code, &format!("describe {transactional_id}"))?;
    let parts: Vec<String> = t
        .topics
        .iter()
        .flat_map(|x| {
            x.partitions
                .iter()
                .map(move |p| format!("{}-{p}", x.topic.0.as_str()))
        })
        .collect();
    let mut v = json!({"transactional_id": transactional_id, "state": t.transaction_state.as_str(),
        "producer_id": t.producer_id.0, "producer_epoch": t.producer_epoch,
        "timeout_ms": t.transaction_timeout_ms, "start_time_ms": t.transaction_start_time_ms,
        "partitions": parts});
    // The Kafka protocol has no history: it comes from the HTTP port,
    // and its absence must not hide what the protocol told.
    let hist = history::fetch(&admin, &transactional_id).await;
    match &hist {
        Ok(h) => v["history"] = h.clone(),
        Err(e) => {
            v["history"] = Value::Null;
            v["history_unavailable"] = json!(format!("{e:#}"));
        }
    }
    emit(
        json_out,
        &v,
        &[
            "TRANSACTIONAL-ID",
            "STATE",
            "PRODUCER-ID",
            "EPOCH",
            "TIMEOUT-MS",
            "PARTITIONS",
        ],
        vec![vec![
            transactional_id.clone(),
            t.transaction_state.to_string(),
            t.producer_id.0.to_string(),
            t.producer_epoch.to_string(),
            t.transaction_timeout_ms.to_string(),
            parts.join(","),
        ]],
    );
    if !json_out {
        match &hist {
            Ok(h) => history::print_sections(h, table),
            Err(e) => println!("\nhistory: unavailable ({e:#})"),
        }
    }
    Ok(())
}

/// `txn history`: one id's recent events.
async fn history_of(
    bootstrap: &str,
    json_out: bool,
    transactional_id: String,
    admin: Option<String>,
) -> Result<()> {
    let admin = history::admin_for(bootstrap, admin);
    let h = history::fetch(&admin, &transactional_id).await?;
    let v = json!({"transactional_id": transactional_id,
        "history_since_ms": h["history_since_ms"], "events": h["events"],
        "events_dropped": h["events_dropped"], "stuck": h["stuck"]});
    if !json_out {
        history::print_stuck(&h);
    }
    emit(
        json_out,
        &v,
        history::EVENT_HEADERS,
        history::event_rows(&h),
    );
    Ok(())
}

/// `txn producers`: the producers a partition knows.
async fn producers(cl: &mut Cluster, json_out: bool, topic: String, partition: i32) -> Result<()> {
    let rows: Vec<Vec<String>> = describe_producers(cl.bootstrap(), &topic, partition)
        .await?
        .iter()
        .map(producer_row)
        .collect();
    let v = json!(rows.iter().map(|r| json!({"producer_id": r[0].parse::<i64>().unwrap_or(-1),
        "epoch": r[1].parse::<i64>().unwrap_or(-1), "last_sequence": r[2].parse::<i64>().unwrap_or(-1),
        "last_timestamp": r[3].parse::<i64>().unwrap_or(-1), "coordinator_epoch": r[4].parse::<i64>().unwrap_or(-1),
        "current_txn_start_offset": r[5].parse::<i64>().unwrap_or(-1)})).collect::<Vec<_>>());
    emit(
        json_out,
        &v,
        &[
            "PRODUCER-ID",
            "EPOCH",
            "LAST-SEQUENCE",
            "LAST-TIMESTAMP",
            "COORDINATOR-EPOCH",
            "TXN-START-OFFSET",
        ],
        rows,
    );
    Ok(())
}

/// `txn find-hanging`: open transactions older than `min_age_ms`.
async fn find_hanging(cl: &mut Cluster, json_out: bool, min_age_ms: i64) -> Result<()> {
    let req = ListTransactionsRequest::default()
        .with_state_filters(vec![s("Ongoing")])
        .with_duration_filter(min_age_ms);
    let mut rows = Vec::new();
    // Each broker describes the transactions it coordinates.
    for (broker, r) in list_everywhere(cl, &req).await? {
        let ids: Vec<TransactionalId> = r
            .transaction_states
            .iter()
            .map(|t| t.transactional_id.clone())
            .collect();
        if ids.is_empty() {
            continue;
        }
        let (d, _) = cl
            .node(broker)
            .await?
            .call::<_, DescribeTransactionsResponse>(
                ApiKey::DescribeTransactions,
                &DescribeTransactionsRequest::default().with_transactional_ids(ids),
            )
            .await?;
        let now = oncelog_broker::now_ms();
        for t in d.transaction_states.iter().filter(|t| t.error_code == 0) {
            let parts: Vec<String> = t
                .topics
                .iter()
                .flat_map(|x| {
                    x.partitions
                        .iter()
                        .map(move |p| format!("{}-{p}", x.topic.0.as_str()))
                })
                .collect();
            let age = if t.transaction_start_time_ms > 0 {
                now - t.transaction_start_time_ms
            } else {
                -1
            };
            rows.push(vec![
                t.transactional_id.0.to_string(),
                t.producer_id.0.to_string(),
                t.producer_epoch.to_string(),
                age.to_string(),
                parts.join(","),
            ]);
        }
    }
    let v = json!(rows.iter().map(|r| json!({"transactional_id": r[0], "producer_id": r[1].parse::<i64>().unwrap_or(-1),
        "producer_epoch": r[2].parse::<i64>().unwrap_or(-1), "age_ms": r[3].parse::<i64>().unwrap_or(-1),
        "partitions": r[4].split(',').filter(|x| !x.is_empty()).collect::<Vec<_>>()})).collect::<Vec<_>>());
    emit(
        json_out,
        &v,
        &[
            "TRANSACTIONAL-ID",
            "PRODUCER-ID",
            "EPOCH",
            "AGE-MS",
            "PINNED-PARTITIONS",
        ],
        rows,
    );
    Ok(())
}

/// `txn abort TOPIC PARTITION`: an abort marker for a hanging transaction.
async fn abort_at(
    cl: &mut Cluster,
    json_out: bool,
    topic: String,
    partition: i32,
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
) -> Result<()> {
    // Every broker's coordinator: in a cluster each lists its own ids.
    let req = ListTransactionsRequest::default()
        .with_producer_id_filters(vec![ProducerId(producer_id)])
        .with_duration_filter(-1);
    let held = list_everywhere(cl, &req)
        .await?
        .iter()
        .find_map(|(_, r)| open_transaction_in(r, producer_id));
    let c = cl.bootstrap();
    let open_here = describe_producers(c, &topic, partition)
        .await?
        .iter()
        .any(|p| p.producer_id.0 == producer_id && p.current_txn_start_offset != -1);
    if held.is_none() && !open_here {
        bail!(
            "nothing open: producer {producer_id} has no open transaction at \
             {topic}-{partition}, and the transaction coordinator holds none for it; \
             nothing was aborted"
        );
    }
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch)
        .with_transaction_result(false)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(TopicName(s(&topic)))
            .with_partition_indexes(vec![partition])])]);
    let (r, _) = c
        .call::<_, WriteTxnMarkersResponse>(ApiKey::WriteTxnMarkers, &req)
        .await?;
    for m in &r.markers {
        for t in &m.topics {
            for p in &t.partitions {
                check(p.error_code, &format!("abort at {topic}-{partition}"))?;
            }
        }
    }
    emit(
        json_out,
        &json!({"aborted": {"topic": topic, "partition": partition, "producer_id": producer_id,
            "transactional_id": held}}),
        &["ABORTED", "PRODUCER-ID", "TRANSACTIONAL-ID"],
        vec![vec![
            format!("{topic}-{partition}"),
            producer_id.to_string(),
            held.clone().unwrap_or_else(|| "-".to_string()),
        ]],
    );
    Ok(())
}

/// ListTransactions to every broker (each lists the ids it coordinates).
async fn list_everywhere(
    cl: &mut Cluster,
    req: &ListTransactionsRequest,
) -> Result<Vec<(i32, ListTransactionsResponse)>> {
    super::ask_every_broker(
        cl,
        ApiKey::ListTransactions,
        req,
        "list its transactions",
        |r: &ListTransactionsResponse| r.error_code,
    )
    .await
}

/// `txn commit` / `txn abort ID`: EndTxn to the id's coordinator, as the
/// producer that holds `producer_id` at `producer_epoch` would send it.
async fn end(
    bootstrap: &str,
    json_out: bool,
    id: &str,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
) -> Result<()> {
    let what = if commit { "commit" } else { "abort" };
    let mut cluster = Cluster::connect(bootstrap).await?;
    let node = cluster
        .coordinator(id, CoordinatorType::Transaction)
        .await?;
    let c = cluster.node(node).await?;
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch)
        .with_committed(commit);
    let mut tries = 0;
    let r = loop {
        let (r, _) = c.call::<_, EndTxnResponse>(ApiKey::EndTxn, &req).await?;
        // A transition of this id in progress, or a commit held by a
        // cut-over: asked again for a while, as clients do.
        if r.error_code == ResponseError::ConcurrentTransactions.code() && tries < 50 {
            tries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        }
        break r;
    };
    let code = r.error_code;
    if code == ResponseError::ProducerFenced.code()
        || code == ResponseError::InvalidProducerEpoch.code()
    {
        bail!(
            "{what} refused: {id} is not at producer id {producer_id} epoch {producer_epoch} \
             (its transaction was fenced, timed out or ended under another epoch); nothing was changed"
        );
    }
    if code == ResponseError::InvalidProducerIdMapping.code() {
        bail!("{what} refused: {id} does not have producer id {producer_id}; nothing was changed");
    }
    if code == ResponseError::InvalidTxnState.code() {
        bail!(
            "{what} refused: {id} has no transaction that can be {}ed at producer id {producer_id} \
             epoch {producer_epoch} (nothing open, or it already ended the other way)",
            what
        );
    }
    check(code, &format!("{what} {id}"))?;
    let done = if commit { "committed" } else { "aborted" };
    emit(
        json_out,
        &json!({ done: {"transactional_id": id, "producer_id": producer_id, "producer_epoch": producer_epoch,
            "next_producer_id": r.producer_id.0, "next_producer_epoch": r.producer_epoch}}),
        &[&done.to_uppercase(), "PRODUCER-ID", "EPOCH"],
        vec![vec![
            id.to_string(),
            producer_id.to_string(),
            producer_epoch.to_string(),
        ]],
    );
    Ok(())
}

/// A row of `txn producers`.
fn producer_row(a: &ProducerState) -> Vec<String> {
    vec![
        a.producer_id.0.to_string(),
        a.producer_epoch.to_string(),
        a.last_sequence.to_string(),
        a.last_timestamp.to_string(),
        a.coordinator_epoch.to_string(),
        a.current_txn_start_offset.to_string(),
    ]
}
