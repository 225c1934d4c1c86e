-- As the Postgres migration of the same name: what is not text weighs too
-- (`block_chars`, in chars), and the largest tool output a compaction could evict is kept
-- with the counters (`sessions.largest_output_chars`), raised by every write of a tool
-- result and set exactly by each compaction and planner refusal under the lease.
--
-- SQLite cannot change a generated column's expression, nor add a STORED one: `chars` is
-- dropped (with the counters' triggers that read it) and added again as VIRTUAL, so it is
-- computed where it is read, from the same columns. The triggers are created again as
-- before, with the weight and the largest output.
DROP TRIGGER messages_inserted;
DROP TRIGGER messages_updated;
DROP TRIGGER messages_deleted;
DROP TRIGGER messages_row_version;
ALTER TABLE messages DROP COLUMN chars;
ALTER TABLE messages ADD COLUMN block_chars INTEGER
    CHECK (block_chars IS NULL OR (typeof(block_chars) = 'integer' AND block_chars >= 0));
ALTER TABLE messages ADD COLUMN chars INTEGER GENERATED ALWAYS AS (
    coalesce(length(content), 0) + coalesce(length(tool_calls), 0) + coalesce(block_chars, 0)
) VIRTUAL;
ALTER TABLE archived_messages ADD COLUMN block_chars INTEGER;
ALTER TABLE sessions ADD COLUMN largest_output_chars INTEGER NOT NULL DEFAULT 0;

-- The blocks' weight by the rule, when a writer gave none (the Python client gives it,
-- from each image's pixel size): text and tool-call blocks 0, a `compaction` block its
-- `encrypted_content` (OpenAI's opaque item; Anthropic's has none, its text is the
-- message's `content`), `thinking` its text,
-- `redacted_thinking` its payload, `reasoning` its texts and payload, anything else (an
-- image, a file, audio) 1,600 tokens at 4 chars a token.
CREATE TRIGGER messages_weigh_blocks AFTER INSERT ON messages
WHEN NEW.block_chars IS NULL AND NEW.extra IS NOT NULL
BEGIN
    UPDATE messages SET block_chars = (SELECT coalesce(sum(CASE
                 WHEN b.type <> 'object' THEN 0
                 WHEN json_extract(b.value, '$.type') LIKE '%text' THEN 0
                 WHEN json_extract(b.value, '$.type') IN ('tool_use', 'tool_call', 'tool_call_chunk',
                     'function_call', 'server_tool_use', 'server_tool_call', 'invalid_tool_call') THEN 0
                 WHEN json_extract(b.value, '$.type') = 'compaction'
                     THEN coalesce(length(json_extract(b.value, '$.encrypted_content')), 0)
                 WHEN json_extract(b.value, '$.type') = 'thinking'
                     THEN coalesce(length(json_extract(b.value, '$.thinking')), 0)
                 WHEN json_extract(b.value, '$.type') = 'redacted_thinking'
                     THEN coalesce(length(json_extract(b.value, '$.data')), 0)
                 WHEN json_extract(b.value, '$.type') = 'reasoning'
                     THEN (coalesce(length(json_extract(b.value, '$.reasoning')), 0) + coalesce(length(json_extract(b.value, '$.text')), 0) + coalesce(length(json_extract(b.value, '$.encrypted_content')), 0) + coalesce((SELECT sum(length(json_extract(s.value, '$.text'))) FROM json_each(CASE WHEN json_type(b.value, '$.summary') = 'array' THEN json_extract(b.value, '$.summary') ELSE '[]' END) AS s), 0))
                 ELSE 6400 END), 0)
             FROM json_each(CASE WHEN json_type(NEW.extra, '$.data.content') = 'array'
                                 THEN json_extract(NEW.extra, '$.data.content') ELSE '[]' END) AS b)
            + CASE WHEN json_type(NEW.extra, '$.data.additional_kwargs.reasoning') = 'object'
                   THEN (coalesce(length(json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.reasoning')), 0) + coalesce(length(json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.text')), 0) + coalesce(length(json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.encrypted_content')), 0) + coalesce((SELECT sum(length(json_extract(s.value, '$.text'))) FROM json_each(CASE WHEN json_type(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.summary') = 'array' THEN json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.summary') ELSE '[]' END) AS s), 0))
                   ELSE 0 END WHERE seq = NEW.seq;
END;

CREATE TRIGGER messages_reweigh_blocks AFTER UPDATE OF extra, block_chars ON messages
WHEN NEW.block_chars IS NULL AND NEW.extra IS NOT NULL
BEGIN
    UPDATE messages SET block_chars = (SELECT coalesce(sum(CASE
                 WHEN b.type <> 'object' THEN 0
                 WHEN json_extract(b.value, '$.type') LIKE '%text' THEN 0
                 WHEN json_extract(b.value, '$.type') IN ('tool_use', 'tool_call', 'tool_call_chunk',
                     'function_call', 'server_tool_use', 'server_tool_call', 'invalid_tool_call') THEN 0
                 WHEN json_extract(b.value, '$.type') = 'compaction'
                     THEN coalesce(length(json_extract(b.value, '$.encrypted_content')), 0)
                 WHEN json_extract(b.value, '$.type') = 'thinking'
                     THEN coalesce(length(json_extract(b.value, '$.thinking')), 0)
                 WHEN json_extract(b.value, '$.type') = 'redacted_thinking'
                     THEN coalesce(length(json_extract(b.value, '$.data')), 0)
                 WHEN json_extract(b.value, '$.type') = 'reasoning'
                     THEN (coalesce(length(json_extract(b.value, '$.reasoning')), 0) + coalesce(length(json_extract(b.value, '$.text')), 0) + coalesce(length(json_extract(b.value, '$.encrypted_content')), 0) + coalesce((SELECT sum(length(json_extract(s.value, '$.text'))) FROM json_each(CASE WHEN json_type(b.value, '$.summary') = 'array' THEN json_extract(b.value, '$.summary') ELSE '[]' END) AS s), 0))
                 ELSE 6400 END), 0)
             FROM json_each(CASE WHEN json_type(NEW.extra, '$.data.content') = 'array'
                                 THEN json_extract(NEW.extra, '$.data.content') ELSE '[]' END) AS b)
            + CASE WHEN json_type(NEW.extra, '$.data.additional_kwargs.reasoning') = 'object'
                   THEN (coalesce(length(json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.reasoning')), 0) + coalesce(length(json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.text')), 0) + coalesce(length(json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.encrypted_content')), 0) + coalesce((SELECT sum(length(json_extract(s.value, '$.text'))) FROM json_each(CASE WHEN json_type(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.summary') = 'array' THEN json_extract(json_extract(NEW.extra, '$.data.additional_kwargs.reasoning'), '$.summary') ELSE '[]' END) AS s), 0))
                   ELSE 0 END WHERE seq = NEW.seq;
