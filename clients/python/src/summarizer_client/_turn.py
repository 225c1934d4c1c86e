"""The turn every entry point shares: mirror the state in the table (delete what the state
removed, store what is new or edited: `_mirror` decides which), ask the worker (with the
prompt tokens the agent's model last reported), and when the stored history changed
under the state (a compaction now, a late one committed after an earlier turn stopped
waiting, or one `compact` made), bring it into the state.

These coroutines run on the client's private loop (see `_loop`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from ._codec import pair_safe, summary_compaction
from ._failopen import logger
from ._mirror import loaded, plan
from .client import MAX_TOKENS, Decision, SummarizerClient, _oneline


@dataclass(frozen=True)
class Turn:
    decision: Decision
    #: The stored history to put in the state, or None to leave the state as it is.
    history: list[BaseMessage] | None

    def update(self) -> dict[str, Any] | None:
        """The state update that applies `history`: everything replaced."""
        if self.history is None:
            return None
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *self.history]}


async def store_new(client: SummarizerClient, session_id: str, messages: Sequence[BaseMessage]) -> bool:
    """Mirrors the state in the table: first deletes the rows of messages this process
    saw the state hold and the state no longer holds (a `RemoveMessage`: a secret pasted
    by mistake is then never summarized, archived or sent to an LLM), never a row this
    process has not seen (another writer's); then stores the messages new since the last
    sync and those edited since. The first sync of a session in this process deletes
    nothing. Returns whether the table now holds everything in `messages` (False after
    a database failure, logged once)."""
    try:
        sync = plan(client._mirrors.get(session_id), messages)
        if sync.remove:
            await client._remove(session_id, sync.remove)
        if sync.store:
            await client._append(session_id, sync.store)
        # Only once both are done: after a failure the next sync deletes and stores again.
        # A removed row found gone already (archived, deleted by hand) is forgotten too.
        client._mirrors.set(session_id, sync.held)
        client.warnings.cleared("store")
        return True
    except Exception as e:  # noqa: BLE001 -- fail open
        client.warnings.warn("store", "storing messages failed: %s", _oneline(e))
        return False


def reported_tokens(messages: Sequence[BaseMessage]) -> int | None:
    """The prompt tokens the agent's model reported on its last call: the
    `usage_metadata["input_tokens"]` of the newest `AIMessage` that has one, when it is
    an int the worker takes (0 to 1,000,000,000); None otherwise (a bool, a negative or
    a float is no count, and is better left out than refused with the whole turn)."""
    for message in reversed(messages):
        if not isinstance(message, AIMessage):
            continue
        usage: Any = message.usage_metadata
        if isinstance(usage, dict) and "input_tokens" in usage:
            tokens = usage["input_tokens"]
            return tokens if type(tokens) is int and 0 <= tokens <= MAX_TOKENS else None
    return None


async def sync_and_ask(
    client: SummarizerClient,
    session_id: str,
    messages: Sequence[BaseMessage],
    *,
    threshold_tokens: int | None = None,
) -> Turn:
    """One turn: the request carries `threshold_tokens` when given, and the state's
    `reported_tokens` as `context_tokens` unless the stored history may have changed
    since the state was loaded (see `SummarizerClient._stale`): a count taken before a
    compaction would ask for another one at once. Never raises."""
    try:
        stored = await store_new(client, session_id, messages)
        tokens = None if session_id in client._stale else reported_tokens(messages)
        decision = await client._turn_starting(
            session_id, context_tokens=tokens, threshold_tokens=threshold_tokens
        )
        # Unstored messages would be lost by a replacement; the next turn catches up.
        if not stored or decision.reply is None:
            return Turn(decision, None)
        latest = decision.latest_compaction_id
        if not decision.compacted and latest == summary_compaction(list(messages)):
            client._stale.discard(session_id)
            return Turn(decision, None)
        history = await _history(client, session_id, decision)
        if history is not None:
            client._stale.discard(session_id)
            client._mirrors.set(session_id, loaded(client._mirrors.get(session_id), history))
        return Turn(decision, history)
    except Exception as e:  # noqa: BLE001 -- a bug here must not stop the agent
        client.warnings.warn("internal", "unexpected error: %r", e)
        return Turn(Decision.without_reply("transport_error"), None)


async def _history(client: SummarizerClient, session_id: str, decision: Decision) -> list[BaseMessage] | None:
    try:
        history = await client._load(session_id)
    except Exception as e:  # noqa: BLE001
        client.warnings.warn("load", "loading the compacted history failed: %s", _oneline(e))
        return None
    if not pair_safe(history):
        client.warnings.warn("pairs", "the stored history of %s is not pair-safe; state kept", session_id)
        return None
    logger.info(
        "summarizer: session %s compacted (compaction %s, %s); %d messages in state",
        session_id,
        decision.latest_compaction_id,
        decision.reason,
        len(history),
    )
    return history


async def store_run(client: SummarizerClient, session_id: str, messages: Sequence[BaseMessage]) -> None:
    """After a run: store what it added. Never raises."""
    await store_new(client, session_id, messages)
