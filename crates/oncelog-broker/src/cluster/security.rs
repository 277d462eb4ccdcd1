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
use crate::acl::Acl;
use crate::security::UserMap;

/// The row of the ACLs.
pub const ACLS: &str = "acls";
/// The row of the SCRAM credentials.
pub const USERS: &str = "scram_credentials";

/// The cells a broker's authorizer and SASL listeners read, which the
/// cluster's rows replace.
#[derive(Clone)]
pub struct Copies {
    pub acls: Arc<Mutex<Vec<Acl>>>,
    pub users: Arc<Mutex<UserMap>>,
}

impl Copies {
    pub fn set_acls(&self, acls: Vec<Acl>) {
        *self.acls.lock().unwrap_or_else(|p| p.into_inner()) = acls;
    }

    pub fn set_users(&self, users: UserMap) {
        *self.users.lock().unwrap_or_else(|p| p.into_inner()) = users;
    }

    /// Replaces both copies with the cluster's rows.
    pub async fn refresh(&self, pool: &Pool) -> Result<(), ClusterError> {
        let acls = load(pool, ACLS).await?;
        let users = load(pool, USERS).await?;
        self.set_acls(acls);
        self.set_users(users);
        Ok(())
    }
}

fn bad_doc(name: &str, e: serde_json::Error) -> ClusterError {
    ClusterError::Invariant(format!("the cluster's {name} row cannot be read: {e}"))
}

/// One document as stored (its default when it was never written).
pub async fn load<T: DeserializeOwned + Default>(
    pool: &Pool,
    name: &str,
) -> Result<T, ClusterError> {
    let client = pool.get().await?;
    let row = client
        .query_opt("SELECT doc FROM security_docs WHERE name = $1", &[&name])
        .await?;
    match row {
        None => Ok(T::default()),
        Some(r) => serde_json::from_value(r.get(0)).map_err(|e| bad_doc(name, e)),
    }
}

/// Changes one document in one transaction holding its row: `plan` gets
/// the current document and gives the next and its answer; the next is
/// written (and announced) only when it differs. Run twice, or through two
/// brokers at once, each change applies to the other's result.
pub async fn change<T, A>(
    pool: &Pool,
    name: &str,
    plan: impl FnOnce(&T) -> (T, A),
) -> Result<(T, A), ClusterError>
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
            "SELECT doc FROM security_docs WHERE name = $1 FOR UPDATE",
            &[&name],
        )
        .await?;
    let current: T = serde_json::from_value(row.get(0)).map_err(|e| bad_doc(name, e))?;
    let (next, answer) = plan(&current);
    if next != current {
        let doc = serde_json::to_value(&next).map_err(|e| bad_doc(name, e))?;
        tx.execute(
            "UPDATE security_docs SET doc = $2, changed_at = clock_timestamp() WHERE name = $1",
            &[&name, &doc],
        )
        .await?;
        tx.execute("SELECT pg_notify($1, '')", &[&CATALOGUE_CHANNEL])
            .await?;
    }
    tx.commit().await?;
    Ok((next, answer))
}
