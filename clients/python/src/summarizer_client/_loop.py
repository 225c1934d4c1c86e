"""A private event loop on a daemon thread, which owns every connection of a client.

Running all I/O on one loop of its own makes a client usable from any caller: async
code on any event loop (each pytest test, each `asyncio.run`), and sync code such as
`agent.invoke(...)`, whose middleware hooks run without a loop or inside someone else's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One event loop running forever on a daemon thread, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=self._name, daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure())

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Awaits `coro` run on the private loop, from any other loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Blocks the calling thread until `coro`, run on the private loop, is done; past
        `timeout` seconds (if given) cancels it and raises `TimeoutError`, even when the
        loop itself is stuck."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("run_sync called from the client's own loop thread")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout}s") from None

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join(timeout=5)
            if not loop.is_running():
                loop.close()
