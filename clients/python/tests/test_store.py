"""The store behind `append` and `load`: SQLite URLs read as the worker reads them; the
SQLite file shared with the worker (its one write lock, the file the worker creates); and,
on either store, what a load and an append must do around compactions."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from agents import FILLER, TOOLS, ScriptedModel, assert_every_message_kept_once, is_tagged_summary, question
from conftest import (
    NATS_URL,
    Worker,
    rows,
    session_id,
    sql,
    sqlite_only,
    sqlite_path,
    unique_subject,
    usage_events,
)
from summarizer_client import SummarizerClient, SummarizerMiddleware
from summarizer_client import _store
from summarizer_client._store import sqlite_uri


def exchange(session: str, n: int) -> list[BaseMessage]:
    """A question and its answer, about 650 chars, with ids of the session's own."""
    return [
        HumanMessage(content=question(n).content, id=f"{session}-q{n}"),
        AIMessage(content=f"Answer {n}: " + FILLER * 6, id=f"{session}-a{n}"),
    ]


def conversation(session: str, turns: int) -> list[BaseMessage]:
    return [m for n in range(1, turns + 1) for m in exchange(session, n)]


def ids(messages: list[BaseMessage]) -> list[str | None]:
    return [m.id for m in messages]


# -- URLs (no store needed) ----------------------------------------------------------


@pytest.mark.parametrize(
    "url, uri",
    [
        ("sqlite:///srv/summarizer/sessions.db", "file:///srv/summarizer/sessions.db?mode=rw"),
        ("sqlite://data/sessions.db", "file:data/sessions.db?mode=rw"),
        ("sqlite:sessions.db", "file:sessions.db?mode=rw"),
        ("sqlite:///srv/a%20b%3F.db", "file:///srv/a%20b%3F.db?mode=rw"),
        ("sqlite:///srv/s.db?mode=ro", "file:///srv/s.db?mode=ro"),
        ("sqlite:///srv/s.db?cache=shared&mode=rwc", "file:///srv/s.db?cache=shared&mode=rwc"),
    ],
)
def test_sqlite_urls_are_read_as_the_worker_reads_them(url: str, uri: str) -> None:
    assert sqlite_uri(url) == uri


@pytest.mark.parametrize(
    "url, error",
    [
        ("sqlite::memory:", "in-memory"),
        ("sqlite://:memory:", "in-memory"),
        ("sqlite://?mode=memory", "in-memory"),
        ("sqlite:///srv/s.db?mode=memory", "in-memory"),
        ("sqlite://", "names no SQLite file"),
        ("sqlite:///srv/s.db?journal=wal", "unknown parameter"),
        ("sqlite:///srv/s.db?mode=rwx", "unknown value"),
    ],
)
def test_a_sqlite_url_no_worker_could_share_is_refused_at_once(
    url: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=error):
        SummarizerClient(database_url=url)
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(ValueError, match=error):
        SummarizerClient()


# -- either store --------------------------------------------------------------------


