"""Fail open: with no worker, no NATS or no database (Postgres down, or no SQLite file),
every turn runs with its state unchanged, and each cause is logged once, not once per
turn."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

from agents import TOOLS, ScriptedModel, is_tagged_summary, question
from conftest import NATS_URL, STORE, Worker, session_id, unique_subject
from summarizer_client import SummarizerClient, SummarizerMiddleware


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_turns(client: SummarizerClient, turns: int) -> list[Any]:
    agent = create_agent(ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": session_id()}}
    for n in range(1, turns + 1):
        agent.invoke({"messages": [question(n)]}, config)
    return list(agent.get_state(config).values["messages"])


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "summarizer_client" and r.levelno == logging.WARNING]


def assert_unchanged(messages: list[Any], turns: int) -> None:
    # Five messages a turn, all there: nothing was replaced.
    assert len(messages) == 5 * turns
    assert not any(is_tagged_summary(m) for m in messages)


@pytest.mark.parametrize("case", ["no_worker", "no_nats", "no_database"])
def test_every_turn_runs_unchanged_and_each_cause_is_logged_once(
    case: str, worker: Worker, database_url: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="summarizer_client")
    nats_url, db_url, subject = NATS_URL, database_url, worker.subject
    if case == "no_worker":
        subject = unique_subject()
    elif case == "no_nats":
        nats_url = f"nats://127.0.0.1:{closed_port()}"
    elif STORE == "sqlite":
        db_url = f"sqlite://{tmp_path / 'nowhere' / 'summarizer.db'}"
    else:
        db_url = f"postgresql://postgres@127.0.0.1:{closed_port()}/nowhere?connect_timeout=1"
    client = SummarizerClient(nats_url, db_url, subject, timeout=1.0)
    client.connect_sync()
    try:
        messages = run_turns(client, 8)  # 16 model calls, over the threshold
    finally:
        client.close_sync()

    assert_unchanged(messages, 8)
    logged = warnings_logged(caplog)
    assert logged, "the outage was not reported"
    assert len(logged) == len(set(logged)) <= 2, logged


def test_the_benchmark_reports_what_the_middleware_adds(worker: Worker, database_url: str) -> None:
    bench = Path(__file__).resolve().parents[1] / "bench_noop.py"
    out = subprocess.run(
        [sys.executable, str(bench), "--turns", "20"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True, text=True, timeout=120, check=True,
    )
    # A figure, not a timed assertion.
    assert "middleware adds" in out.stdout, out.stderr
    print(out.stdout)
