//! ACLs and the authorizer, with Kafka's model and rules.
//!
//! An ACL binds a resource pattern (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID;
//! LITERAL or PREFIXED name, `*` for every name) to an entry (principal,
//! host, operation, ALLOW or DENY). A request of `principal` from `host` for
//! `operation` on a resource is:
//!
//! 1. allowed for a super user (`super.users`);
//! 2. denied if a matching DENY names the operation (or ALL);
//! 3. allowed if a matching ALLOW names it, ALL, or an operation that implies
//!    it (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
//!    DESCRIBE_CONFIGS);
//! 4. otherwise allowed only if no ACL at all matches the resource and
//!    `allow.everyone.if.no.acl.found` is true.
//!
//! A PREFIXED pattern is a plain string prefix, as in Kafka: `orders-sink`
//! matches `orders-sink-0-7` and also `orders-sink-v2-0-7`.
//!
//! Authorization is on when `authorizer.class.name` is set (any value: the
//! broker's own authorizer serves it); off, every request is allowed and the
//! ACL APIs answer SECURITY_DISABLED, as Kafka's do. ACLs are kept in
//! `acls.json` in the data dir, replaced atomically, one change at a time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kafka_protocol::messages::create_acls_request::{AclCreation, CreateAclsRequest};
use kafka_protocol::messages::create_acls_response::{AclCreationResult, CreateAclsResponse};
use kafka_protocol::messages::delete_acls_request::{DeleteAclsFilter, DeleteAclsRequest};
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl, DeleteAclsResponse,
};
use kafka_protocol::messages::describe_acls_request::DescribeAclsRequest;
use kafka_protocol::messages::describe_acls_response::{
    AclDescription, DescribeAclsResource, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, TopicError};

pub const FILE: &str = "acls.json";
/// The CLUSTER resource's one name.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// Kafka's resource types (wire ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
}

impl ResourceType {
    pub const ALL: [ResourceType; 4] = [
        Self::Topic,
        Self::Group,
        Self::Cluster,
        Self::TransactionalId,
    ];

    pub fn wire(self) -> i8 {
        match self {
            Self::Topic => 2,
            Self::Group => 3,
            Self::Cluster => 4,
            Self::TransactionalId => 5,
        }
    }

    pub fn from_wire(v: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.wire() == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Topic => "topic",
            Self::Group => "group",
            Self::Cluster => "cluster",
            Self::TransactionalId => "transactional_id",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PatternType {
    Literal,
    Prefixed,
}

impl PatternType {
    pub fn wire(self) -> i8 {
        match self {
            Self::Literal => 3,
            Self::Prefixed => 4,
        }
    }
}

/// Kafka's operations (wire ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

impl Operation {
    const TABLE: [(Operation, i8); 11] = [
        (Self::All, 2),
        (Self::Read, 3),
        (Self::Write, 4),
        (Self::Create, 5),
        (Self::Delete, 6),
        (Self::Alter, 7),
        (Self::Describe, 8),
        (Self::ClusterAction, 9),
        (Self::DescribeConfigs, 10),
        (Self::AlterConfigs, 11),
        (Self::IdempotentWrite, 12),
    ];

    pub fn wire(self) -> i8 {
        Self::TABLE
            .iter()
            .find(|(o, _)| *o == self)
            .map_or(0, |(_, w)| *w)
    }

    pub fn from_wire(v: i8) -> Option<Self> {
        Self::TABLE.iter().find(|(_, w)| *w == v).map(|(o, _)| *o)
    }

    /// The operations an ALLOW of `self` also allows.
    fn allows(self, asked: Operation) -> bool {
        self == asked
            || self == Self::All
            || (asked == Self::Describe
                && matches!(self, Self::Read | Self::Write | Self::Delete | Self::Alter))
            || (asked == Self::DescribeConfigs && self == Self::AlterConfigs)
    }
}

/// One ACL.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Acl {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub allow: bool,
}

impl Acl {
    fn matches_resource(&self, t: ResourceType, name: &str) -> bool {
        self.resource_type == t
            && match self.pattern_type {
                PatternType::Literal => self.resource_name == name || self.resource_name == "*",
                PatternType::Prefixed => name.starts_with(&self.resource_name),
            }
    }

    fn matches_who(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == "User:*")
            && (self.host == "*" || self.host == host)
    }
}

