"""``python -m examples.periodic.run`` runs as documented: a worker with ``-B`` enqueues and runs
the periodic tasks, and the program exits 0 after a few heartbeats."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def test_the_periodic_example_runs(pg_dsn: str, example_schema: str, run_example: Any) -> None:
    proc = run_example("examples.periodic.run")
    assert "Traceback" not in proc.stderr
    ran, _, rest = proc.stdout.partition("next:\n")
    heartbeats = [line for line in ran.splitlines() if " heartbeat " in line]
    assert len(heartbeats) >= 3, proc.stdout
    assert all("alive at" in line for line in heartbeats)
    upcoming = [line.split()[2] for line in rest.splitlines() if line.startswith("  ")]
    assert upcoming == ["heartbeat", "nightly-report", "cleanup", "6-hourly"]
    assert proc.stdout.rstrip().endswith("worker stopped (exit code 0)")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT count(*), count(DISTINCT (name, tick_at)) FROM {}.schedule_ticks")
        row: Any = conn.execute(query.format(sql.Identifier(example_schema))).fetchone()
    assert row[0] == row[1] >= 3
