"""A model call the provider refused as too long: how to tell one, what the refusal says
of the limit, what keep to ask the worker for, and how to clip a tool output too large
for any compaction to make room for it. Pure functions; `_recover` does the I/O.

The sizes are in chars as the worker weighs them (`_codec.to_row`: text, tool calls,
`block_chars`), the unit of `keep_chars`. A refusal's numbers are tokens of the whole
prompt (system prompt and tools included): the history is scaled by the same ratio, with a
margin for what that proportion misses.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import langchain_core.exceptions
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from ._codec import text_of, to_row

#: The share of the reported limit the retried prompt aims at: the chars-to-tokens
#: proportion is an estimate, and the answer's tokens may count against the window too.
MARGIN = 0.8
#: The room left for the summary beside the kept part when no limit is reported: the
#: worker's default `SUMMARY_MAX_CHARS`, the longest summary it accepts.
SUMMARY_ROOM = 6_000
#: The worker's default `SUMMARIZATION_MIN_KEEP_CHARS`: a smaller keep is clamped to it.
MIN_KEEP = 500
#: How many forced requests one refusal may send, each with half the keep of the one
#: before: a refusal (`within_keep`, `nothing_to_compact`, ...) costs the worker a read,
#: not an LLM call, so enough to halve a 100,000-char keep down to the newest turn.
MAX_ASKS = 8
#: How many of them may compact (each an LLM call), when the first left too much.
MAX_COMPACTIONS = 2
#: The least of a clipped output kept, head and tail together: enough to show what it was.
CLIP_FLOOR = 2_000

# "This model's maximum context length is 128000 tokens. However, your messages resulted
# in 130532 tokens." (OpenAI; "you requested" in older wording)
_OPENAI = re.compile(
    r"maximum context length is ([\d,]+) tokens.*?(?:resulted in|requested) ([\d,]+) tokens",
    re.IGNORECASE | re.DOTALL,
)
# "prompt is too long: 208310 tokens > 200000 maximum" (Anthropic)
_ANTHROPIC = re.compile(r"prompt is too long:\s*([\d,]+) tokens\s*>\s*([\d,]+)", re.IGNORECASE)
# "input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000"
_WITH_OUTPUT = re.compile(r"([\d,]+)\s*\+\s*([\d,]+)\s*>\s*([\d,]+)")
# "The input token count (1234567) exceeds the maximum number of tokens allowed (1048576)"
_GEMINI = re.compile(
    r"input token count \(?([\d,]+)\)? exceeds the maximum number of tokens allowed \(?([\d,]+)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Reported:
    """What a refusal says: the model's limit and the prompt's size, in tokens."""

    limit: int
    size: int


def is_overflow(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is a provider's refusal of a
    prompt as too long: LangChain's `ContextOverflowError`, or for versions without it,
    OpenAI's `context_length_exceeded` and Anthropic's "prompt is too long". The
    providers' modules are looked up, not imported: an error of theirs means they are
    loaded, and an agent without them pays nothing."""
    seen: BaseException | None = error
    for _ in range(4):  # the error, and what it was raised from, a few links deep
        if seen is None:
            return False
        if _is_overflow(seen):
            return True
        seen = seen.__cause__
    return False


def _is_overflow(error: BaseException) -> bool:
    # In the langchain-core versions that have it; earlier ones raise the providers' own.
    overflow = getattr(langchain_core.exceptions, "ContextOverflowError", None)
    if isinstance(overflow, type) and isinstance(error, overflow):
        return True
    text = str(error)
    openai = sys.modules.get("openai")
    bad_request = getattr(openai, "BadRequestError", None)
    if isinstance(bad_request, type) and isinstance(error, bad_request):
        if getattr(error, "code", None) == "context_length_exceeded" or "context_length_exceeded" in text:
            return True
    anthropic = sys.modules.get("anthropic")
    bad_request = getattr(anthropic, "BadRequestError", None)
    if isinstance(bad_request, type) and isinstance(error, bad_request):
        return "prompt is too long" in text.lower()
    return False


def reported(error: BaseException) -> Reported | None:
    """The limit and size the refusal's message gives, when it gives both and the size
    is over the limit; None otherwise."""
    text = str(error)
    found: Reported | None = None
    if (m := _OPENAI.search(text)) is not None:
        found = Reported(limit=_int(m.group(1)), size=_int(m.group(2)))
    elif (m := _ANTHROPIC.search(text)) is not None:
        found = Reported(limit=_int(m.group(2)), size=_int(m.group(1)))
    elif (m := _GEMINI.search(text)) is not None:
        found = Reported(limit=_int(m.group(2)), size=_int(m.group(1)))
    elif (m := _WITH_OUTPUT.search(text)) is not None:
        # The prompt and the room asked for the answer together: the prompt's own limit
        # is what the answer leaves.
        found = Reported(limit=_int(m.group(3)) - _int(m.group(2)), size=_int(m.group(1)))
    if found is None or not 0 < found.limit < found.size:
        return None
    return found


def _int(digits: str) -> int:
    return int(digits.replace(",", ""))


