"""`recall_tool`: the session's archive as a LangChain tool the model can call; and
`compact_tool`, with which the model compacts its own context."""

# No `from __future__ import annotations`: LangChain reads the `config: RunnableConfig`
# parameter's annotation at runtime to inject the run's config instead of asking the
# model for it.

import asyncio
import re

from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from .client import MAX_INSTRUCTIONS_CHARS, Decision, SummarizerClient
from .recall import MAX_MAX_CHARS, RecallError, as_text, fetch_payload, search_payload

NAME = "recall_earlier_conversation"
DESCRIPTION = (
    "Search the earlier part of this conversation that was summarized or cleared away to "
    "save context, and read the original messages. Give an identifier exactly as it was "
    "written (an error code, version, host:port, file path, metric) or a few words; or "
    "'seq N' to read the archived message with that seq whole (summaries and cleared tool "
    "outputs name the seqs). Returns the matching messages, best first."
)

#: `seq 12`, `seqs 12, 14`, `seq #12`, `seq 4 to 9`, `seqs 4-9`, anywhere in the query
#: ("read seq 12 again"): a fetch by seq rather than a search.
_SEQ_REF = re.compile(
    r"\bseqs?\.?\s*[:#-]?\s*(#?\d+(?:\s*(?:,|;|and|to|-|\u2013|\.\.)\s*#?\d+)*)",
    re.IGNORECASE,
)
#: One item of a seq reference: a seq, or a range of them.
_SEQ_ITEM = re.compile(r"(\d+)(?:\s*(?:to|-|\u2013|\.\.)\s*#?(\d+))?", re.IGNORECASE)
#: Words around a seq reference that ask for nothing else ("read seq 12 again").
_FILLER = frozenset(
    "read again what did say says said show fetch get the message messages whole full "
    "text original and from for please recall archived with that this was were its about".split()
)
_MAX_SEQ = 2**63 - 1

#: A fetch by the tool reads at most this many seqs ...
TOOL_MAX_SEQS = 5
#: ... sharing this many chars: what one tool answer may add to the model's context.
TOOL_FETCH_CHARS = MAX_MAX_CHARS


def recall_tool(
    client: SummarizerClient,
    *,
    session_id: str | None = None,
    limit: int = 5,
    max_chars: int = 2_000,
) -> BaseTool:
    """A tool named `recall_earlier_conversation` with one `query` argument: it searches
    the session's archived messages (`client.recall`), or fetches them whole when the
    query is `seq N` (`client.fetch`), and returns them as text. The session is
    `session_id`, or else the run's `thread_id` (as `SummarizerMiddleware` uses). Each
    search returns at most `limit` messages of at most `max_chars` chars; a fetch by seq
    ("seq 12", "seqs 4 to 9", anywhere in the query) reads at most 5 seqs, sharing
    20,000 chars, and names the seqs it did not read yet; the query's other words, if
    any, are searched too.

    It never raises into the agent: on a timeout, no worker, or any other failure it
    returns a short "recall unavailable" text, and a query the worker refuses is
    answered with why, so the model can try again or go on without it."""

    # Past the client's own timeout, a stuck connection attempt or loop: the answer is
    # "unavailable", never a hung tool call.
    bound = client.timeout * 2 + 1.0

    async def arecall(query: str, config: RunnableConfig) -> str:
        session = _session(session_id, config)
        if session is None:
            return _NO_SESSION
        try:
            answer = _answer(client, session, query, limit, max_chars)
            return await asyncio.wait_for(client.run(answer), timeout=bound)
        except Exception as e:  # noqa: BLE001 -- a tool's failure must not end the run
            return _unavailable(client, e)

    def recall(query: str, config: RunnableConfig) -> str:
        session = _session(session_id, config)
        if session is None:
            return _NO_SESSION
        try:
            return client.run_sync(_answer(client, session, query, limit, max_chars), bound)
        except Exception as e:  # noqa: BLE001 -- a tool's failure must not end the run
            return _unavailable(client, e)

    return StructuredTool.from_function(
        func=recall, coroutine=arecall, name=NAME, description=DESCRIPTION
    )


_NO_SESSION = "recall unavailable: this run has no thread_id to find the conversation by."

COMPACT_NAME = "compact_conversation"
COMPACT_DESCRIPTION = (
    "Compact this conversation now: its earlier part is replaced by a summary, which "
    "frees room in your context. Use it when the conversation has grown long, or before "
    "a new phase of the work. Optionally say what the summary must focus on or keep "
    "(identifiers, decisions, open questions). The recent messages are kept as they are; "
    "the next turn continues from the summary."
)


