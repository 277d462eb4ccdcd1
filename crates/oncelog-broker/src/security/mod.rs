//! Listeners and authentication.
//!
//! * **Listeners**, as Kafka names them: `listeners=NAME://HOST:PORT,…`,
//!   each name's security protocol from `listener.security.protocol.map`,
//!   and `advertised.listeners` for what Metadata tells a client that came
//!   in on that listener. Without `listeners` the broker has one PLAINTEXT
//!   listener on `listen`.
//! * **SASL** on SASL_PLAINTEXT listeners: SaslHandshake v0–1 and
//!   SaslAuthenticate v0–2 (KIP-152 framing; after a v0 handshake the tokens
//!   travel raw, length-prefixed, as the oldest clients send them), the
//!   mechanisms PLAIN and SCRAM-SHA-256/512 ([`oncelog_auth`]). Until a
//!   connection has authenticated, only ApiVersions and the two SASL APIs
//!   are served; anything else closes it. A failed authentication is
//!   answered SASL_AUTHENTICATION_FAILED after
//!   `connection.failed.authentication.delay.ms`, counted, logged without
//!   the secret, and the connection closed. With
//!   `connections.max.reauth.ms` the session lifetime is announced
//!   (KIP-368) and a connection that outlives it without re-authenticating
//!   as the same principal is closed.
//! * **SCRAM credentials** ([`ScramUsers`]): salt, iterations, StoredKey and
//!   ServerKey per user and mechanism, never a password, in
//!   `scram-credentials.json` (replaced atomically, changes serialised),
//!   managed through DescribeUserScramCredentials and
//!   AlterUserScramCredentials. PLAIN checks its password against them too,
//!   so one set of users serves both mechanisms.

pub mod acl;
pub mod principal_map;
#[cfg(feature = "tls")]
pub mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::alter_user_scram_credentials_request::AlterUserScramCredentialsRequest;
use kafka_protocol::messages::alter_user_scram_credentials_response::{
    AlterUserScramCredentialsResponse, AlterUserScramCredentialsResult,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::DescribeUserScramCredentialsRequest;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResponse, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::sasl_authenticate_request::SaslAuthenticateRequest;
use kafka_protocol::messages::sasl_authenticate_response::SaslAuthenticateResponse;
use kafka_protocol::messages::sasl_handshake_request::SaslHandshakeRequest;
use kafka_protocol::messages::sasl_handshake_response::SaslHandshakeResponse;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::StrBytes;
use oncelog_auth::{AuthError, Credential, Mechanism, PlainMessage, ScramServer, ServerStep};

use crate::error::{ErrorCode, TopicError};

pub const USERS_FILE: &str = "scram-credentials.json";

/// The principal of a client that did not authenticate (a PLAINTEXT
/// listener), as Kafka names it.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PLAINTEXT" => Self::Plaintext,
            "SSL" => Self::Ssl,
            "SASL_PLAINTEXT" => Self::SaslPlaintext,
            "SASL_SSL" => Self::SaslSsl,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    pub fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    pub fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

/// One listener: where it binds, its protocol, what Metadata advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub protocol: SecurityProtocol,
    pub bind: SocketAddr,
    pub advertised_host: String,
    pub advertised_port: i32,
}

