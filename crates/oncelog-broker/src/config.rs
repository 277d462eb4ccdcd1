//! Broker settings, named as Kafka names them, from defaults, an optional
//! TOML file and `key=value` overrides (in that order).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("unknown setting `{0}`{hint}", hint = did_you_mean(.0))]
    Unknown(String),
    #[error("setting `{key}`: invalid value `{value}`: {why}")]
    Invalid {
        key: String,
        value: String,
        why: String,
    },
}

/// Every broker setting: (name, default, help). The single source for
/// parsing, `--help` and the README table.
pub const SETTINGS: &[(&str, &str, &str)] = &[
    ("data.dir", "./oncelog-data", "directory holding topic logs and broker metadata (local mode; a cluster-mode broker keeps nothing on local disk)"),
    ("listen", "127.0.0.1:9092", "address the Kafka listener binds"),
    ("metrics.listen", "127.0.0.1:9644", "HOST:PORT of the HTTP listener for /metrics (Prometheus text) and /health; empty = off"),
    ("metrics.tls", "false", "serve the HTTP listener (metrics.listen: /metrics, the console, the CLI's endpoints) over TLS, with the Kafka listeners' ssl.keystore.location and ssl.client.auth; the CLI then takes --admin https://HOST:PORT"),
    ("console.enable", "true", "serve the web console at / on the HTTP listener (metrics.listen)"),
    ("console.actions.enable", "false", "let the console change state (abort a hanging transaction, commit or abort a parked one, start or roll back a cut-over), each after a confirmation; with SASL listeners an action needs a SCRAM user's password (HTTP Basic) and, with an authorizer, ALTER on the cluster"),
    ("console.allowed.hosts", "", "host names (comma-separated) the console answers besides IP addresses and localhost (a Host header naming anything else is refused, against DNS rebinding)"),
    ("advertised.listener", "", "HOST:PORT told to clients in Metadata (default: the listen address)"),
    ("listeners", "", "NAME://HOST:PORT,... Kafka-style listeners, each with the security protocol `listener.security.protocol.map` gives its name; when set it replaces `listen` (empty: one PLAINTEXT listener on `listen`)"),
    ("advertised.listeners", "", "NAME://HOST:PORT,... what Metadata tells a client that came in on listener NAME (default: the listener's own address)"),
    ("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL", "NAME:PROTOCOL,... the security protocol of each listener name (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"),
    ("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN", "SASL mechanisms offered on SASL listeners; PLAIN checks the password against the user's SCRAM credentials"),
    ("connections.max.reauth.ms", "0", "KIP-368: a SASL session lasts this long; the client must re-authenticate (as the same principal) or its connection is closed; 0 = sessions do not expire"),
    ("ssl.keystore.location", "", "PEM file with the certificate chain and private key of SSL and SASL_SSL listeners (read again when it changes)"),
    ("ssl.truststore.location", "", "PEM file of the CA certificates client certificates must chain to (for ssl.client.auth)"),
    ("ssl.client.auth", "none", "client certificates on SSL listeners: none, requested or required; a verified certificate's subject is the principal (User:CN=...,O=...)"),
    ("ssl.principal.mapping.rules", "DEFAULT", "how a client certificate's subject becomes the principal name, as Kafka writes it: RULE:pattern/replacement/[LU] rules and DEFAULT (the DN, CN=alice,O=acme), comma-separated, first match wins; a subject no rule matches is refused"),
    ("authorizer.class.name", "", "any value turns authorization on (the broker's own ACL authorizer, Kafka's rules, whatever class is named); empty = every request is allowed and the ACL APIs answer SECURITY_DISABLED"),
    ("super.users", "", "principals allowed everything, `;`-separated (User:admin;User:ANONYMOUS)"),
    ("allow.everyone.if.no.acl.found", "false", "allow a request on a resource no ACL names at all"),
    ("connection.failed.authentication.delay.ms", "100", "a failed authentication is answered (and its connection closed) after this delay, which slows password guessing"),
    ("node.id", "", "this broker's node id (local mode: 0 when unset; cluster mode: unique among live brokers, and assigned by the cluster when unset)"),
    ("cluster.postgres", "", "cluster mode (docs/cluster.md): postgres://user@host:port/db holding every sequencing decision (sslmode=verify-full&sslrootcert=FILE for TLS); empty = local mode on data.dir"),
    ("cluster.object.store", "", "cluster mode: where batches are kept, s3://bucket/prefix (AWS_* variables give endpoint, region and keys) or file:///shared/dir"),
    ("cluster.flush.ms", "5", "cluster mode: how long produce requests are gathered into one object and one PostgreSQL commit"),
    ("cluster.flush.bytes", "4194304", "cluster mode: a flush starts early once it holds this many bytes"),
    ("cluster.lease.ms", "10000", "cluster mode: a broker's lease (PostgreSQL's clock); a broker that does not renew it in time is fenced"),
    ("cluster.put.timeout.ms", "10000", "cluster mode: an object PUT not answered in this time fails its flush (a retriable error for its producers) instead of holding the flushes behind it"),
    ("cluster.fetch.end.fresh.ms", "2000", "cluster mode: a fetch at a partition's end as this broker last read it is answered from memory while no commit to it was seen, for at most this long (the most a lost announcement delays a caught-up consumer); 0 reads PostgreSQL for every fetch"),
    ("cluster.cache.bytes", "268435456", "cluster mode: bytes of batches kept in memory for fetches"),
    ("cluster.intent.grace.ms", "120000", "cluster mode: how long the collector leaves an uncommitted object, and a committed one no batch names any more, before removing it"),
    ("socket.request.max.bytes", "104857600", "largest request frame accepted; bigger frames close the connection"),
    ("auto.create.topics.enable", "true", "create unknown topics on Metadata requests"),
    ("num.partitions", "1", "partitions of an auto-created topic or of CreateTopics with -1"),
    ("message.max.bytes", "1048588", "largest record batch accepted (topic: max.message.bytes)"),
    ("log.segment.bytes", "1073741824", "segment size that triggers a roll (topic: segment.bytes)"),
    ("log.roll.ms", "604800000", "segment age that triggers a roll (topic: segment.ms)"),
    ("log.index.interval.bytes", "4096", "bytes between sparse index entries (topic: index.interval.bytes)"),
    ("log.retention.ms", "604800000", "delete segments older than this; -1 keeps forever (topic: retention.ms)"),
    ("log.retention.bytes", "-1", "delete old segments while a partition is larger; -1 = no limit (topic: retention.bytes)"),
    ("log.retention.check.interval.ms", "300000", "how often retention runs"),
    ("log.cleanup.policy", "delete", "delete (retention removes old segments), compact (the log cleaner keeps the last record per key) or compact,delete (topic: cleanup.policy)"),
    ("log.message.timestamp.before.max.ms", "9223372036854775807", "refuse (INVALID_TIMESTAMP) a CreateTime record older than this many ms (topic: message.timestamp.before.max.ms)"),
    ("log.message.timestamp.after.max.ms", "3600000", "refuse (INVALID_TIMESTAMP) a CreateTime record more than this many ms in the future, Kafka 4's default (topic: message.timestamp.after.max.ms)"),
    ("log.cleaner.enable", "true", "run the log cleaner for topics with cleanup.policy compact"),
    ("log.cleaner.threads", "1", "threads that clean partitions (each cleans one partition at a time)"),
    ("log.cleaner.dedupe.buffer.size", "134217728", "memory for the cleaners' offset maps, shared by the threads (32 bytes per distinct key); a pass stops where its map is full"),
    ("log.cleaner.io.max.bytes.per.second", "-1", "cap on the bytes all cleaners read and write per second; -1 = no cap"),
    ("log.cleaner.backoff.ms", "15000", "how long a cleaner sleeps when no partition needs cleaning"),
    ("log.cleaner.min.cleanable.ratio", "0.5", "clean a partition once this share of its cleanable log is dirty (topic: min.cleanable.dirty.ratio)"),
    ("log.cleaner.delete.retention.ms", "86400000", "keep tombstones and the markers of emptied transactions this long after they are cleaned (topic: delete.retention.ms)"),
    ("log.cleaner.min.compaction.lag.ms", "0", "never clean records younger than this (topic: min.compaction.lag.ms)"),
    ("log.cleaner.max.compaction.lag.ms", "9223372036854775807", "clean records older than this even below the dirty ratio (topic: max.compaction.lag.ms)"),
    ("log.flush.interval.ms", "0", "0 = fdatasync before every acknowledgement (group commit); N > 0 = acknowledge after the write and fdatasync every N ms: a machine crash can lose the last N ms of acknowledged writes"),
    ("log.sync.threads", "8", "threads that fdatasync partitions for group commit; a partition always uses the same one, different partitions sync in parallel"),
    ("log.cache.keep.bytes", "67108864", "after each fdatasync, drop the synced part of a partition's active segment from the page cache except its last N bytes (tailing readers stay in memory); a full page cache makes every write pay for reclaim; -1 = leave it to the kernel, as Kafka does"),
    ("fetch.max.bytes", "57671680", "upper bound on bytes returned by one Fetch"),
    ("transaction.max.timeout.ms", "900000", "largest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT above)"),
    ("transaction.two.phase.commit.prefixes", "", "writers (comma-separated transactional-id prefixes as `writer.transactional.id.prefix` names them, or `text*` for ids starting with text) whose transactions park at their timeout instead of aborting: kept open (pinning the LSO) until their producer commits or aborts them after a restart, or an operator does (`oncelog txn commit|abort`); for Flink's KafkaSink"),
    ("transaction.two.phase.commit.enable", "false", "serve KIP-939 two-phase commit: InitProducerId v6 with enable2Pc (the producer's transactions park at their timeout) and keepPreparedTxn (a restarted producer keeps its prepared transaction and commits or aborts it)"),
    ("transaction.two.phase.commit.max.park.ms", "-1", "abort a parked transaction after it has been parked this long; -1 = never"),
    ("transactional.id.expiration.ms", "604800000", "forget a transactional id idle (no open transaction) this long"),
    ("transaction.version", "2", "finalized transaction.version feature: 2 lets KIP-890 clients (Java 4.x) use EndTxn v5 and Produce v12; 1 keeps them on the classic protocol"),
    ("group.initial.rebalance.delay.ms", "3000", "how long a new group waits for more members before its first rebalance"),
    ("group.min.session.timeout.ms", "6000", "smallest session.timeout.ms a consumer may ask for"),
    ("group.max.session.timeout.ms", "1800000", "largest session.timeout.ms a consumer may ask for"),
    ("coordinator.log.compact.records", "10000", "the transaction and offsets logs are compacted (rewritten as their live state) once this many records, and at least as many as they held live, were appended since the last compaction; restart reads the live state, not the history"),
    ("offsets.retention.minutes", "10080", "committed offsets of a group without members are kept this long"),
    ("offsets.retention.check.interval.ms", "600000", "how often cluster mode looks for expired committed offsets (local mode looks continuously)"),
    ("transaction.auto.heal", "false", "abort orphaned transactions (open at a partition, unknown to the coordinator) through the coordinator's marker path"),
    ("transaction.heal.check.interval.ms", "10000", "how often partitions' open transactions are reconciled with the coordinator; an orphan is one seen on two checks in a row"),
    ("verify.enable", "true", "live verification: each broker reads back the committed data of the partitions it reports (every one in local mode) and checks it from the bytes alone (CRCs, offsets, producer epochs and sequences, markers, the aborted index, content unchanged between passes) and against the coordinator's committed transactions; see docs/exactly-once.md"),
    ("verify.scrub.bytes.per.second", "4194304", "cap on the bytes live verification reads per second on this broker; -1 = no cap"),
    ("verify.unique.window.ms", "86400000", "how long a business key stays checked for a second commit on topics with verify.unique.key (topic: verify.unique.window.ms)"),
    ("verify.unique.max.keys", "1000000", "business keys each broker holds for verify.unique.key, over all its topics (about 100 bytes each); when full the oldest are forgotten first, and oncelog_verify_unique_covered_seconds says how far back keys are still checked"),
    ("verify.scrub.interval.ms", "300000", "time between the end of one verification pass over a partition's whole log and the start of the next, which compares every batch with what the first pass saw (new data is verified within a second of becoming stable, apart from these passes)"),
    ("producer.id.expiration.ms", "86400000", "partitions forget an idle producer id this long after its last write, never one with an open transaction"),
    ("max.partitions.per.topic", "10000", "most partitions one topic may have (CreateTopics / CreatePartitions above it get INVALID_PARTITIONS)"),
    ("max.connections", "2147483647", "most client connections open at once (all listeners); a connection beyond it is closed at once, logged and counted"),
    ("max.connections.per.ip", "2147483647", "most connections open at once from one IP address; beyond it, closed at once"),
    ("connections.max.unauthenticated.ms", "30000", "a connection on a SASL listener that has not authenticated within this time is closed (with the 64 KiB frame bound before authentication, an unauthenticated peer holds little memory and not for long)"),
    ("max.partitions", "100000", "most partitions the broker holds in all; creation is also refused when the open-files limit could not hold 3 files per new partition"),
];