/// A DescribeAcls / DeleteAcls filter.
struct Filter {
    resource_type: i8,
    name: Option<String>,
    pattern_type: i8,
    principal: Option<String>,
    host: Option<String>,
    operation: i8,
    permission: i8,
}

const ANY: i8 = 1;
const MATCH: i8 = 2;

impl Filter {
    fn matches(&self, a: &Acl) -> bool {
        let type_ok = self.resource_type == ANY || self.resource_type == a.resource_type.wire();
        let name_ok = match (&self.name, self.pattern_type) {
            (None, p) => p == ANY || p == MATCH || p == a.pattern_type.wire(),
            (Some(n), ANY) => *n == a.resource_name,
            (Some(n), MATCH) => a.matches_resource(a.resource_type, n),
            (Some(n), p) => p == a.pattern_type.wire() && *n == a.resource_name,
        };
        let who_ok = self.principal.as_ref().is_none_or(|p| *p == a.principal)
            && self.host.as_ref().is_none_or(|h| *h == a.host);
        let op_ok = self.operation == ANY || self.operation == a.operation.wire();
        let perm_ok = self.permission == ANY || self.permission == if a.allow { 3 } else { 2 };
        type_ok && name_ok && who_ok && op_ok && perm_ok
    }

    fn validate(&self) -> Result<(), String> {
        if self.resource_type != ANY && ResourceType::from_wire(self.resource_type).is_none() {
            return Err(format!("unknown resource type {}", self.resource_type));
        }
        if !matches!(self.pattern_type, ANY | MATCH | 3 | 4) {
            return Err(format!("unknown pattern type {}", self.pattern_type));
        }
        if self.operation != ANY && Operation::from_wire(self.operation).is_none() {
            return Err(format!("unknown operation {}", self.operation));
        }
        if !matches!(self.permission, ANY | 2 | 3) {
            return Err(format!("unknown permission type {}", self.permission));
        }
        Ok(())
    }
}

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|x| x.to_string())
}

