//! LLM summarizers: a provider that answers one [`chat::ChatRequest`] with its own retries
//! ([`OpenAiClient`] for any OpenAI-compatible endpoint, [`AnthropicClient`] for
//! Anthropic's Messages API), and [`LlmSummarizer`] above it, which decides what each
//! request holds: the prompt ([`crate::prompt`]), and within `LLM_MAX_INPUT_TOKENS`
//! ([`tokens`]) the old part whole or in chunks ([`chunks`]). [`Fallback`] has the
//! extractive summarizer ([`crate::extractive`]) stand in when the LLM fails
//! (`LLM_FALLBACK`). All are [`Summarizer`]s; [`from_settings`] picks the one the settings
//! ask for. What every HTTP provider shares is `http`'s.

mod anthropic;
pub mod chat;
mod chunked;
pub mod chunks;
mod fallback;
mod http;
mod openai;
mod retry;

use std::sync::Arc;

pub use anthropic::AnthropicClient;
pub use chunked::LlmSummarizer;
pub use fallback::Fallback;
pub use openai::OpenAiClient;

use crate::config::{FallbackMode, LlmSettings, Provider};
use crate::extractive::Extractive;
use crate::metrics::Metrics;
use crate::summarizer::Summarizer;

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
        Provider::OpenAi => Box::new(
            LlmSummarizer::new(
                Box::new(OpenAiClient::new(settings.clone(), metrics.clone())?),
                settings,
            )
            .with_metrics(metrics.clone()),
        ),
        Provider::Anthropic => Box::new(
            LlmSummarizer::new(
                Box::new(AnthropicClient::new(settings.clone(), metrics.clone())?),
                settings,
            )
            .with_metrics(metrics.clone()),
        ),
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
