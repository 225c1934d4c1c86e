-- The SQLite store (DATABASE_URL=sqlite:///path/file.db): the schema the Postgres
-- migrations in ../ arrive at, in one file, with the same tables, columns and meaning.
-- What SQLite lacks is stood in for, and each place says how:
-- - types: timestamps are TEXT, RFC 3339 in UTC with milliseconds
--   (`2026-12-03T08:16:00.123Z`, the form the operator commands print), except the
--   lease's and backoff's instants, which are unix milliseconds (INTEGER) bound by the
--   worker; JSON is TEXT checked with json_valid; booleans are INTEGER 0/1; days are
--   TEXT 'YYYY-MM-DD' (UTC), so they compare and sort as dates;
-- - Postgres's statement-level triggers with transition tables become row-level
--   triggers: SQLite has no other kind. A compaction that deletes a thousand rows then
--   updates its session row a thousand times, in one transaction on a local file;
-- - plpgsql functions become trigger bodies and inline expressions (SQLite runs no
--   stored code), and `duration_bucket`'s log2 a lookup table (the bundled SQLite is
--   built without the math functions);
-- - jsonb containment (`metadata @> '{"summarization": true}'`) becomes
--   `json_type(metadata, '$.summarization') = 'true'`, which, like containment, holds
--   for a JSON true only (json_extract would read the number 1 as true as well; where a
--   0/1 value is needed, `IS 'true'`, which is 0 rather than NULL for a missing key),
--   and `metadata ? 'key'` becomes `json_type(metadata, '$.key') IS NOT NULL` (json_type
--   answers 'null' for a key holding JSON null, SQL NULL for a missing key);
-- - a cast of a JSON figure that is not a number (`"abc"::bigint`) fails the statement
--   in Postgres; CAST(... AS INTEGER) reads it as 0.
--
-- No trigger here fires on the column it writes, so none of them loops, with recursive
-- triggers on or off. Every connection of this project turns them on
-- (`PRAGMA recursive_triggers = ON`): only then does SQLite fire the delete trigger for
-- a row that INSERT OR REPLACE (or REPLACE, or UPDATE OR REPLACE) removes, and without
-- it such a write would leave the session's counters counting the removed row.
-- Agents that replace rows must turn them on too; `summarizer check` finds the drift
-- and `summarizer repair` fixes it.

-- Messages: the public table agents append to and read with plain SQL.
CREATE TABLE messages (
    -- A rowid alias, so appends need not supply it (an explicit seq is allowed, as in
    -- Postgres). AUTOINCREMENT: a seq is never handed out twice, even after the newest
    -- row is deleted, as a sequence never goes back. Unlike Postgres, where the key is
    -- (session_id, seq), a seq is unique across sessions: an explicit seq another
    -- session holds is refused.
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id   TEXT    NOT NULL
                 CHECK (typeof(session_id) = 'text' AND session_id <> ''
                        AND length(CAST(session_id AS BLOB)) <= 256),
    role         TEXT    NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    -- Text only, without NUL: length() stops at a NUL, so a message starting with one
    -- would count no chars and never be compacted, and a BLOB would count bytes and not
    -- decode as text. Postgres refuses both at insert too.
    content      TEXT
                 CHECK (content IS NULL OR (typeof(content) = 'text'
                                            AND instr(CAST(content AS BLOB), x'00') = 0)),
    -- JSON text. Named as in Postgres, so an agent's error names the expected shape.
    -- There is no NOT VALID here: every row ever written is checked.
    tool_calls   TEXT
                 CONSTRAINT tool_calls_is_array CHECK (
                     tool_calls IS NULL
                     OR (json_valid(tool_calls) AND json_type(tool_calls) IN ('array', 'null'))
                 ),
    tool_call_id TEXT    CHECK (tool_call_id IS NULL OR typeof(tool_call_id) = 'text'),
    is_summary   INTEGER NOT NULL DEFAULT 0 CHECK (is_summary IN (0, 1)),
    -- The one definition of "chars": length() counts characters of TEXT, as char_length
    -- does. tool_calls counts as stored: Postgres counts jsonb's own rendering of it
    -- (`{"a": 1}`, keys reordered), SQLite the text as the agent wrote it.
    chars        INTEGER GENERATED ALWAYS AS (
                     coalesce(length(content), 0) + coalesce(length(tool_calls), 0)
                 ) STORED,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    external_id  TEXT,
    extra        TEXT    CHECK (extra IS NULL OR json_valid(extra)),
    -- Postgres fingerprints a row by its `xmin`; SQLite has no row versions, so a row
    -- carries its own: a random 64-bit value at insert, drawn again at every update
    -- (messages_row_version below). A row edited, even to the same text, or deleted
    -- and inserted again has another one.
    row_version  INTEGER NOT NULL DEFAULT (random())
);
-- A session's history in seq order.
CREATE UNIQUE INDEX messages_session_seq ON messages (session_id, seq);
CREATE UNIQUE INDEX messages_external_id ON messages (session_id, external_id)
    WHERE external_id IS NOT NULL;