class _CompactArgs(BaseModel):
    instructions: str | None = Field(
        default=None,
        description=(
            "What the summary should focus on or keep, in at most "
            f"{MAX_INSTRUCTIONS_CHARS:,} characters (optional)."
        ),
    )


def compact_tool(
    client: SummarizerClient,
    session_id: str | None = None,
    *,
    keep_chars: int | None = None,
    timeout: float | None = None,
) -> BaseTool:
    """A tool named `compact_conversation` with one optional `instructions` argument
    (what the summary should focus on): it compacts the session now (`client.compact`),
    and tells the model what happened: `Compacted: 38 earlier messages replaced by a
    summary (42,490 chars saved). ...`, or why not (`Not compacted: too_few_turns
    (...)`). The session is `session_id`, or else the run's `thread_id`; `keep_chars`
    and `timeout` are `client.compact`'s (by default the worker's keep, and at least 2
    minutes).

    The compaction changes the stored history, not the state the tool runs in: the next
    model call of an agent with `SummarizerMiddleware` (or a graph with
    `summarizer_node`) loads it, as it loads any compaction it did not ask for. It
    never raises into the agent: a failure is a `Not compacted: ...` text.

    Its requests say `"instructions_from": "agent"`: the model wrote the instructions, and
    a tool output it read may have steered them, so the worker gives them to the
    summarizer as the agent's request about focus, not as the operator's, without the
    authority to drop facts."""

    # Past the wait for the reply, a stuck connection attempt or loop: never a hung call.
    bound = client._compact_wait(timeout) + client.timeout * 2 + 1.0

    async def acompact(config: RunnableConfig, instructions: str | None = None) -> str:
        session = _session(session_id, config)
        if session is None:
            return _NOT_COMPACTED_NO_SESSION
        try:
            compacting = _compact(client, session, instructions, keep_chars, timeout)
            return await asyncio.wait_for(client.run(compacting), timeout=bound)
        except Exception as e:  # noqa: BLE001 -- a tool's failure must not end the run
            return _compact_failed(client, e)

    def compact(config: RunnableConfig, instructions: str | None = None) -> str:
        session = _session(session_id, config)
        if session is None:
            return _NOT_COMPACTED_NO_SESSION
        try:
            compacting = _compact(client, session, instructions, keep_chars, timeout)
            return client.run_sync(compacting, bound)
        except Exception as e:  # noqa: BLE001 -- a tool's failure must not end the run
            return _compact_failed(client, e)

    return StructuredTool.from_function(
        func=compact,
        coroutine=acompact,
        name=COMPACT_NAME,
        description=COMPACT_DESCRIPTION,
        args_schema=_CompactArgs,
    )


_NOT_COMPACTED_NO_SESSION = (
    "Not compacted: this run has no thread_id to find the conversation by. Go on as you are."
)

#: Why a compaction did not happen, as the model is told, by the reply's reason.
_NOT_COMPACTED = {
    "below_threshold": "the conversation is small enough as it is",
    "too_few_turns": "fewer than two user turns so far, too little to summarize",
    "within_keep": "the whole conversation is within what a compaction keeps as it is",
    "no_safe_boundary": "no place to cut that keeps every tool call with its result",
    "nothing_to_compact": "only an earlier summary is old enough to compact",
    "unknown_session": "nothing of this conversation is stored yet",
    "disabled": "compaction is disabled for this conversation",
    "backing_off": "the summarizer failed recently and waits before it tries again",
    "conflict": "the conversation changed while it was being compacted",
    "in_progress": "another compaction of this conversation is under way; the next turn "
    "continues from it",
    "no_responders": "no summarizer is running",
    "transport_error": "the summarizer could not be reached",
}


async def _compact(
    client: SummarizerClient,
    session: str,
    instructions: str | None,
    keep_chars: int | None,
    timeout: float | None,
) -> str:
    try:
        # On the client's loop already (see `compact_tool`): its coroutine, not its method.
        # The model wrote the instructions, and text in a tool output can steer it: the
        # worker takes them as the agent's request about focus, not as the operator's.
        decision = await client._compact(
            session, instructions, keep_chars, timeout, instructions_from="agent"
        )
    except ValueError as e:
        return f"Not compacted: {e}. Shorten them, or call again without them."
    return _compaction_text(decision, client._compact_wait(timeout))


