"""The ``pgtasks`` command, run as users run it: ``python -m pgtasks ...`` in a subprocess."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks import migrate as migrations

REPO = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.cliapp"


def read_until(proc: subprocess.Popen[bytes], marker: bytes, timeout: float = 30.0) -> bytes:
    """What ``proc`` wrote to stdout up to ``marker`` (its question waits for an answer)."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {seen!r}"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"the command ended before asking: {seen!r}"
            seen += chunk
    return seen


def cli_env(dsn: str, schema: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
    env.update(PGTASKS_DATABASE_URL=dsn, PGTASKS_SCHEMA_NAME=schema, PYTHONUNBUFFERED="1")
    return env


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtasks", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextmanager
def started_cli(env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """A ``pgtasks`` process for the block; killed if it is still running at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtasks", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def statuses(db: psycopg.Connection[Any]) -> dict[str, str]:
    return dict(db.execute("SELECT id, status FROM tasks").fetchall())


def assert_one_clean_error(stderr: str) -> None:
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr


@pytest.fixture
def fresh_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name nobody has migrated yet, dropped afterwards."""
    name = f"cli_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def schema_versions(pg_dsn: str, schema: str) -> list[int]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT version FROM {}.migrations ORDER BY version")
        return [v for (v,) in conn.execute(query.format(sql.Identifier(schema))).fetchall()]


# -- help --------------------------------------------------------------------------------------


def test_help_reads_well(pg_dsn: str, fresh_schema: str) -> None:
    env = cli_env(pg_dsn, fresh_schema)
    top = run_cli(env, "--help")
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("Usage: pgtasks [OPTIONS] COMMAND [ARGS]...")
    for expected in ("-A, --app MODULE", "Examples:", "worker", "migrate", "purge"):
        assert expected in top.stdout
    worker = run_cli(env, "worker", "--help")
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.startswith("Usage: pgtasks worker [OPTIONS]")
    for expected in ("--concurrency", "--queues", "--pool", "--burst", "--migrate", "SIGTERM"):
        assert expected in worker.stdout
    assert "--without-gossip" not in worker.stdout, "Celery-compatibility flags stay hidden"
    for text in (top.stdout, worker.stdout):
        assert max(len(line) for line in text.splitlines()) <= 100
    assert top.stderr == worker.stderr == ""


# -- migrate -----------------------------------------------------------------------------------


def test_migrate_twice(pg_dsn: str, fresh_schema: str) -> None:
    env = cli_env(pg_dsn, fresh_schema)
    first = run_cli(env, "migrate")
    assert first.returncode == 0, first.stderr
    latest = migrations.latest()
    assert f"schema {fresh_schema!r} is now at version {latest}" in first.stdout
    assert "applying 0001_" in first.stderr
    second = run_cli(env, "migrate")
    assert second.returncode == 0, second.stderr
    assert f"schema {fresh_schema!r} is up to date (version {latest})" in second.stdout
    assert "applying" not in second.stderr
    assert schema_versions(pg_dsn, fresh_schema) == [m.version for m in migrations.available()]


def test_concurrent_migrations_apply_once(pg_dsn: str, fresh_schema: str) -> None:
    env = cli_env(pg_dsn, fresh_schema)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pgtasks", "migrate"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    applied = [out for out, _ in outputs if "is now at version" in out]
    up_to_date = [out for out, _ in outputs if "is up to date" in out]
    assert (len(applied), len(up_to_date)) == (1, 3), outputs
    assert schema_versions(pg_dsn, fresh_schema) == [m.version for m in migrations.available()]


# -- worker ------------------------------------------------------------------------------------


def test_worker_on_an_unmigrated_schema_says_to_migrate(pg_dsn: str, fresh_schema: str) -> None:
    env = cli_env(pg_dsn, fresh_schema)
    refused = run_cli(env, "-A", APP, "worker", "-P", "threads")
    assert refused.returncode == 1
    assert "run `pgtasks migrate`" in refused.stderr
    assert "--migrate" in refused.stderr
    assert_one_clean_error(refused.stderr)

    started = run_cli(env, "-A", APP, "worker", "-P", "threads", "--migrate", "--burst")
    assert started.returncode == 0, started.stderr
    assert schema_versions(pg_dsn, fresh_schema)[-1] == migrations.latest()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz", "cannot import app module 'no_such_module_xyz'"),
        (f"{APP}:missing_attr", "has no attribute 'missing_attr'"),
        ("tests.acceptance", "no pgtasks app found in 'tests.acceptance'"),
        (None, "no app given: pass -A MODULE"),
    ],
)
def test_bad_app_is_a_usage_error(
    pg_dsn: str, fresh_schema: str, spec: str | None, message: str
) -> None:
    app_args = ["-A", spec] if spec else []
    done = run_cli(cli_env(pg_dsn, fresh_schema), *app_args, "worker")
    assert done.returncode == 2
    assert message in done.stderr
    assert "Usage: pgtasks worker" in done.stderr
    assert_one_clean_error(done.stderr)


