"""``python -m examples.periodic.run`` runs as documented: a worker with ``-B`` enqueues and runs
the periodic tasks, and the program exits 0 after a few heartbeats."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def example_schema(pg_dsn: str) -> Iterator[str]:
    """A schema nobody has migrated: the example creates it."""
    name = f"ex_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_the_periodic_example_runs(pg_dsn: str, example_schema: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
    env.update(PGTASKS_DATABASE_URL=pg_dsn, PGTASKS_SCHEMA_NAME=example_schema)
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "examples.periodic.run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
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
