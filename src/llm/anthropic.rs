//! Anthropic's Messages API (`POST {LLM_BASE_URL}/messages`), as a [`Chat`] provider.
//!
//! What is retried is decided here, once ([`classify`]): connect errors, timeouts, 429,
//! 500, 502, 503, 504 and 529 (`overloaded_error`), after the server's `retry-after`
//! when it sends one. Never any other 4xx, and never a 429 that says a spend, credit or
//! billing limit was reached: waiting does not lift those, so the worker fails open at
//! once ([`LlmError::Rejected`]). A 400 saying the prompt is too long is
//! [`LlmError::ContextLength`]: a smaller request may fit. The retry loop, deadline,
//! timeouts, metrics and the key's scrubbing are the ones every provider shares
//! (`super::http`, `super::retry`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::chat::{Chat, ChatRequest};
use super::http::{self, Answer};
use crate::config::LlmSettings;
use crate::metrics::Metrics;
use crate::summarizer::LlmError;
use crate::summary::Summary;
use crate::usage::{Meter, Reported};

/// The API version this client speaks (the `anthropic-version` header).
pub const API_VERSION: &str = "2023-06-01";

/// Anthropic's status for `overloaded_error`.
const OVERLOADED: u16 = 529;

pub struct AnthropicClient {
    http: Client,
    metrics: Arc<Metrics>,
    url: String,
    settings: LlmSettings,
}

impl AnthropicClient {
    /// # Errors
    /// When the HTTP client cannot be built (TLS initialisation).
    pub fn new(settings: LlmSettings, metrics: Arc<Metrics>) -> reqwest::Result<Self> {
        let http = Client::builder()
            .connect_timeout(settings.timeout)
            .build()?;
        Ok(Self {
            http,
            metrics,
            url: format!("{}/messages", settings.base_url),
            settings,
        })
    }

    async fn complete(
        &self,
        request: &ChatRequest,
        meter: Option<&Meter>,
    ) -> Result<Summary, LlmError> {
        let model = request.model.as_ref().unwrap_or(&self.settings.model);
        let body = json!({
            "model": model,
            "max_tokens": request.max_tokens,
            "temperature": 0,
            "system": request.system,
            "messages": [{"role": "user", "content": request.user}],
        });
        let attempt = |timeout: Duration| self.attempt(&body, (model, meter), timeout);
        http::with_logged_retries(&self.settings, (&self.metrics, meter), attempt).await
    }

    async fn attempt(
        &self,
        body: &serde_json::Value,
        (model, meter): (&str, Option<&Meter>),
        timeout: Duration,
    ) -> Result<Summary, LlmError> {
        let key = &self.settings.api_key;
        let request = self
            .http
            .post(&self.url)
            .header("x-api-key", key.expose())
            .header("anthropic-version", API_VERSION)
            .json(body);
        let answer = http::send(request, timeout, key).await?;
        if answer.status.is_success() {
            let (usage, parsed) = parse(&answer.body);
            http::answered(&self.metrics, meter, usage);
            let mut summary = parsed?;
            if summary.model.is_empty() {
                model.clone_into(&mut summary.model);
            }
            return Ok(summary);
        }
        let excerpt = http::excerpt(key, &answer.body);
        Err(classify(&answer, excerpt))
    }
}

impl Chat for AnthropicClient {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        meter: Option<&'a Meter>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        AnthropicClient::complete(self, request, meter).boxed()
    }
}

/// The error for a non-success answer; `excerpt` is its body as logs may quote it.
fn classify(answer: &Answer, excerpt: String) -> LlmError {
    let status = answer.status;
    let message = error_message(&answer.body);
    if status == StatusCode::BAD_REQUEST && message.contains("prompt is too long") {
        return LlmError::ContextLength(excerpt);
    }
    let throttled = status == StatusCode::TOO_MANY_REQUESTS;
    if is_retryable(status) && !(throttled && is_spend_limit(&message)) {
        return LlmError::Transient {
            cause: format!("HTTP {}: {excerpt}", status.as_u16()),
            retry_after: answer.retry_after,
        };
    }
    LlmError::Rejected {
        status: status.as_u16(),
        body: excerpt,
    }
}

