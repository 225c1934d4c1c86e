-- Daily rollups behind /stats and `summarizer stats`, kept by statement-level triggers
-- on usage_events, so in the compaction's own commit transaction; the aggregates then
-- read a row per day, however many usage events there are.

CREATE TABLE compaction_daily (
    day               date   PRIMARY KEY,
    compactions       bigint NOT NULL DEFAULT 0,
    messages_removed  bigint NOT NULL DEFAULT 0,
    chars_removed     bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0
);

-- Compaction durations as a histogram: bucket b counts compactions that took less than
-- 2^(b/2) ms (buckets a factor of sqrt 2 wide), so percentiles are read from a few
-- dozen rows.
CREATE TABLE compaction_duration_daily (
    day         date     NOT NULL,
    bucket      smallint NOT NULL,
    compactions bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (day, bucket)
);

-- Failures the database can see: LLM errors and commit conflicts (a store error cannot
-- be recorded in the store it could not reach; /metrics counts those).
CREATE TABLE failure_daily (
    day      date   NOT NULL,
    reason   text   NOT NULL,
    failures bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (day, reason)
);

CREATE FUNCTION duration_bucket(ms bigint) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT least(60, floor(2 * log(2, greatest(ms, 1)::numeric)) + 1)::smallint
$$;

-- Statement-level, plain statements with cached plans: a commit inserts one event, and
-- this adds two small upserts to its transaction.
CREATE FUNCTION usage_events_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Tokens count every summarization call; compactions only those in force.
        INSERT INTO compaction_daily AS d
            (day, compactions, messages_removed, chars_removed, prompt_tokens, completion_tokens)
        SELECT (created_at AT TIME ZONE 'UTC')::date,
               count(*) FILTER (WHERE NOT metadata ? 'restored_at'),
               coalesce(sum((metadata ->> 'messages_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum((metadata ->> 'chars_removed')::bigint)
                        FILTER (WHERE NOT metadata ? 'restored_at'), 0),
               coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0)
        FROM new_rows WHERE metadata @> '{"summarization": true}'
        GROUP BY 1
        ON CONFLICT (day) DO UPDATE SET
            compactions       = d.compactions       + excluded.compactions,
            messages_removed  = d.messages_removed  + excluded.messages_removed,
            chars_removed     = d.chars_removed     + excluded.chars_removed,
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
            chars_removed    = d.chars_removed    - r.chars
        FROM (
            SELECT (n.created_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n,
                   coalesce(sum((n.metadata ->> 'messages_removed')::bigint), 0) AS messages,
                   coalesce(sum((n.metadata ->> 'chars_removed')::bigint), 0) AS chars
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

CREATE TRIGGER usage_events_inserted AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_rollup();
CREATE TRIGGER usage_events_updated AFTER UPDATE ON usage_events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_rollup();

-- What happened before the rollups existed.
INSERT INTO compaction_daily (day, compactions, messages_removed, chars_removed,
                              prompt_tokens, completion_tokens)
SELECT (created_at AT TIME ZONE 'UTC')::date,
       count(*) FILTER (WHERE NOT metadata ? 'restored_at'),
       coalesce(sum((metadata ->> 'messages_removed')::bigint)
                FILTER (WHERE NOT metadata ? 'restored_at'), 0),
       coalesce(sum((metadata ->> 'chars_removed')::bigint)
                FILTER (WHERE NOT metadata ? 'restored_at'), 0),
       coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0)
FROM usage_events WHERE metadata @> '{"summarization": true}'
GROUP BY 1;

-- The last summarization, read backwards from an index.
CREATE INDEX usage_events_summarizations ON usage_events (created_at)
    WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at';

-- The public aggregates, from the rollups.
DROP VIEW summarization_stats;
CREATE VIEW summarization_stats AS
SELECT coalesce(sum(compactions), 0)::bigint       AS total_summarizations,
       coalesce(sum(chars_removed), 0)::bigint     AS total_chars_compacted,
       coalesce(sum(messages_removed), 0)::bigint  AS total_messages_compacted,
       coalesce(sum(prompt_tokens), 0)::bigint     AS prompt_tokens,
       coalesce(sum(completion_tokens), 0)::bigint AS completion_tokens,
       (SELECT max(created_at) FROM usage_events
        WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at')
                                                   AS last_summarization_at
FROM compaction_daily;
