-- Summaries prepared before the threshold (issue 12, SUMMARIZATION_PRECOMPUTE_AT).
--
-- A worker that finds a session between PRECOMPUTE_AT x threshold and the threshold
-- plans the split the threshold would produce, summarizes the old part in the background
-- and stores the result here, not applied. The turn that crosses the threshold applies
-- it with `apply_pending_summary` (one call, one transaction) if the planned prefix is
-- still exactly the session's prefix, and otherwise drops it and compacts as usual.
--
-- The prefix is identified as the commit identifies it (src/store/mod.rs,
-- `fingerprint_sql!`): each removed row's seq, chars and row version (`xmin`). A row
-- version changes with any rewrite of the row, even one to text of the same length or
-- hash, so it is a stricter test than a hash of the content, and costs nothing to read.
-- `prefix_hash` is md5 over those seqs and versions: a one-column summary of the prefix for
-- operators and logs; the arrays are what the apply compares.
CREATE TABLE pending_summaries (
    -- No foreign key to sessions: operators truncate and delete sessions rows, and a
    -- row left behind is dropped by the TTL sweep (see PgStore::save_pending).
    session_id         text        PRIMARY KEY,
    -- The seq of the first message the plan kept: every non-system row before it goes.
    cut_seq            bigint      NOT NULL,
    removed_seqs       bigint[]    NOT NULL CHECK (cardinality(removed_seqs) > 0),
    removed_chars      bigint[]    NOT NULL,
    removed_versions   text[]      NOT NULL,
    prefix_hash        text        NOT NULL,
    -- The limits and model it was planned with: a turn that asks for others drops it.
    threshold_chars    bigint      NOT NULL,
    keep_chars         bigint      NOT NULL,
    requested_model    text,
    summary            text        NOT NULL,
    model              text        NOT NULL,
    prompt_tokens      bigint,
    completion_tokens  bigint,
    -- The usage event's metadata as far as the precompute knows it (chars and tokens
    -- removed, facts, prompt version, fallback); the apply adds the turn's part.
    metadata           jsonb       NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pending_summaries_created_at ON pending_summaries (created_at);

-- How many compactions in force were served from a pending summary, per day, for
-- /stats' `precomputed_share`. A trigger of its own beside usage_events_rollup, so that
-- function is not copied a fourth time.
ALTER TABLE compaction_daily ADD COLUMN precomputed bigint NOT NULL DEFAULT 0;

CREATE FUNCTION usage_events_precomputed_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO compaction_daily AS d (day, precomputed)
        SELECT (created_at AT TIME ZONE 'UTC')::date, count(*)
        FROM new_rows
        WHERE metadata @> '{"summarization": true, "precomputed": true}'
          AND NOT metadata ? 'restored_at'
        GROUP BY 1
        ON CONFLICT (day) DO UPDATE SET precomputed = d.precomputed + excluded.precomputed;
    ELSE
        UPDATE compaction_daily AS d SET precomputed = d.precomputed - r.n
        FROM (
            SELECT (n.created_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.metadata @> '{"summarization": true, "precomputed": true}'
              AND n.metadata ? 'restored_at' AND NOT o.metadata ? 'restored_at'
            GROUP BY 1
        ) AS r
        WHERE d.day = r.day;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_events_precomputed_inserted AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_precomputed_rollup();
CREATE TRIGGER usage_events_precomputed_updated AFTER UPDATE ON usage_events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_precomputed_rollup();

-- The public aggregates, with the precomputed count as a new last column.
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
       coalesce(sum(precomputed), 0)::bigint       AS total_precomputed
FROM compaction_daily;

-- Applies the session's pending summary at the turn that crosses the threshold, in one
-- round trip and one transaction. `outcome`:
--   none              no pending summary: compact as usual
--   busy              another worker holds the session's lease (a compaction or a
--                     precompute in flight): answered busy, as a lease conflict is
--   expired           older than p_max_age_ms: dropped
--   settings_changed  planned with other limits or another model: dropped
--   prefix_changed    a planned row was edited, deleted or added to: dropped
--   outgrown          what would remain is still over p_threshold (the session grew by
--                     more than the band since the plan, a log dump say): dropped, so
--                     that the turn compacts as far as keep instead
--   applied           written: the usage event (metadata `precomputed: true`), the
--                     archive, the summary in the prefix's place, the session's latest
--                     compaction; the other OUT values describe it.
-- A dropped summary is deleted in the same call, and the caller compacts as usual.
--
-- Lock order is the commit's: the session row first (appends, whose trigger updates it,
-- queue behind), then the pending row. The lease is honoured but never taken: nothing is
-- held across the call.
CREATE FUNCTION apply_pending_summary(
    p_session text, p_request_id text, p_threshold bigint, p_keep bigint,
    p_model text, p_max_age_ms bigint,
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
    IF pending.created_at <= now() - p_max_age_ms * interval '1 millisecond' THEN
        outcome := 'expired';
    ELSIF pending.threshold_chars <> p_threshold OR pending.keep_chars <> p_keep
          OR pending.requested_model IS DISTINCT FROM p_model THEN
        outcome := 'settings_changed';
    ELSE
        SELECT array_agg(seq ORDER BY seq), array_agg(chars::bigint ORDER BY seq),
               array_agg(xmin::text ORDER BY seq)
        INTO found_seqs, found_chars, found_versions
        FROM messages
        WHERE session_id = p_session AND seq < pending.cut_seq AND role <> 'system';
        IF found_seqs IS DISTINCT FROM pending.removed_seqs
           OR found_chars IS DISTINCT FROM pending.removed_chars
           OR found_versions IS DISTINCT FROM pending.removed_versions THEN
            outcome := 'prefix_changed';
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
            pending.metadata || jsonb_build_object(
                'summarization', true,
                'precomputed', true,
                'messages_removed', removed_count,
                'chars_removed', removed_total,
                'messages_kept', kept_count,
                'summary_chars', summary_length,
                'request_id', p_request_id,
                'precomputed_at', pending.created_at,
                'duration_ms', floor(1000 * extract(epoch FROM
                                   clock_timestamp() - statement_timestamp()))::bigint))
    RETURNING id INTO applied_id;
    WITH removed AS (
        DELETE FROM messages
        WHERE session_id = p_session AND seq < pending.cut_seq AND role <> 'system'
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
