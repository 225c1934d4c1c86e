"""Recall against the real worker: `client.recall`/`fetch` over what a compaction archived,
their typed failures, and `recall_tool` in a LangChain agent whose scripted model asks
for a fact the compaction took out of its context."""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

import nats
import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from agents import FILLER, assert_pair_safe
from conftest import NATS_URL, Worker, rows, session_id, usage_events
from summarizer_client import (
    Recalled,
    RecallError,
    SummarizerClient,
    SummarizerMiddleware,
    recall_tool,
)
from summarizer_client.recall import as_text
from summarizer_client.tool import TOOL_FETCH_CHARS, TOOL_MAX_SEQS, _other_words, _seqs

FACT = "E-5417"
HOST = "10.43.7.217:6432"
RECALL = "recall_earlier_conversation"
_ids = itertools.count()


@tool
def read_pool_log(service: str) -> str:
    """The connection pooler's log for a service."""
    return (
        f"pgbouncer-14 at {HOST} refused {service} with error {FACT}: "
        "max_client_conn reached. " + FILLER * 4
    )


@tool
def get_metrics(service: str) -> str:
    """The recent metrics of a service."""
    return f"{service}: p99=2300ms rps=410 " + FILLER * 4


class Investigator(BaseChatModel):
    """On the first question: reads the pool log. On later ones: reads metrics. On a
    question that starts with "recall ": calls the recall tool with the rest of it. After
    any tool result: an answer, quoting the recall tool's result. Keeps every input."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "investigator"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Investigator:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        last = messages[-1]
        if isinstance(last, ToolMessage):
            said = f"From the archive: {last.content}" if last.name == RECALL else "Still slow. " + FILLER
            return _reply(AIMessage(content=said))
        text = str(last.content)
        n = next(_ids)
        if text.startswith("recall "):
            call = {"name": RECALL, "args": {"query": text.removeprefix("recall ")}}
        elif len(self.seen) == 1:
            call = {"name": "read_pool_log", "args": {"service": "checkout-api"}}
        else:
            call = {"name": "get_metrics", "args": {"service": "checkout-api"}}
        return _reply(AIMessage(content="", tool_calls=[{**call, "id": f"call-{n}", "type": "tool_call"}]))


def _reply(message: AIMessage) -> ChatResult:
    return ChatResult(generations=[ChatGeneration(message=message)])


def investigate_until_archived(agent: Any, config: dict[str, Any], database_url: str, session: str) -> None:
    """Turns until the first turn's pool log is archived (at most 20)."""
    for n in range(1, 21):
        agent.invoke({"messages": [HumanMessage(content=f"Turn {n}: why is checkout-api slow? " + FILLER)]}, config)
        if any(FACT in r["content"] for r in rows(database_url, "archived_messages", session)):
            return
    raise AssertionError("20 turns and the pool log was never archived")


