-- What compaction costs (issue 38): every request a compaction made is counted, and
-- the part of the prompt the provider read from its cache.
--
-- `cached_prompt_tokens`: of `prompt_tokens`, the part read from the provider's prompt
-- cache (OpenAI's `usage.prompt_tokens_details.cached_tokens`, Anthropic's
-- `usage.cache_read_input_tokens`); NULL when the provider did not report it. A pending
-- summary keeps it until its apply writes the event.
ALTER TABLE usage_events ADD COLUMN cached_prompt_tokens bigint;
ALTER TABLE pending_summaries ADD COLUMN cached_prompt_tokens bigint;

-- The rollup totals them with the requests (`llm_requests` in the metadata) over every
-- summarization, restored ones included, as it does prompt and completion tokens: a
-- restore gives nothing back to the provider. A trigger of its own beside
-- usage_events_rollup.
ALTER TABLE compaction_daily
    ADD COLUMN cached_prompt_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN llm_requests         bigint NOT NULL DEFAULT 0;

CREATE FUNCTION usage_events_cost_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO compaction_daily AS d (day, cached_prompt_tokens, llm_requests)
    SELECT (created_at AT TIME ZONE 'UTC')::date,
           coalesce(sum(greatest(cached_prompt_tokens, 0)), 0),
           sum(metadata_count(metadata, 'llm_requests'))
    FROM new_rows
    WHERE metadata @> '{"summarization": true}'
      AND (cached_prompt_tokens IS NOT NULL OR metadata ? 'llm_requests')
    GROUP BY 1
    ON CONFLICT (day) DO UPDATE SET
        cached_prompt_tokens = d.cached_prompt_tokens + excluded.cached_prompt_tokens,
        llm_requests         = d.llm_requests         + excluded.llm_requests;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_events_cost_inserted AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_cost_rollup();

-- The public aggregates, with the cost totals as new last columns.
CREATE OR REPLACE VIEW summarization_stats AS
SELECT coalesce(sum(compactions), 0)::bigint       AS total_summarizations,
       coalesce(sum(chars_removed), 0)::bigint     AS total_chars_compacted,
       coalesce(sum(messages_removed), 0)::bigint  AS total_messages_compacted,
       coalesce(sum(prompt_tokens), 0)::bigint     AS prompt_tokens,
       coalesce(sum(completion_tokens), 0)::bigint AS completion_tokens,
       (SELECT max(created_at) FROM usage_events
        WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at')
                                                   AS last_summarization_at,
       coalesce(sum(tokens_removed), 0)::bigint    AS total_tokens_compacted,
       sum(fact_recall_sum) / nullif(sum(fact_checked), 0)
                                                   AS mean_fact_recall,
       coalesce(sum(precomputed), 0)::bigint       AS total_precomputed,
       sum(statement_recall_sum) / nullif(sum(statement_checked), 0)
                                                   AS mean_statement_recall,
       coalesce(sum(tool_outputs_cleared), 0)::bigint
                                                   AS total_tool_outputs_cleared,
       coalesce(sum(chars_cleared), 0)::bigint     AS total_chars_cleared,
       coalesce(sum(cached_prompt_tokens), 0)::bigint
                                                   AS cached_prompt_tokens,
       coalesce(sum(llm_requests), 0)::bigint      AS llm_requests
FROM compaction_daily;

-- A pending summary's apply writes its cached tokens into the event. Otherwise
-- migration 22's.
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
        (session_id, model, prompt_tokens, completion_tokens, total_tokens,
         cached_prompt_tokens, metadata)
    VALUES (p_session, pending.model, pending.prompt_tokens, pending.completion_tokens,
            pending.prompt_tokens + pending.completion_tokens, pending.cached_prompt_tokens,
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
