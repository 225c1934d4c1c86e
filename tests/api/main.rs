//! Integration tests against the real Postgres (127.0.0.1:5432) and NATS (127.0.0.1:4222),
//! with wiremock as the LLM. One binary; each test gets its own database and subject.

// Test helpers panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

mod access;
mod budgets;
mod check;
mod client;
mod compaction;
mod concurrency;
mod facts;
mod fixtures;
mod fleet;
mod helpers;
mod isolation;
mod jobs;
mod langchain;
mod llm;
mod operations;
mod outages;
mod precompute;
mod process;
mod providers;
mod rejects;
mod secrets;
mod settings;
mod skips;
mod store;