/// `NAME://HOST:PORT` (HOST may be empty for every address, or `[v6]`).
fn parse_endpoint(s: &str) -> Result<(String, String, u16), String> {
    let (name, rest) = s
        .split_once("://")
        .ok_or_else(|| format!("`{s}`: expected NAME://HOST:PORT"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("`{s}`: expected NAME://HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("`{s}`: bad port `{port}`"))?;
    let name = name.trim().to_ascii_uppercase();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!("`{s}`: bad listener name"));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((name, host, port))
}

/// The listeners of `listeners`, `advertised.listeners` and
/// `listener.security.protocol.map`; with `listeners` empty, one PLAINTEXT
/// listener on `listen` advertised as `advertised` (HOST:PORT, or empty).
pub fn parse_listeners(
    listeners: &str,
    advertised_listeners: &str,
    protocol_map: &str,
    listen: SocketAddr,
    advertised: Option<(String, i32)>,
) -> Result<Vec<Listener>, String> {
    let mut map: BTreeMap<String, SecurityProtocol> = BTreeMap::new();
    for entry in protocol_map
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (name, proto) = entry.split_once(':').ok_or_else(|| {
            format!("listener.security.protocol.map: `{entry}`: expected NAME:PROTOCOL")
        })?;
        let proto = SecurityProtocol::parse(proto.trim()).ok_or_else(|| {
            format!("listener.security.protocol.map: `{proto}` is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
        })?;
        map.insert(name.trim().to_ascii_uppercase(), proto);
    }
    if listeners.trim().is_empty() {
        let (advertised_host, advertised_port) =
            advertised.unwrap_or_else(|| (listen.ip().to_string(), i32::from(listen.port())));
        return Ok(vec![Listener {
            name: "PLAINTEXT".into(),
            protocol: SecurityProtocol::Plaintext,
            bind: listen,
            advertised_host,
            advertised_port,
        }]);
    }
    let mut out: Vec<Listener> = Vec::new();
    for e in listeners
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (name, host, port) = parse_endpoint(e).map_err(|w| format!("listeners: {w}"))?;
        let protocol = map.get(&name).copied().ok_or_else(|| {
            format!(
                "listeners: `{name}` has no security protocol in listener.security.protocol.map"
            )
        })?;
        if out.iter().any(|l| l.name == name) {
            return Err(format!("listeners: `{name}` is named twice"));
        }
        let ip = if host.is_empty() {
            std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        } else {
            host.parse().map_err(|_| {
                format!("listeners: `{e}`: bind to an IP address (a host name is for advertised.listeners)")
            })?
        };
        let bind = SocketAddr::new(ip, port);
        if out.iter().any(|l| l.bind == bind) {
            return Err(format!("listeners: {bind} is used twice"));
        }
        out.push(Listener {
            advertised_host: if host.is_empty() {
                "127.0.0.1".into()
            } else {
                host
            },
            advertised_port: i32::from(port),
            name,
            protocol,
            bind,
        });
    }
    if out.is_empty() {
        return Err("listeners: no listener".into());
    }
    for e in advertised_listeners
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (name, host, port) =
            parse_endpoint(e).map_err(|w| format!("advertised.listeners: {w}"))?;
        let l = out
            .iter_mut()
            .find(|l| l.name == name)
            .ok_or_else(|| format!("advertised.listeners: `{name}` is not in listeners"))?;
        if host.is_empty() {
            return Err(format!("advertised.listeners: `{e}` needs a host"));
        }
        l.advertised_host = host;
        l.advertised_port = i32::from(port);
    }
    Ok(out)
}

// ------------------------------------------------------------ credentials

pub type UserMap = BTreeMap<String, BTreeMap<Mechanism, Credential>>;

/// Every user's SCRAM credentials, durable in the data dir.
pub struct ScramUsers {
    /// `None` in cluster mode: the credentials are the cluster's, set here
    /// at each refresh.
    dir: Option<PathBuf>,
    state: Arc<Mutex<UserMap>>,
}

