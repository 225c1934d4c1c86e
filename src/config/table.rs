//! The one table of settings: each setting's name, default, one-line description and
//! whether its value is a secret. The defaults fed to the config builder, the names the
//! sections read, the effective-configuration log line and the `.env.example` check all
//! come from here, so a setting is added in one place.
//!
//! Names and defaults are public contract (the seed's names; operators' files): never
//! change one.

use super::{LogFormat, Settings};

/// How a setting's value may be shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Shown as it is.
    Plain,
    /// Never shown: `[redacted]` (or empty when unset).
    Secret,
    /// A URL that may carry credentials: shown through [`super::redact_url`].
    Url,
}

/// One setting.
#[derive(Clone, Copy)]
pub struct Setting {
    /// The environment variable (and config file key, in any case).
    pub name: &'static str,
    pub default: &'static str,
    /// What `.env.example` says about it.
    pub doc: &'static str,
    pub kind: Kind,
    /// The value in effect, before redaction, for the effective-configuration line.
    pub show: fn(&Settings) -> String,
}

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

const fn setting(
    name: &'static str,
    default: &'static str,
    doc: &'static str,
    kind: Kind,
    show: fn(&Settings) -> String,
) -> Setting {
    Setting {
        name,
        default,
        doc,
        kind,
        show,
    }
}

fn ms(duration: std::time::Duration) -> String {
    duration.as_millis().to_string()
}

