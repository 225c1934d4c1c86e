-- Recall (summarizer.recall): an agent searches what compaction archived from its
-- session. A search is a case-insensitive substring match of each of its terms
-- (identifiers as written: E-5417, 10.43.7.217:6432, p99=2013ms), which a trigram index
-- serves whatever the archive's size; the session's own rows are reached through
-- archived_messages_session. The first 1,000,000 chars of a message are searchable
-- (a fetch by seq returns it whole).
--
-- pg_trgm ships with Postgres (contrib) and is a trusted extension: the database's
-- owner may create it.
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE INDEX archived_messages_recall ON archived_messages
    USING gin (left(content, 1000000) gin_trgm_ops);
