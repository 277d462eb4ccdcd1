//! A transactional id's history (epochs, fences, recent events) as the
//! broker serves it on its HTTP port (`GET /v1/transactions/<id>/history`):
//! the Kafka protocol has no field for who fenced whom, so `oncelog txn
//! describe` and `oncelog txn history` ask there.
//!
//! The HTTP client is a plain HTTP/1.1 GET with `Connection: close`: the
//! broker's listener answers one small document with a Content-Length and
//! closes, so a general HTTP crate (TLS, pools, redirects) would bring much
//! and add nothing here. Everything is bounded: connect and read deadlines,
//! and the size of the answer.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The broker's default HTTP port (`metrics.listen`).
pub const DEFAULT_ADMIN_PORT: u16 = 9644;
const DEADLINE: Duration = Duration::from_secs(5);
const MAX_ANSWER_BYTES: u64 = 8 << 20;

/// `http://<host of the first bootstrap address>:9644`.
pub fn default_admin_url(bootstrap: &str) -> String {
    let first = bootstrap.split(',').next().unwrap_or("").trim();
    let host = if first.starts_with('[') {
        first.split(']').next().map(|h| format!("{h}]"))
    } else {
        first.rsplit_once(':').map(|(h, _)| h.to_string())
    }
    .filter(|h| !h.is_empty())
    .unwrap_or_else(|| first.to_string());
    format!("http://{host}:{DEFAULT_ADMIN_PORT}")
}

/// The bootstrap whose cluster the HTTP endpoints asked must belong to,
/// and that cluster's id once learnt (`None` inside: it did not answer).
static BOUND: tokio::sync::OnceCell<(String, Option<String>)> = tokio::sync::OnceCell::const_new();
static BOOTSTRAP: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The HTTP endpoint to ask for `bootstrap`'s cluster: `admin` when given,
/// else [`default_admin_url`]. Either way every answer is then checked to
/// come from the bootstrap broker's cluster: a broker names its cluster in
/// the `X-Oncelog-Cluster-Id` header, and an answer of another cluster is
/// refused (a default port that reaches another broker on the same host
/// must not pass off that broker's state as this cluster's).
pub fn admin_for(bootstrap: &str, admin: Option<String>) -> String {
    let _ = BOOTSTRAP.set(bootstrap.to_string());
    admin.unwrap_or_else(|| default_admin_url(bootstrap))
}

/// The bootstrap broker's cluster id, asked once (Metadata); `None` when no
/// bootstrap was bound or it did not answer (nothing to compare with).
async fn expected_cluster() -> Option<&'static (String, Option<String>)> {
    let bootstrap = BOOTSTRAP.get()?;
    Some(
        BOUND
            .get_or_init(|| async {
                let id = async {
                    let mut c = oncelog_client::Client::connect(bootstrap).await.ok()?;
                    let md = oncelog_client::admin::metadata(&mut c, Some(vec![]))
                        .await
                        .ok()?;
                    md.cluster_id.map(|s| s.to_string())
                };
                let id = tokio::time::timeout(DEADLINE, id).await.ok().flatten();
                (bootstrap.clone(), id)
            })
            .await,
    )
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The history of `id` from the broker at `admin` (an `http://` URL).
pub async fn fetch(admin: &str, id: &str) -> Result<Value> {
    let path = format!("/v1/transactions/{}/history", percent_encode(id));
    get_json(admin, &path).await
}

/// Every compacted partition's cleaning state, from the broker at `admin`.
pub async fn cleaner(admin: &str) -> Result<Value> {
    get_json(admin, "/v1/cleaner").await
}

/// The transactions parked past their timeout, from the broker at `admin`.
pub async fn parked(admin: &str) -> Result<Value> {
    get_json(admin, "/v1/transactions/parked").await
}

pub async fn get_json(base: &str, path: &str) -> Result<Value> {
    request_json("GET", base, path).await
}

/// A POST without a body (the parameters are in the query); the answer's
/// `error` field, if any, is the error.
pub async fn post_json(base: &str, path: &str) -> Result<Value> {
    request_json("POST", base, path).await
}

