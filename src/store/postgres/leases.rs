//! The lease and the commit: taking the session for a compaction, giving it back (after
//! a skip or a failure), and replacing the planned prefix with the summary.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};

use super::PgStore;
use crate::compaction::{CountedAt, Loaded, Record};
use crate::message::Message;
use crate::outcome::Reason;
use crate::store::Leases;
use crate::store::counters::rememberable;
use crate::store::leases::{
    Found, LoadedRow, MessageRow, cleared_fence, loaded_from_rows, prefix_fence,
};
use crate::store::millis;
use crate::store::sql::{RELEASE_LEASE, RELEASE_LEASE_REMEMBERING};
use crate::store::{CommitError, Committed, StoreError};

/// The commit's first step: takes the session's row if the lease is still ours (giving
/// the lease up with it, should the transaction commit), then locks every message row the
/// commit will delete or clear, without waiting. `false` when the lease is lost.
///
/// The order is what keeps an agent's writes and a commit from deadlocking. An agent's
/// UPDATE or DELETE of a message locks that row, then its counters' trigger waits for the
/// session's row. So the commit waits only for the session's row, while it holds nothing
/// (appends and edits queue behind it, or it behind them), and never for a message row
/// once it holds the session's: one that an agent holds makes it give way,
/// [`CommitError::RowBusy`], which the worker answers `skipped/conflict`. The agent's
/// statement then goes through, as docs/protocol.md promises ("Concurrent writes").
async fn fence_and_lock(
    tx: &mut sqlx::PgConnection,
    summary: &Record<'_>,
    cut_seq: i64,
) -> Result<bool, CommitError> {
    // One round trip. The rows are locked only once the fence holds the session's row:
    // the lock's scan reads the fence's result.
    let cleared: Vec<i64> = summary.cleared.iter().map(|c| c.seq).collect();
    let fenced = sqlx::query_scalar(
        "WITH fence AS (
             UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = 0, retry_at = NULL
             WHERE session_id = $1 AND lease_owner = $2
             RETURNING 1
         )
         SELECT EXISTS (SELECT 1 FROM fence)
                AND (SELECT count(*) >= 0 FROM (
                         SELECT 1 FROM messages
                         WHERE session_id = $1 AND EXISTS (SELECT 1 FROM fence)
                           AND ((seq < $3 AND role <> 'system' AND seq <> ALL ($4))
                                OR seq = ANY ($5))
                         FOR UPDATE NOWAIT) AS locked)",
    )
    .bind(summary.session_id)
    .bind(summary.lease_owner)
    .bind(cut_seq)
    .bind(summary.kept_seqs)
    .bind(&cleared)
    .fetch_one(&mut *tx)
    .await;
    match fenced {
        Ok(fenced) => Ok(fenced),
        Err(e) if is_lock_not_available(&e) => Err(CommitError::RowBusy),
        Err(e) => Err(e.into()),
    }
}