fn is_retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504 | OVERLOADED)
}

/// A 429 that waiting will not lift: the organisation's spend (or credit, billing,
/// quota) limit, as opposed to a per-minute rate limit.
fn is_spend_limit(message: &str) -> bool {
    ["spend", "credit", "billing", "quota", "usage limit"]
        .iter()
        .any(|words| message.contains(words))
}

/// The error's `error.message`, lower-cased, or the whole body when it is not the API's
/// error shape (a proxy's page, say).
fn error_message(body: &str) -> String {
    #[derive(Deserialize)]
    struct Body {
        error: Detail,
    }
    #[derive(Deserialize)]
    struct Detail {
        #[serde(default)]
        message: String,
    }
    serde_json::from_str::<Body>(body)
        .map_or_else(|_| body.to_owned(), |b| b.error.message)
        .to_lowercase()
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    model: String,
    #[serde(default)]
    content: Vec<Block>,
    usage: Option<Usage>,
    /// `max_tokens` when the answer stopped at the output limit.
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    cache_creation_input_tokens: Option<i64>,
    cache_read_input_tokens: Option<i64>,
}

impl From<Usage> for Reported {
    /// Anthropic's `input_tokens` leaves out the prompt's cached part (read, or written
    /// to the cache): `prompt_tokens` is the whole prompt, as OpenAI counts it, and
    /// `cached_prompt_tokens` the part read from the cache.
    fn from(usage: Usage) -> Self {
        let parts = [
            usage.input_tokens,
            usage.cache_creation_input_tokens,
            usage.cache_read_input_tokens,
        ];
        let prompt_tokens = parts
            .iter()
            .any(Option::is_some)
            .then(|| (parts.iter().flatten()).fold(0i64, |sum, n| sum.saturating_add((*n).max(0))));
        Self {
            prompt_tokens,
            completion_tokens: usage.output_tokens,
            cached_prompt_tokens: usage.cache_read_input_tokens,
        }
    }
}

/// The answer's usage, whatever the answer is (a cut-off one was paid for too), and its
/// text: its first `text` block (a model that thinks first sends other blocks before
/// it).
fn parse(body: &str) -> (Reported, Result<Summary, LlmError>) {
    let mut message: Message = match serde_json::from_str(body) {
        Ok(message) => message,
        Err(e) => {
            let invalid = LlmError::Invalid(format!("not a Messages API answer: {e}"));
            return (Reported::default(), Err(invalid));
        }
    };
    let usage = message.usage.take().map(Reported::from).unwrap_or_default();
    (usage, summary_of(message))
}

