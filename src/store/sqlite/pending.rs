//! Pending summaries in SQLite: what `apply_pending_summary` does in Postgres, as one
//! write transaction here (SQLite has no stored procedures, and the transaction runs in
//! this process anyway, so it costs no round trips).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use sqlx::{Row, SqliteConnection};

use super::leases::{Prefix, Replaced, replace_prefix, write_summary};
use super::{SqliteStore, now_ms};
use crate::compaction::record;
use crate::compaction::{Loaded, Record};
use crate::config::Limits;
use crate::message::char_count;
use crate::store::Pending;
use crate::store::millis;
use crate::store::{Applied, Discard, Saved, StoreError};

/// Whether appends or deletes since the plan break a rule the planner held for the
/// prefix before `cut_seq` (which the caller found unchanged): the kept part must start
/// at a human turn (`PrefixChanged` otherwise), and no kept tool result may answer a
/// call in the prefix, that is have its id with no later call of that id before it
/// (`PairingChanged`). As migration 14's `apply_pending_summary` decides on Postgres.
async fn planner_rule_broken(
    tx: &mut SqliteConnection,
    session_id: &str,
    cut_seq: i64,
) -> Result<Option<Discard>, sqlx::Error> {
    let (human_at_cut, paired): (bool, bool) = sqlx::query_as(
        "SELECT
             EXISTS (SELECT 1 FROM messages
                     WHERE session_id = $1 AND seq = $2 AND role = 'user' AND NOT is_summary),
             NOT EXISTS (
                 SELECT 1 FROM messages AS result
                 WHERE result.session_id = $1 AND result.seq >= $2 AND result.role = 'tool'
                   AND result.tool_call_id IN (
                       SELECT json_extract(call.tool_calls, c.fullkey || '.id')
                       FROM messages AS call, json_each(CASE json_type(call.tool_calls)
                           WHEN 'array' THEN call.tool_calls ELSE '[]' END) AS c
                       WHERE call.session_id = $1 AND call.seq < $2 AND call.role <> 'system'
                         AND NOT call.pinned
                         AND json_type(call.tool_calls, c.fullkey || '.id') = 'text')
                   AND NOT EXISTS (
                       SELECT 1
                       FROM messages AS later, json_each(CASE json_type(later.tool_calls)
                           WHEN 'array' THEN later.tool_calls ELSE '[]' END) AS c
                       WHERE later.session_id = $1
                         AND later.seq >= $2 AND later.seq < result.seq
                         AND json_extract(later.tool_calls, c.fullkey || '.id')
                             = result.tool_call_id))",
    )
    .bind(session_id)
    .bind(cut_seq)
    .fetch_one(&mut *tx)
    .await?;
    Ok(if !human_at_cut {
        Some(Discard::PrefixChanged)
    } else if !paired {
        Some(Discard::PairingChanged)
    } else {
        None
    })
}

/// A JSON column of `row` read back as `T`.
fn parse<T: serde::de::DeserializeOwned>(
    row: &sqlx::sqlite::SqliteRow,
    column: &str,
) -> Result<T, sqlx::Error> {
    let text: String = row.try_get(column)?;
    serde_json::from_str(&text).map_err(|e| sqlx::Error::Decode(e.into()))
}

