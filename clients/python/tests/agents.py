"""A scripted chat model, real tools, and the checks every agent test makes."""

from __future__ import annotations

import itertools
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

FILLER = "latency p99 rose while the connection pool stayed saturated on db-7; "


@tool
def get_logs(service: str) -> str:
    """The recent error logs of a service."""
    return f"14:01:07 ERROR {service} pool exhausted (50/50) " + FILLER * 4


@tool
def get_metrics(service: str) -> str:
    """The recent metrics of a service."""
    return f"{service}: p99=2300ms rps=410 errors=3.1% " + FILLER * 4


TOOLS = [get_logs, get_metrics]
_ids = itertools.count()


class ScriptedModel(BaseChatModel):
    """After a human message: two parallel tool calls. After tool results: an answer.
    Records the size of every input it is given."""

    inputs: list[int] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.inputs.append(sum(len(str(m.content)) for m in messages))
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content="The pool on db-7 is exhausted; " + FILLER * 3)
        else:
            n = next(_ids)
            reply = AIMessage(
                content="",
                tool_calls=[
                    {"name": "get_logs", "args": {"service": "checkout-api"}, "id": f"call-{n}-logs", "type": "tool_call"},
                    {"name": "get_metrics", "args": {"service": "checkout-api"}, "id": f"call-{n}-metrics", "type": "tool_call"},
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


def question(n: int) -> HumanMessage:
    return HumanMessage(content=f"Turn {n}: why is checkout-api slow? " + FILLER * 2)


def assert_pair_safe(messages: list[BaseMessage]) -> None:
    called: set[str] = set()
    for m in messages:
        if isinstance(m, AIMessage):
            called.update(c["id"] for c in m.tool_calls if c["id"])
        if isinstance(m, ToolMessage):
            assert m.tool_call_id in called, f"orphan tool result {m.tool_call_id}"


def is_tagged_summary(message: BaseMessage) -> bool:
    return isinstance(message, HumanMessage) and message.additional_kwargs.get("lc_source") == "summarization"


def assert_every_message_kept_once(
    produced: set[str], current: list[dict[str, Any]], archived: list[dict[str, Any]]
) -> None:
    """Archived + current rows hold every message the agent produced, each once; the rest
    are the worker's summaries."""
    stored = [r["external_id"] for r in current + archived if not r["is_summary"]]
    assert len(stored) == len(set(stored)), "a message is stored twice"
    assert set(stored) == produced
