//! An OpenAI-compatible `/chat/completions` client (OpenAI, vLLM, Ollama, LiteLLM, ...).
//!
//! One place decides what is retried ([`LlmError::is_transient`]): connect errors,
//! timeouts, 408, 429 and 5xx. Waits are exponential with full jitter (a uniform draw in
//! `[0, backoff]`), except that a server's `Retry-After` is honoured up to
//! `LLM_RETRY_AFTER_CAP_MS`. No wait starts that would end past `LLM_DEADLINE_MS`, and
//! each attempt's timeout is cut to the time left.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures_util::future::{BoxFuture, FutureExt};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use super::{LlmError, Summarizer, Summary, prompt};
use crate::config::LlmSettings;
use crate::message::Message;
use crate::metrics::Metrics;

/// Error bodies are quoted in logs and replies only up to this many characters.
const BODY_EXCERPT_CHARS: usize = 300;

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

    async fn complete(&self, old: &[Message]) -> Result<Summary, LlmError> {
        let body = json!({
            "model": self.settings.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": prompt::system_prompt()},
                {"role": "user", "content": prompt::transcript(old)},
            ],
        });
        let deadline = Instant::now() + self.settings.deadline;
        let attempts = AtomicU32::new(0);
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.settings.retry_min_delay)
            .with_max_delay(self.settings.retry_max_delay)
            .with_max_times(self.settings.max_retries);

        let attempt = || async {
            attempts.fetch_add(1, Ordering::Relaxed);
            let left = deadline.saturating_duration_since(Instant::now());
            self.attempt(&body, left.min(self.settings.timeout)).await
        };
        attempt
            .retry(backoff)
            .when(LlmError::is_transient)
            .adjust(|error, backoff| {
                let wait = match error.retry_after() {
                    Some(asked) => asked.min(self.settings.retry_after_cap),
                    None => backoff?.mul_f64(fastrand::f64()),
                };
                // Give up now rather than sleep into the deadline.
                (Instant::now() + wait < deadline).then_some(wait)
            })
            .notify(|error, wait| {
                self.metrics.llm_retried();
                tracing::warn!(
                    attempt = attempts.load(Ordering::Relaxed),
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

impl Summarizer for OpenAiClient {
    fn summarize<'a>(&'a self, old: &'a [Message]) -> BoxFuture<'a, Result<Summary, LlmError>> {
        self.complete(old).boxed()
    }
}

fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// `retry-after-ms` (sent by OpenAI) or `Retry-After` in whole seconds. The HTTP-date
/// form is not honoured: the exponential backoff applies instead.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    number("retry-after-ms")
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .or_else(|| number(RETRY_AFTER.as_str()).map(Duration::from_secs_f64))
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
    fn only_timeouts_throttling_and_server_errors_are_retried() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert!(!is_retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn a_success_without_choices_is_invalid() {
        assert!(matches!(
            parse(r#"{"error": {"message": "overloaded"}}"#),
            Err(LlmError::Invalid(_))
        ));
        assert!(matches!(parse("<html>"), Err(LlmError::Invalid(_))));
        let s = parse(r#"{"model":"m","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#).unwrap();
        assert_eq!(
            (s.text.as_str(), s.prompt_tokens, s.completion_tokens),
            ("hi", Some(3), Some(1))
        );
    }
}
