"""``queues``, ``dlq`` and ``health``, run as users run them: ``python -m pgtasks ...`` in
subprocesses, on rows written directly into a real Postgres schema."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.acceptance.test_cli import REPO, cli_env, run_cli, statuses
from tests.apps.harness import attempts
from tests.integration.test_ops_queries import add_attempt, ago, insert


@pytest.fixture
def env(pg_dsn: str, schema: str) -> dict[str, str]:
    return cli_env(pg_dsn, schema)


def test_help_reads_well(env: dict[str, str]) -> None:
    for command in ("queues", "dlq", "health"):
        done = run_cli(env, command, "--help")
        assert done.returncode == 0, done.stderr
        assert "Examples:" in done.stdout
        if command == "dlq":
            for sub in ("list", "show", "requeue", "discard"):
                assert f"  {sub} " in done.stdout
        if command == "health":
            assert "probe" in done.stdout


def test_queues_table_and_json(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    assert run_cli(env, "queues").stdout == "No tasks in any queue.\n"
    insert(db, run_at=ago(125))
    insert(db, run_at=sql.SQL("now() + interval '1 hour'"))
    insert(db, "RUNNING", lease_until=ago(5))
    insert(db, "DEAD", queue="io")
    done = insert(db, "COMPLETED")
    add_attempt(db, done, 1, "completed")

    table = run_cli(env, "queues")
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header == ("QUEUE   DUE  SCHEDULED  RUNNING  DEAD  OLDEST DUE  EXPIRED LEASES  DONE/MIN")
    cells = {line.split()[0]: line.split() for line in lines}
    assert cells["celery"][1:5] == ["1", "1", "1", "0"]
    assert cells["celery"][5].startswith("2m0")
    assert cells["celery"][6:] == ["1", "0.2"]
    assert cells["io"][1:] == ["0", "0", "0", "1", "-", "0", "0.0"]

    machine = run_cli(env, "queues", "--json", "-Q", "celery,empty")
    assert machine.returncode == 0, machine.stderr
    stats = json.loads(machine.stdout)
    assert set(stats) == {"celery", "empty"}
    assert stats["celery"]["pending_due"] == 1
    assert stats["celery"]["expired_leases"] == 1
    assert stats["celery"]["oldest_due_age"] >= 125
    assert stats["empty"]["pending_due"] == 0


def test_dlq_list_show_requeue_discard(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    assert run_cli(env, "dlq", "list").stdout == "No dead letters.\n"
    first = insert(db, "DEAD", error="ValueError: boom\nmore", attempt=2, updated_at=ago(60))
    second = insert(db, "DEAD", name="ops.other", queue="io", error="worker lost")
    add_attempt(db, first, 1, "retry")
    add_attempt(db, first, 2, "dead")

    listed = run_cli(env, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "TASK",
        "QUEUE",
        "ATTEMPT",
        "RETRIES",
        "DEAD",
        "SINCE",
        "ERROR",
    ]
    assert [line.split()[0] for line in lines[1:]] == [second, first]
    assert lines[2].endswith("ValueError: boom")
    by_queue = run_cli(env, "dlq", "list", "-Q", "celery", "--limit", "5", "--json")
    assert [json.loads(line)["id"] for line in by_queue.stdout.splitlines()] == [first]

    shown = run_cli(env, "dlq", "show", first)
    assert shown.returncode == 0, shown.stderr
    assert "ValueError: boom" in shown.stdout
    assert "attempts:" in shown.stdout and " dead " in shown.stdout
    as_json = json.loads(run_cli(env, "dlq", "show", first, "--json").stdout)
    assert [a["outcome"] for a in as_json["attempts"]] == ["retry", "dead"]
    missing = run_cli(env, "dlq", "show", "nope")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "Error: no dead letter with id 'nope'"

    refused = run_cli_input(env, "n\n", "dlq", "requeue", first)
    assert refused.returncode == 1
    assert statuses(db)[first] == "DEAD"
    requeued = run_cli(env, "dlq", "requeue", first, "-f")
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout == "Requeued 1 dead letter.\n"
    assert statuses(db)[first] == "PENDING"
    assert attempts(db, first)[-1][0] == 3 and attempts(db, first)[-1][2] == "requeued"

    discarded = run_cli(env, "dlq", "discard", second, "-f")
    assert discarded.stdout == "Discarded 1 dead letter.\n"
    assert second not in statuses(db)
    assert run_cli(env, "dlq", "discard", second, "--all", "-f").returncode == 2


def run_cli_input(env: dict[str, str], given: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtasks", *args],
        cwd=REPO,
        env=env,
        input=given,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dlq_all(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    dead = [insert(db, "DEAD") for _ in range(4)]
    other = insert(db, "DEAD", name="ops.other")
    done = run_cli(env, "dlq", "requeue", "--all", "--task", "ops.noop", "-f")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Requeued 4 dead letters of task ops.noop.\n"
    assert done.stderr == ""  # no progress line off a terminal
    assert {i: s for i, s in statuses(db).items() if s == "PENDING"}.keys() == set(dead)
    gone = run_cli(env, "dlq", "discard", "--all", "-f")
    assert gone.stdout == "Discarded 1 dead letter.\n"
    assert other not in statuses(db)


def test_health(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    ok = run_cli(env, "health")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: ") and ok.stdout.count("\n") == 1
    assert run_cli(env, "health", "--require-workers", "1").stdout == (
        "unhealthy: 0 live workers (need 1)\n"
    )

    insert(db, run_at=ago(912))
    sick = run_cli(env, "health")
    assert sick.returncode == 1
    assert sick.stdout.startswith("unhealthy: oldest due task waited 91")
    assert sick.stdout.endswith(" s (over 300)\n") and sick.stdout.count("\n") == 1
    assert sick.stderr == ""
    patient = run_cli(env, "health", "--max-due-age", "3600")
    assert patient.returncode == 0, patient.stdout
    report = json.loads(run_cli(env, "health", "--json").stdout)
    assert report["healthy"] is False and report["oldest_due_age"] >= 912


def test_health_without_a_database(pg_dsn: str, schema: str) -> None:
    env = cli_env("postgresql://nobody@127.0.0.1:1/nothing", schema)
    done = run_cli(env, "health", "--timeout", "2", timeout=30)
    assert done.returncode == 1
    assert done.stdout.startswith("unhealthy: cannot reach the database: ")
    assert done.stdout.count("\n") == 1
    assert done.stderr == ""


def test_quota_set_list_and_clear(env: dict[str, str], db: psycopg.Connection[Any]) -> None:
    help_text = run_cli(env, "quota", "--help")
    assert help_text.returncode == 0 and "Examples:" in help_text.stdout
    assert run_cli(env, "quota", "list").stdout == "no quotas\n"
    done = run_cli(env, "quota", "set", "web", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "web may have at most 2 waiting tasks\n"
    db.execute("INSERT INTO tasks (id, name, payload, source) VALUES ('q1', 't', '[]', 'web')")
    table = run_cli(env, "quota", "list").stdout.splitlines()
    assert table[0].split() == ["SOURCE", "QUOTA", "WAITING"]
    assert table[1].split() == ["web", "2", "1"]
    listed = json.loads(run_cli(env, "quota", "list", "--json").stdout)
    assert listed == {"source": "web", "max_pending": 2, "waiting": 1}
    assert run_cli(env, "quota", "set", "web", "-1").returncode == 2
    assert run_cli(env, "quota", "clear", "web").stdout == "web has no quota now\n"
    missing = run_cli(env, "quota", "clear", "web")
    assert missing.returncode == 2 and "web has no quota" in missing.stderr
