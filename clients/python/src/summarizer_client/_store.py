"""Where `append` and `load` keep messages: the worker fleet's Postgres, or the SQLite file
a worker on the same host keeps its sessions in (`sqlite:///path/to/file.db`).

One small interface, `Store`, with one implementation per backend, chosen by the URL's
scheme. Each backend has its own SQL; the semantics are the same:

- `append_rows` inserts rows (`_codec.Row.as_json()`) in order, each with its
  `block_chars` (the weight of its blocks that are not text, which `chars` counts), and
  returns how many it wrote. A row whose external id the session stores already updates
  that row when its role, text, tool calls, call id, pin or weight differ (an edit in
  place mirrored: a screenshot replaced by another, say), except on the
  worker's summaries and rows it named (`summarizer-...`), which are never rewritten. A
  row that matches a message a compaction archived (same id, role, text, tool calls and
  call id) is that message, sent again by a state that has not seen the compaction: it is
  skipped: that is also how the original of a tool result the worker cleared (whose
  archived copy keeps its id and text) never overwrites the placeholder. An edit in place
  of a cleared row's text stores the new text and marks the row no longer cleared (a pin
  alone leaves it cleared). A row that
  only reuses an archived message's id is a new message: stored;
- `remove_rows` deletes the session's live rows with the external ids given (messages
  the agent removed from its state: see `_mirror` for which), sparing summaries and the
  rows the worker or plain SQL wrote (a `summarizer-` id), and returns the ids it
  deleted: a message the agent removed is no longer summarized, archived or sent to an
  LLM. It names the rows to delete, never the rows to keep: a row the caller has not
  heard of (another writer's) is never deleted;
- `load_rows` gives every row of the session without an external id (the worker's
  summaries, plain-SQL agents' rows) one, so that the next sync recognises it as stored
  (a summary's names the compaction in force, see `_codec.summary_compaction`), and
  returns the session's rows in `seq` order, in the same transaction, as the tuples
  `_codec.from_row` takes: (role, content, tool_calls, tool_call_id, is_summary,
  external_id, extra), JSON columns parsed, `is_summary` a bool;
- `seqs_of` gives the `seq` of the session's live rows with the external ids given: what a
  clipped tool output's note names, so that the model can recall the original by it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

T = TypeVar("T")

#: How long a SQLite statement waits for the file's write lock, which the worker holds
#: while it commits a compaction, before failing: the worker's own busy timeout.
SQLITE_BUSY_TIMEOUT_MS = 10_000


class Store(Protocol):
    async def append_rows(self, session: str, rows: list[dict[str, Any]]) -> int: ...

    async def remove_rows(self, session: str, ids: list[str]) -> list[str]: ...

    async def load_rows(self, session: str) -> list[tuple[Any, ...]]: ...

    async def seqs_of(self, session: str, ids: list[str]) -> dict[str, int]: ...

    async def close(self) -> None: ...


def backend(url: str) -> str:
    """`sqlite` for `sqlite:` URLs, `postgres` for anything else (as the worker decides)."""
    return "sqlite" if url.startswith("sqlite:") else "postgres"


def backend_name(url: str) -> str:
    return "SQLite" if backend(url) == "sqlite" else "Postgres"


async def open_store(url: str, timeout: float) -> Store:
    """The store `url` names, connected. Raises when it cannot be reached now."""
    if backend(url) == "sqlite":
        return await SqliteStore.open(url, timeout)
    return await PostgresStore.open(url, timeout)


# -- Postgres ------------------------------------------------------------------------

_PG_INSERT = """
INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id, external_id, extra,
                      pinned, block_chars)
SELECT %(session)s, m ->> 'role', m ->> 'content', nullif(m -> 'tool_calls', 'null'),
       m ->> 'tool_call_id', m ->> 'external_id', m -> 'extra',
       coalesce((m ->> 'pinned')::boolean, false), (m ->> 'block_chars')::integer
FROM jsonb_array_elements(%(rows)s) WITH ORDINALITY AS r (m, n)
WHERE m ->> 'external_id' IS NULL OR NOT EXISTS (
    SELECT 1 FROM archived_messages a
    WHERE a.session_id = %(session)s AND a.external_id = m ->> 'external_id'
      AND a.role = m ->> 'role' AND a.content IS NOT DISTINCT FROM m ->> 'content'
      AND a.tool_calls IS NOT DISTINCT FROM nullif(m -> 'tool_calls', 'null')
      AND a.tool_call_id IS NOT DISTINCT FROM m ->> 'tool_call_id'
)
ORDER BY n
ON CONFLICT (session_id, external_id) WHERE external_id IS NOT NULL DO UPDATE
SET role = excluded.role, content = excluded.content, tool_calls = excluded.tool_calls,
    tool_call_id = excluded.tool_call_id, extra = excluded.extra, pinned = excluded.pinned,
    block_chars = excluded.block_chars,
    cleared_by = CASE
        WHEN (messages.role, messages.content, messages.tool_calls, messages.tool_call_id)
             IS DISTINCT FROM (excluded.role, excluded.content, excluded.tool_calls,
                               excluded.tool_call_id)
        THEN NULL ELSE messages.cleared_by END
