"""The seed's call site, `maybe_summarize(graph, config, client)`, and the same as a node
for a hand-built `StateGraph` over `MessagesState`; and, for both, what to do when the
model refuses the prompt as too long: `maybe_summarize(..., overflow=error)` in the
caller's `except`, then run the graph again from where it stopped."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import MessagesState
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from ._failopen import logger
from ._overflow import is_overflow, reported, target
from ._recover import recover
from ._turn import sync_and_ask
from .client import Decision, SummarizerClient, _oneline, check_threshold_tokens

#: `maybe_summarize(..., overflow=error)`'s reason when `error` is not a context overflow.
NOT_OVERFLOW = "not_overflow"


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
    overflow: BaseException | None = None,
) -> Decision:
    """Before a turn of a compiled graph with a checkpointer: stores the state's new
    messages, asks the worker, and when the stored history was compacted writes it back
    with `graph.aupdate_state` (`as_node` is passed on). The ask carries the model's
    last reported prompt tokens and `threshold_tokens`, as `SummarizerMiddleware`'s
    does. Never raises: a `threshold_tokens` the worker refuses is answered
    `invalid_request` (logged once), and the turn proceeds.

    `overflow`: the error a model call of the graph raised. When it is a context
    overflow (`ContextOverflowError`, or OpenAI's and Anthropic's own), the session is
    compacted to fit instead (forced, `"overflow": true`, with a keep sized from the
    limit the error reports, halved while the worker finds the history within it) and
    the compacted history written into the state: the decision is `compacted`, and the
    caller runs the graph again from where it stopped (`graph.ainvoke(None, config)`),
    once. Otherwise its `compacted` is false (reason `not_overflow` for another error,
    else the worker's refusal or why there was no reply), and the caller raises the
    error. Nothing is clipped here: a tool output too large on its own is the worker's
    to evict (`TOOL_OUTPUT_MAX_CHARS`)."""
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
    if overflow is not None:
        return await _after_overflow(graph, config, client, session, messages, overflow, as_node)
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


async def _after_overflow(
    graph: Any,
    config: RunnableConfig,
    client: SummarizerClient,
    session: str,
    messages: list[BaseMessage],
    error: BaseException,
    as_node: str | None,
) -> Decision:
    if not is_overflow(error):
        return Decision.without_reply(NOT_OVERFLOW)
    goal = target(messages, reported(error))
    recovery = await client.run(recover(client, session, messages, messages, goal, clip=False))
    if recovery.history is None:
        logger.warning(
            "summarizer: the model refused the prompt of session %s as too long (%s); "
            "nothing could be compacted (%s)",
            session,
            _oneline(error),
            recovery.why_not(),
        )
        return recovery.decision
    update = {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *recovery.history]}
    try:
        await graph.aupdate_state(config, update, as_node=as_node)
    except Exception as e:  # noqa: BLE001 -- the next turn loads the compaction anyway
        client.warnings.warn("graph_state", "writing the graph state failed: %s", _oneline(e))
        return Decision(compacted=False, reason="transport_error", reply=recovery.decision.reply)
    logger.warning(
        "summarizer: the model refused the prompt of session %s as too long; %s",
        session,
        recovery.done(),
    )
    return recovery.decision


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
