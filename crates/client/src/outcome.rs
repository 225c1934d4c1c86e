//! What happened to one turn-starting event: the vocabulary shared by replies, logs and
//! tests. Every outcome but [`Outcome::Compacted`] tells the agent to proceed with its
//! history as it is.

use serde::{Deserialize, Serialize};

/// The `status` field of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Compacted,
    Skipped,
    Busy,
    Failed,
    Rejected,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Compacted => "compacted",
            Self::Skipped => "skipped",
            Self::Busy => "busy",
            Self::Failed => "failed",
            Self::Rejected => "rejected",
        }
    }
}

/// The `reason` field of a reply: machine-readable, stable across versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Compacted,
    /// Compacted by clearing old tool output alone, with no summary
    /// (`TOOL_OUTPUT_CLEARING`).
    Cleared,
    Disabled,
    BelowThreshold,
    TooFewTurns,
    NoSafeBoundary,
    /// A forced compaction found the whole history within its keep: nothing would be
    /// left to summarize (the reply's `session_chars` and `keep_chars` say by how much).
    WithinKeep,
    NothingToCompact,
    UnknownSession,
    /// An LLM failure put the session in backoff (`FAILURE_BACKOFF_MS`).
    BackingOff,
    Conflict,
    InProgress,
    LlmError,
    StoreError,
    InvalidRequest,
    /// A reason this version does not know (from a newer worker); kept so clients
    /// never fail to decode a reply.
    #[serde(other)]
    Other,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Compacted => "compacted",
            Self::Cleared => "cleared",
            Self::Disabled => "disabled",
            Self::BelowThreshold => "below_threshold",
            Self::TooFewTurns => "too_few_turns",
            Self::NoSafeBoundary => "no_safe_boundary",
            Self::WithinKeep => "within_keep",
            Self::NothingToCompact => "nothing_to_compact",
            Self::UnknownSession => "unknown_session",
            Self::BackingOff => "backing_off",
            Self::Conflict => "conflict",
            Self::InProgress => "in_progress",
            Self::LlmError => "llm_error",
            Self::StoreError => "store_error",
            Self::InvalidRequest => "invalid_request",
            Self::Other => "other",
        }
    }
}

/// The figures of a committed compaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The id of the `usage_events` row, also the `compaction_id` of the archived rows.
    pub compaction_id: i64,
    pub messages_removed: i64,
    pub chars_removed: i64,
    /// Messages of the session left beside the summary when the split was planned.
    pub messages_kept: i64,
    /// 0 when no summary was written (a clearing alone).
    pub summary_chars: i64,
    /// Whether a summary replaced an old part; `false` for a clearing alone.
    pub summarized: bool,
    /// Tool results whose content was replaced by a placeholder, left in place, ...
    pub tool_outputs_cleared: i64,
    /// ... and the chars that saved (their content's, less the placeholders').
    pub chars_cleared: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Compacted(Compaction),
    /// Nothing to do, or nothing safe to do; `reason` says which.
    Skipped(Reason),
    /// Another worker holds the session's lease.
    Busy,
    /// Something failed; the session is unchanged. `detail` is for people.
    Failed {
        reason: Reason,
        detail: String,
    },
    /// The request itself is wrong; `detail` says how.
    Rejected {
        detail: String,
    },
}

impl Outcome {
    pub fn status(&self) -> Status {
        match self {
            Self::Compacted(_) => Status::Compacted,
            Self::Skipped(_) => Status::Skipped,
            Self::Busy => Status::Busy,
            Self::Failed { .. } => Status::Failed,
            Self::Rejected { .. } => Status::Rejected,
        }
    }

    pub fn reason(&self) -> Reason {
        match self {
            Self::Compacted(c) if !c.summarized => Reason::Cleared,
            Self::Compacted(_) => Reason::Compacted,
            Self::Skipped(reason) | Self::Failed { reason, .. } => *reason,
            Self::Busy => Reason::InProgress,
            Self::Rejected { .. } => Reason::InvalidRequest,
        }
    }
}
