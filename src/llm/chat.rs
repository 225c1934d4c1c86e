//! One chat request to an LLM provider. Providers (OpenAI-compatible, Anthropic) answer
//! it with their own retries within the deadline; what the request holds (budgets,
//! chunks, the prompt) is decided above them, once for every provider.

use futures_util::future::BoxFuture;

use crate::summarizer::LlmError;
use crate::summary::Summary;
use crate::usage::Meter;

/// One request: a system prompt and one user message, answered in at most `max_tokens`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatRequest {
    pub system: String,
    pub user: String,
    /// The most tokens the answer may take (the provider's `max_tokens`).
    pub max_tokens: u32,
    /// A model other than the configured one (per-session settings); `None` for the
    /// configured `LLM_MODEL`.
    pub model: Option<String>,
}

/// A provider that answers one [`ChatRequest`], counting each request it sends (its
/// retries too) and each answer's usage into `meter` (see [`crate::usage`]).
pub trait Chat: Send + Sync {
    /// # Errors
    /// [`LlmError::ContextLength`] when the provider says the request does not fit the
    /// model's context; otherwise as [`super::Summarizer::summarize`].
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        meter: Option<&'a Meter>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>>;
}
