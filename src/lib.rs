//! A worker fleet that keeps LLM-agent conversations inside their context window.
//!
//! Before each turn an agent asks, over NATS, whether its session needs compacting. A
//! worker checks the session's size in Postgres and, when it is over the threshold,
//! replaces the oldest part of the history with one structured summary. See
//! `docs/protocol.md` for the contract and README.md for running it.
//!
//! # Layout
//! Each module imports only modules listed before it here, and at every depth no module
//! imports a sibling that imports it back (a unit test, `layering`, holds the crate to
//! both). The pure core first (no I/O):
//! - [`message`]: a session's messages, as the public `messages` table holds them;
//!   [`redact`]: the credential shapes kept out of what the worker derives.
//! - [`outcome`]: what happened to an event: the vocabulary of replies, logs and tests;
//!   [`protocol`]: the wire request and reply, with validation. Both come from the
//!   `summarizer-client` crate, which agents embed, so the two sides share one contract.
//! - [`summary`]: the summary record, the seed's template, [`summary::accept`], which
//!   every summary passes, and [`summary::finish`], which gives it its last line;
//!   [`facts`]: the identifiers a summary must keep, and its recall of them; [`prompt`]:
//!   what an LLM is asked.
//! - [`config`]: typed settings from the environment, `.env` and a file, validated once.
//! - [`overrides`]: the limits one event runs with (request, then session, then
//!   configuration, clamped).
//! - [`fact_check`]: what is done about a summary that lost facts.
//! - [`summarizer`]: the interface every summarizer implements; [`extractive`]: the
//!   offline one, which needs no key.
//! - [`compaction`]: the pure steps of one compaction: the split, clearing, token counts,
//!   the plan, and the record the store commits with the usage event's metadata.
//!
//! Then the edges that wrap it:
//! - [`telemetry`]: logs, with secrets scrubbed and text-log escaping; [`metrics`]: the
//!   Prometheus registry.
//! - [`llm`]: the summarizer over the OpenAI-compatible and Anthropic providers that keeps
//!   every request within a token budget (chunks, clipping), and the extractive fallback.
//! - [`store`]: the `Store` interface and its two backends, Postgres and SQLite: counters,
//!   the lease, the fenced commit, the aggregates.
//! - [`health`]: readiness; [`worker`]: one event start to finish
//!   ([`worker::Worker::process`]); [`recall`]: a recall request, answered from the
//!   session's archive.
//! - [`transport`]: how events arrive: core NATS requests on the queue group, bounded,
//!   with drain on shutdown ([`transport::requests`]), and durable jobs on JetStream
//!   ([`transport::jetstream`]).
//! - [`client`]: what Rust agents call before a turn (`summarizer-client`'s); never
//!   fails, always "proceed".
//! - [`http`]: `GET /stats`, `/healthz`, `/readyz`, `/metrics`.
//! - [`audit`]: invariants over the whole database (`summarizer check`).
//! - [`eval`]: `summarizer eval`, fact recall measured on a corpus of scripted
//!   investigations built into the binary.
//! - [`app`]: wiring a worker from settings; [`cli`] and [`demo`]: the binary's commands.
//!
//! The benchmark, the chaos run and the fakes live in the `summarizer-lab` crate
//! (`crates/lab`), which never ships with the worker.
//!
//! # Files
//! A module is one file (`message.rs`) until it needs a second: its submodules, or its
//! unit tests once they would push it past a few hundred lines. It is then a folder
//! whose `mod.rs` is the module (`worker/mod.rs`, `compaction/split/mod.rs`) and whose
//! unit tests are `tests.rs` beside it. Unit tests otherwise end the module's file, in
//! `#[cfg(test)] mod tests`. A folder beside a file holds data, never code (the
//! evaluation corpus's scripts, `eval/corpus/*.json`).

pub mod app;
pub mod audit;
pub mod cli;
pub mod client;
pub mod compaction;
pub mod config;
pub mod demo;
pub mod eval;
pub mod extractive;
pub mod fact_check;
pub mod facts;
pub mod health;
pub mod http;
pub mod llm;
pub mod message;
pub mod metrics;
pub mod outcome;
pub mod overrides;
pub mod prompt;
pub mod protocol;
pub mod recall;
pub mod redact;
pub mod store;
pub mod summarizer;
pub mod summary;
pub mod tables;
pub mod telemetry;
pub mod transport;
pub mod usage;
pub mod worker;

pub use summarizer_client::error_chain;

#[cfg(test)]
mod layering;
