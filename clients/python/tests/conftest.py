"""Fixtures against the real Postgres and NATS, with a worker built from this checkout.

A session gets a fresh database (`summarizer_pytest_<random>`, dropped at the end) and a
worker process (`target/debug/summarizer worker`, built if missing) on a subject of its
own, with a low threshold and the offline extractive summarizer.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import psycopg
import pytest
import pytest_asyncio

from summarizer_client import SummarizerClient

REPO = Path(__file__).resolve().parents[3]
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
        env = {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "RUST_BACKTRACE")},
            "DATABASE_URL": database_url,
            "NATS_URL": NATS_URL,
            "NATS_SUBJECT": self.subject,
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


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
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
        nats_url=NATS_URL, database_url=database_url, subject=worker.subject, timeout=10.0
    ) as connected:
        yield connected


def session_id() -> str:
    return f"s-{secrets.token_hex(6)}"


def rows(database_url: str, table: str, session: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute(
            f"SELECT seq, role, content, is_summary, external_id, extra FROM {table} "
            "WHERE session_id = %s ORDER BY seq",
            (session,),
        )
        names = [c.name for c in cur.description or []]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def usage_events(database_url: str, session: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM usage_events WHERE session_id = %s", (session,)
        ).fetchone()
        return int(row[0]) if row else 0