WHERE NOT messages.is_summary AND substr(messages.external_id, 1, 11) <> 'summarizer-'
  AND (messages.role, messages.content, messages.tool_calls, messages.tool_call_id,
       messages.pinned, messages.block_chars)
      IS DISTINCT FROM (excluded.role, excluded.content, excluded.tool_calls,
                        excluded.tool_call_id, excluded.pinned, excluded.block_chars)
"""

_PG_REMOVE = """
DELETE FROM messages
WHERE session_id = %(session)s AND external_id = ANY (%(ids)s) AND NOT is_summary
  AND substr(external_id, 1, 11) <> 'summarizer-'
RETURNING external_id
"""

# Tags and reads in one statement (a data-modifying CTE).
_PG_LOAD = """
WITH s AS (
    SELECT last_compaction_id FROM sessions WHERE session_id = %(session)s
), tagged AS (
    UPDATE messages SET external_id = CASE
        WHEN is_summary THEN 'summarizer-summary-'
            || coalesce((SELECT last_compaction_id FROM s)::text, 'none') || '-' || seq
        ELSE 'summarizer-row-' || seq END
    WHERE session_id = %(session)s AND external_id IS NULL
    RETURNING seq, external_id
)
SELECT m.role, m.content, m.tool_calls, m.tool_call_id, m.is_summary,
       coalesce(t.external_id, m.external_id), m.extra
FROM messages m LEFT JOIN tagged t ON t.seq = m.seq
WHERE m.session_id = %(session)s
ORDER BY m.seq
"""


_PG_SEQS = """
SELECT external_id, seq FROM messages
WHERE session_id = %(session)s AND external_id = ANY (%(ids)s)
"""


class PostgresStore:
    """A small pool of autocommit connections."""

    def __init__(self, pool: AsyncConnectionPool, timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout

    @classmethod
    async def open(cls, url: str, timeout: float) -> PostgresStore:
        pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=4,
            open=False,
            kwargs={"autocommit": True, "application_name": "summarizer-client"},
        )
        try:
            await pool.open(wait=True, timeout=timeout)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, timeout)

    async def append_rows(self, session: str, rows: list[dict[str, Any]]) -> int:
        async with self._pool.connection(timeout=self._timeout) as conn:
            cursor = await conn.execute(_PG_INSERT, {"session": session, "rows": Jsonb(rows)})
            return max(cursor.rowcount, 0)

    async def remove_rows(self, session: str, ids: list[str]) -> list[str]:
        async with self._pool.connection(timeout=self._timeout) as conn:
            cursor = await conn.execute(_PG_REMOVE, {"session": session, "ids": ids})
            return [str(row[0]) for row in await cursor.fetchall()]

    async def load_rows(self, session: str) -> list[tuple[Any, ...]]:
        async with self._pool.connection(timeout=self._timeout) as conn:
            cursor = await conn.execute(_PG_LOAD, {"session": session})
            return await cursor.fetchall()

    async def seqs_of(self, session: str, ids: list[str]) -> dict[str, int]:
        async with self._pool.connection(timeout=self._timeout) as conn:
            cursor = await conn.execute(_PG_SEQS, {"session": session, "ids": ids})
            return {str(external_id): int(seq) for external_id, seq in await cursor.fetchall()}

    async def close(self) -> None:
        await self._pool.close()


# -- SQLite --------------------------------------------------------------------------

# As _PG_INSERT. json_extract gives a JSON null as SQL NULL (so no nullif), a string as
# its text, a boolean as 1 or 0 (`pinned` is an INTEGER 0/1 column), and an array or
# object as its JSON text, verbatim. tool_calls comes as a
# string holding its JSON text (see SqliteStore.append_rows).
_SQLITE_INSERT = """
INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id, external_id, extra,
                      pinned, block_chars)
SELECT :session, json_extract(r.value, '$.role'), json_extract(r.value, '$.content'),
       json_extract(r.value, '$.tool_calls'), json_extract(r.value, '$.tool_call_id'),
       json_extract(r.value, '$.external_id'), json_extract(r.value, '$.extra'),
       coalesce(json_extract(r.value, '$.pinned'), 0), json_extract(r.value, '$.block_chars')
