//! The web console, served by the broker's HTTP listener ([`crate::observe::http`]):
//! `/` is one page (plain HTML, CSS and JavaScript built into the binary:
//! no build step, no external request) that polls the JSON views of
//! [`views`] under `/v1/console/` every second or two.
//!
//! Read-only unless `console.actions.enable=true`. Then, and only then,
//! `POST /v1/console/actions/*` may abort a hanging transaction, commit or
//! abort a parked one, or start or roll back a cut-over; the page asks for
//! a confirmation first. Every action must come from the console's own
//! origin ([`crate::observe::http::browser_guard`]); with SASL listeners it needs a
//! SCRAM user's password (HTTP Basic) and, with an authorizer, ALTER on the
//! cluster. Every action is logged with who asked.
//!
//! The console answers only requests whose `Host` is an IP address,
//! `localhost` or one of `console.allowed.hosts`, so a web page cannot read
//! it through DNS rebinding.

pub mod views;

use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine as _;

use crate::coordinators::cutover;
use crate::coordinators::txn_service::EndRequest;
use crate::observe::httpmsg::{browser_guard, Reply, Request};
use crate::observe::txn_history::Requester;
use crate::security::acl::{Operation, ResourceType};
use crate::Broker;
use views::Paging;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The page's own rules: scripts, styles and requests from this origin
/// only, never framed (no clickjacking of an action button).
const CSP: &str = "Content-Security-Policy: default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn asset(body: &'static str, ctype: &'static str) -> Reply {
    Reply::new("200 OK", body, ctype)
        .header("Cache-Control: no-cache")
        .header("X-Content-Type-Options: nosniff")
        .header("X-Frame-Options: DENY")
        .header("Referrer-Policy: no-referrer")
        .header(CSP)
}

/// Whether the request's `Host` names this listener by IP address,
/// `localhost` or an allowed name (a missing Host, from an HTTP/1.0 tool,
/// is no browser's).
pub fn host_allowed(req: &Request, allowed: &[String]) -> bool {
    let Some(host) = req.header("host") else {
        return true;
    };
    let host = host.to_ascii_lowercase();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h)
    };
    name.parse::<IpAddr>().is_ok() || name == "localhost" || allowed.iter().any(|a| a == name)
}

/// The console's reply to `req`, or `None` when the path is not the console's.
pub async fn route(b: &Arc<Broker>, req: &Request) -> Option<Reply> {
    let path = req.path.as_str();
    let ours = matches!(path, "/" | "/console" | "/console/")
        || path.starts_with("/console/")
        || path.starts_with("/v1/console/");
    if !ours {
        return None;
    }
    if !b.config.console_enable {
        return Some(Reply::text(
            "404 Not Found",
            "the console is off (console.enable=false)\n",
        ));
    }
    if !host_allowed(req, &b.config.console_allowed_hosts) {
        tracing::warn!(host = req.header("host").unwrap_or(""), peer = ?req.peer,
            "console request refused: its Host is not an IP address, localhost or in console.allowed.hosts");
        return Some(Reply::text(
            "421 Misdirected Request",
            "this Host is not served: add it to console.allowed.hosts\n",
        ));
    }
    if let Some(action) = path.strip_prefix("/v1/console/actions/") {
        return Some(act(b, req, action).await);
    }
    if req.method != "GET" && req.method != "HEAD" {
        return Some(Reply::error(
            "405 Method Not Allowed",
            "the console's views are read with GET".into(),
        ));
    }
    let paging = Paging::new(req.param("page"), req.param("per_page"));
    let reply = match path {
        "/" | "/console" | "/console/" => asset(INDEX_HTML, "text/html; charset=utf-8"),
        "/console/app.js" => asset(APP_JS, "text/javascript; charset=utf-8"),
        "/console/app.css" => asset(APP_CSS, "text/css; charset=utf-8"),
        "/v1/console/overview" => Reply::json_compact(
            &views::overview(b, paging, req.param("q"), req.param("sort")).await,
        ),
        "/v1/console/topic" => {
            match views::topic(b, req.param("topic"), paging, req.param("only") == "pinned").await {
                Some(v) => Reply::json_compact(&v),
                None => Reply::error(
                    "404 Not Found",
                    format!("no topic {:?}", req.param("topic")),
                ),
            }
        }
        "/v1/console/stuck" => Reply::json_compact(&views::stuck(b, paging).await),
        "/v1/console/transactions" => {
            let window = req.param("window_ms").parse().unwrap_or(300_000);
            Reply::json_compact(
                &views::transactions(b, paging, req.param("prefix"), req.param("topic"), window)
                    .await,
            )
        }
        "/v1/console/transaction" => {
            Reply::json_compact(&views::transaction(b, req.param("id")).await)
        }
        "/v1/console/groups" => {
            Reply::json_compact(&views::groups(b, paging, req.param("q")).await)
        }
        "/v1/console/group" => match views::group(b, req.param("group"), paging).await {
            Some(v) => Reply::json_compact(&v),
            None => Reply::error(
                "404 Not Found",
                format!("no group {:?}", req.param("group")),
            ),
        },
        "/v1/console/verify" => {
            let topic = Some(req.param("topic")).filter(|t| !t.is_empty());
            match crate::backend::verify_record::report(b, topic).await {
                Ok(v) => Reply::json_compact(&v),
                Err(e) => Reply::error("503 Service Unavailable", e),
            }
        }
        "/v1/console/actions" => Reply::json_compact(&serde_json::json!({
            "enabled": b.config.console_actions_enable,
            "authentication": if needs_password(b) { "basic" } else { "none" },
        })),
        _ => Reply::error("404 Not Found", format!("no console page {path}")),
    };
    Some(reply)
}

