-- What compaction saves, net of its cost, and idle compaction (issue 38), as Postgres
-- migration 24 (which says what each column means). `idle_since` is Unix milliseconds,
-- as the lease's instants are here, to the second.
ALTER TABLE sessions ADD COLUMN model_turns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN tokens_saved_per_turn INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN tokens_saved_offset INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN tokens_saved_banked INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN idle_since INTEGER
    CHECK (typeof(idle_since) IN ('integer', 'null'));

CREATE INDEX sessions_idle ON sessions (idle_since) WHERE idle_since IS NOT NULL;

ALTER TABLE usage_events ADD COLUMN model_turns INTEGER;

-- Postgres's tokens_saved_of: removed + cleared in place - summary, each a JSON integer
-- or 0.
ALTER TABLE usage_events ADD COLUMN tokens_saved INTEGER GENERATED ALWAYS AS (
      CASE WHEN json_type(metadata, '$.tokens_removed') = 'integer'
           THEN max(json_extract(metadata, '$.tokens_removed'), 0) ELSE 0 END
    + CASE WHEN json_type(metadata, '$.tokens_cleared') = 'integer'
           THEN max(json_extract(metadata, '$.tokens_cleared'), 0) ELSE 0 END
    - CASE WHEN json_type(metadata, '$.summary_tokens') = 'integer'
           THEN max(json_extract(metadata, '$.summary_tokens'), 0) ELSE 0 END
) VIRTUAL;

-- As migration 10's, with the model turns and the idle clock.
DROP TRIGGER messages_inserted;
CREATE TRIGGER messages_inserted AFTER INSERT ON messages
BEGIN
    INSERT INTO sessions (session_id, total_chars, message_count, human_turns,
                          largest_output_chars, model_turns, idle_since)
    VALUES (NEW.session_id, NEW.chars, 1, NEW.role = 'user' AND NOT NEW.is_summary,
            CASE WHEN NEW.role = 'tool' AND NEW.tool_call_id IS NOT NULL AND NEW.cleared_by IS NULL AND NOT NEW.pinned
                 THEN NEW.chars ELSE 0 END,
            NEW.role = 'assistant' AND NOT NEW.is_summary,
            CASE WHEN NOT NEW.is_summary THEN CAST(strftime('%s', 'now') AS INTEGER) * 1000 END)
    ON CONFLICT (session_id) DO UPDATE SET
        total_chars   = total_chars   + excluded.total_chars,
        message_count = message_count + excluded.message_count,
        human_turns   = human_turns   + excluded.human_turns,
        largest_output_chars = max(largest_output_chars, excluded.largest_output_chars),
        model_turns   = model_turns   + excluded.model_turns,
        idle_since    = coalesce(excluded.idle_since, idle_since),
        skip_reason   = NULL;
END;

-- A compaction's event takes the session's turns, and its savings join the session's.
CREATE TRIGGER usage_events_savings AFTER INSERT ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
     AND json_type(NEW.metadata, '$.restored_at') IS NULL
BEGIN
    UPDATE usage_events
    SET model_turns = (SELECT model_turns FROM sessions WHERE session_id = NEW.session_id)
    WHERE id = NEW.id;
    UPDATE sessions SET
        tokens_saved_per_turn = tokens_saved_per_turn + NEW.tokens_saved,
        tokens_saved_offset   = tokens_saved_offset + NEW.tokens_saved * model_turns
    WHERE session_id = NEW.session_id;
END;

-- A restored compaction saves no more: what it saved until now is banked.
CREATE TRIGGER usage_events_savings_restored AFTER UPDATE OF metadata ON usage_events
WHEN NEW.model_turns IS NOT NULL
     AND json_type(NEW.metadata, '$.summarization') = 'true'
     AND json_type(NEW.metadata, '$.restored_at') IS NOT NULL
     AND json_type(OLD.metadata, '$.restored_at') IS NULL
BEGIN
    UPDATE sessions SET
        tokens_saved_banked   = tokens_saved_banked
                                + NEW.tokens_saved * (model_turns - NEW.model_turns),
        tokens_saved_per_turn = tokens_saved_per_turn - NEW.tokens_saved,
        tokens_saved_offset   = tokens_saved_offset - NEW.tokens_saved * NEW.model_turns
    WHERE session_id = NEW.session_id;
END;
