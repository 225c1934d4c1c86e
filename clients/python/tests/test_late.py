"""A compaction that commits after the client stopped waiting reaches the state on the
next turn, and is never undone by storing again what it archived."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

from agents import TOOLS, ScriptedModel, assert_pair_safe, is_tagged_summary, question
from conftest import NATS_URL, SUMMARY, Worker, rows, session_id, usage_events
from summarizer_client import SummarizerClient, SummarizerMiddleware
from summarizer_client._turn import sync_and_ask

LLM_DELAY = 1.5
CLIENT_TIMEOUT = 0.3


class SlowLlm(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat completion endpoint that answers after LLM_DELAY."""

    def do_POST(self) -> None:  # noqa: N802 -- the http.server API
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(LLM_DELAY)
        body = json.dumps({
            "id": "chatcmpl-slow",
            "model": "slow-fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": SUMMARY}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def slow_worker(database_url: str, worker: Worker) -> Iterator[Worker]:
    # `worker` first: it migrates the database.
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowLlm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = Worker(
        database_url,
        LLM_PROVIDER="openai",
        LLM_BASE_URL=f"http://127.0.0.1:{server.server_address[1]}",
        LLM_API_KEY="sk-fake",
        LLM_MODEL="slow-fake",
        LLM_TIMEOUT_MS="10000",
        LLM_DEADLINE_MS="20000",
    )
    try:
        yield slow
    finally:
        slow.stop()
        server.shutdown()


def wait_for(what: str, condition: Any) -> None:
    deadline = time.monotonic() + 15
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_late_compaction_reaches_the_state_on_the_next_turn_and_is_not_undone(
    slow_worker: Worker, database_url: str
) -> None:
    session = session_id()
    client = SummarizerClient(NATS_URL, database_url, slow_worker.subject, timeout=CLIENT_TIMEOUT)
    client.connect_sync()
    try:
        agent = create_agent(
            ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=InMemorySaver()
        )
        config: Any = {"configurable": {"thread_id": session}}
        n = 0
        # Turns until one crosses the threshold: its ask times out while the LLM sleeps.
        while "timeout" not in client.warnings.reported():
            n += 1
            assert n < 10, "no request timed out"
            agent.invoke({"messages": [question(n)]}, config)
        before = agent.get_state(config).values["messages"]
        wait_for("the late compaction", lambda: usage_events(database_url, session) == 1)
        assert not is_tagged_summary(before[0]), "the compaction was not late"
        archived = {r["external_id"] for r in rows(database_url, "archived_messages", session)}
        assert archived and archived <= {m.id for m in before}

        agent.invoke({"messages": [question(n + 1)]}, config)
        after = agent.get_state(config).values["messages"]

        assert is_tagged_summary(after[0])
        assert_pair_safe(after)
        assert not archived & {m.id for m in after}
        current = {r["external_id"] for r in rows(database_url, "messages", session)}
        assert not archived & current
    finally:
        client.close_sync()


async def test_a_sync_never_stores_again_a_message_the_worker_archived(
    slow_worker: Worker, database_url: str
) -> None:
    """A fresh process (nothing remembered) syncing a state from before a late
    compaction: what was archived stays archived."""
    session = session_id()
    async with SummarizerClient(NATS_URL, database_url, slow_worker.subject, timeout=CLIENT_TIMEOUT) as first:
        model = ScriptedModel()
        agent = create_agent(model, tools=TOOLS, checkpointer=InMemorySaver())
        config: Any = {"configurable": {"thread_id": session}}
        for n in range(1, 5):
            await agent.ainvoke({"messages": [question(n)]}, config)
        stale = (await agent.aget_state(config)).values["messages"]
        await first.append(session, stale)
        decision = await first.turn_starting(session)
        assert decision.reason == "timeout"
        wait_for("the late compaction", lambda: usage_events(database_url, session) == 1)
    archived = rows(database_url, "archived_messages", session)
    current_before = rows(database_url, "messages", session)

    async with SummarizerClient(NATS_URL, database_url, slow_worker.subject, timeout=CLIENT_TIMEOUT) as fresh:
        written = await fresh.append(session, stale)
        turn = await fresh.run(sync_and_ask(fresh, session, stale))

    assert written == 0
    # The same rows (the load only tagged the summary with an id).
    assert [r["seq"] for r in rows(database_url, "messages", session)] == [r["seq"] for r in current_before]
    assert rows(database_url, "archived_messages", session) == archived
    assert turn.history is not None and is_tagged_summary(turn.history[0])
