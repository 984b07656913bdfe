"""``python -m examples.unique.run`` runs as documented: duplicates come back as the first task,
and a finished task frees its key while a window keeps holding its own."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def example_schema(pg_dsn: str) -> Iterator[str]:
    name = f"ex_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_the_unique_example_runs(pg_dsn: str, example_schema: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
    env.update(PGTASKS_DATABASE_URL=pg_dsn, PGTASKS_SCHEMA_NAME=example_schema)
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "examples.unique.run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert "sync 42 again:" in out and "(same task: True)" in out
    assert "nightly-sync twice: same task: True" in out
    assert "remind 9 twice: same task: True" in out
    assert "synced customer 42" in out and "synced customer 7" in out
    assert "sync 42 after it ran: new task: True" in out
    assert "remind 9 after it ran: same task: True" in out