def _compaction_text(decision: Decision, waited: float) -> str:
    """What the model reads after `compact_conversation`: what the compaction saved, or
    why there was none."""
    reply: dict[str, Any] = decision.reply or {}
    if decision.compacted:
        removed, cleared = _count(reply, "messages_removed"), _count(reply, "tool_outputs_cleared")
        saved = max(
            0,
            _count(reply, "chars_removed")
            - _count(reply, "summary_chars")
            + _count(reply, "chars_cleared"),
        )
        done = []
        if removed:
            done.append(f"{removed} earlier message{_s(removed)} replaced by a summary")
        if cleared:
            done.append(f"{cleared} old tool output{_s(cleared)} cleared")
        what = " and ".join(done) or "the earlier part replaced by a summary"
        return f"Compacted: {what} ({saved:,} chars saved). The next turn continues from it."
    reason = decision.reason or "unknown"
    if reason == "timeout":
        why = (
            f"no answer within {waited:g}s; it may still complete, and the next turn would "
            "continue from it"
        )
    elif reason in _NOT_COMPACTED:
        why = _NOT_COMPACTED[reason]
    else:
        # `invalid_request`, `llm_error`, `store_error`: the worker says why.
        why = str(reply.get("message") or f"status {reply.get('status')!r}")
    return f"Not compacted: {reason} ({why}). Go on as you are."


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _count(reply: dict[str, Any], key: str) -> int:
    value = reply.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _compact_failed(client: SummarizerClient, error: Exception) -> str:
    timed_out = isinstance(error, (asyncio.TimeoutError, TimeoutError))
    reason = "timeout" if timed_out else "transport_error"
    client.warnings.warn("compact", "compact_conversation failed (%s): %s", reason, error)
    return f"Not compacted: {reason} (the summarizer did not answer). Go on as you are."


def _session(session_id: str | None, config: RunnableConfig) -> str | None:
    if session_id is not None:
        return session_id
    thread = (config.get("configurable") or {}).get("thread_id")
    return None if thread is None else str(thread)


async def _answer(
    client: SummarizerClient, session: str, query: str, limit: int, max_chars: int
) -> str:
    try:
        seqs, rest = _seqs(query)
        if not seqs:
            payload = search_payload(session, query, limit, max_chars)
            # On the client's loop already (see `recall_tool`): its coroutine, not its method.
            text = as_text(query, await client._recall(payload), max_chars=max_chars)
        else:
            each = TOOL_FETCH_CHARS // len(seqs)
            payload = fetch_payload(session, seqs, each)
            text = as_text(query, await client._recall(payload), max_chars=each, fetched=True)
            if rest:
                text += f"\n\n[Not read yet: {rest}. Ask for them in another call.]"
            # What the query asks besides the seqs is searched too.
            words = _other_words(query)
            if words:
                payload = search_payload(session, words, limit, max_chars)
                found = await client._recall(payload)
                text += "\n\n" + as_text(words, found, max_chars=max_chars)
    except ValueError as e:
        return f"recall refused the query: {e}."
    except RecallError as e:
        if e.reason == "invalid_request":
            return f"recall refused the query: {e.message}."
        return _unavailable(client, e)
    client.warnings.cleared("recall")
    return text


def _unavailable(client: SummarizerClient, error: Exception) -> str:
    if isinstance(error, RecallError):
        reason = error.reason
    elif isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        reason = "timeout"
    else:
        reason = "transport_error"
    client.warnings.warn("recall", "recall failed (%s): %s", reason, error)
    return f"recall unavailable ({reason}); go on without the earlier conversation."


def _seqs(query: str) -> tuple[list[int], str]:
    """The seqs the query names, in its order (ranges spelled out, either way round), at
    most `TOOL_MAX_SEQS`, and the rest of them as a model would ask for them ("seqs 6 to
    38, 41"), empty when none is left."""
    items: list[tuple[int, int]] = []
    for ref in _SEQ_REF.finditer(query):
        for item in _SEQ_ITEM.finditer(ref.group(1)):
            lo = int(item.group(1))
            hi = int(item.group(2)) if item.group(2) else lo
            lo, hi = min(lo, hi), max(lo, hi)
            if hi <= _MAX_SEQ:
                items.append((lo, hi))
    seqs: list[int] = []
    left: list[tuple[int, int]] = []
    for lo, hi in items:
        n = lo
        while n <= hi and len(seqs) < TOOL_MAX_SEQS:
            if n not in seqs:
                seqs.append(n)
            n += 1
        if n <= hi:
            left.append((n, hi))
    rest = ", ".join(str(lo) if lo == hi else f"{lo} to {hi}" for lo, hi in left)
    if rest:
        rest = f"seq {rest}" if len(left) == 1 and left[0][0] == left[0][1] else f"seqs {rest}"
    return seqs, rest


def _other_words(query: str) -> str:
    """The query's words besides its seq references and the words asking for them."""
    kept = []
    for word in _SEQ_REF.sub(" ", query).split():
        bare = word.strip("?!.,;:'\"()").lower()
        if len(bare) >= 3 and bare not in _FILLER:
            kept.append(word)
    return " ".join(kept)
