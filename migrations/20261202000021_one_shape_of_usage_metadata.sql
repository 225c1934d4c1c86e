-- A pending summary's usage event is described in one place, the worker's
-- (`compaction::record` in the Rust source): the pending row's metadata is the event's
-- whole metadata as the worker built it when it prepared the summary, and applying it
-- adds the applying turn's ids (`p_turn`, also built by the worker) and the three
-- figures only this transaction knows: the messages kept now, when the summary was
-- prepared, and the apply's own time. Before, this function wrote a second copy of the
-- event's shape.
--
-- A pending row in the former shape (without `summarization`, which a worker of the
-- previous release may still save during a rolling upgrade) is dropped as `expired`: the
-- turn compacts afresh. The previous function (seven arguments) stays for those workers;
-- a later migration drops it.
DELETE FROM pending_summaries;

CREATE FUNCTION apply_pending_summary(
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
        tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra)
    SELECT applied_id, session_id, seq, role, content,
        tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra
    FROM removed;
    INSERT INTO messages (session_id, seq, role, content, is_summary)
    VALUES (p_session, pending.removed_seqs[1], 'user', pending.summary, true);
    UPDATE sessions SET last_compaction_id = applied_id, failures = 0, retry_at = NULL
    WHERE session_id = p_session;
    outcome := 'applied';
END
$$;
