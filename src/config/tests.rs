//! Reading, checking and showing the settings.

use super::*;

fn load(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let env = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_sources(None, Some(env))
}

fn setting_of(err: ConfigError) -> &'static str {
    match err {
        ConfigError::Invalid { setting, .. } => setting,
        ConfigError::File(e) => panic!("expected an invalid setting, got {e}"),
    }
}

#[test]
fn defaults_are_the_seeds() {
    let s = load(&[]).unwrap();
    assert!(s.enabled);
    assert_eq!(s.limits.threshold_chars, 60_000);
    assert_eq!(s.limits.keep_chars, 20_000);
    assert_eq!(s.llm.provider, Provider::Extractive);
    assert_eq!(s.subject, "summarizer.turn.starting");
    assert_eq!(s.queue_group, "summarizer-workers");
    assert_eq!(
        s.database_url.expose(),
        "postgres://postgres@127.0.0.1:5432/summarizer"
    );
}

#[test]
fn the_override_bounds_default_to_the_documented_ones() {
    let s = load(&[]).unwrap();
    assert_eq!(s.bounds, Bounds::default());
    assert_eq!(
        (s.bounds.min_threshold_chars, s.bounds.max_threshold_chars),
        (1_000, 10_000_000)
    );
    assert_eq!(
        (s.bounds.min_keep_chars, s.bounds.max_keep_chars),
        (500, 5_000_000)
    );
}

#[test]
fn environment_overrides_defaults() {
    let s = load(&[
        ("SUMMARIZATION_ENABLED", "false"),
        ("SUMMARIZATION_THRESHOLD_CHARS", "5000"),
        ("SUMMARIZATION_KEEP_CHARS", "1000"),
        ("WORKER_CONCURRENCY", "7"),
        ("HTTP_ADDR", ""),
    ])
    .unwrap();
    assert!(!s.enabled);
    assert_eq!(
        s.limits,
        Limits {
            threshold_chars: 5000,
            keep_chars: 1000
        }
    );
    assert_eq!(s.concurrency, 7);
    assert_eq!(s.http_addr, None);
}

#[test]
fn invalid_values_name_their_setting() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("SUMMARIZATION_KEEP_CHARS", "60000")],
            "SUMMARIZATION_KEEP_CHARS",
        ),
        (&[("WORKER_CONCURRENCY", "0")], "WORKER_CONCURRENCY"),
        (
            &[("SUMMARIZATION_THRESHOLD_CHARS", "lots")],
            "SUMMARIZATION_THRESHOLD_CHARS",
        ),
        (&[("LLM_PROVIDER", "magic")], "LLM_PROVIDER"),
        (&[("LLM_PROVIDER", "openai")], "LLM_API_KEY"),
        (
            &[("SUMMARIZATION_ENABLED", "maybe")],
            "SUMMARIZATION_ENABLED",
        ),
        (&[("HTTP_ADDR", "nowhere")], "HTTP_ADDR"),
        (&[("NATS_USER", "bot")], "NATS_PASSWORD"),
        (
            &[("NATS_CREDS_FILE", "/nonexistent.creds")],
            "NATS_CREDS_FILE",
        ),
        (&[("FAILURE_BACKOFF_MS", "-1")], "FAILURE_BACKOFF_MS"),
        (
            &[("SUMMARIZATION_MAX_THRESHOLD_CHARS", "999")],
            "SUMMARIZATION_MAX_THRESHOLD_CHARS",
        ),
        (
            &[("SUMMARIZATION_MAX_KEEP_CHARS", "499")],
            "SUMMARIZATION_MAX_KEEP_CHARS",
        ),
        (
            &[("SUMMARIZATION_MIN_KEEP_CHARS", "1000")],
            "SUMMARIZATION_MIN_KEEP_CHARS",
        ),
        (
            &[("SUMMARIZATION_MIN_THRESHOLD_CHARS", "0")],
            "SUMMARIZATION_MIN_THRESHOLD_CHARS",
        ),
    ];
    for (env, setting) in cases {
        let err = load(env).expect_err(setting);
        assert_eq!(setting_of(err), *setting, "for {env:?}");
    }
}

