//! `oncelog user create|delete|list`: SCRAM users, through
//! AlterUserScramCredentials and DescribeUserScramCredentials (so it works
//! against Kafka too). The password never leaves this process: the salted
//! password is derived here, as Kafka's own tools do.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Subcommand;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    AlterUserScramCredentialsRequest, ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResponse;
use kafka_protocol::messages::describe_user_scram_credentials_request::{
    DescribeUserScramCredentialsRequest, UserName,
};
use kafka_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResponse;
use kafka_protocol::messages::ApiKey;
use oncelog_auth::{random_bytes, Mechanism};
use oncelog_client::{Client, ResponseError};
use serde_json::json;

use super::{s, table};

#[derive(Subcommand)]
pub enum UserCmd {
    /// Create a user, or set its password, for one SCRAM mechanism or both.
    Create {
        name: String,
        /// The password (or use --password-file; `-` reads stdin's first line).
        #[arg(long, conflicts_with = "password_file")]
        password: Option<String>,
        #[arg(long)]
        password_file: Option<std::path::PathBuf>,
        /// SCRAM-SHA-256, SCRAM-SHA-512, or both (the default).
        #[arg(long)]
        mechanism: Option<String>,
        /// PBKDF2 iterations (Kafka allows 4096 to 16384).
        #[arg(long, default_value_t = 8192)]
        iterations: i32,
    },
    /// Delete a user's credentials (one mechanism, or every one it has).
    Delete {
        name: String,
        #[arg(long)]
        mechanism: Option<String>,
    },
    /// Users and the mechanisms and iterations of their credentials.
    List {
        /// Only these users (an unknown one is an error).
        names: Vec<String>,
    },
}

fn mechanisms(m: Option<&str>) -> Result<Vec<Mechanism>> {
    match m {
        None => Ok(Mechanism::ALL.to_vec()),
        Some(name) => match Mechanism::from_name(name) {
            Some(m) => Ok(vec![m]),
            None => bail!("unknown SCRAM mechanism {name} (SCRAM-SHA-256 or SCRAM-SHA-512)"),
        },
    }
}

fn read_password(password: Option<String>, file: Option<std::path::PathBuf>) -> Result<String> {
    if let Some(p) = password {
        return Ok(p);
    }
    let Some(f) = file else {
        bail!("give --password or --password-file");
    };
    let text = if f.as_os_str() == "-" {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        line
    } else {
        std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?
    };
    let p = text.lines().next().unwrap_or_default().to_string();
    if p.is_empty() {
        bail!("the password is empty");
    }
    Ok(p)
}

async fn alter(c: &mut Client, req: AlterUserScramCredentialsRequest) -> Result<()> {
    let (r, _) = c
        .call::<_, AlterUserScramCredentialsResponse>(ApiKey::AlterUserScramCredentials, &req)
        .await?;
    for res in &r.results {
        if res.error_code != 0 {
            let e = ResponseError::try_from_code(res.error_code)
                .map(|e| format!("{e:?}"))
                .unwrap_or_else(|| format!("error {}", res.error_code));
            bail!(
                "user {}: {e}: {}",
                res.user.as_str(),
                res.error_message.as_ref().map(|m| m.as_str()).unwrap_or("")
            );
        }
    }
    Ok(())
}

pub async fn user(bootstrap: &str, json_out: bool, cmd: UserCmd) -> Result<()> {
    let mut c = Client::connect(bootstrap).await?;
    match cmd {
        UserCmd::Create {
            name,
            password,
            password_file,
            mechanism,
            iterations,
        } => {
            let password = read_password(password, password_file)?;
            let mut ups = Vec::new();
            for m in mechanisms(mechanism.as_deref())? {
                let mut salt = [0u8; 24];
                random_bytes(&mut salt)?;
                let salted =
                    m.salted_password(password.as_bytes(), &salt, iterations.max(1) as u32);
                ups.push(
                    ScramCredentialUpsertion::default()
                        .with_name(s(&name))
                        .with_mechanism(m.wire_id())
                        .with_iterations(iterations)
                        .with_salt(Bytes::copy_from_slice(&salt))
                        .with_salted_password(Bytes::from(salted)),
                );
            }
            let n = ups.len();
            alter(
                &mut c,
                AlterUserScramCredentialsRequest::default().with_upsertions(ups),
            )
            .await?;
            if json_out {
                println!("{}", json!({"user": name, "mechanisms": n}));
            } else {
                println!("user {name}: {n} credential(s) set");
            }
        }
        UserCmd::Delete { name, mechanism } => {
            let mechs = match mechanism.as_deref() {
                Some(m) => mechanisms(Some(m))?,
                None => {
                    // Every mechanism the user has.
                    let req = DescribeUserScramCredentialsRequest::default()
                        .with_users(Some(vec![UserName::default().with_name(s(&name))]));
                    let (r, _) = c
                        .call::<_, DescribeUserScramCredentialsResponse>(
                            ApiKey::DescribeUserScramCredentials,
                            &req,
                        )
                        .await?;
                    let res = r.results.first().context("no answer for the user")?;
                    if res.error_code != 0 {
                        bail!("user {name} has no SCRAM credentials");
                    }
                    res.credential_infos
                        .iter()
                        .filter_map(|ci| Mechanism::from_wire_id(ci.mechanism))
                        .collect()
                }
            };
            let dels = mechs
                .iter()
                .map(|m| {
                    ScramCredentialDeletion::default()
                        .with_name(s(&name))
                        .with_mechanism(m.wire_id())
                })
                .collect();
            alter(
                &mut c,
                AlterUserScramCredentialsRequest::default().with_deletions(dels),
            )
            .await?;
            if json_out {
                println!("{}", json!({"user": name, "deleted": mechs.len()}));
            } else {
                println!("user {name}: {} credential(s) deleted", mechs.len());
            }
        }
        UserCmd::List { names } => {
            let users = (!names.is_empty()).then(|| {
                names
                    .iter()
                    .map(|n| UserName::default().with_name(s(n)))
                    .collect()
            });
            let req = DescribeUserScramCredentialsRequest::default().with_users(users);
            let (r, _) = c
                .call::<_, DescribeUserScramCredentialsResponse>(
                    ApiKey::DescribeUserScramCredentials,
                    &req,
                )
                .await?;
            if r.error_code != 0 {
                bail!(
                    "DescribeUserScramCredentials: error {}: {}",
                    r.error_code,
                    r.error_message.as_ref().map(|m| m.as_str()).unwrap_or("")
                );
            }
            let mut rows = Vec::new();
            let mut out = Vec::new();
            let mut missing = Vec::new();
            for res in &r.results {
                if res.error_code != 0 {
                    missing.push(res.user.to_string());
                    continue;
                }
                let creds: Vec<(String, i32)> = res
                    .credential_infos
                    .iter()
                    .map(|ci| {
                        let m = Mechanism::from_wire_id(ci.mechanism)
                            .map(|m| m.name().to_string())
                            .unwrap_or_else(|| format!("mechanism {}", ci.mechanism));
                        (m, ci.iterations)
                    })
                    .collect();
                for (m, i) in &creds {
                    rows.push(vec![res.user.to_string(), m.clone(), i.to_string()]);
                }
                out.push(json!({"user": res.user.as_str(),
                    "credentials": creds.iter().map(|(m, i)| json!({"mechanism": m, "iterations": i})).collect::<Vec<_>>()}));
            }
            if json_out {
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                table(&["USER", "MECHANISM", "ITERATIONS"], &rows);
            }
            if !missing.is_empty() {
                bail!("no such user: {}", missing.join(", "));
            }
        }
    }
    Ok(())
}
