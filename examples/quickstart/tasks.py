"""The quickstart's tasks: exactly what a Celery project writes, with one import changed."""

from __future__ import annotations

import random

from pgtasks import Celery

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("quickstart")


@app.task
def add(x: int, y: int) -> int:
    """A plain task."""
    return x + y


@app.task(bind=True, max_retries=3, default_retry_delay=1)
def flaky_fetch(self, url: str) -> str:  # type: ignore[no-untyped-def]
    """Fails on its first tries, then succeeds: the retry is stored in the row, not in RAM."""
    if self.request.retries < 2:
        raise self.retry(exc=ConnectionError(f"{url} timed out"), countdown=1)
    return f"fetched {url} after {self.request.retries} retries"


@app.task(autoretry_for=(ValueError,), max_retries=2, retry_backoff=True, retry_backoff_max=2)
def always_broken(n: int) -> None:
    """Never succeeds: dead-lettered after its retries, payload and traceback kept."""
    raise ValueError(f"bad input {n}")


@app.task(priority=9)
def urgent(msg: str) -> str:
    """Higher priority runs first."""
    return msg.upper()


@app.task
def roll() -> int:
    return random.randint(1, 6)
