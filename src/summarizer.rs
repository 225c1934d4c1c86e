//! [`Summarizer`]: what turns the old part of a session into one [`Summary`], and
//! [`LlmError`], why it did not. The extractive summarizer ([`crate::extractive`]) and the
//! LLM providers ([`crate::llm`]) both implement it, so the worker neither knows nor cares
//! which one it holds.
//!
//! It sits below both: neither implementation imports the other's module for the
//! interface, and the fallback in `llm` can hold the extractive summarizer without a loop.

use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::facts::MissingFact;
use crate::message::Message;
use crate::protocol::Instructions;
use crate::summary::Summary;
use crate::usage::Meter;

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
    /// The answer, asked for twice, was not a summary the worker writes: the rule the
    /// last one broke (see [`crate::summary::accept`] and [`crate::summary::echoes`]).
    /// Every answer was paid for all the same: the request's [`Meter`] counted it.
    #[error("the answer was refused twice ({rule}): {0}", rule = .0.rule())]
    Refused(crate::summary::Rejected),
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
            Self::Refused(_) => "refused",
        }
    }
}

/// What a summarizer is asked for: the old part, with what helps write its summary.
/// Everything but `old` may be left at its default.
#[derive(Clone, Copy, Debug, Default)]
pub struct SummaryRequest<'a> {
    /// The messages to summarize, oldest first (an earlier summary among them is folded
    /// in).
    pub old: &'a [Message],
    /// The system messages that precede the old part: never summarized; an LLM reads
    /// them to understand the conversation.
    pub context: &'a [Message],
    /// The model the session asks for (`session_settings.model`); `None` for `LLM_MODEL`.
    pub model: Option<&'a str>,
    /// The focus the operator or the agent asked this summary to have, with who wrote it
    /// (docs/protocol.md, "Forced compactions").
    pub instructions: Option<&'a Instructions>,
    /// For a second attempt, the facts a first summary did not state: each identifier
    /// with the statement it was said in, in order of first appearance (the summarizer
    /// lists as many as its request has room for). Empty for a first attempt.
    pub missing: &'a [MissingFact],
    /// Where the requests made for it, and their answers' usage, are counted: the
    /// compaction's (docs/protocol.md, "The schema"). `None` counts nothing.
    pub meter: Option<&'a Meter>,
    /// The transcript's marker ([`crate::prompt::draw_marker`]), kept by the caller for
    /// all of a compaction's requests so that a second attempt repeats the first's
    /// prompt and the provider's prompt cache serves it. `None`: the summarizer draws
    /// one per request.
    pub marker: Option<&'a str>,
}

impl<'a> SummaryRequest<'a> {
    /// A first attempt at summarizing `old`, with nothing else to go on.
    pub fn of(old: &'a [Message]) -> Self {
        Self {
            old,
            ..Self::default()
        }
    }

    /// This request with its requests counted into `meter`.
    #[must_use]
    pub fn metered(self, meter: &'a Meter) -> Self {
        Self {
            meter: Some(meter),
            ..self
        }
    }

    /// This request with `marker` for its transcript ([`SummaryRequest::marker`]).
    #[must_use]
    pub fn marked(self, marker: &'a str) -> Self {
        Self {
            marker: Some(marker),
            ..self
        }
    }

    /// This request as a second attempt, told what a first summary did not state.
    #[must_use]
    pub fn again(self, missing: &'a [MissingFact]) -> Self {
        Self { missing, ..self }
    }
}

/// Turns the old part of a session into one [`Summary`].
pub trait Summarizer: Send + Sync {
    /// The summary `request` asks for. A summarizer that has no use for a part of the
    /// request (the extractive one reads no context and no model) ignores it.
    ///
    /// # Errors
    /// [`LlmError`] once retries, if any, are exhausted or the deadline has passed.
    fn summarize<'a>(
        &'a self,
        request: SummaryRequest<'a>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>>;

    /// Whether a second attempt with `model` (the request's; `None` for the configured
    /// one), told the facts a first summary did not state ([`SummaryRequest::again`]),
    /// may write a better one: `false` (the default) for a deterministic summarizer,
    /// which would answer the same, so the fact check does not ask. The LLM summarizer
    /// says no for a while after its second attempts stopped improving.
    fn can_do_better(&self, _model: Option<&str>) -> bool {
        false
    }

    /// How a second attempt with `model` went: whether it stated more of the facts than
    /// the first (an attempt that failed is not reported).
    fn retried(&self, _model: Option<&str>, _improved: bool) {}
}
