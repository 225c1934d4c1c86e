-- `summarizer restore` puts a compaction's messages back. Its usage event stays (the LLM
-- call happened and was paid for), marked with "restored_at"; the compaction figures
-- count only compactions still in force, the token figures every summarization.
CREATE OR REPLACE VIEW summarization_stats AS
SELECT count(*) FILTER (WHERE NOT metadata ? 'restored_at')                AS total_summarizations,
       coalesce(sum((metadata ->> 'chars_removed')::bigint)
                FILTER (WHERE NOT metadata ? 'restored_at'), 0)::bigint    AS total_chars_compacted,
       coalesce(sum((metadata ->> 'messages_removed')::bigint)
                FILTER (WHERE NOT metadata ? 'restored_at'), 0)::bigint    AS total_messages_compacted,
       count(DISTINCT session_id) FILTER (WHERE NOT metadata ? 'restored_at') AS sessions_compacted,
       coalesce(sum(prompt_tokens), 0)                                      AS prompt_tokens,
       coalesce(sum(completion_tokens), 0)                                  AS completion_tokens,
       max(created_at) FILTER (WHERE NOT metadata ? 'restored_at')          AS last_summarization_at
FROM usage_events
WHERE metadata @> '{"summarization": true}';
