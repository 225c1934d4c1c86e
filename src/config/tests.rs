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
        (&[("LLM_PROVIDER", "anthropic")], "LLM_API_KEY"),
        (&[("LLM_FALLBACK", "retry")], "LLM_FALLBACK"),
        (
            &[("SUMMARY_PROMPT_FILE", "/nonexistent/prompt.md")],
            "SUMMARY_PROMPT_FILE",
        ),
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
fn precompute_ttl_is_still_read_under_its_old_name_with_a_warning() {
    let s = load(&[("PRECOMPUTE_TTL", "5000")]).unwrap();
    assert_eq!(s.precompute.ttl, Duration::from_millis(5000));
    assert_eq!(s.deprecated.len(), 1, "{:?}", s.deprecated);
    assert!(
        s.deprecated[0].contains("rename it PRECOMPUTE_TTL_MS"),
        "{:?}",
        s.deprecated
    );

    // The new name beside it wins, and the old one is said to be ignored.
    let s = load(&[("PRECOMPUTE_TTL", "5000"), ("PRECOMPUTE_TTL_MS", "7000")]).unwrap();
    assert_eq!(s.precompute.ttl, Duration::from_millis(7000));
    assert!(s.deprecated[0].contains("ignored"), "{:?}", s.deprecated);

    // Unset, nothing to warn about; a bad value under the old name is refused.
    assert!(load(&[]).unwrap().deprecated.is_empty());
    assert_eq!(
        setting_of(load(&[("PRECOMPUTE_TTL", "soon")]).unwrap_err()),
        "PRECOMPUTE_TTL_MS"
    );

    // In a file too, under the environment's new name.
    let dir = std::env::temp_dir().join(format!("summarizer-config-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("summarizer.toml");
    std::fs::write(&path, "precompute_ttl = 4000\n").unwrap();
    let file_only = Settings::from_sources(Some(&path), Some(HashMap::new())).unwrap();
    let env = HashMap::from([("PRECOMPUTE_TTL_MS".to_owned(), "6000".to_owned())]);
    let both = Settings::from_sources(Some(&path), Some(env)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(file_only.precompute.ttl, Duration::from_millis(4000));
    assert!(file_only.deprecated[0].contains("summarizer.toml"));
    assert_eq!(both.precompute.ttl, Duration::from_millis(6000));
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

/// The settings reference's table (`docs/settings.md`, "## Settings"): each row's
/// setting names, and their defaults in the same order. A row may name several settings
/// (`` `A` / `B` ``) with one default for all or one each; `(none)` and
/// `(the provider's)` stand for an empty default.
fn settings_reference() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md");
    let text = std::fs::read_to_string(path).unwrap();
    let table = text
        .split("\n## Settings\n")
        .nth(1)
        .expect("docs/settings.md has a \"## Settings\" section");
    // Names and defaults are separated by " / " or ", " (a URL's slashes are not).
    let cells = |cell: &str| -> Vec<String> {
        cell.split(" / ")
            .flat_map(|part| part.split(", "))
            .map(str::trim)
            .map(|part| match part {
                "(none)" | "(the provider's)" => String::new(),
                quoted => quoted
                    .strip_prefix('`')
                    .and_then(|q| q.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("{quoted:?} is not in backticks"))
                    .to_owned(),
            })
            .collect()
    };
    let mut rows = Vec::new();
    for line in table.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let columns: Vec<&str> = line.split('|').map(str::trim).collect();
        if matches!(columns[1], "setting" | "---") {
            continue;
        }
        let names = cells(columns[1]);
        let defaults = cells(columns[2]);
        let defaults = match defaults.len() {
            1 => vec![defaults[0].clone(); names.len()],
            n if n == names.len() => defaults,
            _ => panic!("{line}: give one default, or one per setting"),
        };
        rows.extend(names.into_iter().zip(defaults));
    }
    rows
}

#[test]
fn the_settings_reference_lists_every_setting_with_its_default() {
    let rows = settings_reference();
    let documented: HashMap<&str, &str> =
        rows.iter().map(|(n, d)| (n.as_str(), d.as_str())).collect();
    assert_eq!(documented.len(), rows.len(), "a setting has two rows");
    for setting in SETTINGS {
        assert_eq!(
            documented.get(setting.name).copied(),
            Some(setting.default),
            "{}: its row in docs/settings.md, with its default",
            setting.name
        );
    }
    for (name, _) in &rows {
        assert!(
            SETTINGS.iter().any(|s| s.name == name),
            "docs/settings.md documents {name}, which is no setting"
        );
    }
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

#[test]
fn the_base_url_and_model_default_to_the_providers() {
    let openai = load(&[("LLM_PROVIDER", "openai"), ("LLM_API_KEY", "k")]).unwrap();
    assert_eq!(
        (openai.llm.base_url.as_str(), openai.llm.model.as_str()),
        ("https://api.openai.com/v1", "gpt-4o-mini")
    );
    let anthropic = load(&[("LLM_PROVIDER", "anthropic"), ("LLM_API_KEY", "k")]).unwrap();
    assert_eq!(anthropic.llm.provider, Provider::Anthropic);
    assert_eq!(
        (
            anthropic.llm.base_url.as_str(),
            anthropic.llm.model.as_str()
        ),
        ("https://api.anthropic.com/v1", "claude-haiku-4-5")
    );
    let chosen = load(&[
        ("LLM_PROVIDER", "anthropic"),
        ("LLM_API_KEY", "k"),
        ("LLM_BASE_URL", "http://proxy:8080/v1/"),
        ("LLM_MODEL", "claude-sonnet-4-5"),
    ])
    .unwrap();
    assert_eq!(
        (chosen.llm.base_url.as_str(), chosen.llm.model.as_str()),
        ("http://proxy:8080/v1", "claude-sonnet-4-5")
    );
    assert_eq!(load(&[]).unwrap().llm.fallback, FallbackMode::None);
}

#[test]
fn a_prompt_file_replaces_the_prompt_only_when_it_asks_for_the_headings() {
    let dir = std::env::temp_dir().join(format!("summarizer-prompt-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.md");
    let text = format!("Summarize the incident.\n{}\n", crate::summary::TEMPLATE);
    std::fs::write(&good, &text).unwrap();
    let bad = dir.join("bad.md");
    std::fs::write(&bad, "Summarize the conversation in three sentences.").unwrap();

    let good_path = good.display().to_string();
    let s = load(&[("SUMMARY_PROMPT_FILE", good_path.as_str())]).unwrap();
    let bad_path = bad.display().to_string();
    let err = load(&[("SUMMARY_PROMPT_FILE", bad_path.as_str())]).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(s.llm.prompt.system(), text);
    assert!(
        s.llm.prompt.version().starts_with("file:"),
        "{:?}",
        s.llm.prompt
    );
    assert!(
        s.redacted()
            .contains(&format!("summary_prompt_file={good_path}"))
    );
    let message = err.to_string();
    assert!(message.starts_with("SUMMARY_PROMPT_FILE: "), "{message}");
    assert!(message.contains("**Investigating:**"), "{message}");
    assert_eq!(
        load(&[]).unwrap().llm.prompt,
        crate::prompt::Prompt::default()
    );
}

#[test]
fn token_budgets_default_to_the_default_models_context_and_must_leave_room() {
    let s = load(&[]).unwrap();
    assert_eq!(s.llm.max_input_tokens, 100_000);
    assert_eq!(s.llm.summary_max_chars, 6_000);
    assert_eq!(s.llm.summary_max_tokens(), 2_000);
    let err = load(&[("LLM_MAX_INPUT_TOKENS", "4000")])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("LLM_MAX_INPUT_TOKENS: must be at least 5024"),
        "{err}"
    );
    let s = load(&[
        ("LLM_MAX_INPUT_TOKENS", "4000"),
        ("SUMMARY_MAX_CHARS", "1000"),
    ])
    .unwrap();
    assert_eq!(s.llm.summary_max_tokens(), 334);
    assert!(load(&[("SUMMARY_MAX_CHARS", "0")]).is_err());
}

#[test]
fn the_fact_check_defaults_to_retry_below_eighty_percent() {
    let s = load(&[]).unwrap();
    assert_eq!(s.fact_check, FactCheck::default());
    assert_eq!(
        (s.fact_check.mode, s.fact_check.min_recall),
        (FactCheckMode::Retry, 0.8)
    );
    let line = s.redacted();
    assert!(line.contains("summary_fact_check=retry"), "{line}");
    assert!(line.contains("summary_min_fact_recall=0.8"), "{line}");
    let s = load(&[
        ("SUMMARY_FACT_CHECK", " Record "),
        ("SUMMARY_MIN_FACT_RECALL", "1"),
    ])
    .unwrap();
    assert_eq!(
        (s.fact_check.mode, s.fact_check.min_recall),
        (FactCheckMode::Record, 1.0)
    );
    let s = load(&[
        ("SUMMARY_FACT_CHECK", "off"),
        ("SUMMARY_MIN_FACT_RECALL", "0"),
    ])
    .unwrap();
    assert_eq!(
        (s.fact_check.mode, s.fact_check.min_recall),
        (FactCheckMode::Off, 0.0)
    );
}

#[test]
fn a_fact_check_mode_or_minimum_recall_out_of_range_is_refused_naming_its_setting() {
    for mode in ["", "on", "true", "retry twice"] {
        let err = load(&[("SUMMARY_FACT_CHECK", mode)]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("expected \"off\", \"record\" or \"retry\""),
            "{mode:?}: {message}"
        );
        assert_eq!(setting_of(err), "SUMMARY_FACT_CHECK", "{mode:?}");
    }
    for recall in ["1.5", "-0.1", "80", "NaN", "inf", "80%", "", "most"] {
        let err = load(&[("SUMMARY_MIN_FACT_RECALL", recall)]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("SUMMARY_MIN_FACT_RECALL: "),
            "{recall:?}: {message}"
        );
        assert_eq!(setting_of(err), "SUMMARY_MIN_FACT_RECALL", "{recall:?}");
    }
    let message = load(&[("SUMMARY_MIN_FACT_RECALL", "80")])
        .unwrap_err()
        .to_string();
    assert!(message.contains("a fraction from 0 to 1"), "{message}");
}

#[test]
fn a_duration_past_a_year_is_refused_at_start_naming_the_setting() {
    // A lease of 2^63 ms made every compaction's SQL fail ("interval out of range"); a
    // deadline of 2^64 - 1 would overflow the clock.
    for name in [
        "LEASE_DURATION_MS",
        "PRECOMPUTE_TTL_MS",
        "FAILURE_BACKOFF_MAX_MS",
        "LLM_DEADLINE_MS",
        "LLM_TIMEOUT_MS",
    ] {
        for huge in ["9223372036854775807", "18446744073709551615", "31536000001"] {
            let err = load(&[(name, huge)]).unwrap_err();
            assert!(err.to_string().contains("at most 31536000000 ms"), "{err}");
            assert_eq!(setting_of(err), name);
        }
    }
}

#[test]
fn precompute_at_is_off_by_default_and_a_fraction_below_one() {
    let settings = load(&[]).unwrap();
    assert!(!settings.precompute.enabled());
    assert_eq!(settings.precompute.concurrency, 4);
    assert_eq!(
        settings.precompute.ttl,
        std::time::Duration::from_secs(3600)
    );
    let on = load(&[("SUMMARIZATION_PRECOMPUTE_AT", "0.8")]).unwrap();
    assert!(on.precompute.wanted(48_001, 60_000));
    assert!(!on.precompute.wanted(48_000, 60_000), "strictly above");
    for bad in ["1", "1.5", "-0.1", "NaN", "inf", "80%"] {
        let err = load(&[("SUMMARIZATION_PRECOMPUTE_AT", bad)]).unwrap_err();
        assert_eq!(setting_of(err), "SUMMARIZATION_PRECOMPUTE_AT", "{bad}");
    }
    let err = load(&[("PRECOMPUTE_CONCURRENCY", "0")]).unwrap_err();
    assert_eq!(setting_of(err), "PRECOMPUTE_CONCURRENCY");
}

#[test]
fn tool_output_clearing_is_off_by_default_and_its_settings_are_checked() {
    let s = load(&[]).unwrap();
    assert_eq!(s.tool_outputs, crate::config::ToolOutputs::default());
    assert!(!s.tool_outputs.clearing);

    let s = load(&[
        ("TOOL_OUTPUT_CLEARING", "ON"),
        ("TOOL_OUTPUT_KEEP", "0"),
        ("TOOL_OUTPUT_MIN_CHARS", "0"),
        (
            "TOOL_OUTPUT_EXCLUDE",
            " read_runbook ,, get_logs ,no_such_tool",
        ),
    ])
    .unwrap();
    assert!(s.tool_outputs.clearing);
    assert_eq!((s.tool_outputs.keep, s.tool_outputs.min_chars), (0, 0));
    // Spaces around names go; an empty name is no name; an unknown one excludes nothing.
    assert_eq!(
        s.tool_outputs.exclude,
        ["read_runbook", "get_logs", "no_such_tool"]
    );
    assert!(
        s.redacted()
            .contains("tool_output_exclude=read_runbook,get_logs,no_such_tool")
    );

    for (setting, value) in [
        ("TOOL_OUTPUT_CLEARING", "yes"),
        ("TOOL_OUTPUT_CLEARING", "true"),
        ("TOOL_OUTPUT_KEEP", "-1"),
        ("TOOL_OUTPUT_KEEP", "three"),
        ("TOOL_OUTPUT_MIN_CHARS", "-5"),
    ] {
        let err = load(&[(setting, value)]).expect_err(value);
        assert_eq!(setting_of(err), setting, "{setting}={value}");
    }
}

#[test]
fn a_recall_subject_that_a_turn_could_match_is_refused() {
    for (recall, turns) in [
        ("summarizer.turn", "summarizer.turn"),
        ("summarizer.*", "summarizer.turn"),
        ("summarizer.recall", "summarizer.>"),
        ("summarizer.>", "summarizer.turn.x"),
    ] {
        let err =
            load(&[("NATS_RECALL_SUBJECT", recall), ("NATS_SUBJECT", turns)]).expect_err(recall);
        assert_eq!(setting_of(err), "NATS_RECALL_SUBJECT", "{recall} / {turns}");
    }
    let s = load(&[
        ("NATS_RECALL_SUBJECT", "agents.recall"),
        ("NATS_SUBJECT", "agents.turn.*"),
    ])
    .unwrap();
    assert_eq!(s.recall_subject, "agents.recall");
}

#[test]
fn idle_compaction_is_off_by_default_and_its_threshold_is_checked() {
    let s = load(&[]).unwrap();
    assert!(!s.idle.enabled());
    let s = load(&[
        ("SUMMARIZATION_IDLE_AFTER_MS", "300000"),
        ("SUMMARIZATION_IDLE_THRESHOLD_CHARS", "40000"),
    ])
    .unwrap();
    assert_eq!(s.idle.after, Duration::from_secs(300));
    assert_eq!(s.idle.threshold(60_000, 20_000), 40_000);
    assert_eq!(
        s.idle.threshold(60_000, 50_000),
        50_000,
        "never below the keep"
    );
    assert_eq!(load(&[]).unwrap().idle.threshold(60_000, 20_000), 30_000);
    assert_eq!(
        setting_of(load(&[("SUMMARIZATION_IDLE_THRESHOLD_CHARS", "-1")]).unwrap_err()),
        "SUMMARIZATION_IDLE_THRESHOLD_CHARS"
    );
    assert_eq!(
        setting_of(load(&[("SUMMARIZATION_IDLE_AFTER_MS", "soon")]).unwrap_err()),
        "SUMMARIZATION_IDLE_AFTER_MS"
    );
}