/// The reply to a cut-over request that changed nothing (the console's
/// actions and the CLI's `/v1/cutover` endpoints).
pub(crate) fn cutover_failure(f: crate::backend::CutoverFailure) -> Reply {
    match f {
        crate::backend::CutoverFailure::Refused(why) => Reply::error("409 Conflict", why),
        crate::backend::CutoverFailure::Unavailable(why) => {
            Reply::error("503 Service Unavailable", why)
        }
    }
}

/// Actions need a password when Kafka clients need one.
fn needs_password(b: &Broker) -> bool {
    b.config.listeners.iter().any(|l| l.protocol.sasl())
}

/// Who asks for a state change over HTTP (a console action, or the CLI's
/// `POST /v1/cutover/*`): `Ok(None)` when no password is needed (no SASL
/// listener), the authenticated principal otherwise; the reply to send when
/// the request may not go on.
pub fn authenticate(b: &Broker, req: &Request) -> Result<Option<String>, Reply> {
    if !needs_password(b) {
        return Ok(None);
    }
    let challenge = |why: &str| {
        Reply::error("401 Unauthorized", why.to_string())
            .header("WWW-Authenticate: Basic realm=\"oncelog console\", charset=\"UTF-8\"")
    };
    let Some(token) = req.header("authorization").and_then(|v| {
        v.strip_prefix("Basic ")
            .or_else(|| v.strip_prefix("basic "))
    }) else {
        return Err(challenge(
            "this change needs a SCRAM user's name and password (HTTP Basic; the CLI sends its --sasl-username and --sasl-password)",
        ));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()
        .and_then(|d| String::from_utf8(d).ok());
    let Some((user, password)) = decoded.as_deref().and_then(|d| d.split_once(':')) else {
        return Err(challenge("malformed Basic credentials"));
    };
    let ok = b
        .users
        .all_of(user)
        .iter()
        .any(|(mech, cred)| cred.matches_password(*mech, password.as_bytes()));
    if !ok {
        tracing::warn!(user, peer = ?req.peer, "console action refused: wrong user name or password");
        return Err(challenge("wrong user name or password"));
    }
    let principal = format!("User:{user}");
    let host = req.peer.map_or(IpAddr::from([127, 0, 0, 1]), |p| p.ip());
    if !b.authz.allowed(
        &principal,
        host,
        Operation::Alter,
        ResourceType::Cluster,
        "kafka-cluster",
    ) {
        tracing::warn!(%principal, peer = ?req.peer, "console action refused: the principal may not ALTER the cluster");
        return Err(Reply::error(
            "403 Forbidden",
            format!("{principal} may not ALTER the cluster"),
        ));
    }
    Ok(Some(principal))
}

fn number<T: std::str::FromStr>(req: &Request, name: &str) -> Result<T, Reply> {
    req.param(name).parse::<T>().map_err(|_| {
        Reply::error(
            "400 Bad Request",
            format!("parameter {name} must be a number"),
        )
    })
}

/// Runs a console action after every check.
async fn act(b: &Arc<Broker>, req: &Request, action: &str) -> Reply {
    if req.method != "POST" {
        return Reply::error("405 Method Not Allowed", "actions are POSTed".into());
    }
    if !b.config.console_actions_enable {
        tracing::warn!(action, peer = ?req.peer, "console action refused: console.actions.enable is false");
        return Reply::error(
            "403 Forbidden",
            "console actions are off: the broker runs with console.actions.enable=false".into(),
        );
    }
    if let Err(why) = browser_guard(req) {
        tracing::warn!(action, peer = ?req.peer, "console action refused: {why}");
        return Reply::error("403 Forbidden", why);
    }
    let principal = match authenticate(b, req) {
        Ok(p) => p,
        Err(reply) => return reply,
    };
    let who_name = principal.clone().unwrap_or_else(|| "anonymous".into());
    let who = Requester {
        client_id: Some(format!("oncelog-console ({who_name})")),
        peer: req.peer,
    };
    let result = match action {
        "abort" => abort(b, req, &who).await,
        "resolve" => resolve(b, req, &who).await,
        "cutover-start" => {
            let drain = if req.param("drain_timeout_ms").is_empty() {
                Ok(300_000)
            } else {
                number(req, "drain_timeout_ms")
            };
            match drain {
                Ok(d) => {
                    let store = b.cutover_store();
                    let topic = req.param("topic");
                    match cutover::start(&store, topic, req.param("from"), req.param("to"), d).await
                    {
                        Ok(_) => cutover::status(&store, topic)
                            .await
                            .map_err(cutover_failure),
                        Err(f) => Err(cutover_failure(f)),
                    }
                }
                Err(r) => Err(r),
            }
        }
        "cutover-rollback" => {
            let store = b.cutover_store();
            let topic = req.param("topic");
            match cutover::rollback(&store, topic).await {
                Ok(_) => cutover::status(&store, topic)
                    .await
                    .map_err(cutover_failure),
                Err(f) => Err(cutover_failure(f)),
            }
        }
        _ => Err(Reply::error(
            "404 Not Found",
            format!("no console action {action:?}"),
        )),
    };
    match result {
        Ok(v) => {
            tracing::warn!(action, principal = %who_name, peer = ?req.peer, params = ?req.params,
                "console action done");
            Reply::json("200 OK", serde_json::json!({ "ok": true, "result": v }))
        }
        Err(reply) => {
            tracing::warn!(action, principal = %who_name, peer = ?req.peer, params = ?req.params,
                status = reply.status, "console action refused");
            reply
        }
    }
}

/// Aborts the transaction of `producer_id` that pins `topic`-`partition`:
/// through its coordinator when it holds it (the producer is fenced and
/// every partition of the transaction gets its marker), else as a hanging
/// transaction with a marker at that partition (`epoch` must be the
/// partition's).
async fn abort(
    b: &Arc<Broker>,
    req: &Request,
    who: &Requester,
) -> Result<serde_json::Value, Reply> {
    let pid: i64 = number(req, "producer_id")?;
    let epoch: i16 = number(req, "epoch")?;
    let partition: i32 = number(req, "partition")?;
    let topic = req.param("topic");
    let open = match b.logs().producers(topic, partition).await {
        Ok(p) => p,
        Err(crate::backend::PartitionError::Unknown) => {
            return Err(Reply::error(
                "404 Not Found",
                format!("no partition {topic}-{partition}"),
            ))
        }
        Err(crate::backend::PartitionError::Storage) => {
            return Err(Reply::error(
                "503 Service Unavailable",
                format!("the producers of {topic}-{partition} could not be read"),
            ))
        }
    };
    if !open
        .iter()
        .any(|(x, e)| *x == pid && e.epoch == epoch && e.current_txn_first_offset.is_some())
    {
        return Err(Reply::error(
            "409 Conflict",
            format!("producer {pid} at epoch {epoch} has no open transaction at {topic}-{partition} (it ended meanwhile?)"),
        ));
    }
    let txns = b.txns();
    match txns.admin_abort(pid, who).await {
        Ok(true) => {
            return Ok(
                serde_json::json!({ "aborted": "through the coordinator; its producer is fenced" }),
            )
        }
        Ok(false) => {}
        Err(crate::error::ErrorCode::ConcurrentTransactions) => {
            return Err(Reply::error(
                "409 Conflict",
                "the coordinator is completing this transaction; its markers are on their way"
                    .into(),
            ))
        }
        Err(code) => {
            return Err(Reply::error(
                "503 Service Unavailable",
                format!("the coordinator could not abort it ({code:?})"),
            ))
        }
    }
    let code = txns
        .abort_hanging(topic, partition, pid, epoch, b.txn.coordinator_epoch)
        .await;
    if code == crate::error::ErrorCode::None {
        Ok(
            serde_json::json!({ "aborted": format!("hanging transaction: ABORT marker written at {topic}-{partition}") }),
        )
    } else {
        Err(Reply::error(
            "409 Conflict",
            format!("the abort marker was refused: {code:?}"),
        ))
    }
}

/// Commits or aborts a parked transaction as its producer would (EndTxn
/// with its producer id and epoch); a transaction that is not parked is its
/// producer's to end, and refused here.
async fn resolve(
    b: &Arc<Broker>,
    req: &Request,
    who: &Requester,
) -> Result<serde_json::Value, Reply> {
    let pid: i64 = number(req, "producer_id")?;
    let epoch: i16 = number(req, "epoch")?;
    let id = req.param("id");
    let commit = match req.param("outcome") {
        "commit" => true,
        "abort" => false,
        other => {
            return Err(Reply::error(
                "400 Bad Request",
                format!("outcome must be commit or abort, not {other:?}"),
            ))
        }
    };
    let txns = b.txns();
    let all = match txns.parked(crate::backend::Scope::All).await {
        Ok((all, _)) => all,
        Err(code) => {
            return Err(Reply::error(
                "503 Service Unavailable",
                format!("the parked transactions could not be read ({code:?})"),
            ))
        }
    };
    let Some(parked) = all.into_iter().find(|p| p.transactional_id == id) else {
        return Err(Reply::error(
            "409 Conflict",
            format!("{id:?} has no parked transaction"),
        ));
    };
    if parked.producer_id != pid || parked.producer_epoch != epoch {
        return Err(Reply::error(
            "409 Conflict",
            format!(
                "{id:?} is parked at producer id {} epoch {}, not {pid}/{epoch}",
                parked.producer_id, parked.producer_epoch
            ),
        ));
    }
    let end = EndRequest {
        id,
        producer_id: pid,
        epoch,
        commit,
        tv2: false,
    };
    match txns.end_txn(end, who, true).await {
        Ok((next_pid, next_epoch)) => Ok(serde_json::json!({
            "transactional_id": id, "outcome": req.param("outcome"),
            "next_producer_id": next_pid, "next_producer_epoch": next_epoch,
        })),
        Err(code) => Err(Reply::error(
            "409 Conflict",
            format!("the coordinator refused: {code:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_host(h: &str) -> Request {
        Request::parse(&format!("GET / HTTP/1.1\r\nHost: {h}\r\n\r\n")).unwrap()
    }

    #[test]
    fn hosts_the_console_answers() {
        let allowed = vec!["broker.internal".to_string()];
        for h in [
            "127.0.0.1:9644",
            "localhost:9644",
            "[::1]:9644",
            "10.1.2.3",
            "LOCALHOST",
            "broker.internal:80",
        ] {
            assert!(host_allowed(&with_host(h), &allowed), "{h}");
        }
        for h in [
            "evil.example:9644",
            "127.0.0.1.evil.example",
            "localhost.evil.example:9644",
        ] {
            assert!(!host_allowed(&with_host(h), &allowed), "{h}");
        }
        let none = Request::parse("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(host_allowed(&none, &[]));
    }
}
