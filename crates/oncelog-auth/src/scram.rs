//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka speaks
//! them: no channel binding (`n,,` or `y,,`), an optional authorization id
//! that must equal the user, extensions accepted and ignored except
//! `tokenauth` (delegation tokens, which we do not have).
//!
//! The exchange, with the keys of RFC 5802 §3:
//!
//! ```text
//! client-first   n,,n=USER,r=CNONCE
//! server-first   r=CNONCE SNONCE,s=SALT,i=ITERATIONS
//! client-final   c=biws,r=CNONCE SNONCE,p=PROOF
//! server-final   v=SERVER-SIGNATURE
//! ```
//!
//! SaltedPassword = PBKDF2(password, salt, i); ClientKey = HMAC(SaltedPassword,
//! "Client Key"); StoredKey = H(ClientKey); ServerKey = HMAC(SaltedPassword,
//! "Server Key"); the proof is ClientKey XOR HMAC(StoredKey, AuthMessage).
//! A broker stores (salt, i, StoredKey, ServerKey) and can check a proof
//! without ever knowing the password.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::error::{random_bytes, AuthError};

/// A SCRAM mechanism, with Kafka's wire id (AlterUserScramCredentials,
/// DescribeUserScramCredentials).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];
    /// Kafka's bounds on the iteration count (ScramMechanism).
    pub const MIN_ITERATIONS: i32 = 4096;
    pub const MAX_ITERATIONS: i32 = 16384;

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's wire id: 1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512 (0 is UNKNOWN).
    pub fn wire_id(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_wire_id(id: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.wire_id() == id)
    }

    fn hmac(self, key: &[u8], data: &[&[u8]]) -> Vec<u8> {
        macro_rules! run {
            ($h:ty) => {{
                // HMAC takes keys of any length: new_from_slice cannot fail.
                let mut mac = match <Hmac<$h> as Mac>::new_from_slice(key) {
                    Ok(m) => m,
                    Err(_) => return Vec::new(),
                };
                for d in data {
                    mac.update(d);
                }
                mac.finalize().into_bytes().to_vec()
            }};
        }
        match self {
            Mechanism::Sha256 => run!(Sha256),
            Mechanism::Sha512 => run!(Sha512),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// PBKDF2-HMAC (RFC 5802's Hi()) of `password`: the salted password.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            Mechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }

    fn output_len(self) -> usize {
        match self {
            Mechanism::Sha256 => 32,
            Mechanism::Sha512 => 64,
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a broker keeps of one user's password for one mechanism.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    pub iterations: u32,
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// From a salted password, as AlterUserScramCredentials carries it.
    pub fn from_salted(mech: Mechanism, salt: &[u8], iterations: u32, salted: &[u8]) -> Self {
        let client_key = mech.hmac(salted, &[b"Client Key"]);
        Self {
            salt: salt.to_vec(),
            iterations,
            stored_key: mech.hash(&client_key),
            server_key: mech.hmac(salted, &[b"Server Key"]),
        }
    }

    /// From a password, with a fresh random salt.
    pub fn new(mech: Mechanism, password: &[u8], iterations: u32) -> Result<Self, AuthError> {
        let mut salt = [0u8; 24];
        random_bytes(&mut salt)?;
        let salted = mech.salted_password(password, &salt, iterations);
        Ok(Self::from_salted(mech, &salt, iterations, &salted))
    }

    /// Whether `password` is this credential's (SASL PLAIN checked against
    /// a stored SCRAM credential), in constant time over the keys.
    pub fn matches_password(&self, mech: Mechanism, password: &[u8]) -> bool {
        let salted = mech.salted_password(password, &self.salt, self.iterations);
        let c = Self::from_salted(mech, &self.salt, self.iterations, &salted);
        bool::from(c.stored_key.ct_eq(&self.stored_key))
    }

    /// A credential nobody's password matches, with a plausible salt: an
    /// unknown user's exchange runs to its end and fails like a wrong
    /// password, so it does not tell which users exist.
    fn decoy(mech: Mechanism, user: &str) -> Self {
        let mut random = [0u8; 64];
        let _ = random_bytes(&mut random);
        Self {
            // The same user always gets the same decoy salt.
            salt: mech.hash(user.as_bytes())[..24].to_vec(),
            iterations: Mechanism::MIN_ITERATIONS as u32,
            stored_key: random[..mech.output_len()].to_vec(),
            server_key: random[..mech.output_len()].to_vec(),
        }
    }
}

mod b64 {
    use super::{Engine, B64};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        B64.decode(s.as_bytes()).map_err(serde::de::Error::custom)
    }
}

fn malformed(why: impl Into<String>) -> AuthError {
    AuthError::Malformed(why.into())
}

/// `=2C` and `=3D` back to `,` and `=` (RFC 5802 saslname).
fn decode_saslname(s: &str) -> Result<String, AuthError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3);
        match esc {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(malformed("bad escape in username")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn encode_saslname(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

/// A nonce: printable, no commas (base64 of random bytes).
fn new_nonce() -> Result<String, AuthError> {
    let mut raw = [0u8; 24];
    random_bytes(&mut raw)?;
    Ok(B64.encode(raw))
}

fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// What the server answers to one client message.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerStep {
    /// Send this and wait for the client's next message.
    Continue(Vec<u8>),
    /// Authenticated as `user`: send the final message.
    Done { response: Vec<u8>, user: String },
}

enum ServerState {
    Initial,
    First {
        user: String,
        known: bool,
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
        cred: Credential,
    },
    Ended,
}

/// The server side of one SCRAM exchange.
pub struct ScramServer {
    mech: Mechanism,
    state: ServerState,
    fixed_nonce: Option<String>,
}

impl ScramServer {
    pub fn new(mech: Mechanism) -> Self {
        Self {
            mech,
            state: ServerState::Initial,
            fixed_nonce: None,
        }
    }

    /// With a fixed server nonce, for the RFC's test vectors.
    pub fn with_nonce(mech: Mechanism, nonce: &str) -> Self {
        Self {
            fixed_nonce: Some(nonce.to_string()),
            ..Self::new(mech)
        }
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mech
    }

    /// The user the exchange is about, once the client's first message named it.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            ServerState::First { user, .. } => Some(user),
            _ => None,
        }
    }

    /// Takes the client's next message. `lookup` finds a user's stored
    /// credential for this mechanism. Any error ends the exchange.
    pub fn step(
        &mut self,
        msg: &[u8],
        lookup: impl FnOnce(&str) -> Option<Credential>,
    ) -> Result<ServerStep, AuthError> {
        let state = std::mem::replace(&mut self.state, ServerState::Ended);
        match state {
            ServerState::Initial => self.client_first(msg, lookup),
            ServerState::First {
                user,
                known,
                gs2_header,
                client_first_bare,
                server_first,
                nonce,
                cred,
            } => {
                let response = client_final(
                    self.mech,
                    msg,
                    &gs2_header,
                    &client_first_bare,
                    &server_first,
                    &nonce,
                    &cred,
                )?;
                if !known {
                    return Err(AuthError::InvalidCredentials);
                }
                Ok(ServerStep::Done { response, user })
            }
            ServerState::Ended => Err(AuthError::State("the exchange has ended".into())),
        }
    }

    fn client_first(
        &mut self,
        msg: &[u8],
        lookup: impl FnOnce(&str) -> Option<Credential>,
    ) -> Result<ServerStep, AuthError> {
        let msg = std::str::from_utf8(msg).map_err(|_| malformed("client-first is not UTF-8"))?;
        // gs2-header: cbind-flag "," [authzid] ","
        let mut it = msg.splitn(3, ',');
        let (Some(flag), Some(authz), Some(bare)) = (it.next(), it.next(), it.next()) else {
            return Err(malformed("client-first lacks a GS2 header"));
        };
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => {
                return Err(AuthError::Unsupported("channel binding".into()))
            }
            _ => return Err(malformed("bad GS2 channel-binding flag")),
        }
        let authzid = match authz {
            "" => None,
            a => Some(decode_saslname(
                a.strip_prefix("a=")
                    .ok_or_else(|| malformed("bad GS2 authorization id"))?,
            )?),
        };
        let gs2_header = format!("{flag},{authz},");
        let mut attrs = bare.split(',');
        let user = attrs
            .next()
            .and_then(|a| a.strip_prefix("n="))
            .ok_or_else(|| malformed("client-first lacks n=username"))?;
        let user = decode_saslname(user)?;
        if user.is_empty() {
            return Err(malformed("empty username"));
        }
        let cnonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed("client-first lacks r=nonce"))?;
        if !valid_nonce(cnonce) {
            return Err(malformed("bad client nonce"));
        }
        for ext in attrs {
            let key = ext.split('=').next().unwrap_or_default();
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err(malformed("bad extension in client-first"));
            }
            if key == "tokenauth" && ext != "tokenauth=false" {
                return Err(AuthError::Unsupported("delegation tokens".into()));
            }
        }
        if authzid.as_ref().is_some_and(|a| *a != user) {
            return Err(AuthError::Unsupported(
                "an authorization id other than the username".into(),
            ));
        }
        let (cred, known) = match lookup(&user) {
            Some(c) => (c, true),
            None => (Credential::decoy(self.mech, &user), false),
        };
        let snonce = match &self.fixed_nonce {
            Some(n) => n.clone(),
            None => new_nonce()?,
        };
        let nonce = format!("{cnonce}{snonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&cred.salt),
            cred.iterations
        );
        let out = server_first.clone().into_bytes();
        self.state = ServerState::First {
            user,
            known,
            gs2_header,
            client_first_bare: bare.to_string(),
            server_first,
            nonce,
            cred,
        };
        Ok(ServerStep::Continue(out))
    }
}