impl ScramUsers {
    pub fn open(data_dir: &Path) -> Result<Self, TopicError> {
        let state = crate::files::read_json(data_dir, USERS_FILE)?;
        Ok(Self {
            dir: Some(data_dir.to_path_buf()),
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// Cluster mode's: in memory, replaced from the cluster's rows.
    pub fn in_memory() -> Self {
        Self {
            dir: None,
            state: Arc::new(Mutex::new(UserMap::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UserMap> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, user: &str, mech: Mechanism) -> Option<Credential> {
        self.lock().get(user).and_then(|m| m.get(&mech)).cloned()
    }

    /// The user's credentials, for a PLAIN check.
    pub fn all_of(&self, user: &str) -> Vec<(Mechanism, Credential)> {
        self.lock()
            .get(user)
            .map(|m| m.iter().map(|(k, v)| (*k, v.clone())).collect())
            .unwrap_or_default()
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    pub fn describe(
        &self,
        req: &DescribeUserScramCredentialsRequest,
    ) -> DescribeUserScramCredentialsResponse {
        let state = self.lock();
        let info = |m: &BTreeMap<Mechanism, Credential>| {
            m.iter()
                .map(|(mech, c)| {
                    CredentialInfo::default()
                        .with_mechanism(mech.wire_id())
                        .with_iterations(c.iterations as i32)
                })
                .collect::<Vec<_>>()
        };
        let ok = |user: &str, m: &BTreeMap<Mechanism, Credential>| {
            DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user.to_string()))
                .with_credential_infos(info(m))
        };
        let results = match req.users.as_deref() {
            None | Some([]) => state.iter().map(|(u, m)| ok(u, m)).collect(),
            Some(users) => {
                let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
                for u in users {
                    *seen.entry(u.name.as_str()).or_default() += 1;
                }
                seen.into_iter()
                    .map(|(u, n)| {
                        let fail = |code: ErrorCode, msg: &str| {
                            DescribeUserScramCredentialsResult::default()
                                .with_user(StrBytes::from_string(u.to_string()))
                                .with_error_code(code.code())
                                .with_error_message(Some(StrBytes::from_string(msg.to_string())))
                        };
                        if n > 1 {
                            fail(ErrorCode::DuplicateResource, "Cannot describe SCRAM credentials for the same user twice in a single request")
                        } else {
                            match state.get(u) {
                                Some(m) => ok(u, m),
                                None => fail(ErrorCode::ResourceNotFound, "Attempt to describe a user credential that does not exist"),
                            }
                        }
                    })
                    .collect()
            }
        };
        DescribeUserScramCredentialsResponse::default().with_results(results)
    }

    /// Runs `plan` on the credentials under the lock and stores what it
    /// makes of them (when that differs) in one atomic write, taking it
    /// only once stored. Returns whether it was stored, what `plan` made,
    /// and its answer.
    pub fn change<P>(
        &self,
        plan: impl FnOnce(&UserMap) -> (UserMap, P),
    ) -> (Result<(), String>, UserMap, P) {
        let mut state = self.lock();
        let (next, p) = plan(&state);
        let stored = if next != *state {
            serde_json::to_vec_pretty(&next)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    crate::files::local_dir(&self.dir)
                        .and_then(|dir| crate::files::write_atomically(dir, USERS_FILE, &bytes))
                        .map_err(|e| e.to_string())
                })
        } else {
            Ok(())
        };
        if stored.is_ok() {
            *state = next.clone();
        }
        (stored, next, p)
    }

    /// Every user's credentials as they stand.
    pub fn users(&self) -> UserMap {
        self.lock().clone()
    }

    /// The credentials' cell, for cluster mode to replace with the
    /// cluster's.
    pub fn shared(&self) -> Arc<Mutex<UserMap>> {
        self.state.clone()
    }
}

/// What an AlterUserScramCredentials makes of `current`, and its answer
/// once the storing is known: both modes run it on the credentials they
/// hold under their lock (local mode's mutex, cluster mode's row).
pub fn plan_alter(
    current: &UserMap,
    req: &AlterUserScramCredentialsRequest,
) -> (UserMap, AlterPlan) {
    enum Change {
        Delete(Mechanism),
        Upsert(Mechanism, Credential),
    }
    let mut per_user: BTreeMap<String, Vec<Result<Change, (ErrorCode, String)>>> = BTreeMap::new();
    for d in &req.deletions {
        let r = match Mechanism::from_wire_id(d.mechanism) {
            Some(m) => Ok(Change::Delete(m)),
            None => Err((
                ErrorCode::UnsupportedSaslMechanism,
                "Unknown SCRAM mechanism".to_string(),
            )),
        };
        per_user.entry(d.name.to_string()).or_default().push(r);
    }
    for u in &req.upsertions {
        let r = match Mechanism::from_wire_id(u.mechanism) {
            None => Err((
                ErrorCode::UnsupportedSaslMechanism,
                "Unknown SCRAM mechanism".to_string(),
            )),
            Some(_) if u.iterations < Mechanism::MIN_ITERATIONS => Err((
                ErrorCode::UnacceptableCredential,
                format!(
                    "Too few iterations: at least {} are required",
                    Mechanism::MIN_ITERATIONS
                ),
            )),
            Some(_) if u.iterations > Mechanism::MAX_ITERATIONS => Err((
                ErrorCode::UnacceptableCredential,
                format!(
                    "Too many iterations: at most {} are allowed",
                    Mechanism::MAX_ITERATIONS
                ),
            )),
            Some(m) if u.salt.is_empty() || u.salted_password.is_empty() => {
                let _ = m;
                Err((
                    ErrorCode::UnacceptableCredential,
                    "Salt and salted password must not be empty".to_string(),
                ))
            }
            Some(m) => Ok(Change::Upsert(
                m,
                Credential::from_salted(m, &u.salt, u.iterations as u32, &u.salted_password),
            )),
        };
        per_user.entry(u.name.to_string()).or_default().push(r);
    }
    let mut next = current.clone();
    let mut results = Vec::new();
    for (user, changes) in per_user {
        let outcome = (|| -> Result<(), (ErrorCode, String)> {
            if user.is_empty() {
                return Err((
                    ErrorCode::UnacceptableCredential,
                    "Username must not be empty".into(),
                ));
            }
            let mut mechs: Vec<Mechanism> = Vec::new();
            let mut ok = Vec::new();
            for c in changes {
                let c = c?;
                let m = match &c {
                    Change::Delete(m) | Change::Upsert(m, _) => *m,
                };
                if mechs.contains(&m) {
                    return Err((
                        ErrorCode::DuplicateResource,
                        "A user credential cannot be altered twice in the same request".into(),
                    ));
                }
                mechs.push(m);
                ok.push(c);
            }
            let mut creds = next.get(&user).cloned().unwrap_or_default();
            for c in ok {
                match c {
                    Change::Delete(m) => {
                        if creds.remove(&m).is_none() {
                            return Err((
                                ErrorCode::ResourceNotFound,
                                "Attempt to delete a user credential that does not exist".into(),
                            ));
                        }
                    }
                    Change::Upsert(m, cred) => {
                        creds.insert(m, cred);
                    }
                }
            }
            if creds.is_empty() {
                next.remove(&user);
            } else {
                next.insert(user.clone(), creds);
            }
            Ok(())
        })();
        let mut r = AlterUserScramCredentialsResult::default()
            .with_user(StrBytes::from_string(user.clone()));
        if let Err((code, msg)) = outcome {
            r = r
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(msg)));
        }
        results.push(r);
    }
    (next, AlterPlan(results))
}

pub struct AlterPlan(Vec<AlterUserScramCredentialsResult>);

impl AlterPlan {
    pub fn answer(
        self,
        stored: &Result<(), String>,
        next: &UserMap,
    ) -> AlterUserScramCredentialsResponse {
        let mut results = self.0;
        match stored {
            Err(e) => {
                tracing::error!(error = %e, "SCRAM credentials could not be written; nothing changed");
                for r in &mut results {
                    if r.error_code == 0 {
                        r.error_code = ErrorCode::KafkaStorageError.code();
                        r.error_message = Some(StrBytes::from_string(format!(
                            "could not store the credentials: {e}"
                        )));
                    }
                }
            }
            Ok(()) => {
                for r in results.iter().filter(|r| r.error_code == 0) {
                    let user = r.user.as_str();
                    let now: Vec<&str> = next
                        .get(user)
                        .map(|m| m.keys().map(|k| k.name()).collect())
                        .unwrap_or_default();
                    tracing::info!(user, mechanisms = ?now, "SCRAM credentials changed");
                }
            }
        }
        AlterUserScramCredentialsResponse::default().with_results(results)
    }
}

// ------------------------------------------------------------ statistics

/// Authentication outcomes by listener, mechanism and result, for /metrics.
#[derive(Default)]
pub struct AuthStats {
    counts: Mutex<BTreeMap<(String, String, &'static str), u64>>,
}

impl AuthStats {
    pub fn count(&self, listener: &str, mechanism: &str, result: &'static str) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *c.entry((listener.to_string(), mechanism.to_string(), result))
            .or_default() += 1;
    }

