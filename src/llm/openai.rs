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
use crate::usage::{Meter, Reported};

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

    async fn send(
        &self,
        request: &ChatRequest,
        meter: Option<&Meter>,
    ) -> Result<Summary, LlmError> {
        let body = json!({
            "model": request.model.as_deref().unwrap_or(&self.settings.model),
            "temperature": 0,
            "max_tokens": request.max_tokens,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.user},
            ],
        });
        let attempt = |timeout: Duration| self.attempt(&body, timeout, meter);
        http::with_logged_retries(&self.settings, (&self.metrics, meter), attempt).await
    }

    async fn attempt(
        &self,
        body: &serde_json::Value,
        timeout: Duration,
        meter: Option<&Meter>,
    ) -> Result<Summary, LlmError> {
        let key = &self.settings.api_key;
        let request = self
            .http
            .post(&self.url)
            .bearer_auth(key.expose())
            .json(body);
        let answer = http::send(request, timeout, key).await?;
        if answer.status.is_success() {
            let (usage, parsed) = parse(&answer.body);
            http::answered(&self.metrics, meter, usage);
            let mut summary = parsed?;
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
        meter: Option<&'a Meter>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        self.send(request, meter).boxed()
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
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<i64>,
}

impl From<Usage> for Reported {
    fn from(usage: Usage) -> Self {
        Self {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cached_prompt_tokens: usage.prompt_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// The answer's usage, whatever the answer is (a cut-off one was paid for too), and its
/// summary.
fn parse(body: &str) -> (Reported, Result<Summary, LlmError>) {
    let mut completion: Completion = match serde_json::from_str(body) {
        Ok(completion) => completion,
        Err(e) => {
            let invalid = LlmError::Invalid(format!("not a chat completion: {e}"));
            return (Reported::default(), Err(invalid));
        }
    };
    let usage = completion
        .usage
        .take()
        .map(Reported::from)
        .unwrap_or_default();
    (usage, summary_of(completion))
}

fn summary_of(completion: Completion) -> Result<Summary, LlmError> {
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
    Ok(Summary {
        text,
        model: completion.model,
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
        assert!(matches!(parse(cut).1, Err(LlmError::Truncated(_))));
        let stopped = cut.replace("\"length\"", "\"stop\"");
        assert!(parse(&stopped).1.is_ok());
        let unsaid = cut.replace(r#","finish_reason":"length""#, "");
        assert!(
            parse(&unsaid).1.is_ok(),
            "servers that send no finish_reason"
        );
    }

    #[test]
    fn a_success_without_choices_is_invalid() {
        assert!(matches!(
            parse(r#"{"error": {"message": "overloaded"}}"#).1,
            Err(LlmError::Invalid(_))
        ));
        assert!(matches!(parse("<html>").1, Err(LlmError::Invalid(_))));
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
                matches!(parse(body).1, Err(LlmError::Invalid(_))),
                "{excerpt}"
            );
        }
        let (usage, s) = parse(
            r#"{"model":"m","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        );
        assert_eq!(s.unwrap().text, "hi");
        assert_eq!(
            usage,
            Reported {
                prompt_tokens: Some(3),
                completion_tokens: Some(1),
                cached_prompt_tokens: None,
            }
        );
    }

    /// The usage is read whatever the answer: a cut-off one was paid for too, and the
    /// cached part of the prompt is `prompt_tokens_details.cached_tokens`.
    #[test]
    fn the_usage_is_read_from_every_answer_with_its_cached_part() {
        let cut = r#"{"choices":[{"message":{"content":"**Investigating:** x"},"finish_reason":"length"}],"usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920}}}"#;
        let (usage, parsed) = parse(cut);
        assert!(matches!(parsed, Err(LlmError::Truncated(_))));
        assert_eq!(
            usage,
            Reported {
                prompt_tokens: Some(2006),
                completion_tokens: Some(300),
                cached_prompt_tokens: Some(1920),
            }
        );
        let no_choices = r#"{"choices":[],"usage":{"prompt_tokens":7}}"#;
        assert_eq!(parse(no_choices).0.prompt_tokens, Some(7));
        assert_eq!(parse("<html>").0, Reported::default());
    }
}