/// Checks client-final and returns server-final.
fn client_final(
    mech: Mechanism,
    msg: &[u8],
    gs2_header: &str,
    client_first_bare: &str,
    server_first: &str,
    nonce: &str,
    cred: &Credential,
) -> Result<Vec<u8>, AuthError> {
    let msg = std::str::from_utf8(msg).map_err(|_| malformed("client-final is not UTF-8"))?;
    let (without_proof, proof) = msg
        .rsplit_once(",p=")
        .ok_or_else(|| malformed("client-final lacks p=proof"))?;
    let mut attrs = without_proof.split(',');
    let cbind = attrs
        .next()
        .and_then(|a| a.strip_prefix("c="))
        .ok_or_else(|| malformed("client-final lacks c=channel-binding"))?;
    let cbind = B64
        .decode(cbind)
        .map_err(|_| malformed("channel binding is not base64"))?;
    if cbind != gs2_header.as_bytes() {
        return Err(malformed("channel binding does not match the GS2 header"));
    }
    let r = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed("client-final lacks r=nonce"))?;
    if r != nonce {
        return Err(malformed(nonce_mismatch(r, nonce, client_first_bare)));
    }
    let proof = B64
        .decode(proof)
        .map_err(|_| malformed("proof is not base64"))?;
    if proof.len() != mech.output_len() || cred.stored_key.len() != mech.output_len() {
        return Err(AuthError::InvalidCredentials);
    }
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    let signature = mech.hmac(&cred.stored_key, &[auth_message.as_bytes()]);
    let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
    if !bool::from(mech.hash(&client_key).ct_eq(&cred.stored_key)) {
        return Err(AuthError::InvalidCredentials);
    }
    let server_signature = mech.hmac(&cred.server_key, &[auth_message.as_bytes()]);
    Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
}

