"""What SummarizerMiddleware adds to a turn when no worker runs: the common case for a
fleet that is down, and the floor of every below-threshold turn (one insert of the new
messages plus one NATS round trip, which answers "no responders" at once).

    DATABASE_URL=postgresql://... python bench_noop.py [--turns 200]
    DATABASE_URL=sqlite:///path/to/file.db python bench_noop.py

Needs the database (Postgres, or the SQLite file a worker has migrated) and NATS; prints
the figure, asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import time
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from summarizer_client import SummarizerClient, SummarizerMiddleware


def per_turn_ms(middleware: list[Any], turns: int) -> float:
    model = GenericFakeChatModel(messages=(AIMessage(content="The pool is exhausted.") for _ in itertools.count()))
    agent = create_agent(model, tools=[], middleware=middleware, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": f"bench-{secrets.token_hex(4)}"}}
    agent.invoke({"messages": [HumanMessage(content="warm up")]}, config)
    started = time.perf_counter()
    for n in range(turns):
        agent.invoke({"messages": [HumanMessage(content=f"Turn {n}: why is checkout-api slow?")]}, config)
    return (time.perf_counter() - started) * 1000 / turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    args = parser.parse_args()
    # A subject nobody serves: "no worker running".
    client = SummarizerClient(args.nats_url, os.environ["DATABASE_URL"], f"bench.{secrets.token_hex(6)}")
    client.connect_sync()
    try:
        bare = per_turn_ms([], args.turns)
        with_middleware = per_turn_ms([SummarizerMiddleware(client)], args.turns)
    finally:
        client.close_sync()
    print(f"turn without middleware: {bare:.2f} ms")
    print(f"turn with middleware, no worker running: {with_middleware:.2f} ms")
    print(f"middleware adds {with_middleware - bare:.2f} ms per turn ({args.turns} turns)")


if __name__ == "__main__":
    main()
