-- The archive's foreign key to usage_events was checked row by row: 800 checks, a quarter
-- of the commit's time, on a 1,000-message compaction (EXPLAIN ANALYZE). The one
-- transaction that writes both keeps them consistent, and `summarizer check` audits it
-- (compaction_without_usage_event), so the constraint goes.
ALTER TABLE archived_messages DROP CONSTRAINT archived_messages_compaction_id_fkey;
