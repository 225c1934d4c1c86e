//! Pending summaries (`SUMMARIZATION_PRECOMPUTE_AT`, [`Pending`]): prepared under the
//! lease before the threshold, applied by the turn that crosses it.

use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;
use crate::compaction::{Loaded, Record};
use crate::config::Limits;

#[async_trait]
pub trait Pending: Send + Sync {
    /// Takes the lease for a precompute and loads the history, unless another owner
    /// holds it or the session has a pending summary younger than `ttl` planned with the
    /// same limits and model. `None` when there is nothing to do.
    async fn take_lease_for_precompute(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Option<Loaded>, StoreError>;

    /// Stores `pending` (planned with `limits`) as the session's pending summary and
    /// gives the lease back, fenced on the lease; drops other sessions' pending summaries
    /// older than `ttl` on the way.
    async fn save_pending(
        &self,
        pending: &Record<'_>,
        limits: Limits,
        ttl: Duration,
    ) -> Result<Saved, StoreError>;

    /// Applies the session's pending summary if it was planned with the turn's limits and
    /// model, is younger than `ttl` and its prefix is unchanged; drops it otherwise and
    /// says why. `ids` are the request's id and the durable job's, if any.
    async fn apply_pending(
        &self,
        session_id: &str,
        ids: (&str, Option<&str>),
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Applied, StoreError>;
}

/// What the turn that crossed the threshold found: see `apply_pending_summary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// No pending summary: compact as usual.
    None,
    /// The session's lease is held (a compaction or a precompute in flight).
    Busy,
    /// A pending summary was dropped, for this reason; compact as usual.
    Discarded(Discard),
    /// The pending summary was written.
    Compacted {
        compaction_id: i64,
        messages_removed: i64,
        chars_removed: i64,
        messages_kept: i64,
        summary_chars: i64,
    },
}

/// Why a pending summary was dropped: the `reason` label of
/// `summarizer_precomputes_discarded_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Older than `PRECOMPUTE_TTL_MS`.
    Expired,
    /// Planned with other limits, or another session model, than the turn's.
    SettingsChanged,
    /// A planned row was edited, deleted, or a row was added before the cut; or the
    /// message at the cut is no longer a human turn.
    PrefixChanged,
    /// A tool result appended after the plan answers a call in the planned prefix:
    /// applying it would archive the call and keep its result.
    PairingChanged,
    /// What would remain is still over the threshold: the session grew by more than the
    /// band since the plan.
    Outgrown,
    /// Overwritten, or deleted by a compaction that did not use it.
    Superseded,
}

impl Discard {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::SettingsChanged => "settings_changed",
            Self::PrefixChanged => "prefix_changed",
            Self::PairingChanged => "pairing_changed",
            Self::Outgrown => "outgrown",
            Self::Superseded => "superseded",
        }
    }
}

/// What [`Store::save_pending`](crate::store::Pending::save_pending) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Saved {
    /// Written: the lease was still ours.
    pub saved: bool,
    /// Other sessions' pending summaries dropped for being older than the TTL.
    pub expired: i64,
    /// The session had a pending summary, which this one replaced.
    pub replaced: bool,
}
