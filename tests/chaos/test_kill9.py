"""Chaos: ``kill -9`` during a run, then the books.

Four worker processes work through a known set of tasks while, about once a second, a random
worker process (or, in the prefork run, a random pool child) is killed with SIGKILL; a killed
worker is replaced by a new one. At the end every task must have completed exactly once as far
as its outcome goes, no attempt may have run twice, and every re-run must belong to an attempt
that lost its worker. ``PGTASKS_CHAOS_TASKS=20000`` runs the full size; CI runs a smaller one.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.chaos.crew import TIMEOUT, Crew, children, crew, scenario


def kill_a_worker(team: Crew, rnd: random.Random) -> bool:
    team.kill(rnd.choice(team.live))
    team.start()
    return True


def kill_a_child(team: Crew, rnd: random.Random) -> bool:
    pids = children(rnd.choice(team.live).pid)
    if not pids:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(rnd.choice(pids), signal.SIGKILL)
    return True


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.usefixtures("no_dead_letters_for_lost_workers")
@pytest.mark.parametrize(
    ("pool", "fault", "seed", "name"),
    [
        ("threads", kill_a_worker, 7, "kill -9 of worker processes"),
        ("prefork", kill_a_child, 11, "kill -9 of prefork children"),
    ],
    ids=["worker-processes", "prefork-children"],
)
def test_killing_processes_loses_no_task(
    app: Celery,
    db: psycopg.Connection[Any],
    pg_dsn: str,
    schema: str,
    pool: str,
    fault: Callable[[Crew, random.Random], bool],
    seed: int,
    name: str,
) -> None:
    with crew(pg_dsn, schema, db, pool=pool, concurrency=2) as team:
        seed = int(os.environ.get("SEED", seed))
        scenario(app, lambda: db, team, fault, name, seed)
