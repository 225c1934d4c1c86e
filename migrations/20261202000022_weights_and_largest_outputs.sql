-- What is not text weighs too, and the largest tool output is known without a load
-- (docs/protocol.md, "The schema"; docs/compaction.md, "Evicting one huge output").

-- The weight, in chars (the unit thresholds use), of a message's content blocks that are
-- not text: images, thinking, reasoning, files. A writer sets it (the Python client does,
-- from each image's pixel size); when it is NULL on insert, the database weighs the
-- blocks in `extra` itself (`block_chars_of`, images at the fixed charge). Text blocks are
-- in `content` already, and calls in `tool_calls`.
ALTER TABLE messages ADD COLUMN block_chars integer CHECK (block_chars >= 0);
ALTER TABLE archived_messages ADD COLUMN block_chars integer;

-- One reasoning item's weight: its texts and its encrypted payload (OpenAI's reasoning
-- items, LangChain's `reasoning` blocks).
CREATE FUNCTION reasoning_chars_of(item jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(char_length(item ->> 'reasoning'), 0)
         + coalesce(char_length(item ->> 'text'), 0)
         + coalesce(char_length(item ->> 'encrypted_content'), 0)
         + coalesce((SELECT sum(char_length(s ->> 'text'))
                     FROM jsonb_array_elements(CASE WHEN jsonb_typeof(item -> 'summary') = 'array'
                                                    THEN item -> 'summary' ELSE '[]' END) AS s), 0)::integer
$$;

-- The rule (the Python client's `_weight` applies the same, with pixel sizes): text and
-- tool-call blocks 0, a `compaction` block its `encrypted_content` (OpenAI's opaque item;
-- Anthropic's has none, its text is the message's `content`), `thinking` its text, `redacted_thinking` its payload, `reasoning` its texts
-- and payload, anything else (an image, a file, audio) 1,600 tokens at 4 chars a token.
CREATE FUNCTION block_chars_of(extra jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (coalesce((
        SELECT sum(CASE
            WHEN jsonb_typeof(b) <> 'object' THEN 0
            WHEN b ->> 'type' LIKE '%text' THEN 0
            WHEN b ->> 'type' IN ('tool_use', 'tool_call', 'tool_call_chunk', 'function_call',
                                  'server_tool_use', 'server_tool_call', 'invalid_tool_call') THEN 0
            WHEN b ->> 'type' = 'compaction' THEN coalesce(char_length(b ->> 'encrypted_content'), 0)
            WHEN b ->> 'type' = 'thinking' THEN coalesce(char_length(b ->> 'thinking'), 0)
            WHEN b ->> 'type' = 'redacted_thinking' THEN coalesce(char_length(b ->> 'data'), 0)
            WHEN b ->> 'type' = 'reasoning' THEN reasoning_chars_of(b)
            ELSE 6400 END)
        FROM jsonb_array_elements(CASE WHEN jsonb_typeof(extra #> '{data,content}') = 'array'
                                       THEN extra #> '{data,content}' ELSE '[]' END) AS b), 0)
      + CASE WHEN jsonb_typeof(extra #> '{data,additional_kwargs,reasoning}') = 'object'
             THEN reasoning_chars_of(extra #> '{data,additional_kwargs,reasoning}') ELSE 0 END
    )::integer
$$;

CREATE FUNCTION messages_weigh_blocks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.block_chars := block_chars_of(NEW.extra);
    RETURN NEW;
END
$$;

CREATE TRIGGER messages_weigh_blocks BEFORE INSERT OR UPDATE OF extra, block_chars ON messages
    FOR EACH ROW
    WHEN (NEW.block_chars IS NULL AND NEW.extra IS NOT NULL)
    EXECUTE FUNCTION messages_weigh_blocks();

-- The rows written before: weighed by the rule. `chars` does not see the weight yet, so
-- the counters' trigger changes nothing here.
UPDATE messages SET block_chars = block_chars_of(extra) WHERE extra IS NOT NULL;

-- `chars` counts the weight: a generated column is redefined by dropping and adding it
-- again (Postgres 15 has no SET EXPRESSION), which rewrites the table once.
ALTER TABLE messages DROP COLUMN chars;
ALTER TABLE messages ADD COLUMN chars integer NOT NULL GENERATED ALWAYS AS (
    coalesce(char_length(content), 0)
    + coalesce(char_length(tool_calls::text), 0)
    + coalesce(block_chars, 0)
) STORED;

-- The largest tool output the session may hold that a compaction could evict (uncleared,
-- unpinned): raised by every write of a tool result, set exactly by each compaction's
-- commit and each planner refusal under the lease. Between them it is an upper bound (a
-- delete does not lower it), so the no-op path reads it from the counters' row and a
-- turn evicts an output over TOOL_OUTPUT_MAX_CHARS without loading the history first.
ALTER TABLE sessions ADD COLUMN largest_output_chars bigint NOT NULL DEFAULT 0;

-- As migration 7's, with the largest output.
CREATE OR REPLACE FUNCTION sessions_track_messages() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO sessions AS s
            (session_id, total_chars, message_count, human_turns, largest_output_chars)
        SELECT session_id, sum(chars), count(*),
               count(*) FILTER (WHERE role = 'user' AND NOT is_summary),
               coalesce(max(chars) FILTER (WHERE role = 'tool' AND tool_call_id IS NOT NULL AND cleared_by IS NULL
                                            AND NOT pinned), 0)
        FROM new_rows
        GROUP BY session_id
        ORDER BY session_id
        ON CONFLICT (session_id) DO UPDATE SET
            total_chars   = s.total_chars   + excluded.total_chars,
            message_count = s.message_count + excluded.message_count,
            human_turns   = s.human_turns   + excluded.human_turns,
            largest_output_chars = greatest(s.largest_output_chars,
                                            excluded.largest_output_chars),
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

-- Every session's counters again, now that chars weigh the blocks, and its largest
-- output as it is.
UPDATE sessions AS s SET
    total_chars = coalesce(m.chars, 0),
    largest_output_chars = coalesce(m.largest, 0)
FROM (
    SELECT session_id, sum(chars)::bigint AS chars,
           max(chars) FILTER (WHERE role = 'tool' AND tool_call_id IS NOT NULL AND cleared_by IS NULL AND NOT pinned)
               AS largest
    FROM messages GROUP BY session_id
) AS m
WHERE s.session_id = m.session_id;

-- A pending summary's apply archives what a commit archives: every column restore puts
-- back (the weight, and `cleared_by`, which migrations 14 to 21 left out: a placeholder
-- row archived by an applied summary came back from a restore no longer cleared), and
-- sets the session's largest output as a commit does. Otherwise migration 21's.
CREATE OR REPLACE FUNCTION apply_pending_summary(
    p_session text, p_turn jsonb, p_threshold bigint, p_keep bigint, p_model text,
    p_max_age_ms bigint,
    OUT outcome text, OUT applied_id bigint, OUT removed_count integer,
    OUT removed_total bigint, OUT kept_count bigint, OUT summary_length integer)
LANGUAGE plpgsql AS $$
DECLARE
    pending pending_summaries%ROWTYPE;
    session_messages integer;
    session_chars bigint;
    found_seqs bigint[];
    found_chars bigint[];
    found_versions text[];
BEGIN
    -- The common case with precompute on and nothing prepared: no lock taken.
    PERFORM 1 FROM pending_summaries WHERE session_id = p_session;
    IF NOT FOUND THEN
        outcome := 'none';
        RETURN;
    END IF;
    SELECT message_count, total_chars INTO session_messages, session_chars FROM sessions
    WHERE session_id = p_session
      AND (lease_owner IS NULL OR lease_expires_at <= now())
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'busy';
        RETURN;
    END IF;
    SELECT * INTO pending FROM pending_summaries WHERE session_id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'none';
        RETURN;
    END IF;
    IF pending.created_at <= now() - p_max_age_ms * interval '1 millisecond'
       OR NOT pending.metadata ? 'summarization' THEN
        outcome := 'expired';
    ELSIF pending.threshold_chars <> p_threshold OR pending.keep_chars <> p_keep
          OR pending.requested_model IS DISTINCT FROM p_model THEN
        outcome := 'settings_changed';
    ELSE
        BEGIN
            PERFORM 1 FROM messages
            WHERE session_id = p_session AND seq < pending.cut_seq AND role <> 'system'
              AND NOT (pinned AND NOT is_summary)
            FOR UPDATE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            -- An agent's statement holds a row of the prefix, and waits for the
            -- session's row we hold: give way. Its write changes the prefix anyway.
            outcome := 'prefix_changed';
        END;
    END IF;
    IF outcome IS NULL THEN
        SELECT array_agg(seq ORDER BY seq), array_agg(chars::bigint ORDER BY seq),
               array_agg(xmin::text ORDER BY seq)
        INTO found_seqs, found_chars, found_versions
        FROM messages
        WHERE session_id = p_session AND seq < pending.cut_seq AND role <> 'system'
          AND NOT (pinned AND NOT is_summary);
        IF found_seqs IS DISTINCT FROM pending.removed_seqs
           OR found_chars IS DISTINCT FROM pending.removed_chars
           OR found_versions IS DISTINCT FROM pending.removed_versions
           OR NOT EXISTS (
               SELECT 1 FROM messages
               WHERE session_id = p_session AND seq = pending.cut_seq
                 AND role = 'user' AND NOT is_summary) THEN
            outcome := 'prefix_changed';
        ELSIF EXISTS (
            SELECT 1
            FROM messages AS result
            WHERE result.session_id = p_session AND result.seq >= pending.cut_seq
              AND result.role = 'tool'
              AND result.tool_call_id IN (
                  SELECT c ->> 'id'
                  FROM messages AS call, jsonb_array_elements(calls_of(call.tool_calls)) AS c
                  WHERE call.session_id = p_session AND call.seq = ANY (pending.removed_seqs)
                    AND jsonb_typeof(c -> 'id') = 'string')
              AND NOT EXISTS (
                  SELECT 1
                  FROM messages AS later, jsonb_array_elements(calls_of(later.tool_calls)) AS c
                  WHERE later.session_id = p_session
                    AND later.seq >= pending.cut_seq AND later.seq < result.seq
                    AND c ->> 'id' = result.tool_call_id)) THEN
            outcome := 'pairing_changed';
        ELSIF session_chars - (SELECT sum(c) FROM unnest(pending.removed_chars) AS c)
              + char_length(pending.summary) > p_threshold THEN
            outcome := 'outgrown';
        END IF;
    END IF;
    DELETE FROM pending_summaries WHERE session_id = p_session;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;

    removed_count := cardinality(pending.removed_seqs);
    removed_total := (SELECT sum(c) FROM unnest(pending.removed_chars) AS c);
    kept_count := session_messages - removed_count;
    summary_length := char_length(pending.summary);
    INSERT INTO usage_events
        (session_id, model, prompt_tokens, completion_tokens, total_tokens, metadata)
    VALUES (p_session, pending.model, pending.prompt_tokens, pending.completion_tokens,
            pending.prompt_tokens + pending.completion_tokens,
            pending.metadata || p_turn || jsonb_build_object(
                'messages_kept', kept_count,
                'precomputed_at', pending.created_at,
                'duration_ms', floor(1000 * extract(epoch FROM
                                   clock_timestamp() - statement_timestamp()))::bigint))
    RETURNING id INTO applied_id;
    WITH removed AS (
        DELETE FROM messages
        WHERE session_id = p_session AND seq < pending.cut_seq AND role <> 'system'
          AND NOT (pinned AND NOT is_summary)
        RETURNING *
    )
    INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
        tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra,
        cleared_by, block_chars)
    SELECT applied_id, session_id, seq, role, content,
        tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra,
        cleared_by, block_chars
    FROM removed;
    INSERT INTO messages (session_id, seq, role, content, is_summary)
    VALUES (p_session, pending.removed_seqs[1], 'user', pending.summary, true);
    UPDATE sessions SET last_compaction_id = applied_id, failures = 0, retry_at = NULL,
        largest_output_chars = (
            SELECT coalesce(max(chars), 0) FROM messages
            WHERE session_id = p_session AND role = 'tool' AND tool_call_id IS NOT NULL AND cleared_by IS NULL
              AND NOT pinned)
    WHERE session_id = p_session;
    outcome := 'applied';
END
$$;