/// " (did you mean `x`?)" for the known setting nearest to `key`, or a
/// pointer to the list when nothing is close.
fn did_you_mean(key: &str) -> String {
    let best = SETTINGS
        .iter()
        .map(|(k, _, _)| (edit_distance(key, k), *k))
        .min();
    match best {
        Some((d, k)) if d <= (key.len() / 3).max(2) => format!(" (did you mean `{k}`?)"),
        _ => " (see `oncelog serve --help` for the settings)".into(),
    }
}

/// Levenshtein distance over bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub data_dir: PathBuf,
    /// Whether `data.dir` was given (a cluster-mode broker uses none, and
    /// says so when one was given).
    pub data_dir_set: bool,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// The HTTP listener speaks TLS (with the Kafka listeners' keystore).
    pub metrics_tls: bool,
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Every listener; the first is `listen` when `listeners` is not set.
    pub listeners: Vec<crate::security::Listener>,
    pub sasl_mechanisms: Vec<String>,
    pub reauth_ms: i64,
    pub failed_auth_delay_ms: u64,
    pub ssl_keystore: String,
    pub ssl_truststore: String,
    pub ssl_client_auth: String,
    /// `ssl.principal.mapping.rules`: a client certificate's DN → principal name.
    pub ssl_principal_mapping: crate::security::principal_map::PrincipalRules,
    /// ACLs are enforced (`authorizer.class.name` set).
    pub authorizer: bool,
    pub super_users: String,
    pub allow_everyone_if_no_acl: bool,
    /// This broker's node id (0 when `node.id` is unset, until cluster mode
    /// assigns one: [`Self::node_id_set`]).
    pub node_id: i32,
    /// Whether `node.id` was given.
    pub node_id_set: bool,
    /// Cluster mode's PostgreSQL URL (empty: local mode).
    pub cluster_postgres: String,
    pub cluster_object_store: String,
    pub cluster_flush_ms: u64,
    pub cluster_flush_bytes: usize,
    pub cluster_lease_ms: u64,
    pub cluster_put_timeout_ms: u64,
    pub cluster_fetch_end_fresh_ms: u64,
    pub cluster_cache_bytes: usize,
    pub cluster_intent_grace_ms: u64,
    pub max_frame_bytes: usize,
    pub auto_create_topics: bool,
    pub num_partitions: i32,
    pub message_max_bytes: i64,
    pub segment_bytes: i64,
    pub segment_ms: i64,
    pub index_interval_bytes: i64,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub retention_check_interval_ms: u64,
    pub cleanup_policy: String,
    pub cleaner_enable: bool,
    pub cleaner_threads: usize,
    pub cleaner_dedupe_buffer_size: u64,
    /// None: no cap.
    pub cleaner_io_max_bytes_per_second: Option<f64>,
    pub cleaner_backoff_ms: u64,
    pub flush_interval_ms: u64,
    pub sync_threads: usize,
    /// None: never drop written data from the page cache.
    pub cache_keep_bytes: Option<u64>,
    pub fetch_max_bytes: usize,
    pub transaction_max_timeout_ms: i32,
    pub transactional_id_expiration_ms: i64,
    /// Transactions that park at their timeout instead of aborting.
    pub two_phase_commit: crate::machines::txn_coordinator::ParkPolicy,
    /// KIP-939 served (InitProducerId v6).
    pub two_phase_commit_enable: bool,
    pub producer_id_expiration_ms: i64,
    pub verify_enable: bool,
    /// None: no cap.
    pub verify_scrub_bytes_per_second: Option<u64>,
    pub verify_scrub_interval_ms: u64,
    pub verify_unique_window_ms: i64,
    pub verify_unique_max_keys: usize,
    pub transaction_version: i16,
    pub transaction_auto_heal: bool,
    pub transaction_heal_check_interval_ms: u64,
    pub group_initial_rebalance_delay_ms: u64,
    pub group_min_session_timeout_ms: i32,
    pub group_max_session_timeout_ms: i32,
    pub offsets_retention_minutes: i64,
    pub offsets_retention_check_interval_ms: u64,
    pub coordinator_log_compact_records: usize,
    pub max_partitions_per_topic: i32,
    pub max_partitions: i64,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub unauthenticated_timeout_ms: u64,
    pub console_enable: bool,
    pub console_actions_enable: bool,
    /// Host names the console answers besides IP addresses and localhost.
    pub console_allowed_hosts: Vec<String>,
    /// Every setting as text, after overrides (for DescribeConfigs).
    pub raw: BTreeMap<String, String>,
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse::<T>().map_err(|e| ConfigError::Invalid {
        key: key.into(),
        value: value.into(),
        why: e.to_string(),
    })
}

