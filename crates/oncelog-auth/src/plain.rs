//! SASL PLAIN (RFC 4616): one message, `authzid NUL authcid NUL passwd`.

use crate::error::AuthError;

/// A parsed PLAIN message. The password is kept only as long as the check
/// takes; `Debug` leaves it out.
pub struct PlainMessage {
    pub user: String,
    pub password: Vec<u8>,
}

impl std::fmt::Debug for PlainMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainMessage")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl PlainMessage {
    /// Parses a client's PLAIN message. An authorization id, when given,
    /// must be the user itself (we do not let one user act as another).
    pub fn parse(msg: &[u8]) -> Result<Self, AuthError> {
        let mut parts = msg.splitn(3, |b| *b == 0);
        let (Some(authzid), Some(user), Some(password)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::Malformed(
                "PLAIN expects authzid NUL username NUL password".into(),
            ));
        };
        let user = std::str::from_utf8(user)
            .map_err(|_| AuthError::Malformed("PLAIN username is not UTF-8".into()))?;
        if user.is_empty() {
            return Err(AuthError::Malformed("PLAIN username is empty".into()));
        }
        if password.is_empty() {
            return Err(AuthError::Malformed("PLAIN password is empty".into()));
        }
        if !authzid.is_empty() && authzid != user.as_bytes() {
            return Err(AuthError::Unsupported(
                "an authorization id other than the username".into(),
            ));
        }
        Ok(Self {
            user: user.to_string(),
            password: password.to_vec(),
        })
    }

    /// The message a client sends (no authorization id).
    pub fn encode(user: &str, password: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(user.len() + password.len() + 2);
        out.push(0);
        out.extend_from_slice(user.as_bytes());
        out.push(0);
        out.extend_from_slice(password.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_encodes() {
        let m = PlainMessage::parse(&PlainMessage::encode("alice", "s3cret")).unwrap();
        assert_eq!(
            (m.user.as_str(), m.password.as_slice()),
            ("alice", &b"s3cret"[..])
        );
        let m = PlainMessage::parse(b"alice\0alice\0pw").unwrap();
        assert_eq!(m.user, "alice");
        // A NUL inside the password is the password's.
        let m = PlainMessage::parse(b"\0bob\0p\0w").unwrap();
        assert_eq!(m.password, b"p\0w");
        assert!(!format!("{m:?}").contains("p\\0w"));
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            &b""[..],
            b"alice",
            b"\0alice",
            b"\0\0pw",
            b"\0alice\0",
            b"\0\xff\0pw",
        ] {
            assert!(
                matches!(PlainMessage::parse(bad), Err(AuthError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            PlainMessage::parse(b"bob\0alice\0pw"),
            Err(AuthError::Unsupported(_))
        ));
    }
}
