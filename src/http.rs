//! The small HTTP surface: `GET /stats` (the aggregates, as `summarizer stats` prints
//! them) and `GET /healthz` (the process is up).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::store::PgStore;

pub fn router(store: PgStore) -> Router {
    Router::new()
        .route("/stats", get(stats))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(store)
}

/// `{"summary": {"total_summarizations": N, "total_chars_compacted": N, ...}}`
async fn stats(State(store): State<PgStore>) -> Response {
    match store.stats().await {
        Ok(stats) => Json(json!({ "summary": stats })).into_response(),
        Err(e) => {
            tracing::error!(error = %crate::error_chain(&e), "GET /stats failed");
            let body = json!({ "error": "the database is unavailable" });
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}
