"""The seed's call site, `maybe_summarize(graph, config, client)`, and the same as a node
for a hand-built `StateGraph` over `MessagesState`."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import MessagesState

from ._turn import sync_and_ask
from .client import Decision, SummarizerClient, _oneline, check_threshold_tokens


def _thread_id(config: RunnableConfig | None) -> str | None:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    return None if thread is None else str(thread)


async def maybe_summarize(
    graph: Any,
    config: RunnableConfig,
    client: SummarizerClient,
    *,
    session_id: str | None = None,
    as_node: str | None = None,
    threshold_tokens: int | None = None,
) -> Decision:
    """Before a turn of a compiled graph with a checkpointer: stores the state's new
    messages, asks the worker, and when the stored history was compacted writes it back
    with `graph.aupdate_state` (`as_node` is passed on). The ask carries the model's
    last reported prompt tokens and `threshold_tokens`, as `SummarizerMiddleware`'s
    does. Never raises: a `threshold_tokens` the worker refuses is answered
    `invalid_request` (logged once), and the turn proceeds."""
    session = session_id or _thread_id(config)
    if session is None:
        client.warnings.warn("no_session", "no session_id and no thread_id in config: skipped")
        return Decision.without_reply("transport_error")
    try:
        snapshot = await graph.aget_state(config)
        messages: list[BaseMessage] = list((snapshot.values or {}).get("messages", []))
    except Exception as e:  # noqa: BLE001 -- fail open
        client.warnings.warn("graph_state", "reading the graph state failed: %s", _oneline(e))
        return Decision.without_reply("transport_error")
    turn = await client.run(
        sync_and_ask(client, session, messages, threshold_tokens=threshold_tokens)
    )
    update = turn.update()
    if update is not None:
        try:
            await graph.aupdate_state(config, update, as_node=as_node)
        except Exception as e:  # noqa: BLE001
            client.warnings.warn("graph_state", "writing the graph state failed: %s", _oneline(e))
    return turn.decision


def summarizer_node(
    client: SummarizerClient,
    *,
    session_id: str | None = None,
    threshold_tokens: int | None = None,
) -> RunnableLambda[MessagesState, dict[str, Any]]:
    """A node for a `StateGraph` over `MessagesState` (sync or async invocation): put it
    before the model node. Its update replaces the messages when the history was
    compacted, and is empty otherwise. `threshold_tokens` as `SummarizerMiddleware`'s
    (`ValueError` when it is not an integer from 1 to 1,000,000,000)."""
    if threshold_tokens is not None:
        check_threshold_tokens(threshold_tokens)

    def session(config: RunnableConfig | None) -> str | None:
        found = session_id or _thread_id(config)
        if found is None:
            client.warnings.warn("no_session", "no session_id and no thread_id: skipped")
        return found

    async def anode(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        sid = session(config)
        if sid is None:
            return {}
        turn = await client.run(
            sync_and_ask(client, sid, list(state["messages"]), threshold_tokens=threshold_tokens)
        )
        return turn.update() or {}

    def node(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        sid = session(config)
        if sid is None:
            return {}
        turn = client.run_sync(
            sync_and_ask(client, sid, list(state["messages"]), threshold_tokens=threshold_tokens)
        )
        return turn.update() or {}

    return RunnableLambda(node, afunc=anode, name="summarizer")
