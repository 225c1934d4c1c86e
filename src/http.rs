//! The small HTTP surface: `GET /stats` (the aggregates, as `summarizer stats` prints
//! them), `GET /healthz` (the process is up), `GET /readyz` (it should get traffic) and
//! `GET /metrics` (Prometheus).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::health::Health;
use crate::metrics::Metrics;
use crate::store::SharedStore;

#[derive(Clone)]
struct AppState {
    store: SharedStore,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

pub fn router(store: SharedStore, health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/stats", get(stats))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState {
            store,
            health,
            metrics,
        })
}

/// Prometheus's scrape: OpenMetrics text.
async fn metrics_text(State(state): State<AppState>) -> Response {
    let body = state.metrics.render(state.store.connections());
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

#[derive(serde::Deserialize)]
struct StatsQuery {
    /// Days of the per-day series (default 30, at most 366).
    days: Option<i32>,
}

/// `{"summary": {"total_summarizations": N, "total_chars_compacted": N, ...}, "daily": [...]}`
async fn stats(State(state): State<AppState>, Query(query): Query<StatsQuery>) -> Response {
    let days = query.days.unwrap_or(30).clamp(1, 366);
    match state.store.stats(days).await {
        Ok(stats) => Json(stats).into_response(),
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
