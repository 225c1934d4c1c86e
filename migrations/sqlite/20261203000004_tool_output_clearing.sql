-- Clearing old tool output, as in the Postgres migration of the same name: a cleared
-- row keeps its place with a placeholder for content and `cleared_by` naming the
-- compaction whose archive holds its original (`archived_messages.cleared`); a session
-- may choose clearing and its keep; the rollup counts the tool results cleared by the
-- compactions in force and the chars that saved.

ALTER TABLE messages ADD COLUMN cleared_by INTEGER;

ALTER TABLE archived_messages ADD COLUMN cleared_by INTEGER;
ALTER TABLE archived_messages ADD COLUMN cleared INTEGER NOT NULL DEFAULT 0
    CHECK (cleared IN (0, 1));

ALTER TABLE session_settings ADD COLUMN tool_output_clearing INTEGER
    CHECK (tool_output_clearing IN (0, 1));
ALTER TABLE session_settings ADD COLUMN tool_output_keep INTEGER
    CHECK (tool_output_keep >= 0);

ALTER TABLE compaction_daily ADD COLUMN tool_outputs_cleared INTEGER NOT NULL DEFAULT 0;
ALTER TABLE compaction_daily ADD COLUMN chars_cleared INTEGER NOT NULL DEFAULT 0;

-- A count of the metadata is taken only when it is a JSON integer; anything else counts 0.
CREATE TRIGGER usage_events_cleared_inserted AFTER INSERT ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
     AND json_type(NEW.metadata, '$.restored_at') IS NULL
     AND json_type(NEW.metadata, '$.tool_outputs_cleared') IS NOT NULL
BEGIN
    INSERT INTO compaction_daily (day, tool_outputs_cleared, chars_cleared)
    VALUES (substr(NEW.created_at, 1, 10),
            CASE WHEN json_type(NEW.metadata, '$.tool_outputs_cleared') = 'integer'
                 THEN json_extract(NEW.metadata, '$.tool_outputs_cleared') ELSE 0 END,
            CASE WHEN json_type(NEW.metadata, '$.chars_cleared') = 'integer'
                 THEN json_extract(NEW.metadata, '$.chars_cleared') ELSE 0 END)
    ON CONFLICT (day) DO UPDATE SET
        tool_outputs_cleared = tool_outputs_cleared + excluded.tool_outputs_cleared,
        chars_cleared        = chars_cleared        + excluded.chars_cleared;
END;

CREATE TRIGGER usage_events_cleared_updated AFTER UPDATE OF metadata ON usage_events
WHEN json_type(NEW.metadata, '$.summarization') = 'true'
     AND json_type(NEW.metadata, '$.tool_outputs_cleared') IS NOT NULL
     AND json_type(NEW.metadata, '$.restored_at') IS NOT NULL
     AND json_type(OLD.metadata, '$.restored_at') IS NULL
BEGIN
    UPDATE compaction_daily SET
        tool_outputs_cleared = tool_outputs_cleared
            - CASE WHEN json_type(NEW.metadata, '$.tool_outputs_cleared') = 'integer'
                   THEN json_extract(NEW.metadata, '$.tool_outputs_cleared') ELSE 0 END,
        chars_cleared = chars_cleared
            - CASE WHEN json_type(NEW.metadata, '$.chars_cleared') = 'integer'
                   THEN json_extract(NEW.metadata, '$.chars_cleared') ELSE 0 END
    WHERE day = substr(NEW.created_at, 1, 10);
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
       coalesce(sum(chars_cleared), 0)     AS total_chars_cleared
FROM compaction_daily;
