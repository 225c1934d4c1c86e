-- Clearing old tool output (TOOL_OUTPUT_CLEARING): a compaction may replace the content
-- of old tool results with a placeholder, leaving each row in place (role, seq,
-- tool_call_id: every call stays paired), and archive the original in the same
-- transaction.

-- The compaction whose archive holds a cleared row's original; NULL for a row as written.
-- Nullable and without a default write, so agents' INSERTs need not know it.
ALTER TABLE messages ADD COLUMN cleared_by bigint;

-- An archived copy of a cleared row (`cleared`): restore writes its content back into
-- the row, where it puts a removed one back as a row. `cleared_by` is archived like the
-- other columns, so that a placeholder row a later summary removed comes back as one.
ALTER TABLE archived_messages
    ADD COLUMN cleared_by bigint,
    ADD COLUMN cleared    boolean NOT NULL DEFAULT false;

-- A session's own choice, and its keep; NULL inherits TOOL_OUTPUT_CLEARING / _KEEP.
ALTER TABLE session_settings
    ADD COLUMN tool_output_clearing boolean,
    ADD COLUMN tool_output_keep     bigint CHECK (tool_output_keep >= 0);

-- The rollup counts the tool results cleared by compactions in force, and the chars that
-- saved, as usage events record them (`tool_outputs_cleared`, `chars_cleared`); a
-- restore takes them out again. A trigger of its own beside usage_events_rollup.
ALTER TABLE compaction_daily
    ADD COLUMN tool_outputs_cleared bigint NOT NULL DEFAULT 0,
    ADD COLUMN chars_cleared        bigint NOT NULL DEFAULT 0;

-- A count of the metadata, or 0 when it is missing, not a number or out of range: a
-- malformed event never fails the commit that inserts it (nested CASEs, as SQL does not
-- promise to test the type before it casts).
CREATE FUNCTION metadata_count(metadata jsonb, field text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(metadata -> field) = 'number'
           THEN CASE WHEN (metadata ->> field)::numeric BETWEEN 0 AND 9000000000000000000
                THEN trunc((metadata ->> field)::numeric)::bigint
                ELSE 0
                END
           ELSE 0
           END
$$;

CREATE FUNCTION usage_events_cleared_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO compaction_daily AS d (day, tool_outputs_cleared, chars_cleared)
        SELECT (created_at AT TIME ZONE 'UTC')::date,
               sum(metadata_count(metadata, 'tool_outputs_cleared')),
               sum(metadata_count(metadata, 'chars_cleared'))
        FROM new_rows
        WHERE metadata @> '{"summarization": true}' AND NOT metadata ? 'restored_at'
          AND metadata ? 'tool_outputs_cleared'
        GROUP BY 1
        ON CONFLICT (day) DO UPDATE SET
            tool_outputs_cleared = d.tool_outputs_cleared + excluded.tool_outputs_cleared,
            chars_cleared        = d.chars_cleared        + excluded.chars_cleared;
    ELSE
        UPDATE compaction_daily AS d SET
            tool_outputs_cleared = d.tool_outputs_cleared - r.outputs,
            chars_cleared        = d.chars_cleared        - r.chars
        FROM (
            SELECT (n.created_at AT TIME ZONE 'UTC')::date AS day,
                   sum(metadata_count(n.metadata, 'tool_outputs_cleared')) AS outputs,
                   sum(metadata_count(n.metadata, 'chars_cleared')) AS chars
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.metadata @> '{"summarization": true}' AND n.metadata ? 'tool_outputs_cleared'
              AND n.metadata ? 'restored_at' AND NOT o.metadata ? 'restored_at'
            GROUP BY 1
        ) AS r
        WHERE d.day = r.day;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_events_cleared_inserted AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_cleared_rollup();
CREATE TRIGGER usage_events_cleared_updated AFTER UPDATE ON usage_events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_cleared_rollup();

-- The public aggregates, with the clearing totals as new last columns.
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
                                                   AS mean_statement_recall,
       coalesce(sum(tool_outputs_cleared), 0)::bigint
                                                   AS total_tool_outputs_cleared,
       coalesce(sum(chars_cleared), 0)::bigint     AS total_chars_cleared
FROM compaction_daily;
