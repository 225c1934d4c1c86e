"""`SummarizerMiddleware` in a `create_agent` agent with parallel tool calls and a durable
checkpointer in the store's database (Postgres, or the SQLite file), over many turns at a
low threshold."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent

from agents import (
    TOOLS,
    ScriptedModel,
    assert_every_message_kept_once,
    assert_pair_safe,
    is_tagged_summary,
    question,
)
from conftest import THRESHOLD, async_checkpointer, checkpointer, rows, session_id, usage_events
from summarizer_client import SummarizerClient, SummarizerMiddleware


def check_turn(state: dict[str, Any], produced: set[str], compacted_before: bool) -> bool:
    messages = state["messages"]
    assert_pair_safe(messages)
    produced.update(m.id for m in messages if not is_tagged_summary(m))
    if compacted_before or is_tagged_summary(messages[0]):
        assert is_tagged_summary(messages[0]), "the checkpoint lost its summary"
        return True
    return False


def test_create_agent_sync_with_a_durable_checkpointer_over_thirty_turns(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = ScriptedModel()
    produced: set[str] = set()
    compacted = False
    with checkpointer(database_url) as saver:
        agent = create_agent(model, tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=saver)
        config = {"configurable": {"thread_id": session}}
        for n in range(1, 32):
            agent.invoke({"messages": [question(n)]}, config)
            state = agent.get_state(config).values
            compacted = check_turn(state, produced, compacted)

    assert compacted
    assert usage_events(database_url, session) >= 5
    # 31 turns of about 1,300 chars each; the model never sees much more than the threshold.
    assert max(model.inputs) < 2 * THRESHOLD, model.inputs
    assert len(produced) == 31 * 5
    assert_every_message_kept_once(
        produced, rows(database_url, "messages", session), rows(database_url, "archived_messages", session)
    )


async def test_create_agent_async_with_a_durable_checkpointer(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = ScriptedModel()
    produced: set[str] = set()
    compacted = False
    async with async_checkpointer(database_url) as saver:
        agent = create_agent(model, tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=saver)
        config = {"configurable": {"thread_id": session}}
        for n in range(1, 13):
            await agent.ainvoke({"messages": [question(n)]}, config)
            state = (await agent.aget_state(config)).values
            compacted = check_turn(state, produced, compacted)

    assert compacted
    assert max(model.inputs) < 3 * THRESHOLD, model.inputs
    assert_every_message_kept_once(
        produced, rows(database_url, "messages", session), rows(database_url, "archived_messages", session)
    )


async def test_an_explicit_session_id_overrides_the_thread(client: SummarizerClient, database_url: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    session = session_id()
    agent = create_agent(
        ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(client, session_id=session)],
        checkpointer=InMemorySaver(),
    )
    await agent.ainvoke({"messages": [question(1)]}, {"configurable": {"thread_id": "other"}})

    stored = rows(database_url, "messages", session)
    assert [r["role"] for r in stored] == ["user", "assistant", "tool", "tool", "assistant"]
