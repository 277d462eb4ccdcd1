//! `oncelog verify status [TOPIC]`: what the broker's live verification
//! found (docs/exactly-once.md, "Verified live"), through its HTTP port
//! (`/v1/verify`): how far each partition is verified, the business-key
//! indexes, and the anomalies, each with its offsets. Exits 1 when an
//! anomaly was found, so a script can alert on it. In a cluster each broker
//! verifies, and reports, the partitions it leads (as in its `/metrics`).

use anyhow::Result;
use clap::Subcommand;
use serde_json::Value;

use super::cutover::Admin;
use super::history::{fmt_ms, get_json, percent_encode};
use super::table;

#[derive(Subcommand)]
pub enum VerifyCmd {
    /// How far each partition is verified, and what was found (of TOPIC
    /// only, if given). Exit status 1 when an anomaly was found.
    Status {
        topic: Option<String>,
        #[command(flatten)]
        admin: Admin,
    },
}

pub async fn verify(bootstrap: &str, json_out: bool, cmd: VerifyCmd) -> Result<()> {
    let VerifyCmd::Status { topic, admin } = cmd;
    let url = admin.url(bootstrap);
    let path = match &topic {
        Some(t) => format!("/v1/verify?topic={}", percent_encode(t)),
        None => "/v1/verify".to_string(),
    };
    let v = get_json(&url, &path).await?;
    let anomalies = v["anomalies"].as_array().cloned().unwrap_or_default();
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_tables(&v, &anomalies);
    }
    if !anomalies.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

fn print_tables(v: &Value, anomalies: &[Value]) {
    let n = |v: &Value| v.as_i64().map_or("-".into(), |x| x.to_string());
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    if v["enabled"] == false {
        println!("live verification is off on this broker (verify.enable=false)");
    }
    let parts: Vec<Vec<String>> = v["partitions"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    vec![
                        text(&p["topic"]),
                        n(&p["partition"]),
                        n(&p["verified_through"]),
                        n(&p["last_stable_offset"]),
                        n(&p["log_start_offset"]),
                        n(&p["passes"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    table(
        &[
            "TOPIC",
            "PARTITION",
            "VERIFIED-THROUGH",
            "LSO",
            "LOG-START",
            "PASSES",
        ],
        &parts,
    );
    let uniques: Vec<Vec<String>> = v["unique"]
        .as_array()
        .map(|us| {
            us.iter()
                .map(|u| {
                    vec![
                        text(&u["topic"]),
                        n(&u["keys"]),
                        n(&u["evicted"]),
                        u["covered_since_ms"].as_i64().map_or("-".into(), fmt_ms),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if !uniques.is_empty() {
        println!();
        table(
            &["UNIQUE-KEY-TOPIC", "KEYS", "EVICTED", "CHECKED-SINCE"],
            &uniques,
        );
    }
    println!();
    let rows: Vec<Vec<String>> = anomalies
        .iter()
        .map(|a| {
            vec![
                text(&a["kind"]),
                format!("{}-{}", text(&a["topic"]), n(&a["partition"])),
                format!("{}..{}", n(&a["first_offset"]), n(&a["last_offset"])),
                n(&a["producer_id"]),
                a["found_ms"].as_i64().map_or("-".into(), fmt_ms),
                text(&a["detail"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no anomalies");
    } else {
        table(
            &[
                "ANOMALY",
                "PARTITION",
                "OFFSETS",
                "PRODUCER",
                "FOUND",
                "DETAIL",
            ],
            &rows,
        );
    }
}
