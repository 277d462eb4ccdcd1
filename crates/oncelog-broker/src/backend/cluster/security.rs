//! The cluster's ACLs and SCRAM credentials: one `security_docs` row each,
//! changed only inside a PostgreSQL transaction that holds the row (so
//! changes through several brokers at once each see the one before), and
//! announced on the catalogue channel. Every broker's copy, which
//! authentication and authorization read, is replaced from these rows at
//! each refresh of the catalogue (at once on the announcement, at the
//! latest every 500 ms); a broker's own data directory holds none of them.

use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::catalogue::CATALOGUE_CHANNEL;
use super::ClusterError;
use crate::security::acl::Acl;
use crate::security::UserMap;

/// The row of the ACLs.
pub const ACLS: &str = "acls";
/// The row of the SCRAM credentials.
pub const USERS: &str = "scram_credentials";

/// The cells a broker's authorizer and SASL listeners read, which the
/// cluster's rows replace. Each row carries a version, bumped by every
/// change: a copy only ever moves to a newer one, so a change answered
/// late (or a read that raced a newer change) never puts back an older
/// set of users or ACLs.
#[derive(Clone)]
pub struct Copies {
    pub acls: Arc<Mutex<Vec<Acl>>>,
    pub users: Arc<Mutex<UserMap>>,
    /// The versions the copies hold: (ACLs, credentials).
    versions: Arc<Mutex<(i64, i64)>>,
}

impl Copies {
    pub fn new(acls: Arc<Mutex<Vec<Acl>>>, users: Arc<Mutex<UserMap>>) -> Self {
        Self {
            acls,
            users,
            versions: Arc::new(Mutex::new((-1, -1))),
        }
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, (i64, i64)> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the ACLs of row version `version`, unless the copy is newer.
    pub fn set_acls(&self, acls: Vec<Acl>, version: i64) {
        let mut v = self.versions();
        if version >= v.0 {
            *self.acls.lock().unwrap_or_else(|p| p.into_inner()) = acls;
            v.0 = version;
        }
    }

    /// Takes the credentials of row version `version`, unless the copy is
    /// newer.
    pub fn set_users(&self, users: UserMap, version: i64) {
        let mut v = self.versions();
        if version >= v.1 {
            *self.users.lock().unwrap_or_else(|p| p.into_inner()) = users;
            v.1 = version;
        }
    }

    /// Replaces both copies with the cluster's rows.
    pub async fn refresh(&self, pool: &Pool) -> Result<(), ClusterError> {
        self.refresh_on(&*pool.get().await?).await
    }

    /// [`Self::refresh`] on a connection of the caller's, both reads
    /// pipelined.
    pub async fn refresh_on(
        &self,
        client: &deadpool_postgres::ClientWrapper,
    ) -> Result<(), ClusterError> {
        let ((acls, av), (users, uv)) =
            futures_util::try_join!(load_on(client, ACLS), load_on(client, USERS))?;
        self.set_acls(acls, av);
        self.set_users(users, uv);
        Ok(())
    }
}

fn bad_doc(name: &str, e: serde_json::Error) -> ClusterError {
    ClusterError::Invariant(format!("the cluster's {name} row cannot be read: {e}"))
}

/// One document as stored and its version (its default and version 0 when
/// it was never written).
pub async fn load<T: DeserializeOwned + Default>(
    pool: &Pool,
    name: &str,
) -> Result<(T, i64), ClusterError> {
    load_on(&*pool.get().await?, name).await
}

/// [`load`] on a connection of the caller's.
pub async fn load_on<T: DeserializeOwned + Default>(
    client: &deadpool_postgres::ClientWrapper,
    name: &str,
) -> Result<(T, i64), ClusterError> {
    // prepared once per connection: every broker runs this every second
    let st = client
        .prepare_cached("SELECT doc, version FROM security_docs WHERE name = $1")
        .await?;
    let row = client.query_opt(&st, &[&name]).await?;
    match row {
        None => Ok((T::default(), 0)),
        Some(r) => Ok((
            serde_json::from_value(r.get(0)).map_err(|e| bad_doc(name, e))?,
            r.get(1),
        )),
    }
}

/// Changes one document in one transaction holding its row: `plan` gets
/// the current document and gives the next and its answer; the next is
/// written (and announced, with a new version) only when it differs. Run
/// twice, or through two brokers at once, each change applies to the
/// other's result. Gives the document after it, its version, and the answer.
pub async fn change<T, A>(
    pool: &Pool,
    name: &str,
    plan: impl FnOnce(&T) -> (T, A),
) -> Result<(T, i64, A), ClusterError>
where
    T: Serialize + DeserializeOwned + Default + PartialEq,
{
    let empty = serde_json::to_value(T::default()).map_err(|e| bad_doc(name, e))?;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO security_docs (name, doc) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[&name, &empty],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT doc, version FROM security_docs WHERE name = $1 FOR UPDATE",
            &[&name],
        )
        .await?;
    let current: T = serde_json::from_value(row.get(0)).map_err(|e| bad_doc(name, e))?;
    let mut version: i64 = row.get(1);
    let (next, answer) = plan(&current);
    if next != current {
        let doc = serde_json::to_value(&next).map_err(|e| bad_doc(name, e))?;
        let row = tx
            .query_one(
                "UPDATE security_docs SET doc = $2, version = version + 1, \
                   changed_at = clock_timestamp() WHERE name = $1 RETURNING version",
                &[&name, &doc],
            )
            .await?;
        version = row.get(0);
        tx.execute("SELECT pg_notify($1, '')", &[&CATALOGUE_CHANNEL])
            .await?;
    }
    tx.commit().await?;
    Ok((next, version, answer))
}