/// The listeners and what clients are told of them.
struct Network {
    listen: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    metrics_tls: bool,
    advertised_host: String,
    advertised_port: i32,
    listeners: Vec<crate::security::Listener>,
    sasl_mechanisms: Vec<String>,
}

impl Network {
    /// From the settings' values (`get`: a setting's value after overrides).
    fn of(get: &impl Fn(&str) -> String) -> Result<Self, ConfigError> {
        let listen: SocketAddr = parse("listen", &get("listen"))?;
        let adv = get("advertised.listener");
        let (advertised_host, advertised_port) = if adv.is_empty() {
            (listen.ip().to_string(), listen.port() as i32)
        } else {
            let (h, p) = adv.rsplit_once(':').ok_or_else(|| ConfigError::Invalid {
                key: "advertised.listener".into(),
                value: adv.clone(),
                why: "expected HOST:PORT".into(),
            })?;
            (h.to_string(), parse("advertised.listener", p)?)
        };
        let listeners = crate::security::parse_listeners(
            &get("listeners"),
            &get("advertised.listeners"),
            &get("listener.security.protocol.map"),
            listen,
            (!adv.is_empty()).then(|| (advertised_host.clone(), advertised_port)),
        )
        .map_err(|why| ConfigError::Invalid {
            key: "listeners".into(),
            value: get("listeners"),
            why,
        })?;
        let tls_listener = listeners.iter().find(|l| {
            matches!(
                l.protocol,
                crate::security::SecurityProtocol::Ssl | crate::security::SecurityProtocol::SaslSsl
            )
        });
        let metrics_tls: bool = parse("metrics.tls", &get("metrics.tls"))?;
        let tls_user = match (tls_listener, metrics_tls) {
            (Some(l), _) => Some((
                "listeners",
                format!("listener {} is {}", l.name, l.protocol.name()),
            )),
            (None, true) => Some(("metrics.tls", "metrics.tls is true".to_string())),
            (None, false) => None,
        };
        if let Some((key, what)) = tls_user {
            if !cfg!(feature = "tls") {
                return Err(ConfigError::Invalid {
                    key: key.into(),
                    value: get(key),
                    why: format!("{what}: this build has no TLS (built without the `tls` feature)"),
                });
            }
            if get("ssl.keystore.location").trim().is_empty() {
                return Err(ConfigError::Invalid {
                    key: "ssl.keystore.location".into(),
                    value: String::new(),
                    why: format!("{what}: it needs ssl.keystore.location (a PEM file with the certificate chain and its private key)"),
                });
            }
        }
        if !matches!(
            get("ssl.client.auth").trim(),
            "" | "none" | "requested" | "required"
        ) {
            return Err(ConfigError::Invalid {
                key: "ssl.client.auth".into(),
                value: get("ssl.client.auth"),
                why: "must be none, requested or required".into(),
            });
        }
        let sasl_mechanisms: Vec<String> = get("sasl.enabled.mechanisms")
            .split(',')
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty())
            .collect();
        if let Some(m) = sasl_mechanisms
            .iter()
            .find(|m| !matches!(m.as_str(), "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512"))
        {
            return Err(ConfigError::Invalid {
                key: "sasl.enabled.mechanisms".into(),
                value: get("sasl.enabled.mechanisms"),
                why: format!("{m} is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
            });
        }
        let (listen, advertised_host, advertised_port) = (
            listeners[0].bind,
            listeners[0].advertised_host.clone(),
            listeners[0].advertised_port,
        );
        let metrics = get("metrics.listen");
        let metrics_listen = if metrics.trim().is_empty() {
            None
        } else {
            Some(parse("metrics.listen", &metrics)?)
        };
        Ok(Self {
            listen,
            metrics_listen,
            metrics_tls,
            advertised_host,
            advertised_port,
            listeners,
            sasl_mechanisms,
        })
    }
}

