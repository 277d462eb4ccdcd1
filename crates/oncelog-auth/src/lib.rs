//! SASL for oncelog, without I/O: the SCRAM-SHA-256 and SCRAM-SHA-512
//! exchanges (RFC 5802, RFC 7677) from both sides, PLAIN (RFC 4616), and
//! the SCRAM credentials a broker stores (salt, iterations, StoredKey,
//! ServerKey: never the password). The broker runs the server side on
//! SASL listeners; the CLI runs the client side and derives the salted
//! password that AlterUserScramCredentials carries.
//!
//! Every parser here reads bytes a peer sent before it authenticated: none
//! panics, each returns [`AuthError`].

pub mod error;
pub mod plain;
pub mod scram;

pub use error::{random_bytes, AuthError};

pub use plain::PlainMessage;
pub use scram::{Credential, Mechanism, ScramClient, ScramServer, ServerStep};