FROM json_each(:rows) AS r
WHERE json_extract(r.value, '$.external_id') IS NULL OR NOT EXISTS (
    SELECT 1 FROM archived_messages a
    WHERE a.session_id = :session AND a.external_id = json_extract(r.value, '$.external_id')
      AND a.role = json_extract(r.value, '$.role')
      AND a.content IS json_extract(r.value, '$.content')
      AND a.tool_calls IS json_extract(r.value, '$.tool_calls')
      AND a.tool_call_id IS json_extract(r.value, '$.tool_call_id')
)
ORDER BY r.key
ON CONFLICT (session_id, external_id) WHERE external_id IS NOT NULL DO UPDATE
SET role = excluded.role, content = excluded.content, tool_calls = excluded.tool_calls,
    tool_call_id = excluded.tool_call_id, extra = excluded.extra, pinned = excluded.pinned,
    block_chars = excluded.block_chars,
    cleared_by = CASE
        WHEN messages.role IS NOT excluded.role OR messages.content IS NOT excluded.content
             OR messages.tool_calls IS NOT excluded.tool_calls
             OR messages.tool_call_id IS NOT excluded.tool_call_id
        THEN NULL ELSE messages.cleared_by END
WHERE NOT messages.is_summary AND substr(messages.external_id, 1, 11) <> 'summarizer-'
  AND (messages.role IS NOT excluded.role OR messages.content IS NOT excluded.content
       OR messages.tool_calls IS NOT excluded.tool_calls
       OR messages.tool_call_id IS NOT excluded.tool_call_id
       OR messages.pinned IS NOT excluded.pinned
       OR messages.block_chars IS NOT excluded.block_chars)
"""

_SQLITE_REMOVE = """
DELETE FROM messages
WHERE session_id = :session AND external_id IN (SELECT value FROM json_each(:ids))
  AND NOT is_summary AND substr(external_id, 1, 11) <> 'summarizer-'
RETURNING external_id
"""

# As _PG_LOAD, in two statements of one write transaction: SQLite has no data-modifying
# CTEs.
_SQLITE_TAG = """
UPDATE messages SET external_id = CASE
    WHEN is_summary THEN 'summarizer-summary-'
        || coalesce((SELECT last_compaction_id FROM sessions WHERE session_id = :session),
                    'none')
        || '-' || seq
    ELSE 'summarizer-row-' || seq END
WHERE session_id = :session AND external_id IS NULL
"""
_SQLITE_SELECT = """
SELECT role, content, tool_calls, tool_call_id, is_summary, external_id, extra
FROM messages WHERE session_id = :session ORDER BY seq
"""

_SQLITE_SEQS = """
SELECT external_id, seq FROM messages
WHERE session_id = :session AND external_id IN (SELECT value FROM json_each(:ids))
"""

# Writes nothing; fails on a file this process cannot write, or has no schema yet (the
# worker migrates it at start), as a Postgres connection fails on a database it cannot
# reach. It waits for the write lock like any write.
_SQLITE_PROBE = "DELETE FROM messages WHERE 0"

# sqlx's query parameters for SQLite URLs, which sqlite3's own `file:` URIs share.
_SQLITE_PARAMS = {
    "mode": {"ro", "rw", "rwc", "memory"},
    "cache": {"private", "shared"},
    "immutable": {"true", "1", "false", "0"},
    "vfs": None,
}


def sqlite_uri(url: str) -> str:
    """The `file:` URI sqlite3 opens for a `sqlite:` URL, read as the worker (sqlx) reads
    it: `sqlite:///abs/path`, `sqlite://relative/path` or `sqlite:relative/path`
    (relative to the working directory), percent-decoded, with sqlx's parameters (`mode`,
    `cache`, `immutable`, `vfs`). Opens an existing file read-write unless `mode` says
    otherwise: the worker creates the file.

    Raises `ValueError` for an in-memory database (`sqlite::memory:`, `mode=memory`),
    which the worker's process cannot share, an empty path, or an unknown parameter."""
    rest = url.removeprefix("sqlite://") if url.startswith("sqlite://") else url[len("sqlite:") :]
    quoted_path, _, query = rest.partition("?")
    path = urllib.parse.unquote(quoted_path, errors="strict")
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    if path == ":memory:" or params.get("mode") == "memory":
        raise ValueError(
            f"{url!r} is an in-memory SQLite database, private to one process: the worker "
            "cannot share it. Use a file both can open: sqlite:///path/to/file.db"
        )
    if not path:
        raise ValueError(f"{url!r} names no SQLite file: use sqlite:///path/to/file.db")
    for key, value in params.items():
        if key not in _SQLITE_PARAMS:
            raise ValueError(f"unknown parameter {key!r} in the SQLite URL")
        allowed = _SQLITE_PARAMS[key]
        if allowed is not None and value not in allowed:
            raise ValueError(f"unknown value {value!r} for {key!r} in the SQLite URL")
    params.setdefault("mode", "rw")
    # `file:` + an absolute path takes an empty authority, so that `//x` stays a path.
    prefix = "file://" if path.startswith("/") else "file:"
    return prefix + urllib.parse.quote(path) + "?" + urllib.parse.urlencode(params)


