//! Secrets kept out of what the worker derives (docs/protocol.md, "Secrets"): what the
//! summarizer is sent (the old part, its context, the instructions), every summary
//! before it is written, and what recall returns. A credential in a tool output (a
//! database URL with its password in a stack trace, a token in a curl command) is
//! replaced by a marker that names its kind, `[REDACTED:aws_access_key]`, and counted.
//!
//! The rule is a table of credential shapes ([`RULES`]), each recognized by what it
//! looks like, never by how random it is: identifiers the fact check relies on (UUIDs,
//! git SHAs, sha256 digests, request ids, hostnames, error codes) look random too, and
//! pass unchanged. Only the secret is replaced: `postgres://app:[REDACTED:url_password]@
//! orders-db:5432/orders` keeps the user, the host and the database, which an
//! investigation may turn on.
//!
//! Pure and synchronous; a pass over a few megabytes takes milliseconds (see
//! docs/benchmarks.md), so the worker runs it with the fact check's work, on the
//! blocking pool for a large old part.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde_json::{Map, Value};

use crate::message::Message;

/// How the marker of a redacted secret starts: `[REDACTED:<kind>]`.
pub const MARKER_START: &str = "[REDACTED:";

/// One credential shape: its kind (the marker's name) and the pattern that finds it.
/// Where the pattern has a group named `secret`, only that group is replaced; otherwise
/// the whole match.
pub struct Rule {
    pub kind: &'static str,
    /// What it recognizes, for docs/protocol.md's table and the tests.
    pub shape: &'static str,
    pattern: &'static str,
}

/// The keys whose value is a secret, in `key=value`, `key: value` and JSON forms: the key
/// ends with one of these words (`DB_PASSWORD`, `aws_secret_access_key`, `X-Api-Key`).
macro_rules! secret_keys {
    () => {
        r"(?:password|passwd|passphrase|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|client[_-]?secret|credentials?)"
    };
}

/// The credential shapes, in the order they are applied: a provider's key is named by
/// its own kind before the assignment rule (`GITHUB_TOKEN=ghp_...` is a `github_token`).
pub const RULES: &[Rule] = &[
    Rule {
        kind: "private_key",
        shape: "a PEM private key block, `-----BEGIN ... PRIVATE KEY-----` to its END line (or the text's end)",
        pattern: r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
    },
    Rule {
        kind: "jwt",
        shape: "a JSON Web Token: three base64url parts, the first two starting `eyJ`",
        pattern: r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    },
    Rule {
        kind: "url_password",
        shape: "the password of credentials inside a URL, `scheme://user:password@host`",
        pattern: r#"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@"'\\]+:(?P<secret>[^\s/@"'\\]+)@"#,
    },
    Rule {
        kind: "bearer_token",
        shape: "a bearer token: `Bearer` and 16 or more token characters",
        pattern: r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)",
    },
    Rule {
        kind: "basic_auth",
        shape: "basic auth: an `Authorization` header (or `-u user:password` of curl) with its credentials",
        pattern: r#"(?i)(?:authorization["']?\s*[:=]\s*["']?basic\s+(?P<secret>[A-Za-z0-9+/]{8,}=*)|\s-u\s+["']?[^\s:"']+:(?P<curl>[^\s"']+))"#,
    },
    Rule {
        kind: "anthropic_key",
        shape: "an Anthropic API key, `sk-ant-...`",
        pattern: r"\bsk-ant-[A-Za-z0-9_-]{20,}",
    },
    Rule {
        kind: "openai_key",
        shape: "an OpenAI API key: `sk-proj-`, `sk-svcacct-` or `sk-admin-` and 20 or more characters, or `sk-` and 32 or more letters and digits",
        pattern: r"\bsk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,}|[A-Za-z0-9]{32,})",
    },
    Rule {
        kind: "aws_access_key",
        shape: "an AWS access key id, `AKIA`/`ASIA` and 16 capitals or digits",
        pattern: r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
    },
    Rule {
        kind: "github_token",
        shape: "a GitHub token, `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` or `github_pat_`",
        pattern: r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
    },
    Rule {
        kind: "gitlab_token",
        shape: "a GitLab personal access token, `glpat-...`",
        pattern: r"\bglpat-[A-Za-z0-9_-]{20,}",
    },
    Rule {
        kind: "slack_token",
        shape: "a Slack token, `xoxb-`/`xoxp-`/`xoxa-`/`xoxr-`/`xoxs-`",
        pattern: r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    },
    Rule {
        kind: "stripe_key",
        shape: "a Stripe secret or restricted key, `sk_live_`/`rk_live_` (or `_test_`)",
        pattern: r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",
    },
    Rule {
        kind: "google_api_key",
        shape: "a Google API key, `AIza` and 35 characters",
        pattern: r"\bAIza[0-9A-Za-z_-]{35}",
    },
    Rule {
        kind: "secret_assignment",
        shape: "the value given to a key that names a secret (`password`, `passwd`, `passphrase`, `secret`, `token`, `api_key`, `access_key`, `private_key`, `client_secret`, `credentials`, as the end of the key's name) in `key=value`, `key: value` and JSON forms: 6 or more characters, not only digits, not one character repeated",
        // The key, then `=` or `:` (quotes around either side), then the value.
        pattern: concat!(
            r"(?i)\b[A-Za-z0-9_.-]*?",
            secret_keys!(),
            r#"["']?\s*[:=]\s*["']?(?P<secret>[^\s"'`,;&<>\\]{6,})"#
        ),
    },
];

