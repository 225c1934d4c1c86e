"""`maybe_summarize` before each turn of a compiled `StateGraph`, and `summarizer_node`."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agents import (
    TOOLS,
    ScriptedModel,
    assert_every_message_kept_once,
    assert_pair_safe,
    is_tagged_summary,
    question,
)
from conftest import THRESHOLD, async_checkpointer, rows, session_id
from summarizer_client import SummarizerClient, maybe_summarize, summarizer_node


def agent_graph(model: ScriptedModel, summarizer: Any = None) -> StateGraph[Any]:
    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    if summarizer is None:
        graph.add_edge(START, "model")
        graph.add_edge("tools", "model")
    else:
        graph.add_node("summarizer", summarizer)
        graph.add_edge(START, "summarizer")
        graph.add_edge("summarizer", "model")
        graph.add_edge("tools", "summarizer")
    return graph


async def test_maybe_summarize_before_each_turn_of_a_compiled_graph(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = ScriptedModel()
    produced: set[str] = set()
    decisions = []
    async with async_checkpointer(database_url) as saver:
        graph = agent_graph(model).compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": session}}
        for n in range(1, 31):
            decision = await maybe_summarize(graph, config, client)
            decisions.append(decision)
            state = (await graph.aget_state(config)).values
            if decision.compacted:
                assert is_tagged_summary(state["messages"][0])
            await graph.ainvoke({"messages": [question(n)]}, config)
            messages = (await graph.aget_state(config)).values["messages"]
            assert_pair_safe(messages)
            produced.update(m.id for m in messages if not is_tagged_summary(m))
        # The last turn's messages reach the table with the next call.
        await maybe_summarize(graph, config, client)

    assert sum(d.compacted for d in decisions) >= 5
    assert {d.reason for d in decisions} <= {"compacted", "below_threshold", "unknown_session", "too_few_turns"}
    assert max(model.inputs) < 2 * THRESHOLD, model.inputs
    assert_every_message_kept_once(
        produced, rows(database_url, "messages", session), rows(database_url, "archived_messages", session)
    )


def test_summarizer_node_in_a_hand_built_graph(client: SummarizerClient, database_url: str) -> None:
    session = session_id()
    model = ScriptedModel()
    graph = agent_graph(model, summarizer_node(client)).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": session}}
    produced: set[str] = set()
    for n in range(1, 21):
        graph.invoke({"messages": [question(n)]}, config)
        messages = graph.get_state(config).values["messages"]
        assert_pair_safe(messages)
        produced.update(m.id for m in messages if not is_tagged_summary(m))
    messages = graph.get_state(config).values["messages"]

    assert is_tagged_summary(messages[0])
    assert max(model.inputs) < 2 * THRESHOLD, model.inputs
    # The final answer of the last turn is stored by the next turn's node: not yet.
    final = messages[-1].id
    assert_every_message_kept_once(
        produced - {final}, rows(database_url, "messages", session), rows(database_url, "archived_messages", session)
    )


async def test_summarizer_node_under_async_invocation(client: SummarizerClient, database_url: str) -> None:
    session = session_id()
    model = ScriptedModel()
    graph = agent_graph(model, summarizer_node(client, session_id=session)).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    for n in range(1, 8):
        await graph.ainvoke({"messages": [question(n)]}, config)
    messages = (await graph.aget_state(config)).values["messages"]

    assert is_tagged_summary(messages[0])
    assert_pair_safe(messages)