def check_url(url: str) -> None:
    """Raises `ValueError` for a database URL no store can ever open."""
    if backend(url) == "sqlite":
        sqlite_uri(url)


class SqliteStore:
    """One connection, opened, used and closed on one dedicated thread (sqlite3
    connections are not thread-safe by default), off the event loop. Statements wait for
    the file's write lock (`SQLITE_BUSY_TIMEOUT_MS`) rather than fail."""

    def __init__(self, executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        self._executor = executor
        self._conn = conn

    @classmethod
    async def open(cls, url: str, timeout: float) -> SqliteStore:
        uri = sqlite_uri(url)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="summarizer-sqlite")
        try:
            conn = await _on(executor, _connect, uri, timeout)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(executor, conn)

    async def append_rows(self, session: str, rows: list[dict[str, Any]]) -> int:
        # tool_calls as Postgres renders jsonb (`[{"id": "c1", "name": ...}]`), not
        # minified: `chars` counts it as stored, so the thresholds, and so the worker's
        # decisions, come out the same on both stores.
        rows = [{**row, "tool_calls": _jsonb_text(row["tool_calls"])} for row in rows]
        return await _on(self._executor, self._append, session, json.dumps(rows))

    async def remove_rows(self, session: str, ids: list[str]) -> list[str]:
        return await _on(self._executor, self._remove, session, json.dumps(ids))

    async def load_rows(self, session: str) -> list[tuple[Any, ...]]:
        return await _on(self._executor, self._load, session)

    async def seqs_of(self, session: str, ids: list[str]) -> dict[str, int]:
        return await _on(self._executor, self._seqs, session, json.dumps(ids))

    async def close(self) -> None:
        try:
            await _on(self._executor, self._conn.close)
        finally:
            self._executor.shutdown(wait=False)

    # -- on the store's thread --

    def _append(self, session: str, rows: str) -> int:
        # One statement, so one implicit transaction, which takes the write lock first.
        cursor = self._conn.execute(_SQLITE_INSERT, {"session": session, "rows": rows})
        return max(cursor.rowcount, 0)

    def _remove(self, session: str, ids: str) -> list[str]:
        rows = self._conn.execute(_SQLITE_REMOVE, {"session": session, "ids": ids}).fetchall()
        return [str(row[0]) for row in rows]

    def _seqs(self, session: str, ids: str) -> dict[str, int]:
        rows = self._conn.execute(_SQLITE_SEQS, {"session": session, "ids": ids}).fetchall()
        return {str(external_id): int(seq) for external_id, seq in rows}

    def _load(self, session: str) -> list[tuple[Any, ...]]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_SQLITE_TAG, {"session": session})
            rows = conn.execute(_SQLITE_SELECT, {"session": session}).fetchall()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return [
            (role, content, _json(calls), call_id, bool(summary), external_id, _json(extra))
            for role, content, calls, call_id, summary, external_id, extra in rows
        ]


def _connect(uri: str, timeout: float) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; _load begins its own.
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        # The first statements wait no longer than the client's timeout, as a Postgres
        # connect does; later ones as long as the worker's commits may take.
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(timeout * 1000))}")
        # WAL is the file's mode, which the worker set already: asking again is harmless.
        conn.execute("PRAGMA journal_mode = WAL")
        # As the worker's connections: in WAL mode, durable across a crash of a process.
        conn.execute("PRAGMA synchronous = NORMAL")
        # As the worker's connections: SQLite fires the delete trigger that keeps the
        # session's counters for a row a REPLACE removes only with recursive triggers on.
        conn.execute("PRAGMA recursive_triggers = ON")
        conn.execute(_SQLITE_PROBE)
        conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    except BaseException:
        conn.close()
        raise
    return conn


async def _on(executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _jsonb_text(value: Any) -> str | None:
    """JSON text as long as Postgres's rendering of it as jsonb (which also reorders keys)."""
    return None if value is None else json.dumps(value, ensure_ascii=False)