impl BrokerConfig {
    /// Builds a config from defaults overlaid with `overrides` (Kafka names).
    pub fn from_map(overrides: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut m: BTreeMap<&str, String> = SETTINGS
            .iter()
            .map(|(k, v, _)| (*k, v.to_string()))
            .collect();
        for (k, v) in overrides {
            let Some(slot) = m.get_mut(k.as_str()) else {
                return Err(ConfigError::Unknown(k.clone()));
            };
            *slot = v.clone();
        }
        let get = |k: &str| m.get(k).cloned().unwrap_or_default();
        let net = Network::of(&get)?;
        // A setting parsed as its field's type.
        macro_rules! v {
            ($k:literal) => {
                parse($k, &get($k))?
            };
        }
        let c = Self {
            data_dir: PathBuf::from(get("data.dir")),
            data_dir_set: overrides.contains_key("data.dir"),
            listen: net.listen,
            metrics_listen: net.metrics_listen,
            metrics_tls: net.metrics_tls,
            advertised_host: net.advertised_host,
            advertised_port: net.advertised_port,
            listeners: net.listeners,
            sasl_mechanisms: net.sasl_mechanisms,
            reauth_ms: v!("connections.max.reauth.ms"),
            failed_auth_delay_ms: v!("connection.failed.authentication.delay.ms"),
            ssl_keystore: get("ssl.keystore.location").trim().to_string(),
            ssl_truststore: get("ssl.truststore.location").trim().to_string(),
            ssl_client_auth: get("ssl.client.auth").trim().to_string(),
            ssl_principal_mapping: crate::security::principal_map::PrincipalRules::parse(&get(
                "ssl.principal.mapping.rules",
            ))
            .map_err(|why| ConfigError::Invalid {
                key: "ssl.principal.mapping.rules".into(),
                value: get("ssl.principal.mapping.rules"),
                why,
            })?,
            authorizer: !get("authorizer.class.name").trim().is_empty(),
            super_users: get("super.users"),
            allow_everyone_if_no_acl: v!("allow.everyone.if.no.acl.found"),
            node_id: match get("node.id").trim() {
                "" => 0,
                v => match parse::<i32>("node.id", v)? {
                    n if n < 0 => {
                        return Err(ConfigError::Invalid {
                            key: "node.id".into(),
                            value: v.to_string(),
                            why: "a node id is 0 or more".into(),
                        })
                    }
                    n => n,
                },
            },
            node_id_set: !get("node.id").trim().is_empty(),
            cluster_postgres: get("cluster.postgres").trim().to_string(),
            cluster_object_store: get("cluster.object.store").trim().to_string(),
            cluster_flush_ms: v!("cluster.flush.ms"),
            cluster_flush_bytes: v!("cluster.flush.bytes"),
            cluster_lease_ms: v!("cluster.lease.ms"),
            cluster_put_timeout_ms: v!("cluster.put.timeout.ms"),
            cluster_fetch_end_fresh_ms: v!("cluster.fetch.end.fresh.ms"),
            cluster_cache_bytes: v!("cluster.cache.bytes"),
            cluster_intent_grace_ms: v!("cluster.intent.grace.ms"),
            max_frame_bytes: v!("socket.request.max.bytes"),
            auto_create_topics: v!("auto.create.topics.enable"),
            num_partitions: v!("num.partitions"),
            message_max_bytes: v!("message.max.bytes"),
            segment_bytes: v!("log.segment.bytes"),
            segment_ms: v!("log.roll.ms"),
            index_interval_bytes: v!("log.index.interval.bytes"),
            retention_ms: v!("log.retention.ms"),
            retention_bytes: v!("log.retention.bytes"),
            retention_check_interval_ms: v!("log.retention.check.interval.ms"),
            cleanup_policy: get("log.cleanup.policy"),
            cleaner_enable: v!("log.cleaner.enable"),
            cleaner_threads: v!("log.cleaner.threads"),
            cleaner_dedupe_buffer_size: v!("log.cleaner.dedupe.buffer.size"),
            cleaner_io_max_bytes_per_second: {
                let v: f64 = v!("log.cleaner.io.max.bytes.per.second");
                (v > 0.0).then_some(v)
            },
            cleaner_backoff_ms: v!("log.cleaner.backoff.ms"),
            flush_interval_ms: v!("log.flush.interval.ms"),
            sync_threads: v!("log.sync.threads"),
            cache_keep_bytes: {
                let v: i64 = v!("log.cache.keep.bytes");
                u64::try_from(v).ok()
            },
            fetch_max_bytes: v!("fetch.max.bytes"),
            transaction_max_timeout_ms: v!("transaction.max.timeout.ms"),
            transactional_id_expiration_ms: v!("transactional.id.expiration.ms"),
            two_phase_commit: crate::machines::txn_coordinator::ParkPolicy::new(
                &get("transaction.two.phase.commit.prefixes"),
                v!("transaction.two.phase.commit.max.park.ms"),
            ),
            two_phase_commit_enable: v!("transaction.two.phase.commit.enable"),
            producer_id_expiration_ms: v!("producer.id.expiration.ms"),
            verify_enable: v!("verify.enable"),
            verify_scrub_bytes_per_second: {
                let v: i64 = v!("verify.scrub.bytes.per.second");
                u64::try_from(v).ok()
            },
            verify_scrub_interval_ms: v!("verify.scrub.interval.ms"),
            verify_unique_window_ms: v!("verify.unique.window.ms"),
            verify_unique_max_keys: v!("verify.unique.max.keys"),
            transaction_version: v!("transaction.version"),
            transaction_auto_heal: v!("transaction.auto.heal"),
            transaction_heal_check_interval_ms: v!("transaction.heal.check.interval.ms"),
            group_initial_rebalance_delay_ms: v!("group.initial.rebalance.delay.ms"),
            group_min_session_timeout_ms: v!("group.min.session.timeout.ms"),
            group_max_session_timeout_ms: v!("group.max.session.timeout.ms"),
            coordinator_log_compact_records: v!("coordinator.log.compact.records"),
            offsets_retention_minutes: v!("offsets.retention.minutes"),
            offsets_retention_check_interval_ms: v!("offsets.retention.check.interval.ms"),
            max_partitions_per_topic: v!("max.partitions.per.topic"),
            max_partitions: v!("max.partitions"),
            max_connections: v!("max.connections"),
            max_connections_per_ip: v!("max.connections.per.ip"),
            unauthenticated_timeout_ms: v!("connections.max.unauthenticated.ms"),
            console_enable: v!("console.enable"),
            console_actions_enable: v!("console.actions.enable"),
            console_allowed_hosts: get("console.allowed.hosts")
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            raw: m.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        };
        c.validate()?;
        Ok(c)
    }

