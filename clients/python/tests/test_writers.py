"""Two writers on one thread: agents in two processes, each with its own client and its own
checkpoint, take turns on one session while the worker compacts it. The table follows
what each state removed, never a row that state has not seen: no message is lost, not
even when a process restarts from a checkpoint older than the table."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver

from agents import TOOLS, ScriptedModel, assert_every_message_kept_once, is_tagged_summary, question
from conftest import NATS_URL, Worker, rows, session_id, usage_events
from summarizer_client import SummarizerClient, SummarizerMiddleware

TESTS = Path(__file__).resolve().parent
#: A turn takes well under a second; a writer silent this long is stuck, not slow.
TURN_TIMEOUT = 120


class Writer:
    """A `writer.py` process: an agent with `SummarizerMiddleware` on `thread`."""

    def __init__(
        self, name: str, mode: str, worker: Worker, database_url: str, thread: str, checkpoint: Path
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(TESTS / "writer.py"), database_url, worker.subject, thread,
             str(checkpoint), name, mode],
            cwd=TESTS,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def turn(self, n: int) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        stdin.write(f"turn {n}\n")
        stdin.flush()
        # One line a turn, so nothing waits in stdout's buffer when select is asked.
        if not select.select([stdout], [], [], TURN_TIMEOUT)[0]:
            self.process.kill()
            raise AssertionError(f"the writer did not finish turn {n} within {TURN_TIMEOUT} s")
        line = stdout.readline()
        assert line, f"the writer exited with {self.process.wait(timeout=10)}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            stdin, _ = self._pipes()
            stdin.write("quit\n")
            stdin.flush()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def test_two_agent_processes_on_one_thread_lose_no_message(
    worker: Worker, database_url: str, tmp_path: Path
) -> None:
    thread = session_id()

    def start(name: str, mode: str) -> Writer:
        return Writer(name, mode, worker, database_url, thread, tmp_path / f"{name}.db")

    writers = {"a": start("a", "sync"), "b": start("b", "async")}
    produced: set[str] = set()
    from_summary = False
    try:
        for n in range(1, 17):
            for writer in writers.values():
                answer = writer.turn(n)
                produced.update(answer["ids"])
                from_summary = from_summary or answer["from_summary"]
            if n == 8:
                # A new process for `a`, from its checkpoint: its state is older than the
                # table (b wrote since), and this process has seen none of the rows yet.
                writers["a"].stop()
                writers["a"] = start("a", "sync")
    finally:
        for writer in writers.values():
            writer.stop()

    assert usage_events(database_url, thread) >= 2 and from_summary, "compacted in between"
    assert len(produced) == 2 * 16 * 5
    live, archived = rows(database_url, "messages", thread), rows(database_url, "archived_messages", thread)
    lost = produced - {r["external_id"] for r in live + archived}
    assert not lost, f"{len(lost)} of {len(produced)} messages lost"
    assert_every_message_kept_once(produced, live, archived)


SECRET = "the prod db password is hunter2-Zq9x"


async def test_a_message_one_writer_removes_is_deleted_and_the_other_writers_are_kept(
    worker: Worker, database_url: str
) -> None:
    """Two agents in one process, each with a client and a checkpoint of its own: the
    one told a secret removes it from its state, and its next turn deletes the row
    before the worker could summarize it; the other's messages are all kept."""
    thread = session_id()
    config: Any = {"configurable": {"thread_id": thread}}

    def connect() -> SummarizerClient:
        return SummarizerClient(NATS_URL, database_url, worker.subject, timeout=10.0)

    produced: set[str] = set()
    async with connect() as mine, connect() as theirs:
        told, other = (
            create_agent(
                ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(c)], checkpointer=InMemorySaver()
            )
            for c in (mine, theirs)
        )
        await told.ainvoke({"messages": [HumanMessage(content=SECRET, id="pasted")]}, config)
        await other.ainvoke({"messages": [question(1)]}, config)
        await told.aupdate_state(config, {"messages": [RemoveMessage(id="pasted")]})
        for n in range(2, 10):
            for agent in (told, other):
                await agent.ainvoke({"messages": [question(n)]}, config)
                state = (await agent.aget_state(config)).values["messages"]
                produced.update(m.id for m in state if not is_tagged_summary(m))

    live, archived = rows(database_url, "messages", thread), rows(database_url, "archived_messages", thread)
    assert usage_events(database_url, thread) >= 2
    assert not [r for r in live + archived if "hunter2" in (r["content"] or "")]
    assert "pasted" not in {r["external_id"] for r in live + archived}
    lost = produced - {r["external_id"] for r in live + archived}
    assert not lost, f"{len(lost)} of {len(produced)} messages lost"
