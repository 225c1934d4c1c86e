"""The table mirrors the graph state: a message the agent removes from its state is
deleted before the turn's request (so it is never summarized, archived or sent to an
LLM), an edit in place updates its row, and a new message that reuses the id of one a
compaction archived is stored, not silently dropped."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver

from agents import FILLER, ScriptedModel, is_tagged_summary, question
from conftest import rows, session_id
from summarizer_client import SummarizerClient, summarizer_node
from test_graph import agent_graph
from test_store import conversation

SECRET = "the prod db password is hunter2-Zq9x"


def everything(database_url: str, session: str) -> list[dict[str, Any]]:
    return rows(database_url, "messages", session) + rows(database_url, "archived_messages", session)


async def agent_that_was_told_a_secret(client: SummarizerClient) -> tuple[str, Any, Any]:
    """A graph with `summarizer_node` whose first turn holds `SECRET` (id `pasted`)."""
    session = session_id()
    graph = agent_graph(ScriptedModel(), summarizer_node(client)).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": session}}
    await graph.ainvoke({"messages": [HumanMessage(content=SECRET, id="pasted")]}, config)
    return session, graph, config


async def test_a_message_removed_from_the_state_is_deleted_and_never_summarized(
    client: SummarizerClient, database_url: str
) -> None:
    session, graph, config = await agent_that_was_told_a_secret(client)
    assert any(SECRET in (r["content"] or "") for r in rows(database_url, "messages", session))

    # The agent takes the message out of its state.
    await graph.aupdate_state(config, {"messages": [RemoveMessage(id="pasted")]})
    compacted = False
    for n in range(1, 12):
        await graph.ainvoke({"messages": [question(n)]}, config)
        state = (await graph.aget_state(config)).values["messages"]
        compacted = compacted or is_tagged_summary(state[0])
    assert compacted, "the session was compacted meanwhile"

    stored = everything(database_url, session)
    assert stored and not [r for r in stored if "hunter2" in (r["content"] or "")]
    assert "pasted" not in {r["external_id"] for r in stored}


async def test_an_edit_in_place_is_mirrored_and_an_unchanged_state_writes_nothing(
    client: SummarizerClient, database_url: str
) -> None:
    session, graph, config = await agent_that_was_told_a_secret(client)
    before = {r["external_id"]: r["seq"] for r in rows(database_url, "messages", session)}

    # The same id with new text replaces the message in the state (add_messages).
    await graph.aupdate_state(config, {"messages": [HumanMessage(content="[redacted]", id="pasted")]})
    await graph.ainvoke({"messages": [question(1)]}, config)

    after = rows(database_url, "messages", session)
    edited = [r for r in after if r["external_id"] == "pasted"]
    assert [r["content"] for r in edited] == ["[redacted]"]
    assert edited[0]["seq"] == before["pasted"], "updated where it was, not appended"
    # A state the table already mirrors writes nothing, in this process or a new one
    # (the node runs before the model: the run's last answer is stored by the first).
    state = (await graph.aget_state(config)).values["messages"]
    assert await client.append(session, state) == 1
    assert await client.append(session, state) == 0
    async with SummarizerClient(
        nats_url=client.nats_url, database_url=database_url, subject=client.subject, timeout=10.0
    ) as fresh:
        assert await fresh.append(session, state) == 0


async def test_a_new_message_reusing_an_archived_id_is_stored_and_summarized_later(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    history = conversation(session, 6)
    await client.append(session, history)
    assert (await client.turn_starting(session)).compacted
    archived = rows(database_url, "archived_messages", session)
    reused = archived[0]["external_id"]
    assert reused == f"{session}-q1"

    # Sent again unchanged (a state that has not seen the compaction): not stored again.
    assert await client.append(session, history) == 0
    # A new message with the id: stored, in the live history.
    turn = HumanMessage(content="Turn 7: and what about orders-db? " + FILLER * 8, id=reused)
    state: list[BaseMessage] = [*await client.load(session), turn]
    assert await client.append(session, state) == 1
    live = rows(database_url, "messages", session)
    assert [r["content"] for r in live if r["external_id"] == reused] == [turn.content]

    # More turns, and the next compaction archives it with its own text.
    more = [
        m
        for n in range(8, 13)
        for m in (
            HumanMessage(content=f"Turn {n}: " + FILLER * 6, id=f"{session}-late-q{n}"),
            AIMessage(content=f"Answer {n}: " + FILLER * 6, id=f"{session}-late-a{n}"),
        )
    ]
    await client.append(session, more)
    assert (await client.turn_starting(session)).compacted
    texts = [r["content"] for r in rows(database_url, "archived_messages", session) if r["external_id"] == reused]
    assert texts == [history[0].content, turn.content], "both kept, nothing vanished"


async def test_a_removed_message_that_was_archived_is_looked_for_once(
    client: SummarizerClient, database_url: str
) -> None:
    """Removing from the state a message the table no longer holds (archived by a
    compaction the state has not loaded) deletes nothing, and later turns do not ask the
    table again."""
    from summarizer_client._turn import store_new

    session = session_id()
    history = conversation(session, 6)
    assert await client.run(store_new(client, session, history))
    assert (await client.turn_starting(session)).compacted
    archived = rows(database_url, "archived_messages", session)[0]["external_id"]
    state = [m for m in history if m.id != archived]
    calls: list[list[str]] = []
    remove = client._remove_missing

    async def counted(session_id: str, keep: list[str]) -> list[str]:
        removed = await remove(session_id, keep)
        calls.append(removed)
        return removed

    client._remove_missing = counted  # type: ignore[method-assign]
    for _ in range(3):
        assert await client.run(store_new(client, session, state))
    assert calls == [[]], "one look, nothing deleted"
    assert archived in {r["external_id"] for r in rows(database_url, "archived_messages", session)}
