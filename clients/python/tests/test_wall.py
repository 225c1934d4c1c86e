"""The issue's end to end (issue 36, "the agent never hits the wall"): a 50-turn scripted
`create_agent` agent whose tools return screenshots (image blocks) and log dumps, one of
200 KB near the end, against a worker with the seed's defaults (a 60,000-char threshold, a
20,000-char keep, `TOOL_OUTPUT_MAX_CHARS` 20,000) and a model with a 32,000-token window
that counts images by their pixel size. No turn fails, and no call is even refused: the
screenshots weigh what the model charges for them (`block_chars`), so the worker compacts
before the window fills, and the 200 KB dump is evicted by the turn it arrives in.

Without the eviction (`TOOL_OUTPUT_MAX_CHARS=0`, or a worker older than it) the dump is
inside the keep and no compaction can remove it for a turn or two: the middleware's
compact-and-retry carries those turns (the dump clipped for the call, then compacted
away), and still no turn fails."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from agents import assert_pair_safe, is_tagged_summary, question
from conftest import NATS_URL, Worker, session_id, sql, usage_metadata
from images import png, screenshot
from limited import LimitedModel, prompt_tokens
from summarizer_client import SummarizerClient, SummarizerMiddleware, recall_tool

WINDOW = 32_000  # tokens
THRESHOLD, KEEP = 60_000, 20_000  # the seed's defaults
HUGE_TURN = 45
SHOT = png(1280, 800)  # 1,366 tokens: 5,464 chars


@pytest.fixture(scope="module")
def seed_worker(database_url: str, worker: Worker) -> Iterator[Worker]:
    # `worker` first: it migrates the database.
    seeded = Worker(
        database_url, SUMMARIZATION_THRESHOLD_CHARS=str(THRESHOLD), SUMMARIZATION_KEEP_CHARS=str(KEEP)
    )
    try:
        yield seeded
    finally:
        seeded.stop()


@pytest.fixture(scope="module")
def no_eviction_worker(database_url: str, worker: Worker) -> Iterator[Worker]:
    seeded = Worker(
        database_url,
        SUMMARIZATION_THRESHOLD_CHARS=str(THRESHOLD),
        SUMMARIZATION_KEEP_CHARS=str(KEEP),
        TOOL_OUTPUT_MAX_CHARS="0",
    )
    try:
        yield seeded
    finally:
        seeded.stop()


@pytest_asyncio.fixture
async def seeded(seed_worker: Worker, database_url: str) -> AsyncIterator[SummarizerClient]:
    async with SummarizerClient(
        NATS_URL, database_url, seed_worker.subject, timeout=10.0, recall_subject=seed_worker.recall_subject
    ) as client:
        yield client


@tool
def take_screenshot(n: int) -> list[dict[str, Any]]:
    """A screenshot of the checkout-api dashboard."""
    return screenshot(1280, 800)


@tool
def dump_logs(n: int) -> str:
    """The last 5 KB of checkout-api's log."""
    return "".join(f"turn {n} 14:{i:02d}:07 ERROR checkout-api pool exhausted (50/50) on db-7\n" for i in range(70))


@tool
def dump_all_logs(n: int) -> str:
    """Every line of checkout-api's log since the incident began: about 200 KB."""
    lines = [f"14:{i // 60 % 60:02d}:{i % 60:02d} ERROR checkout-api pool exhausted on db-{i % 9} req={i:06d}" for i in range(3_300)]
    return "\n".join(lines) + "\nFATAL checkout-api E-4242: connection pool deadlocked"


def plan(n: int) -> list[str]:
    if n == HUGE_TURN:
        return ["dump_all_logs"]
    return ["take_screenshot"] if n % 2 == 0 else ["dump_logs"]


async def fifty_turns(client: SummarizerClient, session: str) -> tuple[LimitedModel, list[Any]]:
    """The scripted investigation; every turn must complete. The model and the final state."""
    model = LimitedModel(limit=WINDOW, plan=plan)
    agent = create_agent(
        model,
        tools=[take_screenshot, dump_logs, dump_all_logs, recall_tool(client)],
        middleware=[SummarizerMiddleware(client)],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": session}}
    assert len(dump_all_logs.invoke({"n": 0})) > 200_000
    state: list[Any] = []
    for n in range(1, 51):
        await agent.ainvoke({"messages": [question(n)]}, config)  # never raises
        state = (await agent.aget_state(config)).values["messages"]
        assert_pair_safe(state)
    return model, state


async def test_fifty_turns_of_screenshots_and_log_dumps_never_hit_the_wall(
    seeded: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model, state = await fifty_turns(seeded, session)

    assert model.refused == [], "no call was even refused"
    assert max(prompt_tokens(p) for p in model.seen) <= WINDOW
    assert is_tagged_summary(state[0])
    # The session stays about its threshold, screenshots weighed: never the window.
    [(total,)] = sql(database_url, "SELECT total_chars FROM sessions WHERE session_id = %s", (session,))
    assert total <= THRESHOLD + KEEP, total
    # The dump was evicted on its own turn: the model read its ends around a note naming
    # the seq of its original, which is one recall away.
    the_call = next(p for p in model.seen if any(isinstance(m, ToolMessage) and m.name == "dump_all_logs" for m in p))
    [dump] = [m for m in the_call if isinstance(m, ToolMessage) and m.name == "dump_all_logs"]
    assert len(str(dump.content)) < 5_000, "the model read the evicted output's ends, not 200 KB"
    assert "E-4242" in str(dump.content), "the last lines stay"
    [(seq,)] = sql(
        database_url,
        "SELECT DISTINCT seq FROM archived_messages WHERE session_id = %s AND external_id = %s",
        (session, dump.id),
    )
    assert f"seq {seq}" in str(dump.content), "the note names where the original is"
    [original] = await seeded.fetch(session, [seq], max_chars=20_000)
    assert original.content.startswith("14:00:00 ERROR checkout-api") and original.truncated


async def test_without_eviction_compact_and_retry_carries_the_huge_dump(
    no_eviction_worker: Worker, database_url: str
) -> None:
    session = session_id()
    async with SummarizerClient(
        NATS_URL, database_url, no_eviction_worker.subject, timeout=10.0,
        recall_subject=no_eviction_worker.recall_subject,
    ) as client:
        model, state = await fifty_turns(client, session)

    # The dump's turn and the next are refused, each call retried once and answered: 100
    # calls for 50 turns, one more for each refusal.
    assert 1 <= len(model.refused) <= 3, len(model.refused)
    assert model.calls() == 100 + len(model.refused)
    assert all(e.get("overflow") for e in usage_metadata(database_url, session) if e.get("forced"))
    assert sum(bool(e.get("overflow")) for e in usage_metadata(database_url, session)) <= len(model.refused)
    assert is_tagged_summary(state[0])
    assert all(len(str(m.content)) < 20_000 for m in state), "the dump was compacted away"
