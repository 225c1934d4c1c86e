"""The Python client reports the same reasons as the Rust `TurnClient` for the same
situations: the reply's reason, `timeout`, `no_responders`, `transport_error`."""

from __future__ import annotations

import socket

import nats

from conftest import NATS_URL, Worker, session_id, unique_subject
from summarizer_client import Decision, SummarizerClient


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_reply_reports_its_own_reason(worker: Worker, database_url: str) -> None:
    async with SummarizerClient(NATS_URL, database_url, worker.subject) as client:
        decision = await client.turn_starting(session_id())

    assert decision.reason == "unknown_session"
    assert not decision.compacted
    assert decision.reply is not None and decision.reply["status"] == "skipped"
    assert "latest_compaction_id" in decision.reply


async def test_no_worker_is_no_responders(database_url: str) -> None:
    async with SummarizerClient(NATS_URL, database_url, unique_subject()) as client:
        assert await client.turn_starting("s") == Decision(False, "no_responders", None)


async def test_a_silent_responder_is_a_timeout(database_url: str) -> None:
    subject = unique_subject()
    nc = await nats.connect(NATS_URL)
    await nc.subscribe(subject)  # never answers
    try:
        async with SummarizerClient(NATS_URL, database_url, subject, timeout=0.2) as client:
            assert await client.turn_starting("s") == Decision(False, "timeout", None)
    finally:
        await nc.close()


async def test_nats_unreachable_is_a_transport_error(database_url: str) -> None:
    async with SummarizerClient(f"nats://127.0.0.1:{closed_port()}", database_url, timeout=0.5) as client:
        assert await client.turn_starting("s") == Decision(False, "transport_error", None)
