"""`SummarizerClient`: asks the worker fleet before a turn, and mirrors LangChain messages
in the `messages` table (in Postgres, or in the SQLite file of a one-host deployment: see
`_store`). Nothing here raises to the agent on the turn path: whatever fails, the answer
is "proceed", and the cause is logged once.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import unicodedata
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as Nats

from ._failopen import Warnings
from ._loop import LoopThread
from ._mirror import DEFAULT_SESSIONS, Mirrors
from ._store import Store, backend, backend_name, check_url, open_store
from .jobs import (
    DEFAULT_SUBJECT_PREFIX,
    MSG_ID_HEADER,
    REPLY_TO_HEADER,
    JobNotStored,
    PublishedJob,
    check_subject,
    job_payload,
    job_subject,
)
from .recall import Recalled, RecallError, fetch_payload, read_reply, search_payload

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

T = TypeVar("T")

#: Between attempts to reach NATS or the database after they could not be reached.
RECONNECT_INTERVAL = 2
#: The least `compact` waits for its reply by default: a compaction waits for an LLM to
#: write the summary, which takes seconds to minutes, not the turn's few seconds.
COMPACT_TIMEOUT = 120.0
#: The worker's limit on a compaction's `instructions`, in chars (Unicode scalar values).
MAX_INSTRUCTIONS_CHARS = 4_000
#: The worker's bounds on `threshold_tokens` (1 to this) and `context_tokens` (0 to this).
MAX_TOKENS = 1_000_000_000
#: Who wrote a compaction's `instructions`, as the request's `instructions_from` says: the
#: agent's own model (whose text a tool output can steer), or an operator.
InstructionsFrom = Literal["agent", "operator"]
INSTRUCTIONS_FROM: tuple[InstructionsFrom, ...] = ("agent", "operator")


@dataclass(frozen=True)
class Decision:
    """What the agent learns before its turn. Every decision means "go on"; only
    `compacted` means the stored history changed.

    `reason` is the reply's reason, or why there was none: `timeout`, `no_responders`
    (no worker running) or `transport_error` (NATS or the database unreachable, an
    unreadable reply, or any error in this package) -- the same strings as the Rust
    `TurnClient`; and `not_overflow` from `maybe_summarize(..., overflow=error)` for an
    error that is not a context overflow.
    """

    compacted: bool
    reason: str
    reply: dict[str, Any] | None = None

    @property
    def latest_compaction_id(self) -> int | None:
        """The compaction in force when the worker answered, if it did."""
        value = (self.reply or {}).get("latest_compaction_id")
        return value if isinstance(value, int) else None

    @classmethod
    def without_reply(cls, reason: str) -> Decision:
        return cls(compacted=False, reason=reason, reply=None)


class SummarizerClient:
    """An async client of the summarizer worker fleet and its `messages` table.

    `database_url` defaults to `$DATABASE_URL`: the worker's Postgres
    (`postgresql://...`), or the SQLite file a worker on the same host keeps its sessions
    in (`sqlite:///path/to/file.db`; an in-memory `sqlite::memory:` raises `ValueError`,
    as the worker could not share it). Without one, `append`/`load` (and so the
    LangChain integrations) are disabled with a warning. Connections are opened by
    `connect()` (or on first use) and live on a private event-loop thread, so one client
    serves async and sync callers alike. `publish_job` publishes durable jobs to the
    fleet's JetStream work queue; `recall` and `fetch` read what compactions archived, on
    `recall_subject`; `compact` compacts a session now, whatever its size.

    The LangChain integrations keep the table following each session's state: a sync
    deletes the rows of messages this client saw in the state and the state no longer
    holds, never a row it has not seen (another writer's). It remembers that for the
    `mirrored_sessions` sessions synced most recently (see `_mirror`).
    """

    def __init__(
        self,
        nats_url: str = "nats://127.0.0.1:4222",
        database_url: str | None = None,
        subject: str = "summarizer.turn.starting",
        timeout: float = 5.0,
        recall_subject: str = "summarizer.recall",
        *,
        mirrored_sessions: int = DEFAULT_SESSIONS,
    ) -> None:
        self.nats_url = nats_url
        self.database_url = database_url or os.environ.get("DATABASE_URL")
        if self.database_url:
            check_url(self.database_url)
        self.subject = subject
        self.recall_subject = recall_subject
        self.timeout = timeout
        self.warnings = Warnings()
        self._loop = LoopThread("summarizer-client")
        self._nats: Nats | None = None
        self._store: Store | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False
        # Per session, what its state held at this process's last sync (ids and
        # fingerprints): a sync stores only the new and the edited messages, and deletes
        # only the rows of those the state held then and no longer holds.
        self._mirrors = Mirrors(mirrored_sessions)
        # Sessions whose stored history may have changed since a state last loaded it: a
        # compaction was answered (`compact` makes one no turn brings in at once), or an
        # ask timed out while one may be under way. The `context_tokens` their states
        # report measure a longer history than the stored one, so `_turn` does not send
        # them until a turn has brought the state up to date.
        self._stale: set[str] = set()

    def __repr__(self) -> str:
        # The database URL may hold a password: never shown.
        return f"SummarizerClient(nats_url={self.nats_url!r}, subject={self.subject!r})"

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self) -> None:
        """Connects to NATS and the database. Never raises: what cannot be reached now is
        retried in the background, and turns proceed unchanged meanwhile."""
        await self._loop.run(self._connect())

    async def close(self) -> None:
        await self._loop.run(self._close())
        self._loop.stop()

    def connect_sync(self) -> None:
        self._loop.run_sync(self._connect())

    def close_sync(self) -> None:
        self._loop.run_sync(self._close())
        self._loop.stop()

    async def __aenter__(self) -> SummarizerClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the public calls ------------------------------------------------------------

    async def turn_starting(
        self,
        session_id: str,
        *,
        context_tokens: int | None = None,
        threshold_tokens: int | None = None,
    ) -> Decision:
        """Asks the fleet whether `session_id` needs compacting, waiting at most
        `timeout` seconds. Never raises.

        `context_tokens` is the prompt's size in tokens as the agent's model reported it
        on its last call (0 to 1,000,000,000); `threshold_tokens` (1 to 1,000,000,000)
        makes the session over its threshold when its tokens pass it, as well as when
        its chars pass `threshold_chars`. Without `context_tokens` the worker estimates
        the tokens from the chars. A value out of those bounds is not checked here: the
        worker answers `invalid_request` (and the turn proceeds, uncompacted)."""
        return await self._loop.run(
            self._turn_starting(
                session_id, context_tokens=context_tokens, threshold_tokens=threshold_tokens
            )
        )

    async def compact(
        self,
        session_id: str,
        instructions: str | None = None,
        *,
        keep_chars: int | None = None,
        timeout: float | None = None,
        instructions_from: InstructionsFrom = "operator",
        overflow: bool = False,
    ) -> Decision:
        """Compacts `session_id` now, even below its threshold (`"force": true`), as a
        turn over its threshold would be: its older part is summarized, keeping at least
        `keep_chars` of its newest messages (this request's keep, clamped to the
        worker's bounds). `instructions` (at most 4,000 chars, no control characters but
        newlines) tell the summarizer what to focus on or keep; the usage event records
        them, and `"forced": true`. Pinned messages stay, as in any compaction.
        `instructions_from` says who wrote them: `"operator"` (this call's caller, the
        default) or `"agent"` (the agent's own model, as `compact_tool` sends: the worker
        gives them less authority, as a request about focus only).

        Waits at most `timeout` seconds for the reply, by default the client's `timeout`
        but at least 2 minutes: the worker calls an LLM. The other skip rules hold: the
        decision's reason may be `too_few_turns`, `within_keep` (the whole history fits
        the keep: the reply's `session_chars` and `keep_chars` say by how much; ask
        again with a smaller `keep_chars`), `no_safe_boundary`, `nothing_to_compact`,
        `backing_off`, `disabled`, or `in_progress` (another worker is compacting the
        session). Like `turn_starting` it never raises for the
        fleet's sake: a timeout, no worker or a transport failure is a decision without
        a reply, and a request the worker refuses is reason `invalid_request` (the
        reply's `message` says why); a compaction that commits after the timeout is
        picked up by the next turn as any late one is. Raises `ValueError` only for
        `instructions` longer than 4,000 chars or an `instructions_from` other than
        `"agent"` or `"operator"`.

        `overflow=True` says the compaction answers a model call the provider refused as
        too long (`"overflow": true`): the usage event and the worker's metrics count it
        apart. `SummarizerMiddleware` and `maybe_summarize(..., overflow=error)` send it
        for you; pass it when you compact after a context overflow yourself."""
        return await self._loop.run(
            self._compact(
                session_id, instructions, keep_chars, timeout, instructions_from, overflow
            )
        )

    def compact_sync(
        self,
        session_id: str,
        instructions: str | None = None,
        *,
        keep_chars: int | None = None,
        timeout: float | None = None,
        instructions_from: InstructionsFrom = "operator",
        overflow: bool = False,
    ) -> Decision:
        """`compact` for sync programs: blocks until the worker answers or the wait ends."""
        return self._loop.run_sync(
            self._compact(
                session_id, instructions, keep_chars, timeout, instructions_from, overflow
            )
        )

    def _compact_wait(self, timeout: float | None) -> float:
        """How long `compact` waits for its reply: `timeout`, or by default the client's
        `timeout` but at least `COMPACT_TIMEOUT` (2 minutes)."""
        return max(self.timeout, COMPACT_TIMEOUT) if timeout is None else timeout

    async def append(self, session_id: str, messages: Sequence[BaseMessage]) -> int:
        """Stores `messages` in order, each once per session by its id (messages without
        one are always stored). A message stored before with other text (or role, tool
        calls, call id, or pin: `additional_kwargs["summarizer_pinned"]`) updates its
        row: an edit in place is mirrored. One that a
        compaction archived, sent again unchanged, is not stored again; a new message
        that only reuses an archived message's id is. Returns how many rows were written.

        Raises on database errors (it is not on the fail-open turn path)."""
        return await self._loop.run(self._append(session_id, list(messages)))

    async def load(self, session_id: str) -> list[BaseMessage]:
        """The session's stored history, oldest first. Raises on database errors."""
        return await self._loop.run(self._load(session_id))

    async def remove(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """Deletes the session's rows of these message ids, whoever stored them, and
        returns the ids it deleted: for a removal no sync of this process can see (a
        message an admin script removed from a checkpoint while no agent process ran,
        say). The worker's summaries (ids starting `summarizer-`) are never deleted, and
        a message a compaction archived already stays in the archive. Remove the
        message from the state too, or a sync may store it again. Raises on database
        errors."""
        return await self._loop.run(self._remove(session_id, list(message_ids)))

    async def publish_job(
        self,
        session_id: str,
        *,
        msg_id: str | None = None,
        reply_to: str | None = None,
        threshold_chars: int | None = None,
        keep_chars: int | None = None,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
    ) -> PublishedJob:
        """Publishes a durable job asking to compact `session_id` if it is over its
        threshold, to `job_subject(session_id, subject_prefix)`, and waits at most
        `timeout` seconds for the stream's acknowledgement: once this returns, the job is
        stored and will be processed (or dead-lettered) by a worker with
        `TRANSPORT=jetstream` or `both`, even one started later.

        `msg_id` is the job's `Nats-Msg-Id`: give one (such as `"<batch>:<session>"`) to
        make retries of the same publish safe; a fresh unique one otherwise. `reply_to`
        is a subject the worker sends the job's reply to (the same JSON a
        `turn_starting` request gets). `threshold_chars`/`keep_chars` are the request's
        own limits, which the worker clamps to its bounds.

        Unlike the turn path, this does not fail open: raises `JobNotStored` when no
        stream takes the subject, NATS is not connected or does not answer, or the
        stream refuses the job; `ValueError` for a job the worker would reject."""
        return await self._loop.run(
            self._publish_job(
                session_id, msg_id, reply_to, threshold_chars, keep_chars, subject_prefix
            )
        )

    def publish_job_sync(
        self,
        session_id: str,
        *,
        msg_id: str | None = None,
        reply_to: str | None = None,
        threshold_chars: int | None = None,
        keep_chars: int | None = None,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
    ) -> PublishedJob:
        """`publish_job` for sync programs: blocks until the job is stored (or raises)."""
        return self._loop.run_sync(
            self._publish_job(
                session_id, msg_id, reply_to, threshold_chars, keep_chars, subject_prefix
            )
        )

    async def recall(
        self, session_id: str, query: str, limit: int = 5, *, max_chars: int | None = None
    ) -> list[Recalled]:
        """The archived messages of `session_id` (summarized or cleared away) that best
        match `query`, at most `limit` (up to 50), best first: an identifier as written
        (`E-5417`, `10.43.7.217:6432`) finds the messages holding it; words find the
        messages with the most of them, the newest first among equals. Each `content` is
        at most `max_chars` chars (4,000 by default, up to 20,000).

        Raises `ValueError` for arguments the worker would refuse, and `RecallError` when
        no answer comes within `timeout` seconds or the worker fails; the turn path's
        fail-open does not apply, as the caller asked for the data."""
        payload = search_payload(session_id, query, limit, max_chars)
        return await self._loop.run(self._recall(payload))

    async def fetch(
        self, session_id: str, seqs: Sequence[int], *, max_chars: int | None = None
    ) -> list[Recalled]:
        """The archived messages of `session_id` with these seqs (up to 50), in seq order;
        seqs that are not archived (or were pruned) are left out. Raises as `recall`."""
        payload = fetch_payload(session_id, list(seqs), max_chars)
        return await self._loop.run(self._recall(payload))

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Runs one of this client's coroutines from sync code (internal), for at most
        `timeout` seconds if given (then `TimeoutError`)."""
        return self._loop.run_sync(coro, timeout)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs a coroutine on the client's loop from any other loop (internal)."""
        return await self._loop.run(coro)

    # -- on the private loop ---------------------------------------------------------

    async def _connect(self) -> None:
        self._closed = False
        await self._try_connect()
        if (self._nats is None or self._store is None) and self._connecting is None:
            self._connecting = asyncio.create_task(self._keep_connecting())

    async def _ensure_connected(self) -> None:
        if self._nats is None and self._store is None and self._connecting is None:
            await self._connect()

    async def _try_connect(self) -> None:
        if self._nats is None:
            nc = Nats()
            try:
                # nats-py retries an initial connect forever when reconnects are
                # unlimited: bounded here, and retried by _keep_connecting.
                await asyncio.wait_for(
                    nc.connect(
                        servers=[self.nats_url],
                        connect_timeout=max(1, int(self.timeout)),
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=RECONNECT_INTERVAL,
                        allow_reconnect=True,
                        error_cb=self._nats_error,
                    ),
                    timeout=max(1.0, self.timeout),
                )
                self._nats = nc
                self.warnings.cleared("nats_unavailable")
            except Exception as e:  # noqa: BLE001 -- any failure means "not now"
                await _close_quietly(nc)
                self.warnings.warn(
                    "nats_unavailable", "NATS unreachable at %s: %s", self.nats_url, _oneline(e)
                )
        if self._store is None and self.database_url:
            # The cause is named for the backend: `postgres` or `sqlite`.
            cause = backend(self.database_url)
            try:
                self._store = await open_store(self.database_url, self.timeout)
                self.warnings.cleared(cause)
            except Exception as e:  # noqa: BLE001
                self.warnings.warn(
                    cause, "%s unreachable: %s", backend_name(self.database_url), _oneline(e)
                )
        elif not self.database_url:
            self.warnings.warn(
                "no_database", "no database_url (or DATABASE_URL): messages are not stored"
            )

    async def _keep_connecting(self) -> None:
        try:
            while not self._closed and (self._nats is None or (self._store is None and self.database_url)):
                await asyncio.sleep(RECONNECT_INTERVAL)
                await self._try_connect()
        finally:
            self._connecting = None

    async def _nats_error(self, error: Exception) -> None:
        self.warnings.warn("nats_error", "NATS connection error: %s", error)

    async def _close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        if self._nats is not None:
            await _close_quietly(self._nats)
            self._nats = None
        if self._store is not None:
            await self._store.close()
            self._store = None

    async def _turn_starting(
        self,
        session_id: str,
        *,
        context_tokens: int | None = None,
        threshold_tokens: int | None = None,
    ) -> Decision:
        fields: dict[str, Any] = {}
        if context_tokens is not None:
            fields["context_tokens"] = context_tokens
        if threshold_tokens is not None:
            fields["threshold_tokens"] = threshold_tokens
        return await self._ask(session_id, fields, self.timeout)

    async def _compact(
        self,
        session_id: str,
        instructions: str | None,
        keep_chars: int | None,
        timeout: float | None,
        instructions_from: InstructionsFrom = "operator",
        overflow: bool = False,
    ) -> Decision:
        if instructions_from not in INSTRUCTIONS_FROM:
            raise ValueError(
                f'instructions_from must be "agent" or "operator", not {instructions_from!r}'
            )
        # Sent with or without instructions: the worker reads it only with them, and a
        # request that says who asks is plain to read in a capture.
        fields: dict[str, Any] = {"force": True, "instructions_from": instructions_from}
        if instructions is not None:
            # Only the length is checked here, to name the limit; the worker checks the
            # rest (a type or a control character) and answers `invalid_request`.
            if isinstance(instructions, str) and len(instructions) > MAX_INSTRUCTIONS_CHARS:
                raise ValueError(
                    f"instructions must be at most {MAX_INSTRUCTIONS_CHARS:,} chars, "
                    f"not {len(instructions):,}"
                )
            fields["instructions"] = instructions
        if keep_chars is not None:
            fields["keep_chars"] = keep_chars
        if overflow:
            fields["overflow"] = True
        return await self._ask(session_id, fields, self._compact_wait(timeout))

    async def _ask(self, session_id: str, fields: dict[str, Any], timeout: float) -> Decision:
        """The turn-starting request with `fields` besides the session and request ids,
        answered within `timeout` seconds. Never raises."""
        try:
            await self._ensure_connected()
            nc = self._nats
            # While disconnected a request would wait out its timeout in a buffer; the
            # agent is better served by proceeding now (as the Rust TurnClient does).
            if nc is None or not nc.is_connected:
                self.warnings.warn("nats_unavailable", "not connected to NATS at %s", self.nats_url)
                return Decision.without_reply("transport_error")
            payload = json.dumps(
                {"session_id": session_id, "request_id": secrets.token_hex(4), **fields}
            ).encode()
            message = await nc.request(self.subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError:
            self.warnings.warn("no_responders", "no worker is serving %s", self.subject)
            return Decision.without_reply("no_responders")
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            # The worker may be compacting the session still: see `_stale`.
            self._stale.add(session_id)
            self.warnings.warn("timeout", "no answer within %ss", timeout)
            return Decision.without_reply("timeout")
        except Exception as e:  # noqa: BLE001 -- fail open on anything
            self.warnings.warn("transport_error", "asking the worker failed: %s", _oneline(e))
            return Decision.without_reply("transport_error")
        for cause in ("nats_unavailable", "no_responders", "timeout", "transport_error"):
            self.warnings.cleared(cause)
        try:
            reply = json.loads(message.data)
            if not isinstance(reply, dict):
                raise ValueError("the reply is not a JSON object")
        except ValueError as e:
            self.warnings.warn("unreadable_reply", "unreadable reply: %s", e)
            return Decision.without_reply("transport_error")
        decision = Decision(
            compacted=reply.get("status") == "compacted",
            reason=str(reply.get("reason", "")),
            reply=reply,
        )
        if reply.get("status") == "rejected":
            # A bad setting (a `threshold_tokens` out of bounds, say) would otherwise
            # turn compaction off without a word.
            self.warnings.warn(
                "rejected", "the worker rejected the request: %s", reply.get("message")
            )
        else:
            self.warnings.cleared("rejected")
        if decision.compacted:
            self._stale.add(session_id)
        return decision

    async def _publish_job(
        self,
        session_id: str,
        msg_id: str | None,
        reply_to: str | None,
        threshold_chars: int | None,
        keep_chars: int | None,
        subject_prefix: str,
    ) -> PublishedJob:
        check_subject("subject_prefix", subject_prefix)
        if reply_to is not None:
            check_subject("reply_to", reply_to)
        key = uuid.uuid4().hex if msg_id is None else msg_id
        if not key or any(unicodedata.category(c) == "Cc" for c in key):
            raise ValueError("msg_id must be a non-empty string without control characters")
        payload = job_payload(session_id, secrets.token_hex(4), threshold_chars, keep_chars)
        subject = job_subject(session_id, subject_prefix)
        headers = {MSG_ID_HEADER: key}
        if reply_to is not None:
            headers[REPLY_TO_HEADER] = reply_to

        def not_stored(reason: str) -> JobNotStored:
            return JobNotStored(reason, subject=subject, msg_id=key)

        await self._ensure_connected()
        nc = self._nats
        # While disconnected a publish would wait in a buffer and might go out after
        # this has given up: refused now instead, and the caller decides.
        if nc is None or not nc.is_connected:
            raise not_stored(f"not connected to NATS at {self.nats_url}")
        try:
            ack = await nc.jetstream(timeout=self.timeout).publish(
                subject, payload, headers=headers
            )
        except nats.js.errors.NoStreamResponseError:
            raise not_stored(
                f"no stream takes {subject} (no worker with TRANSPORT=jetstream or both "
                f"and JETSTREAM_SUBJECT_PREFIX={subject_prefix} has created it)"
            ) from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError) as e:
            raise not_stored(
                f"no acknowledgement within {self.timeout}s (it may be stored all the "
                "same: publish it again with the same msg_id)"
            ) from e
        except Exception as e:  # noqa: BLE001 -- every failure is reported, never dropped
            raise not_stored(_oneline(e)) from e
        return PublishedJob(msg_id=key, sequence=int(ack.seq), duplicate=bool(ack.duplicate))

    async def _recall(self, payload: bytes) -> list[Recalled]:
        await self._ensure_connected()
        nc = self._nats
        if nc is None or not nc.is_connected:
            raise RecallError("transport_error", f"not connected to NATS at {self.nats_url}")
        try:
            message = await nc.request(self.recall_subject, payload, timeout=self.timeout)
        except nats.errors.NoRespondersError:
            raise RecallError("no_responders", f"no worker is serving {self.recall_subject}") from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            raise RecallError("timeout", f"no answer within {self.timeout}s") from None
        except Exception as e:  # noqa: BLE001 -- every failure is the caller's typed error
            raise RecallError("transport_error", _oneline(e)) from e
        return read_reply(message.data)

    def _require_store(self) -> Store:
        if self._store is None:
            name = backend_name(self.database_url) if self.database_url else "the database"
            raise ConnectionError(f"{name} is not connected")
        return self._store

    async def _append(self, session_id: str, messages: list[BaseMessage]) -> int:
        from ._codec import to_row

        if not messages:
            return 0
        await self._ensure_connected()
        # One row per id, as the table holds one: the last version of a message wins.
        latest: dict[str, int] = {m.id: i for i, m in enumerate(messages) if m.id}
        batch = [m for i, m in enumerate(messages) if not m.id or latest[m.id] == i]
        rows = [to_row(m) for m in batch]
        return await self._require_store().append_rows(session_id, [r.as_json() for r in rows])

    async def _remove(self, session_id: str, message_ids: list[str]) -> list[str]:
        """Deletes the session's rows of `message_ids` (see `_store.Store.remove_rows`)."""
        if not message_ids:
            return []
        await self._ensure_connected()
        return await self._require_store().remove_rows(session_id, message_ids)

    async def _seqs_of(self, session_id: str, message_ids: list[str]) -> dict[str, int]:
        """The seqs of the session's live rows of these message ids (those stored)."""
        if not message_ids:
            return {}
        await self._ensure_connected()
        return await self._require_store().seqs_of(session_id, message_ids)

    async def _load(self, session_id: str) -> list[BaseMessage]:
        from ._codec import from_row

        await self._ensure_connected()
        rows = await self._require_store().load_rows(session_id)
        return [from_row(*row) for row in rows]


def check_threshold_tokens(value: int) -> None:
    """Raises `ValueError` for a `threshold_tokens` the worker would refuse."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise ValueError(
            f"threshold_tokens must be an integer from 1 to {MAX_TOKENS:,}, got {value!r}"
        )


async def _close_quietly(nc: Nats) -> None:
    try:
        await asyncio.wait_for(nc.close(), timeout=2.0)
    except Exception:  # noqa: BLE001 -- closing what is already broken
        pass


def _oneline(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
