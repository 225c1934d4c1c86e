"""Recall: what a compaction removed from a session (summarized or cleared), searched or
fetched by seq over NATS (`summarizer.recall`, see the repository's docs/protocol.md,
"Recall"). Needs only the base install; the LangChain tool is `recall_tool`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The worker's bounds, checked here too so that a bad call fails before it is sent.
MAX_LIMIT = 50
MAX_QUERY_BYTES = 1024
MAX_SEQS = 50
MAX_MAX_CHARS = 20_000


@dataclass(frozen=True)
class Recalled:
    """One archived message. `content` is at most the request's `max_chars` chars of it
    (4,000 by default), and `truncated` says whether it was cut there; fetch it by `seq`
    with a larger `max_chars` for more."""

    seq: int
    role: str
    tool_name: str | None
    tool_call_id: str | None
    content: str
    truncated: bool
    compaction_id: int
    archived_at: str


class RecallError(Exception):
    """A recall that brought nothing back. `reason` is `timeout`, `no_responders`,
    `transport_error` (NATS unreachable, or an unreadable reply), `invalid_request` (the
    worker refused the request: `message` says why) or `store_error` (the worker's
    database failed) -- the same causes as the Rust `RecallError`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def search_payload(session_id: str, query: str, limit: int, max_chars: int | None) -> bytes:
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if len(query.encode()) > MAX_QUERY_BYTES:
        raise ValueError(f"query must be at most {MAX_QUERY_BYTES} bytes")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return _payload(session_id, {"query": query, "limit": limit}, max_chars)


def fetch_payload(session_id: str, seqs: list[int], max_chars: int | None) -> bytes:
    if not seqs or len(seqs) > MAX_SEQS:
        raise ValueError(f"seqs must hold 1 to {MAX_SEQS} seqs")
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seqs):
        raise ValueError("seqs must be integers")
    return _payload(session_id, {"seqs": seqs}, max_chars)


def _payload(session_id: str, wanted: dict[str, Any], max_chars: int | None) -> bytes:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    body: dict[str, Any] = {"session_id": session_id, **wanted}
    if max_chars is not None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or not 1 <= max_chars <= MAX_MAX_CHARS:
            raise ValueError(f"max_chars must be an integer from 1 to {MAX_MAX_CHARS}")
        body["max_chars"] = max_chars
    return json.dumps(body).encode()


def read_reply(data: bytes) -> list[Recalled]:
    """The results of a reply, or the `RecallError` it stands for."""
    try:
        reply = json.loads(data)
        if not isinstance(reply, dict):
            raise ValueError("the reply is not a JSON object")
        if reply.get("status") != "ok":
            raise RecallError(
                str(reply.get("reason") or "transport_error"),
                str(reply.get("message") or f"status {reply.get('status')!r}"),
            )
        return [_recalled(r) for r in reply.get("results", [])]
    except RecallError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise RecallError("transport_error", f"unreadable reply: {e}") from e


def _recalled(row: Any) -> Recalled:
    if not isinstance(row, dict):
        raise TypeError("a result is not a JSON object")
    return Recalled(
        seq=int(row["seq"]),
        role=str(row["role"]),
        tool_name=_optional(row.get("tool_name")),
        tool_call_id=_optional(row.get("tool_call_id")),
        content=str(row["content"]),
        truncated=bool(row.get("truncated", False)),
        compaction_id=int(row["compaction_id"]),
        archived_at=str(row["archived_at"]),
    )


def _optional(value: Any) -> str | None:
    return None if value is None else str(value)


def as_text(
    query: str, results: list[Recalled], *, max_chars: int | None = None, fetched: bool = False
) -> str:
    """The results as a model reads them: one block per message, headed by its seq and
    who said it, best first. A result cut at `max_chars` (the request's; `None` for the
    worker's default) says how to read more of it: by its seq, or by its seq alone after
    a fetch of several, unless it was already cut at the most a recall returns."""
    if not results:
        return f"Nothing in the archived part of this conversation matches {query!r}."
    header = f"{len(results)} archived message{'s' if len(results) != 1 else ''} for {query!r}:"
    blocks = [header]
    for r in results:
        who = f"tool {r.tool_name}" if r.role == "tool" and r.tool_name else r.role
        blocks.append(f"[seq {r.seq}, {who}]\n{r.content}{_cut_note(r, max_chars, fetched)}")
    return "\n\n".join(blocks)


def _cut_note(r: Recalled, max_chars: int | None, fetched: bool) -> str:
    if not r.truncated:
        return ""
    if max_chars is not None and max_chars >= MAX_MAX_CHARS:
        return f"\n[... cut at {MAX_MAX_CHARS:,} chars, the most recall returns of one message]"
    if fetched:
        return f"\n[... cut; ask for seq {r.seq} alone to read more of it]"
    return f"\n[... cut; ask for seq {r.seq} to read more of it]"
