//! A SASL listener's authentication (`oncelog_broker::security::Session`)
//! fed arbitrary frames before and after it authenticates: SaslHandshake and
//! SaslAuthenticate at any version, raw tokens after a v0 handshake, PLAIN
//! and SCRAM messages, other requests. It must never panic, and a
//! connection must never end up authenticated as a user whose password it
//! did not prove (the one user here has a password no input contains: it
//! is 32 random bytes, base64).
//!
//! Input: frames as `[u16 length][bytes]`, in order.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use oncelog_auth::{Credential, Mechanism};
use oncelog_broker::security::{
    Auth, AuthStats, Listener, ScramUsers, SecurityProtocol, Session, Verdict,
};

struct Fixture {
    _dir: tempfile::TempDir,
    users: ScramUsers,
    stats: AuthStats,
    mechanisms: Vec<String>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = oncelog_fuzz::scratch_dir();
        let mut pw = [0u8; 32];
        oncelog_auth::random_bytes(&mut pw).expect("randomness");
        let pw: String = pw.iter().map(|b| format!("{b:02x}")).collect();
        let mut creds = BTreeMap::new();
        for m in Mechanism::ALL {
            creds.insert(
                m,
                Credential::new(m, pw.as_bytes(), 4096).expect("credential"),
            );
        }
        let mut users = BTreeMap::new();
        users.insert("alice".to_string(), creds);
        std::fs::write(
            dir.path().join(oncelog_broker::security::USERS_FILE),
            serde_json::to_vec(&users).expect("json"),
        )
        .expect("write users");
        Fixture {
            users: ScramUsers::open(dir.path()).expect("open users"),
            _dir: dir,
            stats: AuthStats::default(),
            mechanisms: vec![
                "PLAIN".into(),
                "SCRAM-SHA-256".into(),
                "SCRAM-SHA-512".into(),
            ],
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let listener = Listener {
        name: "SASL_PLAINTEXT".into(),
        protocol: SecurityProtocol::SaslPlaintext,
        bind: "127.0.0.1:9093".parse().unwrap(),
        advertised_host: "127.0.0.1".into(),
        advertised_port: 9093,
    };
    let mut s = Session::new(&listener, "127.0.0.1:50000".parse().unwrap());
    let auth = Auth {
        users: &f.users,
        stats: &f.stats,
        mechanisms: &f.mechanisms,
        reauth_ms: if data.first().is_some_and(|b| b & 1 == 1) {
            1000
        } else {
            0
        },
    };
    let mut rest = data.get(1..).unwrap_or_default();
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let frame = &rest[2..(2 + n).min(rest.len())];
        rest = &rest[(2 + n).min(rest.len())..];
        match oncelog_broker::protocol::server::judge(&mut s, &Bytes::copy_from_slice(frame), &auth) {
            Verdict::Reply(_) | Verdict::Request => {}
            Verdict::Fail(_) | Verdict::Close(_) => break,
        }
        assert!(
            s.principal().is_none(),
            "authenticated without the password: {:?}",
            s.principal()
        );
    }
});
