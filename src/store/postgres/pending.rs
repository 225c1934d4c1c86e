//! Pending summaries (`SUMMARIZATION_PRECOMPUTE_AT`, migration 12): prepared under the
//! session's lease before the threshold, stored in `pending_summaries`, applied by the
//! turn that crosses the threshold in one call of `apply_pending_summary`.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::PgStore;
use super::leases::loaded_from;
use crate::compaction::record;
use crate::compaction::{Loaded, Record};
use crate::config::Limits;
use crate::store::Pending;
use crate::store::millis;
use crate::store::{Applied, Discard, Saved, StoreError};

#[async_trait]
impl Pending for PgStore {
    /// Takes the session's lease for a precompute and loads the history, unless another
    /// owner holds the lease or the session already has a pending summary younger than
    /// `ttl` for the same limits and model. One round trip; `None` when there is nothing
    /// to do.
    ///
    /// # Errors
    /// When the database is unreachable; no lease is taken then.
    async fn take_lease_for_precompute(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
        (limits, model): (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        let rows = sqlx::query(concat!(
            "WITH lease AS (
                 UPDATE sessions
                 SET lease_owner = $2, lease_expires_at = now() + $3 * interval '1 millisecond'
                 WHERE session_id = $1
                   AND (lease_owner IS NULL OR lease_expires_at <= now())
                   AND NOT EXISTS (
                       SELECT 1 FROM pending_summaries p
                       WHERE p.session_id = $1
                         AND p.created_at > now() - $4 * interval '1 millisecond'
                         AND p.threshold_chars = $5 AND p.keep_chars = $6
                         AND p.requested_model IS NOT DISTINCT FROM $7)
                 RETURNING session_id
             )
             ",
            load_leased_sql!()
        ))
        .bind(session_id)
        .bind(owner)
        .bind(millis(duration))
        .bind(millis(ttl))
        .bind(limits.threshold_chars)
        .bind(limits.keep_chars)
        .bind(model)
        .fetch_all(&self.pool)
        .await?;
        loaded_from(&rows)
    }

    /// Stores `pending` (planned with `limits`) as the session's pending summary (replacing any other) and gives
    /// the lease back, in one statement fenced on the lease: `false`, and nothing
    /// written, when the lease is no longer ours. The same statement drops pending
    /// summaries of any session that are older than `ttl` (at most 100 at a time), and
    /// returns how many it dropped, expired or replaced, for the metrics.
    ///
    /// # Errors
    /// When the database fails; nothing is written then.
    async fn save_pending(
        &self,
        pending: &Record<'_>,
        limits: Limits,
        ttl: Duration,
    ) -> Result<Saved, StoreError> {
        let metadata = pending.pending_metadata();
        let row = sqlx::query(
            "WITH fence AS (
                 UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
                 WHERE session_id = $1 AND lease_owner = $2
                 RETURNING session_id
             ), expired AS (
                 DELETE FROM pending_summaries
                 WHERE session_id IN (
                     SELECT session_id FROM pending_summaries
                     WHERE created_at <= now() - $15 * interval '1 millisecond'
                       AND session_id <> $1
                     LIMIT 100)
                 RETURNING 1
             ), replaced AS (
                 SELECT 1 FROM pending_summaries WHERE session_id = $1
             ), saved AS (
                 INSERT INTO pending_summaries AS p (session_id, cut_seq, removed_seqs,
                     removed_chars, removed_versions, prefix_hash, threshold_chars,
                     keep_chars, requested_model, summary, model, prompt_tokens,
                     completion_tokens, metadata, cached_prompt_tokens)
                 SELECT $1, $3, $4, $5, $6, md5(array_to_string($4, ',') || '/' || array_to_string($6, ',')), $7, $8, $9, $10,
                     $11, $12, $13, $14, $16
                 FROM fence
                 ON CONFLICT (session_id) DO UPDATE SET
                     cut_seq = excluded.cut_seq, removed_seqs = excluded.removed_seqs,
                     removed_chars = excluded.removed_chars,
                     removed_versions = excluded.removed_versions,
                     prefix_hash = excluded.prefix_hash,
                     threshold_chars = excluded.threshold_chars,
                     keep_chars = excluded.keep_chars,
                     requested_model = excluded.requested_model,
                     summary = excluded.summary, model = excluded.model,
                     prompt_tokens = excluded.prompt_tokens,
                     completion_tokens = excluded.completion_tokens,
                     cached_prompt_tokens = excluded.cached_prompt_tokens,
                     metadata = excluded.metadata, created_at = now()
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM saved) AS saved,
                    (SELECT count(*) FROM expired) AS expired,
                    EXISTS (SELECT 1 FROM replaced) AND EXISTS (SELECT 1 FROM saved)
                        AS replaced",
        )
        .bind(pending.session_id)
        .bind(pending.lease_owner)
        .bind(pending.cut_seq)
        .bind(pending.removed_seqs)
        .bind(pending.removed_chars)
        .bind(pending.removed_fingerprints)
        .bind(limits.threshold_chars)
        .bind(limits.keep_chars)
        .bind(pending.requested_model)
        .bind(pending.text)
        .bind(pending.model)
        .bind(pending.usage.prompt_tokens)
        .bind(pending.usage.completion_tokens)
        .bind(&metadata)
        .bind(millis(ttl))
        .bind(pending.usage.cached_prompt_tokens)
        .fetch_one(&self.pool)
        .await?;
        Ok(Saved {
            saved: row.try_get("saved")?,
            expired: row.try_get("expired")?,
            replaced: row.try_get("replaced")?,
        })
    }

    /// Applies the session's pending summary if it was planned with `limits` and
    /// `model`, is younger than `ttl` and its prefix is unchanged; drops it otherwise.
    /// One call of `apply_pending_summary` (migration 23), one transaction: the event's
    /// metadata is the pending summary's, with this turn's ids and what the database
    /// measures ([`record::MEASURED_AT_APPLY`]).
    ///
    /// # Errors
    /// When the database fails; nothing is written then.
    async fn apply_pending(
        &self,
        session_id: &str,
        (request_id, job_id): (&str, Option<&str>),
        (limits, model): (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Applied, StoreError> {
        let row = sqlx::query(
            "SELECT outcome, applied_id, removed_count, removed_total, kept_count,
                    summary_length
             FROM apply_pending_summary($1, $2, $3, $4, $5, $6)",
        )
        .bind(session_id)
        .bind(record::applied_turn_metadata(request_id, job_id))
        .bind(limits.threshold_chars)
        .bind(limits.keep_chars)
        .bind(model)
        .bind(millis(ttl))
        .fetch_one(&self.pool)
        .await?;
        let outcome: String = row.try_get("outcome")?;
        Ok(match outcome.as_str() {
            "applied" => Applied::Compacted {
                compaction_id: row.try_get("applied_id")?,
                messages_removed: row.try_get::<i32, _>("removed_count")?.into(),
                chars_removed: row.try_get("removed_total")?,
                messages_kept: row.try_get("kept_count")?,
                summary_chars: row.try_get::<i32, _>("summary_length")?.into(),
            },
            "busy" => Applied::Busy,
            "expired" => Applied::Discarded(Discard::Expired),
            "settings_changed" => Applied::Discarded(Discard::SettingsChanged),
            "prefix_changed" => Applied::Discarded(Discard::PrefixChanged),
            "pairing_changed" => Applied::Discarded(Discard::PairingChanged),
            "outgrown" => Applied::Discarded(Discard::Outgrown),
            // "none", or an outcome a newer schema added: compact as usual.
            _ => Applied::None,
        })
    }
}
