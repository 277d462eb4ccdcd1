//! Client-side SASL (PLAIN, SCRAM-SHA-256/512) over SaslHandshake v1 and
//! SaslAuthenticate, for SASL_PLAINTEXT listeners. The process's setting is
//! made once ([`set`], by the CLI from its flags) and every new connection
//! authenticates with it right after ApiVersions (`conn::sasl_authenticate`).

use std::sync::OnceLock;

use oncelog_auth::Mechanism;

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

/// The configured user name and password, for the broker's HTTP endpoints
/// that change state (HTTP Basic against the same SCRAM credentials).
pub fn credentials() -> Option<(&'static str, &'static str)> {
    CONFIG
        .get()
        .map(|c| (c.username.as_str(), c.password.as_str()))
}
