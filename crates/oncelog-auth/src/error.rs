//! The one error of every exchange, and the randomness nonces and salts come from.

/// Why an exchange failed. The message is safe to log and to send to the
/// peer: it never contains a password or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The peer's message is not what the mechanism expects at this step.
    #[error("malformed SASL message: {0}")]
    Malformed(String),
    /// Wrong password, unknown user, or a forged proof: deliberately one
    /// answer, so a client cannot tell which users exist.
    #[error("authentication failed: invalid credentials")]
    InvalidCredentials,
    /// The peer asked for something we do not offer (channel binding, an
    /// authorization id other than its own user, a token extension).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A message after the exchange ended, or the server's answer failed
    /// the client's check.
    #[error("SASL exchange out of order: {0}")]
    State(String),
}

/// Fills `buf` with random bytes from the operating system.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), AuthError> {
    getrandom::fill(buf).map_err(|e| AuthError::State(format!("no randomness available: {e}")))
}
