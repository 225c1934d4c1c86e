"""`SummarizerMiddleware`: the worker as a LangChain v1 agent middleware."""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import BaseMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from ._turn import store_run, sync_and_ask
from .client import SummarizerClient


class SummarizerMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Before each model call: store the state's new messages, ask the worker, and when
    the stored history was compacted (now or late) replace the state's messages with it.
    When the run ends: store what it added. The session id defaults to the run's
    `thread_id`. Every failure leaves the state as it is (logged once per cause).
    """

    def __init__(self, client: SummarizerClient, session_id: str | None = None) -> None:
        super().__init__()
        self.client = client
        self.session_id = session_id

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

    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        session = self._session()
        if session is None:
            return None
        turn = await self.client.run(sync_and_ask(self.client, session, self._messages(state)))
        return turn.update()

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session()
        if session is None:
            return None
        turn = self.client.run_sync(sync_and_ask(self.client, session, self._messages(state)))
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
