//! Client-side SASL (PLAIN, SCRAM-SHA-256/512) over SaslHandshake v1 and
//! SaslAuthenticate, for SASL_PLAINTEXT listeners. The process's setting is
//! made once ([`set`], by the CLI from its flags) and every new connection
//! authenticates with it right after ApiVersions.

use std::sync::OnceLock;

use bytes::Bytes;
use kafka_protocol::messages::sasl_authenticate_request::SaslAuthenticateRequest;
use kafka_protocol::messages::sasl_authenticate_response::SaslAuthenticateResponse;
use kafka_protocol::messages::sasl_handshake_request::SaslHandshakeRequest;
use kafka_protocol::messages::sasl_handshake_response::SaslHandshakeResponse;
use kafka_protocol::messages::ApiKey;
use oncelog_auth::{Mechanism, PlainMessage, ScramClient};

use crate::cluster::s;
use crate::conn::Client;
use crate::error::ClientError;

/// How this process's connections authenticate.
#[derive(Clone)]
pub struct SaslConfig {
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    pub mechanism: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslConfig")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

static CONFIG: OnceLock<SaslConfig> = OnceLock::new();

/// Makes every connection of this process authenticate with `c`. The first
/// call wins; later ones are ignored.
pub fn set(c: SaslConfig) -> Result<(), ClientError> {
    if c.mechanism != "PLAIN" && Mechanism::from_name(&c.mechanism).is_none() {
        return Err(ClientError::Auth {
            addr: String::new(),
            why: format!(
                "unknown SASL mechanism {} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
                c.mechanism
            ),
        });
    }
    let _ = CONFIG.set(c);
    Ok(())
}

pub(crate) fn configured() -> Option<&'static SaslConfig> {
    CONFIG.get()
}

fn fail(c: &Client, why: impl Into<String>) -> ClientError {
    ClientError::Auth {
        addr: c.addr().to_string(),
        why: why.into(),
    }
}

/// Runs the SASL exchange on a fresh connection.
pub(crate) async fn authenticate(c: &mut Client, cfg: &SaslConfig) -> Result<(), ClientError> {
    let hs: SaslHandshakeResponse = c
        .call_max::<_, SaslHandshakeResponse>(
            ApiKey::SaslHandshake,
            &SaslHandshakeRequest::default().with_mechanism(s(&cfg.mechanism)),
            1,
        )
        .await?
        .0;
    if hs.error_code != 0 {
        let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
        return Err(fail(
            c,
            format!(
                "the broker refused SASL mechanism {} (error {}); it offers {offered:?}",
                cfg.mechanism, hs.error_code
            ),
        ));
    }
    if cfg.mechanism == "PLAIN" {
        step(c, PlainMessage::encode(&cfg.username, &cfg.password)).await?;
        return Ok(());
    }
    let mech = Mechanism::from_name(&cfg.mechanism)
        .ok_or_else(|| fail(c, format!("unknown SASL mechanism {}", cfg.mechanism)))?;
    let mut scram =
        ScramClient::new(mech, &cfg.username, &cfg.password).map_err(|e| fail(c, e.to_string()))?;
    let server_first = step(c, scram.client_first()).await?;
    let client_final = scram
        .client_final(&server_first)
        .map_err(|e| fail(c, e.to_string()))?;
    let server_final = step(c, client_final).await?;
    scram
        .verify_server_final(&server_final)
        .map_err(|e| fail(c, e.to_string()))
}

/// One SaslAuthenticate: sends `token`, returns the broker's bytes.
async fn step(c: &mut Client, token: Vec<u8>) -> Result<Vec<u8>, ClientError> {
    let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
    let r: SaslAuthenticateResponse = c
        .call::<_, SaslAuthenticateResponse>(ApiKey::SaslAuthenticate, &req)
        .await?
        .0;
    if r.error_code != 0 {
        let why = r.error_message.map(|m| m.to_string()).unwrap_or_default();
        return Err(fail(
            c,
            format!("authentication failed (error {}): {why}", r.error_code),
        ));
    }
    Ok(r.auth_bytes.to_vec())
}