#[test]
fn config_file_is_read_under_the_environment() {
    let dir = std::env::temp_dir().join(format!("summarizer-config-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("summarizer.toml");
    std::fs::write(
        &path,
        "SUMMARIZATION_THRESHOLD_CHARS = 9000\nsummarization_keep_chars = 3000\nWORKER_CONCURRENCY = 4\n",
    )
    .unwrap();
    let env = HashMap::from([("WORKER_CONCURRENCY".to_owned(), "5".to_owned())]);
    let s = Settings::from_sources(Some(&path), Some(env)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        s.limits,
        Limits {
            threshold_chars: 9000,
            keep_chars: 3000
        }
    );
    assert_eq!(s.concurrency, 5);
}

#[test]
fn env_example_lists_every_setting_with_its_default_and_description() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.env.example");
    let listed: HashMap<String, String> = dotenvy::from_path_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    for setting in SETTINGS {
        assert_eq!(
            listed.get(setting.name).map(String::as_str),
            Some(setting.default),
            "{setting:?}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{}=", setting.name)))
            .unwrap();
        let doc = line.split_once(" # ").map(|(_, doc)| doc.trim());
        assert_eq!(doc, Some(setting.doc), "{setting:?}");
    }
    assert_eq!(
        listed.len(),
        SETTINGS.len(),
        "no setting listed that does not exist"
    );
}

#[test]
fn every_setting_is_read_and_shown_under_its_own_name() {
    let names: std::collections::HashSet<_> = SETTINGS.iter().map(|s| s.name).collect();
    assert_eq!(names.len(), SETTINGS.len(), "a name is listed twice");
    let line = load(&[]).unwrap().redacted();
    for setting in SETTINGS {
        let shown = format!("{}=", setting.name.to_ascii_lowercase());
        assert!(line.contains(&shown), "{setting:?} missing from {line}");
    }
}

#[test]
fn secrets_do_not_reach_debug_or_the_config_log_line() {
    let s = load(&[
        ("LLM_PROVIDER", "openai"),
        ("LLM_API_KEY", "sk-very-secret"),
        (
            "LLM_BASE_URL",
            "https://proxy:llm-pass@llm.internal/v1?api_key=llm-query-key",
        ),
        (
            "DATABASE_URL",
            "postgres://app:hunter2@db:5432/summarizer?sslpassword=ssl-pass&sslmode=require",
        ),
        ("NATS_URL", "nats://bot:natspass@[::1]:4222"),
        ("NATS_USER", "bot"),
        ("NATS_PASSWORD", "other-nats-pass"),
        ("NATS_TOKEN", "nats-token-value"),
    ])
    .unwrap();
    let secrets = [
        "sk-very-secret",
        "llm-pass",
        "llm-query-key",
        "hunter2",
        "ssl-pass",
        "natspass",
        "other-nats-pass",
        "nats-token-value",
    ];
    for text in [format!("{s:?}"), s.redacted()] {
        for secret in secrets {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
    let line = s.redacted();
    assert!(
        line.contains(
            "database_url=postgres://[redacted]@db:5432/summarizer?sslpassword=[redacted]&sslmode=require"
        ),
        "{line}"
    );
    assert!(
        line.contains("nats_url=nats://[redacted]@[::1]:4222"),
        "{line}"
    );
    assert!(line.contains("llm_base_url=https://[redacted]@llm.internal/v1?api_key=[redacted]"));
    assert!(line.contains("llm_api_key=[redacted] "), "{line}");
    let mut values = s.secret_values();
    values.sort();
    for secret in secrets {
        assert!(values.iter().any(|v| v == secret), "{secret} not scrubbed");
    }
    assert!(
        !values.iter().any(|v| v == "app" || v == "bot"),
        "{values:?}"
    );
}

#[test]
fn a_bad_llm_url_is_named_without_its_credentials() {
    let err = load(&[
        ("LLM_PROVIDER", "openai"),
        ("LLM_API_KEY", "k"),
        ("LLM_BASE_URL", "ftp://u:llm-pass@host/v1"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("LLM_BASE_URL"), "{err}");
    assert!(!err.contains("llm-pass"), "{err}");
}
