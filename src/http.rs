//! The small HTTP surface: `GET /stats` (the aggregates, as `summarizer stats` prints
//! them), `GET /healthz` (the process is up) and `GET /readyz` (it should get traffic).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::health::Health;
use crate::store::PgStore;

#[derive(Clone)]
struct AppState {
    store: PgStore,
    health: Arc<Health>,
}

pub fn router(store: PgStore, health: Arc<Health>) -> Router {
    Router::new()
        .route("/stats", get(stats))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { store, health })
}

/// `{"summary": {"total_summarizations": N, "total_chars_compacted": N, ...}}`
async fn stats(State(state): State<AppState>) -> Response {
    match state.store.stats().await {
        Ok(stats) => Json(json!({ "summary": stats })).into_response(),
        Err(e) => {
            tracing::error!(error = %crate::error_chain(&e), "GET /stats failed");
            let body = json!({ "error": "the database is unavailable" });
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// 200 with the readiness checks when ready, 503 with them when not.
async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.health.readiness().await;
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness)).into_response()
}
