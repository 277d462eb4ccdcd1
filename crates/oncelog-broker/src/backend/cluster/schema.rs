//! Cluster mode's tables. Created at connect if missing (or older than this
//! build), under an advisory lock so brokers starting together do not race;
//! every statement is `IF NOT EXISTS`, so running it twice changes nothing.

use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;

use super::ClusterError;

/// Bumped when a table changes; stored in `oncelog_meta`. A broker
/// upgrades a database of an older version (version 2: the brokers'
/// listener addresses, the collector's grace for unreferenced objects, the
/// cluster's ACLs and credentials; version 3: the topics' cut-overs;
/// version 4: the brokers' incarnations, which keep a node id unique;
/// version 5: the transaction history's notes; version 6: the groups'
/// membership at rest, for the console; version 7: object keys reserved in
/// slabs instead of one intent row per object, an index of open
/// transactions by deadline for the timeout driver, and the objects'
/// `merged` mark; version 8: live verification's pipeline lineage, progress and anomalies) and
/// refuses a newer one, so a broker of an older build never runs on tables
/// it does not know.
pub const SCHEMA_VERSION: i32 = 8;

/// Any number that no other user of the database takes as advisory lock.
const MIGRATE_LOCK: i64 = 0x6f6e_6365_6c6f_6701;

