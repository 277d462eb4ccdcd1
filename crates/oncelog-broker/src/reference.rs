//! The reference pages generated from the code: docs/configuration.md from
//! the settings table ([`SETTINGS`], the topic configs) and docs/protocol.md
//! from what ApiVersions answers in each mode. Each page keeps prose written
//! by hand around one generated part between [`BEGIN`] and [`END`]; the test
//! below fails when that part differs from the code, and
//! `ONCELOG_BLESS_DOCS=1 cargo test -p oncelog-broker --lib reference` writes it.

use std::collections::BTreeMap;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiKey;

use crate::config::{BrokerConfig, SETTINGS};

pub const BEGIN: &str =
    "<!-- BEGIN GENERATED: ONCELOG_BLESS_DOCS=1 cargo test -p oncelog-broker --lib reference -->";
pub const END: &str = "<!-- END GENERATED -->";

/// A table cell: inline code for values, `|` escaped, never empty.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn code(text: &str) -> String {
    if text.is_empty() {
        "(empty)".to_string()
    } else {
        format!("`{}`", cell(text))
    }
}

/// The generated part of docs/configuration.md.
pub fn configuration() -> String {
    let mut out = String::new();
    out.push_str("## Broker settings\n\n");
    out.push_str(&format!("{} settings.\n\n", SETTINGS.len()));
    out.push_str("| setting | default | meaning |\n|---|---|---|\n");
    for (name, default, help) in SETTINGS {
        out.push_str(&format!(
            "| `{name}` | {} | {} |\n",
            code(default),
            cell(help)
        ));
    }
    let defaults = BrokerConfig::from_map(&BTreeMap::new())
        .expect("the settings table's defaults parse (config::tests::defaults_parse)");
    out.push_str("\n## Topic configs\n\n");
    out.push_str(
        "Set with CreateTopics, AlterConfigs or IncrementalAlterConfigs \
         (`oncelog topic create --config`, `kafka-configs`, any admin client). \
         A topic without one takes the broker setting named beside it. \
         \"stored\" configs are accepted, kept and reported as Kafka does, \
         and change nothing here (one node, one copy).\n\n",
    );
    out.push_str("| config | default | broker setting | acted on |\n|---|---|---|---|\n");
    let mut topic_configs = BrokerConfig::TOPIC_CONFIGS.to_vec();
    topic_configs.sort_unstable();
    for name in topic_configs {
        let default = defaults.topic_default(name).unwrap_or_default();
        let marker = format!("(topic: {name})");
        let broker = SETTINGS
            .iter()
            .find(|(_, _, help)| help.contains(&marker))
            .map(|(k, _, _)| format!("`{k}`"))
            .unwrap_or_default();
        let acted = BrokerConfig::ACTED_TOPIC_CONFIGS.contains(&name)
            || name == "writer.transactional.id.prefix";
        out.push_str(&format!(
            "| `{name}` | {} | {broker} | {} |\n",
            code(&default),
            if acted { "yes" } else { "stored" }
        ));
    }
    out
}

fn versions(keys: &[ApiVersion], key: ApiKey) -> String {
    keys.iter()
        .find(|v| v.api_key == key as i16)
        .map(|v| format!("{}–{}", v.min_version, v.max_version))
        .unwrap_or_else(|| "—".to_string())
}

/// The generated part of docs/protocol.md.
pub fn protocol() -> String {
    let plain = crate::protocol::api_keys(false);
    let with_2pc = crate::protocol::api_keys(true);
    let mut keys: Vec<ApiKey> = plain
        .iter()
        .chain(with_2pc.iter())
        .filter_map(|v| ApiKey::try_from(v.api_key).ok())
        .collect();
    keys.sort_by_key(|k| *k as i16);
    keys.dedup();
    let mut out = String::new();
    out.push_str(&format!(
        "{} APIs, the versions ApiVersions answers with: the same in local \
         and cluster mode (one handler serves each request in both).\n\n",
        keys.len(),
    ));
    out.push_str("| API | key | versions |\n|---|---|---|\n");
    for key in keys {
        let mut here = versions(&plain, key);
        let two_pc = versions(&with_2pc, key);
        if two_pc != here {
            here = format!("{here} ({two_pc} with `transaction.two.phase.commit.enable=true`)");
        }
        out.push_str(&format!("| {key:?} | {} | {here} |\n", key as i16));
    }
    out
}

/// The page's text with its generated part replaced by `generated`; `None`
/// when the page lacks the markers.
pub fn splice(page: &str, generated: &str) -> Option<String> {
    let start = page.find(BEGIN)? + BEGIN.len();
    let end = start + page[start..].find(END)?;
    Some(format!("{}\n{}{}", &page[..start], generated, &page[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn check(page: &str, generated: String) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs")
            .join(page);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let want = splice(&text, &generated)
            .unwrap_or_else(|| panic!("{} has no `{BEGIN}` ... `{END}` part", path.display()));
        if want == text {
            return;
        }
        if std::env::var_os("ONCELOG_BLESS_DOCS").is_some() {
            std::fs::write(&path, want).unwrap();
            return;
        }
        panic!(
            "docs/{page} is not what the code says: run \
             `ONCELOG_BLESS_DOCS=1 cargo test -p oncelog-broker --lib reference` and commit it"
        );
    }

    #[test]
    fn configuration_page_is_the_settings_table() {
        check("configuration.md", configuration());
    }

    #[test]
    fn protocol_page_is_what_api_versions_answers() {
        check("protocol.md", protocol());
    }

    #[test]
    fn every_setting_is_on_the_page() {
        let page = configuration();
        for (name, _, _) in SETTINGS {
            assert!(page.contains(&format!("| `{name}` |")), "{name}");
        }
        for name in BrokerConfig::TOPIC_CONFIGS {
            assert!(page.contains(&format!("| `{name}` |")), "{name}");
        }
    }

    #[test]
    fn splice_replaces_only_the_generated_part() {
        let page = format!("intro\n{BEGIN}\nold\n{END}\noutro\n");
        assert_eq!(
            splice(&page, "new\n").unwrap(),
            format!("intro\n{BEGIN}\nnew\n{END}\noutro\n")
        );
        assert!(splice("no markers", "x").is_none());
    }
}
