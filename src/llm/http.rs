//! What every provider's HTTP client shares: sending one attempt within its timeout,
//! reading the server's `Retry-After`, quoting an error body, and keeping the API key out
//! of anything an error carries. Providers differ in their URLs, headers, bodies and in
//! which statuses they retry; none of that is here.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{RequestBuilder, StatusCode};

use super::retry::{RetryPolicy, with_retries};
use crate::config::{LlmSettings, Secret};
use crate::metrics::Metrics;
use crate::summarizer::LlmError;
use crate::usage::{Meter, Reported};

/// Error bodies are quoted in logs and replies only up to this many characters.
const BODY_EXCERPT_CHARS: usize = 300;

/// No more of a response body is read. An answer is a summary of at most
/// `SUMMARY_MAX_CHARS / 3` tokens (kilobytes) and an error body is quoted in part, so
/// this is far above anything a working server sends; a server that sends more (a
/// runaway generation, a broken proxy) must not have the worker hold it in memory, up
/// to `WORKER_CONCURRENCY` times over.
const MAX_BODY_BYTES: usize = 8 << 20;

/// A longer `Retry-After` is read as this. It only has to be finite and above any
/// sensible `LLM_RETRY_AFTER_CAP_MS`: the retry policy cuts the wait to the cap.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// What a server answered to one attempt.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// The wait the server asked for, read by [`retry_after`].
    pub retry_after: Option<Duration>,
    pub body: String,
}

/// Sends one attempt, headers and body within `timeout`, reading at most
/// [`MAX_BODY_BYTES`] of the body (an error body beyond that is cut, for its excerpt).
///
/// # Errors
/// [`LlmError::Transient`] when no answer came (connect error, timeout, a body cut off)
/// or `timeout` is zero (the deadline has passed); the cause has the key scrubbed.
/// [`LlmError::Invalid`] when a success's body is larger than [`MAX_BODY_BYTES`].
pub async fn send(
    request: RequestBuilder,
    timeout: Duration,
    key: &Secret,
) -> Result<Answer, LlmError> {
    let transient = |cause: String| LlmError::Transient {
        cause,
        retry_after: None,
    };
    if timeout.is_zero() {
        return Err(transient("deadline reached".to_owned()));
    }
    let failed = |e: reqwest::Error| transient(scrub(key, crate::error_chain(&e.without_url())));
    let mut response = request.timeout(timeout).send().await.map_err(failed)?;
    let status = response.status();
    let retry_after = retry_after(response.headers());
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        let room = MAX_BODY_BYTES - body.len();
        if chunk.len() > room {
            if status.is_success() {
                return Err(LlmError::Invalid(format!(
                    "the response body is larger than {MAX_BODY_BYTES} bytes; no summary is \
                     that long"
                )));
            }
            body.extend_from_slice(&chunk[..room]);
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Answer {
        status,
        retry_after,
        body: String::from_utf8(body)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    })
}

/// Runs `attempt` under the settings' retry policy, counting each request into `meter`
/// and the metrics as it is sent, and counting and logging each retry. `attempt` gets
/// its own timeout: `LLM_TIMEOUT_MS`, cut to the time left.
///
/// # Errors
/// The last attempt's error.
pub async fn with_logged_retries<T, A, Fut>(
    settings: &LlmSettings,
    (metrics, meter): (&Metrics, Option<&Meter>),
    mut attempt: A,
) -> Result<T, LlmError>
where
    A: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, LlmError>>,
{
    let policy = RetryPolicy::from(settings);
    let attempt = |left: Duration| {
        metrics.llm_requested();
        if let Some(meter) = meter {
            meter.sent();
        }
        attempt(left.min(settings.timeout))
    };
    with_retries(&policy, attempt, |attempt, error, wait| {
        metrics.llm_retried();
        tracing::warn!(
            attempt,
            wait_ms = wait.as_millis() as u64,
            error = %error,
            "LLM call failed, retrying"
        );
    })
    .await
}

/// An answer's `usage`, as the provider reported it, counted into `meter` and the
/// metrics, whatever becomes of the answer.
pub fn answered(metrics: &Metrics, meter: Option<&Meter>, usage: Reported) {
    metrics.llm_answered(usage);
    if let Some(meter) = meter {
        meter.answered(usage);
    }
}

/// The start of an error body, for logs and replies, with the key scrubbed.
pub fn excerpt(key: &Secret, body: &str) -> String {
    let mut excerpt: String = body.chars().take(BODY_EXCERPT_CHARS).collect();
    if excerpt.len() < body.len() {
        excerpt.push('…');
    }
    scrub(key, excerpt)
}

/// Removes the API key should a server or proxy have echoed it.
pub fn scrub(key: &Secret, text: String) -> String {
    let key = key.expose();
    if key.is_empty() || !text.contains(key) {
        text
    } else {
        text.replace(key, "[redacted]")
    }
}

/// `retry-after-ms` (sent by OpenAI) or `Retry-After` in seconds, never panicking
/// whatever the header holds: a number above [`RETRY_AFTER_MAX`] reads as that, and
/// anything that is not a finite, non-negative number is ignored. The
/// HTTP-date form is not honoured either: the exponential backoff applies instead. The
/// retry policy then clamps the wait to its own bounds.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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
    }

    #[test]
    fn an_echoed_key_is_scrubbed_from_excerpts() {
        let key = Secret::new("sk-live-123");
        let quoted = excerpt(&key, "bad gateway for key sk-live-123");
        assert_eq!(quoted, "bad gateway for key [redacted]");
        let long = format!("sk-live-123 {}", "x".repeat(1000));
        let quoted = excerpt(&key, &long);
        assert!(
            quoted.starts_with("[redacted] x") && quoted.ends_with('…'),
            "{quoted}"
        );
        assert_eq!(scrub(&Secret::default(), "as is".to_owned()), "as is");
    }
}