fn summary_of(message: Message) -> Result<Summary, LlmError> {
    if message.stop_reason.as_deref() == Some("max_tokens") {
        return Err(LlmError::Truncated("stop_reason: max_tokens".to_owned()));
    }
    let text = message
        .content
        .into_iter()
        .find(|block| block.kind == "text")
        .and_then(|block| block.text)
        .ok_or_else(|| LlmError::Invalid("the answer has no text content".to_owned()))?;
    Ok(Summary {
        text,
        model: message.model,
        ..Summary::default()
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn answer(status: u16, body: &str, retry_after: Option<Duration>) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            retry_after,
            body: body.to_owned(),
        }
    }

    fn error_body(kind: &str, message: &str) -> String {
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
    }

    #[test]
    fn overload_throttling_and_server_errors_are_retried_after_their_wait() {
        let wait = Some(Duration::from_secs(3));
        for status in [429, 500, 502, 503, 504, 529] {
            let body = error_body("overloaded_error", "Overloaded");
            let error = classify(&answer(status, &body, wait), String::new());
            assert!(error.is_transient(), "{status}: {error}");
            assert_eq!(error.retry_after(), wait, "{status}");
        }
    }

    #[test]
    fn other_client_errors_are_not_retried() {
        for status in [400, 401, 403, 404, 408, 413, 422, 501] {
            let body = error_body("invalid_request_error", "bad");
            let error = classify(&answer(status, &body, None), String::new());
            assert!(
                matches!(error, LlmError::Rejected { status: s, .. } if s == status),
                "{status}: {error}"
            );
        }
    }

    #[test]
    fn a_spend_limit_is_not_waited_out_but_a_rate_limit_is() {
        for message in [
            "You have reached your specified API usage limits. You will regain access on 2026-01-01.",
            "Your organization has reached its monthly spend limit.",
            "Your credit balance is too low to access the Anthropic API.",
        ] {
            let body = error_body("rate_limit_error", message);
            let error = classify(&answer(429, &body, None), String::new());
            assert!(
                matches!(error, LlmError::Rejected { status: 429, .. }),
                "{message}"
            );
        }
        let body = error_body(
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        );
        assert!(classify(&answer(429, &body, None), String::new()).is_transient());
    }

    #[test]
    fn a_prompt_too_long_is_a_context_length_error() {
        let body = error_body(
            "invalid_request_error",
            "prompt is too long: 215000 tokens > 200000 maximum",
        );
        let error = classify(&answer(400, &body, None), "quoted".to_owned());
        assert!(
            matches!(&error, LlmError::ContextLength(b) if b == "quoted"),
            "{error}"
        );
    }

    /// `input_tokens` leaves the cached part out: the prompt is all three, and the part
    /// read from the cache is `cached_prompt_tokens`, even of a cut-off answer.
    #[test]
    fn the_whole_prompt_is_counted_with_its_cached_part() {
        let body = json!({
            "type": "message", "model": "claude-x",
            "content": [{"type": "text", "text": "**Investigating:** x"}],
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 100,
                      "cache_read_input_tokens": 3000, "output_tokens": 64}
        });
        let (usage, parsed) = parse(&body.to_string());
        assert!(matches!(parsed, Err(LlmError::Truncated(_))));
        assert_eq!(
            usage,
            Reported {
                prompt_tokens: Some(3112),
                completion_tokens: Some(64),
                cached_prompt_tokens: Some(3000),
            }
        );
    }

    #[test]
    fn the_first_text_block_and_the_usage_are_read() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "**Investigating:** x"}
            ],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 812, "output_tokens": 64}
        });
        let (usage, summary) = parse(&body.to_string());
        let summary = summary.unwrap();
        assert_eq!(
            (summary.text.as_str(), summary.model.as_str()),
            ("**Investigating:** x", "claude-x")
        );
        assert_eq!(
            usage,
            Reported {
                prompt_tokens: Some(812),
                completion_tokens: Some(64),
                cached_prompt_tokens: None,
            }
        );
    }

    #[test]
    fn an_answer_stopped_at_max_tokens_is_truncated_not_a_summary() {
        let body = json!({
            "type": "message", "model": "claude-x",
            "content": [{"type": "text", "text": "**Investigating:** x\n**Key findings:**\n- a\n**Ruled out:** b\n**Current state:** wai"}],
            "stop_reason": "max_tokens",
        });
        assert!(matches!(
            parse(&body.to_string()).1,
            Err(LlmError::Truncated(_))
        ));
    }

    #[test]
    fn an_answer_without_text_is_invalid() {
        for body in [
            "",
            "null",
            "<html>",
            r#"{"content": []}"#,
            r#"{"content": [{"type": "text"}]}"#,
            r#"{"content": [{"type": "text", "text": 42}]}"#,
            r#"{"content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}"#,
            r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
        ] {
            assert!(matches!(parse(body).1, Err(LlmError::Invalid(_))), "{body}");
        }
    }

    proptest! {
        #[test]
        fn no_body_makes_parse_or_classify_panic(body in ".{0,200}", status in 400u16..600) {
            let _ = parse(&body);
            let _ = classify(&answer(status, &body, None), String::new());
        }
    }
}
