"""What the bench shows as it runs: a status line on a terminal, and a line per result."""

from __future__ import annotations

import sys
import time
from typing import IO


class Progress:
    """A status line redrawn a few times a second on a terminal, and one result line per phase.

    ``stream`` gets the results; the status line only when it is a TTY.
    """

    INTERVAL = 0.25

    def __init__(self, stream: IO[str] | None = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.live = not quiet and self.stream.isatty()
        self._next = 0.0
        self._shown = False

    def status(self, text: str, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.INTERVAL
        self.stream.write(f"\r\x1b[2K{text}")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False

    def result(self, text: str) -> None:
        self.clear()
        if not self.quiet:
            self.stream.write(text + "\n")
            self.stream.flush()


def bar(done: int, total: int, width: int = 24) -> str:
    """A progress bar of ``done`` out of ``total``, with both counts."""
    filled = width * done // total if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,}"


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an ``s`` unless ``n`` is one."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