/// Postgres's `lock_not_available` (55P03): a `NOWAIT` lock found the row held.
pub(super) fn is_lock_not_available(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

/// Replaces the content of the tool results `summary` clears with their placeholders,
/// after archiving them under `compaction_id` (`cleared`): each row keeps its place, role,
/// seq and `tool_call_id`. The rows are locked and compared with the plan first, so that
/// an agent's edit meanwhile is neither overwritten nor archived in place of the text it
/// replaced: [`CommitError::PrefixChanged`] then.
async fn clear_in_place(
    tx: &mut sqlx::PgConnection,
    summary: &Record<'_>,
    compaction_id: i64,
) -> Result<(), CommitError> {
    let seqs: Vec<i64> = summary.cleared.iter().map(|c| c.seq).collect();
    let found = sqlx::query(concat!(
        "SELECT seq, chars::bigint AS chars, ",
        fingerprint_sql!(),
        " AS fingerprint FROM messages
         WHERE session_id = $1 AND seq = ANY($2) ORDER BY seq FOR UPDATE"
    ))
    .bind(summary.session_id)
    .bind(&seqs)
    .fetch_all(&mut *tx)
    .await?;
    let found = (found.iter())
        .map(|row| {
            Ok((
                row.try_get("seq")?,
                row.try_get("chars")?,
                row.try_get("fingerprint")?,
            ))
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    cleared_fence(summary, &Found::of(found))?;
    let placeholders: Vec<&str> = summary
        .cleared
        .iter()
        .map(|c| c.placeholder.as_str())
        .collect();
    sqlx::query(concat!(
        "WITH archived AS (
             INSERT INTO archived_messages (compaction_id, chars, cleared, ",
        message_columns_sql!(),
        ")
             SELECT $3, chars, true, ",
        message_columns_sql!(),
        " FROM messages WHERE session_id = $1 AND seq = ANY($2)
         )
         UPDATE messages AS m
         SET content = p.placeholder, extra = m.extra #- '{data,content}', cleared_by = $3,
             block_chars = NULL
         FROM unnest($2::bigint[], $4::text[]) AS p(seq, placeholder)
         WHERE m.session_id = $1 AND m.seq = p.seq"
    ))
    .bind(summary.session_id)
    .bind(&seqs)
    .bind(compaction_id)
    .bind(&placeholders)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The rows of a lease-and-load statement: none when the lease was not taken, one of
/// NULLs (the LEFT JOIN) for a leased session with no messages.
pub(super) fn loaded_from(rows: &[PgRow]) -> Result<Option<Loaded>, StoreError> {
    if rows.is_empty() {
        return Ok(None);
    }
    if rows[0].try_get::<Option<i64>, _>("seq")?.is_none() {
        return Ok(Some(Loaded::default()));
    }
    let rows = rows
        .iter()
        .map(LoadedRow::from_row)
        .collect::<Result<Vec<LoadedRow>, _>>()?;
    Ok(Some(loaded_from_rows(rows)?))
}

#[async_trait]
impl Leases for PgStore {
    /// Takes the session's lease for `owner` unless another owner holds an unexpired one,
    /// and in the same round trip loads the session's messages in `seq` order, with their
    /// fingerprints. `None` when another owner holds the lease.
    ///
    /// # Errors
    /// When the database is unreachable; no lease is taken then.
    async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        // No row: not leased. One row of NULLs (the LEFT JOIN): leased, no messages.
        let rows = sqlx::query(concat!(
            "WITH lease AS (
                 UPDATE sessions
                 SET lease_owner = $2, lease_expires_at = now() + $3 * interval '1 millisecond'
                 WHERE session_id = $1
                   AND (lease_owner IS NULL OR lease_expires_at <= now())
                 RETURNING session_id
             )
             ",
            load_leased_sql!()
        ))
        .bind(session_id)
        .bind(owner)
        .bind(millis(duration))
        .fetch_all(&self.pool)
        .await?;
        loaded_from(&rows)
    }

    /// Gives the lease up if `owner` still holds it; a no-op otherwise.
    ///
    /// # Errors
    /// When the database is unreachable; the lease then runs out by itself.
    async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query(RELEASE_LEASE)
            .bind(session_id)
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives the lease up after the planner refused the history `counted` describes with
    /// `keep_chars`, and remembers why: until the counters change, [`Counts::counters`](crate::store::Counts::counters)
    /// answers with the reason and, for the same keep, the worker neither takes the lease
    /// nor loads the history again. Reasons that do not depend on the history alone are
    /// not remembered. The largest evictable output becomes `counted`'s.
    ///
    /// # Errors
    /// When the database is unreachable; the lease then runs out by itself.
    async fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(RELEASE_LEASE_REMEMBERING)
            .bind(session_id)
            .bind(owner)
            .bind(rememberable(reason).then(|| reason.as_str()))
            .bind(counted.total_chars)
            .bind(i32::try_from(counted.message_count).unwrap_or(i32::MAX))
            .bind(keep_chars)
            .bind(counted.largest_output_chars)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives the lease up after a failure and puts the session in backoff: no
    /// summarization before `base x 2^(failures so far)`, capped at `max`, has passed.
    /// A zero `base` records the failure without a backoff. The failure is counted for
    /// today under `reason` (`llm_error`, `store_error`). `owner` is the lease this
    /// worker holds; `None` when the failing statement took none (its transaction rolled
    /// back): the backoff is then set unless another worker holds a live lease.
    ///
    /// The exponent stops at 30 (`base` x 10^9, past any sensible `max`): `power(2, n)`
    /// overflows a double, and the statement fails, from n = 1024 on. The count itself
    /// stops at the integer column's limit for the same reason.
    ///
    /// # Errors
    /// When the database is unreachable; the lease then runs out by itself.
    async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: Reason,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "WITH counted AS (
                 INSERT INTO failure_daily AS f (day, reason, failures)
                 VALUES ((now() AT TIME ZONE 'UTC')::date, $5, 1)
                 ON CONFLICT (day, reason) DO UPDATE SET failures = f.failures + 1
             )
             UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = failures + (failures < 2147483647)::integer,
                 retry_at = CASE WHEN $3 > 0
                     THEN now() + least($3 * power(2, least(failures, 30)), $4)
                                  * interval '1 millisecond'
                 END
             WHERE session_id = $1
               AND (lease_owner = $2
                    OR ($2::text IS NULL
                        AND (lease_owner IS NULL OR lease_expires_at <= now())))",
        )
        .bind(session_id)
        .bind(owner)
        .bind(millis(base))
        .bind(millis(max))
        .bind(reason.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The session's messages in `seq` order.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let rows: Vec<MessageRow> = sqlx::query_as(
            "SELECT seq, role, coalesce(content, '') AS content, tool_calls, tool_call_id,
                    is_summary, chars::bigint AS chars, pinned
             FROM messages WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(Message::try_from)
            .collect::<Result<_, _>>()
            .map_err(Into::into)
    }

    /// Replaces the planned prefix with the summary, in one transaction: fences on the
    /// lease and locks the rows it changes (`fence_and_lock`: without waiting for an
    /// agent's statement), archives and deletes the prefix (checking it is exactly as planned), inserts
    /// the summary in its place and the usage event, clears the planned tool results in
    /// place (archiving their originals, checking they are as planned), drops the
    /// session's pending summary (which the compaction made stale), and releases the
    /// lease. A clearing alone (`summarized: false`) removes nothing and writes no summary.
    ///
    /// # Errors
    /// [`CommitError::LeaseLost`] or [`CommitError::PrefixChanged`] when writing would be
    /// wrong, [`CommitError::RowBusy`] when an agent is writing a row it would change,
    /// [`CommitError::Store`] when the database fails; nothing is written in any case.
    async fn commit(&self, summary: &Record<'_>) -> Result<Committed, CommitError> {
        let mut tx = self.pool.begin().await?;
        // A clearing alone removes nothing: no seq is below the smallest.
        let cut_seq = if summary.summarized {
            summary.cut_seq
        } else {
            i64::MIN
        };
        if !fence_and_lock(&mut tx, summary, cut_seq).await? {
            return Err(CommitError::LeaseLost);
        }
        let metadata = summary.event_metadata();
        // The usage event and the archived, deleted prefix, whose rows are locked.
        let archived = sqlx::query(concat!(
            "WITH event AS (
                 INSERT INTO usage_events
                     (session_id, model, prompt_tokens, completion_tokens, total_tokens,
                      cached_prompt_tokens, metadata)
                 VALUES ($1, $3, $4, $5, $4 + $5, $8, $6)
                 RETURNING id
             ), removed AS (
                 DELETE FROM messages
                 WHERE session_id = $1 AND seq < $2 AND role <> 'system' AND seq <> ALL ($7)
                 RETURNING *, ",
            fingerprint_sql!(),
            " AS fingerprint
             ), archived AS (
                 INSERT INTO archived_messages (compaction_id, chars, ",
            message_columns_sql!(),
            ")
                 SELECT (SELECT id FROM event), chars, ",
            message_columns_sql!(),
            "
                 FROM removed
             ), superseded AS (
                 DELETE FROM pending_summaries WHERE session_id = $1
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM superseded) AS superseded,
                    (SELECT id FROM event) AS id,
                    coalesce(array_agg(seq ORDER BY seq), '{}') AS seqs,
                    coalesce(array_agg(chars::bigint ORDER BY seq), '{}') AS chars,
                    coalesce(array_agg(fingerprint ORDER BY seq), '{}') AS fingerprints
             FROM removed"
        ))
        .bind(summary.session_id)
        .bind(cut_seq)
        .bind(summary.model)
        .bind(summary.usage.prompt_tokens)
        .bind(summary.usage.completion_tokens)
        .bind(&metadata)
        // The pinned messages before the cut, and their partners, stay where they are.
        .bind(summary.kept_seqs)
        .bind(summary.usage.cached_prompt_tokens)
        .fetch_one(&mut *tx)
        .await?;
        let removed = Found {
            seqs: archived.try_get("seqs")?,
            chars: archived.try_get("chars")?,
            fingerprints: archived.try_get("fingerprints")?,
        };
        // Dropping the transaction rolls the deletion back.
        let first_seq = prefix_fence(summary, &removed)?;

        let id: i64 = archived.try_get("id")?;
        if !summary.cleared.is_empty() {
            clear_in_place(&mut tx, summary, id).await?;
        }
        let Some(first_seq) = first_seq else {
            sqlx::query(concat!(
                "UPDATE sessions SET last_compaction_id = $2, largest_output_chars = ",
                largest_output_sql!(),
                " WHERE session_id = $1"
            ))
            .bind(summary.session_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(Committed {
                compaction_id: id,
                superseded: archived.try_get("superseded")?,
            });
        };
        // The summary takes the first removed message's seq: before every kept message,
        // and after any system message that preceded the old part. The same statement
        // records the compaction as the session's latest (its row is locked by the fence
        // already), so replies report it from the counters' read.
        sqlx::query(concat!(
            "WITH summary AS (
                 INSERT INTO messages (session_id, seq, role, content, is_summary)
                 VALUES ($1, $2, 'user', $3, true)
             )
             UPDATE sessions
             SET last_compaction_id = $4, chars_per_token = coalesce($5, chars_per_token),
                 largest_output_chars = ",
            largest_output_sql!(),
            "
             WHERE session_id = $1"
        ))
        .bind(summary.session_id)
        .bind(first_seq)
        .bind(summary.text)
        .bind(id)
        .bind(summary.chars_per_token())
        .execute(&mut *tx)
        .await?;

        tx.commit().await?;
        Ok(Committed {
            compaction_id: id,
            superseded: archived.try_get("superseded")?,
        })
    }
}
