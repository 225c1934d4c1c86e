//! The summarizer's wire contract, and the client Rust agents call before every turn.
//!
//! The worker uses these very types for its requests and replies, so an agent built on
//! this crate and the fleet cannot disagree about the format. The crate depends on
//! serde, serde_json, async-nats and tokio, plus sha2 and nuid for job subjects and ids.
//!
//! # Layout
//! - [`outcome`]: what happened to an event ([`Outcome`]), and the reply's `status` and
//!   `reason` ([`Status`], [`Reason`]).
//! - [`protocol`]: the request and the reply as JSON, with the request's validation.
//! - [`client`]: [`TurnClient`], which never fails its caller: whatever goes wrong, the
//!   answer is "proceed".
//! - [`jobs`]: [`JobPublisher`], which publishes the same request as a durable job to
//!   the fleet's JetStream work queue.
//! - [`recall`]: the request and reply on the recall subject, and [`RecallClient`], with
//!   which an agent searches and fetches what compaction archived.

pub mod client;
pub mod jobs;
pub mod outcome;
pub mod protocol;
pub mod recall;

use std::hash::{BuildHasher, Hasher};

pub use client::{Decision, TurnClient};
pub use jobs::{JobPublisher, Published, job_subject};
pub use outcome::{Compaction, Outcome, Reason, Status};
pub use protocol::{InstructionsFrom, InvalidRequest, Overrides, Reply, Request};
pub use recall::{
    RecallClient, RecallError, RecallReply, RecallRequest, RecallStatus, Recalled, Wanted,
};

/// A request id for the logs: 8 hex digits, random enough to tell events apart.
pub fn new_request_id() -> String {
    // The standard library's per-instance random hash keys are the one source of
    // randomness this crate has without a dependency; ids need no more.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{:08x}", random as u32)
}

/// An error and its sources, joined by ": ", for one log line or reply message.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_are_eight_hex_digits_and_differ() {
        let ids: std::collections::HashSet<String> =
            (0..100).map(|_| super::new_request_id()).collect();
        assert!(ids.len() > 90, "{} distinct of 100", ids.len());
        assert!(
            ids.iter()
                .all(|id| id.len() == 8 && id.chars().all(|c| c.is_ascii_hexdigit()))
        );
    }
}
