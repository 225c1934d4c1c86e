//! Typed settings, read once at start from an optional config file, the environment
//! and `.env`, and validated before anything connects.
//!
//! The setting names are the seed's flat, upper-case names (`SUMMARIZATION_THRESHOLD_CHARS`,
//! ...). A config file uses the same names as keys, in any case. The environment wins over
//! the file, and the file over the defaults. Every error names the setting it is about, so
//! `main` can print it and exit 64.
//!
//! # Layout
//! - [`table`]: the one table of settings (name, default, description, secret or not).
//! - `source`: the merged sources, read setting by setting.
//! - `sections`: the typed sections (compaction limits, database, NATS, LLM, fleet), each
//!   checking its own values.
//! - `rules`: every rule that ties settings together.
//! - `secret`: [`Secret`] and URL redaction.

mod rules;
mod secret;
mod sections;
mod source;
pub mod table;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

pub use secret::{REDACTED, Secret, redact_url, url_credentials, url_secrets};
pub use sections::{
    Bounds, FactCheck, FactCheckMode, FallbackMode, Idle, Jobs, Limits, LlmSettings, NatsAuth,
    Precompute, Provider, ToolOutputs, Transport,
};
pub use table::{Kind, SETTINGS, Setting};

use sections::{Database, Fleet, Nats};
use source::Raw;

/// A setting that is missing, unparsable, or inconsistent with another one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{setting}: {message}")]
    Invalid {
        setting: &'static str,
        message: String,
    },
    #[error("config file: {0}")]
    File(#[from] config::ConfigError),
}

impl ConfigError {
    fn invalid(setting: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            setting,
            message: message.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}; expected \"text\" or \"json\""
            )),
        }
    }
}

/// Every setting, typed. The fields keep the flat names the rest of the crate uses; the
/// sections they are read from are in `sections`.
#[derive(Clone, Debug)]
pub struct Settings {
    pub enabled: bool,
    pub limits: Limits,
    /// The range a request's or a session's own limits are clamped into.
    pub bounds: Bounds,
    pub database_url: Secret,
    pub database_max_connections: u32,
    /// How long a query waits for a pooled connection before failing with `store_error`.
    pub database_acquire_timeout: Duration,
    pub nats_url: Secret,
    pub nats_auth: NatsAuth,
    pub subject: String,
    /// `NATS_RECALL_SUBJECT`: where recall requests are served.
    pub recall_subject: String,
    pub queue_group: String,
    /// `TRANSPORT` and the JetStream job queue's settings.
    pub jobs: Jobs,
    pub concurrency: usize,
    /// `None` when `HTTP_ADDR` is empty: no HTTP listener.
    pub http_addr: Option<SocketAddr>,
    pub llm: LlmSettings,
    /// `SUMMARY_FACT_CHECK` and `SUMMARY_MIN_FACT_RECALL`.
    pub fact_check: FactCheck,
    /// `SUMMARIZATION_PRECOMPUTE_AT`, `PRECOMPUTE_CONCURRENCY`, `PRECOMPUTE_TTL_MS`.
    pub precompute: Precompute,
    /// `SUMMARIZATION_IDLE_AFTER_MS`, `SUMMARIZATION_IDLE_THRESHOLD_CHARS`.
    pub idle: Idle,
    /// `TOOL_OUTPUT_CLEARING`, `TOOL_OUTPUT_KEEP`, `TOOL_OUTPUT_MIN_CHARS`,
    /// `TOOL_OUTPUT_EXCLUDE`.
    pub tool_outputs: ToolOutputs,
    /// `SUMMARIZATION_THRESHOLD_TOKENS`: a session over this many tokens is compacted
    /// too (docs/compaction.md, "Token thresholds"); 0: off.
    pub threshold_tokens: i64,
    /// `REDACT_SECRETS`: secrets are kept out of what the summarizer sees, of summaries
    /// and of what recall returns (docs/protocol.md, "Secrets").
    pub redact_secrets: bool,
    /// How long a session lease lasts before another worker may take it over.
    pub lease_duration: Duration,
    /// After an LLM failure a session waits this long before it is summarized again,
    /// doubling with each further failure up to `failure_backoff_max`. Zero: no backoff.
    pub failure_backoff: Duration,
    pub failure_backoff_max: Duration,
    /// How long SIGTERM waits for in-flight events before giving up on them.
    pub shutdown_grace: Duration,
    pub log_format: LogFormat,
    /// Old setting names in use, one warning each, logged at start.
    pub deprecated: Vec<String>,
}

