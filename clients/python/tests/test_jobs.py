"""Durable jobs: `publish_job` to a worker with `TRANSPORT=both`, on a stream, consumer and
subject prefix of the test's own (the stream is deleted after it, so nothing is left on
the shared NATS)."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest

from agents import FILLER, question
from conftest import NATS_URL, THRESHOLD, Worker, rows, session_id, sql, usage_events
from summarizer_client import JobNotStored, PublishedJob, SummarizerClient, job_subject


@dataclass(frozen=True)
class JobsWorker:
    worker: Worker
    stream: str
    consumer: str
    prefix: str


async def delete_stream(name: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().delete_stream(name)
    except nats.js.errors.NotFoundError:
        pass
    finally:
        await nc.close()


@pytest.fixture
def jobs_worker(worker: Worker, database_url: str) -> Iterator[JobsWorker]:
    # `worker` first: it migrates the database.
    token = secrets.token_hex(6)
    stream, consumer = f"PYTEST_JOBS_{token}", f"pytest-workers-{token}"
    # Apart from the worker's NATS_SUBJECT (pytest.<token>.turn.starting).
    prefix = f"pytest-jobs.{token}"
    running: Worker | None = None
    try:
        running = Worker(
            database_url,
            TRANSPORT="both",
            JETSTREAM_STREAM=stream,
            JETSTREAM_CONSUMER=consumer,
            JETSTREAM_SUBJECT_PREFIX=prefix,
        )
        yield JobsWorker(running, stream, consumer, prefix)
    finally:
        if running is not None:
            running.stop()
        asyncio.run(delete_stream(stream))


def store_conversation(database_url: str, session: str, turns: int = 6) -> None:
    """Plain-SQL rows over the threshold: `turns` exchanges of about 650 chars each."""
    for n in range(1, turns + 1):
        sql(
            database_url,
            "INSERT INTO messages (session_id, role, content) VALUES "
            "(%(s)s, 'user', %(q)s), (%(s)s, 'assistant', %(a)s)",
            {"s": session, "q": question(n).content, "a": f"Answer {n}: " + FILLER * 6},
        )
    chars = sum(len(r["content"]) for r in rows(database_url, "messages", session))
    assert chars > THRESHOLD


def assert_compacted_once(database_url: str, session: str) -> None:
    current = rows(database_url, "messages", session)
    assert usage_events(database_url, session) == 1
    assert current[0]["is_summary"], "the history does not start with the summary"
    assert sum(r["is_summary"] for r in current) == 1
    assert rows(database_url, "archived_messages", session)


async def stream_state(name: str) -> Any:
    nc = await nats.connect(NATS_URL)
    try:
        return (await nc.jetstream().stream_info(name)).state
    finally:
        await nc.close()


async def until_settled(jobs: JobsWorker) -> Any:
    """Waits until the stream is empty (every job acked); returns its state."""
    deadline = time.monotonic() + 30
    while True:
        state = await stream_state(jobs.stream)
        if state.messages == 0:
            return state
        assert time.monotonic() < deadline, f"the stream still holds {state.messages} jobs"
        await asyncio.sleep(0.05)


def test_a_job_subject_is_the_prefix_and_the_hex_digest_of_the_session() -> None:
    # sha256("s1"), as the Rust `job_subject` and `printf s1 | sha256sum` give it.
    assert job_subject("s1") == (
        "summarizer.jobs.e8bc163c82eee18733288c7d4ac636db3a6deb013ef2d37b68322be20edc45cc"
    )
    assert job_subject("s1", "p") == (
        "p.e8bc163c82eee18733288c7d4ac636db3a6deb013ef2d37b68322be20edc45cc"
    )
    subject = job_subject("a session with spaces.and.dots >* ü", "p")
    assert subject.startswith("p.") and len(subject) == 2 + 64
    assert all(c in "0123456789abcdef" for c in subject[2:])


async def test_a_job_compacts_an_over_threshold_session_and_answers_on_reply_to(
    jobs_worker: JobsWorker, database_url: str
) -> None:
    session = session_id()
    store_conversation(database_url, session)
    nc = await nats.connect(NATS_URL)
    try:
        inbox = nc.new_inbox()
        replies = await nc.subscribe(inbox)
        await nc.flush()
        async with SummarizerClient(NATS_URL, database_url, jobs_worker.worker.subject, timeout=10.0) as client:
            published = await client.publish_job(
                session, reply_to=inbox, subject_prefix=jobs_worker.prefix
            )
        reply = json.loads((await replies.next_msg(timeout=20)).data)
    finally:
        await nc.close()

    assert isinstance(published, PublishedJob)
    assert not published.duplicate and published.sequence == 1
    assert len(published.msg_id) == 32, "a fresh uuid4 hex"
    assert (reply["status"], reply["reason"], reply["session_id"]) == ("compacted", "compacted", session)
    assert reply["latest_compaction_id"] is not None
    await until_settled(jobs_worker)
    assert_compacted_once(database_url, session)


async def test_the_same_msg_id_twice_is_stored_once_and_compacts_once(
    jobs_worker: JobsWorker, database_url: str
) -> None:
    session = session_id()
    store_conversation(database_url, session)
    key = f"batch-1:{session}"
    nc = await nats.connect(NATS_URL)
    try:
        inbox = nc.new_inbox()
        replies = await nc.subscribe(inbox)
        await nc.flush()
        async with SummarizerClient(NATS_URL, database_url, jobs_worker.worker.subject, timeout=10.0) as client:
            first = await client.publish_job(
                session, msg_id=key, reply_to=inbox, subject_prefix=jobs_worker.prefix
            )
            second = await client.publish_job(
                session, msg_id=key, reply_to=inbox, subject_prefix=jobs_worker.prefix
            )
        reply = json.loads((await replies.next_msg(timeout=20)).data)
        state = await until_settled(jobs_worker)
        # A second job would have been answered (below_threshold) by now.
        with pytest.raises(nats.errors.TimeoutError):
            await replies.next_msg(timeout=1.5)
    finally:
        await nc.close()

    assert first == PublishedJob(msg_id=key, sequence=1, duplicate=False)
    assert second == PublishedJob(msg_id=key, sequence=1, duplicate=True)
    assert reply["status"] == "compacted"
    assert state.last_seq == 1, "one job stored"
    assert_compacted_once(database_url, session)


def test_a_sync_program_publishes_a_job(jobs_worker: JobsWorker, database_url: str) -> None:
    session = session_id()
    store_conversation(database_url, session)
    client = SummarizerClient(NATS_URL, database_url, jobs_worker.worker.subject, timeout=10.0)
    client.connect_sync()
    try:
        published = client.publish_job_sync(
            session, msg_id="sync-1", threshold_chars=THRESHOLD, subject_prefix=jobs_worker.prefix
        )
    finally:
        client.close_sync()

    assert published == PublishedJob(msg_id="sync-1", sequence=1, duplicate=False)
    deadline = time.monotonic() + 20
    while usage_events(database_url, session) == 0:
        assert time.monotonic() < deadline, "the job did not compact the session"
        time.sleep(0.05)
    asyncio.run(until_settled(jobs_worker))
    assert_compacted_once(database_url, session)


async def test_no_stream_for_the_prefix_is_job_not_stored(database_url: str) -> None:
    prefix = f"pytest-nojobs.{secrets.token_hex(6)}"
    async with SummarizerClient(NATS_URL, database_url, timeout=2.0) as client:
        with pytest.raises(JobNotStored, match="no stream takes") as raised:
            await client.publish_job("s1", msg_id="m-1", subject_prefix=prefix)

    assert raised.value.subject == job_subject("s1", prefix)
    assert raised.value.msg_id == "m-1"


def test_no_stream_is_job_not_stored_from_sync_code_too(database_url: str) -> None:
    client = SummarizerClient(NATS_URL, database_url, timeout=2.0)
    client.connect_sync()
    try:
        with pytest.raises(JobNotStored, match="no stream takes"):
            client.publish_job_sync("s1", subject_prefix=f"pytest-nojobs.{secrets.token_hex(6)}")
    finally:
        client.close_sync()


async def test_nats_unreachable_is_job_not_stored(database_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    async with SummarizerClient(f"nats://127.0.0.1:{port}", database_url, timeout=0.5) as client:
        with pytest.raises(JobNotStored, match="not connected to NATS"):
            await client.publish_job("s1")


@pytest.mark.parametrize(
    "session, options",
    [
        ("", {}),
        ("x" * 257, {}),
        ("s\n1", {}),
        ("s1", {"threshold_chars": 0}),
        ("s1", {"keep_chars": True}),
        ("s1", {"msg_id": ""}),
        ("s1", {"reply_to": "not a subject"}),
        ("s1", {"subject_prefix": "summarizer.jobs.>"}),
    ],
)
async def test_a_job_the_worker_would_reject_is_refused_before_it_is_stored(
    session: str, options: dict[str, Any], database_url: str
) -> None:
    async with SummarizerClient(NATS_URL, database_url, timeout=2.0) as client:
        with pytest.raises(ValueError):
            await client.publish_job(session, **options)
