//! The `oncelog` command line.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use oncelog_broker::config::SETTINGS;
use oncelog_broker::{Broker, BrokerConfig};

mod alloc_guard;
mod cli;
mod sigpipe;

#[global_allocator]
static GLOBAL: alloc_guard::Guard = alloc_guard::Guard;

#[derive(Parser)]
#[command(
    name = "oncelog",
    version,
    about = "A Kafka-compatible streaming broker built for exactly-once"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    security: SecurityArgs,
}

/// The environment variable that carries a process's resolved client
/// security settings (librdkafka's property names, a JSON object) to the
/// processes it starts.
const CLIENT_SECURITY_ENV: &str = oncelog_audit::CLIENT_SECURITY_ENV;

/// The heading the client security options are shown under in every
/// command's `--help` (they are global: accepted by every command).
const SECURITY_HEADING: &str = "Security (Kafka client settings)";

/// How the client commands authenticate (Kafka's client settings).
#[derive(clap::Args)]
#[command(next_help_heading = SECURITY_HEADING)]
struct SecurityArgs {
    /// PLAINTEXT (the default), SASL_PLAINTEXT, SSL or SASL_SSL.
    #[arg(long, global = true, env = "ONCELOG_SECURITY_PROTOCOL")]
    security_protocol: Option<String>,
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, global = true)]
    sasl_mechanism: Option<String>,
    #[arg(long, global = true, env = "ONCELOG_SASL_USERNAME")]
    sasl_username: Option<String>,
    #[arg(
        long,
        global = true,
        env = "ONCELOG_SASL_PASSWORD",
        hide_env_values = true
    )]
    sasl_password: Option<String>,
    /// For SSL and SASL_SSL: the PEM CA certificates the broker's
    /// certificate must chain to (default: the system's CA bundle).
    #[arg(long, global = true)]
    ca_cert: Option<PathBuf>,
    /// For SSL and SASL_SSL listeners with ssl.client.auth: this client's
    /// PEM certificate chain (the file may also hold the key).
    #[arg(long, global = true)]
    cert: Option<PathBuf>,
    /// The PEM private key of --cert (default: looked for in --cert's file).
    /// (Not `--key`: that is `oncelog diff`'s record key.)
    #[arg(long, global = true)]
    cert_key: Option<PathBuf>,
    /// A client properties file in Kafka's format (security.protocol,
    /// sasl.mechanism, sasl.jaas.config with username="…" password="…", or
    /// sasl.username / sasl.password; ssl.truststore.location and
    /// ssl.keystore.location of type PEM, or librdkafka's ssl.ca.location,
    /// ssl.certificate.location, ssl.key.location); flags win over it.
    #[arg(long, global = true)]
    command_config: Option<PathBuf>,
}