async fn request_json(method: &str, base: &str, path: &str) -> Result<Value> {
    let (scheme, rest) = if let Some(rest) = base.strip_prefix("https://") {
        ("https", rest)
    } else if let Some(rest) = base.strip_prefix("http://") {
        ("http", rest)
    } else {
        bail!("{base}: give an http:// or https:// URL");
    };
    let (authority, prefix) = match rest.split_once('/') {
        Some((a, p)) => (a, format!("/{}", p.trim_end_matches('/'))),
        None => (rest, String::new()),
    };
    let prefix = prefix.trim_end_matches('/');
    let url = format!("{scheme}://{authority}{prefix}{path}");
    let tcp = tokio::time::timeout(DEADLINE, TcpStream::connect(authority))
        .await
        .map_err(|_| anyhow!("{method} {url}: connect timed out"))?
        .with_context(|| format!("{method} {url}"))?;
    let stream: oncelog_client::tls::Stream = if scheme == "https" {
        tokio::time::timeout(DEADLINE, oncelog_client::tls::connect_https(tcp, authority))
            .await
            .map_err(|_| anyhow!("{method} {url}: TLS handshake timed out"))?
            .with_context(|| format!("{method} {url}"))?
    } else {
        Box::new(tcp)
    };
    let answer = tokio::time::timeout(DEADLINE, exchange(stream, method, authority, prefix, path))
        .await
        .map_err(|_| anyhow!("{method} {url}: no answer within {}s", DEADLINE.as_secs()))?
        .with_context(|| format!("{method} {url}"))?;
    let (head, body) = split_answer(&answer).ok_or_else(|| anyhow!("{method} {url}: not HTTP"))?;
    if let Some((bootstrap, Some(expected))) = expected_cluster().await {
        let theirs = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("x-oncelog-cluster-id")
                .then(|| v.trim().to_string())
        });
        if let Some(theirs) = theirs {
            if &theirs != expected {
                bail!(
                    "{url} is the HTTP endpoint of cluster {theirs}, but {bootstrap} is cluster \
                     {expected}: give --admin (or ONCELOG_ADMIN) the metrics.listen address of a \
                     broker of {bootstrap}'s cluster"
                );
            }
        }
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| anyhow!("{method} {url}: no status in {:?}", head.lines().next()))?;
    if status != 200 {
        // A JSON answer's `error` is the broker's reason, said plainly.
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            if let Some(why) = v.get("error").and_then(Value::as_str) {
                bail!("{why}");
            }
        }
        let why = String::from_utf8_lossy(body);
        bail!("{method} {url}: HTTP {status} {}", why.trim());
    }
    serde_json::from_slice(body).with_context(|| format!("{method} {url}: not JSON"))
}

async fn exchange(
    mut stream: oncelog_client::tls::Stream,
    method: &str,
    host: &str,
    prefix: &str,
    path: &str,
) -> std::io::Result<Vec<u8>> {
    // A state change on a broker with SASL listeners needs the SASL user's
    // password (HTTP Basic), sent only when SASL settings were given.
    let auth = match (method, oncelog_client::sasl::credentials()) {
        ("POST", Some((user, password))) => {
            use base64::Engine as _;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Authorization: Basic {token}\r\n")
        }
        _ => String::new(),
    };
    let req = format!(
        "{method} {prefix}{path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    stream.take(MAX_ANSWER_BYTES).read_to_end(&mut out).await?;
    Ok(out)
}

/// (status line, body) of an HTTP answer.
fn split_answer(answer: &[u8]) -> Option<(String, &[u8])> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&answer[..end]).to_string();
    head.lines().next()?;
    Some((head, &answer[end + 4..]))
}

/// `2024-05-01 12:00:00.123Z` (UTC) for milliseconds since the epoch.
pub fn fmt_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn time(v: &Value) -> String {
    v.as_i64().map_or_else(|| "-".to_string(), fmt_ms)
}

fn epoch_change(v: &Value, old: &str, new: &str) -> String {
    match (v.get(old).and_then(Value::as_i64), v.get(new)) {
        (Some(o), Some(n)) => format!("{o} -> {}", text(n)),
        (None, Some(n)) => text(n),
        _ => "-".to_string(),
    }
}

fn list<'a>(h: &'a Value, key: &str) -> &'a [Value] {
    h.get(key)
        .and_then(Value::as_array)
        .map(|a| a.as_slice())
        .unwrap_or(&[])
}

/// The event rows: time, event, producer id, epoch, client, peer, detail.
pub fn event_rows(h: &Value) -> Vec<Vec<String>> {
    list(h, "events")
        .iter()
        .map(|e| {
            let mut detail = Vec::new();
            if let Some(c) = e.get("cause").and_then(Value::as_str) {
                detail.push(format!("cause={c}"));
            }
            let parts: Vec<String> = list(e, "partitions").iter().map(text).collect();
            if !parts.is_empty() {
                detail.push(parts.join(","));
            }
            if let Some(d) = e.get("detail").and_then(Value::as_str) {
                detail.push(d.to_string());
            }
            let n = e.get("count").and_then(Value::as_u64).unwrap_or(1);
            if n > 1 {
                detail.push(format!("x{n}, last at {}", time(&e["last_time_ms"])));
            }
            vec![
                time(&e["time_ms"]),
                text(&e["event"]),
                text(&e["producer_id"]),
                epoch_change(e, "old_epoch", "epoch"),
                text(&e["client_id"]),
                text(&e["peer"]),
                detail.join("; "),
            ]
        })
        .collect()
}

