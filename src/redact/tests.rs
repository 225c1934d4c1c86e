//! One test per row of the rule, the false-positive corpus, and the JSON of tool calls.

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn redacted(text: &str) -> (String, Redactions) {
    let mut found = Redactions::default();
    let out = redact(text, &mut found).into_owned();
    (out, found)
}

/// Each rule's kind, with a text holding one secret of it and the text as redacted: the
/// secret replaced, everything around it as it was.
const ROWS: &[(&str, &str, &str)] = &[
    (
        "private_key",
        "key file:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\nx9Zk2w==\n-----END RSA PRIVATE KEY-----\ndone",
        "key file:\n[REDACTED:private_key]\ndone",
    ),
    (
        "jwt",
        "cookie jwt=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U expired",
        "cookie jwt=[REDACTED:jwt] expired",
    ),
    (
        "url_password",
        "connecting to postgres://app:s3cr3t-Pa55@orders-db-1.internal:5432/orders failed",
        "connecting to postgres://app:[REDACTED:url_password]@orders-db-1.internal:5432/orders failed",
    ),
    (
        "bearer_token",
        "curl -H 'Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0' https://api.internal/v1",
        "curl -H 'Authorization: Bearer [REDACTED:bearer_token]' https://api.internal/v1",
    ),
    (
        "basic_auth",
        "GET /metrics Authorization: Basic YWRtaW46aHVudGVyMg== 401",
        "GET /metrics Authorization: Basic [REDACTED:basic_auth] 401",
    ),
    (
        "basic_auth",
        "ran curl -u admin:hunter2xyz https://grafana.internal/api",
        "ran curl -u admin:[REDACTED:basic_auth] https://grafana.internal/api",
    ),
    (
        "anthropic_key",
        "ANTHROPIC key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz012345 rejected",
        "ANTHROPIC key [REDACTED:anthropic_key] rejected",
    ),
    (
        "openai_key",
        "using sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34 for the call",
        "using [REDACTED:openai_key] for the call",
    ),
    (
        "openai_key",
        "old key sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ab still set",
        "old key [REDACTED:openai_key] still set",
    ),
    (
        "aws_access_key",
        "AccessDenied for AKIAIOSFODNN7EXAMPLE on s3://orders-backups",
        "AccessDenied for [REDACTED:aws_access_key] on s3://orders-backups",
    ),
    (
        "github_token",
        "cloning with ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8 failed",
        "cloning with [REDACTED:github_token] failed",
    ),
    (
        "gitlab_token",
        "PRIVATE-TOKEN glpat-Ab12Cd34Ef56Gh78Ij90 used",
        "PRIVATE-TOKEN [REDACTED:gitlab_token] used",
    ),
    (
        "slack_token",
        "webhook posted with xoxb-123456789012-abcdefABCDEF",
        "webhook posted with [REDACTED:slack_token]",
    ),
    (
        "stripe_key",
        "charge failed with sk_live_51HxAbCdEfGhIjKlMn key",
        "charge failed with [REDACTED:stripe_key] key",
    ),
    (
        "google_api_key",
        "maps AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q quota",
        "maps [REDACTED:google_api_key] quota",
    ),
    (
        "secret_assignment",
        "env: DB_PASSWORD=hunter2x REDIS_URL=redis://cache:6379 max_tokens=4096",
        "env: DB_PASSWORD=[REDACTED:secret_assignment] REDIS_URL=redis://cache:6379 max_tokens=4096",
    ),
    (
        "secret_assignment",
        r#"{"client_secret": "Zq8-fake-value", "retries": 3}"#,
        r#"{"client_secret": "[REDACTED:secret_assignment]", "retries": 3}"#,
    ),
    (
        "secret_assignment",
        "X-Api-Key: 7c1e4a90ffee stored in vault; aws_secret_access_key = wJalrXUtnFEMI/K7MDENG",
        "X-Api-Key: [REDACTED:secret_assignment] stored in vault; aws_secret_access_key = [REDACTED:secret_assignment]",
    ),
];

#[test]
fn every_row_of_the_rule_replaces_its_secret_and_names_its_kind() {
    for (kind, text, expected) in ROWS {
        let (out, found) = redacted(text);
        assert_eq!(out, *expected, "{kind}");
        let markers = expected.matches(MARKER_START).count() as u64;
        assert_eq!(found.total(), markers, "{kind}: {found:?}");
        assert_eq!(found.count(kind), markers, "{kind}: {found:?}");
    }
    // And every rule has its row.
    for rule in RULES {
        assert!(
            ROWS.iter().any(|(kind, _, _)| *kind == rule.kind),
            "no test for {}",
            rule.kind
        );
    }
}