impl SecurityArgs {
    /// Makes this process's connections authenticate as asked.
    ///
    /// Also exports the resolved settings, in librdkafka's names, in
    /// [`CLIENT_SECURITY_ENV`] for the processes this one starts (the
    /// auditor's workers), whose own `apply` starts from them.
    fn apply(&self) -> Result<()> {
        let mut props: BTreeMap<String, String> = BTreeMap::new();
        if let Ok(json) = std::env::var(CLIENT_SECURITY_ENV) {
            props = serde_json::from_str(&json).with_context(|| {
                format!("{CLIENT_SECURITY_ENV} is not a JSON object of strings")
            })?;
        }
        if let Some(f) = &self.command_config {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                    continue;
                }
                if let Some((k, v)) = line.split_once(['=', ':']) {
                    props.insert(k.trim().to_string(), v.trim().to_string());
                }
            }
        }
        let jaas = props.get("sasl.jaas.config").cloned().unwrap_or_default();
        let jaas_field = |name: &str| {
            let at = jaas.find(&format!("{name}=\""))? + name.len() + 2;
            let end = jaas[at..].find('"')?;
            Some(jaas[at..at + end].to_string())
        };
        let protocol = self
            .security_protocol
            .clone()
            .or_else(|| props.get("security.protocol").cloned())
            .unwrap_or_else(|| "PLAINTEXT".into())
            .to_ascii_uppercase();
        let (tls, sasl) = match protocol.as_str() {
            "PLAINTEXT" => (false, false),
            "SASL_PLAINTEXT" => (false, true),
            "SSL" => (true, false),
            "SASL_SSL" => (true, true),
            p => bail!("unknown security protocol {p} (PLAINTEXT, SASL_PLAINTEXT, SSL, SASL_SSL)"),
        };
        let mut exported: BTreeMap<&str, String> = BTreeMap::new();
        exported.insert("security.protocol", protocol.clone());
        if sasl {
            let mechanism = self
                .sasl_mechanism
                .clone()
                .or_else(|| props.get("sasl.mechanism").cloned())
                .unwrap_or_else(|| "SCRAM-SHA-512".into());
            let username = self
                .sasl_username
                .clone()
                .or_else(|| props.get("sasl.username").cloned())
                .or_else(|| jaas_field("username"))
                .with_context(|| format!("{protocol} needs --sasl-username (or sasl.jaas.config in --command-config)"))?;
            let password = self
                .sasl_password
                .clone()
                .or_else(|| props.get("sasl.password").cloned())
                .or_else(|| jaas_field("password"))
                .with_context(|| format!("{protocol} needs --sasl-password (or sasl.jaas.config in --command-config)"))?;
            exported.insert("sasl.mechanism", mechanism.clone());
            exported.insert("sasl.username", username.clone());
            exported.insert("sasl.password", password.clone());
            oncelog_client::sasl::set(oncelog_client::sasl::SaslConfig {
                mechanism,
                username,
                password,
            })?;
        }
        let prop = |k: &str| props.get(k).map(PathBuf::from);
        // Kafka's keystore and truststore settings, when they are PEM files.
        let pem = |kind: &str| {
            props
                .get(&format!("ssl.{kind}.type"))
                .is_none_or(|t| t.eq_ignore_ascii_case("PEM"))
        };
        let ca_cert = self
            .ca_cert
            .clone()
            .or_else(|| prop("ssl.ca.location"))
            .or_else(|| prop("ssl.truststore.location").filter(|_| pem("truststore")));
        let keystore = prop("ssl.keystore.location").filter(|_| pem("keystore"));
        let cert = self
            .cert
            .clone()
            .or_else(|| prop("ssl.certificate.location"))
            .or_else(|| keystore.clone());
        let key = self
            .cert_key
            .clone()
            .or_else(|| prop("ssl.key.location"))
            .or_else(|| keystore.clone());
        if tls {
            let abs = |p: &PathBuf| {
                std::path::absolute(p)
                    .unwrap_or_else(|_| p.clone())
                    .display()
                    .to_string()
            };
            for (k, v) in [
                ("ssl.ca.location", &ca_cert),
                ("ssl.certificate.location", &cert),
                ("ssl.key.location", &key),
            ] {
                if let Some(v) = v {
                    exported.insert(k, abs(v));
                }
            }
            oncelog_client::tls::set(oncelog_client::tls::TlsConfig { ca_cert, cert, key })?;
        } else if self.ca_cert.is_some() || self.cert.is_some() || self.cert_key.is_some() {
            bail!("--ca-cert, --cert and --cert-key are for --security-protocol SSL or SASL_SSL (this is {protocol})");
        }
        if protocol != "PLAINTEXT" {
            // Set before any thread of this process starts.
            std::env::set_var(CLIENT_SECURITY_ENV, serde_json::to_string(&exported)?);
        }
        Ok(())
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker. With no flags: data in ./oncelog-data, listening on 127.0.0.1:9092.
    #[command(after_help = settings_help())]
    Serve(ServeArgs),
    /// Topics: list, create, describe (offsets, LSO, configs), delete, add-partitions, alter-config.
    Topic {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: cli::TopicCmd,
    },
    /// Transactions: list, describe (with fences and history), history, producers, find-hanging, abort.
    Txn {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: cli::TxnCmd,
    },
    /// Consumer groups: list, describe (with lag), reset-offsets, delete.
    Group {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: cli::GroupCmd,
    },
    /// Write stdin lines as records (keys, headers, optionally in transactions).
    Produce {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: cli::ProduceArgs,
    },
    /// Read records to stdout (from an offset or time; read_committed by default).
    Consume {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: cli::ConsumeArgs,
    },
    /// Compare the committed content of two topics: counts, per-key
    /// mismatches, missing and extra keys, sums of a numeric field. Exits 1
    /// on a difference.
    Diff {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: cli::DiffArgs,
    },
    /// Hand a topic over from one writer prefix to another: start, status, rollback.
    Cutover {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: cli::CutoverCmd,
    },
    /// What the broker's live verification found: status.
    Verify {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: cli::VerifyCmd,
    },
    /// Audit exactly-once on any Kafka-compatible cluster: real-client
    /// workloads under faults, then a check of the recorded history.
    #[cfg(feature = "audit")]
    Audit(oncelog_audit::runner::AuditArgs),
    /// One workload process of `oncelog audit` (started by it).
    #[command(hide = true)]
    #[cfg(feature = "audit")]
    AuditWorker(oncelog_audit::worker::WorkerArgs),
    /// A native closed-loop produce load for bench/suite.py (librdkafka).
    #[command(hide = true)]
    #[cfg(feature = "audit")]
    BenchLoad(oncelog_audit::load::LoadArgs),
    /// A lean wire-protocol produce load for bench/suite.py.
    #[command(hide = true)]
    BenchWire(oncelog_audit::wire_load::WireLoadArgs),
    /// SCRAM users: create (or set a password), delete, list.
    User {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: cli::UserCmd,
    },
    /// The cluster: id, brokers, supported APIs.
    Cluster {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Print a shell completion script: `oncelog completions bash > /etc/bash_completion.d/oncelog`,
    /// zsh (into a directory on $fpath as `_oncelog`) or fish (~/.config/fish/completions/oncelog.fish).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// Load and audit commands, whose clients' connection chatter during
    /// deliberate broker kills is expected, not news.
    fn quiet_clients(&self) -> bool {
        match self {
            #[cfg(feature = "audit")]
            Command::Audit(_) | Command::AuditWorker(_) | Command::BenchLoad(_) => true,
            Command::BenchWire(_) => true,
            _ => false,
        }
    }
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Cluster id, controller, brokers and the API versions served (from a
    /// broker); with --postgres, a cluster-mode cluster's brokers, leases,
    /// groups, objects and the health of PostgreSQL and the object store,
    /// read from its database (no broker needed; nothing is written).
    Info(ClusterInfoArgs),
}

#[derive(clap::Args)]
struct ClusterInfoArgs {
    /// The cluster's PostgreSQL database (what brokers get as --cluster).
    #[arg(long, env = "ONCELOG_CLUSTER_POSTGRES")]
    postgres: Option<String>,
    /// With --postgres: the object store to probe (a listing), as brokers get it.
    #[arg(long, requires = "postgres")]
    object_store: Option<String>,
}

#[derive(clap::Args)]
struct ConnArgs {
    /// Any Kafka-compatible broker: HOST[:PORT] (port 9092 when left out),
    /// or a comma-separated list of them (`--brokers` too, as rpk says it).
    #[arg(
        long,
        short = 'b',
        visible_alias = "bootstrap-server",
        alias = "brokers",
        value_name = "HOST[:PORT],...",
        global = true,
        env = "ONCELOG_BOOTSTRAP",
        default_value = "127.0.0.1:9092",
        value_parser = oncelog_client::parse_bootstrap
    )]
    bootstrap: String,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Directory for topic logs and broker metadata (setting `data.dir`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// HOST:PORT to listen on (setting `listen`).
    #[arg(long)]
    listen: Option<String>,
    /// HOST:PORT for /metrics and /health (setting `metrics.listen`; empty turns it off).
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Cluster mode: PostgreSQL URL holding every sequencing decision, with
    /// libpq's sslmode/sslrootcert for TLS (setting `cluster.postgres`;
    /// docs/cluster.md).
    #[arg(long = "cluster", value_name = "POSTGRES_URL")]
    cluster: Option<String>,
    /// Cluster mode: s3://bucket/prefix or file:///dir for the batches
    /// (setting `cluster.object.store`).
    #[arg(long, value_name = "URL")]
    object_store: Option<String>,
    /// TOML file of settings, e.g. `"log.segment.bytes" = 1048576`.
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Override one setting: `-o log.retention.ms=60000` (repeatable; wins over the file).
    #[arg(long = "set", short = 'o', value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn settings_help() -> String {
    let mut s = String::from("Settings (Kafka names; from --config, then -o, then the flags):\n");
    for (k, v, help) in SETTINGS {
        s.push_str(&format!("  {k:<34} default {v:<16} {help}\n"));
    }
    s
}

