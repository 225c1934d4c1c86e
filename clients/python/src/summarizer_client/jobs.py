"""Durable jobs: turn-starting requests published to the fleet's JetStream work queue
(workers with `TRANSPORT=jetstream` or `both`), for publishers that need the request to
survive a fleet that is down or busy: a batch that compacts many sessions, a scheduler.

A job is the request's JSON, published to `<prefix>.<hex SHA-256 of the session id>` (a
session id need not be a valid subject token) with a `Nats-Msg-Id` header, so that the
stream drops a duplicate published within its window (two minutes), and an optional
`Reply-To` header, the subject the worker sends the job's reply to. The same contract as
the Rust `summarizer_client::jobs::JobPublisher`; `SummarizerClient.publish_job` publishes.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass
from typing import Any

#: `JETSTREAM_SUBJECT_PREFIX`'s default.
DEFAULT_SUBJECT_PREFIX = "summarizer.jobs"
#: The header a job's reply subject goes in: a job pulled from a stream has no NATS reply
#: of its own.
REPLY_TO_HEADER = "Reply-To"
#: The header the stream deduplicates on.
MSG_ID_HEADER = "Nats-Msg-Id"
#: The worker's limit on a session id, in UTF-8 bytes.
MAX_SESSION_ID_BYTES = 256


@dataclass(frozen=True)
class PublishedJob:
    """A job the stream stored.

    `msg_id` is the `Nats-Msg-Id` it was published with (the caller's, or a fresh one);
    `sequence` its sequence in the stream; `duplicate` that the stream already had a job
    with this `msg_id` within its duplicate window, so this one was dropped (`sequence`
    is then the first one's).
    """

    msg_id: str
    sequence: int
    duplicate: bool


class JobNotStored(Exception):
    """The job was not stored: no stream takes its subject (no worker with
    `TRANSPORT=jetstream` or `both` has created it), NATS is not connected or did not
    answer, or the stream refused it.

    After a timeout the job may have been stored all the same (the acknowledgement was
    lost): publishing it again with the same `msg_id` within the stream's duplicate
    window is safe, and is answered `duplicate=True` if it was.
    """

    def __init__(self, reason: str, *, subject: str, msg_id: str) -> None:
        super().__init__(f"the job was not stored: {reason}")
        self.reason = reason
        self.subject = subject
        self.msg_id = msg_id


def job_subject(session_id: str, prefix: str = DEFAULT_SUBJECT_PREFIX) -> str:
    """The subject a job for `session_id` is published to: `prefix`, a dot, and the hex
    SHA-256 of the session id's UTF-8 bytes."""
    return f"{prefix}.{hashlib.sha256(session_id.encode()).hexdigest()}"


def job_payload(
    session_id: str, request_id: str, threshold_chars: int | None, keep_chars: int | None
) -> bytes:
    """The job's JSON, checked as the worker checks it: a job it would reject is refused
    here (`ValueError`) rather than stored and terminated."""
    _check_id("session_id", session_id)
    request: dict[str, Any] = {"session_id": session_id, "request_id": request_id}
    for name, value in (("threshold_chars", threshold_chars), ("keep_chars", keep_chars)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer (chars), got {value!r}")
        request[name] = value
    return json.dumps(request).encode()


def check_subject(what: str, subject: str) -> None:
    """A subject to publish to: tokens that are not empty, wildcards or whitespace."""
    if not subject or not all(
        token and token not in ("*", ">") and not any(c.isspace() for c in token)
        for token in subject.split(".")
    ):
        raise ValueError(f"{what} must be a subject without wildcards or spaces, got {subject!r}")


def _check_id(field: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty string")
    if len(value.encode()) > MAX_SESSION_ID_BYTES:
        raise ValueError(f"{field} is longer than {MAX_SESSION_ID_BYTES} UTF-8 bytes")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError(f"{field} must not contain control characters")
