//! `oncelog group`: list, describe (with lag), reset-offsets, delete.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use kafka_protocol::messages::delete_groups_request::DeleteGroupsRequest;
use kafka_protocol::messages::delete_groups_response::DeleteGroupsResponse;
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::DescribeGroupsResponse;
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::ListGroupsResponse;
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponse;
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequest, OffsetFetchRequestTopic};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::{ApiKey, GroupId, TopicName};
use oncelog_client::admin::metadata;
use oncelog_client::consumer::{commit_request, decode_assignment, list_offsets, EARLIEST, LATEST};
use oncelog_client::{check, Cluster, CoordinatorType, ResponseError};
use serde_json::{json, Value};

use super::{emit, s, table};

#[derive(Subcommand)]
pub enum GroupCmd {
    /// List consumer groups.
    List,
    /// A group's state, members and per-partition lag (against the last stable offset).
    Describe { group: String },
    /// Move an inactive group's committed offsets (a dry run unless --execute).
    ResetOffsets(ResetOffsets),
    /// Delete an inactive group and its committed offsets.
    Delete { group: String },
}

/// `group reset-offsets`: where to move an inactive group's offsets.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("to").required(true)
    .args(["to_earliest", "to_latest", "to_offset", "to_datetime", "shift_by"])))]
pub struct ResetOffsets {
    pub group: String,
    #[arg(long)]
    pub topic: String,
    /// Only this partition (default: all of the topic).
    #[arg(long, short = 'p')]
    pub partition: Option<i32>,
    #[arg(long)]
    pub to_earliest: bool,
    #[arg(long)]
    pub to_latest: bool,
    #[arg(long, value_name = "OFFSET")]
    pub to_offset: Option<i64>,
    /// The first offset at or after this timestamp (ms since the epoch).
    #[arg(long, value_name = "MS")]
    pub to_datetime: Option<i64>,
    /// Move by N (negative goes back), kept inside the log.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub shift_by: Option<i64>,
    /// Apply the change (without it only the plan is shown).
    #[arg(long)]
    pub execute: bool,
}

pub async fn group(bootstrap: &str, json_out: bool, cmd: GroupCmd) -> Result<()> {
    let mut cl = Cluster::connect(bootstrap).await?;
    match cmd {
        GroupCmd::List => {
            // Each broker lists the groups it coordinates: ask them all, as
            // Kafka's admin client does.
            let mut rows: Vec<Vec<String>> = super::ask_every_broker(
                &mut cl,
                ApiKey::ListGroups,
                &ListGroupsRequest::default(),
                "list its groups",
                |r: &ListGroupsResponse| r.error_code,
            )
            .await?
            .iter()
            .flat_map(|(_, r)| r.groups.iter())
            .map(|g| {
                vec![
                    g.group_id.0.to_string(),
                    g.group_state.to_string(),
                    g.protocol_type.to_string(),
                ]
            })
            .collect();
            rows.sort();
            rows.dedup_by(|a, b| a[0] == b[0]);
            let v = json!(rows
                .iter()
                .map(|r| json!({"group": r[0], "state": r[1], "protocol_type": r[2]}))
                .collect::<Vec<_>>());
            emit(json_out, &v, &["GROUP", "STATE", "PROTOCOL-TYPE"], rows);
        }
        GroupCmd::Describe { group } => describe(&mut cl, json_out, group).await?,
        GroupCmd::ResetOffsets(r) => reset_offsets(&mut cl, json_out, r).await?,
        GroupCmd::Delete { group } => {
            let coordinator = cl.coordinator(&group, CoordinatorType::Group).await?;
            let c = cl.node(coordinator).await?;
            let (r, _) = c
                .call::<_, DeleteGroupsResponse>(
                    ApiKey::DeleteGroups,
                    &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(&group))]),
                )
                .await?;
            for x in &r.results {
                check(x.error_code, &format!("delete group {group}"))?;
            }
            emit(
                json_out,
                &json!({"deleted": group}),
                &["DELETED"],
                vec![vec![group.clone()]],
            );
        }
    }
    Ok(())
}

/// One member of a group, as DescribeGroups tells it.
struct Member {
    member_id: String,
    client_id: String,
    host: String,
    instance_id: Option<String>,
    /// (topic, partitions), for a consumer group whose assignment decodes.
    assignment: Option<Vec<(String, Vec<i32>)>>,
}

