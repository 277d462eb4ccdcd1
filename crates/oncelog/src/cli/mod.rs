//! Client commands of the `oncelog` CLI, a module per command group. They
//! talk the Kafka protocol (through `oncelog-client`), so they work against
//! any Kafka-compatible cluster. Tables for people, `--json` for scripts.
//! What is here is the command line's own: arguments, input parsing and
//! output; the protocol is the client crate's.

use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use oncelog_client::Cluster;
use serde_json::Value;

mod cluster;
mod consume;
mod cutover;
mod diff;
mod format;
mod group;
mod history;
mod produce;
mod progress;
mod topic;
mod txn;
mod user;
mod verify;

pub use cluster::{cluster_info, cluster_store_info};
pub use consume::{consume, ConsumeArgs};
pub use cutover::{cutover, CutoverCmd};
pub use diff::{diff, DiffArgs};
pub use group::{group, GroupCmd};
pub use produce::{produce, ProduceArgs};
pub use topic::{topic, TopicCmd};
pub use txn::{txn, TxnCmd};
pub use user::{user, UserCmd};
pub use verify::{verify, VerifyCmd};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Prints rows as an aligned table; no rows as `none` (not bare headers).
fn table(headers: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        println!("none");
        return;
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

fn emit(json_out: bool, v: &Value, headers: &[&str], rows: Vec<Vec<String>>) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        table(headers, &rows);
    }
}

/// Sends `req` to every broker Metadata names, as Kafka's admin client does
/// for the listings each broker answers for itself (the groups and
/// transactional ids it coordinates). Returns the answers whose
/// `error_code` is none, by broker id; a broker that did not answer or
/// answered an error is named on stderr, and the others still count.
pub(crate) async fn ask_every_broker<Req, Resp>(
    cl: &mut Cluster,
    key: ApiKey,
    req: &Req,
    what: &str,
    error_code: impl Fn(&Resp) -> i16,
) -> anyhow::Result<Vec<(i32, Resp)>>
where
    Req: Encodable + Message,
    Resp: Decodable + Message,
{
    let mut out = Vec::new();
    for id in cl.brokers().await? {
        let addr = cl.address(id).unwrap_or("?").to_string();
        let answer = match cl.node(id).await {
            Ok(c) => c
                .call::<Req, Resp>(key, req)
                .await
                .map_err(anyhow::Error::from)
                .and_then(|(r, _)| {
                    oncelog_client::check(error_code(&r), what)?;
                    Ok(r)
                }),
            Err(e) => Err(e.into()),
        };
        match answer {
            Ok(r) => out.push((id, r)),
            Err(e) => eprintln!("warning: broker {id} ({addr}) did not {what}: {e:#}"),
        }
    }
    Ok(out)
}
