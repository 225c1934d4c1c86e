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
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::chat::{Chat, ChatRequest};
use super::retry::{RetryPolicy, with_retries};
use super::{LlmError, Summary};
use crate::config::LlmSettings;
use crate::metrics::Metrics;

/// Error bodies are quoted in logs and replies only up to this many characters.
const BODY_EXCERPT_CHARS: usize = 300;

/// A longer `Retry-After` is read as this. It only has to be finite and above any
/// sensible `LLM_RETRY_AFTER_CAP_MS`: the retry policy cuts the wait to the cap.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 60 * 60);

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
        let policy = RetryPolicy::from(&self.settings);
        let attempt = |left: Duration| self.attempt(&body, left.min(self.settings.timeout));
        with_retries(&policy, attempt, |attempt, error, wait| {
            self.metrics.llm_retried();
            tracing::warn!(
                attempt,
                wait_ms = wait.as_millis() as u64,
                error = %error,
                "LLM call failed, retrying"
            );
        })
        .await
    }

    async fn attempt(
        &self,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Summary, LlmError> {
        let transient = |cause: String| LlmError::Transient {
            cause,
            retry_after: None,
        };
        if timeout.is_zero() {
            return Err(transient("deadline reached".to_owned()));
        }
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(self.settings.api_key.expose())
            .timeout(timeout)
            .json(body)
            .send()
            .await
            .map_err(|e| transient(self.scrub(crate::error_chain(&e.without_url()))))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response
            .text()
            .await
            .map_err(|e| transient(self.scrub(crate::error_chain(&e.without_url()))))?;
        if status.is_success() {
            let mut summary = parse(&text)?;
            if summary.model.is_empty() {
                summary.model.clone_from(&self.settings.model);
            }
            return Ok(summary);
        }
        let body = self.excerpt(&text);
        if is_context_length(status, &text) {
            return Err(LlmError::ContextLength(format!(
                "HTTP {}: {body}",
                status.as_u16()
            )));
        }
        if is_retryable(status) {
            Err(LlmError::Transient {
                cause: format!("HTTP {}: {body}", status.as_u16()),
                retry_after,
            })
        } else {
            Err(LlmError::Rejected {
                status: status.as_u16(),
                body,
            })
        }
    }

    fn excerpt(&self, body: &str) -> String {
        let mut excerpt: String = body.chars().take(BODY_EXCERPT_CHARS).collect();
        if excerpt.len() < body.len() {
            excerpt.push('…');
        }
        self.scrub(excerpt)
    }

    /// Removes the API key should a server or proxy have echoed it.
    fn scrub(&self, text: String) -> String {
        let key = self.settings.api_key.expose();
        if key.is_empty() || !text.contains(key) {
            text
        } else {
            text.replace(key, "[redacted]")
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

/// `retry-after-ms` (sent by OpenAI) or `Retry-After` in seconds, never panicking
/// whatever the header holds: a number above [`RETRY_AFTER_MAX`] reads as that, and
/// anything that is not a finite, non-negative number is ignored. The
/// HTTP-date form is not honoured either: the exponential backoff applies instead. The
/// retry policy then clamps the wait to its own bounds.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    number("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| number(RETRY_AFTER.as_str()))
        .map(seconds)
}

/// A number of seconds as a wait in `[0, RETRY_AFTER_MAX]`. It is clamped while still an
/// `f64`: `Duration::from_secs_f64` panics on values past `u64::MAX` seconds (and on NaN,
/// which reads as zero here, as does `-0`).
fn seconds(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs.min(RETRY_AFTER_MAX.as_secs_f64()))
        .map_or(RETRY_AFTER_MAX, |wait| wait.min(RETRY_AFTER_MAX))
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
    let text = completion
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.message.content)
        .ok_or_else(|| LlmError::Invalid("the completion has no message content".to_owned()))?;
    let usage = completion.usage;
    Ok(Summary {
        text,
        model: completion.model,
        prompt_tokens: usage.as_ref().and_then(|u| u.prompt_tokens),
        completion_tokens: usage.as_ref().and_then(|u| u.completion_tokens),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn retry_after_reads_milliseconds_then_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        headers.remove("retry-after-ms");
        headers.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn absurd_retry_after_values_are_saturated_or_ignored() {
        let read = |name: &'static str, value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(name, value.parse().unwrap());
            retry_after(&headers)
        };
        for (name, value) in [
            ("retry-after", "100000000000000000000"),
            ("retry-after", "1e308"),
            ("retry-after-ms", "1e30"),
            ("retry-after-ms", "1.7976931348623157e308"),
        ] {
            assert_eq!(read(name, value), Some(RETRY_AFTER_MAX), "{name}: {value}");
        }
        for (name, value) in [
            ("retry-after", "-1"),
            ("retry-after", "NaN"),
            ("retry-after-ms", "inf"),
            ("retry-after-ms", "-infinity"),
            ("retry-after", ""),
            ("retry-after", "soon"),
        ] {
            assert_eq!(read(name, value), None, "{name}: {value}");
        }
        assert_eq!(read("retry-after", "-0"), Some(Duration::ZERO));
        assert_eq!(
            read("retry-after-ms", "0.5"),
            Some(Duration::from_micros(500))
        );
    }

    /// Header values as a proxy might send them: numbers of any size and form, and any
    /// bytes a header may hold.
    fn header_value() -> impl Strategy<Value = HeaderValue> {
        let numeric = prop_oneof![
            any::<f64>().prop_map(|f| f.to_string()),
            any::<f64>().prop_map(|f| format!("{f:e}")),
            any::<u128>().prop_map(|n| n.to_string()),
            "[-+ ]?[0-9]{0,40}(\\.[0-9]{0,10})?([eE][-+]?[0-9]{1,4})?",
            "(?i)[-+]?(inf|infinity|nan)",
        ]
        .prop_map(|s| HeaderValue::from_str(&s).unwrap());
        let bytes = prop::collection::vec(any::<u8>(), 0..64)
            .prop_filter_map("not a header value", |b| HeaderValue::from_bytes(&b).ok());
        prop_oneof![numeric, bytes]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_retry_after_header_panics_or_asks_past_the_bound(
            ms in proptest::option::of(header_value()),
            secs in proptest::option::of(header_value()),
        ) {
            let mut headers = HeaderMap::new();
            if let Some(v) = ms {
                headers.insert("retry-after-ms", v);
            }
            if let Some(v) = secs {
                headers.insert(RETRY_AFTER, v);
            }
            if let Some(wait) = retry_after(&headers) {
                prop_assert!(wait <= RETRY_AFTER_MAX, "{wait:?}");
            }
        }

        #[test]
        fn a_plain_number_of_seconds_is_read_as_sent(secs in 0u64..=RETRY_AFTER_MAX.as_secs()) {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            prop_assert_eq!(retry_after(&headers), Some(Duration::from_secs(secs)));
        }

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
        let s = parse(r#"{"model":"m","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#).unwrap();
        assert_eq!(
            (s.text.as_str(), s.prompt_tokens, s.completion_tokens),
            ("hi", Some(3), Some(1))
        );
    }
}