-- One row per session: the counters make the threshold check a primary-key read, and the
-- lease gives single flight.
CREATE TABLE sessions (
    session_id         TEXT    PRIMARY KEY,
    total_chars        INTEGER NOT NULL DEFAULT 0,
    message_count      INTEGER NOT NULL DEFAULT 0,
    human_turns        INTEGER NOT NULL DEFAULT 0,
    lease_owner        TEXT,
    -- Unix milliseconds, not timestamps: the worker compares them with its own clock
    -- (every process sharing the file shares the host's). Integers only: SQLite sorts
    -- any text above any number, so a `datetime('now')` written here by hand would hold
    -- the lease, or the backoff, for ever.
    lease_expires_at   INTEGER CHECK (typeof(lease_expires_at) IN ('integer', 'null')),
    failures           INTEGER NOT NULL DEFAULT 0,
    retry_at           INTEGER CHECK (typeof(retry_at) IN ('integer', 'null')),
    skip_reason        TEXT,
    skip_at_chars      INTEGER,
    skip_at_count      INTEGER,
    skip_at_keep       INTEGER,
    last_compaction_id INTEGER
);

-- The counters, as sessions_track_messages keeps them, a row at a time. Any change to a
-- session's messages also forgets its remembered refusal (skip_reason).
CREATE TRIGGER messages_inserted AFTER INSERT ON messages
BEGIN
    INSERT INTO sessions (session_id, total_chars, message_count, human_turns)
    VALUES (NEW.session_id, NEW.chars, 1, NEW.role = 'user' AND NOT NEW.is_summary)
    ON CONFLICT (session_id) DO UPDATE SET
        total_chars   = total_chars   + excluded.total_chars,
        message_count = message_count + excluded.message_count,
        human_turns   = human_turns   + excluded.human_turns,
        skip_reason   = NULL;
END;

CREATE TRIGGER messages_deleted AFTER DELETE ON messages
BEGIN
    UPDATE sessions SET
        total_chars   = total_chars   - OLD.chars,
        message_count = message_count - 1,
        human_turns   = human_turns   - (OLD.role = 'user' AND NOT OLD.is_summary),
        skip_reason   = NULL
    WHERE session_id = OLD.session_id;
END;

-- Every column but row_version (and chars, which follows the others): Postgres's
-- trigger fires on any UPDATE, so an edit that keeps the counters (a tool_call_id, a
-- role) still forgets the remembered refusal. Not row_version, which the trigger below
-- writes. The old row leaves its session's counters, the new one joins its own (maybe
-- another session, maybe one with no row yet).
CREATE TRIGGER messages_updated
AFTER UPDATE OF seq, session_id, role, content, tool_calls, tool_call_id, is_summary,
                created_at, external_id, extra ON messages
BEGIN
    UPDATE sessions SET
        total_chars   = total_chars   - OLD.chars,
        message_count = message_count - 1,
        human_turns   = human_turns   - (OLD.role = 'user' AND NOT OLD.is_summary),
        skip_reason   = NULL
    WHERE session_id = OLD.session_id;
    INSERT INTO sessions (session_id, total_chars, message_count, human_turns)
    VALUES (NEW.session_id, NEW.chars, 1, NEW.role = 'user' AND NOT NEW.is_summary)
    ON CONFLICT (session_id) DO UPDATE SET
        total_chars   = total_chars   + excluded.total_chars,
        message_count = message_count + excluded.message_count,
        human_turns   = human_turns   + excluded.human_turns,
        skip_reason   = NULL;
END;

-- A new row version at every update of the row's content: what `xmin` gives Postgres.
CREATE TRIGGER messages_row_version
AFTER UPDATE OF seq, session_id, role, content, tool_calls, tool_call_id, is_summary,
                created_at, external_id, extra ON messages
