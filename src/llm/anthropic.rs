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

    async fn complete(&self, request: &ChatRequest) -> Result<Summary, LlmError> {
        let model = request.model.as_ref().unwrap_or(&self.settings.model);
        let body = json!({
            "model": model,
            "max_tokens": request.max_tokens,
            "temperature": 0,
            "system": request.system,
            "messages": [{"role": "user", "content": request.user}],
        });
        let attempt = |timeout: Duration| self.attempt(&body, model, timeout);
        http::with_logged_retries(&self.settings, &self.metrics, attempt).await
    }

    async fn attempt(
        &self,
        body: &serde_json::Value,
        model: &str,
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
            let mut summary = parse(&answer.body)?;
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
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        AnthropicClient::complete(self, request).boxed()
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
}

/// The answer's text: its first `text` block (a model that thinks first sends other
/// blocks before it).
fn parse(body: &str) -> Result<Summary, LlmError> {
    let message: Message = serde_json::from_str(body)
        .map_err(|e| LlmError::Invalid(format!("not a Messages API answer: {e}")))?;
    if message.stop_reason.as_deref() == Some("max_tokens") {
        return Err(LlmError::Truncated("stop_reason: max_tokens".to_owned()));
    }
    let text = message
        .content
        .into_iter()
        .find(|block| block.kind == "text")
        .and_then(|block| block.text)
        .ok_or_else(|| LlmError::Invalid("the answer has no text content".to_owned()))?;
    let usage = message.usage;
    Ok(Summary {
        text,
        model: message.model,
        prompt_tokens: usage.as_ref().and_then(|u| u.input_tokens),
        completion_tokens: usage.as_ref().and_then(|u| u.output_tokens),
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
        let summary = parse(&body.to_string()).unwrap();
        assert_eq!(
            (
                summary.text.as_str(),
                summary.model.as_str(),
                summary.prompt_tokens,
                summary.completion_tokens
            ),
            ("**Investigating:** x", "claude-x", Some(812), Some(64))
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
            parse(&body.to_string()),
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
            assert!(matches!(parse(body), Err(LlmError::Invalid(_))), "{body}");
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
