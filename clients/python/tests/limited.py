"""A chat model with a context window: it counts its prompt as a provider would (text at 4
chars a token, each image at its pixel size's charge, 1,600 tokens when unread) and
refuses a prompt over its limit with LangChain's `ContextOverflowError`, worded as a
provider words it. Scripted like `agents.ScriptedModel`: after a question it calls the
tools of its `plan`, after their results it answers."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from agents import FILLER
from summarizer_client._weight import FIXED_TOKENS, image_size, image_tokens

_ids = itertools.count()
IMAGES = ("image", "image_url", "input_image")


def prompt_tokens(messages: list[BaseMessage]) -> int:
    """The prompt's tokens: its text (content, text blocks, tool calls) at 4 chars a
    token, and each image by its pixel size (the larger provider's charge) or 1,600."""
    chars = 0
    tokens = 0
    for message in messages:
        content = message.content
        blocks = [content] if isinstance(content, str) else content
        for block in blocks:
            if isinstance(block, str):
                chars += len(block)
            elif block.get("type") in IMAGES:
                size = image_size(block)
                tokens += image_tokens(*size) if size else FIXED_TOKENS
            elif isinstance(block.get("text"), str):
                chars += len(block["text"])
        if isinstance(message, AIMessage) and message.tool_calls:
            chars += len(json.dumps([{"name": c["name"], "args": c["args"]} for c in message.tool_calls]))
    return tokens + -(-chars // 4)


def refusal(limit: int, size: int, style: str) -> ContextOverflowError:
    if style == "openai":
        return ContextOverflowError(
            f"Error code: 400 - This model's maximum context length is {limit} tokens. "
            f"However, your messages resulted in {size} tokens. Please reduce the length "
            "of the messages. (code: context_length_exceeded)"
        )
    if style == "anthropic":
        return ContextOverflowError(f"prompt is too long: {size} tokens > {limit} maximum")
    return ContextOverflowError("Your input exceeds the context window of this model.")


class LimitedModel(BaseChatModel):
    """Refuses a prompt of more than `limit` tokens (`style`: how the refusal is worded:
    `openai`, `anthropic`, or `bare`, without numbers). Keeps every prompt it was given
    (`seen`) and every refusal (`refused`); `plan(n)` names the tools to call (each with
    `{"n": n}`) after the question `Turn n: ...`; none: an answer at once."""

    limit: int
    style: str = "openai"
    plan: Callable[[int], list[str]] = Field(default=lambda n: ["get_logs"])
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    refused: list[ContextOverflowError] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "limited"

    def bind_tools(self, tools: Any, **kwargs: Any) -> LimitedModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        tokens = prompt_tokens(messages)
        if tokens > self.limit:
            error = refusal(self.limit, tokens, self.style)
            self.refused.append(error)
            raise error
        last = messages[-1]
        usage = {"input_tokens": tokens, "output_tokens": 50, "total_tokens": tokens + 50}
        if isinstance(last, ToolMessage):
            reply = AIMessage(content="The pool on db-7 is exhausted; " + FILLER, usage_metadata=usage)
        else:
            # The question's number, as `agents.question(n)` writes it: the same on a retry.
            found = re.match(r"Turn (\d+):", str(last.content))
            n = int(found.group(1)) if found else 0
            names = self.plan(n) if isinstance(last, HumanMessage) else []
            calls = [
                {"name": name, "args": {"n": n}, "id": f"call-{next(_ids)}", "type": "tool_call"}
                for name in names
            ]
            text = "" if calls else "Nothing to look up; " + FILLER
            reply = AIMessage(content=text, tool_calls=calls, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def calls(self) -> int:
        """How many calls it was given, refused or answered."""
        return len(self.seen)
