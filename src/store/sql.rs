//! The SQL that is the same text in both dialects, written once: whole statements as
//! constants, fragments that the backends splice into their own statements as macros
//! (`concat!` takes macros, not constants).
//!
//! Placeholders are `$N` in both: Postgres numbers them so, and sqlx binds SQLite's
//! `$N` by its number too. A statement belongs here only when both backends run it as
//! is; one that differs by a function or a type stays in each backend's file of its
//! concern, where diffing the two files shows the difference.

/// The remembered skip of a `sessions` row, as [`CountersRow`](super::counters::CountersRow)
/// reads it: the reason holds only while the counters are still those it was remembered
/// at.
macro_rules! remembered_skip_columns_sql {
    () => {
        "CASE WHEN skip_at_chars = total_chars AND skip_at_count = message_count
              THEN skip_reason END AS skip_reason,
         skip_at_keep"
    };
}

/// The session's settings (`st`, NULLs without a row) under the names
/// [`SettingsRow`](super::settings::SettingsRow) reads.
macro_rules! settings_columns_sql {
    () => {
        "st.enabled AS settings_enabled, st.threshold_chars AS settings_threshold_chars,
         st.keep_chars AS settings_keep_chars, st.model AS settings_model,
         st.tool_output_clearing AS settings_tool_output_clearing,
         st.tool_output_keep AS settings_tool_output_keep,
         st.threshold_tokens AS settings_threshold_tokens"
    };
}

/// `FROM` for a counters query: the session's settings come with its counters, in the
/// same primary-key lookup (a second on `session_settings`' key), so the no-op path pays
/// no extra round trip for them.
macro_rules! counters_joined_sql {
    () => {
        " FROM sessions LEFT JOIN session_settings AS st ON st.session_id = sessions.session_id "
    };
}

/// One session's row of `session_settings` (`$1`), as [`SettingsRow`](super::settings::SettingsRow).
macro_rules! select_settings_sql {
    () => {
        concat!(
            "SELECT ",
            settings_columns_sql!(),
            " FROM session_settings AS st WHERE st.session_id = $1"
        )
    };
}

/// Gives the lease of session `$1` up if `$2` holds it.
pub const RELEASE_LEASE: &str = "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
     WHERE session_id = $1 AND lease_owner = $2";

/// The largest tool output of session `$1` that a compaction could evict (uncleared,
/// unpinned), as it is: what `sessions.largest_output_chars` is set to under the lease.
macro_rules! largest_output_sql {
    () => {
        "(SELECT coalesce(max(chars), 0) FROM messages
          WHERE session_id = $1 AND role = 'tool' AND tool_call_id IS NOT NULL AND cleared_by IS NULL AND NOT pinned)"
    };
}

/// [`RELEASE_LEASE`], remembering the skip `$3` (NULL: nothing to remember) planned on
/// `$4` chars and `$5` messages with keep `$6`, and the largest output a compaction could
/// evict in that history, `$7`: exact where [`largest_output_sql`] is an upper bound (the
/// planner pairs results with their calls). Only while the counters still say `$4` and
/// `$5`: an output appended since keeps the bound its write raised.
pub const RELEASE_LEASE_REMEMBERING: &str = "UPDATE sessions
     SET lease_owner = NULL, lease_expires_at = NULL,
         skip_reason = $3, skip_at_chars = $4, skip_at_count = $5, skip_at_keep = $6,
         largest_output_chars = CASE WHEN total_chars = $4 AND message_count = $5
                                     THEN $7 ELSE largest_output_chars END
     WHERE session_id = $1 AND lease_owner = $2";

/// Writes session `$1`'s settings (`enabled`, `threshold_chars`, `keep_chars`, `model`,
/// `tool_output_clearing`, `tool_output_keep`, `threshold_tokens`).
pub const UPSERT_SETTINGS: &str = "INSERT INTO session_settings
         (session_id, enabled, threshold_chars, keep_chars, model, tool_output_clearing,
          tool_output_keep, threshold_tokens)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (session_id) DO UPDATE SET
         enabled = excluded.enabled, threshold_chars = excluded.threshold_chars,
         keep_chars = excluded.keep_chars, model = excluded.model,
         tool_output_clearing = excluded.tool_output_clearing,
         tool_output_keep = excluded.tool_output_keep,
         threshold_tokens = excluded.threshold_tokens";

/// Keeps a dead letter unless its `job_key` (`$7`) is kept already; returns its id.
pub const INSERT_DEAD_LETTER: &str = "INSERT INTO dead_letters
         (session_id, subject, msg_id, payload, last_error, deliveries, job_key)
     VALUES ($1, $2, $3, $4, $5, $6, $7)
     ON CONFLICT (job_key) DO NOTHING RETURNING id";

/// Undoes the replay mark of dead letter `$1`.
pub const UNMARK_REPLAYED: &str = "UPDATE dead_letters SET replayed_at = NULL WHERE id = $1";

/// Deletes the replayed dead letters, or all of them when `$1`.
pub const PURGE_DEAD_LETTERS: &str = "DELETE FROM dead_letters WHERE $1 OR replayed_at IS NOT NULL";

