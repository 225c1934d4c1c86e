//! The typed sections of [`super::Settings`], each read from the table's settings and
//! checked value by value where it is defined. Rules that tie two settings together live
//! in [`super::rules`].

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use super::source::Raw;
use super::table::*;
use super::{ConfigError, LogFormat, Secret, redact_url};
use crate::prompt::Prompt;

/// When and how much to compact (docs/compaction.md, "When and what is compacted").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A session strictly larger than this many chars is compacted.
    pub threshold_chars: i64,
    /// The kept (newest) part holds at least this many chars.
    pub keep_chars: i64,
}

impl Limits {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        Ok(Self {
            threshold_chars: raw.positive(&SUMMARIZATION_THRESHOLD_CHARS)?,
            keep_chars: raw.positive(&SUMMARIZATION_KEEP_CHARS)?,
        })
    }
}

/// What a request or a session may ask for instead of the configured [`Limits`]: each
/// value it gives is clamped into these ranges (see [`crate::overrides`]). The configured
/// limits themselves are the operator's and are not clamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min_threshold_chars: i64,
    pub max_threshold_chars: i64,
    pub min_keep_chars: i64,
    pub max_keep_chars: i64,
}

impl Bounds {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        Ok(Self {
            min_threshold_chars: raw.positive(&SUMMARIZATION_MIN_THRESHOLD_CHARS)?,
            max_threshold_chars: raw.positive(&SUMMARIZATION_MAX_THRESHOLD_CHARS)?,
            min_keep_chars: raw.positive(&SUMMARIZATION_MIN_KEEP_CHARS)?,
            max_keep_chars: raw.positive(&SUMMARIZATION_MAX_KEEP_CHARS)?,
        })
    }
}

impl Default for Bounds {
    /// The defaults of the settings table.
    fn default() -> Self {
        Self {
            min_threshold_chars: 1_000,
            max_threshold_chars: 10_000_000,
            min_keep_chars: 500,
            max_keep_chars: 5_000_000,
        }
    }
}

/// Postgres.
#[derive(Clone, Debug)]
pub(super) struct Database {
    pub url: Secret,
    pub max_connections: u32,
    /// How long a query waits for a pooled connection before failing with `store_error`.
    pub acquire_timeout: Duration,
}

impl Database {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        Ok(Self {
            url: Secret::new(raw.non_empty(&DATABASE_URL)?),
            max_connections: raw.positive(&DATABASE_MAX_CONNECTIONS)?,
            acquire_timeout: raw.millis(&DATABASE_ACQUIRE_TIMEOUT_MS)?,
        })
    }
}

/// How the worker authenticates to NATS and secures the connection. A user and password
/// may also sit in `NATS_URL` (`nats://user:password@host:4222`).
#[derive(Clone, Debug, Default)]
pub struct NatsAuth {
    pub user: Option<String>,
    pub password: Secret,
    pub token: Secret,
    /// A `.creds` file (JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// Extra root certificates (PEM) to trust for the server's certificate.
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate and key (PEM), for servers that verify clients.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_required: bool,
}

/// NATS: where, as whom, and which subject and queue group.
#[derive(Clone, Debug)]
pub(super) struct Nats {
    pub url: Secret,
    pub auth: NatsAuth,
    pub subject: String,
    pub recall_subject: String,
    pub queue_group: String,
}

