//! `oncelog cutover`: hands a topic from one writer to another (blue/green),
//! through the broker's HTTP port: `start` freezes the old writer's new
//! transactions and holds the new writer's commits until the old one's open
//! transactions have ended, then the broker switches in one durable step and
//! fences every transactional id of the old writer; `status` shows where it
//! is; `rollback` undoes a cut-over that has not switched yet. The state
//! machine and the argument that no interval has commits of both writers are
//! in the broker's `cutover` module.

use anyhow::Result;
use clap::Subcommand;
use serde_json::Value;

use super::history::{fmt_ms, get_json, percent_encode, post_json};
use super::table;

#[derive(Subcommand)]
pub enum CutoverCmd {
    /// Start handing TOPIC from writer --from to writer --to (writers as
    /// `writer.transactional.id.prefix` names them: a Flink sink's prefix, a
    /// Kafka Streams application.id).
    Start {
        topic: String,
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        /// How long the old writer's open transactions may take to end; then
        /// they are aborted.
        #[arg(long, default_value_t = 300_000)]
        drain_timeout_ms: i64,
        /// Wait until the cut-over has switched (or this many ms passed).
        #[arg(long)]
        wait_ms: Option<u64>,
        #[command(flatten)]
        admin: Admin,
    },
    /// Where TOPIC's cut-over is (all topics' without TOPIC).
    Status {
        topic: Option<String>,
        #[command(flatten)]
        admin: Admin,
    },
    /// Undo TOPIC's cut-over while it drains: the old writer writes again,
    /// the new one's open transactions on the topic can no longer commit.
    Rollback {
        topic: String,
        #[command(flatten)]
        admin: Admin,
    },
}

#[derive(clap::Args)]
pub struct Admin {
    /// The broker's HTTP endpoint (`metrics.listen`); default
    /// http://<bootstrap host>:9644.
    #[arg(long, value_name = "URL", env = "ONCELOG_ADMIN")]
    admin: Option<String>,
}

impl Admin {
    pub(crate) fn url(&self, bootstrap: &str) -> String {
        super::history::admin_for(bootstrap, self.admin.clone())
    }
}

pub async fn cutover(bootstrap: &str, json_out: bool, cmd: CutoverCmd) -> Result<()> {
    let v = match cmd {
        CutoverCmd::Start {
            topic,
            from,
            to,
            drain_timeout_ms,
            wait_ms,
            admin,
        } => {
            let url = admin.url(bootstrap);
            let path = format!(
                "/v1/cutover/start?topic={}&from={}&to={}&drain_timeout_ms={drain_timeout_ms}",
                percent_encode(&topic),
                percent_encode(&from),
                percent_encode(&to)
            );
            let mut v = post_json(&url, &path).await?;
            if let Some(ms) = wait_ms {
                let deadline = std::time::Instant::now() + std::time::Duration::from_millis(ms);
                while v["phase"] == "Draining" && std::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    v = status_of(&url, &topic).await?;
                }
            }
            v
        }
        CutoverCmd::Status { topic, admin } => {
            let url = admin.url(bootstrap);
            match topic {
                Some(t) => status_of(&url, &t).await?,
                None => get_json(&url, "/v1/cutover").await?,
            }
        }
        CutoverCmd::Rollback { topic, admin } => {
            let url = admin.url(bootstrap);
            post_json(
                &url,
                &format!("/v1/cutover/rollback?topic={}", percent_encode(&topic)),
            )
            .await?
        }
    };
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let all: Vec<Value> = match v.get("cutovers").and_then(Value::as_array) {
            Some(list) => list.clone(),
            None => vec![v],
        };
        print_table(&all);
    }
    Ok(())
}

async fn status_of(url: &str, topic: &str) -> Result<Value> {
    get_json(url, &format!("/v1/cutover?topic={}", percent_encode(topic))).await
}

fn print_table(all: &[Value]) {
    let ms = |v: &Value| match v.as_i64() {
        Some(t) if t > 0 => fmt_ms(t),
        _ => "-".to_string(),
    };
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|c| {
            let waiting: Vec<String> = c["waiting_for"]
                .as_array()
                .map(|w| w.iter().map(|t| text(&t["transactional_id"])).collect())
                .unwrap_or_default();
            vec![
                text(&c["topic"]),
                text(&c["phase"]),
                text(&c["from"]),
                text(&c["to"]),
                ms(&c["started_ms"]),
                ms(&c["drain_deadline_ms"]),
                ms(&c["ended_ms"]),
                c["done"].as_bool().map_or("-".into(), |d| d.to_string()),
                if waiting.is_empty() {
                    "-".into()
                } else {
                    waiting.join(",")
                },
            ]
        })
        .collect();
    table(
        &[
            "TOPIC",
            "PHASE",
            "FROM",
            "TO",
            "STARTED",
            "DRAIN-DEADLINE",
            "SWITCHED/ROLLED-BACK",
            "OLD-WRITER-FENCED",
            "WAITING-FOR",
        ],
        &rows,
    );
}
