//! `ssl.principal.mapping.rules`: how a client certificate's distinguished
//! name becomes a principal name, with the rule syntax Kafka documents.
//!
//! A comma-separated list, tried in order; the first rule whose pattern
//! matches the whole DN gives the name:
//!
//! * `RULE:pattern/replacement/` — `pattern` a regular expression,
//!   `replacement` with `$1`, `$2`… for its groups; a `/` inside either is
//!   written `\/`. A trailing `L` or `U` (`RULE:…/…/L`) lower- or upper-cases
//!   the result.
//! * `DEFAULT` — the DN unchanged (`CN=alice,O=acme`).
//!
//! A DN no rule matches is refused (the connection is closed), as Kafka does.
//! Commas inside a pattern are part of it: a rule ends at the comma after its
//! closing `/` and flag.

use regex::Regex;

#[derive(Debug, Clone)]
enum Rule {
    Default,
    Pattern {
        regex: Regex,
        replacement: String,
        case: Case,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

/// Parsed `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
pub struct PrincipalRules {
    rules: Vec<Rule>,
}

impl Default for PrincipalRules {
    fn default() -> Self {
        Self {
            rules: vec![Rule::Default],
        }
    }
}

/// Reads up to the next unescaped `/`, unescaping `\/`; returns the text and
/// the rest after the `/`.
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if s[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            '/' => return Some((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

impl PrincipalRules {
    /// Parses the setting; an empty one is `DEFAULT`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        let mut rest = spec.trim();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let (pattern, after) = until_slash(after)
                    .ok_or_else(|| format!("rule {rest:?}: no / after its pattern"))?;
                let (replacement, after) = until_slash(after)
                    .ok_or_else(|| format!("rule {rest:?}: no / after its replacement"))?;
                let (case, after) = match after.chars().next() {
                    Some('L') => (Case::Lower, &after[1..]),
                    Some('U') => (Case::Upper, &after[1..]),
                    _ => (Case::Keep, after),
                };
                let regex = Regex::new(&format!("^(?:{pattern})$"))
                    .map_err(|e| format!("rule pattern {pattern:?}: {e}"))?;
                rules.push(Rule::Pattern {
                    regex,
                    replacement,
                    case,
                });
                rest = after;
            } else {
                return Err(format!(
                    "{rest:?}: expected DEFAULT or RULE:pattern/replacement/[LU]"
                ));
            }
            rest = rest.trim_start();
            match rest.strip_prefix(',') {
                Some(after) => rest = after.trim_start(),
                None if rest.is_empty() => {}
                None => return Err(format!("{rest:?}: expected a comma between rules")),
            }
        }
        if rules.is_empty() {
            rules.push(Rule::Default);
        }
        Ok(Self { rules })
    }

    /// The principal name for distinguished name `dn`, or `None` when no
    /// rule applies.
    pub fn map(&self, dn: &str) -> Option<String> {
        for rule in &self.rules {
            match rule {
                Rule::Default => return Some(dn.to_string()),
                Rule::Pattern {
                    regex,
                    replacement,
                    case,
                } => {
                    let Some(caps) = regex.captures(dn) else {
                        continue;
                    };
                    let name = expand(&caps, replacement);
                    return Some(match case {
                        Case::Keep => name,
                        Case::Lower => name.to_lowercase(),
                        Case::Upper => name.to_uppercase(),
                    });
                }
            }
        }
        None
    }
}

/// `$N` (one or more digits) replaced by group N (empty when it did not
/// take part), `\x` by `x`, the rest as it is: Java's `replaceAll` syntax,
/// which the rules are written in.
fn expand(caps: &regex::Captures<'_>, replacement: &str) -> String {
    let mut out = String::new();
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            '$' if chars.peek().is_some_and(|d| d.is_ascii_digit()) => {
                let mut n = 0usize;
                while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n.saturating_mul(10).saturating_add(d as usize);
                    chars.next();
                }
                if let Some(m) = caps.get(n) {
                    out.push_str(m.as_str());
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keeps_the_dn() {
        let r = PrincipalRules::parse("").unwrap();
        assert_eq!(r.map("CN=alice,O=acme").as_deref(), Some("CN=alice,O=acme"));
        let r = PrincipalRules::parse("DEFAULT").unwrap();
        assert_eq!(r.map("CN=a").as_deref(), Some("CN=a"));
    }

    #[test]
    fn kafka_documented_rules() {
        // The examples of Kafka's security documentation.
        let r = PrincipalRules::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,DEFAULT",
        )
        .unwrap();
        assert_eq!(
            r.map("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown")
                .as_deref(),
            Some("serviceuser")
        );
        assert_eq!(
            r.map("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown")
                .as_deref(),
            Some("adminuser@admin")
        );
        assert_eq!(r.map("cn=Bob.Smith,O=x").as_deref(), Some("bob.smith"));
        assert_eq!(r.map("O=nobody").as_deref(), Some("O=nobody"));
    }

    #[test]
    fn no_rule_applies_and_escapes() {
        let r = PrincipalRules::parse("RULE:^CN=([^,]*),O=acme$/$1/U").unwrap();
        assert_eq!(r.map("CN=alice,O=acme").as_deref(), Some("ALICE"));
        assert_eq!(r.map("CN=alice,O=other"), None);
        let r = PrincipalRules::parse(r"RULE:^CN=(.*)\/x$/a\/$1/ , DEFAULT").unwrap();
        assert_eq!(r.map("CN=q/x").as_deref(), Some("a/q"));
        // The pattern must match the whole DN, not a part of it.
        let r = PrincipalRules::parse("RULE:CN=([a-z]+)/$1/").unwrap();
        assert_eq!(r.map("CN=alice,O=acme"), None);
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in [
            "RULE:^CN=(.*$/x/",
            "RULE:abc",
            "RULE:a/b",
            "NOPE",
            "DEFAULT RULE:a/b/",
        ] {
            assert!(PrincipalRules::parse(bad).is_err(), "{bad}");
        }
    }
}
