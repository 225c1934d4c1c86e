"""A LangChain agent whose old tool output the worker clears (`tool_output_clearing` on
for its session): nothing new in the client, and the next model call gets each cleared
`ToolMessage` as a placeholder, still paired with its call."""

from __future__ import annotations

import itertools
import re
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from agents import assert_pair_safe
from conftest import rows, session_id, sql
from summarizer_client import SummarizerClient, SummarizerMiddleware

PLACEHOLDER = "[tool output cleared:"
PLACEHOLDER_SHAPE = re.compile(
    r"\[tool output cleared: 2360 chars of dump_logs output were here; recall seq (\d+) for the original\]"
)
_ids = itertools.count()


@tool
def dump_logs(service: str) -> str:
    """Every recent log line of a service."""
    line = f"14:01:07 ERROR {service} pool exhausted (50/50) on db-7\n"
    return line * 40


class LogReader(BaseChatModel):
    """After a human message: one call to dump_logs. After its result: a short answer.
    Keeps every input it is given."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "log-reader"

    def bind_tools(self, tools: Any, **kwargs: Any) -> LogReader:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content="The pool on db-7 is exhausted at 50/50.")
        else:
            reply = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "dump_logs",
                        "args": {"service": "checkout-api"},
                        "id": f"dump-{next(_ids)}",
                        "type": "tool_call",
                    }
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def test_a_cleared_tool_message_reaches_the_model_as_a_placeholder_still_paired(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    sql(
        database_url,
        "INSERT INTO session_settings (session_id, tool_output_clearing, tool_output_keep) "
        "VALUES (%s, %s, %s)",
        (session, True, 1),
    )
    model = LogReader()
    agent = create_agent(
        model, tools=[dump_logs], middleware=[SummarizerMiddleware(client)], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": session}}

    # Each turn adds a 2,360-char log dump: the session crosses the 3,000-char threshold
    # at the second, and clearing the older dumps brings it back under (until the
    # placeholders and questions add up and a summary is made as well).
    for n in range(1, 5):
        await agent.ainvoke({"messages": [HumanMessage(content=f"Turn {n}: what do the logs say?")]}, config)

    cleared_inputs = [
        seen for seen in model.seen if any(isinstance(m, ToolMessage) and str(m.content).startswith(PLACEHOLDER) for m in seen)
    ]
    assert cleared_inputs, "no model call saw a cleared result"
    for seen in model.seen:
        assert_pair_safe(seen)
    # In each call that saw one, the newest result is whole and every older one a
    # placeholder naming its size and the seq to recall its original by.
    recall_seqs: set[int] = set()
    for seen in cleared_inputs:
        results = [m for m in seen if isinstance(m, ToolMessage)]
        assert len(results) >= 2, seen
        assert str(results[-1].content).startswith("14:01:07 ERROR")
        for m in results[:-1]:
            named = PLACEHOLDER_SHAPE.fullmatch(str(m.content))
            assert named, m.content
            recall_seqs.add(int(named.group(1)))
    # The table holds placeholders; the archive holds the dump of every one of them (and
    # of each a summary later removed, archived then as its placeholder).
    stored = [r for r in rows(database_url, "messages", session) if r["role"] == "tool"]
    archived = [r for r in rows(database_url, "archived_messages", session) if r["role"] == "tool"]
    assert [r["content"][: len(PLACEHOLDER)] for r in stored[:-1]] == [PLACEHOLDER] * (len(stored) - 1)
    # A placeholder names its own seq: the original is archived under it.
    for r in stored[:-1]:
        named = PLACEHOLDER_SHAPE.fullmatch(r["content"])
        assert named and int(named.group(1)) == r["seq"], r
    dumps = {r["seq"] for r in archived if r["content"].startswith("14:01:07 ERROR")}
    placeholders = {r["seq"] for r in stored + archived if r["content"].startswith(PLACEHOLDER)}
    assert placeholders and placeholders <= dumps, (placeholders, dumps)
    # Each placeholder's seq is one whose original dump the archive holds.
    assert recall_seqs <= dumps, (recall_seqs, dumps)
    # The state the agent keeps is the table's.
    state = (await agent.aget_state(config)).values["messages"]
    kept = [str(m.content) for m in state if isinstance(m, ToolMessage)]
    assert [c[: len(PLACEHOLDER)] for c in kept[:-1]] == [PLACEHOLDER] * (len(kept) - 1)
