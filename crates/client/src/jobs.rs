//! Jobs: turn-starting requests published to the fleet's JetStream work queue
//! (`TRANSPORT=jetstream` or `both`), for publishers that need the request to survive a
//! fleet that is down or busy: a batch that compacts 10,000 sessions, a scheduler.
//!
//! A job is the request's JSON, published to `<prefix>.<hex SHA-256 of the session id>`
//! (a session id need not be a valid subject token) with a `Nats-Msg-Id` header, so
//! that the stream drops a duplicate published within its window. [`JobPublisher`] does
//! both and waits for the stream's acknowledgement: when it returns `Ok`, the job is
//! stored and will be processed or dead-lettered.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use sha2::{Digest, Sha256};

use crate::protocol::Request;

/// `JETSTREAM_SUBJECT_PREFIX`'s default.
pub const DEFAULT_SUBJECT_PREFIX: &str = "summarizer.jobs";
/// The header a job's reply subject goes in: a job pulled from a stream has no NATS
/// reply of its own.
pub const REPLY_TO_HEADER: &str = "Reply-To";

/// The subject a job for `session_id` is published to.
pub fn job_subject(prefix: &str, session_id: &str) -> String {
    let digest = Sha256::digest(session_id.as_bytes());
    let mut subject = String::with_capacity(prefix.len() + 1 + 64);
    subject.push_str(prefix);
    subject.push('.');
    for byte in digest {
        subject.push_str(&format!("{byte:02x}"));
    }
    subject
}

/// Whether some subject matches both patterns (NATS wildcards: `*` one token, `>` one or
/// more trailing tokens). The worker refuses a job stream whose subjects overlap the
/// request subject: the stream would answer each request with its publish ack.
pub fn subjects_overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<_>, Vec<_>) = (a.split('.').collect(), b.split('.').collect());
    let mut i = 0;
    loop {
        match (a.get(i), b.get(i)) {
            (Some(&">"), Some(_)) | (Some(_), Some(&">")) => return true,
            (None, None) => return true,
            (Some(x), Some(y)) if x == y || *x == "*" || *y == "*" => i += 1,
            _ => return false,
        }
    }
}

/// Why a job was not stored.
#[derive(Debug)]
pub struct PublishError(String);

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the job was not stored: {}", self.0)
    }
}

impl std::error::Error for PublishError {}

/// Publishes jobs to the work queue under one subject prefix.
#[derive(Clone, Debug)]
pub struct JobPublisher {
    jetstream: jetstream::Context,
    prefix: String,
}

/// A stored job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The `Nats-Msg-Id` it was published with.
    pub msg_id: String,
    /// Its sequence in the stream.
    pub sequence: u64,
    /// The stream had a job with this `Nats-Msg-Id` within its duplicate window, so
    /// this one was dropped.
    pub duplicate: bool,
}

impl JobPublisher {
    pub fn new(nats: async_nats::Client, prefix: impl Into<String>) -> Self {
        let mut jetstream = jetstream::new(nats);
        jetstream.set_timeout(Duration::from_secs(5));
        Self {
            jetstream,
            prefix: prefix.into(),
        }
    }

    /// Publishes `request` as a job with `msg_id` as its `Nats-Msg-Id` (a fresh unique id
    /// when `None`: give one, such as `"<batch>:<session>"`, to make retries of the same
    /// publish safe), and `reply_to` as its `Reply-To`, where the worker sends the same
    /// reply a request gets. Waits for the stream's acknowledgement.
    ///
    /// # Errors
    /// When no stream takes the subject (no worker in `jetstream` mode has created it),
    /// or NATS does not answer.
    pub async fn publish(
        &self,
        request: &Request,
        msg_id: Option<&str>,
        reply_to: Option<&str>,
    ) -> Result<Published, PublishError> {
        let msg_id = msg_id.map_or_else(|| nuid::next().to_string(), str::to_owned);
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id.as_str());
        if let Some(reply_to) = reply_to {
            headers.insert(REPLY_TO_HEADER, reply_to);
        }
        let subject = job_subject(&self.prefix, &request.session_id);
        let ack = self
            .jetstream
            .publish_with_headers(subject, headers, request.encode().into())
            .await
            .map_err(|e| PublishError(e.to_string()))?
            .await
            .map_err(|e| PublishError(e.to_string()))?;
        Ok(Published {
            msg_id,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// A job that asks to compact `session_id` if it is over its threshold.
    ///
    /// # Errors
    /// As [`JobPublisher::publish`].
    pub async fn compact(
        &self,
        session_id: &str,
        msg_id: Option<&str>,
    ) -> Result<Published, PublishError> {
        let request = Request {
            session_id: session_id.to_owned(),
            request_id: Some(crate::new_request_id()),
            ..Request::default()
        };
        self.publish(&request, msg_id, None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_subject_is_the_prefix_and_the_hex_digest_of_the_session() {
        // sha256("s1"), as `printf s1 | sha256sum` and Python's hashlib give it.
        assert_eq!(
            job_subject("summarizer.jobs", "s1"),
            "summarizer.jobs.e8bc163c82eee18733288c7d4ac636db3a6deb013ef2d37b68322be20edc45cc"
        );
        let subject = job_subject("p", "a session with spaces.and.dots >*");
        assert!(subject.starts_with("p."));
        assert_eq!(subject.len(), 2 + 64);
        assert!(subject[2..].chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn overlapping_subjects_are_told_apart() {
        for (a, b) in [
            ("summarizer.jobs.>", "summarizer.jobs.x"),
            ("summarizer.>", "summarizer.jobs.>"),
            ("summarizer.*.x", "summarizer.jobs.>"),
            ("a.b", "a.b"),
            ("*.b", "a.*"),
            (">", "anything.at.all"),
        ] {
            assert!(subjects_overlap(a, b), "{a} {b}");
            assert!(subjects_overlap(b, a), "{b} {a}");
        }
        for (a, b) in [
            ("summarizer.jobs.>", "summarizer.turn.starting"),
            ("summarizer.jobs.>", "summarizer.jobs"),
            ("a.b", "a.b.c"),
            ("a.*", "a.b.c"),
            ("a.b.>", "a.c.>"),
        ] {
            assert!(!subjects_overlap(a, b), "{a} {b}");
            assert!(!subjects_overlap(b, a), "{b} {a}");
        }
    }
}
