"""The decisions behind compact-and-retry, without a store: which errors are context
overflows, what their messages say of the limit, the keep asked for, and the clipping of
a tool output too large on its own."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from limited import prompt_tokens, refusal
from summarizer_client._overflow import (
    CLIP_FLOOR,
    MIN_KEEP,
    SUMMARY_ROOM,
    Reported,
    clip_outputs,
    is_overflow,
    message_chars,
    newest_turn,
    reported,
    smaller_keep,
    target,
)


class _BadRequest(Exception):
    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@pytest.fixture
def providers(monkeypatch: pytest.MonkeyPatch) -> tuple[type[_BadRequest], type[_BadRequest]]:
    """Stand-ins for the `openai` and `anthropic` modules, as loaded by a chat model."""
    openai_error = type("BadRequestError", (_BadRequest,), {})
    anthropic_error = type("BadRequestError", (_BadRequest,), {})
    monkeypatch.setitem(sys.modules, "openai", types.SimpleNamespace(BadRequestError=openai_error))
    monkeypatch.setitem(sys.modules, "anthropic", types.SimpleNamespace(BadRequestError=anthropic_error))
    return openai_error, anthropic_error


def test_context_overflows_are_told_from_other_errors(providers: tuple[Any, Any]) -> None:
    openai_error, anthropic_error = providers
    assert is_overflow(ContextOverflowError("too long"))
    assert is_overflow(openai_error("Error code: 400", code="context_length_exceeded"))
    assert is_overflow(anthropic_error("Error code: 400 - prompt is too long: 210000 tokens > 200000 maximum"))
    wrapped = RuntimeError("the model failed")
    wrapped.__cause__ = ContextOverflowError("too long")
    assert is_overflow(wrapped)

    assert not is_overflow(openai_error("Error code: 400 - invalid tool schema", code="invalid_request"))
    assert not is_overflow(anthropic_error("Error code: 400 - messages: roles must alternate"))
    assert not is_overflow(ValueError("prompt is too long"))  # not a provider's error
    assert not is_overflow(TimeoutError())


def test_without_the_providers_loaded_only_langchains_error_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "openai", raising=False)
    monkeypatch.delitem(sys.modules, "anthropic", raising=False)
    assert is_overflow(ContextOverflowError("x"))
    assert not is_overflow(_BadRequest("x", code="context_length_exceeded"))


@pytest.mark.parametrize(
    "text, expected",
    [
        (str(refusal(8000, 9100, "openai")), Reported(8000, 9100)),
        (str(refusal(200000, 208310, "anthropic")), Reported(200000, 208310)),
        ("This model's maximum context length is 128,000 tokens, however you requested 130,532 tokens", Reported(128000, 130532)),
        ("input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000", Reported(180000, 187254)),
        ("The input token count (1234567) exceeds the maximum number of tokens allowed (1048576).", Reported(1048576, 1234567)),
        (str(refusal(8000, 9100, "bare")), None),
        # Numbers that do not explain a refusal are not used.
        ("prompt is too long: 100 tokens > 200 maximum", None),
    ],
)
def test_the_limit_and_size_are_read_from_the_refusal(text: str, expected: Reported | None) -> None:
    assert reported(ContextOverflowError(text)) == expected


def history(turns: int, output: str = "log line\n" * 40) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for n in range(1, turns + 1):
        messages += [
            HumanMessage(content=f"Turn {n}: why?", id=f"q{n}"),
            AIMessage(content="", id=f"a{n}", tool_calls=[{"name": "get_logs", "args": {"n": n}, "id": f"c{n}", "type": "tool_call"}]),
            ToolMessage(content=output, tool_call_id=f"c{n}", id=f"t{n}"),
            AIMessage(content="pool exhausted", id=f"r{n}"),
        ]
    return messages


def test_the_keep_is_sized_from_the_reported_limit_or_else_half_the_history() -> None:
    messages = history(10)
    size = sum(message_chars(m) for m in messages)
    newest = sum(message_chars(m) for m in messages[newest_turn(messages) :])
    assert newest_turn(messages) == 36

    known = target(messages, Reported(limit=1000, size=2000))
    assert known.budget == int(size * 0.5 * 0.8)
    assert known.keep == known.budget // 2
    assert known.floor == max(MIN_KEEP, newest)

    unknown = target(messages, None)
    assert unknown.keep == size // 2
    assert unknown.budget == size // 2 + SUMMARY_ROOM

    # Never below the newest turn: the worker does not cut inside it.
    tiny = target(messages, Reported(limit=10, size=100_000))
    assert tiny.keep == tiny.floor


def test_a_summary_is_not_the_newest_turn() -> None:
    summary = HumanMessage(content="summary", id="s", additional_kwargs={"lc_source": "summarization"})
    assert newest_turn([summary, AIMessage(content="x")]) == 0
    assert newest_turn([HumanMessage(content="q"), summary, AIMessage(content="x")]) == 0


def test_the_keep_is_halved_down_to_the_newest_turn() -> None:
    assert smaller_keep(8_000, 1_000, None) == 4_000
    assert smaller_keep(8_000, 1_000, 5_000) == 2_500  # the session is smaller than the keep
    assert smaller_keep(1_500, 1_000, None) == 1_000
    assert smaller_keep(1_000, 1_000, 900) is None
    assert smaller_keep(8_000, 1_000, True) == 4_000  # not a size


def test_the_largest_text_output_is_clipped_head_and_tail_for_the_call_only() -> None:
    lines = [f"14:{i // 60:02d}:{i % 60:02d} ERROR pool exhausted on db-{i}" for i in range(2_000)]
    huge = "\n".join(lines)
    screenshot = [{"type": "text", "text": "shot"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    messages = history(2) + [
        HumanMessage(content="Turn 3: dump everything", id="q3"),
        AIMessage(content="", id="a3", tool_calls=[
            {"name": "dump", "args": {}, "id": "c3", "type": "tool_call"},
            {"name": "small", "args": {}, "id": "c4", "type": "tool_call"},
            {"name": "shot", "args": {}, "id": "c5", "type": "tool_call"},
        ]),
        ToolMessage(content=huge, tool_call_id="c3", id="t3"),
        ToolMessage(content="a small output", tool_call_id="c4", id="t4"),
        ToolMessage(content=screenshot, tool_call_id="c5", id="t5"),
    ]
    before = [m.model_copy() for m in messages]
    size = sum(message_chars(m) for m in messages)
    budget = size - len(huge) + 10_000

    clipped, ids = clip_outputs(messages, budget, {"t3": 57})

    assert ids == ["t3"]
    assert messages == before, "the messages given are not changed"
    text = str(clipped[-3].content)
    assert sum(message_chars(m) for m in clipped) <= budget
    assert text.startswith(lines[0] + "\n") and text.endswith(lines[-1])
    assert "chars were clipped here to fit the model's context window; the original is stored: recall seq 57 for it]" in text
    assert clipped[-3].id == "t3" and clipped[-3].tool_call_id == "c3"  # type: ignore[attr-defined]
    assert clipped[:-3] == messages[:-3] and clipped[-2:] == messages[-2:]
    # An output already within the budget is left alone, and so is one that has no seq:
    # it is named by its id.
    assert clip_outputs(messages, size, {}) == (messages, [])
    clipped, _ = clip_outputs(messages, 0, {})
    assert "the original is stored: message id t3 for it" in str(clipped[-3].content)
    assert len(str(clipped[-3].content)) < CLIP_FLOOR + 200


def test_the_fake_model_counts_text_and_images() -> None:
    from images import openai_image, png

    assert prompt_tokens([HumanMessage(content="x" * 400)]) == 100
    shot = ToolMessage(content=[{"type": "text", "text": "x" * 8}, openai_image(png(1280, 800))], tool_call_id="c")
    assert prompt_tokens([shot]) == 2 + 1366
    assert prompt_tokens([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "https://x"}}])]) == 1600


def test_a_huge_output_before_a_small_newest_turn_is_clipped_too() -> None:
    # The newest question is too small to cut at (below the worker's least keep), so the
    # dump of the turn before stays in the history: it is the one clipped.
    messages = history(1, output="x" * 50_000) + [HumanMessage(content="Turn 2: and now?", id="q2")]
    clipped, ids = clip_outputs(messages, 10_000, {})
    assert ids == ["t1"]
    assert sum(message_chars(m) for m in clipped) <= 10_000


class ScriptedWorker:
    """Stands in for the client in `_compact_to_fit`: answers each forced request with the
    next decision of its script, and loads `history` after a compaction."""

    def __init__(self, answers: list[Any], history: list[BaseMessage]) -> None:
        from summarizer_client._failopen import Warnings

        self.answers = answers
        self.history = history
        self.asked: list[tuple[int | None, bool]] = []
        self.warnings = Warnings()

    async def _compact(self, session: str, instructions: Any, keep: int | None, timeout: Any, overflow: bool = False) -> Any:
        self.asked.append((keep, overflow))
        return self.answers.pop(0)

    async def _load(self, session: str) -> list[BaseMessage]:
        return self.history


def answered(reason: str, **reply: Any) -> Any:
    from summarizer_client import Decision

    status = "compacted" if reason in ("compacted", "cleared") else "skipped"
    return Decision(status == "compacted", reason, {"status": status, "reason": reason, **reply})


async def test_the_keep_is_halved_while_the_worker_refuses_down_to_the_newest_turn() -> None:
    from summarizer_client import Decision
    from summarizer_client._overflow import Target
    from summarizer_client._recover import _compact_to_fit

    small = [HumanMessage(content="summary", id="summarizer-summary-1-1", additional_kwargs={"lc_source": "summarization"})]
    goal = Target(budget=5_000, keep=8_000, floor=1_000)

    # The history within the keep (smaller than it), only a summary before the cut, no
    # turn to cut at: halved each time, then compacted.
    worker = ScriptedWorker(
        [answered("within_keep", session_chars=6_000), answered("nothing_to_compact"),
         answered("no_safe_boundary"), answered("compacted", latest_compaction_id=1)],
        small,
    )
    decision, history, keep = await _compact_to_fit(worker, "s", goal)  # type: ignore[arg-type]
    assert worker.asked == [(8_000, True), (3_000, True), (1_500, True), (1_000, True)]
    assert decision.compacted and history == small and keep == 1_000

    # At the floor, a refusal ends it; so does any other refusal, or no answer at all.
    for answers in (
        [answered("within_keep", session_chars=6_000), answered("within_keep", session_chars=900),
         answered("no_safe_boundary"), answered("nothing_to_compact")],
        [answered("too_few_turns")],
        [Decision.without_reply("no_responders")],
    ):
        worker = ScriptedWorker(list(answers), small)
        decision, history, _ = await _compact_to_fit(worker, "s", goal)  # type: ignore[arg-type]
        assert history is None and not decision.compacted
        assert len(worker.asked) <= 4 and worker.asked[-1][0] >= 1_000

    # A compaction that left too much: one more with half the keep, never a third.
    large = small + [HumanMessage(content="x" * 9_000, id="q")]
    worker = ScriptedWorker([answered("compacted", latest_compaction_id=1)] * 3, large)
    decision, history, keep = await _compact_to_fit(worker, "s", goal)  # type: ignore[arg-type]
    assert [k for k, _ in worker.asked] == [8_000, 4_000]
    assert decision.compacted and history == large and keep == 4_000