    /// Checks the values' ranges and how they go together.
    fn validate(&self) -> Result<(), ConfigError> {
        let positive = |k: &str, v: i64| {
            if v <= 0 {
                Err(ConfigError::Invalid {
                    key: k.into(),
                    value: v.to_string(),
                    why: "must be positive".into(),
                })
            } else {
                Ok(())
            }
        };
        let at_least = |k: &str, v: i64, min: i64, what: &str| {
            if v < min {
                Err(ConfigError::Invalid {
                    key: k.into(),
                    value: v.to_string(),
                    why: what.into(),
                })
            } else {
                Ok(())
            }
        };
        if !matches!(self.transaction_version, 1 | 2) {
            return Err(ConfigError::Invalid {
                key: "transaction.version".into(),
                value: self.transaction_version.to_string(),
                why: "must be 1 or 2".into(),
            });
        }
        positive("message.max.bytes", self.message_max_bytes)?;
        positive("fetch.max.bytes", self.fetch_max_bytes as i64)?;
        positive(
            "max.partitions.per.topic",
            i64::from(self.max_partitions_per_topic),
        )?;
        positive("max.partitions", self.max_partitions)?;
        // Durations: -1 means "no limit" where Kafka allows it, never less.
        for (k, v) in [
            ("log.retention.ms", self.retention_ms),
            ("log.retention.bytes", self.retention_bytes),
            (
                "log.cache.keep.bytes",
                parse::<i64>("log.cache.keep.bytes", &self.raw_or("log.cache.keep.bytes"))?,
            ),
        ] {
            at_least(k, v, -1, "must be -1 (no limit) or more")?;
        }
        for (k, v) in [
            ("log.roll.ms", self.segment_ms),
            (
                "transaction.max.timeout.ms",
                i64::from(self.transaction_max_timeout_ms),
            ),
            (
                "transactional.id.expiration.ms",
                self.transactional_id_expiration_ms,
            ),
            ("producer.id.expiration.ms", self.producer_id_expiration_ms),
            ("offsets.retention.minutes", self.offsets_retention_minutes),
            (
                "group.min.session.timeout.ms",
                i64::from(self.group_min_session_timeout_ms),
            ),
            (
                "group.max.session.timeout.ms",
                i64::from(self.group_max_session_timeout_ms),
            ),
        ] {
            positive(k, v)?;
        }
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            return Err(ConfigError::Invalid {
                key: "group.min.session.timeout.ms".into(),
                value: self.group_min_session_timeout_ms.to_string(),
                why: "must not exceed group.max.session.timeout.ms".into(),
            });
        }
        positive(
            "transaction.heal.check.interval.ms",
            self.transaction_heal_check_interval_ms as i64,
        )?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::Invalid {
                key: "data.dir".into(),
                value: String::new(),
                why: "must not be empty".into(),
            });
        }
        positive("num.partitions", self.num_partitions as i64)?;
        positive("log.sync.threads", self.sync_threads as i64)?;
        positive("log.cleaner.threads", self.cleaner_threads as i64)?;
        positive("log.cleaner.backoff.ms", self.cleaner_backoff_ms as i64)?;
        positive(
            "log.cleaner.dedupe.buffer.size",
            self.cleaner_dedupe_buffer_size as i64,
        )?;
        positive("log.segment.bytes", self.segment_bytes)?;
        positive("log.index.interval.bytes", self.index_interval_bytes)?;
        positive("socket.request.max.bytes", self.max_frame_bytes as i64)?;
        positive(
            "log.retention.check.interval.ms",
            self.retention_check_interval_ms as i64,
        )?;
        positive(
            "offsets.retention.check.interval.ms",
            self.offsets_retention_check_interval_ms as i64,
        )?;
        Ok(())
    }

    /// A setting's text after overrides, or its default.
    fn raw_or(&self, key: &str) -> String {
        self.raw.get(key).cloned().unwrap_or_else(|| {
            SETTINGS
                .iter()
                .find(|(k, _, _)| *k == key)
                .map(|(_, d, _)| d.to_string())
                .unwrap_or_default()
        })
    }

    /// The broker-level value behind a topic-level config name, as text.
    pub fn topic_default(&self, topic_key: &str) -> Option<String> {
        Some(match topic_key {
            "segment.bytes" => self.segment_bytes.to_string(),
            "segment.ms" => self.segment_ms.to_string(),
            "index.interval.bytes" => self.index_interval_bytes.to_string(),
            "retention.ms" => self.retention_ms.to_string(),
            "retention.bytes" => self.retention_bytes.to_string(),
            "cleanup.policy" => self.cleanup_policy.clone(),
            "max.message.bytes" => self.message_max_bytes.to_string(),
            "flush.ms" => {
                if self.flush_interval_ms == 0 {
                    "0".into()
                } else {
                    self.flush_interval_ms.to_string()
                }
            }
            "compression.type" => "producer".into(),
            "message.timestamp.type" => "CreateTime".into(),
            "min.insync.replicas" => "1".into(),
            "delete.retention.ms" => self.raw_or("log.cleaner.delete.retention.ms"),
            "min.compaction.lag.ms" => self.raw_or("log.cleaner.min.compaction.lag.ms"),
            "max.compaction.lag.ms" => self.raw_or("log.cleaner.max.compaction.lag.ms"),
            "min.cleanable.dirty.ratio" => self.raw_or("log.cleaner.min.cleanable.ratio"),
            "file.delete.delay.ms" => "60000".into(),
            "unclean.leader.election.enable" => "false".into(),
            "preallocate" => "false".into(),
            "message.downconversion.enable" => "true".into(),
            "segment.index.bytes" => "10485760".into(),
            "segment.jitter.ms" => "0".into(),
            "flush.messages" => "9223372036854775807".into(),
            "local.retention.ms" => "-2".into(),
            "local.retention.bytes" => "-2".into(),
            "remote.storage.enable" => "false".into(),
            "message.timestamp.before.max.ms" => self.raw_or("log.message.timestamp.before.max.ms"),
            "message.timestamp.after.max.ms" => self.raw_or("log.message.timestamp.after.max.ms"),
            "writer.transactional.id.prefix" => String::new(),
            "verify.unique.key" => String::new(),
            "verify.unique.window.ms" => self.verify_unique_window_ms.to_string(),
            "verify.lineage.enforce" => "false".into(),
            _ => return None,
        })
    }

    /// Topic config names that are acted on (the rest are stored and reported).
    pub const ACTED_TOPIC_CONFIGS: &'static [&'static str] = &[
        "segment.bytes",
        "segment.ms",
        "index.interval.bytes",
        "retention.ms",
        "retention.bytes",
        "max.message.bytes",
        "cleanup.policy",
        "delete.retention.ms",
        "min.compaction.lag.ms",
        "max.compaction.lag.ms",
        "min.cleanable.dirty.ratio",
        "message.timestamp.type",
        "message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms",
        "verify.unique.key",
        "verify.unique.window.ms",
        "verify.lineage.enforce",
    ];

    /// Every topic config name we accept.
    pub const TOPIC_CONFIGS: &'static [&'static str] = &[
        "writer.transactional.id.prefix",
        "cleanup.policy",
        "compression.type",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "index.interval.bytes",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.downconversion.enable",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
        "verify.unique.key",
        "verify.unique.window.ms",
        "verify.lineage.enforce",
    ];
}

