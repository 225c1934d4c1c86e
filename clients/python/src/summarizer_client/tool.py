"""`recall_tool`: the session's archive as a LangChain tool the model can call."""

# No `from __future__ import annotations`: LangChain reads the `config: RunnableConfig`
# parameter's annotation at runtime to inject the run's config instead of asking the
# model for it.

import re

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from .client import SummarizerClient
from .recall import MAX_MAX_CHARS, MAX_SEQS, RecallError, as_text, fetch_payload, search_payload

NAME = "recall_earlier_conversation"
DESCRIPTION = (
    "Search the earlier part of this conversation that was summarized or cleared away to "
    "save context, and read the original messages. Give an identifier exactly as it was "
    "written (an error code, version, host:port, file path, metric) or a few words; or "
    "'seq N' to read the archived message with that seq whole (summaries and cleared tool "
    "outputs name the seqs). Returns the matching messages, best first."
)

#: `seq 12`, `seqs 12, 14`, `seq #12`: a fetch by seq rather than a search.
_SEQ_QUERY = re.compile(r"^\s*seqs?\s*[:#]?\s*(\d+(?:\s*[,;\s]\s*#?\d+)*)\s*$", re.IGNORECASE)


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
    returns up to 20,000 chars of each.

    It never raises into the agent: on a timeout, no worker, or any other failure it
    returns a short "recall unavailable" text, and a query the worker refuses is
    answered with why, so the model can try again or go on without it."""

    async def arecall(query: str, config: RunnableConfig) -> str:
        session = _session(session_id, config)
        if session is None:
            return _NO_SESSION
        return await client.run(_answer(client, session, query, limit, max_chars))

    def recall(query: str, config: RunnableConfig) -> str:
        session = _session(session_id, config)
        if session is None:
            return _NO_SESSION
        return client.run_sync(_answer(client, session, query, limit, max_chars))

    return StructuredTool.from_function(
        func=recall, coroutine=arecall, name=NAME, description=DESCRIPTION
    )


_NO_SESSION = "recall unavailable: this run has no thread_id to find the conversation by."


def _session(session_id: str | None, config: RunnableConfig) -> str | None:
    if session_id is not None:
        return session_id
    thread = (config.get("configurable") or {}).get("thread_id")
    return None if thread is None else str(thread)


async def _answer(
    client: SummarizerClient, session: str, query: str, limit: int, max_chars: int
) -> str:
    try:
        seqs = _seqs(query)
        if seqs is not None:
            payload = fetch_payload(session, seqs, MAX_MAX_CHARS)
        else:
            payload = search_payload(session, query, limit, max_chars)
        # On the client's loop already (see `recall_tool`): its coroutine, not its method.
        return as_text(query, await client._recall(payload))
    except ValueError as e:
        return f"recall refused the query: {e}."
    except RecallError as e:
        if e.reason == "invalid_request":
            return f"recall refused the query: {e.message}."
        client.warnings.warn(f"recall_{e.reason}", "recall failed: %s", e)
        return f"recall unavailable ({e.reason}); go on without the earlier conversation."
    except Exception as e:  # noqa: BLE001 -- a tool's failure must not end the run
        client.warnings.warn("recall_error", "recall failed: %s", e)
        return "recall unavailable (transport_error); go on without the earlier conversation."


def _seqs(query: str) -> list[int] | None:
    matched = _SEQ_QUERY.match(query)
    if matched is None:
        return None
    seqs = [int(n) for n in re.findall(r"\d+", matched.group(1))]
    return list(dict.fromkeys(seqs))[:MAX_SEQS]