impl Nats {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let file = |setting: &Setting| -> Result<Option<PathBuf>, ConfigError> {
            let Some(path) = raw.optional(setting)?.map(PathBuf::from) else {
                return Ok(None);
            };
            if path.is_file() {
                Ok(Some(path))
            } else {
                let message = format!("{} is not a readable file", path.display());
                Err(ConfigError::invalid(setting.name, message))
            }
        };
        Ok(Self {
            url: Secret::new(raw.non_empty(&NATS_URL)?),
            auth: NatsAuth {
                user: raw.optional(&NATS_USER)?,
                password: Secret::new(raw.text(&NATS_PASSWORD)?),
                token: Secret::new(raw.text(&NATS_TOKEN)?),
                creds_file: file(&NATS_CREDS_FILE)?,
                tls_ca_file: file(&NATS_TLS_CA_FILE)?,
                tls_cert_file: file(&NATS_TLS_CERT_FILE)?,
                tls_key_file: file(&NATS_TLS_KEY_FILE)?,
                tls_required: raw.parse(&NATS_TLS_REQUIRED)?,
            },
            subject: raw.non_empty(&NATS_SUBJECT)?,
            recall_subject: raw.non_empty(&NATS_RECALL_SUBJECT)?,
            queue_group: raw.non_empty(&NATS_QUEUE_GROUP)?,
        })
    }
}

/// Which summarizer writes the summaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Built in, offline, deterministic: no key, no network.
    Extractive,
    /// Any OpenAI-compatible `/chat/completions` endpoint.
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Extractive => "extractive",
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    /// `LLM_BASE_URL` when it is left empty: the provider's own API.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::Extractive | Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com/v1",
        }
    }

    /// `LLM_MODEL` when it is left empty: a small, cheap model of the provider's.
    pub fn default_model(self) -> &'static str {
        match self {
            Self::Extractive | Self::OpenAi => "gpt-4o-mini",
            Self::Anthropic => "claude-haiku-4-5",
        }
    }
}

impl FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "extractive" => Ok(Self::Extractive),
            "openai" => Ok(Self::OpenAi),
            "anthropic" => Ok(Self::Anthropic),
            other => Err(format!(
                "unknown provider {other:?}; expected \"extractive\", \"openai\" or \"anthropic\""
            )),
        }
    }
}

#[derive(Clone)]
pub struct LlmSettings {
    pub provider: Provider,
    pub base_url: String,
    pub model: String,
    pub api_key: Secret,
    /// One HTTP attempt, headers and body.
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub max_retries: usize,
    pub retry_min_delay: Duration,
    pub retry_max_delay: Duration,
    /// The longest `Retry-After` we wait for; a longer one is cut to this.
    pub retry_after_cap: Duration,
    /// The whole summarization, every attempt and wait included.
    pub deadline: Duration,
    /// What summarizes when the LLM cannot.
    pub fallback: FallbackMode,
    /// `SUMMARY_PROMPT_FILE`, when set.
    pub prompt_file: Option<PathBuf>,
    /// The system prompt in force: the default, or the file's text, checked at start.
    pub prompt: Prompt,
    /// No request the summarizer sends is larger, prompt and transcript included
    /// (`o200k_base` tokens): a larger old part is summarized in chunks.
    pub max_input_tokens: usize,
    /// The longest summary accepted (chars); the model is asked for at most a third of
    /// it in tokens.
    pub summary_max_chars: usize,
    /// `SUMMARY_USER_WORDS_CHARS`: the most of the user's own words (rules, the task)
    /// the worker quotes after a summary; 0 quotes none (see `summary::words`).
    pub user_words_chars: usize,
}

/// `LLM_FALLBACK`: what summarizes a session whose LLM summarization failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackMode {
    /// Nothing: the session stays as it is (`failed/llm_error`), as in the seed.
    None,
    /// The extractive summarizer, and the usage event says so.
    Extractive,
}

impl FallbackMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Extractive => "extractive",
        }
    }
}

impl FromStr for FallbackMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "extractive" => Ok(Self::Extractive),
            other => Err(format!(
                "unknown fallback {other:?}; expected \"none\" or \"extractive\""
            )),
        }
    }
}

/// By hand, so the base URL's credentials stay out of `Debug` as well.
impl fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmSettings")
            .field("provider", &self.provider)
            .field("base_url", &redact_url(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_min_delay", &self.retry_min_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .field("retry_after_cap", &self.retry_after_cap)
            .field("deadline", &self.deadline)
            .field("fallback", &self.fallback)
            .field("prompt_file", &self.prompt_file)
            .field("prompt_version", &self.prompt.version())
            .field("max_input_tokens", &self.max_input_tokens)
            .field("summary_max_chars", &self.summary_max_chars)
            .field("user_words_chars", &self.user_words_chars)
            .finish()
    }
}