async def archived_session(client: SummarizerClient, database_url: str) -> str:
    """A new session investigated by an agent until its pool log is archived."""
    session = session_id()
    agent = create_agent(
        Investigator(),
        tools=[read_pool_log, get_metrics, recall_tool(client)],
        middleware=[SummarizerMiddleware(client)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": session}}
    await asyncio.to_thread(investigate_until_archived, agent, config, database_url, session)
    return session


def test_a_langchain_agent_recalls_a_fact_its_context_lost(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = Investigator()
    agent = create_agent(
        model,
        tools=[read_pool_log, get_metrics, recall_tool(client)],
        middleware=[SummarizerMiddleware(client)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": session}}
    investigate_until_archived(agent, config, database_url, session)
    state = agent.get_state(config).values["messages"]
    assert not any(m.name == "read_pool_log" for m in state), "the pool log is still in context"

    agent.invoke({"messages": [HumanMessage(content=f"recall {FACT}")]}, config)

    messages = agent.get_state(config).values["messages"]
    assert_pair_safe(messages)
    answer = [m for m in messages if isinstance(m, ToolMessage) and m.name == RECALL][-1]
    # The original tool output, whole, with its seq and the tool it came from.
    assert f"refused checkout-api with error {FACT}: max_client_conn reached" in answer.content
    assert HOST in answer.content
    assert "tool read_pool_log]" in answer.content
    assert str(messages[-1].content).startswith("From the archive: 1 archived message")
    assert usage_events(database_url, session) >= 1


async def test_recall_and_fetch_read_the_sessions_archive(
    client: SummarizerClient, database_url: str
) -> None:
    session = await archived_session(client, database_url)
    archived = rows(database_url, "archived_messages", session)
    holding = [r["seq"] for r in archived if HOST in r["content"]]

    found = await client.recall(session, HOST)
    assert [r.seq for r in found] == holding
    assert found[0].role == "tool" and found[0].tool_name == "read_pool_log"
    assert found[0].tool_call_id and found[0].archived_at and found[0].compaction_id > 0
    assert await client.recall(session, "pgbouncer-14 max_client_conn", limit=1) == found[:1]
    # Another session's archive answers nothing, by query or by seq.
    assert await client.recall(session_id(), HOST) == []
    assert await client.fetch(session_id(), holding) == []

    whole = await client.fetch(session, [*holding, 10**9])
    assert [r.seq for r in whole] == holding and not whole[0].truncated
    cut = await client.fetch(session, holding, max_chars=40)
    assert cut[0].truncated and len(cut[0].content) == 40


async def test_a_query_is_text_and_a_bad_one_is_refused(client: SummarizerClient) -> None:
    session = session_id()
    # Query syntax reaches no database: these are searched as text and find nothing.
    for query in ["'; DROP TABLE messages; --", 'E-5417 OR "x" AND NOT y*', "%_% \\ NEAR(a b)"]:
        assert await client.recall(session, query) == []
    with pytest.raises(RecallError) as refused:
        await client.recall(session, "a b c")
    assert refused.value.reason == "invalid_request" and "3 chars" in refused.value.message
    for bad in [dict(query=""), dict(query="x" * 1025), dict(query="E-5417", limit=51)]:
        with pytest.raises(ValueError):
            await client.recall(session, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await client.fetch(session, list(range(51)))


async def test_the_tool_says_recall_is_unavailable_rather_than_raising(
    worker: Worker, database_url: str
) -> None:
    # A subject nobody serves, and one whose only subscriber never answers.
    silent = await nats.connect(NATS_URL)
    await silent.subscribe(f"{worker.recall_subject}.silent", cb=_ignore)
    try:
        for subject, reason in [
            (f"{worker.recall_subject}.nobody", "no_responders"),
            (f"{worker.recall_subject}.silent", "timeout"),
        ]:
            async with SummarizerClient(
                nats_url=NATS_URL, database_url=database_url, recall_subject=subject, timeout=0.5
            ) as client:
                with pytest.raises(RecallError) as failed:
                    await client.recall("s-1", FACT)
                assert failed.value.reason == reason
                said = await recall_tool(client).ainvoke(
                    {"query": FACT}, {"configurable": {"thread_id": "s-1"}}
                )
                assert said == f"recall unavailable ({reason}); go on without the earlier conversation."
    finally:
        await silent.close()


async def test_the_tool_fetches_by_seq_and_names_the_session_it_lacks(
    client: SummarizerClient, database_url: str
) -> None:
    session = await archived_session(client, database_url)
    config = {"configurable": {"thread_id": session}}
    seq = next(r["seq"] for r in rows(database_url, "archived_messages", session) if HOST in r["content"])

    tool_ = recall_tool(client)
    said = await tool_.ainvoke({"query": f"seq {seq}"}, config)
    assert said.startswith(f"1 archived message for 'seq {seq}':\n\n[seq {seq}, tool read_pool_log]\n")
    assert "max_client_conn reached" in said
    assert tool_.invoke({"query": "a b"}, config).startswith("recall refused the query: ")
    assert tool_.invoke({"query": FACT}, {}) == (
        "recall unavailable: this run has no thread_id to find the conversation by."
    )
    # The model is asked for the query only; the session comes from the run.
    assert set(tool_.args) == {"query"}


async def test_the_tool_reads_the_seqs_a_query_names_a_few_at_a_time(
    client: SummarizerClient, database_url: str
) -> None:
    session = await archived_session(client, database_url)
    config = {"configurable": {"thread_id": session}}
    archived = sorted({r["seq"] for r in rows(database_url, "archived_messages", session)})
    assert len(archived) > TOOL_MAX_SEQS, archived
    first, last = archived[0], archived[-1]
    tool_ = recall_tool(client)

    # A seq named anywhere in the query is read, not searched for.
    said = await tool_.ainvoke({"query": f"what did seq #{first} say?"}, config)
    assert f"[seq {first}, " in said and said.startswith("1 archived message for")
    # A range reads its first few seqs and names the rest, which the next call reads.
    said = await tool_.ainvoke({"query": f"seqs {last} to {first}"}, config)
    shown = [int(n) for n in re.findall(r"^\[seq (\d+), ", said, re.MULTILINE)]
    assert shown == archived[:TOOL_MAX_SEQS], said
    rest = f"seqs {first + TOOL_MAX_SEQS} to {last}"
    assert said.endswith(f"[Not read yet: {rest}. Ask for them in another call.]"), said
    # What the five share is at most one message's worth.
    assert len(said) < TOOL_FETCH_CHARS + 2_000
    said = await tool_.ainvoke({"query": rest}, config)
    shown = [int(n) for n in re.findall(r"^\[seq (\d+), ", said, re.MULTILINE)]
    assert shown == archived[TOOL_MAX_SEQS : 2 * TOOL_MAX_SEQS], said
    # Words besides the seq are searched too.
    said = await tool_.ainvoke({"query": f"read seq {first} and the max_client_conn error"}, config)
    assert said.startswith(f"1 archived message for 'read seq {first} and the max_client_conn error':")
    assert "archived messages for 'max_client_conn error':" in said or (
        "archived message for 'max_client_conn error':" in said
    ), said
    assert said.count("max_client_conn reached") >= 1, said


def test_seq_references_and_cut_notes_read_as_a_model_would_write_them() -> None:
    assert _seqs("seq 12") == ([12], "")
    assert _seqs("Seqs 12, 14 and #15; seq 12") == ([12, 14, 15], "")
    assert _seqs("read seq: 4-6 again") == ([4, 5, 6], "")
    assert _seqs("seq-12 and seq. 13") == ([12, 13], "")
    # In the query's order, a range either way round; the rest named for the next call.
    assert _seqs("seqs 1, 2, 3, 10-20") == ([1, 2, 3, 10, 11], "seqs 12 to 20")
    assert _seqs("seq 9 to 4") == ([4, 5, 6, 7, 8], "seq 9")
    assert _seqs("seqs 1 to 3, 2 to 8, 40") == ([1, 2, 3, 4, 5], "seqs 6 to 8, 40")
    assert _seqs("seq 1..10000000") == ([1, 2, 3, 4, 5], "seqs 6 to 10000000")
    # Not a seq: no reference, or past any seq there can be.
    assert _seqs("E-5417 in sequence logs") == ([], "")
    assert _seqs("seq 99999999999999999999") == ([], "")
    assert _other_words("read seq 12 again, please") == ""
    assert _other_words("what did seq #4817 say about checkout timeouts?") == "checkout timeouts?"

    def recalled(seq: int, truncated: bool) -> Recalled:
        return Recalled(seq, "tool", "read_pool_log", "c1", "x" * 10, truncated, 1, "2026-12-06T00:00:00Z")

    assert as_text("q", [recalled(3, False)]).endswith("[seq 3, tool read_pool_log]\nxxxxxxxxxx")
    assert as_text("q", [recalled(3, True)]).endswith("[... cut; ask for seq 3 to read more of it]")
    assert as_text("seq 3", [recalled(3, True)], max_chars=4_000, fetched=True).endswith(
        "[... cut; ask for seq 3 alone to read more of it]"
    )
    # At the most recall returns, asking again would loop: the model is told so.
    for fetched in [True, False]:
        assert as_text("seq 3", [recalled(3, True)], max_chars=20_000, fetched=fetched).endswith(
            "[... cut at 20,000 chars, the most recall returns of one message]"
        )


async def test_a_recall_that_works_again_clears_its_warning(
    client: SummarizerClient, worker: Worker
) -> None:
    tool_ = recall_tool(client)
    config = {"configurable": {"thread_id": session_id()}}
    subject = client.recall_subject
    client.recall_subject = f"{worker.recall_subject}.nobody"
    try:
        said = await tool_.ainvoke({"query": FACT}, config)
        assert said.startswith("recall unavailable (no_responders)")
        assert "recall" in client.warnings.reported()
    finally:
        client.recall_subject = subject
    said = await tool_.ainvoke({"query": FACT}, config)
    assert said.startswith("Nothing in the archived part"), said
    assert "recall" not in client.warnings.reported()


async def _ignore(_: Any) -> None:
    return None
