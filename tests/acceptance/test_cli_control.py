"""``status``, ``inspect``, ``call``, ``result`` and the Celery worker flags, run as users run
them: ``python -m pgtasks ...`` in subprocesses, against a running worker and real Postgres."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.acceptance.test_cli import cli_env, run_cli, started_cli, statuses, wait_for

APP = "tests.acceptance.controlapp"


def online(db: psycopg.Connection[Any], worker_id: str) -> bool:
    return db.execute("SELECT 1 FROM workers WHERE id = %s", (worker_id,)).fetchone() is not None


@pytest.fixture
def env(pg_dsn: str, schema: str) -> dict[str, str]:
    return cli_env(pg_dsn, schema)


@pytest.fixture
def worker(env: dict[str, str], db: psycopg.Connection[Any]) -> Iterator[str]:
    """A prefork worker (``w-ctl``) running for the test, with Celery-style time limits."""
    args = ["-A", APP, "worker", "-n", "w-ctl", "-c", "2", "--soft-time-limit", "20"]
    args += ["--time-limit", "1", "-Q", "celery,io", "--without-gossip", "-Ofair", "-E"]
    with started_cli(env, *args) as proc:
        wait_for(lambda: online(db, "w-ctl") or proc.poll() is not None, what="the worker")
        assert proc.poll() is None, proc.communicate()[1]
        yield "w-ctl"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr


# -- status ----------------------------------------------------------------------------------------


def test_status_without_workers_is_unavailable(env: dict[str, str]) -> None:
    done = run_cli(env, "status")
    assert done.returncode == 69
    # As Celery prints it (compared with the celery command in compat/scenarios/cli.py).
    assert done.stdout == ""
    assert done.stderr.strip().endswith("Error: No nodes replied within time constraint")


def test_status_lists_the_live_workers(env: dict[str, str], worker: str) -> None:
    done = run_cli(env, "-A", APP, "status")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"->  {worker}: OK\n\n1 node online.\n"
    as_json = run_cli(env, "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    first, _, last = as_json.stdout.strip().partition("\n")
    assert json.loads(first) == {worker: {"ok": "pong"}}
    assert last.strip() == "1 node online."
    elsewhere = run_cli(env, "status", "-d", "some-other-worker")
    assert elsewhere.returncode == 69


def test_a_stale_heartbeat_is_offline(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    db.execute(
        "INSERT INTO workers (id, host, pid, queues, concurrency, heartbeat_at) "
        "VALUES ('gone', 'h', 1, '{celery}', 1, now() - interval '1 hour')"
    )
    assert run_cli(env, "status").returncode == 69


# -- inspect ---------------------------------------------------------------------------------------


def test_inspect(
    env: dict[str, str], worker: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    running = app.send_task("controlapp.patient", (30,), soft_time_limit=30)
    later = app.send_task("controlapp.add", (1, 2), countdown=3600, queue="io")
    wait_for(lambda: statuses(db).get(running.id) == "RUNNING", what="the task to start")

    active = run_cli(env, "-A", APP, "inspect", "active")
    assert active.returncode == 0, active.stderr
    lines = active.stdout.splitlines()
    assert lines[0] == f"->  {worker}: OK"
    assert lines[1].startswith("    * {") and running.id in lines[1]
    assert "'name': 'controlapp.patient'" in lines[1]
    assert "'args': '(30,)'" in lines[1]  # argsrepr: see docs/migrating-from-celery.md
    assert lines[-1] == "1 node online."

    reserved = run_cli(env, "inspect", "reserved", "--json")
    assert [r["id"] for r in json.loads(reserved.stdout.splitlines()[0])[worker]] == [running.id]

    scheduled = json.loads(run_cli(env, "inspect", "scheduled", "-j").stdout.splitlines()[0])
    assert [s["request"]["id"] for s in scheduled[worker]] == [later.id]
    assert scheduled[worker][0]["request"]["args"] == "(1, 2)"

    registered = run_cli(env, "inspect", "registered")
    assert registered.returncode == 0, registered.stderr
    for name in ("controlapp.add", "controlapp.fail", "controlapp.patient", "controlapp.slow"):
        assert f"    * {name}" in registered.stdout

    ping = run_cli(env, "inspect", "ping")
    assert ping.stdout == f"->  {worker}: OK\n        pong\n\n1 node online.\n"

    stats = json.loads(run_cli(env, "inspect", "stats", "-j").stdout.splitlines()[0])[worker]
    assert stats["pool"] == {"max-concurrency": 2, "running": 1}
    assert stats["queues"] == ["celery", "io"]
    assert isinstance(stats["pid"], int)

    queues = json.loads(run_cli(env, "inspect", "active_queues", "-j").stdout.splitlines()[0])
    assert [q["name"] for q in queues[worker]] == ["celery", "io"]

    app.AsyncResult(running.id).revoke()
    bad = run_cli(env, "inspect", "nonsense")
    assert bad.returncode == 2


def test_inspect_without_workers(env: dict[str, str]) -> None:
    done = run_cli(env, "inspect", "active")
    assert done.returncode == 69
    assert "Error: No nodes replied within time constraint" in done.stderr


# -- call and result -------------------------------------------------------------------------------


def test_call_then_result(env: dict[str, str], worker: str, db: psycopg.Connection[Any]) -> None:
    called = run_cli(env, "-A", APP, "call", "controlapp.add", "--args", "[2, 3]")
    assert called.returncode == 0, called.stderr
    task_id = called.stdout.strip()
    assert len(task_id) == 36
    done = run_cli(env, "-A", APP, "result", task_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "5\n"

    failing = run_cli(env, "call", "controlapp.fail", "-k", '{"message": "boom"}').stdout.strip()
    failed = run_cli(env, "-A", APP, "result", failing)
    assert failed.returncode == 1
    assert failed.stderr.strip() == "Error: ValueError: boom"
    traceback = run_cli(env, "result", failing, "--traceback")
    assert traceback.returncode == 0
    assert "ValueError: boom" in traceback.stdout


def test_call_options_reach_the_row(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    args = ["call", "controlapp.add", "-a", "[1, 1]", "--queue", "io", "--priority", "7"]
    later = run_cli(env, *args, "--countdown", "600").stdout.strip()
    at = run_cli(env, "call", "controlapp.add", "--eta", "2031-01-02T03:04:05").stdout.strip()
    row = db.execute(
        "SELECT queue, priority, run_at > now() + interval '500 seconds', payload::text "
        "FROM tasks WHERE id = %s",
        (later,),
    ).fetchone()
    assert row is not None
    assert row[:3] == ("io", 7, True)
    assert json.loads(row[3]) == [[1, 1], {}]
    eta = db.execute("SELECT run_at FROM tasks WHERE id = %s", (at,)).fetchone()
    assert eta is not None and eta[0].isoformat().startswith("2031-01-02T03:04:05")
    bad = run_cli(env, "call", "controlapp.add", "--args", '{"a": 1}')
    assert bad.returncode == 2
    assert "is not a JSON array" in bad.stderr


# -- the worker's Celery flags --------------------------------------------------------------------


def test_worker_time_limits_from_the_command_line(
    env: dict[str, str], worker: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    killed = app.send_task("controlapp.slow", (30,))  # the worker's --time-limit 1
    patient = app.send_task("controlapp.patient", (30,), soft_time_limit=0.5)
    assert patient.get(timeout=20) == "cleaned up"
    with pytest.raises(Exception) as caught:
        killed.get(timeout=20)
    assert type(caught.value).__name__ == "TimeLimitExceeded"
    assert statuses(db)[killed.id] == "FAILED"
    # The worker replaced its child and keeps going.
    assert app.send_task("controlapp.add", (4, 4)).get(timeout=20) == 8
    assert run_cli(env, "status").returncode == 0


def test_purge_exclude_and_burst(
    env: dict[str, str], app: Celery, db: psycopg.Connection[Any]
) -> None:
    for i in range(3):
        app.send_task("controlapp.add", (i, i))
    done = run_cli(env, "-A", APP, "worker", "-P", "threads", "--burst", "--purge")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "purge: Erased 3 messages from the queue.\n"
    assert statuses(db) == {}

    kept = app.send_task("controlapp.add", (1, 1), queue="b")
    ran = app.send_task("controlapp.add", (2, 2), queue="a")
    args = ["-A", APP, "worker", "-P", "threads", "--burst", "-Q", "a,b", "-X", "b"]
    done = run_cli(env, *args)
    assert done.returncode == 0, done.stderr
    assert statuses(db) == {kept.id: "PENDING", ran.id: "COMPLETED"}


def test_pidfile_and_logfile(
    env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    pidfile = tmp_path / "%n.pid"
    logfile = tmp_path / "%n.log"
    args = ["-A", APP, "worker", "-P", "threads", "-n", "w-files"]
    args += ["--pidfile", str(pidfile), "--logfile", str(logfile)]
    with started_cli(env, *args) as proc:
        wait_for(lambda: online(db, "w-files") or proc.poll() is not None, what="the worker")
        written = tmp_path / "w-files.pid"
        assert written.read_text().strip() == str(proc.pid)
        again = run_cli(env, *args)
        assert again.returncode == 1
        assert "already exists" in again.stderr
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert not written.exists()
    assert stderr == ""
    events = [
        json.loads(line)["event"] for line in (tmp_path / "w-files.log").read_text().splitlines()
    ]
    assert "worker.started" in events and "worker.stopped" in events


def test_detach_is_refused(env: dict[str, str]) -> None:
    done = run_cli(env, "-A", APP, "worker", "-D")
    assert done.returncode == 2
    assert "supervisor" in done.stderr


def test_max_tasks_per_child_from_the_command_line(
    env: dict[str, str], app: Celery, db: psycopg.Connection[Any]
) -> None:
    results = [app.send_task("controlapp.add", (i, 0)) for i in range(4)]
    args = ["-A", APP, "worker", "-c", "1", "--burst", "--max-tasks-per-child", "1"]
    done = run_cli(env, *args)
    assert done.returncode == 0, done.stderr
    assert [r.get(timeout=5) for r in results] == [0, 1, 2, 3]


def test_purge_exclude_queues(
    env: dict[str, str], app: Celery, db: psycopg.Connection[Any]
) -> None:
    kept = app.send_task("controlapp.add", (1, 1), queue="keep")
    app.send_task("controlapp.add", (1, 1), queue="drop")
    app.send_task("controlapp.add", (1, 1))
    done = run_cli(env, "purge", "-f", "-X", "keep")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Purged 2 messages from all queues except keep."
    assert statuses(db) == {kept.id: "PENDING"}
    nothing = run_cli(env, "purge", "-f", "-Q", "keep", "-X", "keep")
    assert nothing.stdout.strip() == "Purged 0 messages from queues keep except keep."
    assert statuses(db) == {kept.id: "PENDING"}


def test_inspect_revoked_and_quiet(
    env: dict[str, str], worker: str, app: Celery, db: psycopg.Connection[Any]
) -> None:
    later = app.send_task("controlapp.add", (1, 2), countdown=3600)
    app.AsyncResult(later.id).revoke()
    done = run_cli(env, "-q", "inspect", "revoked")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"->  {worker}: OK\n    * {later.id}\n"