BEGIN
    UPDATE messages SET row_version = random() WHERE seq = NEW.seq;
END;

-- (Postgres resets the counters on TRUNCATE; SQLite has none, and `DELETE FROM messages`
-- fires messages_deleted for each row, since a table with triggers is never truncated.)

-- One row per LLM call a summarization made; other usage may live here too, told apart by
-- metadata.
CREATE TABLE usage_events (
    -- AUTOINCREMENT: an id is never reused, so an archive's compaction_id never names
    -- a later event.
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id        TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    total_tokens      INTEGER,
    metadata          TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    created_at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX usage_events_session ON usage_events (session_id, created_at);
-- The last summarization in force, read backwards from an index. The condition is
-- spelled exactly as the queries spell it, so the planner can use it.
CREATE INDEX usage_events_summarizations ON usage_events (created_at)
    WHERE json_type(metadata, '$.summarization') = 'true'
      AND json_type(metadata, '$.restored_at') IS NULL;

-- Every message a compaction removed, with the compaction (usage event) that removed it.
-- No foreign key, as in Postgres: `summarizer check` audits it.
CREATE TABLE archived_messages (
    compaction_id INTEGER NOT NULL,
    session_id    TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    role          TEXT    NOT NULL,
    content       TEXT,
    tool_calls    TEXT,
    tool_call_id  TEXT,
    is_summary    INTEGER NOT NULL,
    chars         INTEGER NOT NULL,
    created_at    TEXT    NOT NULL,
    archived_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    external_id   TEXT,
    extra         TEXT,
    PRIMARY KEY (compaction_id, seq)
);
CREATE INDEX archived_messages_session ON archived_messages (session_id, seq);
CREATE INDEX archived_messages_external_id ON archived_messages (session_id, external_id)
    WHERE external_id IS NOT NULL;

-- Daily rollups behind /stats, kept by the triggers on usage_events below, in the
-- compaction's own transaction.
CREATE TABLE compaction_daily (
    day               TEXT    PRIMARY KEY,
    compactions       INTEGER NOT NULL DEFAULT 0,
    messages_removed  INTEGER NOT NULL DEFAULT 0,
    chars_removed     INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    tokens_removed    INTEGER NOT NULL DEFAULT 0,
    fact_checked      INTEGER NOT NULL DEFAULT 0,
    fact_recall_sum   REAL    NOT NULL DEFAULT 0,
    precomputed       INTEGER NOT NULL DEFAULT 0
);

-- Compaction durations as a histogram: bucket b counts compactions that took less than
-- 2^(b/2) ms.
CREATE TABLE compaction_duration_daily (
    day         TEXT    NOT NULL,
    bucket      INTEGER NOT NULL,
    compactions INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, bucket)
);

-- Failures the database can see (llm_error, conflict).
CREATE TABLE failure_daily (
    day      TEXT    NOT NULL,
    reason   TEXT    NOT NULL,
    failures INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, reason)
);

-- Postgres's duration_bucket(ms) = least(60, floor(2 * log2(greatest(ms, 1))) + 1),
-- without log2: bucket b holds the durations under upper_ms = 2^(b/2), so the bucket of
-- ms is the first whose bound is above it (60 past them all). Even buckets' bounds are
-- exact powers of two; odd ones are 2^((b-1)/2) x sqrt 2, irrational, so no integer ms
-- lies on them and the double's rounding cannot move one across. greatest(ms, 1) needs
-- no counterpart: every ms under 1.41 is in bucket 1 either way, and as greatest skips a
-- NULL, a JSON null duration counts as 1 ms (coalesce below).
CREATE TABLE duration_buckets (
    bucket   INTEGER PRIMARY KEY,
    upper_ms REAL    NOT NULL
);
WITH RECURSIVE b (bucket) AS (
    SELECT 1 UNION ALL SELECT bucket + 1 FROM b WHERE bucket < 60
)
INSERT INTO duration_buckets (bucket, upper_ms)
SELECT bucket,
       CASE WHEN bucket % 2 = 0 THEN 1 << (bucket / 2)
            ELSE (1 << (bucket / 2)) * 1.4142135623730951
       END
FROM b;