/// How many sessions, messages and archived messages there are; each backend adds its
/// count of compactions (`compactions`), which reads the usage event's JSON.
macro_rules! check_totals_sql {
    ($compactions:literal) => {
        concat!(
            "SELECT (SELECT count(*) FROM sessions) AS sessions,
                    (SELECT count(*) FROM messages) AS messages,
                    (SELECT count(*) FROM archived_messages) AS archived_messages, (",
            $compactions,
            ") AS compactions"
        )
    };
}

/// The columns a message is written with and an archived copy keeps: all but `chars`,
/// which the database computes from them, and the archive's `compaction_id`. A restore
/// puts these back exactly.
macro_rules! message_columns_sql {
    () => {
        "session_id, seq, role, content, tool_calls, tool_call_id, is_summary, created_at,
         external_id, extra, cleared_by, block_chars"
    };
}

/// Whether compaction `c` of the archive (a column or a placeholder) is in force: not
/// restored. A restore leaves archived what it could not put back (a cleared original
/// whose row was deleted or edited since): those rows belong to a restored compaction.
macro_rules! in_force_sql {
    ($c:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM usage_events AS u WHERE u.id = ",
            $c,
            " AND u.metadata ->> 'restored_at' IS NOT NULL)"
        )
    };
}

/// The compactions of session `$1` that a restore from `$2` undoes (default: the newest
/// only), newest first.
pub const RESTORABLE_COMPACTIONS: &str = concat!(
    "SELECT DISTINCT compaction_id FROM archived_messages
     WHERE session_id = $1 AND ",
    in_force_sql!("compaction_id"),
    "
       AND compaction_id >= coalesce($2,
           (SELECT max(compaction_id) FROM archived_messages AS a
            WHERE a.session_id = $1 AND ",
    in_force_sql!("a.compaction_id"),
    "))
     ORDER BY compaction_id DESC"
);

/// The cleared originals of compaction `$1` that a restore cannot write back, by seq,
/// with why: their row was deleted since (`deleted`), or no longer holds the compaction's
/// placeholder (`edited`: an edit of its text makes a row the agent's again, its
/// `cleared_by` NULL). They stay archived, where recall reaches them.
pub const UNRESTORABLE_CLEARED: &str = "SELECT a.seq,
            CASE WHEN m.seq IS NULL THEN 'deleted' ELSE 'edited' END AS why
     FROM archived_messages AS a
     LEFT JOIN messages AS m ON m.session_id = a.session_id AND m.seq = a.seq
     WHERE a.compaction_id = $1 AND a.cleared
       AND (m.seq IS NULL OR m.cleared_by IS DISTINCT FROM a.compaction_id)
     ORDER BY a.seq";

/// Writes compaction `$1`'s cleared originals back into the rows that still hold its
/// placeholder, and no other: text a restore did not write is never overwritten.
pub const UNCLEAR: &str = "UPDATE messages
     SET content = a.content, extra = a.extra, cleared_by = a.cleared_by,
         block_chars = a.block_chars
     FROM archived_messages AS a
     WHERE a.compaction_id = $1 AND a.cleared AND messages.cleared_by = $1
       AND messages.session_id = a.session_id AND messages.seq = a.seq";

/// Deletes compaction `$1`'s cleared originals that are back in their rows ([`UNCLEAR`]);
/// the others stay archived.
pub const DELETE_UNCLEARED: &str = "DELETE FROM archived_messages
     WHERE compaction_id = $1 AND cleared
       AND EXISTS (
           SELECT 1 FROM messages AS m
           WHERE m.session_id = archived_messages.session_id
             AND m.seq = archived_messages.seq
             AND m.content IS NOT DISTINCT FROM archived_messages.content
             AND m.cleared_by IS NOT DISTINCT FROM archived_messages.cleared_by)";

/// Deletes the summary compaction `$2` wrote into session `$1`: it took the seq of the
/// first message it removed (a clearing alone removed none, and wrote none).
pub const DELETE_RESTORED_SUMMARY: &str =
    "DELETE FROM messages WHERE session_id = $1 AND is_summary
       AND seq = (SELECT min(seq) FROM archived_messages
                  WHERE compaction_id = $2 AND NOT cleared)";

/// Whether compaction `$1` removed messages (and so wrote a summary), or only cleared.
pub const COMPACTION_REMOVED: &str =
    "SELECT EXISTS (SELECT 1 FROM archived_messages WHERE compaction_id = $1 AND NOT cleared)";

/// After a restore, records as session `$1`'s compaction in force the newest one not
/// undone (or none): clients compare it with the one their state reflects and reload.
pub const LAST_COMPACTION_IN_FORCE: &str = concat!(
    "UPDATE sessions SET last_compaction_id = (
         SELECT max(compaction_id) FROM archived_messages WHERE session_id = $1 AND ",
    in_force_sql!("compaction_id"),
    "
     )
     WHERE session_id = $1"
);

/// Compactions by reason of failure, from the daily rollup, as `(reason, count)`.
pub const FAILURES_BY_REASON: &str =
    "SELECT reason, CAST(sum(failures) AS bigint) FROM failure_daily GROUP BY reason";

/// The duration histogram's non-empty buckets, from the daily rollup, as `(bucket, count)`.
pub const DURATION_BUCKETS: &str = "SELECT bucket, CAST(sum(compactions) AS bigint)
     FROM compaction_duration_daily
     GROUP BY bucket HAVING sum(compactions) > 0 ORDER BY bucket";