    pub fn snapshot(&self) -> Vec<((String, String, &'static str), u64)> {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

// ------------------------------------------------------------ connection limits

/// Open client connections, for `max.connections` and
/// `max.connections.per.ip`, and the ones refused or closed early.
#[derive(Default)]
pub struct Connections {
    per_ip: Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    total: std::sync::atomic::AtomicUsize,
    refused: Mutex<BTreeMap<&'static str, u64>>,
    last_warn_ms: std::sync::atomic::AtomicI64,
}

/// One admitted connection; leaving frees its place.
pub struct ConnSlot {
    conns: std::sync::Arc<Connections>,
    ip: std::net::IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.conns
            .total
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        let mut m = self.conns.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

impl Connections {
    /// A place for a new connection from `ip`, or why there is none
    /// (`max_connections`, `max_connections_per_ip`).
    pub fn admit(
        self: &std::sync::Arc<Self>,
        ip: std::net::IpAddr,
        max: usize,
        max_per_ip: usize,
    ) -> Result<ConnSlot, &'static str> {
        let mut m = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let why = if self.total.load(std::sync::atomic::Ordering::Relaxed) >= max {
            Some("max_connections")
        } else if m.get(&ip).copied().unwrap_or(0) >= max_per_ip {
            Some("max_connections_per_ip")
        } else {
            None
        };
        if let Some(why) = why {
            drop(m);
            self.count_refused(why);
            return Err(why);
        }
        *m.entry(ip).or_default() += 1;
        self.total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(ConnSlot {
            conns: self.clone(),
            ip,
        })
    }

    pub fn count_refused(&self, why: &'static str) {
        let mut r = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        *r.entry(why).or_default() += 1;
    }

    /// Whether a refusal should be logged now (at most once a second).
    pub fn warn_now(&self) -> bool {
        let now = oncelog_log::now_ms();
        let last = self.last_warn_ms.load(std::sync::atomic::Ordering::Relaxed);
        now - last >= 1000
            && self
                .last_warn_ms
                .compare_exchange(
                    last,
                    now,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
    }

    pub fn open(&self) -> usize {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn refused(&self) -> Vec<(&'static str, u64)> {
        let r = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

// ------------------------------------------------------------ a connection

/// What the broker's security needs from the broker.
pub struct Auth<'a> {
    pub users: &'a ScramUsers,
    pub stats: &'a AuthStats,
    /// `sasl.enabled.mechanisms`.
    pub mechanisms: &'a [String],
    /// `connections.max.reauth.ms` (0: no re-authentication).
    pub reauth_ms: i64,
}

enum Exchange {
    Plain,
    Scram(ScramServer),
}

enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// The mechanism is chosen; `raw`: tokens come without Kafka framing
    /// (SaslHandshake v0).
    Exchanging {
        mechanism: String,
        exchange: Exchange,
        raw: bool,
    },
    /// Authenticated as the connection's principal.
    Done,
}

/// What the connection does with a frame.
pub enum Verdict {
    /// Send these bytes (a framed response, or a raw token) and go on.
    Reply(Bytes),
    /// Send these bytes after the failed-authentication delay, then close.
    Fail(Bytes),
    /// Close at once; the reason is logged.
    Close(String),
    /// Not a SASL matter: handle as a request.
    Request,
}

/// One connection's authentication.
pub struct Session {
    pub listener: String,
    pub peer: SocketAddr,
    sasl: bool,
    state: State,
    principal: Option<String>,
    expires: Option<Instant>,
}

impl Session {
    pub fn new(listener: &Listener, peer: SocketAddr) -> Self {
        let sasl = listener.protocol.sasl();
        Self {
            listener: listener.name.clone(),
            peer,
            sasl,
            state: if sasl { State::Handshake } else { State::Done },
            principal: if sasl {
                None
            } else {
                Some(ANONYMOUS.to_string())
            },
            expires: None,
        }
    }

    /// On an SSL listener: the verified client certificate's principal.
    pub fn set_certificate_principal(&mut self, principal: String) {
        if !self.sasl {
            self.principal = Some(principal);
        }
    }

    /// The authenticated principal (`User:NAME`), if any yet.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// After a SaslHandshake v0 the next frames are raw tokens.
    pub fn expects_raw_token(&self) -> bool {
        matches!(self.state, State::Exchanging { raw: true, .. })
    }

    /// Whether a SASL exchange is under way (a handshake that left none
    /// open is answered, then its connection closed).
    pub fn exchanging(&self) -> bool {
        matches!(self.state, State::Exchanging { .. })
    }

    /// Judges a request frame of API `key` that is not a SASL request.
    pub fn gate(&self, key: i16) -> Verdict {
        if !self.sasl {
            return Verdict::Request;
        }
        if self.principal.is_none() {
            if key == ApiKey::ApiVersions as i16 {
                return Verdict::Request;
            }
            let name = ApiKey::try_from(key)
                .map(|k| format!("{k:?}"))
                .unwrap_or_else(|_| format!("API {key}"));
            return Verdict::Close(format!(
                "the client sent {name} before authenticating (a SASL listener expects \
                 SaslHandshake after ApiVersions: a client without SASL settings?)"
            ));
        }
        if self.expires.is_some_and(|e| Instant::now() >= e) {
            return Verdict::Close(
                "SASL session expired without re-authentication (connections.max.reauth.ms)".into(),
            );
        }
        Verdict::Request
    }

    pub fn handshake(
        &mut self,
        r: SaslHandshakeRequest,
        version: i16,
        auth: &Auth<'_>,
    ) -> SaslHandshakeResponse {
        let offered: Vec<StrBytes> = auth
            .mechanisms
            .iter()
            .map(|m| StrBytes::from_string(m.clone()))
            .collect();
        let resp = SaslHandshakeResponse::default().with_mechanisms(offered);
        let mechanism = r.mechanism.to_string();
        let reauth = matches!(self.state, State::Done) && self.principal.is_some();
        let allowed = self.sasl
            && (matches!(self.state, State::Handshake)
                || (reauth && auth.reauth_ms > 0 && version >= 1));
        if !allowed {
            tracing::warn!(listener = %self.listener, peer = %self.peer, "SaslHandshake out of place (not a SASL listener, or a second one without re-authentication enabled)");
            self.state = State::Done;
            return resp.with_error_code(ErrorCode::IllegalSaslState.code());
        }
        if !auth.mechanisms.iter().any(|m| *m == mechanism) {
            tracing::warn!(listener = %self.listener, peer = %self.peer, mechanism, enabled = ?auth.mechanisms, "SASL mechanism not enabled");
            auth.stats.count(&self.listener, &mechanism, "failure");
            return resp.with_error_code(ErrorCode::UnsupportedSaslMechanism.code());
        }
        let exchange = if mechanism == "PLAIN" {
            Exchange::Plain
        } else if let Some(m) = Mechanism::from_name(&mechanism) {
            Exchange::Scram(ScramServer::new(m))
        } else {
            auth.stats.count(&self.listener, &mechanism, "failure");
            return resp.with_error_code(ErrorCode::UnsupportedSaslMechanism.code());
        };
        self.state = State::Exchanging {
            mechanism,
            exchange,
            raw: version == 0,
        };
        resp
    }

    /// One SaslAuthenticate; `true` when it failed (the connection closes).
    pub fn authenticate(
        &mut self,
        r: SaslAuthenticateRequest,
        version: i16,
        auth: &Auth<'_>,
    ) -> (SaslAuthenticateResponse, bool) {
        let resp = SaslAuthenticateResponse::default();
        if !matches!(self.state, State::Exchanging { raw: false, .. }) {
            let msg = "SaslAuthenticate without a SaslHandshake (v1) first";
            tracing::warn!(listener = %self.listener, peer = %self.peer, "{msg}");
            return (
                resp.with_error_code(ErrorCode::IllegalSaslState.code())
                    .with_error_message(Some(StrBytes::from_static_str(msg))),
                true,
            );
        }
        match self.step(&r.auth_bytes, auth) {
            Ok((bytes, done)) => {
                let mut resp = resp.with_auth_bytes(Bytes::from(bytes));
                if done && version >= 1 && auth.reauth_ms > 0 {
                    resp.session_lifetime_ms = auth.reauth_ms;
                }
                (resp, false)
            }
            Err(msg) => (
                resp.with_error_code(ErrorCode::SaslAuthenticationFailed.code())
                    .with_error_message(Some(StrBytes::from_string(msg))),
                true,
            ),
        }
    }

    /// A raw token after SaslHandshake v0: answered raw (length-prefixed);
    /// a failure closes the connection, as Kafka does.
    pub fn raw_token(&mut self, frame: &Bytes, auth: &Auth<'_>) -> Verdict {
        match self.step(frame, auth) {
            Ok((bytes, _)) => {
                let mut b = BytesMut::with_capacity(4 + bytes.len());
                b.put_i32(bytes.len() as i32);
                b.extend_from_slice(&bytes);
                Verdict::Reply(b.freeze())
            }
            Err(_) => Verdict::Fail(Bytes::new()),
        }
    }

    /// Runs one step of the chosen mechanism: (bytes to send, done).
    fn step(&mut self, token: &[u8], auth: &Auth<'_>) -> Result<(Vec<u8>, bool), String> {
        let State::Exchanging {
            mechanism,
            exchange,
            ..
        } = &mut self.state
        else {
            return Err("no SASL exchange in progress".into());
        };
        let mechanism = mechanism.clone();
        let result: Result<Option<(Vec<u8>, String)>, (AuthError, Option<String>)> = match exchange
        {
            Exchange::Plain => match PlainMessage::parse(token) {
                Ok(m) => {
                    let ok = auth
                        .users
                        .all_of(&m.user)
                        .iter()
                        .any(|(mech, c)| c.matches_password(*mech, &m.password));
                    if ok {
                        Ok(Some((Vec::new(), m.user)))
                    } else {
                        Err((AuthError::InvalidCredentials, Some(m.user)))
                    }
                }
                Err(e) => Err((e, None)),
            },
            Exchange::Scram(server) => {
                let mech = server.mechanism();
                let user_before = server.user().map(str::to_string);
                match server.step(token, |u| auth.users.get(u, mech)) {
                    Ok(ServerStep::Continue(b)) => return Ok((b, false)),
                    Ok(ServerStep::Done { response, user }) => Ok(Some((response, user))),
                    Err(e) => Err((e, user_before.or_else(|| server.user().map(str::to_string)))),
                }
            }
        };
        match result {
            Ok(Some((bytes, user))) => {
                let principal = format!("User:{user}");
                if let Some(old) = self.principal.as_ref().filter(|p| **p != principal) {
                    let msg = format!("re-authentication as {principal} on a connection of {old}: the principal may not change");
                    tracing::warn!(listener = %self.listener, peer = %self.peer, mechanism, "{msg}");
                    auth.stats.count(&self.listener, &mechanism, "failure");
                    self.state = State::Done;
                    return Err(msg);
                }
                let again = self.principal.is_some();
                tracing::info!(listener = %self.listener, peer = %self.peer, mechanism, principal, reauthentication = again, "authenticated");
                auth.stats.count(&self.listener, &mechanism, "success");
                self.principal = Some(principal);
                self.state = State::Done;
                self.expires = (auth.reauth_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(auth.reauth_ms as u64));
                Ok((bytes, true))
            }
            Ok(None) => Ok((Vec::new(), false)),
            Err((e, user)) => {
                // The user name, never the secret.
                tracing::warn!(listener = %self.listener, peer = %self.peer, mechanism, user = user.as_deref().unwrap_or("?"), error = %e, "authentication failed");
                auth.stats.count(&self.listener, &mechanism, "failure");
                self.state = State::Done;
                Err(match e {
                    AuthError::InvalidCredentials => format!(
                        "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
                    ),
                    e => format!("Authentication failed with SASL mechanism {mechanism}: {e}"),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    const MAP: &str = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,INTERNAL:SASL_PLAINTEXT";

    #[test]
    fn a_request_before_authentication_is_named() {
        let l = parse_listeners(
            "SASL_PLAINTEXT://127.0.0.1:9094",
            "",
            MAP,
            addr("127.0.0.1:1"),
            None,
        )
        .unwrap();
        let session = Session::new(&l[0], addr("127.0.0.1:5"));
        assert!(matches!(
            session.gate(ApiKey::ApiVersions as i16),
            Verdict::Request
        ));
        match session.gate(ApiKey::Metadata as i16) {
            Verdict::Close(why) => {
                assert!(
                    why.starts_with("the client sent Metadata before authenticating"),
                    "{why}"
                )
            }
            _ => panic!("Metadata before authentication was let through"),
        }
    }

    #[test]
    fn listeners_parse_as_kafka_names_them() {
        let l = parse_listeners("", "", MAP, addr("127.0.0.1:9092"), None).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(
            (l[0].name.as_str(), l[0].protocol, l[0].advertised_port),
            ("PLAINTEXT", SecurityProtocol::Plaintext, 9092)
        );
        let l = parse_listeners(
            "PLAINTEXT://127.0.0.1:9092, internal://[::1]:9093,SASL_PLAINTEXT://:9094",
            "INTERNAL://broker-1.example:19093",
            MAP,
            addr("127.0.0.1:1"),
            None,
        )
        .unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(
            (l[1].name.as_str(), l[1].protocol),
            ("INTERNAL", SecurityProtocol::SaslPlaintext)
        );
        assert_eq!(l[1].bind, addr("[::1]:9093"));
        assert_eq!(
            (l[1].advertised_host.as_str(), l[1].advertised_port),
            ("broker-1.example", 19093)
        );
        assert_eq!(l[2].bind, addr("0.0.0.0:9094"));
        for (ls, adv, why) in [
            ("NOPE://127.0.0.1:1", "", "no security protocol"),
            ("PLAINTEXT://127.0.0.1", "", "expected NAME://HOST:PORT"),
            (
                "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2",
                "",
                "named twice",
            ),
            (
                "PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:1",
                "",
                "used twice",
            ),
            ("PLAINTEXT://localhost:1", "", "IP address"),
            ("PLAINTEXT://127.0.0.1:1", "SSL://h:2", "not in listeners"),
            ("PLAINTEXT://127.0.0.1:99999", "", "bad port"),
        ] {
            let e = parse_listeners(ls, adv, MAP, addr("127.0.0.1:1"), None).unwrap_err();
            assert!(e.contains(why), "{ls} {adv}: {e}");
        }
        assert!(
            parse_listeners("A://127.0.0.1:1", "", "A:TLS", addr("127.0.0.1:1"), None).is_err()
        );
    }
}