fn path(path: Option<&std::path::PathBuf>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

use Kind::{Plain, Secret, Url};

pub const SUMMARIZATION_ENABLED: Setting = setting(
    "SUMMARIZATION_ENABLED",
    "true",
    "false: reply skipped/disabled at once, no DB or LLM call",
    Plain,
    |s| s.enabled.to_string(),
);
pub const SUMMARIZATION_THRESHOLD_CHARS: Setting = setting(
    "SUMMARIZATION_THRESHOLD_CHARS",
    "60000",
    "compact a session larger than this many chars",
    Plain,
    |s| s.limits.threshold_chars.to_string(),
);
pub const SUMMARIZATION_THRESHOLD_TOKENS: Setting = setting(
    "SUMMARIZATION_THRESHOLD_TOKENS",
    "0",
    "also compact a session over this many tokens (reported or estimated); 0: off",
    Plain,
    |s| s.threshold_tokens.to_string(),
);
pub const SUMMARIZATION_KEEP_CHARS: Setting = setting(
    "SUMMARIZATION_KEEP_CHARS",
    "20000",
    "keep at least this many recent chars; must be < threshold",
    Plain,
    |s| s.limits.keep_chars.to_string(),
);
pub const SUMMARIZATION_MIN_THRESHOLD_CHARS: Setting = setting(
    "SUMMARIZATION_MIN_THRESHOLD_CHARS",
    "1000",
    "a request's or session's threshold_chars is raised to at least this ...",
    Plain,
    |s| s.bounds.min_threshold_chars.to_string(),
);
pub const SUMMARIZATION_MAX_THRESHOLD_CHARS: Setting = setting(
    "SUMMARIZATION_MAX_THRESHOLD_CHARS",
    "10000000",
    "... and lowered to at most this",
    Plain,
    |s| s.bounds.max_threshold_chars.to_string(),
);
pub const SUMMARIZATION_MIN_KEEP_CHARS: Setting = setting(
    "SUMMARIZATION_MIN_KEEP_CHARS",
    "500",
    "a request's or session's keep_chars is raised to at least this ...",
    Plain,
    |s| s.bounds.min_keep_chars.to_string(),
);
pub const SUMMARIZATION_MAX_KEEP_CHARS: Setting = setting(
    "SUMMARIZATION_MAX_KEEP_CHARS",
    "5000000",
    "... and lowered to at most this",
    Plain,
    |s| s.bounds.max_keep_chars.to_string(),
);
pub const DATABASE_URL: Setting = setting(
    "DATABASE_URL",
    "postgres://postgres@127.0.0.1:5432/summarizer",
    "credentials here (user:password@, ?password=) are redacted in all output",
    Url,
    |s| s.database_url.expose().to_owned(),
);
pub const DATABASE_MAX_CONNECTIONS: Setting = setting(
    "DATABASE_MAX_CONNECTIONS",
    "10",
    "pool size per worker; no connection is held during LLM calls",
    Plain,
    |s| s.database_max_connections.to_string(),
);
pub const DATABASE_ACQUIRE_TIMEOUT_MS: Setting = setting(
    "DATABASE_ACQUIRE_TIMEOUT_MS",
    "5000",
    "a query waiting longer for a connection fails with store_error",
    Plain,
    |s| ms(s.database_acquire_timeout),
);
pub const NATS_URL: Setting = setting(
    "NATS_URL",
    "nats://127.0.0.1:4222",
    "nats://user:password@host:4222 works; credentials are redacted in all output",
    Url,
    |s| s.nats_url.expose().to_owned(),
);
pub const NATS_USER: Setting = setting(
    "NATS_USER",
    "",
    "user/password authentication (both or neither)",
    Plain,
    |s| s.nats_auth.user.clone().unwrap_or_default(),
);
pub const NATS_PASSWORD: Setting = setting("NATS_PASSWORD", "", "never logged", Secret, |s| {
    s.nats_auth.password.expose().to_owned()
});
pub const NATS_TOKEN: Setting = setting(
    "NATS_TOKEN",
    "",
    "token authentication; never logged",
    Secret,
    |s| s.nats_auth.token.expose().to_owned(),
);
pub const NATS_CREDS_FILE: Setting = setting(
    "NATS_CREDS_FILE",
    "",
    "a .creds file (JWT + nkey seed)",
    Plain,
    |s| path(s.nats_auth.creds_file.as_ref()),
);
pub const NATS_TLS_CA_FILE: Setting = setting(
    "NATS_TLS_CA_FILE",
    "",
    "extra root CA (PEM) to trust for the server",
    Plain,
    |s| path(s.nats_auth.tls_ca_file.as_ref()),
);
pub const NATS_TLS_CERT_FILE: Setting = setting(
    "NATS_TLS_CERT_FILE",
    "",
    "client certificate (PEM), with NATS_TLS_KEY_FILE",
    Plain,
    |s| path(s.nats_auth.tls_cert_file.as_ref()),
);
pub const NATS_TLS_KEY_FILE: Setting =
    setting("NATS_TLS_KEY_FILE", "", "client key (PEM)", Plain, |s| {
        path(s.nats_auth.tls_key_file.as_ref())
    });
pub const NATS_TLS_REQUIRED: Setting = setting(
    "NATS_TLS_REQUIRED",
    "false",
    "true: refuse a connection without TLS",
    Plain,
    |s| s.nats_auth.tls_required.to_string(),
);
pub const NATS_SUBJECT: Setting = setting(
    "NATS_SUBJECT",
    "summarizer.turn.starting",
    "the subject agents send turn-starting requests to",
    Plain,
    |s| s.subject.clone(),
);
pub const NATS_RECALL_SUBJECT: Setting = setting(
    "NATS_RECALL_SUBJECT",
    "summarizer.recall",
    "the subject agents send recall requests to (search and fetch what compaction archived)",
    Plain,
    |s| s.recall_subject.clone(),
);
pub const NATS_QUEUE_GROUP: Setting = setting(
    "NATS_QUEUE_GROUP",
    "summarizer-workers",
    "every event goes to one worker of this group",
    Plain,
    |s| s.queue_group.clone(),
);
pub const TRANSPORT: Setting = setting(
    "TRANSPORT",
    "core",
    "core (request/reply on NATS_SUBJECT), jetstream (durable jobs from a work-queue stream) or both",
    Plain,
    |s| s.jobs.transport.as_str().to_owned(),
);
pub const JETSTREAM_STREAM: Setting = setting(
    "JETSTREAM_STREAM",
    "SUMMARIZER_JOBS",
    "jetstream, both: the WorkQueue stream created or bound on <prefix>.>",
    Plain,
    |s| s.jobs.stream.clone(),
);
pub const JETSTREAM_CONSUMER: Setting = setting(
    "JETSTREAM_CONSUMER",
    "summarizer-workers",
    "the durable pull consumer the fleet shares",
    Plain,
    |s| s.jobs.consumer.clone(),
);
pub const JETSTREAM_SUBJECT_PREFIX: Setting = setting(
    "JETSTREAM_SUBJECT_PREFIX",
    "summarizer.jobs",
    "jobs go to <prefix>.<hex sha256 of the session id>; must not overlap NATS_SUBJECT",
    Plain,
    |s| s.jobs.subject_prefix.clone(),
);
pub const JETSTREAM_MAX_DELIVER: Setting = setting(
    "JETSTREAM_MAX_DELIVER",
    "5",
    "deliveries of a failing job before it is dead-lettered (table dead_letters)",
    Plain,
    |s| s.jobs.max_deliver.to_string(),
);
pub const JETSTREAM_ACK_WAIT_MS: Setting = setting(
    "JETSTREAM_ACK_WAIT_MS",
    "30000",
    "a job not acked within this is redelivered; progress is sent every half of it while one runs",
    Plain,
    |s| ms(s.jobs.ack_wait),
);
pub const WORKER_CONCURRENCY: Setting = setting(
    "WORKER_CONCURRENCY",
    "32",
    "events in flight per worker (LLM calls included)",
    Plain,
    |s| s.concurrency.to_string(),
);
pub const HTTP_ADDR: Setting = setting(
    "HTTP_ADDR",
    "127.0.0.1:8080",
    "empty: no HTTP; 127.0.0.1:0: any free port (logged)",
    Plain,
    |s| s.http_addr.map(|a| a.to_string()).unwrap_or_default(),
);
pub const LLM_PROVIDER: Setting = setting(
    "LLM_PROVIDER",
    "extractive",
    "extractive (offline, no key), openai (any OpenAI-compatible API) or anthropic",
    Plain,
    |s| s.llm.provider.as_str().to_owned(),
);
pub const LLM_BASE_URL: Setting = setting(
    "LLM_BASE_URL",
    "",
    "empty: per provider (https://api.openai.com/v1, https://api.anthropic.com/v1); /chat/completions or /messages is appended; credentials are redacted",
    Url,
    |s| s.llm.base_url.clone(),
);
pub const LLM_MODEL: Setting = setting(
    "LLM_MODEL",
    "",
    "empty: per provider (openai: gpt-4o-mini, anthropic: claude-haiku-4-5)",
    Plain,
    |s| s.llm.model.clone(),
);
pub const LLM_API_KEY: Setting = setting(
    "LLM_API_KEY",
    "",
    "openai, anthropic: required; never logged",
    Secret,
    |s| s.llm.api_key.expose().to_owned(),
);
pub const LLM_TIMEOUT_MS: Setting = setting(
    "LLM_TIMEOUT_MS",
    "30000",
    "one HTTP attempt, headers and body",
    Plain,
    |s| ms(s.llm.timeout),
);
pub const LLM_MAX_RETRIES: Setting = setting(
    "LLM_MAX_RETRIES",
    "4",
    "retries after the first attempt (connect errors, timeouts, 408, 429, 5xx)",
    Plain,
    |s| s.llm.max_retries.to_string(),
);
pub const LLM_RETRY_MIN_DELAY_MS: Setting = setting(
    "LLM_RETRY_MIN_DELAY_MS",
    "500",
    "first backoff; doubles each retry, full jitter",
    Plain,
    |s| ms(s.llm.retry_min_delay),
);
pub const LLM_RETRY_MAX_DELAY_MS: Setting = setting(
    "LLM_RETRY_MAX_DELAY_MS",
    "10000",
    "backoff ceiling",
    Plain,
    |s| ms(s.llm.retry_max_delay),
);
pub const LLM_RETRY_AFTER_CAP_MS: Setting = setting(
    "LLM_RETRY_AFTER_CAP_MS",
    "30000",
    "a server's Retry-After is honoured up to this",
    Plain,
    |s| ms(s.llm.retry_after_cap),
);
pub const LLM_DEADLINE_MS: Setting = setting(
    "LLM_DEADLINE_MS",
    "90000",
    "the whole summarization, every attempt and wait included",
    Plain,
    |s| ms(s.llm.deadline),
);
pub const LLM_FALLBACK: Setting = setting(
    "LLM_FALLBACK",
    "none",
    "none: an LLM failure leaves the session unchanged; extractive: compact with it instead",
    Plain,
    |s| s.llm.fallback.as_str().to_owned(),
);
pub const SUMMARY_PROMPT_FILE: Setting = setting(
    "SUMMARY_PROMPT_FILE",
    "",
    "a file whose text replaces the system prompt; must ask for the four headings",
    Plain,
    |s| path(s.llm.prompt_file.as_ref()),
);
pub const LLM_MAX_INPUT_TOKENS: Setting = setting(
    "LLM_MAX_INPUT_TOKENS",
    "100000",
    "no request is larger (prompt and transcript, o200k_base tokens); larger old parts go in chunks",
    Plain,
    |s| s.llm.max_input_tokens.to_string(),
);
pub const SUMMARY_MAX_CHARS: Setting = setting(
    "SUMMARY_MAX_CHARS",
    "6000",
    "the longest summary accepted; the model is asked for at most chars/3 tokens",
    Plain,
    |s| s.llm.summary_max_chars.to_string(),
);
pub const SUMMARY_USER_WORDS_CHARS: Setting = setting(
    "SUMMARY_USER_WORDS_CHARS",
    "1500",
    "the most chars the user wrote (standing rules, the task) quoted verbatim after each summary; 0: none",
    Plain,
    |s| s.llm.user_words_chars.to_string(),
);
pub const SUMMARY_FACT_CHECK: Setting = setting(
    "SUMMARY_FACT_CHECK",
    "retry",
    "off, record (each summary's recall of the removed identifiers) or retry (record, and ask an LLM once more below the minimum)",
    Plain,
    |s| s.fact_check.mode.as_str().to_owned(),
);
pub const SUMMARY_MIN_FACT_RECALL: Setting = setting(
    "SUMMARY_MIN_FACT_RECALL",
    "0.8",
    "a fraction from 0 to 1: an LLM summary keeping fewer of the identifiers is asked for once more (retry)",
    Plain,
    |s| s.fact_check.min_recall.to_string(),
);
pub const SUMMARIZATION_PRECOMPUTE_AT: Setting = setting(
    "SUMMARIZATION_PRECOMPUTE_AT",
    "0",
    "0: off; a fraction below 1 (0.8): above it x threshold, summarize in the background so the crossing turn only commits (costs extra LLM calls)",
    Plain,
    |s| s.precompute.at.to_string(),
);
pub const PRECOMPUTE_CONCURRENCY: Setting = setting(
    "PRECOMPUTE_CONCURRENCY",
    "4",
    "background precomputes per worker; more are not started (a later turn tries again)",
    Plain,
    |s| s.precompute.concurrency.to_string(),
);
pub const PRECOMPUTE_TTL_MS: Setting = setting(
    "PRECOMPUTE_TTL_MS",
    "3600000",
    "milliseconds: a pending summary older than this is dropped, not applied",
    Plain,
    |s| ms(s.precompute.ttl),
);
pub const SUMMARIZATION_IDLE_AFTER_MS: Setting = setting(
    "SUMMARIZATION_IDLE_AFTER_MS",
    "0",
    "0: off; milliseconds: a session no message was written to for this long is compacted in the \
     background over SUMMARIZATION_IDLE_THRESHOLD_CHARS, once per idle period (set it to the \
     lifetime of the provider prompt cache: 300000, or 3600000 for extended caching)",
    Plain,
    |s| ms(s.idle.after),
);
pub const SUMMARIZATION_IDLE_THRESHOLD_CHARS: Setting = setting(
    "SUMMARIZATION_IDLE_THRESHOLD_CHARS",
    "0",
    "an idle session larger than this many chars is compacted (0: half the threshold of the \
     session; never below its keep)",
    Plain,
    |s| s.idle.threshold_chars.to_string(),
);
pub const REDACT_SECRETS: Setting = setting(
    "REDACT_SECRETS",
    "on",
    "on or off: credentials (API keys, tokens, passwords, keys in URLs) are replaced by a marker naming their kind in what the summarizer is sent, in summaries and in what recall returns; the archive keeps the originals",
    Plain,
    |s| if s.redact_secrets { "on" } else { "off" }.to_owned(),
);
pub const TOOL_OUTPUT_CLEARING: Setting = setting(
    "TOOL_OUTPUT_CLEARING",
    "off",
    "off or on: clear old tool results (placeholder in place, original archived) before summarizing, with no LLM call when that is enough",
    Plain,
    |s| if s.tool_outputs.clearing { "on" } else { "off" }.to_owned(),
);
pub const TOOL_OUTPUT_KEEP: Setting = setting(
    "TOOL_OUTPUT_KEEP",
    "3",
    "the newest this many tool results are never cleared (0 or more)",
    Plain,
    |s| s.tool_outputs.keep.to_string(),
);
pub const TOOL_OUTPUT_MIN_CHARS: Setting = setting(
    "TOOL_OUTPUT_MIN_CHARS",
    "1000",
    "tool results shorter than this many chars are never cleared (0 or more)",
    Plain,
    |s| s.tool_outputs.min_chars.to_string(),
);
pub const TOOL_OUTPUT_MAX_CHARS: Setting = setting(
    "TOOL_OUTPUT_MAX_CHARS",
    "20000",
    "a tool result larger than this many chars is cleared by the next turn, even among the \
     newest and with TOOL_OUTPUT_CLEARING off, its first and last lines kept (0: off, else \
     at least 4000)",
    Plain,
    |s| s.tool_outputs.max_chars.to_string(),
);
pub const TOOL_OUTPUT_EXCLUDE: Setting = setting(
    "TOOL_OUTPUT_EXCLUDE",
    "",
    "comma-separated tool names whose results are never cleared",
    Plain,
    |s| s.tool_outputs.exclude.join(","),
);
pub const LEASE_DURATION_MS: Setting = setting(
    "LEASE_DURATION_MS",
    "120000",
    "a crashed worker's lease is taken over after this; keep it above LLM_DEADLINE_MS",
    Plain,
    |s| ms(s.lease_duration),
);
pub const FAILURE_BACKOFF_MS: Setting = setting(
    "FAILURE_BACKOFF_MS",
    "60000",
    "after an LLM failure, skip the session this long (0: off) ...",
    Plain,
    |s| ms(s.failure_backoff),
);
pub const FAILURE_BACKOFF_MAX_MS: Setting = setting(
    "FAILURE_BACKOFF_MAX_MS",
    "900000",
    "... doubling per further failure, up to this",
    Plain,
    |s| ms(s.failure_backoff_max),
);
pub const SHUTDOWN_GRACE_MS: Setting = setting(
    "SHUTDOWN_GRACE_MS",
    "30000",
    "SIGTERM: how long in-flight events may take to finish",
    Plain,
    |s| ms(s.shutdown_grace),
);
pub const LOG_FORMAT: Setting = setting(
    "LOG_FORMAT",
    "text",
    "text for people, json for production",
    Plain,
    |s| match s.log_format {
        LogFormat::Text => "text".to_owned(),
        LogFormat::Json => "json".to_owned(),
    },
);

/// Every setting, in the order `.env.example` lists them.
pub const SETTINGS: &[Setting] = &[
    SUMMARIZATION_ENABLED,
    SUMMARIZATION_THRESHOLD_CHARS,
    SUMMARIZATION_THRESHOLD_TOKENS,
    SUMMARIZATION_KEEP_CHARS,
    SUMMARIZATION_MIN_THRESHOLD_CHARS,
    SUMMARIZATION_MAX_THRESHOLD_CHARS,
    SUMMARIZATION_MIN_KEEP_CHARS,
    SUMMARIZATION_MAX_KEEP_CHARS,
    DATABASE_URL,
    DATABASE_MAX_CONNECTIONS,
    DATABASE_ACQUIRE_TIMEOUT_MS,
    NATS_URL,
    NATS_USER,
    NATS_PASSWORD,
    NATS_TOKEN,
    NATS_CREDS_FILE,
    NATS_TLS_CA_FILE,
    NATS_TLS_CERT_FILE,
    NATS_TLS_KEY_FILE,
    NATS_TLS_REQUIRED,
    NATS_SUBJECT,
    NATS_RECALL_SUBJECT,
    NATS_QUEUE_GROUP,
    TRANSPORT,
    JETSTREAM_STREAM,
    JETSTREAM_CONSUMER,
    JETSTREAM_SUBJECT_PREFIX,
    JETSTREAM_MAX_DELIVER,
    JETSTREAM_ACK_WAIT_MS,
    WORKER_CONCURRENCY,
    HTTP_ADDR,
    LLM_PROVIDER,
    LLM_BASE_URL,
    LLM_MODEL,
    LLM_API_KEY,
    LLM_TIMEOUT_MS,
    LLM_MAX_RETRIES,
    LLM_RETRY_MIN_DELAY_MS,
    LLM_RETRY_MAX_DELAY_MS,
    LLM_RETRY_AFTER_CAP_MS,
    LLM_DEADLINE_MS,
    LLM_FALLBACK,
    SUMMARY_PROMPT_FILE,
    LLM_MAX_INPUT_TOKENS,
    SUMMARY_MAX_CHARS,
    SUMMARY_USER_WORDS_CHARS,
    SUMMARY_FACT_CHECK,
    SUMMARY_MIN_FACT_RECALL,
    SUMMARIZATION_PRECOMPUTE_AT,
    PRECOMPUTE_CONCURRENCY,
    PRECOMPUTE_TTL_MS,
    SUMMARIZATION_IDLE_AFTER_MS,
    SUMMARIZATION_IDLE_THRESHOLD_CHARS,
    REDACT_SECRETS,
    TOOL_OUTPUT_CLEARING,
    TOOL_OUTPUT_KEEP,
    TOOL_OUTPUT_MIN_CHARS,
    TOOL_OUTPUT_MAX_CHARS,
    TOOL_OUTPUT_EXCLUDE,
    LEASE_DURATION_MS,
    FAILURE_BACKOFF_MS,
    FAILURE_BACKOFF_MAX_MS,
    SHUTDOWN_GRACE_MS,
    LOG_FORMAT,
];

/// Settings that had another name, with the setting each became: the old name is still
/// read (in the file and in the environment alike) when the new one is not set beside it,
/// and the worker warns at start that it is deprecated.
pub const RENAMED: [(&str, &Setting); 1] = [("PRECOMPUTE_TTL", &PRECOMPUTE_TTL_MS)];