impl LlmSettings {
    /// The most tokens a summary is asked to take: `SUMMARY_MAX_CHARS` / 3, rounded up.
    /// A token averages about four characters of English and fewer of identifiers and
    /// numbers, so a third leaves the model room to finish a summary that is within the
    /// character limit; the limit itself is enforced in characters by the summary check.
    pub fn summary_max_tokens(&self) -> u32 {
        u32::try_from(self.summary_max_chars.div_ceil(3)).unwrap_or(u32::MAX)
    }

    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let provider: Provider = raw.parse(&LLM_PROVIDER)?;
        let base_url = raw.optional(&LLM_BASE_URL)?;
        let base_url = base_url.as_deref().unwrap_or(provider.default_base_url());
        let prompt_file = raw.optional(&SUMMARY_PROMPT_FILE)?.map(PathBuf::from);
        let prompt = match &prompt_file {
            Some(path) => read_prompt(path)?,
            None => Prompt::default(),
        };
        let llm = Self {
            provider,
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: raw
                .optional(&LLM_MODEL)?
                .unwrap_or_else(|| provider.default_model().to_owned()),
            api_key: Secret::new(raw.text(&LLM_API_KEY)?),
            timeout: raw.millis(&LLM_TIMEOUT_MS)?,
            max_retries: raw.parse(&LLM_MAX_RETRIES)?,
            retry_min_delay: raw.millis(&LLM_RETRY_MIN_DELAY_MS)?,
            retry_max_delay: raw.millis(&LLM_RETRY_MAX_DELAY_MS)?,
            retry_after_cap: raw.millis(&LLM_RETRY_AFTER_CAP_MS)?,
            deadline: raw.millis(&LLM_DEADLINE_MS)?,
            fallback: raw.parse(&LLM_FALLBACK)?,
            prompt_file,
            prompt,
            max_input_tokens: raw.positive(&LLM_MAX_INPUT_TOKENS)?,
            summary_max_chars: raw.positive(&SUMMARY_MAX_CHARS)?,
            user_words_chars: raw.parse(&SUMMARY_USER_WORDS_CHARS)?,
        };
        Ok(llm)
    }
}

/// `SUMMARY_PROMPT_FILE`'s text as the system prompt; an unreadable file, or one that
/// does not ask for the template's headings, stops the worker at start.
fn read_prompt(path: &Path) -> Result<Prompt, ConfigError> {
    let invalid = |message: String| ConfigError::invalid(SUMMARY_PROMPT_FILE.name, message);
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
    Prompt::from_file_text(text).map_err(|e| invalid(format!("{}: {e}", path.display())))
}

/// `SUMMARY_FACT_CHECK`: what is done with each summary's recall of the identifiers it
/// replaces (see [`crate::fact_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactCheckMode {
    /// Nothing is measured; usage events carry no `facts_*` figures.
    Off,
    /// Measured and recorded in the usage event, never acted on.
    Record,
    /// Recorded, and an LLM summary below `SUMMARY_MIN_FACT_RECALL` is asked for once
    /// more, with the identifiers it lacks listed.
    Retry,
}

impl FactCheckMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Record => "record",
            Self::Retry => "retry",
        }
    }
}

impl FromStr for FactCheckMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(Self::Off),
            "record" => Ok(Self::Record),
            "retry" => Ok(Self::Retry),
            other => Err(format!(
                "unknown fact check {other:?}; expected \"off\", \"record\" or \"retry\""
            )),
        }
    }
}

/// The fact check's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FactCheck {
    pub mode: FactCheckMode,
    /// A fraction in [0, 1]: below it, `retry` asks once more.
    pub min_recall: f64,
}

