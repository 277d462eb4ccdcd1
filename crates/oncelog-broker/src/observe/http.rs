//! The broker's HTTP listener (`metrics.listen`): `/metrics` (Prometheus
//! text, [`crate::observe::metrics`]), `/health`, the JSON endpoints the CLI reads
//! (`GET /v1/transactions/<id>/history`, `/v1/transactions/parked`,
//! `/v1/cleaner`, `/v1/cutover`) and writes (`POST /v1/cutover/start`,
//! `/v1/cutover/rollback`), and the web console (`/`, `/console/*`,
//! `/v1/console/*`, [`crate::observe::console`]).
//!
//! Every answer names the cluster and node it comes from
//! (`X-Oncelog-Cluster-Id`, `X-Oncelog-Node-Id`).
//!
//! HTTP/1.1 on hyper, each request head bounded (8 KiB) and read under a
//! deadline; no request body is read. A state-changing request (POST) from
//! a browser is refused unless it comes from the console's own origin
//! ([`browser_guard`]), so another web page cannot start a cut-over or an
//! action through an operator's browser.

use std::sync::Arc;

use tokio::net::TcpListener;

pub use crate::observe::httpmsg::{
    browser_guard, percent_decode, query_params, PathError, Reply, Request,
};
use crate::observe::metrics::render;
use crate::Broker;

async fn route(b: &Arc<Broker>, req: &Request) -> Reply {
    let path = req.path.as_str();
    if path.starts_with("/v1/cutover") {
        if req.method == "POST" {
            if let Err(why) = browser_guard(req) {
                tracing::warn!(path, peer = ?req.peer, "{why}");
                return Reply::error("403 Forbidden", why);
            }
            match crate::observe::console::authenticate(b, req) {
                Ok(who) => tracing::info!(path, principal = who.as_deref().unwrap_or("anonymous"),
                    peer = ?req.peer, params = ?req.params, "cut-over request"),
                Err(reply) => return reply,
            }
        }
        return cutover_endpoint(b, req).await;
    }
    if let Some(reply) = crate::observe::console::route(b, req).await {
        return reply;
    }
    match path {
        "/metrics" => Reply::new(
            "200 OK",
            render(b).await,
            crate::observe::exposition::CONTENT_TYPE,
        ),
        "/health" => Reply::text("200 OK", "ok\n"),
        "/v1/verify" => {
            let topic = req.params.get("topic").map(String::as_str);
            match crate::backend::verify_record::report(b, topic).await {
                Ok(v) => Reply::json("200 OK", v),
                Err(e) => Reply::error("503 Service Unavailable", e),
            }
        }
        "/v1/cleaner" => {
            let parts: serde_json::Map<String, serde_json::Value> = b
                .cleaner
                .statuses()
                .into_iter()
                .map(|(k, v)| (k, serde_json::to_value(v).unwrap_or_default()))
                .collect();
            Reply::json("200 OK", serde_json::json!({ "partitions": parts }))
        }
        "/v1/transactions/parked" => match b.txns().parked(crate::backend::Scope::All).await {
            Ok((parked, _)) => Reply::json("200 OK", serde_json::json!({ "parked": parked })),
            Err(code) => Reply::error(
                "503 Service Unavailable",
                format!("the transaction coordinator could not be read ({code:?})"),
            ),
        },
        _ => match history_id(path) {
            Some(Ok(id)) => match b.txns().history(&id).await {
                Ok(v) => Reply::json("200 OK", v),
                Err(code) => Reply::error(
                    "503 Service Unavailable",
                    format!("the transaction history could not be read ({code:?})"),
                ),
            },
            Some(Err(why)) => Reply::text("400 Bad Request", format!("{why}\n")),
            None => Reply::text("404 Not Found", "not found\n"),
        },
    }
}

