//! The `verify_lineage` table: consumer groups' committed input ranges
//! ([`crate::backend::lineage`]). A group's range adjacent to its last one
//! into the same outputs extends that row, so a pipeline keeps one row per
//! input partition while it runs.

use oncelog_verify::lineage::Consumed;

use super::{Cluster, ClusterError};

pub async fn overlapping(
    c: &Cluster,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> Result<Vec<Consumed>, ClusterError> {
    let client = c.pool.get().await?;
    let rows = client
        .query(
            "SELECT grp, writer, from_offset, to_offset, outputs, at_ms, start_known FROM verify_lineage \
             WHERE input_topic = $1 AND input_partition = $2 AND from_offset < $4 AND to_offset > $3 \
             ORDER BY at_ms",
            &[&topic, &partition, &from, &to],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Consumed {
            group: r.get(0),
            writer: r.get(1),
            from: r.get(2),
            to: r.get(3),
            outputs: r.get::<_, Vec<String>>(4).into_iter().collect(),
            at_ms: r.get(5),
            start_known: r.get(6),
        })
        .collect())
}

pub async fn add(
    c: &Cluster,
    topic: &str,
    partition: i32,
    r: &Consumed,
) -> Result<(), ClusterError> {
    if r.from >= r.to {
        return Ok(());
    }
    let outputs: Vec<String> = r.outputs.iter().cloned().collect();
    let client = c.pool.get().await?;
    let extended = client
        .execute(
            "UPDATE verify_lineage SET to_offset = $5, writer = $6, at_ms = $7 \
             WHERE input_topic = $1 AND input_partition = $2 AND grp = $3 AND to_offset = $4 \
               AND outputs = $8 AND start_known AND $9",
            &[
                &topic,
                &partition,
                &r.group,
                &r.from,
                &r.to,
                &r.writer,
                &r.at_ms,
                &outputs,
                &r.start_known,
            ],
        )
        .await?;
    if extended == 0 {
        client
            .execute(
                "INSERT INTO verify_lineage (input_topic, input_partition, grp, writer, \
                 from_offset, to_offset, outputs, at_ms, start_known) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    &topic,
                    &partition,
                    &r.group,
                    &r.writer,
                    &r.from,
                    &r.to,
                    &outputs,
                    &r.at_ms,
                    &r.start_known,
                ],
            )
            .await?;
    }
    Ok(())
}

pub async fn reset(
    c: &Cluster,
    group: &str,
    partitions: Option<&[(String, i32)]>,
) -> Result<(), ClusterError> {
    let client = c.pool.get().await?;
    match partitions {
        None => {
            client
                .execute("DELETE FROM verify_lineage WHERE grp = $1", &[&group])
                .await?;
        }
        Some(ps) => {
            let topics: Vec<&str> = ps.iter().map(|(t, _)| t.as_str()).collect();
            let parts: Vec<i32> = ps.iter().map(|(_, p)| *p).collect();
            client
                .execute(
                    "DELETE FROM verify_lineage v USING unnest($2::text[], $3::int4[]) AS x(t, p) \
                     WHERE v.grp = $1 AND v.input_topic = x.t AND v.input_partition = x.p",
                    &[&group, &topics, &parts],
                )
                .await?;
        }
    }
    Ok(())
}

pub async fn expire(c: &Cluster, cutoff_ms: i64) -> Result<(), ClusterError> {
    let client = c.pool.get().await?;
    client
        .execute("DELETE FROM verify_lineage WHERE at_ms < $1", &[&cutoff_ms])
        .await?;
    Ok(())
}
