//! The summarizer's lab: what measures and tortures the worker, kept out of the worker's
//! crate so none of it ships in the worker's image.
//!
//! # Layout
//! - [`bench`]: our no-op and compaction paths against bare NATS and Postgres, in one
//!   run (`summarizer-lab bench`).
//! - [`chaos`]: simulated agents against worker processes killed at random, ending with
//!   `summarizer check` and an audit (`summarizer-lab chaos`).
//! - [`worker_process`]: the worker processes both run (this binary's `worker` command,
//!   which is the `summarizer worker` of the library).
//! - [`fake_llm`]: an OpenAI-compatible fake with latency and failures.
//! - [`db`]: the throwaway databases both run in.

pub mod bench;
pub mod chaos;
pub mod db;
pub mod fake_llm;
pub mod worker_process;