/// The identifiers the fact check relies on, and text that merely mentions the words a
/// secret's key ends with: none is a secret.
const NOT_SECRETS: &[&str] = &[
    "request 0f8c2a4e-9b1d-4c3e-8f7a-6d5e4c3b2a19 took 30000 ms",
    "deployed commit 3f9c2a7b8e1d4f6a0c5b9e2d7a4f1c8b3e6d9a0f to checkout-api v5.33.0",
    "image sha256:9b2a4c6e8f0a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1e3f5a7b9c1d3e5f7a9b1c pulled",
    "req-7f3a9b2c41 and trace 4bf92f3577b34da6a3ce929d0e0e4736 failed with E-5417",
    "orders-db-replica-1.prod.internal:5432 hit max_connections=500 at 14:05:11Z",
    "HikariPool-1 - Connection is not available, request timed out after 30000ms",
    "max_tokens=4096, prompt_tokens: 8123, token_count=17, tokens_removed: 2210",
    "the token is expired; rotate the secret before 14:20 and reset the password",
    "password: ******** (hidden), token=<redacted>, api_key: \"\"",
    "auth.log: Accepted publickey for deploy from 10.0.3.17 port 52211",
    "ARN arn:aws:iam::123456789012:role/checkout-api, account 123456789012",
    "git@github.com:acme/checkout-api.git and https://github.com/acme/checkout-api/pull/4821",
    "sk-prod-eu-west-1 cluster and ASIA-PACIFIC region, AKIA prefix documented",
    "base64 of the payload: eyJhbGciOiJIUzI1NiJ9 (a header only)",
    "INC-4821, PD-88314, FRZ-0314, JIRA OPS-1234, #inc-4821",
    "secrets: 3, tokens: 12, passwords: 0",
    "basic checks passed; bearer of bad news",
];

#[test]
fn the_false_positive_corpus_passes_unchanged() {
    for text in NOT_SECRETS {
        let (out, found) = redacted(text);
        assert_eq!(out, *text);
        assert!(found.is_empty(), "{text}: {found:?}");
        assert!(matches!(
            redact(text, &mut Redactions::default()),
            Cow::Borrowed(_)
        ));
    }
}

#[test]
fn a_text_is_redacted_once_and_a_second_pass_changes_nothing() {
    let text: String = ROWS
        .iter()
        .map(|(_, text, _)| *text)
        .collect::<Vec<_>>()
        .join("\n");
    let (once, found) = redacted(&text);
    let markers: usize = ROWS
        .iter()
        .map(|(_, _, e)| e.matches(MARKER_START).count())
        .sum();
    assert_eq!(found.total(), markers as u64);
    let (twice, again) = redacted(&once);
    assert_eq!(twice, once);
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn a_providers_key_under_a_secrets_name_is_named_by_its_own_kind() {
    let (out, found) = redacted("GITHUB_TOKEN=ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8");
    assert_eq!(out, "GITHUB_TOKEN=[REDACTED:github_token]");
    assert_eq!(found.to_json(), json!({"github_token": 1}));
}

#[test]
fn tool_calls_are_redacted_in_their_arguments_whatever_their_shape() {
    let mut found = Redactions::default();
    let calls = json!([
        {"id": "c1", "name": "db_query",
         "arguments": {"dsn": "postgres://app:pw-123456@db:5432/x", "password": "hunter2x",
                       "limit": 10, "token": "123456", "tags": ["AKIAIOSFODNN7EXAMPLE"]}},
        {"id": "c2", "name": "http_get",
         "arguments": "{\"url\": \"https://api/v1\", \"api_key\": \"k-9f8e7d6c\"}"},
    ]);
    let out = redact_json(&calls, &mut found);
    assert_eq!(
        out,
        json!([
            {"id": "c1", "name": "db_query",
             "arguments": {"dsn": "postgres://app:[REDACTED:url_password]@db:5432/x",
                           "password": "[REDACTED:secret_assignment]",
                           "limit": 10, "token": "123456",
                           "tags": ["[REDACTED:aws_access_key]"]}},
            {"id": "c2", "name": "http_get",
             "arguments": "{\"url\": \"https://api/v1\", \"api_key\": \"[REDACTED:secret_assignment]\"}"},
        ])
    );
    assert_eq!(
        found.to_json(),
        json!({"aws_access_key": 1, "secret_assignment": 2, "url_password": 1})
    );
}

#[test]
fn a_message_keeps_everything_but_its_secrets() {
    let m = Message {
        seq: 7,
        role: crate::message::Role::Tool,
        content: "login as admin with password=hunter2x".to_owned(),
        tool_calls: None,
        tool_call_id: Some("c1".to_owned()),
        is_summary: false,
        chars: 37,
        pinned: true,
    };
    let mut found = Redactions::default();
    let out = redact_message(&m, &mut found);
    assert_eq!(
        out.content,
        "login as admin with password=[REDACTED:secret_assignment]"
    );
    assert_eq!(
        (out.seq, out.chars, out.pinned, out.tool_call_id),
        (7, 37, true, Some("c1".to_owned()))
    );
}

proptest! {
    /// Whatever the text: no panic, nothing but secrets changed (what is left outside
    /// the markers is what was there), and a second pass finds nothing.
    #[test]
    fn any_text_is_redacted_idempotently(
        text in r"[ -~\n]{0,200}",
        secret in prop::sample::select(ROWS.iter().map(|(_, t, _)| *t).collect::<Vec<_>>()),
    ) {
        let text = format!("{text} {secret} {text}");
        let (once, _) = redacted(&text);
        let (twice, again) = redacted(&once);
        prop_assert_eq!(&twice, &once);
        prop_assert!(again.is_empty());
    }
}

/// docs/protocol.md's table ("Secrets") names every rule, in the order they apply.
#[test]
fn the_documented_table_is_the_rule() {
    let doc = include_str!("../../docs/protocol.md");
    let section = doc
        .split("\n## Secrets\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/protocol.md has a \"## Secrets\" section");
    let documented: Vec<&str> = (section.lines())
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(kind, _)| kind))
        .collect();
    let kinds: Vec<&str> = RULES.iter().map(|rule| rule.kind).collect();
    assert_eq!(documented, kinds);
}
