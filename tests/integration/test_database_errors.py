"""When the database is misnamed, missing, or goes away mid-run."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtasks import Celery
from pgtasks.exceptions import ImproperlyConfigured

REPO = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def kill_connections(db: psycopg.Connection[Any], application_name: str) -> int:
    """Terminate the backends of one application (never this connection); returns how many."""
    killed = db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = %s AND datname = current_database() "
        "AND pid <> pg_backend_pid()",
        (application_name,),
    ).fetchone()
    assert killed is not None
    return int(killed[0])


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("postgresql://:::bad", "port '::bad' is not a number"),
        ("host=x port=notaport", "port 'notaport' is not a number"),
        ("postgresql://app@[::1/db", "malformed database URL"),
        ("postgresql://app@host/db?nonsense=1", "malformed database URL"),
    ],
)
def test_malformed_url_is_one_line_improperly_configured(url: str, text: str) -> None:
    app = Celery("bad-url", broker=url, set_as_current=False)

    @app.task(name="dberr.noop")
    def noop() -> None: ...

    with pytest.raises(ImproperlyConfigured, match=text) as caught:
        noop.delay()
    message = str(caught.value)
    assert "\n" not in message
    assert "postgresql://user:password@host:5432/dbname" in message
    # Nothing was left half-opened: the next call says the same.
    with pytest.raises(ImproperlyConfigured, match=text):
        noop.delay()


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "amqp://guest:guest@localhost//"])
def test_other_broker_urls_are_refused(url: str) -> None:
    app = Celery("other-broker", broker=url, set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match="pgtasks keeps tasks in PostgreSQL") as caught:
        app.send_task("dberr.noop")
    assert "\n" not in str(caught.value)
    assert "guest:guest" not in str(caught.value)


def test_worker_cli_reports_an_unreachable_database(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
    env.update(
        PGTASKS_DATABASE_URL="postgresql://postgres@127.0.0.1:1/postgres",
        PGTASKS_SCHEMA_NAME="pgtasks",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", "tests.acceptance.cliapp", "worker"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: cannot reach the database:")
    assert "PGTASKS_DATABASE_URL" in lines[0]
    assert "Traceback" not in done.stderr


def test_worker_survives_its_connections_being_killed(
    app: Celery, pg_dsn: str, schema: str, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """Every connection of the worker is terminated twice while tasks run: it reconnects, every
    task completes exactly once and nothing is left RUNNING."""
    tag = f"pgtasks-test-{uuid.uuid4().hex[:10]}"
    app.conf.broker_url = make_conninfo(pg_dsn, application_name=tag)
    runs = sql.Identifier(schema, "runs")
    db.execute(sql.SQL("CREATE TABLE {} (task_id text NOT NULL)").format(runs))
    # The tasks' own bookkeeping connections, which the test leaves alone.
    idle: queue.SimpleQueue[psycopg.Connection[Any]] = queue.SimpleQueue()
    opened: list[psycopg.Connection[Any]] = []

    @app.task(name="dberr.work", bind=True)
    def work(self: Any, n: int) -> int:
        try:
            conn = idle.get_nowait()
        except queue.Empty:
            conn = psycopg.connect(pg_dsn, autocommit=True)
            opened.append(conn)
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(runs), (self.request.id,))
        idle.put(conn)
        time.sleep(0.05)
        return n * n

    def running() -> int:
        row = db.execute("SELECT count(*) FROM tasks WHERE status = 'RUNNING'").fetchone()
        return int(row[0]) if row else 0

    def executed() -> int:
        row = db.execute(sql.SQL("SELECT count(*) FROM {}").format(runs)).fetchone()
        return int(row[0]) if row else 0

    total = 60
    ids = [work.delay(n).id for n in range(total)]
    # Results are read through an app of their own, so only the worker meets dead connections.
    client = Celery("client", broker=pg_dsn, schema_name=schema, set_as_current=False)
    try:
        with worker_factory(concurrency=4):
            wait_for(lambda: executed() >= 8 and running() >= 1, what="tasks to be running")
            assert kill_connections(db, tag) >= 1
            wait_for(lambda: executed() >= 30, what="the worker to carry on after the kill")
            assert kill_connections(db, tag) >= 1
            values = [client.AsyncResult(i).get(timeout=30) for i in ids]
            assert values == [n * n for n in range(total)]
    finally:
        client.close()
        for conn in opened:
            conn.close()

    per_task = db.execute(
        sql.SQL("SELECT task_id, count(*) FROM {} GROUP BY task_id").format(runs)
    ).fetchall()
    assert len(per_task) == total
    assert {count for _, count in per_task} == {1}, "a task ran more than once"
    by_status = dict(db.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())
    assert by_status == {"COMPLETED": total}


def test_enqueue_after_the_database_dropped_idle_connections(
    app: Celery, pg_dsn: str, db: psycopg.Connection[Any]
) -> None:
    tag = f"pgtasks-test-{uuid.uuid4().hex[:10]}"
    app.conf.broker_url = make_conninfo(pg_dsn, application_name=tag)
    first = app.send_task("dberr.noop")
    assert kill_connections(db, tag) >= 1
    second = app.send_task("dberr.noop")
    assert {first.state, second.state} == {"PENDING"}


def test_bulk_enqueue_after_the_database_dropped_idle_connections(
    app: Celery, pg_dsn: str, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="dberr.bulk")
    def bulk(n: int) -> None: ...

    tag = f"pgtasks-test-{uuid.uuid4().hex[:10]}"
    app.conf.broker_url = make_conninfo(pg_dsn, application_name=tag)
    bulk.apply_many([(0,)])
    assert kill_connections(db, tag) >= 1
    # The rows are built as they are sent: the first connection is found broken, and all of
    # them go on another, once each.
    sent = bulk.apply_many([(n,) for n in range(2000)])
    stored = db.execute("SELECT count(*), count(DISTINCT id) FROM tasks").fetchone()
    assert stored == (2001, 2001)
    assert {r.id for r in sent} <= {row[0] for row in db.execute("SELECT id FROM tasks")}
