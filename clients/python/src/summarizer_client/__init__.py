"""summarizer_client: a drop-in for LangGraph and LangChain agents that keeps their
conversations inside the context window with the summarizer worker fleet.

`SummarizerClient`, `Decision`, compaction on demand (`SummarizerClient.compact`), the
durable jobs (`SummarizerClient.publish_job`, `job_subject`, `PublishedJob`,
`JobNotStored`) and recall of what compactions archived (`SummarizerClient.recall`/`fetch`,
`Recalled`, `RecallError`) need only the base install; `SummarizerMiddleware`,
`maybe_summarize`, `summarizer_node`, `recall_tool` and `compact_tool` need the
`[langchain]` extra.

The messages live where the workers keep their sessions: their Postgres
(`database_url="postgresql://..."`), or, for a deployment on one host, their SQLite file
(`database_url="sqlite:///path/to/file.db"`, read with the standard library's `sqlite3`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import Decision, SummarizerClient
from .jobs import JobNotStored, PublishedJob, job_subject
from .recall import Recalled, RecallError

if TYPE_CHECKING:
    from .graph import maybe_summarize, summarizer_node
    from .middleware import SummarizerMiddleware
    from .tool import compact_tool, recall_tool

__all__ = [
    "Decision",
    "JobNotStored",
    "PublishedJob",
    "RecallError",
    "Recalled",
    "SummarizerClient",
    "SummarizerMiddleware",
    "compact_tool",
    "job_subject",
    "maybe_summarize",
    "recall_tool",
    "summarizer_node",
]


def __getattr__(name: str) -> Any:
    # The LangChain parts import langchain lazily: the base install works without it.
    if name == "SummarizerMiddleware":
        from .middleware import SummarizerMiddleware

        return SummarizerMiddleware
    if name in ("recall_tool", "compact_tool"):
        from . import tool

        return getattr(tool, name)
    if name in ("maybe_summarize", "summarizer_node"):
        from . import graph

        return getattr(graph, name)
    raise AttributeError(name)
