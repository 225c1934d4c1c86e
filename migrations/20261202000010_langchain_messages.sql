-- What a LangChain message needs beyond the public columns, so that Python agents
-- (clients/python) round-trip their history losslessly, and what a client needs to
-- notice a compaction that committed after it stopped waiting. All new columns are
-- nullable: plain-SQL agents keep writing and reading messages as before.

-- external_id: the LangChain message id, unique within a session where set, so that a
-- client syncing its graph state stores each message once.
-- extra: what the public columns cannot hold, written and read by the client only: the
-- message type, content blocks when content is a list (the content column then holds
-- their text, which is what the summarizer reads and `chars` counts), name,
-- additional_kwargs, response_metadata and the other fields of the message.
ALTER TABLE messages
    ADD COLUMN external_id text,
    ADD COLUMN extra jsonb;
CREATE UNIQUE INDEX messages_external_id ON messages (session_id, external_id)
    WHERE external_id IS NOT NULL;

-- The archive keeps them, so a restore brings messages back whole, and a client can tell
-- that a message it still holds was archived (and must not be stored again).
ALTER TABLE archived_messages
    ADD COLUMN external_id text,
    ADD COLUMN extra jsonb;
CREATE INDEX archived_messages_external_id ON archived_messages (session_id, external_id)
    WHERE external_id IS NOT NULL;

-- The compaction now in force: set by each commit and by `summarizer restore`, read with
-- the counters and sent in every reply, so that a client whose request timed out learns
-- on its next turn that the history was compacted meanwhile.
ALTER TABLE sessions ADD COLUMN last_compaction_id bigint;
