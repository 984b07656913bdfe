"""A worker app for coordination tests.

Worker subprocesses load it with ``-A tests.apps.coord``; the database and schema come from
``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``. Every task records each execution in the
``executions`` table of the test schema, keyed by (task_id, attempt): running the same claim
twice bumps ``runs`` instead of adding a row, so a duplicate execution is visible to the test.
Tests steer blocking tasks through the ``gates`` table.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from pgtasks import Celery, Task

app = Celery("coord", set_as_current=False)

RECORD = "coord.record"
BLOCK = "coord.block"
EXIT_PROCESS = "coord.exit_process"
LIMITED = "coord.limited"
FLAKY = "coord.flaky"

TABLES = """
CREATE TABLE IF NOT EXISTS executions (
    task_id     text        NOT NULL,
    attempt     integer     NOT NULL,
    worker      text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    runs        integer     NOT NULL DEFAULT 1,
    call        text,
    UNIQUE (task_id, attempt)
);
CREATE TABLE IF NOT EXISTS gates (key text PRIMARY KEY);
"""

GATE_TIMEOUT = 30.0
RECONNECT_TIMEOUT = 60.0

_conns: dict[tuple[int, int], psycopg.Connection[Any]] = {}


def install(conn: psycopg.Connection[Any]) -> None:
    """Create the record tables in ``conn``'s current schema (its search_path)."""
    conn.execute(TABLES)


def open_gate(conn: psycopg.Connection[Any], key: str) -> None:
    """Let every task blocked on ``key`` go on."""
    conn.execute("INSERT INTO gates (key) VALUES (%s) ON CONFLICT DO NOTHING", (key,))


def _conn() -> psycopg.Connection[Any]:
    """A connection for this process and thread; never one inherited through fork."""
    key = (os.getpid(), threading.get_ident())
    conn = _conns.get(key)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(app.database_url, autocommit=True, connect_timeout=5)
        conn.execute(
            sql.SQL("SET search_path TO {}").format(sql.Identifier(app.settings.schema_name))
        )
        # The records are test data: no need to wait for each one to reach the disk.
        conn.execute("SET synchronous_commit TO off")
        _conns[key] = conn
    return conn


def _write(query: str, params: tuple[Any, ...]) -> None:
    """Run a record statement, again on a new connection while the database is unreachable
    (the chaos tests restart it under running tasks)."""
    deadline = time.monotonic() + RECONNECT_TIMEOUT
    while True:
        try:
            _conn().execute(query, params)
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _started(task: Task[Any, Any], finished: bool = False) -> None:
    req = task.request
    # The call token keeps a statement sent again after a broken connection (which may have
    # committed the first time) from counting as a second run.
    _write(
        "INSERT INTO executions (task_id, attempt, worker, pid, finished_at, call)"
        " VALUES (%s, %s, %s, %s, CASE WHEN %s THEN clock_timestamp() END, %s)"
        " ON CONFLICT (task_id, attempt) DO UPDATE"
        " SET runs = executions.runs + (executions.call IS DISTINCT FROM EXCLUDED.call)::int",
        (req.id, req.attempt, req.hostname, os.getpid(), finished, uuid.uuid4().hex),
    )


def _finished(task: Task[Any, Any]) -> None:
    req = task.request
    _write(
        "UPDATE executions SET finished_at = clock_timestamp() WHERE task_id = %s AND attempt = %s",
        (req.id, req.attempt),
    )


@app.task(name=RECORD, bind=True)
def record(self: Task[Any, Any], n: int = 0, sleep: float = 0.0) -> int:
    """Record this execution (sleeping ``sleep`` seconds in between) and return ``n``."""
    if sleep <= 0:
        _started(self, finished=True)
        return n
    _started(self)
    time.sleep(sleep)
    _finished(self)
    return n


@app.task(name=BLOCK, bind=True)
def block(self: Task[Any, Any], key: str) -> str:
    """Record the start, wait until the test opens gate ``key``, record the end."""
    _started(self)
    deadline = time.monotonic() + GATE_TIMEOUT
    while _conn().execute("SELECT 1 FROM gates WHERE key = %s", (key,)).fetchone() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {key!r} was not opened within {GATE_TIMEOUT}s")
        time.sleep(0.02)
    _finished(self)
    return key


@app.task(name=EXIT_PROCESS, bind=True)
def exit_process(self: Task[Any, Any]) -> None:
    """Record the start, then end the process running it without any clean-up."""
    _started(self)
    os._exit(1)


@app.task(name=LIMITED, bind=True, rate_limit="20/s")
def limited(self: Task[Any, Any]) -> None:
    """Record the start of a task limited to 20 starts a second across all workers."""
    _started(self, finished=True)


@app.task(name=FLAKY, bind=True)
def flaky(self: Task[Any, Any], countdown: float) -> int:
    """Record the start; the first attempt asks for a retry in ``countdown`` seconds."""
    _started(self, finished=True)
    if self.request.retries == 0:
        raise self.retry(countdown=countdown, exc=ValueError("first try fails"))
    return self.request.retries
