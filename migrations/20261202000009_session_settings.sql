-- Per-session settings (README "Settings"): operators and agents write them with SQL or
-- `summarizer session <id> --set key=value`. Every column but the key is nullable: NULL
-- inherits the configured value. A request's own limits win over these; these win over
-- the configuration. The worker clamps sizes to SUMMARIZATION_MIN_*/MAX_* whatever is
-- written here.
--
-- No foreign key to sessions: settings may be written before the session's first
-- message, and outlive its row.
CREATE TABLE session_settings (
    session_id      text        PRIMARY KEY
                    CHECK (session_id <> '' AND octet_length(session_id) <= 256),
    -- false: every turn-starting request is answered skipped/disabled.
    enabled         boolean,
    threshold_chars bigint      CHECK (threshold_chars > 0),
    keep_chars      bigint      CHECK (keep_chars > 0),
    -- The model to summarize this session with (recorded as requested_model).
    model           text        CHECK (model <> ''),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (keep_chars < threshold_chars)
);

-- updated_at follows every UPDATE, however it is written.
CREATE FUNCTION session_settings_touch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER session_settings_touch BEFORE UPDATE ON session_settings
    FOR EACH ROW EXECUTE FUNCTION session_settings_touch();

-- A remembered planner refusal (no_safe_boundary, nothing_to_compact) depends on the
-- keep it was planned with, which a request or session_settings may now change: it
-- holds only for the same keep. NULL (refusals remembered before this column) holds for
-- none, so such a session is planned once more.
ALTER TABLE sessions ADD COLUMN skip_at_keep bigint;
