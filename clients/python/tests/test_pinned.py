"""Pinned messages: `additional_kwargs["summarizer_pinned"] = True` is mirrored to the
`pinned` column when the message is stored and when it is pinned or unpinned later (an
edit in place), and a pinned message outlives every compaction where it is, in the table
and in the state, with its tool call's partners."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from agents import FILLER, ScriptedModel, assert_pair_safe, is_tagged_summary, question
from conftest import pins, rows, session_id, usage_events, usage_metadata
from summarizer_client import SummarizerClient, summarizer_node
from test_graph import agent_graph

PIN = "summarizer_pinned"
GOAL = "Goal: find why checkout-api is slow, and never restart db-7 without asking. " + FILLER


def pinned(message: BaseMessage, pin: bool = True) -> BaseMessage:
    """The message with its pin set or taken away (the same id: an edit in place)."""
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k != PIN}
    return message.model_copy(update={"additional_kwargs": {**kwargs, PIN: True} if pin else kwargs})


def assert_every_call_answered(messages: list[BaseMessage]) -> None:
    """Each tool call in the list has its result in it (the other half of pair safety)."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    for m in messages:
        if isinstance(m, AIMessage):
            for call in m.tool_calls:
                assert call["id"] in answered, f"call {call['id']} lost its result"


def archived_ids(database_url: str, session: str) -> set[str]:
    return {r["external_id"] for r in rows(database_url, "archived_messages", session)}


async def test_pinned_messages_outlive_compactions_in_their_place_and_unpinning_lets_them_go(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    graph = agent_graph(ScriptedModel(), summarizer_node(client)).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": session}}
    goal = HumanMessage(content=GOAL, id="goal", additional_kwargs={PIN: True})

    # Pinned when first stored.
    await graph.ainvoke({"messages": [goal]}, config)
    assert pins(database_url, session)["goal"] is True
    # Pinned later: the first turn's log, one of two parallel results.
    state = (await graph.aget_state(config)).values["messages"]
    log = next(m for m in state if isinstance(m, ToolMessage) and m.name == "get_logs")
    await graph.aupdate_state(config, {"messages": [pinned(log)]})
    await graph.ainvoke({"messages": [question(1)]}, config)
    assert pins(database_url, session)[log.id] is True
    assert sum(pins(database_url, session).values()) == 2

    for n in range(2, 10):  # about 1,300 chars a turn over a 3,000 threshold
        await graph.ainvoke({"messages": [question(n)]}, config)
    assert usage_events(database_url, session) >= 2

    # In the table: still in `messages`, pinned, never archived, where they were.
    table = rows(database_url, "messages", session)
    assert [r["external_id"] for r in table[:1]] == ["goal"], "the goal kept its place"
    assert {"goal", log.id} <= {r["external_id"] for r in table}
    assert not {"goal", log.id} & archived_ids(database_url, session)
    assert pins(database_url, session)["goal"] and pins(database_url, session)[log.id]
    assert not any(event.get("forced") for event in usage_metadata(database_url, session))
    # In the state: the pinned messages as they were, pin included, beside the summary;
    # the log with its call, and the call with both its results.
    state = (await graph.aget_state(config)).values["messages"]
    by_id = {m.id: m for m in state}
    assert state[0].id == "goal" and state[0].additional_kwargs.get(PIN) is True
    assert by_id[log.id].additional_kwargs.get(PIN) is True and by_id[log.id].content == log.content
    assert any(is_tagged_summary(m) for m in state)
    assert_pair_safe(state)
    assert_every_call_answered(state)
    # A fresh process that loaded nothing finds every pin stored already (the node runs
    # before the model: the run's last answer is stored here first).
    assert await client.append(session, state) == 1
    async with SummarizerClient(client.nats_url, database_url, client.subject, timeout=10.0) as fresh:
        assert await fresh.append(session, state) == 0

    # Unpinned: the column follows, the row stays where it is, and the next compaction
    # may take the goal away.
    seq = table[0]["seq"]
    await graph.aupdate_state(config, {"messages": [pinned(state[0], pin=False)]})
    await graph.ainvoke({"messages": [question(10)]}, config)
    assert pins(database_url, session).get("goal") is False or "goal" in archived_ids(database_url, session)
    assert all(r["seq"] == seq for r in rows(database_url, "messages", session) if r["external_id"] == "goal")
    for n in range(11, 16):
        if "goal" in archived_ids(database_url, session):
            break
        await graph.ainvoke({"messages": [question(n)]}, config)
    assert "goal" in archived_ids(database_url, session), "unpinned, the goal is summarized like any message"
    assert pins(database_url, session)[log.id] is True
    state = (await graph.aget_state(config)).values["messages"]
    assert "goal" not in {m.id for m in state} and log.id in {m.id for m in state}
    assert_pair_safe(state)
    assert_every_call_answered(state)


async def test_pinning_is_an_edit_in_place_on_either_store(client: SummarizerClient, database_url: str) -> None:
    """`append` alone: a pin toggled writes the row, the same pin again writes nothing,
    and a load gives the message back with its pin."""
    session = session_id()
    ask = HumanMessage(content="why is checkout-api slow?", id="ask")
    answer = AIMessage(content="The pool on db-7 is exhausted.", id="answer")
    assert await client.append(session, [pinned(ask), answer]) == 2
    before = {r["external_id"]: r["seq"] for r in rows(database_url, "messages", session)}
    assert pins(database_url, session) == {"ask": True, "answer": False}

    assert await client.append(session, [pinned(ask), answer]) == 0
    assert await client.append(session, [pinned(ask, pin=False), pinned(answer)]) == 2
    assert pins(database_url, session) == {"ask": False, "answer": True}
    assert {r["external_id"]: r["seq"] for r in rows(database_url, "messages", session)} == before
    # Only `True` pins: a stray truthy value does not.
    assert await client.append(session, [ask.model_copy(update={"additional_kwargs": {PIN: "yes"}})]) == 0
    assert pins(database_url, session)["ask"] is False

    loaded = {m.id: m for m in await client.load(session)}
    assert loaded["answer"].additional_kwargs == {PIN: True}
    assert loaded["ask"].additional_kwargs == {}
