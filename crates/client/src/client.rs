//! The client agents written in Rust call before every turn. It never fails to its
//! caller: whatever goes wrong, the answer is "proceed".

use std::time::Duration;

use async_nats::RequestErrorKind;
use async_nats::connection::State;

use crate::new_request_id;
use crate::outcome::Status;
use crate::protocol::{InstructionsFrom, Overrides, Reply, Request};

/// What the agent learns before its turn. Every variant means "go on"; only
/// `Replied` with status `compacted` means the history changed.
// A decision is made once a turn and moved once: boxing the reply would cost an
// allocation per turn to save a copy of a couple of hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A worker answered.
    Replied(Reply),
    /// No worker answered within the timeout. A worker may still be compacting; it commits
    /// safely and the next turn sees the result.
    TimedOut,
    /// No worker is subscribed: NATS says so at once.
    NoWorkers,
    /// NATS could not be reached, or the reply could not be read.
    Unavailable(String),
}

impl Decision {
    /// Whether the session's history was compacted (re-read it before the turn).
    pub fn compacted(&self) -> bool {
        matches!(self, Self::Replied(r) if r.status == Status::Compacted)
    }

    /// Machine-readable: the reply's reason, or why there was none.
    pub fn reason(&self) -> &str {
        match self {
            Self::Replied(reply) => reply.reason.as_str(),
            Self::TimedOut => "timeout",
            Self::NoWorkers => "no_responders",
            Self::Unavailable(_) => "transport_error",
        }
    }
}

#[derive(Clone, Debug)]
pub struct TurnClient {
    nats: async_nats::Client,
    subject: String,
}

impl TurnClient {
    pub fn new(nats: async_nats::Client, subject: impl Into<String>) -> Self {
        Self {
            nats,
            subject: subject.into(),
        }
    }

    /// Asks the fleet whether `session_id` needs compacting before the next turn, and
    /// waits at most `timeout` for the answer.
    pub async fn turn_starting(&self, session_id: &str, timeout: Duration) -> Decision {
        self.turn_starting_with(session_id, Overrides::default(), timeout)
            .await
    }

    /// [`TurnClient::turn_starting`], asking for this turn's own limits; the worker
    /// clamps them to its configured bounds.
    pub async fn turn_starting_with(
        &self,
        session_id: &str,
        overrides: Overrides,
        timeout: Duration,
    ) -> Decision {
        self.ask(session_id, overrides, timeout).await
    }

    /// Asks the fleet to compact `session_id` now, even below its threshold (`"force":
    /// true`; the other skip rules hold), with `instructions` as the summary's focus and
    /// `overrides`' other limits (a `keep_chars`, say). A compaction calls the LLM:
    /// give it a `timeout` of the LLM's deadline, not a turn's. The instructions go as
    /// the agent's (see [`TurnClient::compact_with`] for an operator's).
    pub async fn compact(
        &self,
        session_id: &str,
        instructions: Option<&str>,
        overrides: Overrides,
        timeout: Duration,
    ) -> Decision {
        self.compact_with(
            session_id,
            instructions,
            InstructionsFrom::Agent,
            overrides,
            timeout,
        )
        .await
    }

    /// [`TurnClient::compact`], saying who wrote the instructions: an operator's are the
    /// summary's focus, an agent's only a request about it (docs/protocol.md, "Forced
    /// compactions").
    pub async fn compact_with(
        &self,
        session_id: &str,
        instructions: Option<&str>,
        from: InstructionsFrom,
        overrides: Overrides,
        timeout: Duration,
    ) -> Decision {
        let request = Request {
            overrides: Overrides {
                force: true,
                ..overrides
            },
            instructions: instructions.map(str::to_owned),
            instructions_from: from,
            ..new_request(session_id)
        };
        self.send(&request.encode(), timeout).await
    }

    /// A request for `session_id` with `overrides`, with a new id.
    async fn ask(&self, session_id: &str, overrides: Overrides, timeout: Duration) -> Decision {
        let request = Request {
            overrides,
            ..new_request(session_id)
        };
        self.send(&request.encode(), timeout).await
    }

    /// Sends `payload` as it is: for tools and tests that need to send what a careless
    /// agent might.
    pub async fn send(&self, payload: &[u8], timeout: Duration) -> Decision {
        // While reconnecting, a request would wait out its whole timeout in the client's
        // buffer; the agent is better served by proceeding now.
        if self.nats.connection_state() != State::Connected {
            return Decision::Unavailable("not connected to NATS".to_owned());
        }
        let request = async_nats::Request::new()
            .payload(payload.to_vec().into())
            .timeout(Some(timeout));
        // The outer timeout also bounds a client stuck reconnecting.
        let sent = tokio::time::timeout(
            timeout,
            self.nats.send_request(self.subject.clone(), request),
        )
        .await;
        match sent {
            Err(_elapsed) => Decision::TimedOut,
            Ok(Err(e)) => match e.kind() {
                RequestErrorKind::TimedOut => Decision::TimedOut,
                RequestErrorKind::NoResponders => Decision::NoWorkers,
                _ => Decision::Unavailable(crate::error_chain(&e)),
            },
            Ok(Ok(message)) => match serde_json::from_slice(&message.payload) {
                Ok(reply) => Decision::Replied(reply),
                Err(e) => Decision::Unavailable(format!("unreadable reply: {e}")),
            },
        }
    }
}

/// A plain request for `session_id`, with a new id.
fn new_request(session_id: &str) -> Request {
    Request {
        session_id: session_id.to_owned(),
        request_id: Some(new_request_id()),
        ..Request::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Outcome, Reason};

    /// The Python client (clients/python) reports these same strings for the same cases.
    #[test]
    fn each_decision_reports_its_reason() {
        let reply = Reply::new(
            &Outcome::Skipped(Reason::BelowThreshold),
            None,
            None,
            None,
            0,
        );
        assert_eq!(Decision::Replied(reply).reason(), "below_threshold");
        assert_eq!(Decision::TimedOut.reason(), "timeout");
        assert_eq!(Decision::NoWorkers.reason(), "no_responders");
        assert_eq!(
            Decision::Unavailable("down".to_owned()).reason(),
            "transport_error"
        );
    }
}
