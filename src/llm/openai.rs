//! An OpenAI-compatible `/chat/completions` client (OpenAI, vLLM, Ollama, LiteLLM, ...).
//!
//! One place decides what is retried ([`LlmError::is_transient`]): connect errors,
//! timeouts, 408, 429 and 5xx. How long to wait, and whether to try again at all, is
//! [`super::retry`]'s: at most `1 + LLM_MAX_RETRIES` attempts, waits exponential with full
//! jitter or, when the server sends `Retry-After`, its wait clamped to
//! `[LLM_RETRY_MIN_DELAY_MS, LLM_RETRY_AFTER_CAP_MS]`, none ending past `LLM_DEADLINE_MS`.
//! Each attempt's timeout is cut to the time left. Nothing a server sends (headers,
//! status, body) can panic here: it is an answer or an [`LlmError`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::chat::{Chat, ChatRequest};
use super::http;
use crate::config::LlmSettings;
use crate::metrics::Metrics;
use crate::summarizer::LlmError;
use crate::summary::Summary;

pub struct OpenAiClient {
    http: Client,
    metrics: Arc<Metrics>,
    url: String,
    settings: LlmSettings,
}

impl OpenAiClient {
    /// # Errors
    /// When the HTTP client cannot be built (TLS initialisation).
    pub fn new(settings: LlmSettings, metrics: Arc<Metrics>) -> reqwest::Result<Self> {
        let http = Client::builder()
            .connect_timeout(settings.timeout)
            .build()?;
        Ok(Self {
            http,
            metrics,
            url: format!("{}/chat/completions", settings.base_url),
            settings,
        })
    }

    async fn send(&self, request: &ChatRequest) -> Result<Summary, LlmError> {
        let body = json!({
            "model": request.model.as_deref().unwrap_or(&self.settings.model),
            "temperature": 0,
            "max_tokens": request.max_tokens,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.user},
            ],
        });
        let attempt = |timeout: Duration| self.attempt(&body, timeout);
        http::with_logged_retries(&self.settings, &self.metrics, attempt).await
    }

    async fn attempt(
        &self,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Summary, LlmError> {
        let key = &self.settings.api_key;
        let request = self
            .http
            .post(&self.url)
            .bearer_auth(key.expose())
            .json(body);
        let answer = http::send(request, timeout, key).await?;
        if answer.status.is_success() {
            let mut summary = parse(&answer.body)?;
            if summary.model.is_empty() {
                summary.model.clone_from(&self.settings.model);
            }
            return Ok(summary);
        }
        let body = http::excerpt(key, &answer.body);
        if is_context_length(answer.status, &answer.body) {
            return Err(LlmError::ContextLength(format!(
                "HTTP {}: {body}",
                answer.status.as_u16()
            )));
        }
        if is_retryable(answer.status) {
            Err(LlmError::Transient {
                cause: format!("HTTP {}: {body}", answer.status.as_u16()),
                retry_after: answer.retry_after,
            })
        } else {
            Err(LlmError::Rejected {
                status: answer.status.as_u16(),
                body,
            })
        }
    }
}

impl Chat for OpenAiClient {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        self.send(request).boxed()
    }
}

/// Whether a refusal says the request is larger than the model's context: OpenAI's
/// error code `context_length_exceeded`, or the wording OpenAI-compatible servers (vLLM,
/// LiteLLM, Ollama) use for it ("maximum context length is ...", "context length
/// exceeded"). Such a request may succeed smaller, unlike other 4xx.
fn is_context_length(status: StatusCode, body: &str) -> bool {
    if status != StatusCode::BAD_REQUEST && status != StatusCode::PAYLOAD_TOO_LARGE {
        return false;
    }
    let code = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/code")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        });
    if code.as_deref() == Some("context_length_exceeded") {
        return true;
    }
    let lower = body.to_ascii_lowercase();
    [
        "maximum context length",
        "context length exceeded",
        "context_length_exceeded",
    ]
    .iter()
    .any(|phrase| lower.contains(phrase))
}

fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

#[derive(Deserialize)]
struct Completion {
    #[serde(default)]
    model: String,
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
    /// `length` when the answer stopped at `max_tokens`.
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
}

fn parse(body: &str) -> Result<Summary, LlmError> {
    let completion: Completion = serde_json::from_str(body)
        .map_err(|e| LlmError::Invalid(format!("not a chat completion: {e}")))?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| LlmError::Invalid("the completion has no message content".to_owned()))?;
    if choice.finish_reason.as_deref() == Some("length") {
        return Err(LlmError::Truncated("finish_reason: length".to_owned()));
    }
    let text = choice
        .message
        .content
        .ok_or_else(|| LlmError::Invalid("the completion has no message content".to_owned()))?;
    let usage = completion.usage;
    Ok(Summary {
        text,
        model: completion.model,
        prompt_tokens: usage.as_ref().and_then(|u| u.prompt_tokens),
        completion_tokens: usage.as_ref().and_then(|u| u.completion_tokens),
        ..Summary::default()
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_body_makes_parse_panic(body in ".{0,200}") {
            let _ = parse(&body);
        }
    }

    #[test]
    fn only_timeouts_throttling_and_server_errors_are_retried() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert!(!is_retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn context_length_refusals_are_told_apart_from_other_4xx() {
        let openai = r#"{"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 650000 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}"#;
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens","type":"BadRequestError","code":400}"#;
        assert!(is_context_length(StatusCode::BAD_REQUEST, openai));
        assert!(is_context_length(StatusCode::BAD_REQUEST, vllm));
        assert!(!is_context_length(
            StatusCode::BAD_REQUEST,
            r#"{"error": {"message": "Invalid model", "code": "model_not_found"}}"#
        ));
        assert!(!is_context_length(StatusCode::UNAUTHORIZED, openai));
        assert!(!is_context_length(StatusCode::BAD_REQUEST, "<html>"));
    }

    #[test]
    fn an_answer_cut_off_at_max_tokens_is_truncated_not_a_summary() {
        let cut = r#"{"choices":[{"message":{"content":"**Investigating:** x\n**Key findings:**\n- a\n**Ruled out:** b\n**Current state:** requests wait up to 29."},"finish_reason":"length"}]}"#;
        assert!(matches!(parse(cut), Err(LlmError::Truncated(_))));
        let stopped = cut.replace("\"length\"", "\"stop\"");
        assert!(parse(&stopped).is_ok());
        let unsaid = cut.replace(r#","finish_reason":"length""#, "");
        assert!(parse(&unsaid).is_ok(), "servers that send no finish_reason");
    }

    #[test]
    fn a_success_without_choices_is_invalid() {
        assert!(matches!(
            parse(r#"{"error": {"message": "overloaded"}}"#),
            Err(LlmError::Invalid(_))
        ));
        assert!(matches!(parse("<html>"), Err(LlmError::Invalid(_))));
        let huge = "\u{fffd}".repeat(1 << 20);
        for body in [
            "",
            "null",
            "[]",
            r#"{"choices": []}"#,
            r#"{"choices": [{"message": {}}]}"#,
            r#"{"choices": [{"message": {"content": null}}]}"#,
            r#"{"choices": [{"message": {"content": 42}}]}"#,
            r#"{"choices": [{"message": {"content": ["a"]}}]}"#,
            r#"{"choices": "no"}"#,
            &huge,
        ] {
            let excerpt: String = body.chars().take(40).collect();
            assert!(
                matches!(parse(body), Err(LlmError::Invalid(_))),
                "{excerpt}"
            );
        }
        let s = parse(r#"{"model":"m","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#).unwrap();
        assert_eq!(
            (s.text.as_str(), s.prompt_tokens, s.completion_tokens),
            ("hi", Some(3), Some(1))
        );
    }
}
