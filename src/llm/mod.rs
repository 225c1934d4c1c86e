//! Summarizers: what turns the old part of a session into one summary.
//!
//! [`Extractive`] runs offline and needs no key. An LLM is two levels: a provider that
//! answers one [`chat::ChatRequest`] with its own retries ([`OpenAiClient`] for any
//! OpenAI-compatible endpoint, [`AnthropicClient`] for Anthropic's Messages API), and
//! [`LlmSummarizer`] above it, which decides what each request holds: the prompt
//! ([`prompt`]), and within `LLM_MAX_INPUT_TOKENS` ([`tokens`]) the old part whole or in
//! chunks ([`chunks`]). [`Fallback`] has the extractive summarizer stand in when the LLM
//! fails (`LLM_FALLBACK`). All sit behind [`Summarizer`] so the worker neither knows nor
//! cares which one it holds. What every HTTP provider shares is `http`'s.

mod anthropic;
pub mod chat;
mod chunked;
pub mod chunks;
mod extractive;
mod fallback;
mod http;
mod openai;
pub mod prompt;
mod retry;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

pub use anthropic::AnthropicClient;
pub use chunked::LlmSummarizer;
pub use extractive::Extractive;
pub use fallback::Fallback;
pub use openai::OpenAiClient;

use crate::config::{FallbackMode, LlmSettings, Provider};
use crate::message::Message;
use crate::metrics::Metrics;

/// A summary as the summarizer produced it, before [`crate::summary::check`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    /// The model that wrote it, as the provider reported it.
    pub model: String,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The version of the prompt that asked for it ([`prompt::Prompt::version`]); `None`
    /// when no prompt did (the extractive summarizer).
    pub prompt_version: Option<String>,
    /// Set when the configured LLM failed and `LLM_FALLBACK` wrote this summary instead:
    /// the LLM's error, which carries no secret (see `http::scrub`).
    pub fallback_reason: Option<String>,
}

impl Summary {
    /// Adds `other`'s token usage to this one's: a summary that took several calls
    /// (chunks, a second attempt) reports what all of them cost.
    pub fn add_usage(&mut self, other: &Summary) {
        let add = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        self.prompt_tokens = add(self.prompt_tokens, other.prompt_tokens);
        self.completion_tokens = add(self.completion_tokens, other.completion_tokens);
    }
}

/// Why no summary came back. Only [`LlmError::Transient`] is retried.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Connect errors, timeouts, 408, 429 and 5xx: worth another try, after
    /// `retry_after` when the server said so.
    #[error("{cause}")]
    Transient {
        cause: String,
        retry_after: Option<Duration>,
    },
    /// Any other non-success status: the request itself is wrong; retrying cannot help.
    #[error("HTTP {status}: {body}")]
    Rejected { status: u16, body: String },
    /// A success status with a body that holds no summary.
    #[error("invalid response: {0}")]
    Invalid(String),
    /// The provider said the request does not fit the model's context (OpenAI's
    /// `context_length_exceeded`, Anthropic's "prompt is too long"): a smaller request
    /// may succeed, so it is not a permanent failure.
    #[error("context length exceeded: {0}")]
    ContextLength(String),
    /// The answer stopped at the output limit (OpenAI's `finish_reason: "length"`,
    /// Anthropic's `stop_reason: "max_tokens"`): it ends mid-word, and may still hold
    /// every heading, so it is never a summary. Asked again, shorter and with more room
    /// (see `chunked`), before it is a failure.
    #[error("the answer was cut off at the output limit: {0}")]
    Truncated(String),
}

impl LlmError {
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The `cause` label of `summarizer_llm_failures_total`.
    pub fn metric_cause(&self) -> &'static str {
        match self {
            Self::Transient { .. } => "transient",
            Self::Rejected { .. } => "rejected",
            Self::Invalid(_) => "invalid_response",
            Self::ContextLength(_) => "context_length",
            Self::Truncated(_) => "truncated",
        }
    }
}

pub trait Summarizer: Send + Sync {
    /// Summarizes `old` (oldest first; an earlier summary among them is folded in).
    ///
    /// # Errors
    /// [`LlmError`] once retries, if any, are exhausted or the deadline has passed.
    fn summarize<'a>(&'a self, old: &'a [Message]) -> BoxFuture<'a, Result<Summary, LlmError>>;

    /// [`Summarizer::summarize`], given the system messages that precede the old part
    /// (never summarized; an LLM reads them to understand the conversation) and the model
    /// the session asks for (`session_settings.model`; `None` for `LLM_MODEL`). A
    /// summarizer that has no use for them keeps this default.
    ///
    /// # Errors
    /// As [`Summarizer::summarize`].
    fn summarize_in_context<'a>(
        &'a self,
        context: &'a [Message],
        old: &'a [Message],
        model: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        let _ = (context, model);
        self.summarize(old)
    }

    /// A second attempt at [`Summarizer::summarize_in_context`], told which identifiers
    /// of `old` a first summary left out (`missing`, in order of first appearance; the
    /// summarizer lists as many as its request has room for).
    ///
    /// `None` when this summarizer cannot do better than it did: the default, right for
    /// a deterministic one (the extractive summarizer would answer the same).
    ///
    /// # Errors
    /// As [`Summarizer::summarize`]; the caller keeps the first summary.
    fn summarize_keeping<'a>(
        &'a self,
        context: &'a [Message],
        old: &'a [Message],
        model: Option<&'a str>,
        missing: &'a [String],
    ) -> Option<BoxFuture<'a, Result<Summary, LlmError>>> {
        let _ = (context, old, model, missing);
        None
    }
}

/// The summarizer `settings` ask for: the provider's, wrapped in [`Fallback`] when
/// `LLM_FALLBACK=extractive` (a fallback from the extractive summarizer to itself would
/// only repeat its error, so it gets none).
///
/// # Errors
/// When the HTTP client cannot be built (TLS initialisation).
pub fn from_settings(
    settings: &LlmSettings,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Box<dyn Summarizer>> {
    let summarizer: Box<dyn Summarizer> = match settings.provider {
        Provider::Extractive => return Ok(Box::new(Extractive::new(settings.summary_max_chars))),
        Provider::OpenAi => Box::new(LlmSummarizer::new(
            Box::new(OpenAiClient::new(settings.clone(), metrics.clone())?),
            settings,
        )),
        Provider::Anthropic => Box::new(LlmSummarizer::new(
            Box::new(AnthropicClient::new(settings.clone(), metrics.clone())?),
            settings,
        )),
    };
    Ok(match settings.fallback {
        FallbackMode::None => summarizer,
        FallbackMode::Extractive => Box::new(Fallback::new(
            summarizer,
            metrics,
            settings.summary_max_chars,
        )),
    })
}
