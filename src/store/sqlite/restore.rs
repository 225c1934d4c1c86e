//! Operator actions on one session, as `store::restore` does them on Postgres: what it
//! looks like, putting compacted messages back from the archive, and pruning the archive.

use std::time::Duration;

use sqlx::Row;

use super::{RFC3339, SqliteStore, now_ms, settings::settings_from};
use crate::store::{Pruned, RestoreError, Restored, SessionView, StoreError};

/// An archived row archived before the cutoff `?1`, in unix milliseconds (2440587.5 is
/// the julian day of the unix epoch). julianday() reads any form of timestamp SQLite
/// parses, not only the one the column's default writes.
macro_rules! archived_before_sql {
    () => {
        "julianday(archived_at) < 2440587.5 + ?1 / 86400000.0"
    };
}

impl SqliteStore {
    /// The session's counters, lease, backoff and its last `limit` compactions. The lease's
    /// and backoff's instants, stored as unix milliseconds, are shown as RFC 3339 text,
    /// as Postgres shows its timestamps.
    ///
    /// # Errors
    /// When the file cannot be read. `Ok(None)` for an unknown session.
    pub async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError> {
        let Some(row) = sqlx::query(
            "SELECT total_chars, message_count, human_turns, lease_owner,
                    strftime(?2, lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
                    failures, strftime(?2, retry_at / 1000.0, 'unixepoch') AS retry_at,
                    st.enabled AS settings_enabled,
                    st.threshold_chars AS settings_threshold_chars,
                    st.keep_chars AS settings_keep_chars, st.model AS settings_model
             FROM sessions LEFT JOIN session_settings AS st USING (session_id)
             WHERE session_id = ?1",
        )
        .bind(session_id)
        .bind(RFC3339)
        .fetch_optional(self.pool())
        .await?
        else {
            return Ok(None);
        };
        let compactions = sqlx::query_as(
            "SELECT id, coalesce(strftime(?2, created_at), created_at) AS at, model,
                    coalesce(CAST(json_extract(metadata, '$.messages_removed') AS INTEGER), 0)
                        AS messages_removed,
                    coalesce(CAST(json_extract(metadata, '$.chars_removed') AS INTEGER), 0)
                        AS chars_removed,
                    json_type(metadata, '$.restored_at') IS NOT NULL AS restored
             FROM usage_events
             WHERE session_id = ?1 AND json_type(metadata, '$.summarization') = 'true'
             ORDER BY id DESC LIMIT ?3",
        )
        .bind(session_id)
        .bind(RFC3339)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(Some(SessionView {
            session_id: session_id.to_owned(),
            total_chars: row.try_get("total_chars")?,
            message_count: row.try_get("message_count")?,
            human_turns: row.try_get("human_turns")?,
            lease_owner: row.try_get("lease_owner")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            failures: row.try_get("failures")?,
            retry_at: row.try_get("retry_at")?,
            settings: settings_from(&row)?,
            compactions,
        }))
    }

    /// Undoes the session's compactions from `from` (default: the newest only) to the
    /// newest, newest first, as Postgres does. The whole restore holds the file's write
    /// lock (where Postgres locks the session's row), so no append or commit interleaves.
    /// The usage events stay, marked `restored_at` (RFC 3339 with milliseconds and `Z`,
    /// where Postgres writes microseconds and `+00:00`).
    ///
    /// # Errors
    /// [`RestoreError`] saying why nothing was written.
    pub async fn restore(
        &self,
        session_id: &str,
        from: Option<i64>,
    ) -> Result<Restored, RestoreError> {
        let mut tx = self.begin_write().await?;
        let found = sqlx::query("SELECT 1 FROM sessions WHERE session_id = ?1")
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(RestoreError::UnknownSession(session_id.to_owned()));
        }
        let compactions: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT compaction_id FROM archived_messages
             WHERE session_id = ?1
               AND compaction_id >= coalesce(?2,
                   (SELECT max(compaction_id) FROM archived_messages WHERE session_id = ?1))
             ORDER BY compaction_id DESC",
        )
        .bind(session_id)
        .bind(from)
        .fetch_all(&mut *tx)
        .await?;
        if compactions.is_empty() {
            return Err(RestoreError::NothingToRestore(from));
        }
        let mut messages_restored = 0;
        for &compaction in &compactions {
            // Its summary took the seq of the first message it removed.
            let summary = sqlx::query(
                "DELETE FROM messages WHERE session_id = ?1 AND is_summary
                   AND seq = (SELECT min(seq) FROM archived_messages WHERE compaction_id = ?2)",
            )
            .bind(session_id)
            .bind(compaction)
            .execute(&mut *tx)
            .await?;
            if summary.rows_affected() != 1 {
                return Err(RestoreError::SummaryMissing(compaction));
            }
            // SQLite has no DELETE in a CTE: copy back, then delete, in the same
            // transaction. Each row gets a new row_version, as a new row gets a new xmin.
            let back = sqlx::query(
                "INSERT INTO messages (session_id, seq, role, content, tool_calls, tool_call_id,
                                       is_summary, created_at, external_id, extra)
                 SELECT session_id, seq, role, content, tool_calls, tool_call_id, is_summary,
                        created_at, external_id, extra
                 FROM archived_messages WHERE compaction_id = ?1 ORDER BY seq",
            )
            .bind(compaction)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM archived_messages WHERE compaction_id = ?1")
                .bind(compaction)
                .execute(&mut *tx)
                .await?;
            messages_restored += i64::try_from(back.rows_affected()).unwrap_or(i64::MAX);
            sqlx::query(
                "UPDATE usage_events
                 SET metadata = json_set(metadata, '$.restored_at', strftime(?2, 'now'))
                 WHERE id = ?1",
            )
            .bind(compaction)
            .bind(RFC3339)
            .execute(&mut *tx)
            .await?;
        }
        // The compaction now in force is the newest one not undone (or none).
        sqlx::query(
            "UPDATE sessions SET last_compaction_id = (
                 SELECT max(compaction_id) FROM archived_messages WHERE session_id = ?1
             )
             WHERE session_id = ?1",
        )
        .bind(session_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Restored {
            compactions,
            messages_restored,
        })
    }

    /// Deletes archived messages archived more than `older_than` ago, marking their usage
    /// events `archive_pruned_at`, as Postgres does; with `dry_run`, counts and writes
    /// nothing. The cutoff is this process's clock, taken once.
    ///
    /// # Errors
    /// When the file cannot be read or written.
    pub async fn prune_archive(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError> {
        let older_than = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let cutoff_ms = now_ms().saturating_sub(older_than);
        // A dry run too: it reads under the lock what it would delete, and writes nothing.
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(concat!(
            "SELECT count(DISTINCT compaction_id) AS compactions, count(*) AS messages
             FROM archived_messages WHERE ",
            archived_before_sql!()
        ))
        .bind(cutoff_ms)
        .fetch_one(&mut *tx)
        .await?;
        let pruned = Pruned {
            compactions: row.try_get("compactions")?,
            archived_messages: row.try_get("messages")?,
            dry_run,
        };
        if !dry_run {
            sqlx::query(concat!(
                "UPDATE usage_events
                 SET metadata = json_set(metadata, '$.archive_pruned_at', strftime(?2, 'now'))
                 WHERE id IN (SELECT compaction_id FROM archived_messages WHERE ",
                archived_before_sql!(),
                ")"
            ))
            .bind(cutoff_ms)
            .bind(RFC3339)
            .execute(&mut *tx)
            .await?;
            sqlx::query(concat!(
                "DELETE FROM archived_messages WHERE ",
                archived_before_sql!()
            ))
            .bind(cutoff_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(pruned)
    }
}
