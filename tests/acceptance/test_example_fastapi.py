"""``python -m examples.fastapi.run`` runs as documented: an endpoint enqueues with
``delay_async`` and awaits the result with ``get_async``, and a unique task clicked twice is
one task."""

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

pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install fastapi)")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def example_schema(pg_dsn: str) -> Iterator[str]:
    name = f"ex_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_the_fastapi_example_runs(pg_dsn: str, example_schema: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
    env.update(PGTASKS_DATABASE_URL=pg_dsn, PGTASKS_SCHEMA_NAME=example_schema)
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "examples.fastapi.run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "POST /reports/eu twice -> same task: True" in proc.stdout
    assert "'result': 5}" in proc.stdout
    assert "report: report for eu" in proc.stdout