/// Why a client-final's nonce `r` is not the exchange's `nonce` (the
/// client's nonce followed by the server's). librdkafka before 2.6.1 (so
/// kcat and the clients built on it, e.g. Debian's) sends its own nonce
/// again in front of the whole one: a known client bug, named here so that
/// the refusal (which stands: RFC 5802 demands it, and Kafka 4 refuses
/// too) tells what to do.
fn nonce_mismatch(r: &str, nonce: &str, client_first_bare: &str) -> String {
    let cnonce = client_first_bare
        .split(',')
        .find_map(|a| a.strip_prefix("r="))
        .unwrap_or_default();
    if !cnonce.is_empty() && r.strip_prefix(cnonce) == Some(nonce) {
        "nonce does not match: the client repeated its own nonce before the server's \
         (a known bug of librdkafka before 2.6.1, as in kcat and other clients built on it: \
         upgrade the client's librdkafka to 2.6.1 or later)"
            .into()
    } else {
        "nonce does not match".into()
    }
}

/// The client side of one SCRAM exchange.
pub struct ScramClient {
    mech: Mechanism,
    password: Vec<u8>,
    client_first_bare: String,
    cnonce: String,
    server_signature: Option<Vec<u8>>,
}

impl ScramClient {
    pub fn new(mech: Mechanism, user: &str, password: &str) -> Result<Self, AuthError> {
        Ok(Self::with_nonce(mech, user, password, &new_nonce()?))
    }

