-- The fact check (issue 11): a usage event records `facts_total`, the distinct
-- identifiers of what its compaction removed, and `facts_kept`, how many of them the
-- summary carries (none when SUMMARY_FACT_CHECK=off). The daily rollup counts the events
-- that had facts and sums their recall (kept / total), so /stats reports the mean recall
-- from a row per day. Like the tokens, every summarization counts, restored or not:
-- recall measures what the summarizer wrote, which a restore does not change.

ALTER TABLE compaction_daily
    ADD COLUMN fact_checked    bigint           NOT NULL DEFAULT 0,
    ADD COLUMN fact_recall_sum double precision NOT NULL DEFAULT 0;

-- kept / total, or NULL for an event with no facts to keep (or no figures). Nested CASEs,
-- because SQL does not promise to test the types before it casts: a malformed figure is
-- not counted, and never fails the commit that inserts it.
CREATE FUNCTION fact_recall(metadata jsonb) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(metadata -> 'facts_total') = 'number'
                     AND jsonb_typeof(metadata -> 'facts_kept') = 'number'
           THEN CASE WHEN (metadata ->> 'facts_total')::double precision > 0
                THEN (metadata ->> 'facts_kept')::double precision
                     / (metadata ->> 'facts_total')::double precision
                END
           END
$$;

-- As in migration 8, with the fact figures beside the tokens.
CREATE OR REPLACE FUNCTION usage_events_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Tokens of the calls and fact recall count every summarization; compactions only
        -- those in force.
        INSERT INTO compaction_daily AS d
            (day, compactions, messages_removed, chars_removed, tokens_removed,
             prompt_tokens, completion_tokens, fact_checked, fact_recall_sum)
        SELECT (created_at AT TIME ZONE 'UTC')::date,
               count(*) FILTER (WHERE NOT metadata ? 'restored_at'),
               coalesce(sum((metadata ->> 'messages_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum((metadata ->> 'chars_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum((metadata ->> 'tokens_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0),
               count(fact_recall(metadata)), coalesce(sum(fact_recall(metadata)), 0)
        FROM new_rows WHERE metadata @> '{"summarization": true}'
        GROUP BY 1
        ON CONFLICT (day) DO UPDATE SET
            compactions       = d.compactions       + excluded.compactions,
            messages_removed  = d.messages_removed  + excluded.messages_removed,
            chars_removed     = d.chars_removed     + excluded.chars_removed,
            tokens_removed    = d.tokens_removed    + excluded.tokens_removed,
            prompt_tokens     = d.prompt_tokens     + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            fact_checked      = d.fact_checked      + excluded.fact_checked,
            fact_recall_sum   = d.fact_recall_sum   + excluded.fact_recall_sum;
        INSERT INTO compaction_duration_daily AS d (day, bucket, compactions)
        SELECT (created_at AT TIME ZONE 'UTC')::date,
               duration_bucket((metadata ->> 'duration_ms')::bigint), count(*)
        FROM new_rows
        WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at'
          AND metadata ? 'duration_ms'
        GROUP BY 1, 2
        ON CONFLICT (day, bucket) DO UPDATE SET compactions = d.compactions + excluded.compactions;
    ELSE
        -- `summarizer restore` marks an event restored: its compaction no longer counts.
        UPDATE compaction_daily AS d SET
            compactions      = d.compactions      - r.n,
            messages_removed = d.messages_removed - r.messages,
            chars_removed    = d.chars_removed    - r.chars,
            tokens_removed   = d.tokens_removed   - r.tokens
        FROM (
            SELECT (n.created_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n,
                   coalesce(sum((n.metadata ->> 'messages_removed')::bigint), 0) AS messages,
                   coalesce(sum((n.metadata ->> 'chars_removed')::bigint), 0) AS chars,
                   coalesce(sum((n.metadata ->> 'tokens_removed')::bigint), 0) AS tokens
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.metadata @> '{"summarization": true}'
              AND n.metadata ? 'restored_at' AND NOT o.metadata ? 'restored_at'
            GROUP BY 1
        ) AS r
        WHERE d.day = r.day;
        UPDATE compaction_duration_daily AS d SET compactions = d.compactions - r.n
        FROM (
            SELECT (n.created_at AT TIME ZONE 'UTC')::date AS day,
                   duration_bucket((n.metadata ->> 'duration_ms')::bigint) AS bucket,
                   count(*) AS n
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.metadata @> '{"summarization": true}' AND n.metadata ? 'duration_ms'
              AND n.metadata ? 'restored_at' AND NOT o.metadata ? 'restored_at'
            GROUP BY 1, 2
        ) AS r
        WHERE d.day = r.day AND d.bucket = r.bucket;
    END IF;
    RETURN NULL;
END
$$;

-- Events written before this migration have no figures; any that do (a newer worker
-- against this schema) are folded in.
UPDATE compaction_daily AS d SET fact_checked = e.checked, fact_recall_sum = e.recall
FROM (
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day,
           count(fact_recall(metadata)) AS checked,
           coalesce(sum(fact_recall(metadata)), 0) AS recall
    FROM usage_events
    WHERE metadata @> '{"summarization": true}'
    GROUP BY 1
) AS e
WHERE d.day = e.day;

-- The public aggregates, with the mean recall (a new last column, so the view is replaced
-- in place): NULL until an event had facts.
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
                                                   AS mean_fact_recall
FROM compaction_daily;