impl Member {
    fn to_json(&self) -> Value {
        json!({"member_id": self.member_id, "client_id": self.client_id, "host": self.host,
            "instance_id": self.instance_id,
            "assignment": self.assignment.as_ref().map(|a| a.iter()
                .map(|(t, ps)| json!({"topic": t, "partitions": ps})).collect::<Vec<_>>())})
    }

    fn row(&self) -> Vec<String> {
        let assignment = match &self.assignment {
            None => "-".to_string(),
            Some(a) if a.is_empty() => "(none)".to_string(),
            Some(a) => a
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| format!("{t}-{p}")))
                .collect::<Vec<_>>()
                .join(","),
        };
        vec![
            self.member_id.clone(),
            self.client_id.clone(),
            self.host.clone(),
            self.instance_id.clone().unwrap_or_else(|| "-".to_string()),
            assignment,
        ]
    }
}

/// `group describe`: state, members and per-partition lag.
async fn describe(cl: &mut Cluster, json_out: bool, group: String) -> Result<()> {
    let coordinator = cl.coordinator(&group, CoordinatorType::Group).await?;
    let c = cl.node(coordinator).await?;
    let (d, _) = c
        .call::<_, DescribeGroupsResponse>(
            ApiKey::DescribeGroups,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
        )
        .await?;
    let g = d.groups.first().ok_or_else(|| anyhow!("empty answer"))?;
    // Kafka answers an unknown group with state Dead (or, from
    // DescribeGroups v6, GROUP_ID_NOT_FOUND).
    if g.error_code == ResponseError::GroupIdNotFound.code() || g.group_state.as_str() == "Dead" {
        bail!("group {group} does not exist");
    }
    check(g.error_code, &format!("describe {group}"))?;
    let consumer = g.protocol_type.as_str() == "consumer";
    let members: Vec<Member> = g
        .members
        .iter()
        .map(|m| Member {
            member_id: m.member_id.to_string(),
            client_id: m.client_id.to_string(),
            host: m.client_host.to_string(),
            instance_id: m.group_instance_id.as_ref().map(|x| x.to_string()),
            assignment: if consumer {
                decode_assignment(&m.member_assignment)
            } else {
                None
            },
        })
        .collect();
    let (o, _) = c
        .call::<_, OffsetFetchResponse>(
            ApiKey::OffsetFetch,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(s(&group)))
                .with_topics(None),
        )
        .await?;
    let mut lag_rows = Vec::new();
    for t in &o.topics {
        let parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
        let lso = list_offsets(c, t.name.0.as_str(), &parts, LATEST, true).await?;
        for p in &t.partitions {
            let end = lso.get(&p.partition_index).copied().unwrap_or(-1);
            let lag = if p.committed_offset >= 0 && end >= 0 {
                (end - p.committed_offset).max(0)
            } else {
                -1
            };
            lag_rows.push(vec![
                t.name.0.to_string(),
                p.partition_index.to_string(),
                p.committed_offset.to_string(),
                end.to_string(),
                lag.to_string(),
            ]);
        }
    }
    lag_rows.sort();
    let v = json!({"group": group, "state": g.group_state.as_str(), "protocol": g.protocol_data.as_str(),
        "protocol_type": g.protocol_type.as_str(),
        "members": members.iter().map(Member::to_json).collect::<Vec<_>>(),
        "offsets": lag_rows.iter().map(|r| json!({"topic": r[0], "partition": r[1].parse::<i64>().unwrap_or(-1),
            "committed": r[2].parse::<i64>().unwrap_or(-1), "last_stable_offset": r[3].parse::<i64>().unwrap_or(-1),
            "lag": r[4].parse::<i64>().unwrap_or(-1)})).collect::<Vec<_>>()});
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "group {group}: {} ({} members, protocol {})",
            g.group_state.as_str(),
            g.members.len(),
            g.protocol_data.as_str()
        );
        if !members.is_empty() {
            table(
                &[
                    "MEMBER-ID",
                    "CLIENT-ID",
                    "HOST",
                    "INSTANCE-ID",
                    "ASSIGNMENT",
                ],
                &members.iter().map(Member::row).collect::<Vec<_>>(),
            );
            println!();
        }
        table(
            &["TOPIC", "PARTITION", "COMMITTED", "LSO", "LAG"],
            &lag_rows,
        );
    }
    Ok(())
}

