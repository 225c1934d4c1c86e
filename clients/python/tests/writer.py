"""One agent process of `test_writers`: a `create_agent` agent with `SummarizerMiddleware`,
its own `SummarizerClient` and its own checkpoint (a SQLite file of its own, so that it
survives a restart of the process), on a thread another process writes to as well.

    python writer.py DATABASE_URL SUBJECT THREAD_ID CHECKPOINT_FILE NAME (sync|async)

Reads one command a line on stdin: `turn N` runs turn N and answers one JSON line, the ids
of every message the state held at any step of the turn (summaries left out) and whether
the state starts from a summary; `quit` closes the client and exits.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import sys
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

import agents
from agents import FILLER, TOOLS, ScriptedModel, is_tagged_summary
from summarizer_client import SummarizerClient, SummarizerMiddleware


def main() -> None:
    database_url, subject, thread, checkpoint, name, mode = sys.argv[1:7]
    # Tool call ids unique to this process, as a real model's are: two writers (or one
    # writer restarted) must not both call `call-0-logs` on one thread.
    tag = secrets.token_hex(3)
    agents._ids = (f"{name}-{tag}-{n}" for n in itertools.count())  # type: ignore[assignment]
    client = SummarizerClient(database_url=database_url, subject=subject, timeout=10.0)
    config: Any = {"configurable": {"thread_id": thread}}

    def question(line: str) -> str | None:
        command = line.split()
        if not command or command == ["quit"]:
            return None
        return f"{name} turn {command[1]}: why is checkout-api slow? " + FILLER * 2

    if mode == "sync":
        client.connect_sync()
        try:
            with SqliteSaver.from_conn_string(checkpoint) as saver:
                agent = create_agent(
                    ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=saver
                )
                while (text := question(sys.stdin.readline())) is not None:
                    seen: set[str] = set()
                    for values in agent.stream(request(text), config, stream_mode="values"):
                        seen.update(ids(values))
                    answer(seen, agent.get_state(config).values)
        finally:
            client.close_sync()
        return

    async def run() -> None:
        async with client, AsyncSqliteSaver.from_conn_string(checkpoint) as saver:
            agent = create_agent(
                ScriptedModel(), tools=TOOLS, middleware=[SummarizerMiddleware(client)], checkpointer=saver
            )
            loop = asyncio.get_running_loop()
            while (text := question(await loop.run_in_executor(None, sys.stdin.readline))) is not None:
                seen: set[str] = set()
                async for values in agent.astream(request(text), config, stream_mode="values"):
                    seen.update(ids(values))
                answer(seen, (await agent.aget_state(config)).values)

    asyncio.run(run())


def request(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text)]}


def ids(values: dict[str, Any]) -> list[str]:
    return [m.id for m in values["messages"] if not is_tagged_summary(m)]


def answer(seen: set[str], state: dict[str, Any]) -> None:
    from_summary = is_tagged_summary(state["messages"][0])
    print(json.dumps({"ids": sorted(seen), "from_summary": from_summary}), flush=True)


if __name__ == "__main__":
    main()
