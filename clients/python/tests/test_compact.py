"""Compaction on demand: `client.compact` below the threshold, with instructions the usage
event records (as the operator's) and the worker's refusals; and `compact_tool`, with
which a scripted model in a LangChain agent compacts its own context (its instructions
the agent's) and starts its next call from the summary."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import nats
import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from agents import FILLER, assert_pair_safe, is_tagged_summary, question
from conftest import NATS_URL, rows, session_id, unique_subject, usage_events, usage_metadata
from summarizer_client import Decision, SummarizerClient, SummarizerMiddleware, compact_tool
from summarizer_client.tool import _compaction_text
from test_store import conversation

COMPACT = "compact_conversation"
FOCUS = "Keep the pool sizes and every error code.\nDrop the small talk."
_ids = itertools.count()


class SelfCompactor(BaseChatModel):
    """On a question that starts with "compact:": calls `compact_conversation` with the
    rest of it as instructions. After the tool's answer: says it. Otherwise: a long
    answer, no tools. Reports its prompt's chars as its input tokens (one per char), and
    keeps every input."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "self-compactor"

    def bind_tools(self, tools: Any, **kwargs: Any) -> SelfCompactor:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        last = messages[-1]
        text = str(last.content)
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Done: {text}")
        elif text.startswith("compact:"):
            args = {"instructions": text.removeprefix("compact:").strip()}
            call = {"name": COMPACT, "args": args, "id": f"call-{next(_ids)}", "type": "tool_call"}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            reply = AIMessage(content="The pool on db-7 is exhausted; " + FILLER * 5)
        tokens = sum(len(str(m.content)) for m in messages)
        reply.usage_metadata = {"input_tokens": tokens, "output_tokens": 10, "total_tokens": tokens + 10}
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def test_compact_compacts_a_session_below_its_threshold_and_records_why(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    await client.append(session, conversation(session, 4))  # about 2,500 chars: below 3,000
    assert (await client.turn_starting(session)).reason == "below_threshold"

    decision = await client.compact(session, FOCUS, keep_chars=500)

    assert decision.compacted and decision.reason == "compacted", decision
    assert decision.reply is not None and decision.reply["messages_removed"] >= 2
    assert decision.latest_compaction_id == decision.reply["compaction_id"]
    [event] = usage_metadata(database_url, session)
    assert event["forced"] is True and event["instructions"] == FOCUS, event
    assert event["instructions_from"] == "operator", event
    history = await client.load(session)
    assert is_tagged_summary(history[0])
    # Forced once, not for good: the next turn is below the threshold again.
    assert (await client.turn_starting(session)).reason == "below_threshold"


async def test_compact_sync_without_instructions_and_up_to_the_longest(
    client: SummarizerClient, database_url: str
) -> None:
    plain, longest = session_id(), session_id()
    for session in (plain, longest):
        await client.append(session, conversation(session, 4))

    decision = await asyncio.to_thread(client.compact_sync, plain, keep_chars=500)
    # 4,000 chars (Unicode scalar values, not bytes), newlines allowed.
    most = "Keep E-5417.\n" + "é" * (4_000 - 13)
    assert len(most) == 4_000
    at_most = await client.compact(longest, most, keep_chars=500)

    assert decision.compacted and at_most.compacted, (decision, at_most)
    [event] = usage_metadata(database_url, plain)
    assert event["forced"] is True and "instructions" not in event, event
    assert "instructions_from" not in event, event
    [event] = usage_metadata(database_url, longest)
    assert event["instructions"] == most


async def test_compact_reports_what_the_worker_refuses_and_what_it_skips(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    await client.append(session, conversation(session, 4))
    for bad in ["focus on\tthe pool", "line one\r\nline two", "bell\x07", "nul\x00"]:
        decision = await client.compact(session, bad)
        assert decision.reason == "invalid_request" and not decision.compacted, decision
        assert decision.reply is not None and decision.reply["status"] == "rejected"
        assert "instructions" in decision.reply["message"], decision.reply
    with pytest.raises(ValueError, match="at most 4,000 chars"):
        await client.compact(session, "x" * 4_001)
    with pytest.raises(ValueError, match="at most 4,000 chars"):
        client.compact_sync(session, "x" * 4_001)
    assert usage_events(database_url, session) == 0

    short = session_id()
    await client.append(short, conversation(short, 1))
    decision = await client.compact(short, FOCUS)
    assert decision.reason == "too_few_turns" and not decision.compacted, decision
    assert usage_events(database_url, short) == 0


async def test_compact_fails_open(database_url: str) -> None:
    async with SummarizerClient(NATS_URL, database_url, unique_subject()) as nobody:
        assert await nobody.compact("s", FOCUS) == Decision(False, "no_responders", None)
        said = await compact_tool(nobody).ainvoke({}, {"configurable": {"thread_id": "s"}})
        assert said == "Not compacted: no_responders (no summarizer is running). Go on as you are."

    subject = unique_subject()
    silent = await nats.connect(NATS_URL)
    await silent.subscribe(subject)  # never answers
    try:
        # A compaction waits longer than a turn, but no longer than asked.
        async with SummarizerClient(NATS_URL, database_url, subject, timeout=0.2) as client:
            assert client._compact_wait(None) == 120.0
            assert await client.compact("s", timeout=0.3) == Decision(False, "timeout", None)
            tool_ = compact_tool(client, timeout=0.3)
            said = tool_.invoke({"instructions": FOCUS}, {"configurable": {"thread_id": "s"}})
            assert said.startswith("Not compacted: timeout (no answer within 0.3s; it may still complete"), said
            assert "s" in client._stale, "a compaction may be under way"
    finally:
        await silent.close()


@pytest.mark.parametrize("invocation", ["invoke", "ainvoke"])
async def test_a_model_compacts_its_own_context_and_its_next_call_starts_from_the_summary(
    invocation: str, client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = SelfCompactor()
    agent = create_agent(
        model,
        tools=[compact_tool(client, keep_chars=500)],
        # A token threshold the model's reports never reach: the asks carry them all the same.
        middleware=[SummarizerMiddleware(client, threshold_tokens=1_000_000)],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": session}}
    sent: list[int | None] = []
    ask = client._turn_starting

    async def recorded(session_id: str, **kwargs: Any) -> Decision:
        sent.append(kwargs.get("context_tokens"))
        assert kwargs.get("threshold_tokens") == 1_000_000
        return await ask(session_id, **kwargs)

    client._turn_starting = recorded  # type: ignore[method-assign]

    async def run(text: str) -> None:
        message = {"messages": [HumanMessage(content=text)]}
        if invocation == "ainvoke":
            await agent.ainvoke(message, config)
        else:
            await asyncio.to_thread(agent.invoke, message, config)

    try:
        for n in range(1, 4):  # about 1,900 chars: below the threshold
            await run(str(question(n).content))
        assert usage_events(database_url, session) == 0
        await run("compact: the pool figures and error codes")
        after_tool = sent[-1]
        await run(str(question(4).content))
    finally:
        del client._turn_starting

    state = (await agent.aget_state(config)).values["messages"]
    said = [m for m in state if isinstance(m, ToolMessage) and m.name == COMPACT][-1].content
    assert said.startswith("Compacted: ") and "earlier messages replaced by a summary (" in said, said
    assert said.endswith(" chars saved). The next turn continues from it."), said
    [event] = usage_metadata(database_url, session)
    assert event["forced"] is True and event["instructions"] == "the pool figures and error codes"
    assert event["instructions_from"] == "agent", event

    # The model call right after the tool's: from the summary, the tool's answer last.
    archived = {r["external_id"] for r in rows(database_url, "archived_messages", session)}
    after = model.seen[-2]
    assert isinstance(after[-1], ToolMessage) and after[-1].name == COMPACT
    assert any(is_tagged_summary(m) for m in after), [type(m).__name__ for m in after]
    assert not archived & {m.id for m in after}
    assert question(1).content not in [m.content for m in after]
    assert_pair_safe(after)
    assert is_tagged_summary(state[0]) and not archived & {m.id for m in state}

    # Each ask carries the model's last reported prompt size (none before its first
    # call), but for the one right after the tool's compaction: that size was measured
    # before it, and would ask for another at once. The next ask carries the size of the
    # call that started from the summary.
    assert len(sent) == 6 and sent[0] is None, sent
    assert all(isinstance(t, int) and t > 0 for t in sent[1:4]), sent
    assert after_tool is None and sent[4] is None, sent
    assert sent[5] == sum(len(str(m.content)) for m in after), sent


async def test_the_request_says_who_wrote_the_instructions(database_url: str) -> None:
    """On the wire: `client.compact` speaks for the operator unless told otherwise, and
    `compact_tool` for the agent, whose model wrote its instructions."""
    subject = unique_subject()
    listener = await nats.connect(NATS_URL)
    sent: list[dict[str, Any]] = []

    async def answer(message: Any) -> None:
        sent.append(json.loads(message.data))
        await message.respond(b'{"status": "skipped", "reason": "too_few_turns"}')

    await listener.subscribe(subject, cb=answer)
    config: Any = {"configurable": {"thread_id": "s"}}
    try:
        async with SummarizerClient(NATS_URL, database_url, subject) as client:
            await client.compact("s", FOCUS)
            await client.compact("s")
            await asyncio.to_thread(client.compact_sync, "s", FOCUS, instructions_from="agent")
            await compact_tool(client).ainvoke({"instructions": FOCUS}, config)
            await asyncio.to_thread(compact_tool(client).invoke, {}, config)
            for bad in ["system", "Operator", None]:
                with pytest.raises(ValueError, match='instructions_from must be "agent" or "operator"'):
                    await client.compact("s", FOCUS, instructions_from=bad)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="instructions_from"):
                client.compact_sync("s", instructions_from="user")  # type: ignore[arg-type]
    finally:
        await listener.close()

    assert [(r.get("instructions"), r["instructions_from"], r["force"]) for r in sent] == [
        (FOCUS, "operator", True),
        (None, "operator", True),
        (FOCUS, "agent", True),
        (FOCUS, "agent", True),
        (None, "agent", True),
    ]


def test_what_the_model_is_told() -> None:
    compacted = Decision(True, "compacted", {
        "status": "compacted", "messages_removed": 38, "chars_removed": 44_120,
        "summary_chars": 1_630, "tool_outputs_cleared": 0, "chars_cleared": 0,
    })
    assert _compaction_text(compacted, 120.0) == (
        "Compacted: 38 earlier messages replaced by a summary (42,490 chars saved). "
        "The next turn continues from it."
    )
    cleared = Decision(True, "cleared", {
        "status": "compacted", "messages_removed": 0, "chars_removed": 0, "summary_chars": 0,
        "tool_outputs_cleared": 1, "chars_cleared": 2_360,
    })
    assert _compaction_text(cleared, 120.0).startswith("Compacted: 1 old tool output cleared (2,360 chars saved).")
    skipped = Decision(False, "too_few_turns", {"status": "skipped", "reason": "too_few_turns"})
    assert _compaction_text(skipped, 120.0) == (
        "Not compacted: too_few_turns (fewer than two user turns so far, too little to "
        "summarize). Go on as you are."
    )
    refused = Decision(False, "invalid_request", {"status": "rejected", "message": "instructions: bad"})
    assert _compaction_text(refused, 120.0) == "Not compacted: invalid_request (instructions: bad). Go on as you are."