/// `group reset-offsets`: a dry run unless `--execute`.
async fn reset_offsets(cl: &mut Cluster, json_out: bool, r: ResetOffsets) -> Result<()> {
    let ResetOffsets {
        group,
        topic,
        partition,
        to_earliest,
        to_latest,
        to_offset,
        to_datetime,
        shift_by,
        execute,
    } = r;
    let coordinator = cl.coordinator(&group, CoordinatorType::Group).await?;
    let c = cl.node(coordinator).await?;
    let (d, _) = c
        .call::<_, DescribeGroupsResponse>(
            ApiKey::DescribeGroups,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
        )
        .await?;
    if let Some(g) = d.groups.first() {
        let state = g.group_state.as_str();
        if g.error_code == 0 && !g.members.is_empty() {
            bail!(
                "group {group} is {state} with {} members: offsets can only be reset \
                 while it has none (stop its consumers first)",
                g.members.len()
            );
        }
    }
    let md = metadata(c, Some(vec![topic.clone()])).await?;
    let t = md
        .topics
        .first()
        .ok_or_else(|| anyhow!("no metadata for {topic}"))?;
    check(t.error_code, &format!("topic {topic}"))?;
    let mut parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
    parts.sort();
    if let Some(p) = partition {
        if !parts.contains(&p) {
            bail!("{topic} has no partition {p}");
        }
        parts = vec![p];
    }
    let (o, _) = c
        .call::<_, OffsetFetchResponse>(
            ApiKey::OffsetFetch,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(s(&group)))
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(TopicName(s(&topic)))
                    .with_partition_indexes(parts.clone())])),
        )
        .await?;
    check(o.error_code, &format!("offsets of {group}"))?;
    let current: BTreeMap<i32, i64> = o
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition_index, p.committed_offset))
        })
        .collect();
    let start = list_offsets(c, &topic, &parts, EARLIEST, false).await?;
    let end = list_offsets(c, &topic, &parts, LATEST, false).await?;
    let by_time = match to_datetime {
        Some(ts) => Some(list_offsets(c, &topic, &parts, ts, false).await?),
        None => None,
    };
    let mut plan: Vec<(i32, i64, i64)> = Vec::new();
    for p in &parts {
        let lo = start.get(p).copied().unwrap_or(0);
        let hi = end.get(p).copied().unwrap_or(0);
        let cur = current.get(p).copied().unwrap_or(-1);
        let target = if to_earliest {
            lo
        } else if to_latest {
            hi
        } else if let Some(x) = to_offset {
            x
        } else if let Some(m) = &by_time {
            match m.get(p).copied() {
                Some(x) if x >= 0 => x,
                _ => hi,
            }
        } else {
            let base = if cur >= 0 { cur } else { lo };
            base.saturating_add(shift_by.unwrap_or(0))
        };
        plan.push((*p, cur, target.clamp(lo, hi)));
    }
    if execute {
        let req = commit_request(&group, &topic, plan.iter().map(|(p, _, o)| (*p, *o)));
        let (r, _) = c
            .call::<_, OffsetCommitResponse>(ApiKey::OffsetCommit, &req)
            .await?;
        for t in &r.topics {
            for p in &t.partitions {
                check(p.error_code, &format!("reset offsets of {group}"))?;
            }
        }
    }
    let v = json!({"group": group, "topic": topic, "executed": execute,
        "partitions": plan.iter().map(|(p, cur, new)| json!({"partition": p, "current": cur, "new": new})).collect::<Vec<_>>()});
    emit(
        json_out,
        &v,
        &["GROUP", "TOPIC", "PARTITION", "CURRENT", "NEW"],
        plan.iter()
            .map(|(p, cur, new)| {
                vec![
                    group.clone(),
                    topic.clone(),
                    p.to_string(),
                    cur.to_string(),
                    new.to_string(),
                ]
            })
            .collect(),
    );
    if !execute && !json_out {
        eprintln!("dry run: nothing changed; add --execute to apply");
    }
    Ok(())
}
