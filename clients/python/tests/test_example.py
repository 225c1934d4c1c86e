"""The README's example runs as written (with a scripted model in place of a real one)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from conftest import Worker, rows

class ToolingFakeModel(GenericFakeChatModel):
    """A scripted model that accepts the example's tools (and calls none)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolingFakeModel:  # type: ignore[override]
        return self


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agent.py"


async def test_the_example_runs_and_stores_the_conversation(
    worker: Worker, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    spec = importlib.util.spec_from_file_location("example_agent", EXAMPLE)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = ToolingFakeModel(messages=(AIMessage(content="Pool exhausted on db-7.") for _ in itertools.count()))

    await example.main(model=model, subject=worker.subject, recall_subject=worker.recall_subject)

    assert capsys.readouterr().out.count("Pool exhausted on db-7.") == 2
    assert [r["role"] for r in rows(database_url, "messages", "incident-1204")] == ["user", "assistant"] * 2
