-- The fact check's statement figure: a usage event records `facts_stated`, how many of
-- the `facts_total` identifiers its summary carries inside a statement (a sentence or
-- bullet that is not a list of identifiers: "Also noted: 14:01, v5.33.0" states
-- nothing). The daily rollup counts the events that have it and sums their
-- stated / total, so /stats reports `mean_statement_recall` from a row per day. Like the
-- fact recall, every summarization counts, restored or not, so only inserts touch it:
-- a trigger of its own, beside usage_events_rollup, which is not copied again.

ALTER TABLE compaction_daily
    ADD COLUMN statement_checked    bigint           NOT NULL DEFAULT 0,
    ADD COLUMN statement_recall_sum double precision NOT NULL DEFAULT 0;

-- stated / total, or NULL for an event without the figure or with no facts. Nested
-- CASEs, as in fact_recall: a malformed figure is not counted and never fails a commit.
CREATE FUNCTION statement_recall(metadata jsonb) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(metadata -> 'facts_total') = 'number'
                     AND jsonb_typeof(metadata -> 'facts_stated') = 'number'
           THEN CASE WHEN (metadata ->> 'facts_total')::double precision > 0
                THEN (metadata ->> 'facts_stated')::double precision
                     / (metadata ->> 'facts_total')::double precision
                END
           END
$$;

CREATE FUNCTION usage_events_statement_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO compaction_daily AS d (day, statement_checked, statement_recall_sum)
    SELECT (created_at AT TIME ZONE 'UTC')::date,
           count(statement_recall(metadata)), coalesce(sum(statement_recall(metadata)), 0)
    FROM new_rows
    WHERE metadata @> '{"summarization": true}' AND statement_recall(metadata) IS NOT NULL
    GROUP BY 1
    ON CONFLICT (day) DO UPDATE SET
        statement_checked    = d.statement_checked    + excluded.statement_checked,
        statement_recall_sum = d.statement_recall_sum + excluded.statement_recall_sum;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_events_statement_inserted AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_statement_rollup();

-- The public aggregates, with the mean statement recall as a new last column: NULL until
-- an event had the figure.
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
                                                   AS mean_statement_recall
FROM compaction_daily;
