-- The durable job queue (issue 13, TRANSPORT=jetstream|both): a job that still fails
-- after JETSTREAM_MAX_DELIVER deliveries is removed from the stream and kept here, with
-- what is needed to replay it (`summarizer dead-letters replay`), so no job is lost.

CREATE TABLE dead_letters (
    id           bigserial   PRIMARY KEY,
    -- The session the job names (NULL only for a payload that named none).
    session_id   text,
    -- The job's subject, Nats-Msg-Id and payload (the request's JSON), as published.
    subject      text        NOT NULL,
    msg_id       text,
    payload      text        NOT NULL,
    -- Why its last delivery failed, and how many deliveries it had.
    last_error   text        NOT NULL,
    deliveries   integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Set when `summarizer dead-letters replay` published it again.
    replayed_at  timestamptz,
    -- The stream's name, the job's sequence in it and its publish time: a job whose ack
    -- was lost after it was kept comes again, and is not kept twice. (The time tells
    -- apart two jobs of one sequence in a stream deleted and made again.)
    job_key      text        UNIQUE
);
CREATE INDEX dead_letters_pending ON dead_letters (created_at) WHERE replayed_at IS NULL;