/// The compiled [`RULES`], once per process.
static COMPILED: LazyLock<Vec<(&'static Rule, Regex)>> = LazyLock::new(|| {
    RULES
        .iter()
        .map(|rule| {
            let regex = Regex::new(rule.pattern).expect("the rules' patterns compile");
            (rule, regex)
        })
        .collect()
});

/// A key (of a JSON object) that names a secret: its whole name ends with one.
static SECRET_KEY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(r"(?i)", secret_keys!(), r"$")).expect("the secret keys' pattern compiles")
});

/// How many secrets of each kind a pass replaced: for the usage event's `redacted`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redactions(BTreeMap<&'static str, u64>);

impl Redactions {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many of `kind` were replaced.
    pub fn count(&self, kind: &str) -> u64 {
        self.0.get(kind).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Redactions) {
        for (kind, n) in &other.0 {
            *self.0.entry(kind).or_default() += n;
        }
    }

    /// `{"aws_access_key": 1, "url_password": 2}`.
    pub fn to_json(&self) -> Value {
        Value::Object(
            (self.0.iter())
                .map(|(kind, n)| ((*kind).to_owned(), Value::from(*n)))
                .collect(),
        )
    }

    fn found(&mut self, kind: &'static str) {
        *self.0.entry(kind).or_default() += 1;
    }
}

/// The marker that replaces a secret of `kind`.
pub fn marker(kind: &str) -> String {
    format!("{MARKER_START}{kind}]")
}

/// `text` with every secret [`RULES`] recognize replaced by its kind's marker, counted
/// into `found`; borrowed when there is none.
pub fn redact<'a>(text: &'a str, found: &mut Redactions) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for (rule, regex) in COMPILED.iter() {
        if !regex.is_match(&out) {
            continue;
        }
        let replaced = regex
            .replace_all(&out, |caps: &Captures<'_>| replace(rule, caps, found))
            .into_owned();
        // A match whose value is no secret is written back as it was.
        if replaced != *out {
            out = Cow::Owned(replaced);
        }
    }
    out
}

/// The replacement of one match: the match with its secret group (or the whole of it)
/// as the marker; the match unchanged when its value is no secret ([`could_be_secret`]).
fn replace(rule: &Rule, caps: &Captures<'_>, found: &mut Redactions) -> String {
    let whole = caps.get(0).expect("a match");
    let Some(secret) = caps.name("secret").or_else(|| caps.name("curl")) else {
        found.found(rule.kind);
        return marker(rule.kind);
    };
    if !could_be_secret(secret.as_str()) {
        return whole.as_str().to_owned();
    }
    found.found(rule.kind);
    let (start, end) = (secret.start() - whole.start(), secret.end() - whole.start());
    let text = whole.as_str();
    format!("{}{}{}", &text[..start], marker(rule.kind), &text[end..])
}

/// Whether a value given to a secret's key could be one: not only digits (a count, a
/// port), not one character repeated (`********`, a mask already), not a marker.
fn could_be_secret(value: &str) -> bool {
    let mut chars = value.chars();
    let first = chars.next();
    !value.starts_with(MARKER_START)
        && !value.bytes().all(|b| b.is_ascii_digit())
        && !chars.all(|c| Some(c) == first)
}

/// `value` with every string in it redacted, and the whole string value of an object key
/// that names a secret (`{"password": "hunter2"}`) replaced, as `secret_assignment`.
pub fn redact_json(value: &Value, found: &mut Redactions) -> Value {
    match value {
        Value::String(text) => Value::String(redact(text, found).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(|v| redact_json(v, found)).collect()),
        Value::Object(fields) => {
            let mut out = Map::with_capacity(fields.len());
            for (key, v) in fields {
                let redacted = match v {
                    Value::String(text)
                        if SECRET_KEY.is_match(key)
                            && text.chars().count() >= 6
                            && could_be_secret(text) =>
                    {
                        // A provider's key under a secret's name is named by its kind.
                        let own = redact(text, found);
                        if own.starts_with(MARKER_START) && own.ends_with(']') {
                            Value::String(own.into_owned())
                        } else {
                            found.found("secret_assignment");
                            Value::String(marker("secret_assignment"))
                        }
                    }
                    v => redact_json(v, found),
                };
                out.insert(key.clone(), redacted);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// `m` as the summarizer may see it: its content and its tool calls redacted.
pub fn redact_message(m: &Message, found: &mut Redactions) -> Message {
    Message {
        content: redact(&m.content, found).into_owned(),
        tool_calls: m.tool_calls.as_ref().map(|calls| redact_json(calls, found)),
        ..m.clone()
    }
}

#[cfg(test)]
mod tests;
