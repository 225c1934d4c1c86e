"""Compact and retry: what a context overflow does to a session, in order. `_overflow`
decides (the keep, what to clip); this sequences the I/O, on the client's private loop
(see `_loop`).

1. Bring the table up to date with the state (`_turn.store_new`): a compaction of a table
   that lacks the newest messages, loaded into the state, would drop them.
2. Ask the worker for forced compactions marked `"overflow": true`, at most
   `_overflow.MAX_ASKS` requests and `MAX_COMPACTIONS` compactions, halving the keep
   while the worker answers that the history fits it (`within_keep`), finds no turn to
   cut at (`no_safe_boundary`) or only a summary before the cut (`nothing_to_compact`),
   or compacts to a history still over the target, down to the newest turn.
3. Load the compacted history (pair-checked) for the state, and for the retried call,
   with its largest text tool outputs clipped when it is still over.

No reply from the worker (none running, a timeout, NATS down) and nothing changes: the
caller raises the model's error, as it would have without this package. Never raises
itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage, ToolMessage

from ._mirror import loaded
from ._overflow import (
    MAX_ASKS,
    MAX_COMPACTIONS,
    Target,
    clip_outputs,
    message_chars,
    smaller_keep,
)
from ._turn import _history, store_new
from .client import Decision, SummarizerClient, _oneline


@dataclass(frozen=True)
class Recovery:
    """What a refusal led to. `history` is the stored history after the compaction, for
    the state (None when nothing was compacted); `messages` is what the retried call
    gets: that history (or the request's messages) with the outputs named in `clipped`
    clipped. `decision` is the compaction's answer, or the worker's last refusal."""

    decision: Decision
    history: list[BaseMessage] | None
    messages: list[BaseMessage]
    clipped: list[str] = field(default_factory=list)
    keep: int = 0

    @property
    def changed(self) -> bool:
        """Whether the retried call gets anything else than the call refused."""
        return self.history is not None or bool(self.clipped)

    def done(self) -> str:
        """What changed, for the log."""
        done = []
        if self.history is not None:
            done.append(
                f"compaction {self.decision.latest_compaction_id} (keep {self.keep:,} chars) "
                f"left {len(self.history)} messages"
            )
        if self.clipped:
            done.append(f"{len(self.clipped)} tool output(s) clipped for the call")
        return " and ".join(done) or "nothing changed"

    def why_not(self) -> str:
        """Why nothing changed, for the log."""
        if self.decision.reply is None:
            return f"no answer from the worker: {self.decision.reason}"
        return f"the worker answered {self.decision.reason}"


async def recover(
    client: SummarizerClient,
    session_id: str,
    state: Sequence[BaseMessage],
    request: Sequence[BaseMessage],
    goal: Target,
    *,
    clip: bool,
) -> Recovery:
    """Compacts `session_id`, whose `state` the model refused (as the call's `request`
    messages), towards `goal`; clips the retried call's outputs when `clip`. Nothing
    changes (`Recovery.changed` is false) when the table could not be brought up to date
    or the worker gave no answer: its decision says why. Never raises."""
    unchanged = Recovery(Decision.without_reply("transport_error"), None, list(request))
    try:
        if not await store_new(client, session_id, state):
            return unchanged
        decision, history, keep = await _compact_to_fit(client, session_id, goal)
        if decision.reply is None and history is None:
            return Recovery(decision, None, list(request), keep=keep)
        messages = list(history if history is not None else request)
        clipped: list[str] = []
        if clip:
            messages, clipped = await _clip(client, session_id, messages, goal.budget)
        if history is not None:
            client._mirrors.set(session_id, loaded(client._mirrors.get(session_id), history))
        return Recovery(decision, history, messages, clipped, keep)
    except Exception as e:  # noqa: BLE001 -- a bug here must not hide the model's error
        client.warnings.warn("internal", "unexpected error after a context overflow: %r", e)
        return unchanged


async def _compact_to_fit(
    client: SummarizerClient, session_id: str, goal: Target
) -> tuple[Decision, list[BaseMessage] | None, int]:
    """The forced compactions: the decision to report (the one that compacted, if one
    did), the history it left (loaded, pair-safe), and the keep it ran with."""
    keep = goal.keep
    compacted: tuple[Decision, list[BaseMessage], int] | None = None
    compactions = 0
    decision = Decision.without_reply("transport_error")
    for _ in range(MAX_ASKS):
        decision = await client._compact(session_id, None, keep, None, overflow=True)
        if decision.reply is None:
            break
        if decision.compacted:
            compactions += 1
            history = await _history(client, session_id, decision)
            if history is None:
                break
            compacted = (decision, history, keep)
            if sum(message_chars(m) for m in history) <= goal.budget or compactions >= MAX_COMPACTIONS:
                break
            smaller = smaller_keep(keep, goal.floor, None)
        elif decision.reason in ("within_keep", "no_safe_boundary", "nothing_to_compact"):
            smaller = smaller_keep(keep, goal.floor, decision.reply.get("session_chars"))
        else:
            break
        if smaller is None:
            break
        keep = smaller
    if compacted is not None:
        return compacted
    return decision, None, keep


async def _clip(
    client: SummarizerClient, session_id: str, messages: list[BaseMessage], budget: int
) -> tuple[list[BaseMessage], list[str]]:
    ids = [str(m.id) for m in messages if isinstance(m, ToolMessage) and m.id]
    try:
        seqs = await client._seqs_of(session_id, ids)
    except Exception as e:  # noqa: BLE001 -- the note names the message id instead
        client.warnings.warn("load", "reading the seqs of tool outputs failed: %s", _oneline(e))
        seqs = {}
    return clip_outputs(messages, budget, seqs)
