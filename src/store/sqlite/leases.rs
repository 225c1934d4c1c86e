//! The lease and the commit: taking the session for a compaction, giving it back (after
//! a skip or a failure), and replacing the planned prefix with the summary.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Row, SqliteConnection};

use super::{SqliteStore, now_ms};
use crate::compaction::{CountedAt, Loaded, Record};
use crate::message::Message;
use crate::outcome::Reason;
use crate::store::Leases;
use crate::store::counters::rememberable;
use crate::store::leases::{Found, LoadedRow, cleared_fence, loaded_from_rows, prefix_fence};
use crate::store::millis;
use crate::store::sql::{RELEASE_LEASE, RELEASE_LEASE_REMEMBERING};
use crate::store::{CommitError, Committed, StoreError};

impl SqliteStore {
    /// After a statement that took the session's lease for `owner` (`leased`) or not:
    /// the history, or `None`. A failed load gives the lease back.
    pub(super) async fn load_if_leased(
        &self,
        leased: bool,
        session_id: &str,
        owner: &str,
    ) -> Result<Option<Loaded>, StoreError> {
        if !leased {
            return Ok(None);
        }
        match self.load(session_id).await {
            Ok(loaded) => Ok(Some(loaded)),
            Err(e) => {
                // Not left holding a lease nobody will use.
                let _ = self.release_lease(session_id, owner).await;
                Err(e)
            }
        }
    }

    /// The session's messages in `seq` order, with their fingerprints.
    async fn load(&self, session_id: &str) -> Result<Loaded, StoreError> {
        let rows: Vec<LoadedRow> = sqlx::query_as(
            "SELECT seq, role, coalesce(content, '') AS content, tool_calls, tool_call_id,
                    is_summary, chars, pinned, CAST(row_version AS TEXT) AS fingerprint,
                    cleared_by IS NOT NULL AS cleared
             FROM messages WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(loaded_from_rows(rows)?)
    }
}

/// Which rows a commit or an applied pending summary replaces: the non-system messages
/// before a cut seq, but for those that stay in place.
#[derive(Clone, Copy, Debug)]
pub(super) enum Replaced<'a> {
    /// A pending summary's prefix: pinned messages stay (a plan that also kept a pinned
    /// message's tool-call partner in place differs from it, and is dropped).
    Before(i64),
    /// A commit's plan: the messages it keeps in place (`kept`: pinned ones and their
    /// partners) stay.
    Planned { cut_seq: i64, kept: &'a [i64] },
}

/// The rows of session `$1` that [`Replaced`] names: the non-system messages before the
/// cut seq `$2`, but for pinned ones when `$3` is NULL, or for the seqs of the JSON
/// array `$3` (usually empty) when it is not.
macro_rules! replaced_rows_sql {
    () => {
        "session_id = $1 AND seq < $2 AND role <> 'system'
         AND CASE WHEN $3 IS NULL THEN NOT (pinned AND NOT is_summary)
                  ELSE seq NOT IN (SELECT value FROM json_each($3)) END"
    };
}

impl Replaced<'_> {
    /// `$2` and `$3` of [`replaced_rows_sql!`].
    fn bound(self) -> (i64, Option<String>) {
        match self {
            Replaced::Before(cut_seq) => (cut_seq, None),
            // A list of integers always serializes.
            Replaced::Planned { cut_seq, kept } => (
                cut_seq,
                Some(serde_json::to_string(kept).unwrap_or_else(|_| "[]".to_owned())),
            ),
        }
    }
}

/// The rows a commit or a pending summary replaces, as it compares them with the plan.
pub(super) struct Prefix(pub(super) Found);

