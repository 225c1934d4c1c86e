-- Per-session failure backoff: after an LLM failure a session is not summarized again
-- before retry_at, so a poisoned session does not call the LLM on every turn.
ALTER TABLE sessions
    ADD COLUMN failures integer     NOT NULL DEFAULT 0,
    ADD COLUMN retry_at timestamptz;