impl Default for FactCheck {
    /// The defaults of the settings table.
    fn default() -> Self {
        Self {
            mode: FactCheckMode::Retry,
            min_recall: 0.8,
        }
    }
}

impl FactCheck {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let min_recall: f64 = raw.parse(&SUMMARY_MIN_FACT_RECALL)?;
        // `f64` parses "NaN" and "inf" too; neither is a fraction.
        if !(0.0..=1.0).contains(&min_recall) {
            return Err(ConfigError::invalid(
                SUMMARY_MIN_FACT_RECALL.name,
                format!("must be a fraction from 0 to 1 (0.8 is 80%), got {min_recall}"),
            ));
        }
        Ok(Self {
            mode: raw.parse(&SUMMARY_FACT_CHECK)?,
            min_recall,
        })
    }
}

/// Summaries prepared before the threshold (`SUMMARIZATION_PRECOMPUTE_AT`; see
/// `crate::worker::precompute`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Precompute {
    /// A fraction of the threshold in [0, 1); 0 is off.
    pub at: f64,
    /// Background precomputes at once per worker.
    pub concurrency: usize,
    /// A pending summary older than this is dropped.
    pub ttl: Duration,
}

impl Default for Precompute {
    /// The defaults of the settings table: off.
    fn default() -> Self {
        Self {
            at: 0.0,
            concurrency: 4,
            ttl: Duration::from_secs(3600),
        }
    }
}

impl Precompute {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let at: f64 = raw.parse(&SUMMARIZATION_PRECOMPUTE_AT)?;
        // `f64` parses "NaN" and "inf" too. 1 would precompute at the threshold itself,
        // where the turn compacts anyway.
        if !(0.0..1.0).contains(&at) {
            return Err(ConfigError::invalid(
                SUMMARIZATION_PRECOMPUTE_AT.name,
                format!(
                    "must be 0 (off) or a fraction below 1 (0.8 is 80% of the threshold), got {at}"
                ),
            ));
        }
        Ok(Self {
            at,
            concurrency: raw.positive(&PRECOMPUTE_CONCURRENCY)?,
            ttl: raw.millis(&PRECOMPUTE_TTL_MS)?,
        })
    }

    pub fn enabled(&self) -> bool {
        self.at > 0.0
    }

    /// Whether a session of `chars` below `threshold` is in the band where a summary is
    /// prepared: strictly above `at` x threshold (and precompute on).
    pub fn wanted(&self, chars: i64, threshold: i64) -> bool {
        self.enabled() && chars as f64 > self.at * threshold as f64
    }
}

/// Compaction of sessions left idle (`SUMMARIZATION_IDLE_*`; see `crate::worker::idle`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Idle {
    /// A session with no message written for this long is idle; zero is off.
    pub after: Duration,
    /// An idle session larger than this is compacted; 0: half its threshold.
    pub threshold_chars: i64,
}

impl Idle {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let threshold_chars: i64 = raw.parse(&SUMMARIZATION_IDLE_THRESHOLD_CHARS)?;
        if threshold_chars < 0 {
            return Err(ConfigError::invalid(
                SUMMARIZATION_IDLE_THRESHOLD_CHARS.name,
                format!(
                    "must be 0 (half the threshold) or a number of chars, got {threshold_chars}"
                ),
            ));
        }
        Ok(Self {
            after: raw.millis_or_zero(&SUMMARIZATION_IDLE_AFTER_MS)?,
            threshold_chars,
        })
    }

    pub fn enabled(&self) -> bool {
        !self.after.is_zero()
    }

    /// How long idle a session may be before a pass gives up on it, takes it out of the
    /// schedule and leaves it as it is: `after` and as long again, at least an hour
    /// more. In a running fleet a pass takes a session seconds after it is due; older
    /// ones were written before the fleet watched (the setting just turned on, or the
    /// fleet down for long), and compacting all of them at once would spend LLM calls
    /// on conversations long over.
    pub fn give_up_after(&self) -> Duration {
        self.after + self.after.max(Duration::from_secs(3600))
    }

    /// The chars over which an idle session whose own threshold is `threshold` and keep
    /// `keep` is compacted: the setting, else half the threshold, never below the keep
    /// (a session at its keep has nothing to compact).
    pub fn threshold(&self, threshold: i64, keep: i64) -> i64 {
        let idle = if self.threshold_chars > 0 {
            self.threshold_chars
        } else {
            threshold / 2
        };
        idle.max(keep)
    }
}

