-- What compaction saves, net of its cost, and idle compaction (issue 38; docs/protocol.md,
-- "What compaction costs" and "Idle compaction").
--
-- `model_turns`: the model calls the session's agent made, counted as the assistant
-- messages it inserted (one per call), by the counters' trigger at no extra write. A
-- summary is not one, nor is an edit, and `summarizer restore` takes back the ones its
-- re-inserts would add.
--
-- The savings of the compactions in force, kept per session so that /stats needs no
-- pass over the usage events: a compaction that took `saved` tokens out of the context
-- (removed + cleared in place - summary) when the session had made T_c turns has saved
-- saved x (model_turns - T_c) tokens since. Summed over the session's compactions in
-- force, that is model_turns x `tokens_saved_per_turn` - `tokens_saved_offset` (the sum
-- of saved x T_c); a restore banks what its compaction saved until then in
-- `tokens_saved_banked`. Numeric, not bigint: a product never overflows the commit.
--
-- `idle_since`: when the agent last inserted a message (the statement's time, not its
-- transaction's), to the second (so that a burst of inserts in one second writes the
-- indexed column once); NULL once an idle pass has claimed the session. The partial
-- index is the schedule: a pass reads the sessions idle longest, in order, and takes each
-- out of it. Building it locks `sessions` against writes for as long as a scan of the
-- table takes (seconds at a million sessions): agents' inserts wait meanwhile.
ALTER TABLE sessions
    ADD COLUMN model_turns           bigint  NOT NULL DEFAULT 0,
    ADD COLUMN tokens_saved_per_turn bigint  NOT NULL DEFAULT 0,
    ADD COLUMN tokens_saved_offset   numeric NOT NULL DEFAULT 0,
    ADD COLUMN tokens_saved_banked   numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_since            timestamptz;

CREATE INDEX sessions_idle ON sessions (idle_since) WHERE idle_since IS NOT NULL;

-- The session's model turns when the compaction was written (NULL for compactions
-- written before this migration, which count no savings).
ALTER TABLE usage_events ADD COLUMN model_turns bigint;

-- As migration 22's, with the model turns and the idle clock, both moved by inserts only.
CREATE OR REPLACE FUNCTION sessions_track_messages() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO sessions AS s
            (session_id, total_chars, message_count, human_turns, largest_output_chars,
             model_turns, idle_since)
        SELECT session_id, sum(chars), count(*),
               count(*) FILTER (WHERE role = 'user' AND NOT is_summary),
               coalesce(max(chars) FILTER (WHERE role = 'tool' AND tool_call_id IS NOT NULL AND cleared_by IS NULL
                                            AND NOT pinned), 0),
               CASE WHEN TG_OP = 'INSERT'
                    THEN count(*) FILTER (WHERE role = 'assistant' AND NOT is_summary) ELSE 0 END,
               CASE WHEN TG_OP = 'INSERT' AND bool_or(NOT is_summary)
                    THEN date_trunc('second', statement_timestamp()) END
        FROM new_rows
        GROUP BY session_id
        ORDER BY session_id
        ON CONFLICT (session_id) DO UPDATE SET
            total_chars   = s.total_chars   + excluded.total_chars,
            message_count = s.message_count + excluded.message_count,
            human_turns   = s.human_turns   + excluded.human_turns,
            largest_output_chars = greatest(s.largest_output_chars,
                                            excluded.largest_output_chars),
            model_turns   = s.model_turns   + excluded.model_turns,
            idle_since    = coalesce(excluded.idle_since, s.idle_since),
            skip_reason   = NULL;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE sessions AS s SET
            total_chars   = s.total_chars   - d.chars,
            message_count = s.message_count - d.n,
            human_turns   = s.human_turns   - d.turns,
            skip_reason   = NULL
        FROM (
            SELECT session_id, sum(chars) AS chars, count(*) AS n,
                   count(*) FILTER (WHERE role = 'user' AND NOT is_summary) AS turns
            FROM old_rows
            GROUP BY session_id
        ) AS d
        WHERE s.session_id = d.session_id;
    END IF;
    RETURN NULL;
END
$$;

-- The tokens a compaction took out of the context for every later turn: what it removed
-- and what it cleared in place, less its summary. Negative when the summary is longer.
-- Summed as numeric and clamped (to 2^50), so that absurd metadata never fails a commit.
CREATE FUNCTION tokens_saved_of(metadata jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT least(greatest(metadata_count(metadata, 'tokens_removed')::numeric
                          + metadata_count(metadata, 'tokens_cleared')
                          - metadata_count(metadata, 'summary_tokens'),
                          -1125899906842624), 1125899906842624)::bigint
$$;

-- A compaction's event takes the session's turns, and its savings join the session's.
-- The commit (and a pending summary's apply) holds the session's row already.
CREATE FUNCTION usage_events_savings() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    saved bigint := tokens_saved_of(NEW.metadata);
BEGIN
    UPDATE sessions SET
        tokens_saved_per_turn = tokens_saved_per_turn + saved,
        tokens_saved_offset   = tokens_saved_offset + saved::numeric * model_turns
    WHERE session_id = NEW.session_id
    RETURNING model_turns INTO NEW.model_turns;
    RETURN NEW;
END
$$;

CREATE TRIGGER usage_events_savings BEFORE INSERT ON usage_events
    FOR EACH ROW
    WHEN (NEW.metadata @> '{"summarization": true}' AND NOT NEW.metadata ? 'restored_at')
    EXECUTE FUNCTION usage_events_savings();

-- A restored compaction saves no more: what it saved until now is banked.
CREATE FUNCTION usage_events_savings_restored() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    saved bigint := tokens_saved_of(NEW.metadata);
BEGIN
    UPDATE sessions SET
        tokens_saved_banked   = tokens_saved_banked
                                + saved::numeric * (model_turns - NEW.model_turns),
        tokens_saved_per_turn = tokens_saved_per_turn - saved,
        tokens_saved_offset   = tokens_saved_offset - saved::numeric * NEW.model_turns
    WHERE session_id = NEW.session_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_events_savings_restored AFTER UPDATE OF metadata ON usage_events
    FOR EACH ROW
    WHEN (NEW.model_turns IS NOT NULL AND NEW.metadata @> '{"summarization": true}'
          AND NEW.metadata ? 'restored_at' AND NOT OLD.metadata ? 'restored_at')
    EXECUTE FUNCTION usage_events_savings_restored();