END;

-- The rows written before, weighed by the trigger above.
UPDATE messages SET block_chars = NULL WHERE extra IS NOT NULL;

-- Every session's counters again, now that chars weigh the blocks, and its largest output.
UPDATE sessions SET
    total_chars = coalesce((SELECT sum(chars) FROM messages m
                            WHERE m.session_id = sessions.session_id), 0),
    largest_output_chars = coalesce((SELECT max(chars) FROM messages m
                                     WHERE m.session_id = sessions.session_id
                                       AND m.role = 'tool' AND m.tool_call_id IS NOT NULL AND m.cleared_by IS NULL
                                       AND NOT m.pinned), 0);

-- The counters, as schema migration 1 keeps them, with the largest output.
CREATE TRIGGER messages_inserted AFTER INSERT ON messages
BEGIN
    INSERT INTO sessions (session_id, total_chars, message_count, human_turns,
                          largest_output_chars)
    VALUES (NEW.session_id, NEW.chars, 1, NEW.role = 'user' AND NOT NEW.is_summary,
            CASE WHEN NEW.role = 'tool' AND NEW.tool_call_id IS NOT NULL AND NEW.cleared_by IS NULL AND NOT NEW.pinned
                 THEN NEW.chars ELSE 0 END)
    ON CONFLICT (session_id) DO UPDATE SET
        total_chars   = total_chars   + excluded.total_chars,
        message_count = message_count + excluded.message_count,
        human_turns   = human_turns   + excluded.human_turns,
        largest_output_chars = max(largest_output_chars, excluded.largest_output_chars),
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

-- As before, and the weight (which changes chars), the pin and cleared_by (which decide
-- whether an output is one a compaction could evict).
CREATE TRIGGER messages_updated
AFTER UPDATE OF seq, session_id, role, content, tool_calls, tool_call_id, is_summary,
                created_at, external_id, extra, block_chars, pinned, cleared_by ON messages
BEGIN
    UPDATE sessions SET
        total_chars   = total_chars   - OLD.chars,
        message_count = message_count - 1,
        human_turns   = human_turns   - (OLD.role = 'user' AND NOT OLD.is_summary),
        skip_reason   = NULL
    WHERE session_id = OLD.session_id;
    INSERT INTO sessions (session_id, total_chars, message_count, human_turns,
                          largest_output_chars)
    VALUES (NEW.session_id, NEW.chars, 1, NEW.role = 'user' AND NOT NEW.is_summary,
            CASE WHEN NEW.role = 'tool' AND NEW.tool_call_id IS NOT NULL AND NEW.cleared_by IS NULL AND NOT NEW.pinned
                 THEN NEW.chars ELSE 0 END)
    ON CONFLICT (session_id) DO UPDATE SET
        total_chars   = total_chars   + excluded.total_chars,
        message_count = message_count + excluded.message_count,
        human_turns   = human_turns   + excluded.human_turns,
        largest_output_chars = max(largest_output_chars, excluded.largest_output_chars),
        skip_reason   = NULL;
END;

-- A new row version at every update of the row's content, the weight included.
CREATE TRIGGER messages_row_version
AFTER UPDATE OF seq, session_id, role, content, tool_calls, tool_call_id, is_summary,
                created_at, external_id, extra, block_chars ON messages
BEGIN
    UPDATE messages SET row_version = random() WHERE seq = NEW.seq;
END;
