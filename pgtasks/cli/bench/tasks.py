"""The bench's app and the no-op tasks its workers run.

The app is made on first use, not on import: importing the bench makes no app and reads no
setting. Its worker processes find it with ``-A pgtasks.cli.bench.tasks`` (their lookup of the
module's ``app`` makes it) and read the database URL and schema from ``PGTASKS_DATABASE_URL``
and ``PGTASKS_SCHEMA_NAME``. Workers of the asyncio pool run ``async def`` versions of the same
tasks (see ``bench_tasks``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from pgtasks.app import Celery
from pgtasks.cli.bench.options import DEFAULT_SCHEMA
from pgtasks.task import Task

#: The ``-A`` of the bench's worker processes.
APP_MODULE = __name__

#: The tasks' names, as workers and result rows know them.
NOOP = "pgtasks.bench.noop"
STAMP = "pgtasks.bench.stamp"
ANOOP = "pgtasks.bench.anoop"
ASTAMP = "pgtasks.bench.astamp"

#: The bench's app with its four tasks, made by ``bench_app()`` on first use (a test may set
#: another in its place).
app: Celery


def bench_app() -> Celery:
    """The bench's app (this module's ``app``), made on first use."""
    made: Celery | None = globals().get("app")
    if made is None:
        made = Celery(
            "pgtasks.bench",
            broker=os.environ.get("PGTASKS_DATABASE_URL"),
            schema_name=DEFAULT_SCHEMA,
            set_as_current=False,
        )
        made.task(name=NOOP, ignore_result=True)(noop)
        made.task(name=STAMP)(stamp)
        made.task(name=ANOOP, ignore_result=True)(anoop)
        made.task(name=ASTAMP)(astamp)
        globals()["app"] = made
    return made


def __getattr__(name: str) -> Any:
    # ``app`` is made when first looked up (as ``-A`` does), never on import.
    if name == "app":
        return bench_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def noop(i: int) -> None:
    """Does nothing: measures the queue, not the task."""


def stamp(sent: float) -> float:
    """Returns its send-to-start latency in seconds (``sent`` is the sender's ``time.time()``:
    sender and workers share the bench's host), so reading latencies reads results only."""
    return time.time() - sent


async def anoop(i: int) -> None:
    """``noop`` as a coroutine, for workers of the asyncio pool."""


async def astamp(sent: float) -> float:
    """``stamp`` as a coroutine, for workers of the asyncio pool."""
    return time.time() - sent


def bench_tasks(pool: str = "threads") -> tuple[Task[Any, Any], Task[Any, Any]]:
    """The no-op task and the stamping task the workers of ``pool`` run: coroutines on the
    asyncio pool (what it is for), plain functions on the others."""
    tasks = bench_app().tasks
    if pool == "asyncio":
        return tasks[ANOOP], tasks[ASTAMP]
    return tasks[NOOP], tasks[STAMP]
