-- Store hardening: remembered planner refusals, and counters that survive TRUNCATE.

-- A session the planner refused (no_safe_boundary, nothing_to_compact) is answered from
-- its counters until they change, instead of taking the lease and loading its whole
-- history on every turn. The counters recorded are those of the history the decision was
-- planned on (not the row's at release time), so an append racing the decision still
-- makes it stale.
ALTER TABLE sessions
    ADD COLUMN skip_reason   text,
    ADD COLUMN skip_at_chars bigint,
    ADD COLUMN skip_at_count integer;

-- As before, and any change to a session's messages also forgets its remembered refusal:
-- an edit that keeps the counters (a role, a tool_call_id) may change the plan. Same
-- statements, so appends pay nothing more.
CREATE OR REPLACE FUNCTION sessions_track_messages() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO sessions AS s (session_id, total_chars, message_count, human_turns)
        SELECT session_id, sum(chars), count(*),
               count(*) FILTER (WHERE role = 'user' AND NOT is_summary)
        FROM new_rows
        GROUP BY session_id
        ORDER BY session_id
        ON CONFLICT (session_id) DO UPDATE SET
            total_chars   = s.total_chars   + excluded.total_chars,
            message_count = s.message_count + excluded.message_count,
            human_turns   = s.human_turns   + excluded.human_turns,
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

-- TRUNCATE fires no row or DELETE trigger, so the counters kept what was truncated.
-- The session rows stay (with their leases and backoff); their counters go to zero.
CREATE FUNCTION sessions_reset_counters() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sessions SET total_chars = 0, message_count = 0, human_turns = 0,
        skip_reason = NULL
    WHERE total_chars <> 0 OR message_count <> 0 OR human_turns <> 0
       OR skip_reason IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_truncated AFTER TRUNCATE ON messages
    FOR EACH STATEMENT EXECUTE FUNCTION sessions_reset_counters();
