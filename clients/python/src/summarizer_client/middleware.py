"""`SummarizerMiddleware`: the worker as a LangChain v1 agent middleware."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import BaseMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from ._turn import Turn, store_run, sync_and_ask
from .client import SummarizerClient, check_threshold_tokens


class SummarizerMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Before each model call: store the state's new messages, ask the worker, and when
    the stored history was compacted (now, late, or by `compact_tool`) replace the
    state's messages with it. When the run ends: store what it added. The session id
    defaults to the run's `thread_id`. Every failure leaves the state as it is (logged
    once per cause).

    Each ask carries the prompt tokens the model reported on its last call (the newest
    `AIMessage`'s `usage_metadata["input_tokens"]`, when there is one) as
    `context_tokens`, and `threshold_tokens` when given: the session is then compacted
    when its tokens pass it, whatever its chars. Raises `ValueError` for a
    `threshold_tokens` that is not an integer from 1 to 1,000,000,000.
    """

    def __init__(
        self,
        client: SummarizerClient,
        session_id: str | None = None,
        *,
        threshold_tokens: int | None = None,
    ) -> None:
        super().__init__()
        if threshold_tokens is not None:
            check_threshold_tokens(threshold_tokens)
        self.client = client
        self.session_id = session_id
        self.threshold_tokens = threshold_tokens

    def _session(self) -> str | None:
        if self.session_id is not None:
            return self.session_id
        try:
            thread = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:
            thread = None
        if thread is None:
            self.client.warnings.warn(
                "no_session", "no session_id and no thread_id in the run's config: skipped"
            )
            return None
        return str(thread)

    @staticmethod
    def _messages(state: AgentState[Any]) -> list[BaseMessage]:
        return list(state.get("messages", []))

    def _ask(self, session: str, state: AgentState[Any]) -> Coroutine[Any, Any, Turn]:
        return sync_and_ask(
            self.client, session, self._messages(state), threshold_tokens=self.threshold_tokens
        )

    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        session = self._session()
        if session is None:
            return None
        turn = await self.client.run(self._ask(session, state))
        return turn.update()

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session()
        if session is None:
            return None
        turn = self.client.run_sync(self._ask(session, state))
        return turn.update()

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        session = self._session()
        if session is not None:
            await self.client.run(store_run(self.client, session, self._messages(state)))
        return None

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session()
        if session is not None:
            self.client.run_sync(store_run(self.client, session, self._messages(state)))
        return None
