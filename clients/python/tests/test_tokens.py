"""The token trigger: asks carry the prompt tokens the agent's model reported, and a
session whose tokens pass `threshold_tokens` is compacted however far below its chars
threshold it is; one under it is not. Against a worker whose chars threshold is out of
reach (1,000,000)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from agents import FILLER, assert_pair_safe, is_tagged_summary, question
from conftest import NATS_URL, Worker, session_id, usage_events
from summarizer_client import SummarizerClient, SummarizerMiddleware, summarizer_node
from summarizer_client._turn import reported_tokens
from test_graph import agent_graph
from test_store import conversation

ROOMY = 1_000_000


@pytest.fixture(scope="module")
def roomy_worker(database_url: str, worker: Worker) -> Iterator[Worker]:
    # `worker` first: it migrates the database.
    roomy = Worker(database_url, SUMMARIZATION_THRESHOLD_CHARS=str(ROOMY))
    try:
        yield roomy
    finally:
        roomy.stop()


@pytest_asyncio.fixture
async def roomy(roomy_worker: Worker, database_url: str) -> AsyncIterator[SummarizerClient]:
    async with SummarizerClient(NATS_URL, database_url, roomy_worker.subject, timeout=10.0) as client:
        yield client


class Reporting(BaseChatModel):
    """Answers every question at length, without tools, and reports `tokens` as its
    prompt's size. Keeps every input."""

    tokens: int
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "reporting"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Reporting:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        usage = {"input_tokens": self.tokens, "output_tokens": 200, "total_tokens": self.tokens + 200}
        reply = AIMessage(content="The pool on db-7 is exhausted; " + FILLER * 10, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def test_context_tokens_over_threshold_tokens_compact_a_small_session(
    roomy: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    await roomy.append(session, conversation(session, 4))  # about 2,500 chars

    # At the threshold is not over it; nor are the chars' 625 estimated tokens.
    assert (await roomy.turn_starting(session, context_tokens=1_000, threshold_tokens=1_000)).reason == (
        "below_threshold"
    )
    assert (await roomy.turn_starting(session, threshold_tokens=1_000)).reason == "below_threshold"
    assert (await roomy.turn_starting(session, context_tokens=5_000)).reason == "below_threshold"
    assert usage_events(database_url, session) == 0

    decision = await roomy.turn_starting(session, context_tokens=1_001, threshold_tokens=1_000)

    assert decision.compacted, decision
    assert usage_events(database_url, session) == 1
    # Without a reported count, the estimate from the chars decides.
    estimated = session_id()
    await roomy.append(estimated, conversation(estimated, 4))
    assert (await roomy.turn_starting(estimated, threshold_tokens=100)).compacted


@pytest.mark.parametrize(
    "field, bad",
    [
        ("threshold_tokens", 0),
        ("threshold_tokens", -5),
        ("threshold_tokens", 1.5),
        ("threshold_tokens", 1.0),
        ("threshold_tokens", "5000"),
        ("threshold_tokens", True),
        ("threshold_tokens", 10**12),
        ("context_tokens", -1),
        ("context_tokens", 2.5),
        ("context_tokens", 10**12),
    ],
)
async def test_token_counts_out_of_bounds_are_refused_by_the_worker(
    field: str, bad: Any, roomy: SummarizerClient
) -> None:
    decision = await roomy.turn_starting(session_id(), **{field: bad})
    assert decision.reason == "invalid_request" and not decision.compacted, decision
    assert decision.reply is not None and field in decision.reply["message"], decision.reply
    assert "rejected" in roomy.warnings.reported()


@pytest.mark.parametrize("entry", ["middleware", "node"])
@pytest.mark.parametrize("reported, compacts", [(50_000, True), (5_000, False)])
async def test_an_agent_is_compacted_when_its_model_reports_more_tokens_than_its_threshold(
    entry: str, reported: int, compacts: bool, roomy: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    model = Reporting(tokens=reported)
    if entry == "middleware":
        agent: Any = create_agent(
            model,
            tools=[],
            middleware=[SummarizerMiddleware(roomy, threshold_tokens=20_000)],
            checkpointer=InMemorySaver(),
        )
    else:
        graph = agent_graph(model, summarizer_node(roomy, threshold_tokens=20_000))  # type: ignore[arg-type]
        agent = graph.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": session}}

    for n in range(1, 6):  # at most about 4,500 chars: 1,100 estimated tokens
        await agent.ainvoke({"messages": [question(n)]}, config)
        if usage_events(database_url, session):
            break

    state = (await agent.aget_state(config)).values["messages"]
    if compacts:
        assert usage_events(database_url, session) == 1
        assert is_tagged_summary(state[0]) and any(is_tagged_summary(m) for m in model.seen[-1])
        assert sum(len(str(m.content)) for m in model.seen[-2]) < 5_000, "far below 1,000,000 chars"
        assert_pair_safe(state)
    else:
        assert usage_events(database_url, session) == 0
        assert len(state) == 10 and not any(is_tagged_summary(m) for m in state)


def test_only_a_count_the_worker_takes_is_sent_as_context_tokens() -> None:
    def answered(tokens: Any) -> AIMessage:
        message = AIMessage(content="ok")
        # Assigned after validation, as a provider integration might: pydantic would
        # have made 1 of True and -4 of -4.0.
        message.usage_metadata = {"input_tokens": tokens, "output_tokens": 1, "total_tokens": 1}
        return message

    ask = HumanMessage(content="why?")
    assert reported_tokens([]) is None
    assert reported_tokens([ask, AIMessage(content="no usage")]) is None
    assert reported_tokens([answered(1_200), ask]) == 1_200
    assert reported_tokens([answered(0)]) == 0
    # The newest report counts, also over an older valid one.
    assert reported_tokens([answered(7), AIMessage(content="no usage"), answered(9)]) == 9
    for bad in [True, -1, 1.5, "100", None, 10**12]:
        assert reported_tokens([answered(5), answered(bad)]) is None, bad


def test_a_threshold_tokens_the_worker_would_refuse_is_refused_at_once() -> None:
    client = SummarizerClient(database_url="sqlite:///nowhere/summarizer.db")
    for bad in [0, -1, 1.5, "5000", True, 10**12]:
        with pytest.raises(ValueError, match="threshold_tokens"):
            SummarizerMiddleware(client, threshold_tokens=bad)
        with pytest.raises(ValueError, match="threshold_tokens"):
            summarizer_node(client, threshold_tokens=bad)
    assert SummarizerMiddleware(client, threshold_tokens=10**9).threshold_tokens == 10**9
