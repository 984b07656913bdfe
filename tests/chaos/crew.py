"""What every chaos run shares: the crew of worker processes, the fault loop, the books.

A scenario enqueues a known set of ``coord.record`` tasks, injects a fault about once a second
until every task has finished, and checks the books (see ``books``). Between faults, no RUNNING
row may keep an expired lease for longer than the lease, a reclaim interval and a margin: a
lease the reclaimers pass over fails the run as it happens, not at its deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from pgtasks import Celery
from tests.apps import coord
from tests.apps.harness import WorkerProcess, one, remote, rows
from tests.chaos import books

#: Seconds a run may take to finish its tasks (``PGTASKS_CHAOS_DEADLINE``: raise it with
#: ``PGTASKS_CHAOS_TASKS`` for full-size runs), and the test's timeout, which leaves room for
#: start-up and the books.
DEADLINE = float(os.environ.get("PGTASKS_CHAOS_DEADLINE", 240))
TIMEOUT = DEADLINE + 120

#: The test's own connection. A scenario that restarts the database hands out a new one after
#: each restart; the others always hand out the same.
Db = Callable[[], psycopg.Connection[Any]]

WORKERS = 4
LEASE = 1.0
#: Seconds between a worker's reclaims (its maintenance interval for LEASE).
RECLAIM_INTERVAL = min(max(LEASE / 3.0, 0.2), 10.0)
#: Seconds a lease may stay expired on a RUNNING row before the run fails: the lease, a reclaim
#: interval, and a margin for a busy machine. A lease that ran out while the server was down
#: counts from the server's start. A lease the reclaimers pass over waits for a full reclaim,
#: ten seconds or more: past this.
STALE_AFTER = LEASE + RECLAIM_INTERVAL + 4.0
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

    def start(self, dsn: str | None = None) -> WorkerProcess:
        """A new worker, on the crew's database address unless given another (a proxy's)."""
        worker = WorkerProcess(
            dsn or self.pg_dsn, self.schema, next(self.names), lease=LEASE, **self.options
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


def stale_leases(db: psycopg.Connection[Any], after: float) -> list[dict[str, Any]]:
    """RUNNING rows whose lease ran out more than ``after`` seconds ago (or, if it ran out
    while the server was down, more than ``after`` seconds after the server started)."""
    return rows(
        db,
        "SELECT id, claimed_by, attempt, now() - lease_until AS expired_for,"
        "       now() - pg_postmaster_start_time() AS server_up_for"
        "  FROM tasks"
        " WHERE status = 'RUNNING'"
        "   AND GREATEST(lease_until, pg_postmaster_start_time())"
        "       < now() - make_interval(secs => %s)"
        " ORDER BY lease_until LIMIT 5",
        (after,),
    )


def run_with_faults(
    db: Db,
    team: Crew,
    fault: Callable[[random.Random], bool],
    seed: int,
    stale_after: float = STALE_AFTER,
) -> int:
    """Inject a fault about once a second until every task has finished; returns how many.
    Between faults, no RUNNING row may keep a lease expired for ``stale_after`` seconds."""
    rnd = random.Random(seed)
    faults = 0

    def unfinished() -> int:
        return int(one(db(), "SELECT count(*) AS n FROM tasks WHERE status <> 'COMPLETED'")["n"])

    def state() -> str:
        counts = rows(
            db(),
            "SELECT status, claimed_by, count(*) AS n, min(run_at) - now() AS due_in,"
            " min(lease_until) - now() AS lease_left FROM tasks WHERE status <> 'COMPLETED'"
            " GROUP BY 1, 2",
        )
        return "\n".join(str(c) for c in counts)

    def no_stale_leases() -> None:
        stale = stale_leases(db(), stale_after)
        assert not stale, (
            f"leases expired for over {stale_after:g}s, with live workers: {stale}\n"
            f"{state()}\n{team.details()}"
        )

    deadline = time.monotonic() + DEADLINE
    while unfinished():
        assert time.monotonic() < deadline, f"unfinished:\n{state()}\n{team.details()}"
        no_stale_leases()
        time.sleep(rnd.uniform(0.5, 1.5))
        no_stale_leases()
        if unfinished() and fault(rnd):
            faults += 1
    return faults


def scenario(
    app: Celery,
    db: Db,
    team: Crew,
    fault: Callable[[Crew, random.Random], bool],
    name: str,
    seed: int,
    tasks: int = 2000,
    crashed: bool = False,
    stale_after: float = STALE_AFTER,
) -> books.Books:
    """Enqueue the run's tasks (``tasks`` in CI), inject ``fault`` about once a second until
    they have all finished (no lease staying expired for ``stale_after`` seconds meanwhile),
    and check the books."""
    coord.install(db())
    calls = [((i,), {"sleep": TASK_SLEEP}) for i in range(books.size(tasks))]
    ids = {r.id for r in remote(app, coord.RECORD).apply_many(calls)}
    faults = run_with_faults(db, team, lambda rnd: fault(team, rnd), seed, stale_after)
    # The workers still listed carried on: only the ones the test killed died.
    assert all(w.alive() for w in team.live), team.details()
    kept = books.check(db(), ids, crashed)
    print(kept.summary(name, faults))
    assert faults >= 2, "the run ended before the faults could matter; raise the task count"
    assert kept.lost == 0 and kept.stale_writes == 0
    assert crashed or kept.double_runs == 0
    return kept
