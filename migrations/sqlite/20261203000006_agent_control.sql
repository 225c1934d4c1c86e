-- The agent in control, as in the Postgres migration of the same name: pinned messages,
-- a session's token threshold, and the chars per token measured at its last compaction.

ALTER TABLE messages ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1));

-- Pinning or unpinning is an edit of the row: a new row version, so that a compaction
-- planned on the row as it was gives up (`conflict`), and the remembered refusal is
-- forgotten, as Postgres's triggers do for any UPDATE.
CREATE TRIGGER messages_pinned AFTER UPDATE OF pinned ON messages
WHEN OLD.pinned IS NOT NEW.pinned
BEGIN
    UPDATE messages SET row_version = random() WHERE seq = NEW.seq;
    UPDATE sessions SET skip_reason = NULL WHERE session_id = NEW.session_id;
END;

ALTER TABLE session_settings ADD COLUMN threshold_tokens INTEGER
    CHECK (threshold_tokens > 0);

ALTER TABLE sessions ADD COLUMN chars_per_token REAL CHECK (chars_per_token > 0);
