-- Token figures (issue 9): each compaction's usage event records `tokens_removed`, the
-- tokenizer's count of what it removed, and the daily rollup sums it for compactions in
-- force, so /stats reports `total_tokens_compacted` measured, not estimated. As with the
-- chars, a restored compaction (`restored_at`) stops counting.

ALTER TABLE compaction_daily ADD COLUMN tokens_removed bigint NOT NULL DEFAULT 0;

-- As in migration 5, with tokens_removed beside chars_removed.
CREATE OR REPLACE FUNCTION usage_events_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Tokens of the calls count every summarization; compactions only those in force.
        INSERT INTO compaction_daily AS d
            (day, compactions, messages_removed, chars_removed, tokens_removed,
             prompt_tokens, completion_tokens)
        SELECT (created_at AT TIME ZONE 'UTC')::date,
               count(*) FILTER (WHERE NOT metadata ? 'restored_at'),
               coalesce(sum((metadata ->> 'messages_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum((metadata ->> 'chars_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum((metadata ->> 'tokens_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0)
        FROM new_rows WHERE metadata @> '{"summarization": true}'
        GROUP BY 1
        ON CONFLICT (day) DO UPDATE SET
            compactions       = d.compactions       + excluded.compactions,
            messages_removed  = d.messages_removed  + excluded.messages_removed,
            chars_removed     = d.chars_removed     + excluded.chars_removed,
            tokens_removed    = d.tokens_removed    + excluded.tokens_removed,
            prompt_tokens     = d.prompt_tokens     + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens;
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

-- Events written before this migration have no tokens_removed: they count as zero.
-- (Any that do, written by a newer worker against this schema, are folded in.)
UPDATE compaction_daily AS d SET tokens_removed = e.tokens
FROM (
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day,
           sum((metadata ->> 'tokens_removed')::bigint) AS tokens
    FROM usage_events
    WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at'
      AND metadata ? 'tokens_removed'
    GROUP BY 1
) AS e
WHERE d.day = e.day;

-- The public aggregates, with the tokens compacted (a new last column, so the view is
-- replaced in place).
CREATE OR REPLACE VIEW summarization_stats AS
SELECT coalesce(sum(compactions), 0)::bigint       AS total_summarizations,
       coalesce(sum(chars_removed), 0)::bigint     AS total_chars_compacted,
       coalesce(sum(messages_removed), 0)::bigint  AS total_messages_compacted,
       coalesce(sum(prompt_tokens), 0)::bigint     AS prompt_tokens,
       coalesce(sum(completion_tokens), 0)::bigint AS completion_tokens,
       (SELECT max(created_at) FROM usage_events
        WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at')
                                                   AS last_summarization_at,
       coalesce(sum(tokens_removed), 0)::bigint    AS total_tokens_compacted
FROM compaction_daily;
