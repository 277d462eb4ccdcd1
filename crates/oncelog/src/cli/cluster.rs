//! `oncelog cluster info`.

use anyhow::Result;
use kafka_protocol::messages::ApiKey;
use oncelog_client::admin::metadata;
use oncelog_client::Client;
use serde_json::{json, Value};

use super::table;

pub async fn cluster_info(bootstrap: &str, json_out: bool) -> Result<()> {
    let mut c = Client::connect(bootstrap).await?;
    let md = metadata(&mut c, None).await?;
    let brokers: Vec<Value> = md
        .brokers
        .iter()
        .map(|b| json!({"node_id": b.node_id.0, "host": b.host.as_str(), "port": b.port}))
        .collect();
    let mut apis: Vec<(i16, (i16, i16))> = c.api_versions().iter().map(|(k, v)| (*k, *v)).collect();
    apis.sort();
    let v = json!({
        "cluster_id": md.cluster_id.as_ref().map(|x| x.as_str()),
        "controller_id": md.controller_id.0,
        "brokers": brokers,
        "topics": md.topics.len(),
        "apis": apis.iter().map(|(k, (lo, hi))| json!({
            "api": ApiKey::try_from(*k).map(|a| format!("{a:?}")).unwrap_or_else(|_| k.to_string()),
            "min": lo, "max": hi})).collect::<Vec<_>>(),
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "cluster id: {}",
            md.cluster_id.as_ref().map(|x| x.as_str()).unwrap_or("-")
        );
        println!("controller: {}", md.controller_id.0);
        println!("topics:     {}", md.topics.len());
        let rows = md
            .brokers
            .iter()
            .map(|b| {
                vec![
                    b.node_id.0.to_string(),
                    format!("{}:{}", b.host.as_str(), b.port),
                ]
            })
            .collect::<Vec<_>>();
        table(&["NODE", "ADDRESS"], &rows);
    }
    Ok(())
}

/// `oncelog cluster info --postgres URL [--object-store URL]`: a cluster-mode
/// cluster as its database says, read only.
pub async fn cluster_store_info(
    postgres: String,
    object_store: Option<String>,
    json_out: bool,
) -> Result<()> {
    let i =
        oncelog_broker::backend::cluster::info::info(&postgres, object_store.as_deref()).await?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&i)?);
        return Ok(());
    }
    println!("cluster id:   {}", i.cluster_id);
    println!("schema:       {}", i.schema_version);
    println!(
        "postgresql:   {} (round trip {:.1} ms)",
        i.postgres.server_version, i.postgres.round_trip_ms
    );
    if let Some(s) = &i.object_store {
        match &s.error {
            None => println!("object store: {} ok (list {:.1} ms)", s.store, s.list_ms),
            Some(e) => println!("object store: {} FAILING: {e}", s.store),
        }
    }
    println!(
        "topics:       {} ({} partitions, {} offsets)",
        i.topics, i.partitions, i.offsets
    );
    match i.oldest_open_transaction_ms {
        Some(age) => println!(
            "transactions: {} open, the oldest {} ms",
            i.open_transactions, age
        ),
        None => println!("transactions: {} open", i.open_transactions),
    }
    println!(
        "objects:      {} ({} bytes), {} key slabs not yet collected",
        i.objects, i.object_bytes, i.key_slabs
    );
    println!(
        "groups:       {} ({} transactional offsets pending)",
        i.groups.len(),
        i.pending_transactional_offsets
    );
    println!();
    let rows = i
        .brokers
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                b.session.to_string(),
                b.address.clone(),
                if b.live { "live" } else { "gone" }.to_string(),
                b.lease_left_ms.to_string(),
                b.renewed_ms_ago.to_string(),
            ]
        })
        .collect::<Vec<_>>();
    table(
        &[
            "BROKER",
            "SESSION",
            "ADDRESS",
            "STATE",
            "LEASE_LEFT_MS",
            "RENEWED_MS_AGO",
        ],
        &rows,
    );
    if !i.groups.is_empty() {
        println!();
        let rows = i
            .groups
            .iter()
            .map(|g| {
                vec![
                    g.group.clone(),
                    g.coordinator.to_string(),
                    g.session.to_string(),
                    if g.live { "live" } else { "gone" }.to_string(),
                ]
            })
            .collect::<Vec<_>>();
        table(&["GROUP", "COORDINATOR", "SESSION", "STATE"], &rows);
    }
    if !i.jobs.is_empty() {
        println!();
        let rows = i
            .jobs
            .iter()
            .map(|j| {
                vec![
                    j.job.clone(),
                    j.broker_id.to_string(),
                    j.expires_in_ms.to_string(),
                    j.runs.to_string(),
                    j.last_run_ago_ms.map_or("-".into(), |v| v.to_string()),
                    j.last_error.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect::<Vec<_>>();
        table(
            &[
                "JOB",
                "HOLDER",
                "LEASE_LEFT_MS",
                "RUNS",
                "LAST_RUN_MS_AGO",
                "LAST_ERROR",
            ],
            &rows,
        );
    }
    Ok(())
}
