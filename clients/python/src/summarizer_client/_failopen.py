"""Fail open, quietly: a warning once per cause, not once per turn."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("summarizer_client")


class Warnings:
    """Remembers which causes were reported; a cause that clears may be reported again."""

    def __init__(self) -> None:
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    def warn(self, cause: str, message: str, *args: object) -> None:
        with self._lock:
            if cause in self._reported:
                return
            self._reported.add(cause)
        logger.warning("summarizer: " + message + " (proceeding unchanged; logged once)", *args)

    def cleared(self, cause: str) -> None:
        with self._lock:
            self._reported.discard(cause)

    def reported(self) -> set[str]:
        with self._lock:
            return set(self._reported)