-- usage_events_rollup and usage_events_precomputed_rollup, a row at a time and only for
-- summarizations (the WHEN). Tokens of the calls and fact recall count every
-- summarization; compactions, their figures and their durations only those in force (no
-- restored_at). fact_recall(metadata) is inlined: facts_kept / facts_total when both
-- are JSON numbers and the total is positive, else NULL (not counted). The nested CASEs
-- keep a malformed figure from being divided.
CREATE TRIGGER usage_events_inserted AFTER INSERT ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
BEGIN
    INSERT INTO compaction_daily
        (day, compactions, messages_removed, chars_removed, tokens_removed,
         prompt_tokens, completion_tokens, fact_checked, fact_recall_sum, precomputed)
    SELECT day, in_force, in_force * messages, in_force * chars, in_force * tokens,
           prompt, completion, recall IS NOT NULL, coalesce(recall, 0),
           in_force AND precomputed
    FROM (
        SELECT substr(NEW.created_at, 1, 10) AS day,
               json_type(NEW.metadata, '$.restored_at') IS NULL AS in_force,
               coalesce(CAST(json_extract(NEW.metadata, '$.messages_removed') AS INTEGER), 0)
                   AS messages,
               coalesce(CAST(json_extract(NEW.metadata, '$.chars_removed') AS INTEGER), 0)
                   AS chars,
               coalesce(CAST(json_extract(NEW.metadata, '$.tokens_removed') AS INTEGER), 0)
                   AS tokens,
               coalesce(NEW.prompt_tokens, 0) AS prompt,
               coalesce(NEW.completion_tokens, 0) AS completion,
               CASE WHEN json_type(NEW.metadata, '$.facts_total') IN ('integer', 'real')
                         AND json_type(NEW.metadata, '$.facts_kept') IN ('integer', 'real')
                    THEN CASE WHEN json_extract(NEW.metadata, '$.facts_total') > 0
                         THEN CAST(json_extract(NEW.metadata, '$.facts_kept') AS REAL)
                              / json_extract(NEW.metadata, '$.facts_total')
                         END
               END AS recall,
               json_type(NEW.metadata, '$.precomputed') IS 'true' AS precomputed
    )
    -- The WHERE tells SQLite's parser the ON CONFLICT is the upsert's, not a join's.
    WHERE true
    ON CONFLICT (day) DO UPDATE SET
        compactions       = compactions       + excluded.compactions,
        messages_removed  = messages_removed  + excluded.messages_removed,
        chars_removed     = chars_removed     + excluded.chars_removed,
        tokens_removed    = tokens_removed    + excluded.tokens_removed,
        prompt_tokens     = prompt_tokens     + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        fact_checked      = fact_checked      + excluded.fact_checked,
        fact_recall_sum   = fact_recall_sum   + excluded.fact_recall_sum,
        precomputed       = precomputed       + excluded.precomputed;
    INSERT INTO compaction_duration_daily (day, bucket, compactions)
    SELECT substr(NEW.created_at, 1, 10),
           coalesce((SELECT min(bucket) FROM duration_buckets
                     WHERE upper_ms > coalesce(CAST(json_extract(NEW.metadata, '$.duration_ms')
                                                    AS INTEGER), 1)), 60),
           1
    WHERE json_type(NEW.metadata, '$.restored_at') IS NULL
      AND json_type(NEW.metadata, '$.duration_ms') IS NOT NULL
    ON CONFLICT (day, bucket) DO UPDATE SET compactions = compactions + 1;
END;

-- `summarizer restore` marks an event restored: its compaction no longer counts (its
-- tokens and recall still do). Only the update that adds restored_at subtracts.
CREATE TRIGGER usage_events_updated AFTER UPDATE OF metadata ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
     AND json_type(NEW.metadata, '$.restored_at') IS NOT NULL
     AND json_type(OLD.metadata, '$.restored_at') IS NULL
BEGIN
    UPDATE compaction_daily SET
        compactions      = compactions - 1,
        messages_removed = messages_removed
            - coalesce(CAST(json_extract(NEW.metadata, '$.messages_removed') AS INTEGER), 0),
        chars_removed    = chars_removed
            - coalesce(CAST(json_extract(NEW.metadata, '$.chars_removed') AS INTEGER), 0),
        tokens_removed   = tokens_removed
            - coalesce(CAST(json_extract(NEW.metadata, '$.tokens_removed') AS INTEGER), 0),
        precomputed      = precomputed
            - (json_type(NEW.metadata, '$.precomputed') IS 'true')
    WHERE day = substr(NEW.created_at, 1, 10);
    UPDATE compaction_duration_daily SET compactions = compactions - 1
    WHERE json_type(NEW.metadata, '$.duration_ms') IS NOT NULL
      AND day = substr(NEW.created_at, 1, 10)
      AND bucket = coalesce((SELECT min(bucket) FROM duration_buckets
                             WHERE upper_ms > coalesce(CAST(json_extract(NEW.metadata,
                                                       '$.duration_ms') AS INTEGER), 1)), 60);
