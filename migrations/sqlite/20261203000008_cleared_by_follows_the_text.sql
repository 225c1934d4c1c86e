-- As the Postgres migration of the same name: `messages.cleared_by` names the compaction
-- whose placeholder the row holds, only while it holds it. An edit of a cleared row's
-- text makes the row the agent's again; a write that sets `cleared_by` itself (the worker
-- clearing a row, restore putting the original back) is left alone. SQLite's BEFORE
-- triggers cannot change NEW: this one updates the row after.
CREATE TRIGGER messages_uncleared_by_edit
AFTER UPDATE OF content ON messages
WHEN OLD.cleared_by IS NOT NULL
     AND NEW.content IS NOT OLD.content
     AND NEW.cleared_by IS OLD.cleared_by
BEGIN
    UPDATE messages SET cleared_by = NULL WHERE seq = NEW.seq;
END;

UPDATE messages SET cleared_by = NULL
WHERE cleared_by IS NOT NULL
  AND (content IS NULL
       OR content NOT LIKE '[tool output cleared: % chars of % output were here; recall seq '
                           || seq || ' for the original]');
