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
