"""The worker: claims tasks, runs them in a pool, finalises them with fenced statements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgtasks.worker.worker import Worker

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: enqueueing reads the time-limit header helpers of this package, and
    # must not pay for importing the whole worker.
    if name == "Worker":
        from pgtasks.worker.worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