pub const EVENT_HEADERS: &[&str] = &[
    "TIME",
    "EVENT",
    "PRODUCER-ID",
    "EPOCH",
    "CLIENT-ID",
    "PEER",
    "DETAIL",
];

/// Prints where a stuck transaction is stuck (nothing when it is not).
pub fn print_stuck(h: &Value) {
    if let Some(st) = h.get("stuck").filter(|v| v.is_object()) {
        println!(
        "\nSTUCK: the {} markers of producer {} epoch {} have failed {} times at {} since {}: {}",
        if st["commit"].as_bool() == Some(true) {
            "COMMIT"
        } else {
            "ABORT"
        },
        text(&st["producer_id"]),
        text(&st["epoch"]),
        text(&st["tries"]),
        text(&st["partition"]),
        time(&st["since_ms"]),
        text(&st["error"]),
    );
    }
}

/// Prints the epochs, fences and events sections of a history.
pub fn print_sections(h: &Value, table: fn(&[&str], &[Vec<String>])) {
    if h["persisted"].as_bool() == Some(true) {
        println!(
            "\nhistory kept in the cluster's database since {} (every broker answers alike)",
            time(&h["history_since_ms"])
        );
    } else {
        println!(
            "\nhistory kept in memory since {} (a broker restart clears it)",
            time(&h["history_since_ms"])
        );
    }
    print_stuck(h);
    let epochs: Vec<Vec<String>> = list(h, "epochs")
        .iter()
        .map(|e| {
            let ended = match (e["ended_ms"].as_i64(), e["ended_by"].as_str()) {
                (Some(t), Some(by)) => format!("{} ({by})", fmt_ms(t)),
                _ => "current".to_string(),
            };
            vec![
                text(&e["producer_id"]),
                text(&e["epoch"]),
                time(&e["since_ms"]),
                text(&e["via"]),
                text(&e["client_id"]),
                text(&e["peer"]),
                ended,
            ]
        })
        .collect();
    println!("\nepochs:");
    table(
        &[
            "PRODUCER-ID",
            "EPOCH",
            "SINCE",
            "VIA",
            "CLIENT-ID",
            "PEER",
            "ENDED",
        ],
        &epochs,
    );
    let fences: Vec<Vec<String>> = list(h, "fences")
        .iter()
        .map(|f| {
            let aborted: Vec<String> = list(f, "aborted_partitions").iter().map(text).collect();
            vec![
                time(&f["time_ms"]),
                text(&f["cause"]),
                text(&f["producer_id"]),
                epoch_change(f, "old_epoch", "new_epoch"),
                text(&f["client_id"]),
                text(&f["peer"]),
                if aborted.is_empty() {
                    "-".to_string()
                } else {
                    aborted.join(",")
                },
            ]
        })
        .collect();
    println!("\nfences:");
    table(
        &[
            "TIME",
            "CAUSE",
            "PRODUCER-ID",
            "EPOCH",
            "CLIENT-ID",
            "PEER",
            "ABORTED",
        ],
        &fences,
    );
    println!("\nevents:");
    table(EVENT_HEADERS, &event_rows(h));
    let dropped = h["events_dropped"].as_u64().unwrap_or(0);
    if dropped > 0 {
        println!("({dropped} older events not kept)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_url_from_bootstrap() {
        assert_eq!(default_admin_url("127.0.0.1:9092"), "http://127.0.0.1:9644");
        assert_eq!(
            default_admin_url("b1.example:9092,b2:9092"),
            "http://b1.example:9644"
        );
        assert_eq!(default_admin_url("[::1]:9092"), "http://[::1]:9644");
        assert_eq!(default_admin_url("localhost"), "http://localhost:9644");
    }

    #[test]
    fn encodes_and_formats() {
        assert_eq!(percent_encode("a/b c-é"), "a%2Fb%20c-%C3%A9");
        assert_eq!(fmt_ms(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(fmt_ms(1_709_251_199_999), "2024-02-29 23:59:59.999Z");
        assert_eq!(fmt_ms(951_782_400_000), "2000-02-29 00:00:00.000Z");
    }

    #[test]
    fn answers_are_split() {
        let (head, body) = split_answer(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n{}").unwrap();
        assert_eq!(
            (head.as_str(), body),
            ("HTTP/1.1 200 OK\r\nA: b", &b"{}"[..])
        );
        assert!(split_answer(b"garbage").is_none());
    }
}