END;

-- The public aggregates, from the rollups. last_summarization_at is the stored text (the
-- greatest of RFC 3339 UTC texts of one form is the latest instant).
CREATE VIEW summarization_stats AS
SELECT coalesce(sum(compactions), 0)       AS total_summarizations,
       coalesce(sum(chars_removed), 0)     AS total_chars_compacted,
       coalesce(sum(messages_removed), 0)  AS total_messages_compacted,
       coalesce(sum(prompt_tokens), 0)     AS prompt_tokens,
       coalesce(sum(completion_tokens), 0) AS completion_tokens,
       (SELECT max(created_at) FROM usage_events
        WHERE json_type(metadata, '$.summarization') = 'true'
          AND json_type(metadata, '$.restored_at') IS NULL)
                                           AS last_summarization_at,
       coalesce(sum(tokens_removed), 0)    AS total_tokens_compacted,
       sum(fact_recall_sum) / nullif(sum(fact_checked), 0)
                                           AS mean_fact_recall,
       coalesce(sum(precomputed), 0)       AS total_precomputed
FROM compaction_daily;

-- Per-session settings; NULL inherits the configured value. No foreign key to sessions.
CREATE TABLE session_settings (
    session_id      TEXT    PRIMARY KEY
                    CHECK (session_id <> '' AND length(CAST(session_id AS BLOB)) <= 256),
    enabled         INTEGER CHECK (enabled IN (0, 1)),
    threshold_chars INTEGER CHECK (threshold_chars > 0),
    keep_chars      INTEGER CHECK (keep_chars > 0),
    model           TEXT    CHECK (model <> ''),
    updated_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CHECK (keep_chars < threshold_chars)
);

-- updated_at follows every UPDATE of the settings. SQLite's triggers cannot assign NEW,
-- so the row is written again after the update; the trigger does not fire on
-- updated_at itself, so it does not fire on its own write (where Postgres would also
-- overwrite an UPDATE of updated_at alone, this keeps it).
CREATE TRIGGER session_settings_touch
AFTER UPDATE OF session_id, enabled, threshold_chars, keep_chars, model ON session_settings
BEGIN
    UPDATE session_settings SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    WHERE session_id = NEW.session_id;
END;

-- Summaries prepared before the threshold (SUMMARIZATION_PRECOMPUTE_AT), not applied.
-- The planned prefix is identified as the commit identifies it: each removed row's seq,
-- chars and row version, here JSON arrays (SQLite has no array type) in seq order.
CREATE TABLE pending_summaries (
    session_id        TEXT    PRIMARY KEY,
    cut_seq           INTEGER NOT NULL,
    removed_seqs      TEXT    NOT NULL
                      CHECK (json_valid(removed_seqs) AND json_array_length(removed_seqs) > 0),
    removed_chars     TEXT    NOT NULL CHECK (json_valid(removed_chars)),
    removed_versions  TEXT    NOT NULL CHECK (json_valid(removed_versions)),
    prefix_hash       TEXT    NOT NULL,
    threshold_chars   INTEGER NOT NULL,
    keep_chars        INTEGER NOT NULL,
    requested_model   TEXT,
    summary           TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    metadata          TEXT    NOT NULL CHECK (json_valid(metadata)),
    -- Unix milliseconds, bound by the worker, like the lease: its age is compared with
    -- the worker's clock.
    created_at        INTEGER NOT NULL
);
CREATE INDEX pending_summaries_created_at ON pending_summaries (created_at);

-- Jobs that failed JETSTREAM_MAX_DELIVER times, kept for `summarizer dead-letters`.
CREATE TABLE dead_letters (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  TEXT,
    subject     TEXT    NOT NULL,
    msg_id      TEXT,
    payload     TEXT    NOT NULL,
    last_error  TEXT    NOT NULL,
    deliveries  INTEGER NOT NULL,
    created_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    replayed_at TEXT,
    -- One dead letter per job (stream, sequence, publish time); NULLs do not collide.
    job_key     TEXT    UNIQUE
);
CREATE INDEX dead_letters_pending ON dead_letters (created_at) WHERE replayed_at IS NULL;
