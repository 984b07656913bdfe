"""pgtasks adapter for the shared side-by-side benchmark harness (/work/shared/bench).

Registered from outside the harness:

    BENCH_EXTRA_ADAPTERS="pgtasks=/work/main/benchmarks/pgtasks_adapter.py" \
    SYSTEMS=pgtasks,celery,pgqueuer,procrastinate ./run_all.sh

The harness imports this module only to read ``configs`` and ``worker_commands``; pgtasks itself
is imported lazily inside the methods, which run in the harness's runner subprocesses.

``PGTASKS_BENCH_SRC`` (optional) names a folder holding a ``pgtasks`` package to benchmark instead
of the installed one (e.g. a ``git archive`` snapshot of one commit, so that edits in progress in
the working tree cannot change the code under test mid-run). It is put first on ``PYTHONPATH``
for the runner subprocesses and the workers; ``version()`` reports which copy was imported.
"""

from __future__ import annotations

import os
import sys
import time

import common  # the harness's module (its folder is on sys.path in the driver and runners)
from adapters.base import Adapter

HERE = os.path.dirname(os.path.abspath(__file__))  # this folder: holds pgtasks_app.py
HARNESS = os.path.dirname(os.path.abspath(common.__file__))
DB = "bench_pgtasks"
SCHEMA = "pgtasks"
BASE = ["-m", "pgtasks", "-A", "pgtasks_app", "worker", "-l", "WARNING"]


class PgTasksAdapter(Adapter):
    name = "pgtasks"
    python = sys.executable
    has_bulk = True
    configs = {
        # Total concurrency: 2 task slots in every configuration.
        "2proc-c1-threads": {"procs": [["-c", "1", "-P", "threads"]] * 2},
        "1proc-c2-threads": {"procs": [["-c", "2", "-P", "threads"]]},
        "2proc-c1-prefork": {"procs": [["-c", "1", "-P", "prefork"]] * 2},
        "1proc-c2-prefork": {"procs": [["-c", "2", "-P", "prefork"]]},
        # Workers that never park: every task is claimed (for A/B runs of the hand-off).
        "2proc-c1-threads-claims": {
            "procs": [["-c", "1", "-P", "threads"]] * 2,
            "env": {"PGTASKS_HANDOFF": "false"},
        },
        # The asyncio pool: the task is an async def, run on each worker's event loop.
        "2proc-c1-asyncio": {
            "procs": [["-c", "1", "-P", "asyncio"]] * 2,
            "env": {"PGTASKS_BENCH_ASYNC": "1"},
        },
        # Workers that keep no finished rows: a success deletes its row as it completes.
        "2proc-c1-threads-drop": {
            "procs": [["-c", "1", "-P", "threads"]] * 2,
            "env": {"PGTASKS_FINISHED_TASK_RETENTION": "0"},
        },
    }

    # -- lifecycle ------------------------------------------------------------------------------

    def version(self) -> str:
        from importlib.metadata import version

        import pgtasks

        src = os.path.dirname(os.path.dirname(os.path.abspath(pgtasks.__file__)))
        return (
            f"pgtasks {pgtasks.__version__} (from {src}), psycopg {version('psycopg')}, "
            f"psycopg-pool {version('psycopg-pool')}"
        )

    def reset(self) -> None:
        from pgtasks.migrate import migrate

        common.recreate_database(DB)
        migrate(common.dsn(DB), SCHEMA)

    def env(self) -> dict:
        paths = [HERE, HARNESS]
        if os.environ.get("PGTASKS_BENCH_SRC"):
            paths.insert(0, os.path.abspath(os.environ["PGTASKS_BENCH_SRC"]))
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        return {"PYTHONPATH": os.pathsep.join(paths), "PGTASKS_DATABASE_URL": common.dsn(DB)}

    # -- enqueue --------------------------------------------------------------------------------

    def open_producer(self):
        """One app and its connection pool, open and connected before the timed loop."""
        from pgtasks_app import app, bench_task

        app.settings  # noqa: B018 - validate settings once, outside the timed loop
        app.broker.pool.wait(timeout=30.0)
        return bench_task

    def enqueue_one(self, h, run: str, ts: float) -> None:
        h.delay(run, ts)

    def close_producer(self, h) -> None:
        h.app.close()

    def enqueue_bulk(self, n: int, run: str) -> float:
        h = self.open_producer()
        limits = os.environ.get("PGTASKS_BENCH_LIMITS", "")
        try:
            if limits.startswith("keys:"):
                # Every task under a concurrency limit (see pgtasks_app.bench_limited).
                from pgtasks_app import bench_limited

                h = bench_limited
            elif limits.startswith("backlog:"):
                self._held_backlog(h, int(limits.split(":")[1]))
            elif limits.startswith("rated:"):
                self._rated_backlog(int(limits.split(":")[1]))
            t0 = time.perf_counter()
            left = n
            while left:
                k = min(self.bulk_chunk, left)
                h.apply_many([(run, 0.0)] * k)
                left -= k
            return time.perf_counter() - t0
        finally:
            self.close_producer(h)

    def _held_backlog(self, h, n: int) -> None:
        """``n`` tasks of one concurrency key whose count is full, ahead of the timed ones:
        claims meet them first and set them BLOCKED (they never run)."""
        from pgtasks_app import bench_held

        left = n
        while left:
            k = min(self.bulk_chunk, left)
            bench_held.apply_many([("held",)] * k)
            left -= k
        with h.app.broker.connection() as conn:
            conn.execute(
                f"INSERT INTO {SCHEMA}.concurrency_limits (key, max_running, running)"
                " VALUES (%s, 1, 1) ON CONFLICT (key) DO UPDATE SET running = 1",
                ('task:bench.held:{"run":"held"}',),
            )

    def _rated_backlog(self, n: int) -> None:
        """``n`` tasks of a task limited to one start an hour, ahead of the timed ones: claims
        meet them first, start one and leave the others waiting for their start times."""
        from pgtasks_app import bench_rated

        left = n
        while left:
            k = min(self.bulk_chunk, left)
            bench_rated.apply_many([("rated",)] * k)
            left -= k

    # -- workers --------------------------------------------------------------------------------

    def worker_commands(self, config: str, logdir: str) -> list[list[str]]:
        settings = [f"{k}={v}" for k, v in self.configs[config].get("env", {}).items()]
        prefix = ["env", *settings] if settings else []
        return [[*prefix, self.python, *BASE, *extra] for extra in self.configs[config]["procs"]]

    def system_done_count(self) -> int | None:
        import psycopg

        with psycopg.connect(common.dsn(DB)) as c:
            row = c.execute(
                f"SELECT count(*) FILTER (WHERE status = 'COMPLETED'), count(*) FROM {SCHEMA}.tasks"
            ).fetchone()
            # No row at all: the workers deleted what they finished ("-drop"): nothing to count.
            return row[0] if row and row[1] else None


ADAPTER = PgTasksAdapter()