/// A digest of the planned prefix, kept for operators comparing rows; nothing decides on
/// it. FNV-1a (64 bits) over the text Postgres hashes with md5 (`seqs/versions`, comma
/// separated): fixed, unlike std's hasher, whose algorithm may change between releases.
fn prefix_hash(seqs: &[i64], versions: &[String]) -> String {
    let join = |items: Vec<String>| items.join(",");
    let text = format!(
        "{}/{}",
        join(seqs.iter().map(i64::to_string).collect()),
        join(versions.to_vec())
    );
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// `value` as JSON text, for a JSON column.
fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, sqlx::Error> {
    serde_json::to_string(value).map_err(|e| sqlx::Error::Encode(e.into()))
}

#[async_trait]
impl Pending for SqliteStore {
    /// Takes the session's lease for a precompute and loads the history, unless another
    /// owner holds the lease or the session already has a pending summary younger than
    /// `ttl` for the same limits and model. `None` when there is nothing to do.
    ///
    /// # Errors
    /// When the database fails; no lease is taken then.
    async fn take_lease_for_precompute(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
        (limits, model): (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        let turn = self.write_turn().await?;
        let taken = sqlx::query(concat!(
            "UPDATE sessions SET lease_owner = $2, lease_expires_at = $3 + $4
             WHERE session_id = $1 AND ",
            lease_free_sql!("$3"),
            " AND NOT EXISTS (
                 SELECT 1 FROM pending_summaries p
                 WHERE p.session_id = $1 AND p.created_at > $3 - $5
                   AND p.threshold_chars = $6 AND p.keep_chars = $7
                   AND p.requested_model IS $8)"
        ))
        .bind(session_id)
        .bind(owner)
        .bind(now_ms())
        .bind(millis(duration))
        .bind(millis(ttl))
        .bind(limits.threshold_chars)
        .bind(limits.keep_chars)
        .bind(model)
        .execute(self.pool())
        .await?
        .rows_affected();
        drop(turn);
        self.load_if_leased(taken > 0, session_id, owner).await
    }

    /// Stores `pending` as the session's pending summary and gives the lease back, fenced
    /// on the lease; drops other sessions' pending summaries older than `ttl` (at most
    /// 100). One transaction; as [`crate::store::Pending::save_pending`].
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
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let expired = sqlx::query(
            "DELETE FROM pending_summaries WHERE session_id IN (
                 SELECT session_id FROM pending_summaries
                 WHERE created_at <= $2 - $3 AND session_id <> $1 LIMIT 100)",
        )
        .bind(pending.session_id)
        .bind(now)
        .bind(millis(ttl))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let fenced = sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
             WHERE session_id = $1 AND lease_owner = $2",
        )
        .bind(pending.session_id)
        .bind(pending.lease_owner)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        let mut replaced = false;
        if fenced {
            replaced = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pending_summaries WHERE session_id = $1)",
            )
            .bind(pending.session_id)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO pending_summaries (session_id, cut_seq, removed_seqs,
                     removed_chars, removed_versions, prefix_hash, threshold_chars, keep_chars,
                     requested_model, summary, model, prompt_tokens, completion_tokens,
                     metadata, created_at, cached_prompt_tokens)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                         $16)
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
                     metadata = excluded.metadata, created_at = excluded.created_at",
            )
            .bind(pending.session_id)
            .bind(pending.cut_seq)
            .bind(json_text(pending.removed_seqs)?)
            .bind(json_text(pending.removed_chars)?)
            .bind(json_text(pending.removed_fingerprints)?)
            .bind(prefix_hash(
                pending.removed_seqs,
                pending.removed_fingerprints,
            ))
            .bind(limits.threshold_chars)
            .bind(limits.keep_chars)
            .bind(pending.requested_model)
            .bind(pending.text)
            .bind(pending.model)
            .bind(pending.usage.prompt_tokens)
            .bind(pending.usage.completion_tokens)
            .bind(metadata.to_string())
            .bind(now)
            .bind(pending.usage.cached_prompt_tokens)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(Saved {
            saved: fenced,
            expired: i64::try_from(expired).unwrap_or(i64::MAX),
            replaced,
        })
    }

    /// Applies the session's pending summary if it was planned with `limits` and
    /// `model`, is younger than `ttl`, its prefix is unchanged and what remains fits
    /// under the threshold; drops it otherwise. One write transaction, with the outcomes
    /// of Postgres's `apply_pending_summary`.
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
        // The common case with precompute on and nothing prepared: no write lock taken.
        let any: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM pending_summaries WHERE session_id = $1")
                .bind(session_id)
                .fetch_optional(self.pool())
                .await?;
        if any.is_none() {
            return Ok(Applied::None);
        }
        let mut tx = self.begin_write().await?;
        // The commit's own time, as Postgres's statement measures it: from the lock on.
        let started = Instant::now();
        let now = now_ms();
        let session = sqlx::query(concat!(
            "SELECT message_count, total_chars FROM sessions WHERE session_id = $1 AND ",
            lease_free_sql!("$2")
        ))
        .bind(session_id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(session) = session else {
            return Ok(Applied::Busy);
        };
        let Some(pending) = sqlx::query(
            "SELECT cut_seq, removed_seqs, removed_chars, removed_versions, threshold_chars,
                    keep_chars, requested_model, summary, model, prompt_tokens,
                    completion_tokens, cached_prompt_tokens, metadata, created_at,
                    strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch')
                        AS created_at_text
             FROM pending_summaries WHERE session_id = $1",
        )
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(Applied::None);
        };
        let removed_seqs: Vec<i64> = parse(&pending, "removed_seqs")?;
        let removed_chars: Vec<i64> = parse(&pending, "removed_chars")?;
        let removed_versions: Vec<String> = parse(&pending, "removed_versions")?;
        let cut_seq: i64 = pending.try_get("cut_seq")?;
        let summary: String = pending.try_get("summary")?;
        let created_at: i64 = pending.try_get("created_at")?;
        let chars_removed: i64 = removed_chars.iter().sum();
        let summary_chars = char_count(&summary);
        let session_chars: i64 = session.try_get("total_chars")?;
        let mut metadata: serde_json::Value = parse(&pending, "metadata")?;
        // A pending row in the former shape, from a worker of the previous release, is
        // as good as expired (see migration 9).
        let discard = if created_at <= now - millis(ttl) || metadata.get("summarization").is_none()
        {
            Some(Discard::Expired)
        } else if pending.try_get::<i64, _>("threshold_chars")? != limits.threshold_chars
            || pending.try_get::<i64, _>("keep_chars")? != limits.keep_chars
            || pending
                .try_get::<Option<String>, _>("requested_model")?
                .as_deref()
                != model
        {
            Some(Discard::SettingsChanged)
        } else {
            let prefix = Prefix::read(&mut tx, session_id, Replaced::Before(cut_seq)).await?;
            if !prefix.is(&removed_seqs, &removed_chars, &removed_versions) {
                Some(Discard::PrefixChanged)
            } else if let Some(broken) = planner_rule_broken(&mut tx, session_id, cut_seq).await? {
                Some(broken)
            } else if session_chars - chars_removed + summary_chars > limits.threshold_chars {
                Some(Discard::Outgrown)
            } else {
                None
            }
        };
        sqlx::query("DELETE FROM pending_summaries WHERE session_id = $1")
            .bind(session_id)
            .execute(&mut *tx)
            .await?;
        let first_seq = match (discard, removed_seqs.first()) {
            (None, Some(&first)) => first,
            (Some(reason), _) => {
                tx.commit().await?;
                return Ok(Applied::Discarded(reason));
            }
            // An empty plan is refused by the table's writer; drop it as changed.
            (None, None) => {
                tx.commit().await?;
                return Ok(Applied::Discarded(Discard::PrefixChanged));
            }
        };
        let messages_removed = i64::try_from(removed_seqs.len()).unwrap_or(i64::MAX);
        let messages_kept = session.try_get::<i64, _>("message_count")? - messages_removed;
        // The pending summary's metadata, this turn's ids, and what this transaction
        // measures (`record::MEASURED_AT_APPLY`).
        record::merge(
            &mut metadata,
            record::applied_turn_metadata(request_id, job_id),
        );
        record::merge(
            &mut metadata,
            json!({
                "messages_kept": messages_kept,
                "precomputed_at": pending.try_get::<String, _>("created_at_text")?,
                "duration_ms": i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            }),
        );
        let prompt_tokens: Option<i64> = pending.try_get("prompt_tokens")?;
        let completion_tokens: Option<i64> = pending.try_get("completion_tokens")?;
        let cached_prompt_tokens: Option<i64> = pending.try_get("cached_prompt_tokens")?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO usage_events
                 (session_id, model, prompt_tokens, completion_tokens, total_tokens,
                  cached_prompt_tokens, metadata)
             VALUES ($1, $2, $3, $4, $3 + $4, $6, $5)
             RETURNING id",
        )
        .bind(session_id)
        .bind(pending.try_get::<String, _>("model")?)
        .bind(prompt_tokens)
        .bind(completion_tokens)
        .bind(metadata.to_string())
        .bind(cached_prompt_tokens)
        .fetch_one(&mut *tx)
        .await?;
        replace_prefix(&mut tx, session_id, Replaced::Before(cut_seq), id).await?;
        write_summary(&mut tx, session_id, first_seq, (&summary, None), id).await?;
        sqlx::query(concat!(
            "UPDATE sessions SET failures = 0, retry_at = NULL, largest_output_chars = ",
            largest_output_sql!(),
            " WHERE session_id = $1"
        ))
        .bind(session_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Applied::Compacted {
            compaction_id: id,
            messages_removed,
            chars_removed,
            messages_kept,
            summary_chars,
        })
    }
}
