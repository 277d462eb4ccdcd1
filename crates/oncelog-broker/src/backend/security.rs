//! The catalogue's ACLs and SCRAM credentials: a file in the data
//! directory in local mode, a row of PostgreSQL in cluster mode (every
//! broker's copy follows it). A change runs its plan on what is stored, in
//! one step, and is taken only once stored.

use super::Catalogue;
use crate::backend::cluster::front::Front;
use crate::backend::cluster::security::{self as rows, ACLS, USERS};
use crate::backend::cluster::ClusterError;
use crate::security::acl::Acl;
use crate::security::UserMap;

/// What a failed change of the cluster's row is answered with; a failure
/// to reach PostgreSQL changes nothing.
fn failed(front: &Front, what: &str, e: &ClusterError) -> String {
    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, *e, error = %e, "cluster: changing the {what} failed; nothing changed");
    format!("the cluster's {what} could not be changed: {e}")
}

impl Catalogue<'_> {
    /// Changes the ACLs to what `plan` makes of them. Returns whether that
    /// was stored and the plan's answer (made of the stored ACLs, or of
    /// none when they could not be read).
    pub async fn change_acls<P>(
        &self,
        plan: impl Fn(&[Acl]) -> (Vec<Acl>, P),
    ) -> (Result<(), String>, P) {
        match self {
            Catalogue::Local(b) => super::blocking(|| b.authz.change(plan)),
            Catalogue::Cluster(_, front) => {
                match rows::change(&front.cluster.pool, ACLS, |cur: &Vec<Acl>| plan(cur)).await {
                    Ok((next, version, p)) => {
                        front.security.set_acls(next, version);
                        (Ok(()), p)
                    }
                    Err(e) => (Err(failed(front, "ACLs", &e)), plan(&[]).1),
                }
            }
        }
    }

    /// Brings this broker's copy of the ACLs up to date before it answers
    /// from them (cluster mode; the copy stays if PostgreSQL cannot be
    /// reached).
    pub async fn refresh_acls(&self) {
        if let Catalogue::Cluster(_, front) = self {
            match rows::load(&front.cluster.pool, ACLS).await {
                Ok((acls, version)) => front.security.set_acls(acls, version),
                Err(e) => {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading the ACLs failed; answering from the copy")
                }
            }
        }
    }

    /// Changes the SCRAM credentials to what `plan` makes of them. Returns
    /// whether that was stored, the credentials `plan` made, and its
    /// answer.
    pub async fn change_users<P>(
        &self,
        plan: impl Fn(&UserMap) -> (UserMap, P),
    ) -> (Result<(), String>, UserMap, P) {
        match self {
            Catalogue::Local(b) => super::blocking(|| b.users.change(plan)),
            Catalogue::Cluster(_, front) => {
                match rows::change(&front.cluster.pool, USERS, |cur: &UserMap| plan(cur)).await {
                    Ok((next, version, p)) => {
                        front.security.set_users(next.clone(), version);
                        (Ok(()), next, p)
                    }
                    Err(e) => {
                        let empty = UserMap::default();
                        let p = plan(&empty).1;
                        (Err(failed(front, "SCRAM credentials", &e)), empty, p)
                    }
                }
            }
        }
    }

    /// Brings this broker's copy of the SCRAM credentials up to date
    /// (cluster mode; the copy stays if PostgreSQL cannot be reached).
    pub async fn refresh_users(&self) {
        if let Catalogue::Cluster(_, front) = self {
            match rows::load(&front.cluster.pool, USERS).await {
                Ok((users, version)) => front.security.set_users(users, version),
                Err(e) => {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading the SCRAM credentials failed; answering from the copy")
                }
            }
        }
    }
}