/// Clearing old tool output before a summary (`TOOL_OUTPUT_*`; see `crate::compaction::clearing`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutputs {
    /// `TOOL_OUTPUT_CLEARING`: whether a compaction clears first, unless the session or
    /// the request says otherwise.
    pub clearing: bool,
    /// The newest this many tool results are never cleared.
    pub keep: usize,
    /// Results of fewer chars are never cleared.
    pub min_chars: i64,
    /// Tools whose results are never cleared, by the name of the call they answer.
    pub exclude: Vec<String>,
    /// `TOOL_OUTPUT_MAX_CHARS`: a result larger than this is evicted by the next turn,
    /// whatever the rules above say (see `compaction::clearing::evictions`); 0 is off.
    pub max_chars: i64,
}

impl Default for ToolOutputs {
    /// The defaults of the settings table: off.
    fn default() -> Self {
        Self {
            clearing: false,
            keep: 3,
            min_chars: 1000,
            exclude: Vec::new(),
            max_chars: 20_000,
        }
    }
}

/// A setting that is `off` or `on` (in any case).
pub(super) fn on_off(raw: &Raw, setting: &Setting) -> Result<bool, ConfigError> {
    match raw.text(setting)?.to_ascii_lowercase().as_str() {
        "off" => Ok(false),
        "on" => Ok(true),
        other => Err(ConfigError::invalid(
            setting.name,
            format!("must be off or on, got {other:?}"),
        )),
    }
}

/// The smallest `TOOL_OUTPUT_MAX_CHARS` but 0: an evicted result keeps its first and last
/// lines (`compaction::clearing::EVICTED_ENDS_CHARS` each) beside its placeholder, so a
/// smaller one would save next to nothing.
pub const MIN_EVICTED_CHARS: i64 = 4_000;

impl ToolOutputs {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let clearing = on_off(raw, &TOOL_OUTPUT_CLEARING)?;
        let keep: i64 = raw.parse(&TOOL_OUTPUT_KEEP)?;
        let keep = usize::try_from(keep).map_err(|_| {
            ConfigError::invalid(
                TOOL_OUTPUT_KEEP.name,
                format!("must be 0 or more, got {keep}"),
            )
        })?;
        let min_chars: i64 = raw.parse(&TOOL_OUTPUT_MIN_CHARS)?;
        if min_chars < 0 {
            return Err(ConfigError::invalid(
                TOOL_OUTPUT_MIN_CHARS.name,
                format!("must be 0 or more, got {min_chars}"),
            ));
        }
        // Names as written, spaces around them dropped; a name no tool has excludes
        // nothing, which is not an error (tools come and go with the agent's code).
        let exclude = (raw.text(&TOOL_OUTPUT_EXCLUDE)?.split(','))
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect();
        let max_chars: i64 = raw.parse(&TOOL_OUTPUT_MAX_CHARS)?;
        if max_chars != 0 && max_chars < MIN_EVICTED_CHARS {
            return Err(ConfigError::invalid(
                TOOL_OUTPUT_MAX_CHARS.name,
                format!("must be 0 (off) or at least {MIN_EVICTED_CHARS}, got {max_chars}"),
            ));
        }
        Ok(Self {
            clearing,
            keep,
            min_chars,
            exclude,
            max_chars,
        })
    }
}