    /// With a fixed client nonce, for the RFC's test vectors.
    pub fn with_nonce(mech: Mechanism, user: &str, password: &str, nonce: &str) -> Self {
        Self {
            mech,
            password: password.as_bytes().to_vec(),
            client_first_bare: format!("n={},r={nonce}", encode_saslname(user)),
            cnonce: nonce.to_string(),
            server_signature: None,
        }
    }

    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Takes server-first and returns client-final.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, AuthError> {
        let sf = std::str::from_utf8(server_first)
            .map_err(|_| malformed("server-first is not UTF-8"))?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for a in sf.split(',') {
            if let Some(v) = a.strip_prefix("r=") {
                nonce = Some(v);
            } else if let Some(v) = a.strip_prefix("s=") {
                salt = Some(B64.decode(v).map_err(|_| malformed("salt is not base64"))?);
            } else if let Some(v) = a.strip_prefix("i=") {
                iterations = Some(
                    v.parse::<u32>()
                        .map_err(|_| malformed("bad iteration count"))?,
                );
            } else if let Some(e) = a.strip_prefix("e=") {
                return Err(AuthError::State(format!("server refused: {e}")));
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(malformed("server-first lacks r=, s= or i="));
        };
        if !nonce.starts_with(&self.cnonce) || nonce.len() == self.cnonce.len() {
            return Err(AuthError::State("server nonce does not extend ours".into()));
        }
        if iterations == 0 || iterations > 1_000_000 {
            return Err(malformed("iteration count out of range"));
        }
        let salted = self.mech.salted_password(&self.password, &salt, iterations);
        let client_key = self.mech.hmac(&salted, &[b"Client Key"]);
        let stored_key = self.mech.hash(&client_key);
        let server_key = self.mech.hmac(&salted, &[b"Server Key"]);
        let without_proof = format!("c={},r={nonce}", B64.encode(b"n,,"));
        let auth_message = format!("{},{sf},{without_proof}", self.client_first_bare);
        let signature = self.mech.hmac(&stored_key, &[auth_message.as_bytes()]);
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        self.server_signature = Some(self.mech.hmac(&server_key, &[auth_message.as_bytes()]));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks server-final: the server knew our credential.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), AuthError> {
        let sf = std::str::from_utf8(server_final)
            .map_err(|_| malformed("server-final is not UTF-8"))?;
        if let Some(e) = sf.strip_prefix("e=") {
            return Err(AuthError::State(format!("server refused: {e}")));
        }
        let v = sf
            .strip_prefix("v=")
            .ok_or_else(|| malformed("server-final lacks v="))?;
        let v = B64
            .decode(v)
            .map_err(|_| malformed("server signature is not base64"))?;
        match &self.server_signature {
            Some(want) if bool::from(want.ct_eq(&v)) => Ok(()),
            Some(_) => Err(AuthError::State("the server's signature is wrong".into())),
            None => Err(AuthError::State("server-final before server-first".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3: user "user", password "pencil".
    #[test]
    fn rfc7677_sha256_vector() {
        let mech = Mechanism::Sha256;
        let mut client = ScramClient::with_nonce(mech, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(client.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = mech.salted_password(b"pencil", &salt, 4096);
        let cred = Credential::from_salted(mech, &salt, 4096, &salted);
        let mut server = ScramServer::with_nonce(mech, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
        let first = match server.step(&client.client_first(), |u| {
            (u == "user").then(|| cred.clone())
        }) {
            Ok(ServerStep::Continue(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            first,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let fin = client.client_final(&first).unwrap();
        assert_eq!(
            fin,
            &b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="[..]
        );
        match server.step(&fin, |_| None) {
            Ok(ServerStep::Done { response, user }) => {
                assert_eq!(response, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
                assert_eq!(user, "user");
                client.verify_server_final(&response).unwrap();
            }
            other => panic!("{other:?}"),
        }
        // The exchange is over.
        assert!(matches!(
            server.step(b"x", |_| None),
            Err(AuthError::State(_))
        ));
    }

    fn exchange(
        mech: Mechanism,
        stored: Option<Credential>,
        user: &str,
        password: &str,
    ) -> Result<String, AuthError> {
        let mut client = ScramClient::new(mech, user, password)?;
        let mut server = ScramServer::new(mech);
        let ServerStep::Continue(first) = server.step(&client.client_first(), |_| stored)? else {
            panic!("done after one step")
        };
        let fin = client.client_final(&first)?;
        match server.step(&fin, |_| None)? {
            ServerStep::Done { response, user } => {
                client.verify_server_final(&response)?;
                Ok(user)
            }
            ServerStep::Continue(_) => panic!("not done after two steps"),
        }
    }

    #[test]
    fn both_mechanisms_round_trip_and_refuse_a_wrong_password() {
        for mech in Mechanism::ALL {
            let cred = Credential::new(mech, b"s3cret", 4096).unwrap();
            assert_eq!(
                exchange(mech, Some(cred.clone()), "a,b=c", "s3cret").unwrap(),
                "a,b=c"
            );
            assert_eq!(
                exchange(mech, Some(cred.clone()), "alice", "wrong"),
                Err(AuthError::InvalidCredentials)
            );
            // An unknown user fails the same way, at the same step.
            assert_eq!(
                exchange(mech, None, "nobody", "s3cret"),
                Err(AuthError::InvalidCredentials)
            );
            assert!(cred.matches_password(mech, b"s3cret"));
            assert!(!cred.matches_password(mech, b"s3cret!"));
        }
        // A SHA-256 credential is no SHA-512 one.
        let c256 = Credential::new(Mechanism::Sha256, b"pw", 4096).unwrap();
        assert_eq!(
            exchange(Mechanism::Sha512, Some(c256), "alice", "pw"),
            Err(AuthError::InvalidCredentials)
        );
    }

    #[test]
    fn malformed_and_unsupported_client_messages() {
        let cred = Credential::new(Mechanism::Sha256, b"pw", 4096).unwrap();
        let first = |m: &[u8]| ScramServer::new(Mechanism::Sha256).step(m, |_| Some(cred.clone()));
        for bad in [
            &b""[..],
            b"n,,",
            b"n,,r=abc",
            b"n,,n=alice",
            b"n,,n=alice,r=",
            b"n,,n=al=ice,r=abc",
            b"x,,n=alice,r=abc",
            b"n,b,n=alice,r=abc",
            b"n,,n=,r=abc",
            b"n,,n=alice,r=abc,=x",
            b"n,,n=alice,r=abc,1=2",
            b"\xff,,n=a,r=b",
        ] {
            assert!(
                matches!(first(bad), Err(AuthError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for unsupported in [
            &b"p=tls-unique,,n=alice,r=abc"[..],
            b"n,a=bob,n=alice,r=abc",
            b"n,,n=alice,r=abc,tokenauth=true",
        ] {
            assert!(matches!(first(unsupported), Err(AuthError::Unsupported(_))));
        }
        assert!(matches!(
            first(b"y,a=alice,n=alice,r=abc,ext=1"),
            Ok(ServerStep::Continue(_))
        ));

        // client-final that does not fit the exchange.
        let mut s = ScramServer::with_nonce(Mechanism::Sha256, "SN");
        s.step(b"n,,n=alice,r=CN", |_| Some(cred.clone())).unwrap();
        for bad in [
            &b"c=biws,r=CNSN"[..],
            b"c=eSws,r=CNSN,p=AAAA",
            b"c=biws,r=CNXX,p=AAAA",
            b"c=!!,r=CNSN,p=AAAA",
            b"r=CNSN,p=AAAA",
        ] {
            let mut s2 = ScramServer::with_nonce(Mechanism::Sha256, "SN");
            s2.step(b"n,,n=alice,r=CN", |_| Some(cred.clone())).unwrap();
            assert!(
                matches!(s2.step(bad, |_| None), Err(AuthError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            s.step(b"c=biws,r=CNSN,p=AAAA", |_| None),
            Err(AuthError::InvalidCredentials)
        );

        // librdkafka before 2.6.1 repeats its nonce: refused, and named.
        let mut s3 = ScramServer::with_nonce(Mechanism::Sha256, "SN");
        s3.step(b"n,,n=alice,r=CN", |_| Some(cred.clone())).unwrap();
        match s3.step(b"c=biws,r=CNCNSN,p=AAAA", |_| Some(cred.clone())) {
            Err(AuthError::Malformed(why)) => assert!(
                why.starts_with("nonce does not match: ")
                    && why.contains("librdkafka before 2.6.1"),
                "{why}"
            ),
            other => panic!("the repeated nonce was not refused: {other:?}"),
        }
        let mut s4 = ScramServer::with_nonce(Mechanism::Sha256, "SN");
        s4.step(b"n,,n=alice,r=CN", |_| Some(cred.clone())).unwrap();
        assert_eq!(
            s4.step(b"c=biws,r=CNXX,p=AAAA", |_| None),
            Err(AuthError::Malformed("nonce does not match".into()))
        );
    }

    #[test]
    fn credentials_round_trip_through_json_and_keep_secrets_out_of_debug() {
        let c = Credential::new(Mechanism::Sha512, b"pw", 8192).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"iterations\":8192"), "{json}");
        let back: Credential = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        assert!(back.matches_password(Mechanism::Sha512, b"pw"));
        assert!(!format!("{c:?}").contains("stored_key"));
        assert_eq!(Mechanism::from_wire_id(2), Some(Mechanism::Sha512));
        assert_eq!(
            Mechanism::from_name("SCRAM-SHA-256"),
            Some(Mechanism::Sha256)
        );
        assert_eq!(Mechanism::from_wire_id(0), None);
        assert_eq!(
            serde_json::to_string(&Mechanism::Sha256).unwrap(),
            "\"SCRAM-SHA-256\""
        );
    }
}
