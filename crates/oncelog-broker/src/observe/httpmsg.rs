//! HTTP request heads and replies of the broker's HTTP listener
//! ([`crate::observe::http`]), and the check that keeps other web pages from changing
//! state through an operator's browser ([`browser_guard`]).

use std::collections::BTreeMap;

/// Why a history path is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("bad percent-encoding in the transactional id")]
    BadEncoding,
    #[error("empty transactional id")]
    Empty,
}

pub fn percent_decode(s: &str) -> Result<String, PathError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(PathError::BadEncoding)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err(PathError::BadEncoding);
            }
            let hex = std::str::from_utf8(hex).map_err(|_| PathError::BadEncoding)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| PathError::BadEncoding)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| PathError::BadEncoding)
}

/// The query's parameters, percent-decoded.
pub fn query_params(query: &str) -> Result<BTreeMap<String, String>, PathError> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Ok((percent_decode(k)?, percent_decode(&v.replace('+', " "))?))
        })
        .collect()
}

/// A parsed request head.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The query's parameters, percent-decoded.
    pub params: BTreeMap<String, String>,
    /// Header names lower-cased; values trimmed.
    pub headers: Vec<(String, String)>,
    pub peer: Option<std::net::SocketAddr>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn param(&self, name: &str) -> &str {
        self.params.get(name).map_or("", String::as_str)
    }

    /// The request hyper read, from `peer`.
    pub fn of<B>(req: &hyper::Request<B>, peer: std::net::SocketAddr) -> Result<Self, PathError> {
        Ok(Self {
            method: req.method().as_str().to_string(),
            path: req.uri().path().to_string(),
            params: query_params(req.uri().query().unwrap_or(""))?,
            headers: req
                .headers()
                .iter()
                .map(|(k, v)| {
                    let v = String::from_utf8_lossy(v.as_bytes()).trim().to_string();
                    (k.as_str().to_ascii_lowercase(), v)
                })
                .collect(),
            peer: Some(peer),
        })
    }

    /// Parses a request head (`GET /path?query HTTP/1.1` and header lines).
    #[cfg(test)]
    pub fn parse(head: &str) -> Result<Self, PathError> {
        let mut lines = head.split("\r\n");
        let first = lines.next().unwrap_or("");
        let mut words = first.split_whitespace();
        let method = words.next().unwrap_or("").to_string();
        let target = words.next().unwrap_or("");
        let path = target.split('?').next().unwrap_or("").to_string();
        let query = target.split_once('?').map_or("", |(_, q)| q);
        let params = query_params(query)?;
        let headers = lines
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Self {
            method,
            path,
            params,
            headers,
            peer: None,
        })
    }
}

/// A response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: &'static str,
    pub body: Vec<u8>,
    pub content_type: &'static str,
    /// Extra header lines (`Name: value`).
    pub headers: Vec<String>,
}

impl Reply {
    pub fn new(status: &'static str, body: impl Into<Vec<u8>>, content_type: &'static str) -> Self {
        Self {
            status,
            body: body.into(),
            content_type,
            headers: Vec::new(),
        }
    }

    pub fn json(status: &'static str, v: serde_json::Value) -> Self {
        Self::new(
            status,
            serde_json::to_string_pretty(&v).unwrap_or_default() + "\n",
            "application/json",
        )
    }

    /// Compact JSON (the console's polls).
    pub fn json_compact(v: &serde_json::Value) -> Self {
        Self::new(
            "200 OK",
            serde_json::to_vec(v).unwrap_or_default(),
            "application/json",
        )
        .header("Cache-Control: no-store")
    }

    pub fn error(status: &'static str, why: String) -> Self {
        Self::json(status, serde_json::json!({ "error": why }))
    }

    pub fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self::new(status, body.into(), "text/plain")
    }

    pub fn header(mut self, line: impl Into<String>) -> Self {
        self.headers.push(line.into());
        self
    }

    /// As hyper's response.
    pub fn into_response(self) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
        let code = self
            .status
            .get(..3)
            .and_then(|c| c.parse::<u16>().ok())
            .and_then(|c| hyper::StatusCode::from_u16(c).ok())
            .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        let mut out =
            hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(self.body)));
        *out.status_mut() = code;
        let headers = out.headers_mut();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(self.content_type),
        );
        for line in &self.headers {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            match (
                hyper::header::HeaderName::from_bytes(name.trim().as_bytes()),
                hyper::header::HeaderValue::from_str(value.trim()),
            ) {
                (Ok(n), Ok(v)) => {
                    headers.append(n, v);
                }
                _ => {
                    tracing::warn!(header = %line, "HTTP listener: a reply header is not valid; left out")
                }
            }
        }
        out
    }
}

/// Refuses a state-changing request a browser sent from another origin:
/// one whose `Origin` is not this listener's `Host`, or whose
/// `Sec-Fetch-Site` is anything but same-origin (a browser always sends one
/// of them with a POST). Tools (the CLI, curl) send neither and pass.
pub fn browser_guard(req: &Request) -> Result<(), String> {
    if let Some(site) = req.header("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return Err(format!("refused a {site} request: state changes are accepted only from this listener's own pages"));
        }
    }
    if let Some(origin) = req.header("origin") {
        let host = req.header("host").unwrap_or("");
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or(origin);
        if origin == "null" || origin_host != host {
            return Err(format!("refused a request from origin {origin}: state changes are accepted only from this listener's own pages"));
        }
    }
    Ok(())
}
