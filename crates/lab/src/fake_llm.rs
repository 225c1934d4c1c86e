//! An OpenAI-compatible LLM on 127.0.0.1 for the chaos run and the benchmark: it answers
//! with a valid summary after a delay drawn from a range, and fails a given share of
//! calls with HTTP 500. Not a test double for unit tests (those use wiremock).
//!
//! Like a model should, it folds an earlier summary in rather than echoing it (the
//! worker refuses an echo, docs/compaction.md "The acceptance gate"): when the transcript
//! holds one, the answer ends with a bullet of the identifiers the newer messages added.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

const SUMMARY: &str = "**Investigating:** chaos incident\n**Key findings:**\n- workers were killed at random\n**Ruled out:** nothing ruled out yet\n**Current state:** still investigating";

pub struct FakeLlm {
    pub url: String,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    failure_rate: f64,
    delay_ms: Range<u64>,
    answered: AtomicU64,
    failed: AtomicU64,
}

impl FakeLlm {
    /// Calls answered so far (failures not included).
    pub fn answered(&self) -> u64 {
        self.counts.answered.load(Ordering::Relaxed)
    }

    pub fn summary(&self) -> String {
        format!(
            "fake LLM answered {} calls and failed {}",
            self.counts.answered.load(Ordering::Relaxed),
            self.counts.failed.load(Ordering::Relaxed)
        )
    }
}

/// Serves on a free port until the process ends.
///
/// # Errors
/// When no port can be bound.
pub async fn start(failure_rate: f64, delay_ms: Range<u64>) -> anyhow::Result<FakeLlm> {
    let counts = Arc::new(Counts {
        failure_rate,
        delay_ms,
        ..Counts::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    let app = Router::new()
        .route("/v1/chat/completions", post(complete))
        .with_state(counts.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(FakeLlm { url, counts })
}

/// The summary to answer to `request`: [`SUMMARY`], with what came since when the
/// transcript holds an earlier summary: identifiers of the messages after it that it
/// does not hold (40 at most).
fn answer(request: &serde_json::Value) -> String {
    let transcript: String = (request["messages"].as_array().into_iter().flatten())
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    let Some((_, rest)) = transcript.split_once("earlier summary]") else {
        return SUMMARY.to_owned();
    };
    let (earlier, since) = rest.split_once("\n[").unwrap_or((rest, ""));
    let held = summarizer::facts::FactSet::of_text(earlier);
    let found = summarizer::facts::FactSet::of_text(since);
    let new: Vec<&str> = (found.iter())
        .map(|(_, fact)| fact)
        .filter(|fact| !held.contains(fact))
        .take(40)
        .collect();
    format!("{SUMMARY}\n- Since then: {}", new.join("; "))
}

async fn complete(
    State(counts): State<Arc<Counts>>,
    Json(request): Json<serde_json::Value>,
) -> Response {
    let delay = if counts.delay_ms.is_empty() {
        counts.delay_ms.start
    } else {
        fastrand::u64(counts.delay_ms.clone())
    };
    tokio::time::sleep(Duration::from_millis(delay)).await;
    if fastrand::f64() < counts.failure_rate {
        counts.failed.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::INTERNAL_SERVER_ERROR, "injected failure").into_response();
    }
    counts.answered.fetch_add(1, Ordering::Relaxed);
    Json(json!({
        "model": "chaos-model",
        "choices": [{"message": {"role": "assistant", "content": answer(&request)}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 30}
    }))
    .into_response()
}
