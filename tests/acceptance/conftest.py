"""What the example tests share: a schema nobody has migrated, and a run of an example module
the way its docstring says to run it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from tests.apps.harness import REPO


@pytest.fixture
def example_schema(pg_dsn: str) -> Iterator[str]:
    """A schema nobody has migrated: the example creates it."""
    name = f"ex_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def run_example(
    pg_dsn: str, example_schema: str
) -> Callable[[str], subprocess.CompletedProcess[str]]:
    """``run_example("examples.x.run")``: ``python -m`` it on the test database and a fresh
    schema, with no other PGTASKS_ setting; it must exit 0."""

    def run(module: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
        env.update(PGTASKS_DATABASE_URL=pg_dsn, PGTASKS_SCHEMA_NAME=example_schema)
        env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-m", module],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        return proc

    return run
