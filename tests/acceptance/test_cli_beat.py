"""``pgtasks beat``, run as users run it: ``python -m pgtasks ...`` in subprocesses, against real
Postgres, with the periodic tasks of ``tests.apps.periodic``."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.acceptance.test_cli import cli_env, run_cli, started_cli, wait_for

APP = "tests.apps.periodic"
ENTRIES = ["every-second", "nightly", "hourly-report"]


@pytest.fixture
def env(pg_dsn: str, schema: str) -> dict[str, str]:
    return cli_env(pg_dsn, schema)


def ticks(db: psycopg.Connection[Any]) -> list[tuple[str, Any, str]]:
    return db.execute(
        "SELECT name, tick_at, task_id FROM schedule_ticks ORDER BY tick_at"
    ).fetchall()


def pings(db: psycopg.Connection[Any]) -> list[str]:
    rows = db.execute("SELECT id FROM tasks WHERE name = 'periodic.ping' ORDER BY id").fetchall()
    return [task_id for (task_id,) in rows]


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then the process's stderr; it must exit 0 without a traceback."""
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    return stderr


def events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


# -- help and flags ----------------------------------------------------------------------------


def test_help_lists_the_real_flags_and_hides_the_ignored_ones(env: dict[str, str]) -> None:
    done = run_cli(env, "beat", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: pgtasks beat [OPTIONS]")
    for shown in ("--max-interval", "--loglevel", "--logfile", "--pidfile", "--migrate"):
        assert shown in done.stdout
    for shown in ("--list", "--json", "Examples:", "pgtasks -A proj beat", "SIGTERM"):
        assert shown in done.stdout
    for hidden in ("--detach", "--scheduler", "--schedule ", "--uid", "--enable-remote-control"):
        assert hidden not in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 100
    top = run_cli(env, "--help")
    assert "beat" in top.stdout


def test_detach_is_refused(env: dict[str, str]) -> None:
    done = run_cli(env, "-A", APP, "beat", "--detach")
    assert done.returncode == 2
    assert "--detach is not supported" in done.stderr
    assert "supervisor" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_schema_is_one_clean_error(pg_dsn: str) -> None:
    env = cli_env(pg_dsn, "no_such_schema_here")
    done = run_cli(env, "-A", APP, "beat", "--list")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "pgtasks migrate" in done.stderr


# -- --list ------------------------------------------------------------------------------------


def test_list_shows_every_entry(env: dict[str, str]) -> None:
    done = run_cli(env, "-A", APP, "beat", "--list")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.strip().splitlines()
    assert header.split() == ["NAME", "TASK", "SCHEDULE", "LAST", "TICK", "NEXT", "TICK", "MISSED"]
    assert [row.split()[0] for row in rows] == ENTRIES
    by_name = {row.split()[0]: row for row in rows}
    assert "periodic.ping" in by_name["every-second"]
    assert "<freq: 0:00:01>" in by_name["every-second"]
    assert "30 3 * * *" in by_name["nightly"]
    assert by_name["nightly"].rstrip().endswith("skip")
    assert "periodic.report" in by_name["hourly-report"]  # from on_after_configure
    assert by_name["hourly-report"].rstrip().endswith("once")
    # Never ticked yet: no last tick, and the next one is in the future (UTC).
    last_tick_at = header.index("LAST TICK")
    assert all(row[last_tick_at:].startswith("- ") for row in rows)
    assert ":30:00 UTC" in by_name["nightly"]


def test_list_json(env: dict[str, str]) -> None:
    done = run_cli(env, "-A", APP, "beat", "--list", "--json")
    assert done.returncode == 0, done.stderr
    entries = {e["name"]: e for e in json.loads(done.stdout)}
    assert list(entries) == ENTRIES
    assert entries["every-second"] == {
        **entries["every-second"],
        "task": "periodic.ping",
        "schedule": "<freq: 0:00:01>",
        "last_tick": None,
        "missed": "once",
        "args": ["hello"],
        "kwargs": {},
        "options": {},
    }
    assert entries["nightly"]["kwargs"] == {"days": 7}
    assert entries["nightly"]["options"] == {"queue": "maintenance"}
    assert entries["nightly"]["missed"] == "skip"
    assert entries["hourly-report"]["args"] == ["hourly"]
    nightly = entries["nightly"]["next_tick"]
    assert nightly.endswith("T03:30:00+00:00"), nightly


def test_json_needs_list(env: dict[str, str]) -> None:
    done = run_cli(env, "-A", APP, "beat", "--json")
    assert done.returncode == 2
    assert "--json goes with --list" in done.stderr


def test_list_with_migrate_creates_the_schema(pg_dsn: str, fresh_schema: str) -> None:
    done = run_cli(cli_env(pg_dsn, fresh_schema), "-A", APP, "beat", "--migrate", "--list")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1 + len(ENTRIES)


@pytest.fixture
def fresh_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name nobody has migrated yet, dropped afterwards."""
    name = f"beat_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


# -- running -----------------------------------------------------------------------------------


def test_beat_enqueues_the_every_second_entry(
    env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    with started_cli(env, "-A", APP, "beat", "--max-interval", "0.2", "-l", "DEBUG") as proc:
        wait_for(lambda: pings(db) or proc.poll() is not None, timeout=5, what="a periodic task")
        assert proc.poll() is None, proc.communicate()[1]
        wait_for(lambda: len(pings(db)) >= 2, timeout=5, what="a second tick")
        stderr = stop(proc)
    ticked = ticks(db)
    # Run across the top of an hour, the hourly entry ticks as well; the rest is about pings.
    assert {name for name, _, _ in ticked} <= {"every-second", "hourly-report"}
    recorded = [tick for tick in ticked if tick[0] == "every-second"]
    assert sorted(task_id for _, _, task_id in recorded) == pings(db)
    for _, tick_at, _ in recorded:
        assert tick_at.microsecond == 0  # ticks fall on whole seconds (anchored at the epoch)
    row = db.execute(
        "SELECT payload, queue, status FROM tasks WHERE id = %s", (recorded[0][2],)
    ).fetchone()
    assert row is not None
    payload, queue, status = row
    assert (queue, status) == ("celery", "PENDING")
    assert payload[0] == ["hello"]
    logged = events(stderr)
    assert [e["entries"] for e in logged if e["event"] == "beat.started"] == [ENTRIES]
    assert sum(e["event"] == "beat.tick" for e in logged) == len(ticked)
    assert logged[-1]["event"] == "beat.shutdown"
    # The entry's last tick is what --list shows next.
    listed = run_cli(env, "-A", APP, "beat", "--list", "--json")
    entries = {e["name"]: e for e in json.loads(listed.stdout)}
    assert entries["every-second"]["last_tick"] == recorded[-1][1].isoformat()


def test_two_beats_never_enqueue_the_same_tick_twice(
    env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    logfiles = [tmp_path / "first.log", tmp_path / "second.log"]

    def started(path: Path) -> bool:
        return path.exists() and '"beat.started"' in path.read_text()

    args = ["-A", APP, "beat", "--max-interval", "0.05", "-f"]
    with (
        started_cli(env, *args, str(logfiles[0])) as first,
        started_cli(env, *args, str(logfiles[1])) as second,
    ):
        procs = (first, second)
        wait_for(
            lambda: all(map(started, logfiles)) or any(p.poll() is not None for p in procs),
            timeout=20,
            what="both beat processes",
        )

        # Both race for three ticks of the every-second entry, and neither gives up meanwhile.
        def raced() -> bool:
            assert first.poll() is None and second.poll() is None, "a beat process exited"
            return sum(name == "every-second" for name, _, _ in ticks(db)) >= 3

        wait_for(raced, timeout=20, what="three ticks of the every-second entry")
        for proc in procs:
            stop(proc)
    recorded = ticks(db)
    assert len(recorded) >= 2, recorded
    keys = [(name, tick_at) for name, tick_at, _ in recorded]
    assert len(keys) == len(set(keys))
    # Run across the top of an hour, the hourly entry ticks too: count the pings' entry only.
    every_second = [task_id for name, _, task_id in recorded if name == "every-second"]
    assert sorted(every_second) == pings(db)
    tasks = {task_id for (task_id,) in db.execute("SELECT id FROM tasks").fetchall()}
    assert {task_id for _, _, task_id in recorded} <= tasks
    # Each tick was enqueued by exactly one of the two processes.
    enqueued = [
        e["tick"]
        for path in logfiles
        for e in events(path.read_text())
        if e["event"] == "beat.tick"
    ]
    assert sorted(enqueued) == sorted(tick_at.isoformat() for _, tick_at, _ in recorded)


def test_sigterm_stops_beat_and_the_files_flags_work(
    env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    pidfile, logfile = tmp_path / "beat.pid", tmp_path / "beat.log"
    args = ["-A", APP, "beat", "--max-interval", "0.2", "--pidfile", str(pidfile)]
    args += ["-f", str(logfile), "-S", "django_celery_beat.schedulers:DatabaseScheduler"]
    args += ["-s", "/nonexistent/celerybeat-schedule", "--uid", "nobody", "-n", "b@%h"]
    args += ["--no-enable-remote-control", "--executable", "/usr/bin/python3"]
    with started_cli(env, *args) as proc:
        wait_for(
            lambda: (pidfile.exists() and pidfile.read_text().strip()) or proc.poll() is not None,
            timeout=5,
            what="the pidfile",
        )
        assert proc.poll() is None, proc.communicate()[1]
        assert int(pidfile.read_text()) == proc.pid
        # A second beat on the same pidfile refuses to start.
        taken = run_cli(env, *args)
        assert taken.returncode == 1
        assert "already exists" in taken.stderr
        wait_for(lambda: pings(db), timeout=5, what="a periodic task")
        stderr = stop(proc)
    assert stderr == ""  # everything went to the log file
    assert not pidfile.exists()
    logged = events(logfile.read_text())
    warned = [e["flags"] for e in logged if e["event"] == "beat.flags_ignored"]
    assert len(warned) == 1
    assert any("django_celery_beat" in text for text in warned[0])
    assert any("--uid" in text for text in warned[0])
    assert {"beat.started", "beat.tick", "beat.stopping", "beat.shutdown"} <= {
        e["event"] for e in logged
    }


def test_sigint_stops_beat_too(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    def synced() -> bool:
        return db.execute("SELECT count(*) FROM schedule_entries").fetchone() == (len(ENTRIES),)

    with started_cli(env, "-A", APP, "beat", "--max-interval", "5") as proc:
        wait_for(lambda: synced() or proc.poll() is not None, timeout=5, what="the first pass")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "SIGINT" in stderr
