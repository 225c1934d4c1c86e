"""The table mirrors the graph state: a message the agent removes from its state is
deleted before the turn's request (so it is never summarized, archived or sent to an
LLM), but never a row the process has not seen its state hold (another writer's); an
edit in place updates its row, and a new message that reuses the id of one a compaction
archived is stored, not silently dropped."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages

from agents import FILLER, ScriptedModel, is_tagged_summary, question
from conftest import Worker, rows, session_id, sql
from summarizer_client import SummarizerClient, summarizer_node
from test_graph import agent_graph
from summarizer_client._mirror import loaded, plan
from summarizer_client._turn import store_new
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
    session = session_id()
    history = conversation(session, 6)
    assert await client.run(store_new(client, session, history))
    assert (await client.turn_starting(session)).compacted
    archived = rows(database_url, "archived_messages", session)[0]["external_id"]
    state = [m for m in history if m.id != archived]
    calls: list[list[str]] = []
    remove = client._remove

    async def counted(session_id: str, ids: list[str]) -> list[str]:
        removed = await remove(session_id, ids)
        calls.append(removed)
        return removed

    client._remove = counted  # type: ignore[method-assign]
    try:
        for _ in range(3):
            assert await client.run(store_new(client, session, state))
    finally:
        del client._remove
    assert calls == [[]], "one look, nothing deleted"
    assert archived in {r["external_id"] for r in rows(database_url, "archived_messages", session)}


def live_ids(database_url: str, session: str) -> set[str]:
    return {r["external_id"] for r in rows(database_url, "messages", session)}


async def test_a_sync_deletes_only_what_its_own_state_held(
    client: SummarizerClient, worker: Worker, database_url: str
) -> None:
    session = session_id()
    state: list[BaseMessage] = conversation(session, 2)
    theirs = [HumanMessage(content="From the other writer: " + FILLER, id=f"{session}-b1")]
    async with SummarizerClient(database_url=database_url, subject=worker.subject) as other:
        assert await other.run(store_new(other, session, theirs))

    # A first sync in this process: its state holds none of the other's rows, and has
    # removed none of them.
    assert await client.run(store_new(client, session, state))
    assert live_ids(database_url, session) == {m.id for m in state} | {f"{session}-b1"}

    # A RemoveMessage: that row only.
    state = add_messages(state, [RemoveMessage(id=f"{session}-q1")])
    assert await client.run(store_new(client, session, state))
    assert live_ids(database_url, session) == {f"{session}-a1", f"{session}-q2", f"{session}-a2", f"{session}-b1"}

    # Everything the state held, and a fresh start: the other's row stays.
    fresh = HumanMessage(content="Start over: " + FILLER, id=f"{session}-q9")
    state = add_messages(state, [RemoveMessage(id=REMOVE_ALL_MESSAGES), fresh])
    assert await client.run(store_new(client, session, state))
    assert live_ids(database_url, session) == {f"{session}-b1", f"{session}-q9"}


def test_a_loaded_history_that_never_reached_the_state_makes_no_sync_delete() -> None:
    """After a compaction the state is replaced by the stored history, the other writer's
    kept messages with it; should the update fail (a checkpoint that could not be saved),
    the next sync still holds the old state, which never held them."""
    mine = conversation("s", 3)
    theirs = HumanMessage(content="From the other writer", id="s-b1")
    summary = HumanMessage(content="summary", id="summarizer-summary-1-9", additional_kwargs={"lc_source": "summarization"})
    history: list[BaseMessage] = [summary, *mine[4:], theirs]
    held = loaded(plan(None, mine).held, history)
    assert set(held) == {"summarizer-summary-1-9", "s-q3", "s-a3"}

    failed = plan(held, [*mine, HumanMessage(content="next", id="s-q4")])
    assert failed.remove == [] and [m.id for m in failed.store] == ["s-q1", "s-a1", "s-q2", "s-a2", "s-q4"]

    # It reached the state: the other's message is learned there, and its removal mirrored.
    reached = plan(held, history)
    assert reached.remove == [] and [m.id for m in reached.store] == ["s-b1"]
    assert plan(reached.held, history[:-1]).remove == ["s-b1"]
    # A summary's row is never deleted by a sync.
    assert plan(reached.held, []).remove == ["s-q3", "s-a3", "s-b1"]


async def test_a_client_remembers_the_sessions_synced_last_and_remove_deletes_any_row(
    worker: Worker, database_url: str
) -> None:
    with pytest.raises(ValueError, match="mirrored_sessions must be a positive integer"):
        SummarizerClient(database_url=database_url, mirrored_sessions=0)
    sessions = [session_id() for _ in range(3)]
    states = {s: conversation(s, 1) for s in sessions}
    async with SummarizerClient(
        database_url=database_url, subject=worker.subject, mirrored_sessions=2
    ) as client:
        for s in sessions:
            assert await client.run(store_new(client, s, states[s]))
        assert len(client._mirrors) == 2
        first, _, last = sessions

        # Remembered: the removal is mirrored.
        assert await client.run(store_new(client, last, states[last][1:]))
        assert live_ids(database_url, last) == {f"{last}-a1"}
        # Forgotten: synced as a first sync, which deletes nothing.
        assert await client.run(store_new(client, first, states[first][1:]))
        assert live_ids(database_url, first) == {f"{first}-q1", f"{first}-a1"}

        # What `remove` is for; never a row the worker or plain SQL wrote.
        sql(database_url, "INSERT INTO messages (session_id, role, content) VALUES (%s, 'user', 'plain')", (first,))
        tagged = [m.id for m in await client.load(first) if m.id and m.id.startswith("summarizer-")]
        assert len(tagged) == 1
        assert await client.remove(first, [f"{first}-q1", *tagged, "never-stored"]) == [f"{first}-q1"]
        assert live_ids(database_url, first) == {f"{first}-a1", *tagged}