const DDL: &str = r#"
CREATE TABLE IF NOT EXISTS oncelog_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS brokers (
    id               integer PRIMARY KEY,
    session          bigint NOT NULL,
    host             text NOT NULL,
    port             integer NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    registered_at    timestamptz NOT NULL,
    renewed_at       timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS topics (
    id         uuid PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    partitions integer NOT NULL,
    configs    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id         uuid NOT NULL REFERENCES topics (id) ON DELETE CASCADE,
    partition        integer NOT NULL,
    next_offset      bigint NOT NULL DEFAULT 0,
    log_start_offset bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS object_intents (
    key        text PRIMARY KEY,
    broker_id  integer NOT NULL,
    session    bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS object_slabs (
    broker_id  integer NOT NULL,
    session    bigint NOT NULL,
    first_seq  bigint NOT NULL,
    last_seq   bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    closed_at  timestamptz,
    collecting boolean NOT NULL DEFAULT false,
    PRIMARY KEY (broker_id, session, first_seq)
);
CREATE TABLE IF NOT EXISTS objects (
    key        text PRIMARY KEY,
    size       bigint NOT NULL,
    broker_id  integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS batches (
    topic_id      uuid NOT NULL,
    partition     integer NOT NULL,
    base_offset   bigint NOT NULL,
    last_offset   bigint NOT NULL,
    object_key    text REFERENCES objects (key),
    position      bigint NOT NULL,
    length        integer NOT NULL,
    inline_data   bytea,
    max_timestamp bigint NOT NULL,
    producer_id   bigint NOT NULL,
    control       boolean NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE,
    CHECK (last_offset >= base_offset),
    CHECK ((object_key IS NULL) <> (inline_data IS NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS batches_by_last_offset
    ON batches (topic_id, partition, last_offset);
CREATE INDEX IF NOT EXISTS batches_by_object ON batches (object_key);
CREATE TABLE IF NOT EXISTS producers (
    topic_id         uuid NOT NULL,
    partition        integer NOT NULL,
    producer_id      bigint NOT NULL,
    txn_first_offset bigint,
    entry            jsonb NOT NULL,
    PRIMARY KEY (topic_id, partition, producer_id),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS producers_open_txns
    ON producers (topic_id, partition, txn_first_offset)
    WHERE txn_first_offset IS NOT NULL;
CREATE TABLE IF NOT EXISTS aborted_txns (
    topic_id     uuid NOT NULL,
    partition    integer NOT NULL,
    producer_id  bigint NOT NULL,
    first_offset bigint NOT NULL,
    last_offset  bigint NOT NULL,
    PRIMARY KEY (topic_id, partition, last_offset, producer_id),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE
);
CREATE SEQUENCE IF NOT EXISTS producer_ids START 1000;
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id text PRIMARY KEY,
    producer_id      bigint NOT NULL,
    meta             jsonb NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS transactions_by_producer ON transactions (producer_id);
CREATE INDEX IF NOT EXISTS transactions_ongoing_deadline ON transactions
    (((meta->>'start_ms')::bigint + (meta->>'timeout_ms')::bigint))
    WHERE meta->>'state' = 'Ongoing';
CREATE TABLE IF NOT EXISTS group_owners (
    group_id  text PRIMARY KEY,
    broker_id integer NOT NULL,
    session   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id     text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    offset_value bigint NOT NULL,
    leader_epoch integer NOT NULL,
    metadata     text,
    commit_ms    bigint NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS group_pending_offsets (
    producer_id  bigint NOT NULL,
    group_id     text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    offset_value bigint NOT NULL,
    leader_epoch integer NOT NULL,
    metadata     text,
    commit_ms    bigint NOT NULL,
    PRIMARY KEY (producer_id, group_id, topic, partition)
);
CREATE INDEX IF NOT EXISTS group_pending_offsets_by_group
    ON group_pending_offsets (group_id, topic, partition);
CREATE TABLE IF NOT EXISTS topic_writers (
    topic          text NOT NULL,
    writer         text NOT NULL,
    last_commit_ms bigint NOT NULL,
    PRIMARY KEY (topic, writer)
);
CREATE TABLE IF NOT EXISTS job_leases (
    job         text PRIMARY KEY,
    broker_id   integer NOT NULL,
    session     bigint NOT NULL,
    expires_at  timestamptz NOT NULL,
    runs        bigint NOT NULL DEFAULT 0,
    last_run_at timestamptz,
    last_error  text
);
CREATE TABLE IF NOT EXISTS compaction_state (
    topic_id                uuid NOT NULL,
    partition               integer NOT NULL,
    first_dirty             bigint NOT NULL,
    passes                  bigint NOT NULL DEFAULT 0,
    last_pass_at            timestamptz,
    records_read            bigint NOT NULL DEFAULT 0,
    records_kept            bigint NOT NULL DEFAULT 0,
    aborted_records_removed bigint NOT NULL DEFAULT 0,
    bytes_read              bigint NOT NULL DEFAULT 0,
    bytes_written           bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS cutovers (
    topic_id   uuid PRIMARY KEY REFERENCES topics (id) ON DELETE CASCADE,
    cutover    jsonb NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS txn_history (
    seq              bigserial PRIMARY KEY,
    transactional_id text NOT NULL,
    note             jsonb NOT NULL,
    broker_id        integer NOT NULL,
    noted_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS txn_history_by_id ON txn_history (transactional_id, seq);
CREATE TABLE IF NOT EXISTS group_membership (
    group_id   text PRIMARY KEY,
    broker_id  integer NOT NULL,
    snapshot   jsonb NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS security_docs (
    name       text PRIMARY KEY,
    doc        jsonb NOT NULL,
    version    bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS verify_lineage (
    input_topic     text NOT NULL,
    input_partition integer NOT NULL,
    grp             text NOT NULL,
    writer          text NOT NULL,
    from_offset     bigint NOT NULL,
    to_offset       bigint NOT NULL,
    outputs         text[] NOT NULL,
    at_ms           bigint NOT NULL,
    start_known     boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS verify_lineage_by_input
    ON verify_lineage (input_topic, input_partition, to_offset);
CREATE INDEX IF NOT EXISTS verify_lineage_by_group ON verify_lineage (grp);
CREATE TABLE IF NOT EXISTS verify_progress (
    topic              text NOT NULL,
    partition          integer NOT NULL,
    topic_id           text NOT NULL,
    verified_through   bigint NOT NULL,
    log_start_offset   bigint NOT NULL,
    last_stable_offset bigint NOT NULL,
    passes             bigint NOT NULL,
    remembered_batches bigint NOT NULL,
    compacted          boolean NOT NULL,
    broker_id          integer NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS verify_anomalies (
    kind         text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    first_offset bigint NOT NULL,
    last_offset  bigint NOT NULL,
    producer_id  bigint NOT NULL,
    epoch        smallint NOT NULL,
    detail       text NOT NULL,
    found_ms     bigint NOT NULL,
    broker_id    integer NOT NULL,
    PRIMARY KEY (kind, topic, partition, first_offset, last_offset)
);
CREATE INDEX IF NOT EXISTS verify_anomalies_by_time ON verify_anomalies (found_ms);
"#;

/// Columns added to existing tables since schema version 1: (table,
/// column, definition). Each is added only when missing (an ALTER TABLE
/// takes the table's strongest lock even when it would change nothing).
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("brokers", "listeners", "jsonb NOT NULL DEFAULT '{}'"),
    ("brokers", "incarnation", "uuid"),
    ("objects", "unreferenced_since", "timestamptz"),
    ("objects", "merged", "boolean NOT NULL DEFAULT false"),
];

/// How often an upgrade that lost a lock conflict to running brokers is
/// tried again, and how long it waits for a table's lock each time.
const MIGRATE_ATTEMPTS: u32 = 6;
const MIGRATE_LOCK_TIMEOUT: &str = "5s";

/// Creates the tables if they are missing and checks the stored version.
///
/// A database already at this version is left alone: its DDL is not run
/// again, because `CREATE INDEX IF NOT EXISTS` takes its table's SHARE lock
/// before it looks for the index, and a broker restarting beside brokers
/// that write (ROW EXCLUSIVE on the same tables) deadlocked with them.
/// An upgrade or a first creation waits at most a few seconds for each
/// lock and is tried again when it loses a deadlock or that wait.
pub async fn migrate(pool: &Pool) -> Result<(), ClusterError> {
    if stored_version(pool).await? == Some(SCHEMA_VERSION) {
        return Ok(());
    }
    let mut attempt = 1;
    loop {
        match migrate_once(pool).await {
            Err(ClusterError::Postgres(e)) if attempt < MIGRATE_ATTEMPTS && lock_conflict(&e) => {
                tracing::warn!(attempt, error = %e, "cluster: schema migration lost a lock conflict; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(attempt)))
                    .await;
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// The schema version the database holds; `None` before the first broker
/// made the tables. A value that is not a number reads as `None` here, and
/// the migration then reports it.
async fn stored_version(pool: &Pool) -> Result<Option<i32>, ClusterError> {
    let client = pool.get().await?;
    match client
        .query_opt(
            "SELECT value FROM oncelog_meta WHERE key = 'schema_version'",
            &[],
        )
        .await
    {
        Ok(row) => Ok(row.and_then(|r| r.get::<_, String>(0).parse().ok())),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A deadlock or a lock wait past `lock_timeout`: the other side keeps
/// running, and trying again is safe (the migration's transaction rolled
/// back whole).
fn lock_conflict(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::LOCK_NOT_AVAILABLE
    )
}

async fn migrate_once(pool: &Pool) -> Result<(), ClusterError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .await?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{MIGRATE_LOCK_TIMEOUT}'"
    ))
    .await?;
    // "relation … already exists, skipping" for every table at each start
    // is not news
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await?;
    tx.batch_execute(DDL).await?;
    for (table, column, definition) in ADDED_COLUMNS {
        let present = tx
            .query_opt(
                "SELECT 1 FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2",
                &[table, column],
            )
            .await?
            .is_some();
        if !present {
            tx.batch_execute(&format!(
                "ALTER TABLE {table} ADD COLUMN {column} {definition}"
            ))
            .await?;
        }
    }
    let stored = tx
        .query_opt(
            "SELECT value FROM oncelog_meta WHERE key = 'schema_version'",
            &[],
        )
        .await?;
    match stored {
        None => {
            tx.execute(
                "INSERT INTO oncelog_meta (key, value) VALUES ('schema_version', $1), \
                 ('cluster_id', $2)",
                &[
                    &SCHEMA_VERSION.to_string(),
                    &uuid::Uuid::new_v4().simple().to_string(),
                ],
            )
            .await?;
        }
        Some(row) => {
            let v: String = row.get(0);
            match v.parse::<i32>() {
                Ok(n) if n == SCHEMA_VERSION => {}
                // the tables and columns above brought it up to date
                Ok(n) if (1..SCHEMA_VERSION).contains(&n) => {
                    tx.execute(
                        "UPDATE oncelog_meta SET value = $1 WHERE key = 'schema_version'",
                        &[&SCHEMA_VERSION.to_string()],
                    )
                    .await?;
                    tracing::info!(
                        from = n,
                        to = SCHEMA_VERSION,
                        "cluster: database schema upgraded"
                    );
                }
                _ => {
                    return Err(ClusterError::Config(format!(
                        "the database holds oncelog schema version {v}; this broker knows {SCHEMA_VERSION}"
                    )))
                }
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

/// The cluster id stored at the first broker's start.
pub async fn cluster_id(pool: &Pool) -> Result<String, ClusterError> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            "SELECT value FROM oncelog_meta WHERE key = 'cluster_id'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