/// Denials by resource type, for /metrics.
#[derive(Default)]
pub struct DenyStats {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl DenyStats {
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// The ACLs and the rules that apply them.
pub struct Authorizer {
    pub enabled: bool,
    super_users: Vec<String>,
    allow_if_no_acl: bool,
    /// `None` in cluster mode: the ACLs are the cluster's, set here at
    /// each refresh.
    dir: Option<PathBuf>,
    acls: Arc<Mutex<Vec<Acl>>>,
    pub denials: DenyStats,
}

impl Authorizer {
    pub fn open(
        data_dir: Option<&Path>,
        enabled: bool,
        super_users: &str,
        allow_if_no_acl: bool,
    ) -> Result<Self, TopicError> {
        let acls = match data_dir {
            Some(d) => crate::files::read_json(d, FILE)?,
            None => Vec::new(),
        };
        Ok(Self {
            enabled,
            super_users: super_users
                .split(';')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            allow_if_no_acl,
            dir: data_dir.map(Path::to_path_buf),
            acls: Arc::new(Mutex::new(acls)),
            denials: DenyStats::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Acl>> {
        self.acls.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// May `principal` from `host` do `op` on resource (`t`, `name`)?
    /// Without an authorizer, always. A denial is counted and logged at
    /// debug (callers log what was refused).
    pub fn allowed(
        &self,
        principal: &str,
        host: IpAddr,
        op: Operation,
        t: ResourceType,
        name: &str,
    ) -> bool {
        if !self.enabled || self.super_users.iter().any(|s| s == principal) {
            return true;
        }
        let host = host.to_string();
        let acls = self.lock();
        let mut any_for_resource = false;
        let mut allowed = false;
        for a in acls.iter().filter(|a| a.matches_resource(t, name)) {
            any_for_resource = true;
            if !a.matches_who(principal, &host) {
                continue;
            }
            if !a.allow && (a.operation == op || a.operation == Operation::All) {
                drop(acls);
                self.deny(t, principal, op, name);
                return false;
            }
            if a.allow && a.operation.allows(op) {
                allowed = true;
            }
        }
        drop(acls);
        let ok = allowed || (!any_for_resource && self.allow_if_no_acl);
        if !ok {
            self.deny(t, principal, op, name);
        }
        ok
    }

    /// May `principal` do `op` on some resource of type `t` (an ALLOW of it
    /// exists and no DENY covers every name)? Kafka's check for idempotent
    /// producers: WRITE on any topic.
    pub fn allowed_any(
        &self,
        principal: &str,
        host: IpAddr,
        op: Operation,
        t: ResourceType,
    ) -> bool {
        if !self.enabled || self.super_users.iter().any(|s| s == principal) {
            return true;
        }
        let host = host.to_string();
        let acls = self.lock();
        let who = |a: &&Acl| a.resource_type == t && a.matches_who(principal, &host);
        let denied_all = acls.iter().filter(who).any(|a| {
            !a.allow
                && (a.operation == op || a.operation == Operation::All)
                && ((a.pattern_type == PatternType::Literal && a.resource_name == "*")
                    || (a.pattern_type == PatternType::Prefixed && a.resource_name.is_empty()))
        });
        let some_allow = acls
            .iter()
            .filter(who)
            .any(|a| a.allow && a.operation.allows(op));
        let ok = !denied_all
            && (some_allow || (self.allow_if_no_acl && !acls.iter().any(|a| a.resource_type == t)));
        drop(acls);
        if !ok {
            self.deny(t, principal, op, "*");
        }
        ok
    }

    fn deny(&self, t: ResourceType, principal: &str, op: Operation, name: &str) {
        let mut c = self
            .denials
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *c.entry(t.name()).or_default() += 1;
        tracing::debug!(principal, operation = ?op, resource_type = t.name(), resource = name, "authorization denied");
    }

    fn persist(&self, next: &[Acl]) -> Result<(), String> {
        let bytes = serde_json::to_vec_pretty(next).map_err(|e| e.to_string())?;
        crate::files::local_dir(&self.dir)
            .and_then(|dir| crate::files::write_atomically(dir, FILE, &bytes))
            .map_err(|e| e.to_string())
    }

    /// Runs `plan` on the ACLs under the lock and stores what it makes of
    /// them (when that differs), taking it only once stored.
    pub fn change<P>(&self, plan: impl FnOnce(&[Acl]) -> (Vec<Acl>, P)) -> (Result<(), String>, P) {
        let mut acls = self.lock();
        let (next, p) = plan(&acls);
        let stored = if next != *acls {
            self.persist(&next)
        } else {
            Ok(())
        };
        if stored.is_ok() {
            *acls = next;
        }
        (stored, p)
    }

    /// The ACLs as they stand (cluster mode's copy is refreshed from
    /// PostgreSQL through `shared`).
    pub fn acls(&self) -> Vec<Acl> {
        self.lock().clone()
    }

    /// The ACLs' cell, for cluster mode to replace with the cluster's.
    pub fn shared(&self) -> Arc<Mutex<Vec<Acl>>> {
        self.acls.clone()
    }

    pub fn describe(&self, r: &DescribeAclsRequest) -> DescribeAclsResponse {
        if !self.enabled {
            return DescribeAclsResponse::default()
                .with_error_code(ErrorCode::SecurityDisabled.code())
                .with_error_message(Some(StrBytes::from_static_str(
                    "No Authorizer is configured (authorizer.class.name)",
                )));
        }
        let f = Filter {
            resource_type: r.resource_type_filter,
            name: opt(&r.resource_name_filter),
            pattern_type: r.pattern_type_filter,
            principal: opt(&r.principal_filter),
            host: opt(&r.host_filter),
            operation: r.operation,
            permission: r.permission_type,
        };
        if let Err(why) = f.validate() {
            return DescribeAclsResponse::default()
                .with_error_code(ErrorCode::InvalidRequest.code())
                .with_error_message(Some(StrBytes::from_string(why)));
        }
        let mut by_resource: BTreeMap<(ResourceType, String, PatternType), Vec<AclDescription>> =
            BTreeMap::new();
        for a in self.lock().iter().filter(|a| f.matches(a)) {
            by_resource
                .entry((a.resource_type, a.resource_name.clone(), a.pattern_type))
                .or_default()
                .push(description(a));
        }
        DescribeAclsResponse::default().with_resources(
            by_resource
                .into_iter()
                .map(|((t, n, p), acls)| {
                    DescribeAclsResource::default()
                        .with_resource_type(t.wire())
                        .with_resource_name(StrBytes::from_string(n))
                        .with_pattern_type(p.wire())
                        .with_acls(acls)
                })
                .collect(),
        )
    }
}

const NO_AUTHORIZER: &str = "No Authorizer is configured (authorizer.class.name)";

/// CreateAcls' answer without an authorizer.
pub fn create_disabled(req: &CreateAclsRequest) -> CreateAclsResponse {
    CreateAclsResponse::default().with_results(
        req.creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(ErrorCode::SecurityDisabled.code())
                    .with_error_message(Some(StrBytes::from_static_str(NO_AUTHORIZER)))
            })
            .collect(),
    )
}

/// DeleteAcls' answer without an authorizer.
pub fn delete_disabled(r: &DeleteAclsRequest) -> DeleteAclsResponse {
    DeleteAclsResponse::default().with_filter_results(
        r.filters
            .iter()
            .map(|_| delete_failed(ErrorCode::SecurityDisabled, NO_AUTHORIZER.into()))
            .collect(),
    )
}

fn delete_failed(code: ErrorCode, msg: String) -> DeleteAclsFilterResult {
    DeleteAclsFilterResult::default()
        .with_error_code(code.code())
        .with_error_message(Some(StrBytes::from_string(msg)))
}

/// What a CreateAcls makes of `current` (the ACLs after it, sorted), and
/// its answer once their storing is known: both modes run it on the ACLs
/// they hold under their lock (local mode's mutex, cluster mode's row).
pub fn plan_create(current: &[Acl], req: &CreateAclsRequest) -> (Vec<Acl>, CreatePlan) {
    let parsed: Vec<Result<Acl, String>> = req.creations.iter().map(parse_creation).collect();
    let mut next = current.to_vec();
    for a in parsed.iter().flatten() {
        if !next.contains(a) {
            next.push(a.clone());
        }
    }
    next.sort();
    (next, CreatePlan(parsed))
}

pub struct CreatePlan(Vec<Result<Acl, String>>);

impl CreatePlan {
    pub fn answer(self, stored: &Result<(), String>) -> CreateAclsResponse {
        let results = self
            .0
            .iter()
            .map(|p| match (p, stored) {
                (Err(why), _) => AclCreationResult::default()
                    .with_error_code(ErrorCode::InvalidRequest.code())
                    .with_error_message(Some(StrBytes::from_string(why.clone()))),
                (Ok(_), Err(e)) => AclCreationResult::default()
                    .with_error_code(ErrorCode::KafkaStorageError.code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "could not store the ACLs: {e}"
                    )))),
                (Ok(a), Ok(())) => {
                    tracing::info!(acl = ?a, "ACL created");
                    AclCreationResult::default()
                }
            })
            .collect();
        CreateAclsResponse::default().with_results(results)
    }
}

/// What a DeleteAcls makes of `current`, and its answer once the storing
/// is known (as `plan_create`).
pub fn plan_delete(current: &[Acl], r: &DeleteAclsRequest) -> (Vec<Acl>, DeletePlan) {
    let mut next = current.to_vec();
    let mut results = Vec::new();
    for df in &r.filters {
        let f = filter_of(df);
        if let Err(why) = f.validate() {
            results.push(Err(why));
            continue;
        }
        let (gone, kept): (Vec<Acl>, Vec<Acl>) = next.into_iter().partition(|a| f.matches(a));
        next = kept;
        results.push(Ok(gone));
    }
    let deleted = current.len() - next.len();
    (next, DeletePlan { results, deleted })
}

pub struct DeletePlan {
    results: Vec<Result<Vec<Acl>, String>>,
    deleted: usize,
}

impl DeletePlan {
    pub fn answer(self, stored: &Result<(), String>) -> DeleteAclsResponse {
        if let Err(e) = stored {
            return DeleteAclsResponse::default().with_filter_results(
                self.results
                    .iter()
                    .map(|_| {
                        delete_failed(
                            ErrorCode::KafkaStorageError,
                            format!("could not store the ACLs: {e}"),
                        )
                    })
                    .collect(),
            );
        }
        if self.deleted > 0 {
            tracing::info!(deleted = self.deleted, "ACLs deleted");
        }
        DeleteAclsResponse::default().with_filter_results(
            self.results
                .into_iter()
                .map(|r| match r {
                    Err(why) => delete_failed(ErrorCode::InvalidRequest, why),
                    Ok(gone) => DeleteAclsFilterResult::default()
                        .with_matching_acls(gone.iter().map(matching).collect()),
                })
                .collect(),
        )
    }
}

fn filter_of(d: &DeleteAclsFilter) -> Filter {
    Filter {
        resource_type: d.resource_type_filter,
        name: opt(&d.resource_name_filter),
        pattern_type: d.pattern_type_filter,
        principal: opt(&d.principal_filter),
        host: opt(&d.host_filter),
        operation: d.operation,
        permission: d.permission_type,
    }
}

fn description(a: &Acl) -> AclDescription {
    AclDescription::default()
        .with_principal(StrBytes::from_string(a.principal.clone()))
        .with_host(StrBytes::from_string(a.host.clone()))
        .with_operation(a.operation.wire())
        .with_permission_type(if a.allow { 3 } else { 2 })
}

fn matching(a: &Acl) -> DeleteAclsMatchingAcl {
    DeleteAclsMatchingAcl::default()
        .with_resource_type(a.resource_type.wire())
        .with_resource_name(StrBytes::from_string(a.resource_name.clone()))
        .with_pattern_type(a.pattern_type.wire())
        .with_principal(StrBytes::from_string(a.principal.clone()))
        .with_host(StrBytes::from_string(a.host.clone()))
        .with_operation(a.operation.wire())
        .with_permission_type(if a.allow { 3 } else { 2 })
}

fn parse_creation(c: &AclCreation) -> Result<Acl, String> {
    let resource_type = ResourceType::from_wire(c.resource_type).ok_or_else(|| {
        format!(
            "resource type {} cannot have ACLs here (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID)",
            c.resource_type
        )
    })?;
    let pattern_type = match c.resource_pattern_type {
        3 => PatternType::Literal,
        4 => PatternType::Prefixed,
        p => return Err(format!("pattern type {p} is not LITERAL or PREFIXED")),
    };
    let operation = Operation::from_wire(c.operation)
        .ok_or_else(|| format!("operation {} is not a concrete operation", c.operation))?;
    let allow = match c.permission_type {
        3 => true,
        2 => false,
        p => return Err(format!("permission type {p} is not ALLOW or DENY")),
    };
    let principal = c.principal.to_string();
    match principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
        _ => {
            return Err(format!(
                "principal {principal:?} is not TYPE:NAME (e.g. User:alice)"
            ))
        }
    }
    let host = c.host.to_string();
    if host.is_empty() {
        return Err("host must not be empty (`*` for every host)".into());
    }
    let name = c.resource_name.to_string();
    if name.is_empty() {
        return Err("resource name must not be empty".into());
    }
    if resource_type == ResourceType::Cluster && name != CLUSTER_NAME {
        return Err(format!("the CLUSTER resource is named {CLUSTER_NAME}"));
    }
    if pattern_type == PatternType::Prefixed && name == "*" {
        return Err("a PREFIXED pattern cannot be the wildcard `*` (use LITERAL *)".into());
    }
    Ok(Acl {
        resource_type,
        resource_name: name,
        pattern_type,
        principal,
        host,
        operation,
        allow,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        t: ResourceType,
        name: &str,
        p: PatternType,
        who: &str,
        op: Operation,
        allow: bool,
    ) -> Acl {
        Acl {
            resource_type: t,
            resource_name: name.into(),
            pattern_type: p,
            principal: who.into(),
            host: "*".into(),
            operation: op,
            allow,
        }
    }

    fn authz(acls: Vec<Acl>, allow_if_no_acl: bool) -> (tempfile::TempDir, Authorizer) {
        let dir = tempfile::tempdir().unwrap();
        let a = Authorizer::open(Some(dir.path()), true, "User:root", allow_if_no_acl).unwrap();
        *a.lock() = acls;
        (dir, a)
    }

    const H: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn kafka_rules() {
        use Operation::*;
        use PatternType::*;
        use ResourceType::*;
        let (_d, a) = authz(
            vec![
                acl(Topic, "orders", Literal, "User:alice", Write, true),
                acl(
                    TransactionalId,
                    "orders-sink",
                    Prefixed,
                    "User:alice",
                    Write,
                    true,
                ),
                acl(Topic, "*", Literal, "User:bob", Read, true),
                acl(Topic, "secret", Literal, "User:bob", Read, false),
                acl(Group, "g", Literal, "User:*", All, true),
            ],
            false,
        );
        assert!(a.allowed("User:alice", H, Write, Topic, "orders"));
        assert!(
            a.allowed("User:alice", H, Describe, Topic, "orders"),
            "WRITE implies DESCRIBE"
        );
        assert!(!a.allowed("User:alice", H, Read, Topic, "orders"));
        assert!(a.allowed("User:alice", H, Write, TransactionalId, "orders-sink-0-7"));
        assert!(
            a.allowed(
                "User:alice",
                H,
                Write,
                TransactionalId,
                "orders-sink-v2-0-7"
            ),
            "a plain string prefix"
        );
        assert!(!a.allowed("User:alice", H, Write, TransactionalId, "orders-green-0-7"));
        assert!(a.allowed("User:bob", H, Read, Topic, "anything"));
        assert!(
            !a.allowed("User:bob", H, Read, Topic, "secret"),
            "DENY wins"
        );
        assert!(
            a.allowed("User:carol", H, Read, Group, "g"),
            "User:* and ALL"
        );
        assert!(!a.allowed("User:carol", H, Read, Topic, "orders"));
        assert!(
            a.allowed("User:root", H, Alter, Cluster, CLUSTER_NAME),
            "super user"
        );
        // No ACL for the resource at all: allow.everyone.if.no.acl.found.
        assert!(!a.allowed("User:carol", H, Read, Cluster, CLUSTER_NAME));
        let (_d2, open) = authz(
            vec![acl(Topic, "orders", Literal, "User:alice", Write, true)],
            true,
        );
        assert!(open.allowed("User:carol", H, Alter, Cluster, CLUSTER_NAME));
        assert!(
            !open.allowed("User:carol", H, Write, Topic, "orders"),
            "ACLs exist for it"
        );
        // Idempotent producers: WRITE on some topic.
        assert!(a.allowed_any("User:alice", H, Write, Topic));
        assert!(!a.allowed_any("User:carol", H, Write, Topic));
        assert_eq!(a.denials.snapshot().iter().map(|(_, n)| n).sum::<u64>(), 6);
    }

    #[test]
    fn create_describe_delete_are_durable_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let a = Authorizer::open(Some(dir.path()), true, "", false).unwrap();
        let c = |t: i8, name: &str, p: i8, who: &str, op: i8, perm: i8| {
            AclCreation::default()
                .with_resource_type(t)
                .with_resource_name(StrBytes::from_string(name.into()))
                .with_resource_pattern_type(p)
                .with_principal(StrBytes::from_string(who.into()))
                .with_host(StrBytes::from_static_str("*"))
                .with_operation(op)
                .with_permission_type(perm)
        };
        let create = CreateAclsRequest::default().with_creations(vec![
            c(2, "orders", 3, "User:alice", 4, 3),
            c(5, "orders-sink", 4, "User:alice", 4, 3),
            c(1, "x", 3, "User:alice", 4, 3),
            c(4, "other", 3, "User:alice", 7, 3),
            c(2, "t", 3, "alice", 4, 3),
            c(2, "*", 4, "User:alice", 4, 3),
        ]);
        let (stored, plan) = a.change(|acls| plan_create(acls, &create));
        let r = plan.answer(&stored);
        let codes: Vec<i16> = r.results.iter().map(|x| x.error_code).collect();
        assert_eq!(codes, vec![0, 0, 42, 42, 42, 42]);
        let again = Authorizer::open(Some(dir.path()), true, "", false).unwrap();
        assert_eq!(again.count(), 2);
        let d = again.describe(
            &DescribeAclsRequest::default()
                .with_resource_type_filter(5)
                .with_resource_name_filter(Some(StrBytes::from_static_str("orders-sink-0-1")))
                .with_pattern_type_filter(MATCH)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_operation(ANY)
                .with_permission_type(ANY),
        );
        assert_eq!(d.resources.len(), 1);
        assert_eq!(d.resources[0].resource_name.as_str(), "orders-sink");
        let delete = DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()
            .with_resource_type_filter(2)
            .with_resource_name_filter(None)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_pattern_type_filter(ANY)
            .with_operation(ANY)
            .with_permission_type(ANY)]);
        let (stored, plan) = again.change(|acls| plan_delete(acls, &delete));
        let del = plan.answer(&stored);
        assert_eq!(del.filter_results[0].matching_acls.len(), 1);
        assert_eq!(
            Authorizer::open(Some(dir.path()), true, "", false)
                .unwrap()
                .count(),
            1
        );
        let off = Authorizer::open(Some(dir.path()), false, "", false).unwrap();
        assert!(!off.enabled);
        assert_eq!(
            create_disabled(
                &CreateAclsRequest::default().with_creations(vec![c(2, "a", 3, "User:a", 4, 3)])
            )
            .results[0]
                .error_code,
            54
        );
    }
}