/// Serves HTTP/1.1 (keep-alive, pipelining) with hyper until the process
/// ends. A request head must arrive within 5 s and fit in 8 KiB.
pub async fn serve(b: Arc<Broker>, listener: TcpListener) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, most likely: wait, do not spin.
                tracing::warn!(error = %e, "HTTP listener: accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let b = b.clone();
        tokio::spawn(async move {
            #[cfg(feature = "tls")]
            if b.config.metrics_tls {
                let Some(acceptor) = b.tls.as_ref().map(|t| t.acceptor()) else {
                    return;
                };
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => serve_connection(b, tls, peer).await,
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %peer, error = %e, "HTTP listener: TLS handshake failed; closing connection")
                    }
                    Err(_) => {
                        tracing::debug!(peer = %peer, "HTTP listener: no TLS handshake in time; closing connection")
                    }
                }
                return;
            }
            serve_connection(b, stream, peer).await
        });
    }
}

/// How long the HTTP listener waits for a connection's TLS handshake.
#[cfg(feature = "tls")]
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves one connection's requests (HTTP/1.1, keep-alive) on `io`: TCP,
/// or TLS over it.
async fn serve_connection<S>(b: Arc<Broker>, io: S, peer: std::net::SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let b = b.clone();
        async move { Ok::<_, std::convert::Infallible>(answer(&b, req, peer).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(5))
        .max_buf_size(8192)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    if let Err(e) = conn.await {
        tracing::debug!(peer = %peer, error = %e, "HTTP connection ended with an error");
    }
}

/// One request's answer, naming the cluster and node it comes from (the
/// CLI refuses another cluster's).
async fn answer<B>(
    b: &Arc<Broker>,
    req: hyper::Request<B>,
    peer: std::net::SocketAddr,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let mut reply = match Request::of(&req, peer) {
        Ok(req) => route(b, &req).await,
        Err(e) => Reply::error("400 Bad Request", e.to_string()),
    };
    reply
        .headers
        .push(format!("X-Oncelog-Cluster-Id: {}", b.cluster_id()));
    reply
        .headers
        .push(format!("X-Oncelog-Node-Id: {}", b.node_id()));
    reply.into_response()
}

/// The transactional id of a `/v1/transactions/<id>/history` path
/// (percent-decoded); `None` for any other path.
pub fn history_id(path: &str) -> Option<Result<String, PathError>> {
    let raw = path
        .strip_prefix("/v1/transactions/")?
        .strip_suffix("/history")?;
    Some(percent_decode(raw).and_then(|id| {
        if id.is_empty() {
            Err(PathError::Empty)
        } else {
            Ok(id)
        }
    }))
}

/// `drain_timeout_ms` of a start request (five minutes when not given).
fn drain_timeout(req: &Request) -> Result<i64, Reply> {
    match req.params.get("drain_timeout_ms").map(|v| v.parse::<i64>()) {
        None => Ok(300_000),
        Some(Ok(v)) => Ok(v),
        Some(Err(_)) => Err(Reply::error(
            "400 Bad Request",
            "drain_timeout_ms must be a number".into(),
        )),
    }
}

/// `GET /v1/cutover[?topic=T]`, `POST /v1/cutover/start?topic=&from=&to=&drain_timeout_ms=`,
/// `POST /v1/cutover/rollback?topic=` (in cluster mode on the cluster's
/// rows: any broker serves them).
async fn cutover_endpoint(b: &Arc<Broker>, req: &Request) -> Reply {
    let (method, path, params) = (req.method.as_str(), req.path.as_str(), &req.params);
    let store = b.cutover_store();
    let topic = params.get("topic").cloned().unwrap_or_default();
    let status = |topic: String| {
        let store = &store;
        async move {
            match crate::coordinators::cutover::status(store, &topic).await {
                Ok(v) => Reply::json("200 OK", v),
                Err(f) => crate::observe::console::cutover_failure(f),
            }
        }
    };
    match (method, path) {
        ("GET", "/v1/cutover") if topic.is_empty() => {
            let all = match store.all().await {
                Ok(all) => all,
                Err(f) => return crate::observe::console::cutover_failure(f),
            };
            let mut out = Vec::with_capacity(all.len());
            for c in all {
                match crate::coordinators::cutover::status(&store, &c.topic).await {
                    Ok(v) => out.push(v),
                    Err(f) => return crate::observe::console::cutover_failure(f),
                }
            }
            Reply::json("200 OK", serde_json::json!({ "cutovers": out }))
        }
        ("GET", "/v1/cutover") => status(topic).await,
        ("POST", "/v1/cutover/start") => {
            let from = params.get("from").map_or("", String::as_str);
            let to = params.get("to").map_or("", String::as_str);
            let drain = match drain_timeout(req) {
                Ok(d) => d,
                Err(reply) => return reply,
            };
            match crate::coordinators::cutover::start(&store, &topic, from, to, drain).await {
                Ok(_) => status(topic).await,
                Err(f) => crate::observe::console::cutover_failure(f),
            }
        }
        ("POST", "/v1/cutover/rollback") => {
            match crate::coordinators::cutover::rollback(&store, &topic).await {
                Ok(_) => status(topic).await,
                Err(f) => crate::observe::console::cutover_failure(f),
            }
        }
        (_, "/v1/cutover/start" | "/v1/cutover/rollback") => {
            Reply::error("405 Method Not Allowed", "use POST".into())
        }
        _ => Reply::error("404 Not Found", format!("no such endpoint {path}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_paths() {
        assert_eq!(
            history_id("/v1/transactions/fare-writer-7/history"),
            Some(Ok("fare-writer-7".to_string()))
        );
        assert_eq!(
            history_id("/v1/transactions/a%2Fb%20c%C3%A9/history"),
            Some(Ok("a/b cé".to_string()))
        );
        assert_eq!(
            history_id("/v1/transactions/%zz/history"),
            Some(Err(PathError::BadEncoding))
        );
        assert_eq!(
            history_id("/v1/transactions/%4/history"),
            Some(Err(PathError::BadEncoding))
        );
        assert_eq!(
            history_id("/v1/transactions//history"),
            Some(Err(PathError::Empty))
        );
        assert_eq!(
            history_id("/v1/transactions/%+4/history"),
            Some(Err(PathError::BadEncoding))
        );
        assert_eq!(history_id("/metrics"), None);
        assert_eq!(history_id("/v1/transactions/x"), None);
    }

    #[test]
    fn request_heads() {
        let r = Request::parse("POST /v1/console/actions/abort?topic=a%20b&partition=3 HTTP/1.1\r\nHost: 127.0.0.1:9644\r\nOrigin: http://127.0.0.1:9644\r\n\r\n").unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/console/actions/abort");
        assert_eq!(r.param("topic"), "a b");
        assert_eq!(r.param("partition"), "3");
        assert_eq!(r.header("host"), Some("127.0.0.1:9644"));
        assert!(browser_guard(&r).is_ok());
        assert!(Request::parse("GET /?x=%zz HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn cross_site_posts_are_refused() {
        let head = |extra: &str| {
            Request::parse(&format!(
                "POST /v1/cutover/start HTTP/1.1\r\nHost: 127.0.0.1:9644\r\n{extra}\r\n"
            ))
            .unwrap()
        };
        assert!(
            browser_guard(&head("")).is_ok(),
            "a tool sends neither header"
        );
        assert!(browser_guard(&head("Sec-Fetch-Site: same-origin\r\n")).is_ok());
        assert!(browser_guard(&head("Sec-Fetch-Site: cross-site\r\n")).is_err());
        assert!(browser_guard(&head("Sec-Fetch-Site: same-site\r\n")).is_err());
        assert!(browser_guard(&head("Origin: http://evil.example\r\n")).is_err());
        assert!(browser_guard(&head("Origin: null\r\n")).is_err());
        assert!(browser_guard(&head("Origin: http://127.0.0.1:9645\r\n")).is_err());
    }
}
