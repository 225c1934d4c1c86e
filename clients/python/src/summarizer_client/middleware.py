"""`SummarizerMiddleware`: the worker as a LangChain v1 agent middleware."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import langchain.agents.middleware as agent_middleware
from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, RemoveMessage
from langgraph.config import get_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.runtime import Runtime
from langgraph.types import Command

from ._failopen import logger
from ._overflow import is_overflow, reported, target
from ._recover import Recovery, recover
from ._turn import Turn, store_run, sync_and_ask
from .client import SummarizerClient, _oneline, check_threshold_tokens

if TYPE_CHECKING:
    from langchain.agents.middleware import ExtendedModelResponse

    Answer = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]

Handler = Callable[[ModelRequest[Any]], ModelResponse[Any]]
AsyncHandler = Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]


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

    Around each model call (`wrap_model_call`/`awrap_model_call`): when the provider
    refuses the prompt as too long (`ContextOverflowError`, or OpenAI's and Anthropic's
    own errors), the session is compacted to fit (forced, `"overflow": true`, with a keep
    sized from the limit the error reports) and the call made once more on the compacted
    history, with its largest tool outputs clipped if it is still too long;
    the state then holds the compacted history (the clipped outputs whole). If nothing
    can be compacted or clipped, the worker does not answer, or the second call is
    refused too, the first error is raised: never a loop, never a message dropped.
    Put it first in `middleware=[...]` so that the middleware after it (inner) rework
    the retried call as they did the first.
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

    def wrap_model_call(self, request: ModelRequest[Any], handler: Handler) -> Answer:
        try:
            return handler(request)
        except Exception as error:
            session = self._overflowed(error)
            if session is None:
                raise
            recovery = self.client.run_sync(self._recover(session, request, error))
            if not recovery.changed:
                self._not_recovered(session, error, recovery)
                raise
            try:
                retry = request.override(messages=cast("list[AnyMessage]", recovery.messages))
                response = handler(retry)
            except Exception as again:
                if is_overflow(again):
                    self._still_too_long(session, again, recovery)
                    raise error from again
                raise
            return self._answer(session, recovery, response)

    async def awrap_model_call(self, request: ModelRequest[Any], handler: AsyncHandler) -> Answer:
        try:
            return await handler(request)
        except Exception as error:
            session = self._overflowed(error)
            if session is None:
                raise
            recovery = await self.client.run(self._recover(session, request, error))
            if not recovery.changed:
                self._not_recovered(session, error, recovery)
                raise
            try:
                retry = request.override(messages=cast("list[AnyMessage]", recovery.messages))
                response = await handler(retry)
            except Exception as again:
                if is_overflow(again):
                    self._still_too_long(session, again, recovery)
                    raise error from again
                raise
            return self._answer(session, recovery, response)

    # -- a context overflow ----------------------------------------------------------

    def _overflowed(self, error: Exception) -> str | None:
        """The session to recover when `error` is a context overflow, else None."""
        if not is_overflow(error):
            return None
        return self._session()

    def _recover(
        self, session: str, request: ModelRequest[Any], error: Exception
    ) -> Coroutine[Any, Any, Recovery]:
        state = self._messages(request.state)
        goal = target(state, reported(error))
        return recover(self.client, session, state, request.messages, goal, clip=True)

    def _answer(self, session: str, recovery: Recovery, response: ModelResponse[Any]) -> Answer:
        """The retried call's response; with the compacted history for the state, which
        the next turn would load anyway, so that the checkpoint holds it at once."""
        logger.warning(
            "summarizer: the model refused the prompt of session %s as too long; %s, and "
            "the call succeeded on the second try",
            session,
            recovery.done(),
        )
        # A langchain without it cannot update the state from here: the next turn loads
        # the compaction then, as it loads any it did not ask for.
        extended = getattr(agent_middleware, "ExtendedModelResponse", None)
        if recovery.history is None or extended is None:
            return response
        update = {
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *recovery.history, *response.result]
        }
        answer: Answer = extended(model_response=response, command=Command(update=update))
        return answer

    def _not_recovered(self, session: str, error: Exception, recovery: Recovery) -> None:
        logger.warning(
            "summarizer: the model refused the prompt of session %s as too long (%s); "
            "nothing could be compacted or clipped (%s): raising the error",
            session,
            _oneline(error),
            recovery.why_not(),
        )

    def _still_too_long(self, session: str, error: Exception, recovery: Recovery) -> None:
        logger.warning(
            "summarizer: the model refused the prompt of session %s as too long again after "
            "%s (%s): raising the first error; a compaction stays, and the next turn starts "
            "from it",
            session,
            recovery.done(),
            _oneline(error),
        )

