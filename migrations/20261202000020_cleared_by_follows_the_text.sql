-- `messages.cleared_by` names the compaction whose placeholder the row holds, and only
-- while it holds it (docs/protocol.md, "The schema"). An edit of a cleared row's text by
-- the agent (plain SQL; the Python client's mirror already did this itself) makes the row
-- the agent's again: no longer cleared. `summarizer restore` then leaves the agent's text
-- in place and the original in the archive, instead of writing the original over it; and
-- when a later summary archives the edited row, recall finds it as a message, not as a
-- placeholder's copy. A write that sets `cleared_by` itself (the worker clearing a row,
-- restore putting the original back) says what it means and is left alone.
CREATE FUNCTION messages_uncleared_by_edit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.cleared_by := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER messages_uncleared_by_edit BEFORE UPDATE OF content ON messages
    FOR EACH ROW
    WHEN (OLD.cleared_by IS NOT NULL
          AND NEW.content IS DISTINCT FROM OLD.content
          AND NEW.cleared_by IS NOT DISTINCT FROM OLD.cleared_by)
    EXECUTE FUNCTION messages_uncleared_by_edit();

-- Rows edited before this migration still name the compaction; their text is no longer
-- its placeholder ("[tool output cleared: N chars of TOOL output were here; recall seq
-- SEQ for the original]").
UPDATE messages SET cleared_by = NULL
WHERE cleared_by IS NOT NULL
  AND (content IS NULL
       OR content NOT LIKE '[tool output cleared: % chars of % output were here; recall seq '
                           || seq || ' for the original]');