fn load_settings(args: &ServeArgs) -> Result<BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let table: toml::Table =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        for (k, v) in table {
            let v = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => bail!("setting {k}: unsupported value {other}"),
            };
            m.insert(k, v);
        }
    }
    for o in &args.overrides {
        let Some((k, v)) = o.split_once('=') else {
            bail!("-o expects KEY=VALUE, got {o:?}");
        };
        m.insert(k.trim().to_string(), v.trim().to_string());
    }
    if let Some(d) = &args.data_dir {
        m.insert("data.dir".into(), d.display().to_string());
    }
    if let Some(l) = &args.listen {
        m.insert("listen".into(), l.clone());
    }
    if let Some(l) = &args.metrics_listen {
        m.insert("metrics.listen".into(), l.clone());
    }
    if let Some(u) = &args.cluster {
        m.insert("cluster.postgres".into(), u.clone());
    }
    if let Some(u) = &args.object_store {
        m.insert("cluster.object.store".into(), u.clone());
    }
    Ok(m)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONCELOG_LOG").unwrap_or_else(|_| {
                // librdkafka's connection chatter during the auditor's
                // own broker kills is expected, not news.
                let quiet = cli.command.quiet_clients();
                // The connection pool's own warnings repeat what cluster
                // mode says once a minute about PostgreSQL being unreachable.
                tracing_subscriber::EnvFilter::new(if quiet {
                    "info,rdkafka=off,librdkafka=off,deadpool.postgres=error"
                } else {
                    "info,deadpool.postgres=error"
                })
            }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if !matches!(cli.command, Command::Serve(_)) {
        if let Err(e) = cli.security.apply() {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
    match cli.command {
        Command::Serve(args) => {
            if let Err(e) = serve(args) {
                // An operator-facing failure: the cause chain on one line,
                // never a Debug dump or a backtrace. Bad settings exit 2.
                eprintln!("error: {e:#}");
                let code = if e.is::<SettingsError>() { 2 } else { 1 };
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Topic { conn, cmd } => client(|| cli::topic(&conn.bootstrap, conn.json, cmd)),
        Command::Txn { conn, cmd } => client(|| cli::txn(&conn.bootstrap, conn.json, cmd)),
        Command::Group { conn, cmd } => client(|| cli::group(&conn.bootstrap, conn.json, cmd)),
        Command::Produce { conn, args } => {
            client(|| cli::produce(&conn.bootstrap, conn.json, args))
        }
        Command::Consume { conn, args } => client(|| cli::consume(&conn.bootstrap, args)),
        Command::Diff { conn, args } => client(|| cli::diff(&conn.bootstrap, conn.json, args)),
        Command::Cutover { conn, cmd } => client(|| cli::cutover(&conn.bootstrap, conn.json, cmd)),
        Command::Verify { conn, cmd } => client(|| cli::verify(&conn.bootstrap, conn.json, cmd)),
        #[cfg(feature = "audit")]
        Command::Audit(args) => std::process::exit(oncelog_audit::runner::run(args)),
        #[cfg(feature = "audit")]
        Command::AuditWorker(args) => std::process::exit(if args.workload == "recommit" {
            oncelog_audit::recommit::main(args)
        } else {
            oncelog_audit::worker::run(args)
        }),
        #[cfg(feature = "audit")]
        Command::BenchLoad(args) => std::process::exit(oncelog_audit::load::run(args)),
        Command::BenchWire(args) => std::process::exit(oncelog_audit::wire_load::run(args)),
        Command::User { conn, cmd } => client(|| cli::user(&conn.bootstrap, conn.json, cmd)),
        Command::Cluster {
            conn,
            cmd: ClusterCmd::Info(args),
        } => match args.postgres {
            Some(pg) => client(|| cli::cluster_store_info(pg, args.object_store, conn.json)),
            None => client(|| cli::cluster_info(&conn.bootstrap, conn.json)),
        },
        Command::Completions { shell } => {
            // `oncelog completions bash | head` ends quietly, as client
            // commands do (clap_complete panics on a failed write).
            sigpipe::default();
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "oncelog", &mut script);
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            match out.write_all(&script).and_then(|()| out.flush()) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(e) => {
                    eprintln!("error: writing the completion script: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}

/// Runs one client command on a small runtime.
fn client<F, Fut>(f: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    sigpipe::default();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(f());
    if let Err(e) = result {
        // A user-facing failure: the message chain, not a backtrace.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// A setting that is unknown or out of range (exit code 2).
#[derive(Debug)]
struct SettingsError(String);

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

/// Why a listener's address could not be taken, with the usual cause.
fn listen_error(addr: std::net::SocketAddr, what: &str, e: &std::io::Error) -> anyhow::Error {
    let why = match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "address {addr} is already in use: another process listens on port {}",
            addr.port()
        ),
        std::io::ErrorKind::AddrNotAvailable => {
            format!("address {addr} is not an address of this machine")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("no permission to listen on {addr} (ports below 1024 need privileges)")
        }
        _ => format!("{addr}: {e}"),
    };
    anyhow::anyhow!("cannot start the {what} listener: {why}")
}

/// A listener's address, taken (bound) but not yet accepting connections:
/// a port in use stops the start before anything else happens (before the
/// data directory is recovered, before a cluster-mode broker registers),
/// and no client connects before the broker can answer.
struct Reserved {
    socket: tokio::net::TcpSocket,
    addr: std::net::SocketAddr,
    what: String,
}

fn reserve(addr: std::net::SocketAddr, what: &str) -> Result<Reserved> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| listen_error(addr, what, &e))?;
    // as TcpListener::bind does: a restart need not wait out TIME_WAIT
    socket
        .set_reuseaddr(true)
        .and_then(|()| socket.bind(addr))
        .map_err(|e| listen_error(addr, what, &e))?;
    Ok(Reserved {
        socket,
        addr,
        what: what.to_string(),
    })
}

impl Reserved {
    fn listen(self) -> Result<tokio::net::TcpListener> {
        self.socket
            .listen(1024)
            .map_err(|e| listen_error(self.addr, &self.what, &e))
    }
}

/// The web console's address for a browser on this host: a listener on
/// every address (0.0.0.0, ::) is reached at the loopback address.
fn console_url(at: std::net::SocketAddr, tls: bool) -> String {
    let ip = match at.ip() {
        std::net::IpAddr::V4(a) if a.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(a) if a.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}/", std::net::SocketAddr::new(ip, at.port()))
}

fn serve(args: ServeArgs) -> Result<()> {
    let settings = load_settings(&args).map_err(|e| SettingsError(format!("{e:#}")))?;
    let mut config = BrokerConfig::from_map(&settings).map_err(|e| SettingsError(e.to_string()))?;
    alloc_guard::keep_request_buffers();
    match oncelog_broker::backend::local::datadir::raise_open_files_limit() {
        Some(n) => tracing::info!(open_files_limit = n, "this broker may open {n} files"),
        None => tracing::warn!("could not read the open files limit"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let listen = config.listen;
        // Every port is taken first: a broker that cannot serve stops before
        // it recovers its data or registers in a cluster (where Metadata
        // would list it). Connections are accepted once it is ready.
        let mut reserved = Vec::new();
        for l in &config.listeners {
            let what = format!("Kafka ({} {})", l.name, l.protocol.name());
            reserved.push(reserve(l.bind, &what)?);
        }
        let metrics_reserved = match config.metrics_listen {
            Some(addr) => Some((addr, reserve(addr, "metrics (metrics.listen)")?)),
            None => None,
        };
        Broker::assign_node_id(&mut config)
            .await
            .context("starting cluster mode")?;
        if !config.cluster_postgres.is_empty() {
            if config.data_dir_set {
                tracing::warn!(data_dir = %config.data_dir.display(),
                    "cluster mode keeps nothing on local disk: data.dir is not used");
            } else {
                tracing::info!("cluster mode: no data directory (nothing on local disk)");
            }
        }
        let broker = Broker::start(config).await?;
        let mut listeners = Vec::new();
        for r in reserved {
            listeners.push(r.listen()?);
        }
        let metrics_listener = match metrics_reserved {
            Some((addr, r)) => Some((addr, r.listen()?)),
            None => None,
        };
        tracing::info!(
            listen = %listen,
            data_dir = %if broker.front().is_some() {
                "none (cluster mode)".to_string()
            } else {
                broker.config.data_dir.display().to_string()
            },
            advertised = %format!("{}:{}", broker.config.advertised_host, broker.config.advertised_port),
            mode = if broker.front().is_some() {
                "cluster"
            } else if broker.interval_flush() {
                "interval-flush"
            } else {
                "fsync-before-ack"
            },
            "oncelog serving"
        );
        for l in &broker.config.listeners {
            tracing::info!(listener = %l.name, protocol = l.protocol.name(), bind = %l.bind,
                advertised = %format!("{}:{}", l.advertised_host, l.advertised_port), "listener");
        }
        if broker.config.listeners.iter().any(|l| l.protocol.sasl()) {
            tracing::info!(users = broker.users.count(), mechanisms = ?broker.config.sasl_mechanisms, "SASL enabled");
        }
        broker.spawn_background();
        if let Some((addr, l)) = metrics_listener {
            tracing::info!(metrics = %addr, "metrics serving at /metrics and /health");
            if broker.config.console_enable {
                let at = l.local_addr().unwrap_or(addr);
                tracing::info!("console: {}", console_url(at, broker.config.metrics_tls));
            }
            tokio::spawn(oncelog_broker::observe::http::serve(broker.clone(), l));
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            servers.push(tokio::spawn(oncelog_broker::protocol::server::serve(broker.clone(), l, i, stop_rx.clone())));
        }
        drop(stop_rx);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
            why = broker.cluster_stopped() => bail!("{why}"),
        }
        let _ = stop_tx.send(true);
        for s in servers {
            let _ = s.await;
        }
        broker.leave_cluster().await;
        let b = broker.clone();
        let failed = tokio::task::spawn_blocking(move || b.flush_all()).await.unwrap_or(1);
        if failed > 0 {
            bail!("{failed} partitions could not be flushed at shutdown");
        }
        let (syncs, appended_bytes) = broker.io_counters();
        tracing::info!(syncs, appended_bytes, "flushed; stopped cleanly");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    /// Every subcommand's flags, the global ones included, are distinct
    /// (a global flag named like a subcommand's panics when parsed: the
    /// TLS key was once `--key`, which is `oncelog diff`'s record key).
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::{CommandFactory, Parser};
        super::Cli::command().debug_assert();
        for argv in [
            &[
                "oncelog",
                "diff",
                "a",
                "b",
                "--key",
                "id",
                "--cert-key",
                "k.pem",
            ][..],
            &[
                "oncelog",
                "produce",
                "t",
                "--cert",
                "c.pem",
                "--cert-key",
                "k.pem",
            ],
            &["oncelog", "topic", "list", "--ca-cert", "ca.pem"],
        ] {
            super::Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        }
    }

    /// What kafka-topics, kafka-console-consumer, rpk and kcat taught their
    /// users parses here too, to the same options.
    #[test]
    fn the_kafka_tools_spellings_are_accepted() {
        use super::{Cli, Command};
        use clap::Parser;
        let parse =
            |argv: &[&str]| Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        for flag in ["-b", "--bootstrap", "--bootstrap-server", "--brokers"] {
            let Command::Topic { conn, .. } =
                parse(&["oncelog", "topic", "list", flag, "h1"]).command
            else {
                panic!("not topic")
            };
            assert_eq!(conn.bootstrap, "h1:9092", "{flag}");
        }
        let Command::Topic {
            cmd:
                crate::cli::TopicCmd::Create {
                    partitions,
                    replication_factor,
                    configs,
                    ..
                },
            ..
        } = parse(&[
            "oncelog", "topic", "create", "t", "-p", "3", "-r", "1", "-c", "a=b", "-b", "h:1",
        ])
        .command
        else {
            panic!("not topic create")
        };
        assert_eq!(
            (partitions, replication_factor, configs),
            (3, Some(1), vec!["a=b".to_string()])
        );
        assert!(Cli::try_parse_from(["oncelog", "topic", "create", "t", "-r", "0"]).is_err());
        let consume = |args: &[&str]| {
            let mut argv = vec!["oncelog", "consume", "t"];
            argv.extend_from_slice(args);
            match parse(&argv).command {
                Command::Consume { args, .. } => args,
                _ => panic!("not consume"),
            }
        };
        let a = consume(&["-p", "2", "-g", "g1", "-n", "5", "-o", "end"]);
        assert_eq!(
            (
                a.partition,
                a.group.as_deref(),
                a.max_messages,
                a.from.as_str()
            ),
            (Some(2), Some("g1"), Some(5), "end")
        );
        assert_eq!(consume(&["-c", "7"]).max_messages, Some(7));
        assert_eq!(consume(&["--count", "8"]).max_messages, Some(8));
        assert_eq!(consume(&["-o", "-3"]).from, "-3");
        assert!(consume(&["--from-beginning"]).from_beginning);
        assert!(Cli::try_parse_from([
            "oncelog",
            "consume",
            "t",
            "--from-beginning",
            "--from",
            "end"
        ])
        .is_err());
        let Command::Produce { args, .. } =
            parse(&["oncelog", "produce", "t", "-p", "1", "-K", ":"]).command
        else {
            panic!("not produce")
        };
        assert_eq!(
            (args.partition, args.key_separator.as_deref()),
            (Some(1), Some(":"))
        );
        assert_eq!(consume(&["--num", "9"]).max_messages, Some(9));
    }

    #[test]
    fn the_console_url_is_one_a_browser_here_opens() {
        let url = |a: &str| super::console_url(a.parse().unwrap(), false);
        assert_eq!(url("127.0.0.1:9644"), "http://127.0.0.1:9644/");
        assert_eq!(url("0.0.0.0:9644"), "http://127.0.0.1:9644/");
        assert_eq!(url("[::]:9644"), "http://[::1]:9644/");
        assert_eq!(url("10.0.0.5:80"), "http://10.0.0.5:80/");
        let tls = super::console_url("0.0.0.0:9644".parse().unwrap(), true);
        assert_eq!(tls, "https://127.0.0.1:9644/");
    }
}