def message_chars(message: BaseMessage) -> int:
    """The message's size as the worker weighs its row (`chars`)."""
    row = to_row(message)
    calls = len(json.dumps(row.tool_calls, ensure_ascii=False)) if row.tool_calls else 0
    return len(row.content) + calls + row.block_chars


def newest_turn(messages: Sequence[BaseMessage]) -> int:
    """Where the newest human turn starts (a summary is not one): the worker never cuts
    inside it, so no keep below its size keeps less. 0 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, HumanMessage) and message.additional_kwargs.get("lc_source") != "summarization":
            return i
    return 0


@dataclass(frozen=True)
class Target:
    """What a recovery aims at: the history's size the retried call may take (`budget`),
    the keep to ask for first, and the least keep worth asking for (`floor`: the newest
    turn, which no compaction cuts into)."""

    budget: int
    keep: int
    floor: int


def target(messages: Sequence[BaseMessage], refusal: Reported | None) -> Target:
    """The target for a history of `messages` that the model refused. With the limit
    and size reported, the history is scaled to the limit (with `MARGIN`) and half of it
    kept, the rest being room for the summary and for the cut, which falls on a human
    turn at or before where the keep is reached. Without them the keep is half the
    history, and the summary's room comes on top."""
    sizes = [message_chars(m) for m in messages]
    history = sum(sizes)
    floor = max(MIN_KEEP, sum(sizes[newest_turn(messages) :]))
    if refusal is not None:
        budget = int(history * refusal.limit / refusal.size * MARGIN)
        keep = budget // 2
    else:
        keep = history // 2
        budget = keep + SUMMARY_ROOM
    return Target(budget=budget, keep=max(floor, keep), floor=floor)


def smaller_keep(keep: int, floor: int, session_chars: object) -> int | None:
    """The next keep after a compaction that kept too much, or a refusal that a smaller
    keep may turn into a compaction: the whole history within the keep (`within_keep`),
    no turn to cut at before it (`no_safe_boundary`), or only a summary before it
    (`nothing_to_compact`: the keep is reached inside one large turn, whose human message
    is then the cut). Half of the keep or of the session, whichever is smaller, down to
    `floor`. None when the keep is at the floor already."""
    if keep <= floor:
        return None
    if isinstance(session_chars, int) and not isinstance(session_chars, bool) and session_chars > 0:
        keep = min(keep, session_chars)
    return max(floor, keep // 2)


def clip_outputs(
    messages: Sequence[BaseMessage], budget: int, seqs: Mapping[str, int]
) -> tuple[list[BaseMessage], list[str]]:
    """`messages` with their text tool outputs clipped, the largest first (a huge one is
    the one a compaction could not remove: the newest turn's, or the turn before when the
    newest is too small to cut at), until the whole is within `budget` (or each is down
    to `CLIP_FLOOR`): each keeps its head and tail around a note saying how much was cut
    and how to read the original (`recall seq N`, from `seqs` by message id, else the
    message id). Returns the copy and the ids of the messages clipped; the messages given
    are not changed. Outputs with blocks that are not text (a screenshot) are not
    clipped."""
    out = list(messages)
    excess = sum(message_chars(m) for m in messages) - budget
    clipped: list[str] = []
    if excess <= 0:
        return out, clipped
    outputs = [
        (len(text), i, text)
        for i, m in enumerate(messages)
        if isinstance(m, ToolMessage) and (text := _plain_text(m)) is not None
    ]
    for size, i, text in sorted(outputs, reverse=True):
        if excess <= 0:
            break
        message = messages[i]
        seq = seqs.get(message.id) if message.id is not None else None
        where = f"recall seq {seq}" if seq is not None else f"message id {message.id}"

        def note(cut: int) -> str:
            return (
                f"[... {cut:,} of this tool output's {size:,} chars were clipped here to "
                f"fit the model's context window; the original is stored: {where} for it]"
            )

        # The note takes room too (a few more chars when the count grows a digit).
        keep = max(CLIP_FLOOR, size - excess - len(note(excess)) - 4)
        if keep >= size:
            continue
        shorter = _head_and_tail(text, keep, note(size - keep))
        excess -= size - len(shorter)
        out[i] = message.model_copy(update={"content": shorter})
        clipped.append(str(message.id))
    return out, clipped


def _plain_text(message: ToolMessage) -> str | None:
    content = message.content
    if isinstance(content, str):
        return content
    if all(isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text") for b in content):
        return text_of(content)
    return None


def _head_and_tail(text: str, keep: int, note: str) -> str:
    """About `keep` chars of `text`: its first and last halves, each cut at a line end
    when one is near, around `note`."""
    half = max(1, keep // 2)
    head, tail = text[:half], text[-half:]
    newline = head.rfind("\n")
    if newline >= half // 2:
        head = head[: newline + 1]
    newline = tail.find("\n")
    if 0 <= newline < half // 2:
        tail = tail[newline + 1 :]
    return f"{head.rstrip(chr(10))}\n{note}\n{tail}"