def test_unknown_log_level(pg_dsn: str, schema: str) -> None:
    done = run_cli(cli_env(pg_dsn, schema), "-A", APP, "worker", "-l", "NOPE")
    assert done.returncode == 2
    assert "unknown log level 'NOPE'" in done.stderr
    assert "-l/--loglevel" in done.stderr
    assert_one_clean_error(done.stderr)


def test_burst_worker_runs_what_is_queued_and_exits(
    pg_dsn: str, schema: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    results = [app.send_task("cliapp.add", (i, i)) for i in range(5)]
    done = run_cli(
        cli_env(pg_dsn, schema), "-A", APP, "worker", "--burst", "-P", "threads", "-c", "2"
    )
    assert done.returncode == 0, done.stderr
    assert [r.get(timeout=1) for r in results] == [0, 2, 4, 6, 8]
    assert set(statuses(db).values()) == {"COMPLETED"}
    assert "Traceback" not in done.stderr


def test_sigterm_lets_the_running_task_finish(
    pg_dsn: str, schema: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    result = app.send_task("cliapp.slow", (1.5,))
    queued = app.send_task("cliapp.add", (1, 2), countdown=3600)
    env = cli_env(pg_dsn, schema)
    with started_cli(env, "-A", APP, "worker", "-c", "1", "-l", "INFO") as proc:
        wait_for(lambda: result.state == "SLEEPING", what="the task to start")
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker did not stop after SIGTERM")
    assert proc.returncode == 0, stderr
    assert result.get(timeout=1) == "finished"
    assert statuses(db) == {result.id: "COMPLETED", queued.id: "PENDING"}
    stopping = [line for line in stderr.splitlines() if "worker.stopping" in line]
    assert len(stopping) == 1, stderr
    assert '"mode": "warm"' in stopping[0]
    assert '"running": 1' in stopping[0], "the signal arrived while the task ran"
    assert "Traceback" not in stderr


# -- purge -------------------------------------------------------------------------------------


def test_purge_deletes_waiting_tasks_only(
    pg_dsn: str, schema: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    waiting = [app.send_task("cliapp.add", (i, 1)) for i in range(3)]
    other = app.send_task("cliapp.add", (0, 0), queue="other")
    running = app.send_task("cliapp.add", (9, 9))
    db.execute(
        "UPDATE tasks SET status = 'RUNNING', claimed_by = 'someone', attempt = 1, "
        "lease_until = now() + interval '1 hour' WHERE id = %s",
        (running.id,),
    )
    env = cli_env(pg_dsn, schema)

    only_other = run_cli(env, "purge", "-f", "-Q", "other")
    assert only_other.returncode == 0, only_other.stderr
    assert only_other.stdout.strip() == "Purged 1 message from queues other."
    assert other.id not in statuses(db)

    everything = run_cli(env, "-A", APP, "purge", "-f")
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.strip() == "Purged 3 messages from all queues."
    assert statuses(db) == {running.id: "RUNNING"}
    assert all(r.id not in statuses(db) for r in waiting)


def test_purge_asks_before_deleting(
    pg_dsn: str, schema: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    app.send_task("cliapp.add", (1, 1))
    proc = subprocess.run(
        [sys.executable, "-m", "pgtasks", "purge"],
        cwd=REPO,
        env=cli_env(pg_dsn, schema),
        input="n\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Delete 1 waiting task in all queues?" in proc.stdout
    assert "Aborted" in proc.stderr
    assert len(statuses(db)) == 1


def test_purge_deletes_only_what_it_counted(
    pg_dsn: str, schema: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    counted = [app.send_task("cliapp.add", (i, 1)) for i in range(2)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtasks", "purge", "-Q", "celery"],
        cwd=REPO,
        env=cli_env(pg_dsn, schema),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        asked = read_until(proc, b"[y/N]: ")
        newcomer = app.send_task("cliapp.add", (7, 7))  # enqueued while the question waits
        out, err = proc.communicate(b"y\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert b"Delete 2 waiting tasks in queues celery?" in asked
    assert out.decode().endswith("Purged 2 messages from queues celery.\n")
    assert statuses(db) == {newcomer.id: "PENDING"}
    assert all(r.id not in statuses(db) for r in counted)
