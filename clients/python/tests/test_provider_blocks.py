"""What providers put in messages beside text, through the table and back: thinking,
redacted thinking, OpenAI's encrypted reasoning and compaction items, Anthropic's
`compaction` block, images. Each round-trips exactly through append and load, through a
compaction that keeps it and through `summarizer restore` of one that archived it; each
weighs by the rule (`block_chars`, which `chars` counts); an Anthropic compaction block's
text is message text, summarized and recalled, while the opaque items never reach
`content` (nor so the worker's LLM)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from conftest import STORE, session_id, sql, worker_binary
from images import anthropic_image, jpeg, openai_image, png
from summarizer_client import SummarizerClient
from summarizer_client._codec import to_row
from test_store import conversation

ENCRYPTED = "gAAAAABpZ" + "q7Xz" * 500  # an encrypted payload: opaque, never text
PROVIDER_SUMMARY = (
    "Earlier in this investigation: incident INC-777 was opened after host-zeta-9 began "
    "returning error E-9999 on every checkout request."
)


def provider_messages(prefix: str) -> list[BaseMessage]:
    """A turn as providers write it: Anthropic's thinking and compaction, OpenAI's
    reasoning and encrypted compaction items, images in and out of tools."""
    return [
        HumanMessage(
            id=f"{prefix}-q",
            content=[
                {"type": "text", "text": "Why is checkout-api failing? Here is the dashboard:"},
                anthropic_image(jpeg(1024, 1024), "image/jpeg"),
            ],
        ),
        AIMessage(
            id=f"{prefix}-anthropic",
            content=[
                {"type": "compaction", "content": PROVIDER_SUMMARY},
                {"type": "thinking", "thinking": "The pool may be exhausted.", "signature": "EqQBCkYIBxgCKkA" * 20},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix" * 30},
                {"type": "text", "text": "Let me take a screenshot of the pool dashboard."},
                {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {"panel": "pool"}},
            ],
            tool_calls=[{"name": "screenshot", "args": {"panel": "pool"}, "id": "toolu_1", "type": "tool_call"}],
            response_metadata={"model_name": "claude-test", "stop_reason": "tool_use"},
        ),
        ToolMessage(
            id=f"{prefix}-shot",
            tool_call_id="toolu_1",
            content=[{"type": "text", "text": "pool dashboard"}, openai_image(png(1280, 800))],
        ),
        AIMessage(
            id=f"{prefix}-openai",
            content=[
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "Pool saturated at 50/50."}],
                    "encrypted_content": ENCRYPTED,
                },
                {"type": "compaction", "id": "cmp_1", "encrypted_content": ENCRYPTED},
                {"type": "text", "text": "The pool on db-7 is exhausted.", "annotations": []},
            ],
            additional_kwargs={
                "reasoning": {"id": "rs_2", "type": "reasoning", "summary": [], "encrypted_content": ENCRYPTED}
            },
            usage_metadata={"input_tokens": 4_000, "output_tokens": 100, "total_tokens": 4_100},
        ),
    ]


def stored(database_url: str, session: str) -> dict[str, tuple[str, int, int, int]]:
    """By message id: the row's content, block_chars, chars and tool_calls' length."""
    calls = "length(tool_calls)" if STORE == "sqlite" else "char_length(tool_calls::text)"
    found = sql(
        database_url,
        f"SELECT external_id, content, block_chars, chars, coalesce({calls}, 0) FROM messages "
        "WHERE session_id = %s AND external_id IS NOT NULL",
        (session,),
    )
    return {str(i): (str(c), int(b), int(n), int(t)) for i, c, b, n, t in found}


async def test_provider_blocks_round_trip_and_weigh_by_the_rule(client: SummarizerClient, database_url: str) -> None:
    session = session_id()
    messages = provider_messages(session)

    assert await client.append(session, messages) == len(messages)
    assert await client.load(session) == messages

    rows = stored(database_url, session)
    for message in messages:
        content, block_chars, chars, calls = rows[str(message.id)]
        assert block_chars == to_row(message).block_chars
        assert chars == len(content) + calls + block_chars, message.id
        assert "gAAAA" not in content, "an opaque item is never text"
    # The images by their pixel size (Anthropic's charge is the larger for both), the
    # thinking by its text, the redacted thinking and the reasoning by their payloads.
    assert rows[f"{session}-q"][1] == 4 * 1_399
    assert rows[f"{session}-shot"][1] == 4 * 1_366
    assert rows[f"{session}-anthropic"][1] == len("The pool may be exhausted.") + len("EmwKAhgBEgy3va3pzix" * 30)
    # Its reasoning block, its compaction item and its additional_kwargs reasoning: each its payload.
    assert rows[f"{session}-openai"][1] == len("Pool saturated at 50/50.") + 3 * len(ENCRYPTED)
    # Anthropic's compaction block is text: the provider's summary is in `content`.
    assert rows[f"{session}-anthropic"][0].startswith(PROVIDER_SUMMARY + "\n")
    assert rows[f"{session}-openai"][0] == "The pool on db-7 is exhausted."


async def test_an_edit_of_an_image_alone_is_mirrored(client: SummarizerClient, database_url: str) -> None:
    session = session_id()
    shot = ToolMessage(id="shot", tool_call_id="c1", content=[{"type": "text", "text": "dashboard"}, openai_image(png(1280, 800))])
    await client.append(session, [shot])
    smaller = shot.model_copy(update={"content": [{"type": "text", "text": "dashboard"}, openai_image(png(512, 512))]})

    # The text is the same; the weight tells the edit.
    assert await client.append(session, [smaller]) == 1
    assert await client.load(session) == [smaller]
    assert stored(database_url, session)["shot"][1] == 4 * 350


async def test_a_provider_compaction_is_summarized_and_recalled(client: SummarizerClient) -> None:
    session = session_id()
    await client.append(session, provider_messages(session) + conversation(session, 4))

    decision = await client.compact(session, keep_chars=500)

    assert decision.compacted, decision
    [found] = await client.recall(session, "INC-777")
    assert found.seq and "host-zeta-9" in found.content and "E-9999" in found.content
    summary = str((await client.load(session))[0].content)
    assert "INC-777" in summary, summary
    assert "gAAAA" not in summary


async def test_opaque_items_come_back_exactly_after_compaction_and_restore(
    client: SummarizerClient, database_url: str
) -> None:
    session = session_id()
    early, late = provider_messages(f"{session}-early"), provider_messages(f"{session}-late")
    messages = early + conversation(session, 3) + late
    await client.append(session, messages)
    before = stored(database_url, session)

    decision = await client.compact(session, keep_chars=500)
    assert decision.compacted, decision

    # The newest turn is never cut into: its reasoning items stay with their calls, as
    # the provider needs them.
    history = await client.load(session)
    assert history[-len(late) :] == late
    assert all(m.id not in {e.id for e in early} for m in history)

    restore(database_url, session)
    assert [m for m in await client.load(session) if not m.id.startswith("summarizer-")] == messages  # type: ignore[union-attr]
    after = stored(database_url, session)
    assert {i: after[i] for i in before} == before, "the weight is restored with the row"


def restore(database_url: str, session: str) -> None:
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    env["DATABASE_URL"] = database_url
    subprocess.run([str(worker_binary()), "restore", session], env=env, check=True, capture_output=True)