/// Why a topic config value is not acceptable (a message for the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTopicConfig(pub String);

/// Checks a topic config value; returns a reason when it is not acceptable.
pub fn validate_topic_config(key: &str, value: &str) -> Result<(), InvalidTopicConfig> {
    check_topic_config(key, value)
}

fn check_topic_config(key: &str, value: &str) -> Result<(), InvalidTopicConfig> {
    let bad = |why: String| Err(InvalidTopicConfig(why));
    if !BrokerConfig::TOPIC_CONFIGS.contains(&key) {
        return bad(format!("unknown topic config {key}"));
    }
    match key {
        "cleanup.policy" => {
            for p in value.split(',') {
                if !matches!(p.trim(), "delete" | "compact") {
                    return bad(format!("invalid cleanup.policy {value}"));
                }
            }
            Ok(())
        }
        "compression.type" => match value {
            "producer" | "uncompressed" | "gzip" | "snappy" | "lz4" | "zstd" => Ok(()),
            _ => bad(format!("invalid compression.type {value}")),
        },
        "writer.transactional.id.prefix" => {
            crate::machines::writers::check_prefix(value).or_else(bad)
        }
        "verify.unique.key" if value.is_empty() => Ok(()),
        "verify.unique.key" => oncelog_verify::unique::KeySpec::parse(value)
            .map(|_| ())
            .or_else(bad),
        "verify.unique.window.ms" => match value.parse::<i64>() {
            Ok(v) if v > 0 => Ok(()),
            _ => bad(format!("{key} must be a positive integer")),
        },
        "message.timestamp.type" => match value {
            "CreateTime" | "LogAppendTime" => Ok(()),
            _ => bad(format!("invalid message.timestamp.type {value}")),
        },
        "preallocate"
        | "unclean.leader.election.enable"
        | "message.downconversion.enable"
        | "remote.storage.enable"
        | "verify.lineage.enforce" => value
            .parse::<bool>()
            .map(|_| ())
            .or_else(|_| bad(format!("{key} must be true or false"))),
        "min.cleanable.dirty.ratio" => match value.parse::<f64>() {
            Ok(v) if (0.0..=1.0).contains(&v) => Ok(()),
            _ => bad(format!("{key} must be a number from 0 to 1")),
        },
        "message.timestamp.before.max.ms" | "message.timestamp.after.max.ms" => {
            match value.parse::<i64>() {
                Ok(v) if v >= 0 => Ok(()),
                _ => bad(format!("{key} must be 0 or more")),
            }
        }
        "segment.bytes" | "index.interval.bytes" | "max.message.bytes" | "min.insync.replicas" => {
            match value.parse::<i64>() {
                Ok(v) if v > 0 => Ok(()),
                _ => bad(format!("{key} must be a positive integer")),
            }
        }
        _ => value
            .parse::<i64>()
            .map(|_| ())
            .or_else(|_| bad(format!("{key} must be an integer"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        assert_eq!(c.listen.port(), 9092);
        assert_eq!(c.advertised_port, 9092);
        assert!(c.auto_create_topics);
        for (k, _, _) in SETTINGS {
            assert!(!k.is_empty());
        }
        for k in BrokerConfig::TOPIC_CONFIGS {
            assert!(c.topic_default(k).is_some(), "{k}");
            validate_topic_config(k, &c.topic_default(k).unwrap()).unwrap();
        }
    }

    #[test]
    fn unknown_and_bad_values_rejected() {
        let mut m = BTreeMap::new();
        m.insert("nope".to_string(), "1".to_string());
        assert!(matches!(
            BrokerConfig::from_map(&m),
            Err(ConfigError::Unknown(_))
        ));
        let mut m = BTreeMap::new();
        m.insert("num.partitions".to_string(), "zero".to_string());
        assert!(BrokerConfig::from_map(&m).is_err());
        assert!(validate_topic_config("retention.ms", "abc").is_err());
        assert!(validate_topic_config("cleanup.policy", "compact,delete").is_ok());
    }

    fn config_error(k: &str, v: &str) -> String {
        let mut m = BTreeMap::new();
        m.insert(k.to_string(), v.to_string());
        BrokerConfig::from_map(&m).unwrap_err().to_string()
    }

    #[test]
    fn unknown_keys_suggest_the_nearest_setting() {
        let e = config_error("log.retention.msec", "1");
        assert!(e.contains("did you mean `log.retention.ms`?"), "{e}");
        let e = config_error("transaction.versoin", "2");
        assert!(e.contains("did you mean `transaction.version`?"), "{e}");
        let e = config_error("completely.different.thing", "2");
        assert!(e.contains("oncelog serve --help"), "{e}");
    }

    #[test]
    fn out_of_range_values_rejected() {
        assert!(config_error("transaction.version", "3").contains("must be 1 or 2"));
        assert!(config_error("transaction.version", "0").contains("must be 1 or 2"));
        assert!(config_error("message.max.bytes", "0").contains("must be positive"));
        assert!(config_error("log.retention.ms", "-5").contains("must be -1"));
        assert!(config_error("transaction.max.timeout.ms", "-1").contains("must be positive"));
        assert!(config_error("log.roll.ms", "-1").contains("must be positive"));
        assert!(config_error("max.partitions.per.topic", "0").contains("must be positive"));
        let mut m = BTreeMap::new();
        m.insert("log.retention.ms".to_string(), "-1".to_string());
        BrokerConfig::from_map(&m).unwrap();
    }
}
