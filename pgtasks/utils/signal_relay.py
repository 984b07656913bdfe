"""Handle SIGTERM/SIGINT in a thread of their own instead of inside the interrupted code.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is:
possibly inside ``Event.wait`` holding the event's condition lock, or halfway through writing a
log line holding the log writer's lock. A handler that takes either lock (``event.set()``,
``log.info(...)``) then waits for itself and the process never stops. The relay's own handler
only puts the signal number on a ``queue.SimpleQueue`` (whose ``put`` may be called from a signal
handler); a daemon thread takes it off and calls the real handler, where locks are ordinary.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import structlog

log = structlog.get_logger("pgtasks")
Handler = Callable[[signal.Signals], None]


class SignalRelay:
    """Install with :meth:`install` (from the main thread); undo with :meth:`restore`."""

    def __init__(self, handler: Handler, signums: Iterable[int], name: str = "signals") -> None:
        self.handler = handler
        self.signums = tuple(signums)
        self._name = name
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._previous: dict[int, Any] = {}
        self._thread: threading.Thread | None = None

    def _receive(self, signum: int, frame: FrameType | None) -> None:
        self._queue.put(signum)

    def _relay(self) -> None:
        while (signum := self._queue.get()) is not None:
            sig = signal.Signals(signum)
            try:
                self.handler(sig)
            except Exception:  # the next signal must still be handled
                log.exception("signal.handler_failed", signal=sig.name)

    def install(self) -> SignalRelay:
        self._thread = threading.Thread(target=self._relay, name=self._name, daemon=True)
        self._thread.start()
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._receive)
        return self

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> SignalRelay:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()
