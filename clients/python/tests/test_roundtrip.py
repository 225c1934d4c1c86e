"""Every message kind through the `messages` table and back, unchanged."""

from __future__ import annotations

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from conftest import session_id, sql
from summarizer_client import SummarizerClient


def every_kind() -> list:  # type: ignore[type-arg]
    return [
        SystemMessage(content="You are an SRE assistant.", id="m-system"),
        HumanMessage(content="Why is checkout-api slow?", id="m-human", name="alice"),
        HumanMessage(
            id="m-blocks",
            content=[
                {"type": "text", "text": "Here is the graph:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                "and a bare string block",
            ],
            additional_kwargs={"source": "slack", "thread": {"ts": "1733.42"}},
        ),
        AIMessage(
            id="m-ai-calls",
            content="Checking logs and metrics.",
            tool_calls=[
                {"name": "get_logs", "args": {"service": "checkout-api", "lines": 50}, "id": "call-1", "type": "tool_call"},
                {"name": "get_metrics", "args": {}, "id": "call-2", "type": "tool_call"},
            ],
            invalid_tool_calls=[{"name": "bad", "args": "{oops", "id": "call-3", "error": "bad json", "type": "invalid_tool_call"}],
            additional_kwargs={"refusal": None, "reasoning": "pool?"},
            response_metadata={"model_name": "gpt-test", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            name="sre-bot",
        ),
        ToolMessage(content="pool exhausted", tool_call_id="call-1", id="m-tool", name="get_logs", artifact={"rows": [1, 2]}),
        ToolMessage(content=[{"type": "text", "text": "p99=2300ms"}], tool_call_id="call-2", id="m-tool-blocks", status="error"),
        AIMessage(
            id="m-ai-blocks",
            content=[{"type": "text", "text": "The pool is exhausted."}, {"type": "reasoning", "reasoning": "because"}],
        ),
        ChatMessage(content="Be brief.", role="developer", id="m-chat"),
        FunctionMessage(content="42", name="legacy_fn", id="m-function"),
        AIMessageChunk(content="streamed", id="m-chunk"),
    ]


async def test_every_message_kind_round_trips_losslessly(client: SummarizerClient) -> None:
    session = session_id()
    messages = every_kind()

    written = await client.append(session, messages)
    loaded = await client.load(session)

    assert written == len(messages)
    assert loaded == messages
    assert [type(m) for m in loaded] == [type(m) for m in messages]


async def test_a_message_is_stored_once_by_its_id(client: SummarizerClient, database_url: str) -> None:
    session = session_id()
    messages = every_kind()[:3]
    await client.append(session, messages)
    again = await client.append(session, messages)

    assert again == 0
    assert await client.load(session) == messages


async def test_rows_written_with_plain_sql_and_summaries_load_as_langchain_messages(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    sql(
        database_url,
        """INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id, is_summary) VALUES
           (%(s)s, 'user', 'the summary', NULL, NULL, true),
           (%(s)s, 'user', 'hi', NULL, NULL, false),
           (%(s)s, 'assistant', '', '[{"id": "c1", "name": "get_logs", "arguments": {"service": "api"}}]', NULL, false),
           (%(s)s, 'tool', 'ok', NULL, 'c1', false)""",
        {"s": session},
    )

    first = await client.load(session)
    second = await client.load(session)

    summary, human, ai, tool = first
    assert isinstance(summary, HumanMessage) and summary.additional_kwargs == {"lc_source": "summarization"}
    assert summary.content == "the summary"
    assert isinstance(human, HumanMessage) and human.content == "hi"
    assert isinstance(ai, AIMessage)
    assert ai.tool_calls == [{"name": "get_logs", "args": {"service": "api"}, "id": "c1", "type": "tool_call"}]
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == "c1"
    # Ids are given once, on the first load, and stay: a sync recognises the rows.
    assert all(m.id for m in first)
    assert [m.id for m in second] == [m.id for m in first]
    assert await client.append(session, first) == 0


async def test_the_content_column_holds_the_text_of_content_blocks(client: SummarizerClient, database_url: str) -> None:
    session = session_id()
    await client.append(session, every_kind()[2:3])
    found = sql(database_url, "SELECT role, content FROM messages WHERE session_id = %s", (session,))

    assert found == [("user", "Here is the graph:\nand a bare string block")]
