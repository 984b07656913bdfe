"""Chaos: ``kill -9`` during a run, then the books.

Four worker processes work through a known set of tasks while, about once a second, a random
worker process (or, in the prefork run, a random pool child) is killed with SIGKILL; a killed
worker is replaced by a new one. At the end every task must have completed exactly once as far
as its outcome goes, no attempt may have run twice, and every re-run must belong to an attempt
that lost its worker. ``PGTASKS_CHAOS_TASKS=20000`` runs the full size; CI runs a smaller one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.apps import coord
from tests.apps.harness import WorkerProcess, one, remote, rows
from tests.chaos import books

WORKERS = 4
LEASE = 1.0
# Each task sleeps a little, so that kills land in the middle of running tasks and the run lasts
# long enough for several of them.
TASK_SLEEP = 0.02


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (Linux)."""
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text()
            found.extend(int(p) for p in text.split())
    return found


class Crew:
    """The worker processes of a run: started, killed and replaced by the test."""

    def __init__(self, pg_dsn: str, schema: str, **options: Any) -> None:
        self.pg_dsn, self.schema, self.options = pg_dsn, schema, options
        self.names = (f"chaos-{i}" for i in itertools.count())
        self.live: list[WorkerProcess] = []
        self.dead: list[WorkerProcess] = []

    def start(self) -> WorkerProcess:
        worker = WorkerProcess(
            self.pg_dsn, self.schema, next(self.names), lease=LEASE, **self.options
        )
        self.live.append(worker)
        return worker

    def kill(self, worker: WorkerProcess) -> None:
        worker.kill()
        self.live.remove(worker)
        self.dead.append(worker)

    def details(self) -> str:
        return "\n".join(w.describe() for w in self.live[-2:])

    def close(self) -> None:
        for worker in self.live + self.dead:
            worker.close()


@contextlib.contextmanager
def crew(pg_dsn: str, schema: str, db: psycopg.Connection[Any], **options: Any) -> Iterator[Crew]:
    team = Crew(pg_dsn, schema, **options)
    try:
        for _ in range(WORKERS):
            team.start()
        for worker in team.live:
            worker.wait_ready(db)
        yield team
    finally:
        team.close()


def run_with_faults(
    db: psycopg.Connection[Any], team: Crew, fault: Callable[[random.Random], bool], seed: int
) -> int:
    """Inject a fault about once a second until every task has finished; returns how many."""
    rnd = random.Random(seed)
    faults = 0

    def unfinished() -> int:
        return int(one(db, "SELECT count(*) AS n FROM tasks WHERE status <> 'COMPLETED'")["n"])

    def state() -> str:
        counts = rows(
            db,
            "SELECT status, claimed_by, count(*) AS n, min(run_at) - now() AS due_in,"
            " min(lease_until) - now() AS lease_left FROM tasks WHERE status <> 'COMPLETED'"
            " GROUP BY 1, 2",
        )
        return "\n".join(str(c) for c in counts)

    deadline = time.monotonic() + float(os.environ.get("PGTASKS_CHAOS_DEADLINE", 240))
    while unfinished():
        assert time.monotonic() < deadline, f"unfinished:\n{state()}\n{team.details()}"
        time.sleep(rnd.uniform(0.5, 1.5))
        if unfinished() and fault(rnd):
            faults += 1
    return faults


@pytest.fixture
def no_dead_letters_for_lost_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many kills can cost one task several workers; the run checks that it still completes
    # (the dead-lettering of a task that keeps killing its worker is tested on its own).
    monkeypatch.setenv("PGTASKS_MAX_LOST_ATTEMPTS", "1000")


def scenario(
    app: Celery,
    db: psycopg.Connection[Any],
    team: Crew,
    fault: Callable[[Crew, random.Random], bool],
    name: str,
    seed: int,
) -> None:
    """Enqueue the run's tasks, inject ``fault`` about once a second until they have all
    finished, and check the books."""
    coord.install(db)
    calls = [((i,), {"sleep": TASK_SLEEP}) for i in range(books.size(2000))]
    ids = {r.id for r in remote(app, coord.RECORD).apply_many(calls)}
    faults = run_with_faults(db, team, lambda rnd: fault(team, rnd), seed)
    # The workers still listed carried on: only the ones the test killed died.
    assert all(w.alive() for w in team.live), team.details()
    kept = books.check(db, ids)
    print(kept.summary(name, faults))
    assert faults >= 2, "the run ended before the faults could matter; raise the task count"
    assert kept.lost == 0 and kept.stale_writes == 0 and kept.double_runs == 0


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


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_dead_letters_for_lost_workers")
def test_killing_worker_processes_loses_no_task(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    with crew(pg_dsn, schema, db, pool="threads", concurrency=2) as team:
        seed = int(os.environ.get("SEED", 7))
        scenario(app, db, team, kill_a_worker, "kill -9 of worker processes", seed)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_dead_letters_for_lost_workers")
def test_killing_prefork_children_loses_no_task(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    with crew(pg_dsn, schema, db, pool="prefork", concurrency=2) as team:
        seed = int(os.environ.get("SEED", 11))
        scenario(app, db, team, kill_a_child, "kill -9 of prefork children", seed)
