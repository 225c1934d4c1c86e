"""Fixtures against the real NATS and the store `SUMMARIZER_TEST_STORE` selects, with a
worker built from this checkout.

`SUMMARIZER_TEST_STORE=postgres` (the default) or `sqlite`, the same switch as the Rust
suite's. A session gets a fresh database -- a Postgres database `summarizer_pytest_<random>`
(dropped at the end), or a SQLite file in a temporary directory, which the worker creates
-- and a worker process (`target/debug/summarizer worker`, built if missing) on a subject
of its own, with a low threshold and the offline extractive summarizer. The helpers that
read or write the database directly (`sql`, `rows`, `usage_events`, `checkpointer`) do it
as an agent on that store would: psycopg, or sqlite3.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import nats
import nats.errors
import psycopg
import pytest
import pytest_asyncio

from summarizer_client import SummarizerClient

REPO = Path(__file__).resolve().parents[3]
STORE = os.environ.get("SUMMARIZER_TEST_STORE", "postgres")
if STORE not in ("postgres", "sqlite"):
    raise pytest.UsageError(f"SUMMARIZER_TEST_STORE must be postgres or sqlite, not {STORE!r}")
ADMIN_URL = os.environ.get("SUMMARIZER_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
NATS_URL = "nats://127.0.0.1:4222"
THRESHOLD = 3000
KEEP = 1000
SUMMARY = (
    "**Investigating:** checkout-api slow\n**Key findings:**\n- pool exhausted at 14:01\n"
    "**Ruled out:** DNS\n**Current state:** checking the database"
)


def worker_binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target.is_absolute():
        target = REPO / target
    binary = target / "debug" / "summarizer"
    if not binary.exists():
        subprocess.run(["cargo", "build", "--bin", "summarizer"], cwd=REPO, check=True)
    return binary


def unique_subject() -> str:
    return f"pytest.{secrets.token_hex(6)}.turn.starting"


class Worker:
    """A `summarizer worker` process; stopped with SIGTERM."""

    def __init__(self, database_url: str, **overrides: str) -> None:
        self.subject = unique_subject()
        # Every worker serves recall on one queue group: a subject of its own, so that no
        # other test's worker (on another database) answers this one's recalls.
        self.recall_subject = self.subject.replace(".turn.starting", ".recall")
        env = {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "RUST_BACKTRACE")},
            "DATABASE_URL": database_url,
            "NATS_URL": NATS_URL,
            "NATS_SUBJECT": self.subject,
            "NATS_RECALL_SUBJECT": self.recall_subject,
            "SUMMARIZATION_THRESHOLD_CHARS": str(THRESHOLD),
            "SUMMARIZATION_KEEP_CHARS": str(KEEP),
            "LLM_PROVIDER": "extractive",
            "HTTP_ADDR": "",
            "RUST_LOG": "warn",
            **overrides,
        }
        # Its own directory, so that no .env of the checkout is read.
        self._cwd = tempfile.TemporaryDirectory()
        self.process = subprocess.Popen(
            [str(worker_binary()), "worker"], env=env, cwd=self._cwd.name
        )
        self._wait_until_answering()

    def _wait_until_answering(self) -> None:
        import asyncio

        async def answered() -> bool:
            nc = await nats.connect(NATS_URL)
            try:
                payload = json.dumps({"session_id": "pytest-ping"}).encode()
                await nc.request(self.subject, payload, timeout=1)
                return True
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                return False
            finally:
                await nc.close()

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.process.returncode}")
            if asyncio.run(answered()):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the worker did not answer within 60 s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._cwd.cleanup()


def sqlite_only(reason: str) -> pytest.MarkDecorator:
    """Marks a test that is about the SQLite file the worker shares: skipped under Postgres."""
    return pytest.mark.skipif(STORE != "sqlite", reason=f"SQLite only: {reason}")


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if STORE == "sqlite":
        # Absolute (sqlite:///tmp/...): the workers run in directories of their own. The
        # first worker creates and migrates the file.
        yield f"sqlite://{tmp_path_factory.mktemp('sqlite') / 'summarizer.db'}"
        return
    name = f"summarizer_pytest_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def worker(database_url: str) -> Iterator[Worker]:
    running = Worker(database_url)
    try:
        yield running
    finally:
        running.stop()


@pytest_asyncio.fixture
async def client(worker: Worker, database_url: str) -> AsyncIterator[SummarizerClient]:
    async with SummarizerClient(
        nats_url=NATS_URL,
        database_url=database_url,
        subject=worker.subject,
        recall_subject=worker.recall_subject,
        timeout=10.0,
    ) as connected:
        yield connected


def session_id() -> str:
    return f"s-{secrets.token_hex(6)}"


def sqlite_path(database_url: str) -> str:
    """The file of the fixture's SQLite URL (always `sqlite:///<absolute path>`)."""
    assert database_url.startswith("sqlite:///"), database_url
    return database_url.removeprefix("sqlite://")