impl Settings {
    /// Reads the process environment (after `.env`) over `file`, over the defaults.
    ///
    /// # Errors
    /// As [`Settings::from_sources`].
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::from_sources(file, None)
    }

    /// Like [`Settings::load`], with `env` standing in for the process environment.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the file cannot be read or parsed,
    /// [`ConfigError::Invalid`] naming the first setting that is wrong.
    pub fn from_sources(
        file: Option<&Path>,
        env: Option<HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let raw = Raw::merge(file, env)?;
        let mut settings = Self::from_sections(
            raw.parse(&table::SUMMARIZATION_ENABLED)?,
            (Limits::read(&raw)?, Bounds::read(&raw)?),
            Database::read(&raw)?,
            (Nats::read(&raw)?, Jobs::read(&raw)?),
            (LlmSettings::read(&raw)?, FactCheck::read(&raw)?),
            (Fleet::read(&raw)?, Precompute::read(&raw)?),
        );
        settings.tool_outputs = ToolOutputs::read(&raw)?;
        settings.idle = Idle::read(&raw)?;
        settings.redact_secrets = sections::on_off(&raw, &table::REDACT_SECRETS)?;
        settings.threshold_tokens = raw.parse(&table::SUMMARIZATION_THRESHOLD_TOKENS)?;
        if !(0..=crate::protocol::MAX_TOKENS).contains(&settings.threshold_tokens) {
            return Err(ConfigError::invalid(
                table::SUMMARIZATION_THRESHOLD_TOKENS.name,
                format!(
                    "must be from 0 (off) to {}, got {}",
                    crate::protocol::MAX_TOKENS,
                    settings.threshold_tokens
                ),
            ));
        }
        settings.check_rules()?;
        settings.deprecated = raw.deprecated().to_vec();
        Ok(settings)
    }

    fn from_sections(
        enabled: bool,
        (limits, bounds): (Limits, Bounds),
        database: Database,
        (nats, jobs): (Nats, Jobs),
        (llm, fact_check): (LlmSettings, FactCheck),
        (fleet, precompute): (Fleet, Precompute),
    ) -> Self {
        Self {
            enabled,
            limits,
            bounds,
            database_url: database.url,
            database_max_connections: database.max_connections,
            database_acquire_timeout: database.acquire_timeout,
            nats_url: nats.url,
            nats_auth: nats.auth,
            subject: nats.subject,
            recall_subject: nats.recall_subject,
            queue_group: nats.queue_group,
            jobs,
            concurrency: fleet.concurrency,
            http_addr: fleet.http_addr,
            llm,
            fact_check,
            precompute,
            idle: Idle::default(),
            tool_outputs: ToolOutputs::default(),
            threshold_tokens: 0,
            redact_secrets: true,
            lease_duration: fleet.lease_duration,
            failure_backoff: fleet.failure_backoff,
            failure_backoff_max: fleet.failure_backoff_max,
            shutdown_grace: fleet.shutdown_grace,
            log_format: fleet.log_format,
            deprecated: Vec::new(),
        }
    }

    /// The effective configuration as `name=value` pairs (every setting of the table,
    /// lower-case names) for the start-up log line: secrets shown as `[redacted]`, URLs
    /// with their credentials redacted.
    pub fn redacted(&self) -> String {
        SETTINGS
            .iter()
            .map(|setting| {
                let value = (setting.show)(self);
                let shown = match setting.kind {
                    Kind::Plain => value,
                    Kind::Secret if value.is_empty() => value,
                    Kind::Secret => REDACTED.to_owned(),
                    Kind::Url => redact_url(&value),
                };
                format!("{}={shown}", setting.name.to_ascii_lowercase())
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Every secret value these settings hold, in the forms a library may print them
    /// (a URL's password as written and decoded, ...): what the log writer scrubs
    /// from lines it did not format itself.
    pub fn secret_values(&self) -> Vec<String> {
        let mut found = Vec::new();
        for setting in SETTINGS {
            let value = (setting.show)(self);
            match setting.kind {
                Kind::Plain => {}
                Kind::Secret => found.push(value),
                // Postgres reads a bare user as the role name; NATS and HTTP servers
                // read it as a token.
                Kind::Url => found.extend(url_secrets(&value, setting.name != "DATABASE_URL")),
            }
        }
        found.retain(|s| !s.is_empty());
        found.sort();
        found.dedup();
        found
    }
}
