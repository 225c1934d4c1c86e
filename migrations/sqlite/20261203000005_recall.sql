-- Recall (summarizer.recall), as in the Postgres migration of the same name: an FTS5
-- index of the archive with the trigram tokenizer, so that a search of a substring of 3
-- chars or more (an identifier as written, a word) is an index lookup.
--
-- The index names archived rows by rowid, which VACUUM may renumber in a table without
-- an INTEGER PRIMARY KEY: the archive is rebuilt with one (`id`), its old key kept as a
-- unique index. The index stores no copy of the text (content=''), and its rows are
-- deleted with the archive's (contentless_delete). `session` holds the session id
-- between two unit separators (a control character no session id may hold), so that a
-- search names its session as a phrase of the index too: a short id, or one that is a
-- substring of another, matches exactly its own rows.
CREATE TABLE archived_messages_new (
    id            INTEGER PRIMARY KEY,
    compaction_id INTEGER NOT NULL,
    session_id    TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    role          TEXT    NOT NULL,
    content       TEXT,
    tool_calls    TEXT,
    tool_call_id  TEXT,
    is_summary    INTEGER NOT NULL,
    chars         INTEGER NOT NULL,
    created_at    TEXT    NOT NULL,
    archived_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    external_id   TEXT,
    extra         TEXT,
    cleared_by    INTEGER,
    cleared       INTEGER NOT NULL DEFAULT 0 CHECK (cleared IN (0, 1))
);
INSERT INTO archived_messages_new
    (compaction_id, session_id, seq, role, content, tool_calls, tool_call_id, is_summary,
     chars, created_at, archived_at, external_id, extra, cleared_by, cleared)
SELECT compaction_id, session_id, seq, role, content, tool_calls, tool_call_id, is_summary,
       chars, created_at, archived_at, external_id, extra, cleared_by, cleared
FROM archived_messages ORDER BY compaction_id, seq;
DROP TABLE archived_messages;
ALTER TABLE archived_messages_new RENAME TO archived_messages;
CREATE UNIQUE INDEX archived_messages_key ON archived_messages (compaction_id, seq);
CREATE INDEX archived_messages_session ON archived_messages (session_id, seq);
CREATE INDEX archived_messages_external_id ON archived_messages (session_id, external_id)
    WHERE external_id IS NOT NULL;

CREATE VIRTUAL TABLE archived_search USING fts5(
    session, body, tokenize = 'trigram', content = '', contentless_delete = 1
);

CREATE TRIGGER archived_messages_indexed AFTER INSERT ON archived_messages
BEGIN
    INSERT INTO archived_search (rowid, session, body)
    VALUES (NEW.id, char(31) || NEW.session_id || char(31),
            substr(coalesce(NEW.content, ''), 1, 1000000));
END;

CREATE TRIGGER archived_messages_unindexed AFTER DELETE ON archived_messages
BEGIN
    DELETE FROM archived_search WHERE rowid = OLD.id;
END;

INSERT INTO archived_search (rowid, session, body)
SELECT id, char(31) || session_id || char(31), substr(coalesce(content, ''), 1, 1000000)
FROM archived_messages;
