-- The fact check's statement figure, as in the Postgres migration of the same name: a
-- usage event's `facts_stated` (identifiers its summary carries inside a statement, not
-- a list) over `facts_total` is summed per day for /stats' `mean_statement_recall`.
-- Every summarization counts, restored or not, so only inserts touch it: a trigger of
-- its own beside usage_events_inserted. The stated / total is inlined, with nested CASEs
-- so that a malformed figure is not divided (and not counted).

ALTER TABLE compaction_daily ADD COLUMN statement_checked INTEGER NOT NULL DEFAULT 0;
ALTER TABLE compaction_daily ADD COLUMN statement_recall_sum REAL NOT NULL DEFAULT 0;

CREATE TRIGGER usage_events_statement_inserted AFTER INSERT ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
     AND json_type(NEW.metadata, '$.facts_total') IN ('integer', 'real')
     AND json_type(NEW.metadata, '$.facts_stated') IN ('integer', 'real')
     AND json_extract(NEW.metadata, '$.facts_total') > 0
BEGIN
    INSERT INTO compaction_daily (day, statement_checked, statement_recall_sum)
    VALUES (substr(NEW.created_at, 1, 10), 1,
            CAST(json_extract(NEW.metadata, '$.facts_stated') AS REAL)
            / json_extract(NEW.metadata, '$.facts_total'))
    ON CONFLICT (day) DO UPDATE SET
        statement_checked    = statement_checked    + excluded.statement_checked,
        statement_recall_sum = statement_recall_sum + excluded.statement_recall_sum;
END;

-- The public aggregates, with the mean statement recall as a new last column: NULL until
-- an event had the figure.
DROP VIEW summarization_stats;
CREATE VIEW summarization_stats AS
SELECT coalesce(sum(compactions), 0)       AS total_summarizations,
       coalesce(sum(chars_removed), 0)     AS total_chars_compacted,
       coalesce(sum(messages_removed), 0)  AS total_messages_compacted,
       coalesce(sum(prompt_tokens), 0)     AS prompt_tokens,
       coalesce(sum(completion_tokens), 0) AS completion_tokens,
       (SELECT max(created_at) FROM usage_events
        WHERE json_type(metadata, '$.summarization') = 'true'
          AND json_type(metadata, '$.restored_at') IS NULL)
                                           AS last_summarization_at,
       coalesce(sum(tokens_removed), 0)    AS total_tokens_compacted,
       sum(fact_recall_sum) / nullif(sum(fact_checked), 0)
                                           AS mean_fact_recall,
       coalesce(sum(precomputed), 0)       AS total_precomputed,
       sum(statement_recall_sum) / nullif(sum(statement_checked), 0)
                                           AS mean_statement_recall
FROM compaction_daily;
