"""LangChain messages to and from rows of the `messages` table, losslessly.

The public columns hold what the worker and plain-SQL agents read: a role, the text
(content blocks flattened to their text, an Anthropic `compaction` block's included), tool
calls as `[{id, name, arguments}]`, the `tool_call_id`, `pinned`
(`additional_kwargs["summarizer_pinned"] is True`), and `block_chars`, the weight of the
blocks that are not text (images, thinking, reasoning: see `_weight`), which `chars`, and so
the thresholds, count.
`external_id` holds the message id; `extra` holds the message type and every other field
of the message (content blocks when content is a list, name, additional_kwargs (so the
pin too), response_metadata, ...), from which the message is rebuilt exactly.

Rows the worker wrote (summaries) or plain-SQL agents wrote have no `extra`: they are
built from the public columns, a summary as a `HumanMessage` tagged
`additional_kwargs={"lc_source": "summarization"}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_core.messages.tool import ToolCall

from ._weight import block_chars

#: Ids given on load to rows that have none. A summary's names the compaction in force
#: when it was loaded, which is how a client tells that its state is out of date.
SUMMARY_ID_PREFIX = "summarizer-summary-"
ROW_ID_PREFIX = "summarizer-row-"
#: `additional_kwargs[PINNED] = True` pins a message: its row's `pinned` column is set,
#: and no compaction summarizes, clears or archives it.
PINNED = "summarizer_pinned"

_ROLES = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessageChunk": "system",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "function": "tool",
    "FunctionMessageChunk": "tool",
}
_CHAT_ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}


@dataclass(frozen=True)
class Row:
    """One `messages` row as the client writes it."""

    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    external_id: str | None
    extra: dict[str, Any]
    pinned: bool = False
    #: What the blocks that are not text weigh, in chars (`_weight.block_chars`).
    block_chars: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "external_id": self.external_id,
            "extra": self.extra,
            "pinned": self.pinned,
            "block_chars": self.block_chars,
        }


def is_pinned(message: BaseMessage) -> bool:
    """Whether the message is pinned: `additional_kwargs["summarizer_pinned"]` is `True`
    (not merely truthy, so that a stray value pins nothing)."""
    return message.additional_kwargs.get(PINNED) is True


def fingerprint(message: BaseMessage) -> int:
    """What tells an edited message from the one stored, within this process: its type,
    content, tool calls, call id and pin. Cheap (no serialization, no attribute a message type
    lacks: pydantic's misses are slow), since every message of the state is
    fingerprinted at every turn: 50,000 messages in under 100 ms."""
    content = message.content
    calls = repr(message.tool_calls) if isinstance(message, AIMessage) and message.tool_calls else None
    call_id = message.tool_call_id if isinstance(message, ToolMessage) else None
    text = content if isinstance(content, str) else repr(content)
    return hash((message.type, text, calls, call_id, is_pinned(message)))


def text_of(content: str | list[str | dict[Any, Any]]) -> str:
    """The text of a message's content: itself, or its text blocks joined, with the text
    of Anthropic's server-side `compaction` blocks (`{"type": "compaction", "content":
    "..."}`): the provider's own summary of the conversation, which is message text to be
    summarized, fact-checked and recalled like any other. Opaque items (reasoning,
    OpenAI's encrypted compaction) hold no text here: they stay in `extra` only, so they
    are never sent to the worker's LLM."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "compaction" and isinstance(block.get("content"), str):
            parts.append(block["content"])
    return "\n".join(parts)


def role_of(message: BaseMessage) -> str:
    if message.type == "chat":
        return _CHAT_ROLES.get(str(getattr(message, "role", "")).lower(), "user")
    return _ROLES.get(message.type, "user")


def to_row(message: BaseMessage) -> Row:
    data = message.model_dump(mode="json")
    data.pop("id", None)
    data.pop("type", None)
    if isinstance(message.content, str):
        # The content column holds it; no need to store it twice.
        data.pop("content", None)
    calls = None
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [
            {"id": c.get("id"), "name": c["name"], "arguments": c["args"]}
            for c in message.tool_calls
        ]
    tool_call_id = message.tool_call_id if isinstance(message, ToolMessage) else None
    # Round-trip through JSON so that what is stored is exactly what loads back.
    data = json.loads(json.dumps(data, default=str))
    return Row(
        role=role_of(message),
        content=text_of(message.content),
        tool_calls=calls,
        tool_call_id=tool_call_id,
        external_id=message.id,
        extra={"type": message.type, "data": data},
        pinned=is_pinned(message),
        block_chars=block_chars(data.get("content"), data.get("additional_kwargs")),
    )


def from_row(
    role: str,
    content: str | None,
    tool_calls: Any,
    tool_call_id: str | None,
    is_summary: bool,
    external_id: str | None,
    extra: Any,
) -> BaseMessage:
    if isinstance(extra, dict) and isinstance(extra.get("data"), dict) and "type" in extra:
        data = dict(extra["data"])
        data.setdefault("content", content or "")
        data["id"] = external_id
        return messages_from_dict([{"type": extra["type"], "data": data}])[0]
    text = content or ""
    if role == "user" and is_summary:
        return HumanMessage(
            content=text,
            id=external_id,
            additional_kwargs={"lc_source": "summarization"},
        )
    if role == "user":
        return HumanMessage(content=text, id=external_id)
    if role == "assistant":
        return AIMessage(content=text, id=external_id, tool_calls=_calls(tool_calls))
    if role == "system":
        return SystemMessage(content=text, id=external_id)
    return ToolMessage(content=text, id=external_id, tool_call_id=tool_call_id or "")


def _calls(stored: Any) -> list[ToolCall]:
    """Tool calls from the column, in any of the shapes the worker accepts."""
    if isinstance(stored, str):
        try:
            stored = json.loads(stored)
        except ValueError:
            return []
    if not isinstance(stored, list):
        return []
    calls: list[ToolCall] = []
    for call in stored:
        if not isinstance(call, dict):
            continue
        inner = call.get("function")
        function: dict[str, Any] = inner if isinstance(inner, dict) else call
        name = function.get("name")
        args = function.get("args", function.get("arguments", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"input": args}
        if not isinstance(args, dict):
            args = {"input": args}
        calls.append(
            ToolCall(name=str(name or ""), args=args, id=call.get("id"), type="tool_call")
        )
    return calls


def summary_compaction(messages: list[BaseMessage]) -> int | None:
    """The compaction the state reflects: named by the id of its newest loaded summary."""
    for message in reversed(messages):
        if message.id and message.id.startswith(SUMMARY_ID_PREFIX):
            number = message.id[len(SUMMARY_ID_PREFIX) :].split("-", 1)[0]
            return int(number) if number.isdigit() else None
    return None


def pair_safe(messages: list[BaseMessage]) -> bool:
    """No tool result without the call that asked for it earlier in the list."""
    called: set[str] = set()
    for message in messages:
        if isinstance(message, AIMessage):
            called.update(c["id"] for c in message.tool_calls if c["id"])
        elif isinstance(message, ToolMessage) and message.tool_call_id not in called:
            return False
    return True
