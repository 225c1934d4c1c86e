//! Integration tests against a real store and the real NATS (127.0.0.1:4222), with
//! wiremock as the LLM. One binary; each test gets its own database and subject.
//!
//! The suite is parameterized by the store, not copied: `SUMMARIZER_TEST_STORE` selects
//! it for the whole run (`helpers::backend`):
//! - `postgres` (the default): the real Postgres at 127.0.0.1:5432, a database per test;
//! - `sqlite`: a SQLite file per test, in `summarizer-tests/` under the temporary
//!   directory (`cargo test --test api` with `SUMMARIZER_TEST_STORE=sqlite`; scripts/test
//!   runs both).
//!
//! Every test runs on both, through `TestDb` (db.rs: the test's own SQL, written once
//! where both databases run it, per backend in helpers named for what they do) and the
//! `SharedStore` of the test's URL. The few about Postgres itself (its connections cut
//! through a proxy, its catalogs, the history of its migrations) begin with
//! `helpers::postgres_only!("<why>")`, which under SQLite says so on stderr and returns.

// Test helpers panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

mod access;
mod budgets;
mod check;
mod clearing;
mod client;
mod compaction;
mod concurrency;
mod control;
mod cost;
mod db;
mod facts;
mod fixtures;
mod fleet;
mod helpers;
mod idle;
mod in_process;
mod isolation;
mod jobs;
mod langchain;
mod llm;
mod operations;
mod outages;
mod precompute;
mod process;
mod providers;
mod recall;
mod rejects;
mod secrets;
mod settings;
mod skips;
mod store;
mod storm;
mod untrusted;
mod wall;
mod words;
