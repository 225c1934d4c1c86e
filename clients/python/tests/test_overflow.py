"""Compact and retry: a `create_agent` agent whose model refuses a prompt over its window
(`limited.LimitedModel`, `ContextOverflowError`), against a worker whose chars threshold is
out of reach, so that only the refusals compact. The middleware compacts the session
(`overflow: true`), calls the model once more, and the next turn starts from the
compaction; when nothing fits, or no worker answers, the model's first error is raised,
after two calls at most. And `maybe_summarize(..., overflow=error)` for a compiled graph."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from langchain.agents import create_agent
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agents import FILLER, assert_pair_safe, is_tagged_summary, question
from conftest import NATS_URL, Worker, session_id, sql, unique_subject, usage_metadata
from limited import LimitedModel, prompt_tokens
from summarizer_client import SummarizerClient, SummarizerMiddleware, maybe_summarize

ROOMY = 1_000_000


@pytest.fixture(scope="module")
def roomy_worker(database_url: str, worker: Worker) -> Iterator[Worker]:
    # `worker` first: it migrates the database. No eviction of large outputs here: the
    # clipping is the client's to test.
    roomy = Worker(database_url, SUMMARIZATION_THRESHOLD_CHARS=str(ROOMY), TOOL_OUTPUT_MAX_CHARS="0")
    try:
        yield roomy
    finally:
        roomy.stop()


@pytest_asyncio.fixture
async def roomy(roomy_worker: Worker, database_url: str) -> AsyncIterator[SummarizerClient]:
    async with SummarizerClient(
        NATS_URL, database_url, roomy_worker.subject, timeout=10.0, recall_subject=roomy_worker.recall_subject
    ) as client:
        yield client


@tool
def get_logs(n: int) -> str:
    """The recent error logs of checkout-api."""
    return f"turn {n}: 14:01:07 ERROR checkout-api pool exhausted (50/50) " + FILLER * 4


@tool
def dump_logs(n: int) -> str:
    """Every log line of checkout-api since the incident began."""
    return "".join(f"14:{i // 60:02d}:{i % 60:02d} ERROR checkout-api pool exhausted on db-{i % 9}\n" for i in range(400))


def agent(model: LimitedModel, client: SummarizerClient, tools: list[Any] | None = None) -> Any:
    return create_agent(
        model,
        tools=tools or [get_logs, dump_logs],
        middleware=[SummarizerMiddleware(client)],
        checkpointer=InMemorySaver(),
    )


async def run(agent_: Any, invocation: str, n: int, config: Any) -> dict[str, Any]:
    message = {"messages": [question(n)]}
    if invocation == "ainvoke":
        return await agent_.ainvoke(message, config)  # type: ignore[no-any-return]
    return await asyncio.to_thread(agent_.invoke, message, config)  # type: ignore[no-any-return]


@pytest.mark.parametrize("invocation", ["invoke", "ainvoke"])
@pytest.mark.parametrize("style", ["openai", "anthropic", "bare"])
async def test_an_overflow_is_compacted_the_call_retried_once_and_the_next_turn_is_healthy(
    invocation: str, style: str, roomy: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    # About 1,000 chars a turn: the window (2,000 tokens, 8,000 chars) is full by turn 8.
    model = LimitedModel(limit=2_000, style=style)
    agent_ = agent(model, roomy)
    config: Any = {"configurable": {"thread_id": session}}

    n = 0
    while not model.refused:
        n += 1
        assert n < 20, "the window never filled"
        calls = model.calls()
        await run(agent_, invocation, n, config)
    # The refused call, then the retry on the compacted history; the run went on.
    assert model.calls() - calls == 3, "the tool call, the refusal, the retry, nothing more"
    i = next(i for i, p in enumerate(model.seen) if prompt_tokens(p) > 2_000)
    refused, retried = model.seen[i], model.seen[i + 1]
    assert retried[-1].id == refused[-1].id, "the same call again"
    assert prompt_tokens(retried) <= 2_000
    assert is_tagged_summary(retried[0]), "the retry starts from the summary"
    state = (await agent_.aget_state(config)).values["messages"]
    assert is_tagged_summary(state[0]), "the checkpoint holds the compaction"
    assert_pair_safe(state)
    [event] = usage_metadata(database_url, session)
    assert event["overflow"] is True and event["forced"] is True, event

    # The next turn starts from the compaction, with no refusal; and the turns after it
    # run, whatever the window does.
    await run(agent_, invocation, n + 1, config)
    assert len(model.refused) == 1
    for m in range(n + 2, n + 5):
        await run(agent_, invocation, m, config)
    state = (await agent_.aget_state(config)).values["messages"]
    assert is_tagged_summary(state[0])
    assert_pair_safe(state)


async def test_the_first_error_is_raised_when_nothing_makes_the_prompt_fit(
    roomy: SummarizerClient, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    session = session_id()
    model = LimitedModel(limit=100_000)
    agent_ = agent(model, roomy)
    config: Any = {"configurable": {"thread_id": session}}
    for n in range(1, 6):
        await run(agent_, "ainvoke", n, config)

    # A window smaller than the newest question itself: compacted, then refused again.
    model.limit = 40
    calls = model.calls()
    with caplog.at_level(logging.WARNING, logger="summarizer_client"):
        with pytest.raises(ContextOverflowError) as raised:
            await run(agent_, "ainvoke", 6, config)

    assert raised.value is model.refused[0], "the first refusal is the one raised"
    assert model.calls() - calls == 2, "one retry, never a loop"
    assert "too long again after compaction" in caplog.text, caplog.text
    [event] = usage_metadata(database_url, session)
    assert event["overflow"] is True
    # The compaction stays: with the window back, the turn runs from it.
    model.limit = 100_000
    await run(agent_, "ainvoke", 6, config)
    assert is_tagged_summary(model.seen[-1][0])
    assert len(model.refused) == 2


async def test_a_session_too_short_to_compact_raises_the_first_error_at_once(roomy: SummarizerClient) -> None:
    model = LimitedModel(limit=20, plan=lambda n: [])
    agent_ = agent(model, roomy)
    with pytest.raises(ContextOverflowError) as raised:
        await run(agent_, "ainvoke", 1, {"configurable": {"thread_id": session_id()}})

    # One turn is too few to compact, and there is no tool output to clip.
    assert raised.value is model.refused[0]
    assert model.calls() == 1


@pytest.mark.parametrize("invocation", ["invoke", "ainvoke"])
async def test_with_no_worker_the_error_surfaces_as_before(
    invocation: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with SummarizerClient(NATS_URL, database_url, unique_subject(), timeout=2.0) as nobody:
        model = LimitedModel(limit=100_000)
        agent_ = agent(model, nobody)
        config: Any = {"configurable": {"thread_id": session_id()}}
        for n in range(1, 4):
            await run(agent_, invocation, n, config)
        model.limit = 500
        calls = model.calls()
        with caplog.at_level(logging.WARNING, logger="summarizer_client"):
            with pytest.raises(ContextOverflowError) as raised:
                await run(agent_, invocation, 4, config)

    assert raised.value is model.refused[0]
    assert model.calls() - calls == 1
    assert "no answer from the worker: no_responders" in caplog.text


async def test_a_tool_output_too_large_alone_is_clipped_for_the_retry_only(
    roomy: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    # The log dump (about 22,000 chars) does not fit a 3,000-token window on its own.
    model = LimitedModel(limit=3_000, plan=lambda n: ["dump_logs"] if n == 4 else ["get_logs"])
    agent_ = agent(model, roomy)
    config: Any = {"configurable": {"thread_id": session}}
    for n in range(1, 5):
        await run(agent_, "ainvoke", n, config)

    assert len(model.refused) == 1
    [retry] = [p for p in model.seen if any(_clipped(m) for m in p)]
    [output] = [m for m in retry if _clipped(m)]
    [(seq,)] = sql(database_url, "SELECT seq FROM messages WHERE session_id = %s AND external_id = %s", (session, output.id))
    assert f"the original is stored: recall seq {seq} for it]" in str(output.content)
    assert str(output.content).startswith("14:00:00 ERROR checkout-api pool exhausted on db-0\n")
    assert prompt_tokens(retry) <= 3_000
    # The state keeps the output whole: nothing is dropped, only the call was clipped.
    state = (await agent_.aget_state(config)).values["messages"]
    [whole] = [m for m in state if m.id == output.id]
    assert whole.content == dump_logs.invoke({"n": 4})


def _clipped(message: BaseMessage) -> bool:
    return isinstance(message, ToolMessage) and "were clipped here" in str(message.content)


async def test_maybe_summarize_recovers_a_compiled_graph_after_an_overflow(
    roomy: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = LimitedModel(limit=2_000)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode([get_logs]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": session}}

    recovered = 0
    for n in range(1, 14):
        await maybe_summarize(graph, config, roomy)
        try:
            await graph.ainvoke({"messages": [question(n)]}, config)
        except Exception as error:
            decision = await maybe_summarize(graph, config, roomy, overflow=error)
            if not decision.compacted:
                raise
            recovered += 1
            await graph.ainvoke(None, config)  # the model node again, on the compaction
        assert_pair_safe((await graph.aget_state(config)).values["messages"])

    assert recovered >= 1 and len(model.refused) == recovered
    assert all(e["overflow"] for e in usage_metadata(database_url, session))
    not_one = await maybe_summarize(graph, config, roomy, overflow=ValueError("bad tool schema"))
    assert (not_one.compacted, not_one.reason) == (False, "not_overflow")
