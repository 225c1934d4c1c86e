-- What compaction costs (issue 38), as Postgres migration 23: the part of the prompt the
-- provider read from its cache, kept by a pending summary until its apply, and the
-- rollup's totals of it and of the requests (`llm_requests` in the metadata), over every
-- summarization, restored ones included, as prompt and completion tokens are.
ALTER TABLE usage_events ADD COLUMN cached_prompt_tokens INTEGER;
ALTER TABLE pending_summaries ADD COLUMN cached_prompt_tokens INTEGER;

ALTER TABLE compaction_daily ADD COLUMN cached_prompt_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE compaction_daily ADD COLUMN llm_requests INTEGER NOT NULL DEFAULT 0;

-- A count of the metadata is taken only when it is a JSON integer; anything else counts 0.
CREATE TRIGGER usage_events_cost_inserted AFTER INSERT ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
     AND (NEW.cached_prompt_tokens IS NOT NULL
          OR json_type(NEW.metadata, '$.llm_requests') IS NOT NULL)
BEGIN
    INSERT INTO compaction_daily (day, cached_prompt_tokens, llm_requests)
    VALUES (substr(NEW.created_at, 1, 10),
            max(coalesce(NEW.cached_prompt_tokens, 0), 0),
            CASE WHEN json_type(NEW.metadata, '$.llm_requests') = 'integer'
                 THEN max(json_extract(NEW.metadata, '$.llm_requests'), 0) ELSE 0 END)
    ON CONFLICT (day) DO UPDATE SET
        cached_prompt_tokens = cached_prompt_tokens + excluded.cached_prompt_tokens,
        llm_requests         = llm_requests         + excluded.llm_requests;
END;

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
                                           AS mean_statement_recall,
       coalesce(sum(tool_outputs_cleared), 0)
                                           AS total_tool_outputs_cleared,
       coalesce(sum(chars_cleared), 0)     AS total_chars_cleared,
       coalesce(sum(cached_prompt_tokens), 0)
                                           AS cached_prompt_tokens,
       coalesce(sum(llm_requests), 0)      AS llm_requests
FROM compaction_daily;