/// `TRANSPORT`: where events come from./// `TRANSPORT`: where events come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Core NATS request/reply on `NATS_SUBJECT` (the seed's behaviour).
    Core,
    /// Durable jobs pulled from the JetStream work queue.
    JetStream,
    Both,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::JetStream => "jetstream",
            Self::Both => "both",
        }
    }

    pub fn serves_requests(self) -> bool {
        matches!(self, Self::Core | Self::Both)
    }

    pub fn serves_jobs(self) -> bool {
        matches!(self, Self::JetStream | Self::Both)
    }
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "core" => Ok(Self::Core),
            "jetstream" => Ok(Self::JetStream),
            "both" => Ok(Self::Both),
            other => Err(format!(
                "unknown transport {other:?}; expected \"core\", \"jetstream\" or \"both\""
            )),
        }
    }
}

/// The durable job queue (`TRANSPORT=jetstream|both`; see `crate::transport::jetstream`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jobs {
    pub transport: Transport,
    pub stream: String,
    pub consumer: String,
    /// Jobs are published under `<subject_prefix>.`; the stream takes `<subject_prefix>.>`.
    pub subject_prefix: String,
    /// Deliveries of a failing job before it is dead-lettered.
    pub max_deliver: i64,
    pub ack_wait: Duration,
}

impl Jobs {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let prefix = raw.non_empty(&JETSTREAM_SUBJECT_PREFIX)?;
        let valid_token =
            |t: &str| !t.is_empty() && t != "*" && t != ">" && !t.contains(char::is_whitespace);
        if !prefix.split('.').all(valid_token) {
            return Err(ConfigError::invalid(
                JETSTREAM_SUBJECT_PREFIX.name,
                format!("must be a subject without wildcards or spaces, got {prefix:?}"),
            ));
        }
        // Stream and consumer names are single tokens to the server.
        let name = |setting: &Setting| -> Result<String, ConfigError> {
            let name = raw.non_empty(setting)?;
            if name.contains(['.', '*', '>', ' ', '/', '\\']) {
                return Err(ConfigError::invalid(
                    setting.name,
                    format!("must not contain '.', '*', '>', '/', '\\' or spaces, got {name:?}"),
                ));
            }
            Ok(name)
        };
        Ok(Self {
            transport: raw.parse(&TRANSPORT)?,
            stream: name(&JETSTREAM_STREAM)?,
            consumer: name(&JETSTREAM_CONSUMER)?,
            subject_prefix: prefix,
            max_deliver: raw.positive(&JETSTREAM_MAX_DELIVER)?,
            ack_wait: raw.millis(&JETSTREAM_ACK_WAIT_MS)?,
        })
    }

    /// The stream's subjects: every job subject.
    pub fn stream_subjects(&self) -> String {
        format!("{}.>", self.subject_prefix)
    }
}

/// The worker process: concurrency, leases, backoff, shutdown, HTTP and logs.
#[derive(Clone, Debug)]
pub(super) struct Fleet {
    pub concurrency: usize,
    /// `None` when `HTTP_ADDR` is empty: no HTTP listener.
    pub http_addr: Option<SocketAddr>,
    pub lease_duration: Duration,
    pub failure_backoff: Duration,
    pub failure_backoff_max: Duration,
    pub shutdown_grace: Duration,
    pub log_format: LogFormat,
}

impl Fleet {
    pub(super) fn read(raw: &Raw) -> Result<Self, ConfigError> {
        let http_addr = match raw.optional(&HTTP_ADDR)? {
            None => None,
            Some(_) => Some(raw.parse(&HTTP_ADDR)?),
        };
        Ok(Self {
            concurrency: raw.positive(&WORKER_CONCURRENCY)?,
            http_addr,
            lease_duration: raw.millis(&LEASE_DURATION_MS)?,
            failure_backoff: raw.millis_or_zero(&FAILURE_BACKOFF_MS)?,
            failure_backoff_max: raw.millis_or_zero(&FAILURE_BACKOFF_MAX_MS)?,
            shutdown_grace: raw.millis(&SHUTDOWN_GRACE_MS)?,
            log_format: raw.parse(&LOG_FORMAT)?,
        })
    }
}