async def test_a_load_right_after_a_compaction_returns_the_summary_first(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    history = conversation(session, 6)
    await client.append(session, history)

    decision = await client.turn_starting(session)
    loaded = await client.load(session)

    assert decision.compacted
    summary, *kept = loaded
    assert is_tagged_summary(summary)
    assert summary.id and summary.id.startswith(f"summarizer-summary-{decision.latest_compaction_id}-")
    assert kept and ids(kept) == ids(history[-len(kept) :])
    archived = [r["external_id"] for r in rows(database_url, "archived_messages", session)]
    assert archived == ids(history[: -len(kept)])
    # What the compaction archived is never stored again, and the summary is known.
    assert await client.append(session, [summary, *history]) == 0


async def test_tool_calls_count_as_many_chars_as_postgres_counts_them(
    client: SummarizerClient, database_url: str
) -> None:
    """`chars`, which the thresholds add up, counts tool_calls as stored: Postgres its
    jsonb rendering (`[{"id": "call-1", ...}]`, keys reordered), SQLite the text. The
    SQLite path stores text of that length, so the worker decides alike on both."""
    session = session_id()
    args = {"service": "checkout-api", "lines": 50, "note": "café → db-7\n", "ok": True, "ratio": 0.5}
    message = AIMessage(
        content="Checking.",
        id=f"{session}-ai",
        tool_calls=[{"name": "get_logs", "args": args, "id": "call-1", "type": "tool_call"}],
    )
    await client.append(session, [message])

    [(chars,)] = sql(database_url, "SELECT chars FROM messages WHERE session_id = %s", (session,))
    rendered = json.dumps([{"id": "call-1", "name": "get_logs", "arguments": args}], ensure_ascii=False)
    assert chars == len("Checking.") + len(rendered)
    assert (await client.load(session))[0] == message


async def test_appends_racing_compactions_keep_every_message_once_in_order(
    client: SummarizerClient, worker: Worker, database_url: str
) -> None:
    """One client appends exchange after exchange while another asks for compactions as
    fast as it can, until three were made: the appends land during the worker's
    summarizing and its commits (on SQLite, waiting at the file's write lock), and
    nothing is lost, doubled or reordered."""
    session = session_id()
    produced: list[BaseMessage] = []
    compactions: list[int] = []
    done = asyncio.Event()

    async def append_all() -> None:
        try:
            for n in range(1, 201):
                if len(compactions) >= 3:
                    break
                batch = exchange(session, n)
                produced.extend(batch)
                assert await client.append(session, batch) == 2
                await asyncio.sleep(0.01)
        finally:
            done.set()

    async def ask_all(asker: SummarizerClient) -> None:
        while not done.is_set():
            decision = await asker.turn_starting(session)
            if decision.compacted and decision.latest_compaction_id is not None:
                compactions.append(decision.latest_compaction_id)

    async with SummarizerClient(NATS_URL, database_url, worker.subject, timeout=10.0) as asker:
        await asyncio.gather(append_all(), ask_all(asker))

    current = rows(database_url, "messages", session)
    assert len(compactions) >= 3 and usage_events(database_url, session) == len(compactions)
    assert current[0]["is_summary"] and sum(r["is_summary"] for r in current) == 1
    assert_every_message_kept_once(
        set(ids(produced)), current, rows(database_url, "archived_messages", session)  # type: ignore[arg-type]
    )
    kept = [r["external_id"] for r in current[1:]]
    assert kept == ids(produced[-len(kept) :])
    loaded = await client.load(session)
    assert is_tagged_summary(loaded[0]) and loaded[0].id.startswith(f"summarizer-summary-{compactions[-1]}-")
    assert ids(loaded[1:]) == kept


# -- the SQLite file -----------------------------------------------------------------

SQLITE_FILE = "about the SQLite file the worker shares"


@sqlite_only(SQLITE_FILE)
async def test_append_and_load_wait_for_the_write_lock_another_process_holds(
    client: SummarizerClient, database_url: str
) -> None:
    """As the worker holds it while it commits a compaction: they wait (the busy
    timeout) and land, rather than fail."""
    session = session_id()
    history = conversation(session, 2)
    holder = sqlite3.connect(sqlite_path(database_url), isolation_level=None)
    loop = asyncio.get_running_loop()
    try:
        holder.execute("BEGIN IMMEDIATE")
        loop.call_later(1.0, holder.execute, "COMMIT")
        started = time.monotonic()
        written = await client.append(session, history)
        append_waited = time.monotonic() - started

        # A row without an id, which the load tags in its write transaction.
        sql(database_url, "INSERT INTO messages (session_id, role, content) VALUES (%s, 'user', 'plain')", (session,))
        holder.execute("BEGIN IMMEDIATE")
        loop.call_later(1.0, holder.execute, "COMMIT")
        started = time.monotonic()
        loaded = await client.load(session)
        load_waited = time.monotonic() - started
    finally:
        holder.close()

    assert written == 4 and append_waited >= 0.9
    assert load_waited >= 0.9
    plain = rows(database_url, "messages", session)[-1]
    assert ids(loaded) == [*ids(history), plain["external_id"]]
    assert plain["external_id"] == f"summarizer-row-{plain['seq']}"


@sqlite_only(SQLITE_FILE)
def test_a_write_lock_held_past_the_busy_timeout_fails_open_and_the_next_turn_catches_up(
    worker: Worker, database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="summarizer_client")
    monkeypatch.setattr(_store, "SQLITE_BUSY_TIMEOUT_MS", 200)
    session = session_id()
    client = SummarizerClient(NATS_URL, database_url, worker.subject, timeout=5.0)
    client.connect_sync()
    holder = sqlite3.connect(sqlite_path(database_url), isolation_level=None)
    try:
        agent = create_agent(
            ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=InMemorySaver()
        )
        config: Any = {"configurable": {"thread_id": session}}
        holder.execute("BEGIN IMMEDIATE")
        for n in (1, 2):
            agent.invoke({"messages": [question(n)]}, config)
        during = agent.get_state(config).values["messages"]
        stored_during = rows(database_url, "messages", session)
        holder.execute("COMMIT")
        agent.invoke({"messages": [question(3)]}, config)
        after = agent.get_state(config).values["messages"]
    finally:
        holder.close()
        client.close_sync()

    assert len(during) == 10 and stored_during == []
    logged = [r.getMessage() for r in caplog.records if r.name == "summarizer_client"]
    assert len(logged) == 1 and "database is locked" in logged[0], logged
    assert [r["external_id"] for r in rows(database_url, "messages", session)] == ids(after)


@sqlite_only(SQLITE_FILE)
def test_the_client_waits_for_the_worker_to_create_the_file(tmp_path: Path) -> None:
    """A missing file is an unreachable database: the client never creates it (the worker
    creates and migrates it), warns once, and connects once the worker has."""
    path = tmp_path / "later.db"
    url = f"sqlite://{path}"
    session = session_id()
    client = SummarizerClient(NATS_URL, url, unique_subject(), timeout=2.0)
    client.connect_sync()
    try:
        assert "sqlite" in client.warnings.reported()
        assert not path.exists()
        worker = Worker(url)
        try:
            deadline = time.monotonic() + 15
            while "sqlite" in client.warnings.reported():
                assert time.monotonic() < deadline, "the client did not reconnect"
                time.sleep(0.1)
            written = asyncio.run(client.append(session, conversation(session, 1)))
        finally:
            worker.stop()
    finally:
        client.close_sync()

    assert written == 2
    assert len(rows(url, "messages", session)) == 2


@sqlite_only(SQLITE_FILE)
async def test_relative_sqlite_urls_name_a_file_in_the_working_directory(
    client: SummarizerClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = session_id()
    history = conversation(session, 1)
    await client.append(session, history)
    path = Path(sqlite_path(database_url))
    monkeypatch.chdir(path.parent)

    for url in (f"sqlite:{path.name}", f"sqlite://{path.name}", f"sqlite:./{path.name}"):
        async with SummarizerClient(NATS_URL, url, timeout=5.0) as relative:
            assert ids(await relative.load(session)) == ids(history)


@sqlite_only(SQLITE_FILE)
@pytest.mark.parametrize("case", ["read_only", "directory", "not_a_database", "not_migrated"])
async def test_a_file_the_client_cannot_use_is_an_unreachable_database(
    case: str, worker: Worker, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(Tests run as root, whom file modes do not stop: `mode=ro` stands in for a file
    this process may not write.)"""
    caplog.set_level(logging.WARNING, logger="summarizer_client")
    if case == "read_only":
        url = database_url + "?mode=ro"
    elif case == "directory":
        url = f"sqlite://{tmp_path}"
    elif case == "not_a_database":
        (tmp_path / "notes.db").write_text("not a database\n" * 100)
        url = f"sqlite://{tmp_path / 'notes.db'}"
    else:
        sqlite3.connect(tmp_path / "empty.db").close()
        url = f"sqlite://{tmp_path / 'empty.db'}"
    session = session_id()

    async with SummarizerClient(NATS_URL, url, worker.subject, timeout=1.0) as client:
        decision = await client.turn_starting(session)
        with pytest.raises(ConnectionError, match="SQLite is not connected"):
            await client.append(session, conversation(session, 1))
        await client.turn_starting(session)

    assert decision.reason == "unknown_session"
    logged = [r.getMessage() for r in caplog.records if r.name == "summarizer_client"]
    assert len(logged) == 1 and "SQLite unreachable" in logged[0], logged
