"""What a client remembers of each session's mirror, and what a sync deletes and stores.

The table may hold rows this process never saw: another agent on the same thread, in
another process with a checkpoint of its own, stores its messages there too, and a
process restarted from a checkpoint older than the table finds the rows written since.
A state that does not hold such a row has not removed it. So a sync deletes only the rows
of messages this process saw the session's state hold at an earlier sync and that the
state no longer holds: a `RemoveMessage` (`REMOVE_ALL_MESSAGES` included). The first sync
of a session in a process deletes nothing; it only learns what the state holds.

The memory is per session, not per state: one client assumes one state per session. Two
agents with states of their own on one thread (two checkpointers) need a client each, as
two processes have.

It is bounded: the sessions synced most recently, at most `capacity` of them, each with
the ids and fingerprints of what its state held at the last sync (a compacted state is
small). A session forgotten is synced as a first sync is: nothing deleted, every message
stored again where it differs (one statement that mostly writes nothing).

Everything here runs on the client's loop (see `_loop`): no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

#: The prefix of the ids of the rows the worker wrote (summaries) and of rows written
#: with plain SQL, given on load: a sync never deletes them (`_store` spares them too).
SPARED_PREFIX = "summarizer-"
#: How many sessions a client remembers by default (see `Mirrors`).
DEFAULT_SESSIONS = 1_000


@dataclass(frozen=True)
class Sync:
    """What one sync does: delete the rows of `remove`, store `store`, then remember
    `held`, what the state holds now, as the session's mirror."""

    remove: list[str]
    store: list[BaseMessage]
    held: dict[str, int]


def held_by(messages: Sequence[BaseMessage]) -> dict[str, int]:
    """The ids of `messages` with their fingerprints; for an id given twice, the last
    message's (the one `append` stores)."""
    from ._codec import fingerprint

    return {m.id: fingerprint(m) for m in messages if m.id}


def plan(held: dict[str, int] | None, messages: Sequence[BaseMessage]) -> Sync:
    """The sync of a state holding `messages`, when the process last saw its session's
    state hold `held` (None: it has not seen it). Removes what was held and is no longer
    (never a summary's row, nor one this process has not seen); stores what is new or
    differs from what was held (all of it, when nothing was)."""
    now = held_by(messages)
    if held is None:
        return Sync(remove=[], store=[m for m in messages if m.id], held=now)
    remove = [i for i in held if i not in now and not i.startswith(SPARED_PREFIX)]
    store = [m for m in messages if m.id and held.get(m.id) != now[m.id]]
    return Sync(remove=remove, store=store, held=now)


def loaded(held: dict[str, int] | None, history: Sequence[BaseMessage]) -> dict[str, int]:
    """What to remember once a loaded `history` replaces a state that held `held`: the
    history's messages that state held (and the summaries, never deleted anyway). The
    others, another writer's, are remembered only when a sync sees them in the state: a
    history that never reaches it (a failed `aupdate_state`, a checkpoint that could not
    be saved) must not make the next sync delete rows the state never held."""
    seen = held or {}
    return {
        i: f for i, f in held_by(history).items() if i in seen or i.startswith(SPARED_PREFIX)
    }


class Mirrors:
    """Per session, what its state held at this process's last sync, for at most
    `capacity` sessions: the least recently synced is forgotten first."""

    def __init__(self, capacity: int = DEFAULT_SESSIONS) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"mirrored_sessions must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self._held: OrderedDict[str, dict[str, int]] = OrderedDict()

    def get(self, session: str) -> dict[str, int] | None:
        held = self._held.get(session)
        if held is not None:
            self._held.move_to_end(session)
        return held

    def set(self, session: str, held: dict[str, int]) -> None:
        self._held[session] = held
        self._held.move_to_end(session)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def __len__(self) -> int:
        return len(self._held)