impl Prefix {
    pub(super) async fn read(
        tx: &mut SqliteConnection,
        session_id: &str,
        replaced: Replaced<'_>,
    ) -> Result<Self, sqlx::Error> {
        let (cut_seq, seqs) = replaced.bound();
        let rows = sqlx::query(concat!(
            "SELECT seq, chars, CAST(row_version AS TEXT) AS version FROM messages WHERE ",
            replaced_rows_sql!(),
            " ORDER BY seq"
        ))
        .bind(session_id)
        .bind(cut_seq)
        .bind(seqs)
        .fetch_all(tx)
        .await?;
        let rows = (rows.iter())
            .map(|row| {
                Ok((
                    row.try_get("seq")?,
                    row.try_get("chars")?,
                    row.try_get("version")?,
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(Self(Found::of(rows)))
    }

    /// Exactly the planned prefix: the same rows, of the same sizes, in the same versions.
    pub(super) fn is(&self, seqs: &[i64], chars: &[i64], versions: &[String]) -> bool {
        self.0.seqs == seqs && self.0.chars == chars && self.0.fingerprints == versions
    }
}

/// Archives the `replaced` rows under `compaction_id` and deletes them, and drops the
/// session's pending summary: `true` when there was one.
pub(super) async fn replace_prefix(
    tx: &mut SqliteConnection,
    session_id: &str,
    replaced: Replaced<'_>,
    compaction_id: i64,
) -> Result<bool, sqlx::Error> {
    let (cut_seq, seqs) = replaced.bound();
    sqlx::query(concat!(
        "INSERT INTO archived_messages (compaction_id, chars, ",
        message_columns_sql!(),
        ") SELECT $4, chars, ",
        message_columns_sql!(),
        " FROM messages WHERE ",
        replaced_rows_sql!()
    ))
    .bind(session_id)
    .bind(cut_seq)
    .bind(seqs.as_deref())
    .bind(compaction_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(concat!("DELETE FROM messages WHERE ", replaced_rows_sql!()))
        .bind(session_id)
        .bind(cut_seq)
        .bind(seqs.as_deref())
        .execute(&mut *tx)
        .await?;
    let pending = sqlx::query("DELETE FROM pending_summaries WHERE session_id = $1")
        .bind(session_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    Ok(pending > 0)
}

/// The rows of the tool results `summary` clears, as they are now, for the commit's fence
/// ([`cleared_fence`]).
async fn cleared_rows(
    tx: &mut SqliteConnection,
    summary: &Record<'_>,
) -> Result<Found, sqlx::Error> {
    if summary.cleared.is_empty() {
        return Ok(Found::default());
    }
    let seqs: Vec<i64> = summary.cleared.iter().map(|c| c.seq).collect();
    let rows: Vec<(i64, i64, String)> = sqlx::query_as(
        "SELECT seq, chars, CAST(row_version AS TEXT) FROM messages
         WHERE session_id = $1 AND seq IN (SELECT value FROM json_each($2)) ORDER BY seq",
    )
    .bind(summary.session_id)
    // A list of integers always serializes.
    .bind(serde_json::to_string(&seqs).unwrap_or_else(|_| "[]".to_owned()))
    .fetch_all(&mut *tx)
    .await?;
    Ok(Found::of(rows))
}

/// Archives the tool results `summary` clears under `compaction_id` (`cleared`) and
/// replaces their content with their placeholders, each row left in its place.
async fn clear_in_place(
    tx: &mut SqliteConnection,
    summary: &Record<'_>,
    compaction_id: i64,
) -> Result<(), sqlx::Error> {
    for planned in summary.cleared {
        sqlx::query(concat!(
            "INSERT INTO archived_messages (compaction_id, chars, cleared, ",
            message_columns_sql!(),
            ") SELECT $3, chars, 1, ",
            message_columns_sql!(),
            " FROM messages WHERE session_id = $1 AND seq = $2"
        ))
        .bind(summary.session_id)
        .bind(planned.seq)
        .bind(compaction_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE messages
             SET content = $3, extra = json_remove(extra, '$.data.content'), cleared_by = $4,
                 block_chars = NULL
             WHERE session_id = $1 AND seq = $2",
        )
        .bind(summary.session_id)
        .bind(planned.seq)
        .bind(&planned.placeholder)
        .bind(compaction_id)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Inserts the summary `text` at `seq` (the first removed message's) and records the
/// compaction as the session's latest, with the chars per token it measured, when it did
/// (`Record::chars_per_token`).
pub(super) async fn write_summary(
    tx: &mut SqliteConnection,
    session_id: &str,
    seq: i64,
    (text, chars_per_token): (&str, Option<f64>),
    compaction_id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content, is_summary)
         VALUES ($1, $2, 'user', $3, 1)",
    )
    .bind(session_id)
    .bind(seq)
    .bind(text)
    .execute(&mut *tx)
    .await?;
    sqlx::query(concat!(
        "UPDATE sessions
         SET last_compaction_id = $2, chars_per_token = coalesce($3, chars_per_token),
             largest_output_chars = ",
        largest_output_sql!(),
        "
         WHERE session_id = $1"
    ))
    .bind(session_id)
    .bind(compaction_id)
    .bind(chars_per_token)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[async_trait]
impl Leases for SqliteStore {
    /// Takes the session's lease for `owner` unless another owner holds an unexpired one,
    /// then loads the session's messages with their fingerprints. Two statements, where
    /// Postgres makes one: a message appended in between is loaded or not, and either
    /// way the commit fences on what was loaded.
    ///
    /// # Errors
    /// When the database fails; no lease is taken then.
    async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        let turn = self.write_turn().await?;
        let taken = sqlx::query(concat!(
            "UPDATE sessions SET lease_owner = $2, lease_expires_at = $3 + $4
             WHERE session_id = $1 AND ",
            lease_free_sql!("$3")
        ))
        .bind(session_id)
        .bind(owner)
        .bind(now_ms())
        .bind(millis(duration))
        .execute(&self.pool)
        .await?
        .rows_affected();
        drop(turn);
        self.load_if_leased(taken > 0, session_id, owner).await
    }

    /// Gives the lease up if `owner` still holds it; a no-op otherwise.
    ///
    /// # Errors
    /// When the database fails; the lease then runs out by itself.
    async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError> {
        let _turn = self.write_turn().await?;
        sqlx::query(RELEASE_LEASE)
            .bind(session_id)
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives the lease up and remembers why the planner refused the history `counted`
    /// describes, as [`crate::store::Leases::release_lease_remembering`] does.
    ///
    /// # Errors
    /// When the database fails; the lease then runs out by itself.
    async fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError> {
        let _turn = self.write_turn().await?;
        sqlx::query(RELEASE_LEASE_REMEMBERING)
            .bind(session_id)
            .bind(owner)
            .bind(rememberable(reason).then(|| reason.as_str()))
            .bind(counted.total_chars)
            .bind(counted.message_count)
            .bind(keep_chars)
            .bind(counted.largest_output_chars)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives the lease up after a failure and puts the session in backoff, as
    /// [`crate::store::Leases::record_failure`] does (the same exponent cap of 30; a product
    /// past SQLite's integers becomes a real, and the cap at `max` applies to it).
    ///
    /// # Errors
    /// When the database fails; the lease then runs out by itself.
    async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: Reason,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(count_failure_sql!())
            .bind(reason.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = failures + (failures < 2147483647),
                 retry_at = CASE WHEN $3 > 0
                     THEN $5 + min($3 * (1 << min(failures, 30)), $4)
                 END
             WHERE session_id = $1
               AND (lease_owner = $2
                    OR ($2 IS NULL AND (lease_owner IS NULL OR lease_expires_at <= $5)))",
        )
        .bind(session_id)
        .bind(owner)
        .bind(millis(base))
        .bind(millis(max))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The session's messages in `seq` order.
    ///
    /// # Errors
    /// When the database fails.
    async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        Ok(self.load(session_id).await?.messages)
    }

    /// Replaces the planned prefix with the summary, in one transaction that holds the
    /// file's write lock from its first statement: fences on the lease, checks the prefix
    /// is exactly as planned (seqs, chars and row versions), writes the usage event,
    /// archives and deletes the prefix, drops a pending summary, inserts the summary in
    /// the prefix's place and releases the lease. Appends from other connections wait
    /// for it (busy timeout) and land after it.
    ///
    /// # Errors
    /// As [`crate::store::Leases::commit`]; nothing is written in any case.
    async fn commit(&self, summary: &Record<'_>) -> Result<Committed, CommitError> {
        let mut tx = self.begin_write().await?;
        let fenced = sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = 0, retry_at = NULL
             WHERE session_id = $1 AND lease_owner = $2",
        )
        .bind(summary.session_id)
        .bind(summary.lease_owner)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if fenced == 0 {
            return Err(CommitError::LeaseLost);
        }
        // A clearing alone removes nothing: no seq is below the smallest. The pinned
        // messages before the cut, and their partners, stay where they are.
        let replaced = Replaced::Planned {
            cut_seq: if summary.summarized {
                summary.cut_seq
            } else {
                i64::MIN
            },
            kept: summary.kept_seqs,
        };
        // Dropping the transaction rolls it back.
        let prefix = Prefix::read(&mut tx, summary.session_id, replaced).await?;
        let first_seq = prefix_fence(summary, &prefix.0)?;
        cleared_fence(summary, &cleared_rows(&mut tx, summary).await?)?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO usage_events
                 (session_id, model, prompt_tokens, completion_tokens, total_tokens,
                  cached_prompt_tokens, metadata)
             VALUES ($1, $2, $3, $4, $3 + $4, $5, $6)
             RETURNING id",
        )
        .bind(summary.session_id)
        .bind(summary.model)
        .bind(summary.usage.prompt_tokens)
        .bind(summary.usage.completion_tokens)
        .bind(summary.usage.cached_prompt_tokens)
        .bind(summary.event_metadata().to_string())
        .fetch_one(&mut *tx)
        .await?;
        let superseded = replace_prefix(&mut tx, summary.session_id, replaced, id).await?;
        clear_in_place(&mut tx, summary, id).await?;
        match first_seq {
            Some(seq) => {
                let written = (summary.text, summary.chars_per_token());
                write_summary(&mut tx, summary.session_id, seq, written, id).await?;
            }
            None => {
                sqlx::query(concat!(
                    "UPDATE sessions SET last_compaction_id = $2, largest_output_chars = ",
                    largest_output_sql!(),
                    " WHERE session_id = $1"
                ))
                .bind(summary.session_id)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(Committed {
            compaction_id: id,
            superseded,
        })
    }
}
