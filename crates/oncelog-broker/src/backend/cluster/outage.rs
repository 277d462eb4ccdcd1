//! PostgreSQL unreachable is one condition, said once a minute while it
//! lasts, not one warning per failed statement: every background task and
//! every client request of a cluster-mode broker meets it (before this,
//! 300–700 lines a minute per broker). The first failure says so with the
//! server's address and the error; while it lasts a line a minute counts
//! the failures since; the first success after it says how long it lasted.
//! Errors that are not about reaching PostgreSQL (a constraint, a fence)
//! are logged where they happen, as before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ClusterError;

/// How often an ongoing outage is said again.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// An error that may carry a cluster storage error.
pub trait StorageError: std::fmt::Display {
    fn cluster_error(&self) -> Option<&ClusterError>;
}

impl<T: StorageError + ?Sized> StorageError for &T {
    fn cluster_error(&self) -> Option<&ClusterError> {
        (**self).cluster_error()
    }
}

impl StorageError for ClusterError {
    fn cluster_error(&self) -> Option<&ClusterError> {
        Some(self)
    }
}

impl StorageError for super::catalogue::CatalogueError {
    fn cluster_error(&self) -> Option<&ClusterError> {
        match self {
            super::catalogue::CatalogueError::Cluster(c) => Some(c),
            super::catalogue::CatalogueError::Topic(_) => None,
        }
    }
}

/// Whether `e` says PostgreSQL could not be reached (or is shutting down or
/// starting), rather than that a statement failed.
pub fn unreachable(e: &ClusterError) -> bool {
    match e {
        ClusterError::Pool(deadpool_postgres::PoolError::Backend(pg)) => pg_unreachable(pg),
        ClusterError::Pool(deadpool_postgres::PoolError::Timeout(_))
        | ClusterError::Pool(deadpool_postgres::PoolError::Closed) => true,
        ClusterError::Postgres(pg) => pg_unreachable(pg),
        // no renewal got through: PostgreSQL is unreachable from here
        ClusterError::LeaseUnproven { .. } => true,
        _ => false,
    }
}

fn pg_unreachable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // the server is shutting down, starting or in recovery
        Some(c) => {
            *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::CONNECTION_FAILURE
        }
        // no server answer at all: a socket, TLS or timeout error
        None => {
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                if s.is::<std::io::Error>() {
                    return true;
                }
                source = s.source();
            }
            e.to_string().contains("timed out") || e.to_string().contains("connection")
        }
    }
}

#[derive(Default)]
struct State {
    since: Option<Instant>,
    said_at: Option<Instant>,
    failures: u64,
    failures_said: u64,
}

/// One broker's view of whether PostgreSQL is reachable.
pub struct Outage {
    /// `host:port` of the server(s), for messages.
    address: String,
    state: Mutex<State>,
}

impl Outage {
    pub fn new(config: &tokio_postgres::Config) -> Self {
        let ports = config.get_ports();
        let address = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let host = match h {
                    tokio_postgres::config::Host::Tcp(h) => h.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                };
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                format!("{host}:{port}")
            })
            .collect::<Vec<_>>()
            .join(",");
        Self {
            address,
            state: Mutex::new(State::default()),
        }
    }

    /// Takes `e` when it says PostgreSQL is unreachable (logging the outage
    /// at most once a minute) and returns true; false for any other error,
    /// which the caller logs itself.
    pub fn absorb(&self, e: &impl StorageError) -> bool {
        if !e.cluster_error().is_some_and(unreachable) {
            return false;
        }
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.failures += 1;
        match (s.since, s.said_at) {
            (None, _) => {
                s.since = Some(now);
                s.said_at = Some(now);
                s.failures_said = s.failures;
                tracing::warn!(
                    postgres = %self.address,
                    error = %e,
                    "cluster: PostgreSQL at {} is unreachable; requests that need it get \
                     retriable errors until it is back (said again once a minute)",
                    self.address
                );
            }
            (Some(since), Some(said)) if now.duration_since(said) >= SAY_EVERY => {
                s.said_at = Some(now);
                let more = s.failures - s.failures_said;
                s.failures_said = s.failures;
                tracing::warn!(
                    postgres = %self.address,
                    error = %e,
                    failures = more,
                    "cluster: PostgreSQL at {} still unreachable after {} s ({more} failures in \
                     the last minute)",
                    self.address,
                    since.elapsed().as_secs()
                );
            }
            _ => {}
        }
        true
    }

    /// A statement reached PostgreSQL: ends an outage, saying how long it was.
    pub fn reached(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(since) = s.since.take() {
            tracing::info!(
                postgres = %self.address,
                failures = s.failures,
                "cluster: PostgreSQL at {} is reachable again after {} ms ({} failures)",
                self.address,
                since.elapsed().as_millis(),
                s.failures
            );
            *s = State::default();
        }
    }

    /// Whether an outage is going on (for /health and metrics).
    pub fn ongoing(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .since
            .is_some()
    }
}

/// Logs a cluster error with `tracing::warn!`, unless it says PostgreSQL is
/// unreachable: the cluster's [`Outage`] says that once a minute instead.
macro_rules! cluster_warn {
    ($outage:expr, $err:expr, $($arg:tt)+) => {
        if !$outage.absorb(&$err) {
            tracing::warn!($($arg)+);
        }
    };
}
pub(crate) use cluster_warn;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_timeouts_and_closed_pools_are_outages_and_fences_are_not() {
        let t = ClusterError::Pool(deadpool_postgres::PoolError::Timeout(
            deadpool_postgres::TimeoutType::Create,
        ));
        assert!(unreachable(&t));
        assert!(unreachable(&ClusterError::Pool(
            deadpool_postgres::PoolError::Closed
        )));
        assert!(!unreachable(&ClusterError::Fenced {
            broker_id: 1,
            session: 2
        }));
        assert!(!unreachable(&ClusterError::Config("x".into())));
    }

    #[test]
    fn an_outage_is_absorbed_and_ended() {
        let o = Outage::new(&"host=db.example port=6543".parse().unwrap());
        assert_eq!(o.address, "db.example:6543");
        let t = ClusterError::Pool(deadpool_postgres::PoolError::Timeout(
            deadpool_postgres::TimeoutType::Wait,
        ));
        assert!(o.absorb(&t) && o.absorb(&t) && o.ongoing());
        assert!(!o.absorb(&ClusterError::Config("x".into())));
        o.reached();
        assert!(!o.ongoing());
    }
}