def sql(database_url: str, statement: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Runs one statement in a transaction of its own, as an agent or an operator would
    with plain SQL, and returns its rows. Written with psycopg's placeholders (`%s`,
    `%(name)s`), which become sqlite3's (`?`, `:name`) under SQLite."""
    if STORE == "sqlite":
        statement = re.sub(r"%\((\w+)\)s", r":\1", statement).replace("%s", "?")
        conn = sqlite3.connect(sqlite_path(database_url), timeout=10)
        try:
            with conn:
                return conn.execute(statement, params).fetchall()
        finally:
            conn.close()
    with psycopg.connect(database_url) as pg:
        cur = pg.execute(statement, params)
        return cur.fetchall() if cur.description else []


def rows(database_url: str, table: str, session: str) -> list[dict[str, Any]]:
    """The session's rows of `messages` or `archived_messages`, in seq order, as psycopg
    reads them (SQLite's 0/1 and JSON text read as bool and parsed JSON)."""
    found = sql(
        database_url,
        f"SELECT seq, role, content, is_summary, external_id, extra FROM {table} "
        "WHERE session_id = %s ORDER BY seq",
        (session,),
    )
    return [
        {
            "seq": seq,
            "role": role,
            "content": content,
            "is_summary": bool(is_summary),
            "external_id": external_id,
            "extra": json.loads(extra) if isinstance(extra, str) else extra,
        }
        for seq, role, content, is_summary, external_id, extra in found
    ]


def usage_events(database_url: str, session: str) -> int:
    found = sql(database_url, "SELECT count(*) FROM usage_events WHERE session_id = %s", (session,))
    return int(found[0][0])


def usage_metadata(database_url: str, session: str) -> list[dict[str, Any]]:
    """The `metadata` of the session's usage events, oldest first, parsed."""
    found = sql(
        database_url,
        "SELECT metadata FROM usage_events WHERE session_id = %s ORDER BY id",
        (session,),
    )
    return [json.loads(m) if isinstance(m, str) else m for (m,) in found]


def pins(database_url: str, session: str) -> dict[str, bool]:
    """The `pinned` column of the session's rows in `messages`, by external id."""
    found = sql(
        database_url,
        "SELECT external_id, pinned FROM messages WHERE session_id = %s AND external_id IS NOT NULL",
        (session,),
    )
    return {str(external_id): bool(pinned) for external_id, pinned in found}


@contextmanager
def checkpointer(database_url: str) -> Iterator[Any]:
    """A durable LangGraph checkpointer in the store's own database (for SQLite, the file
    the worker and the client share): PostgresSaver or SqliteSaver."""
    if STORE == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(sqlite_path(database_url)) as lite:
            yield lite
        return
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(database_url) as saver:
        saver.setup()
        yield saver


@asynccontextmanager
async def async_checkpointer(database_url: str) -> AsyncIterator[Any]:
    """`checkpointer` for async graphs: AsyncPostgresSaver or AsyncSqliteSaver."""
    if STORE == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(sqlite_path(database_url)) as lite:
            yield lite
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(database_url) as saver:
        await saver.setup()
        yield saver
