"""``dlq requeue`` and ``dlq discard`` on many dead letters, run as users run them: the
question says how many and which, and only those change, even when more die meanwhile."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_cli import REPO, cli_env, read_until, run_cli, statuses
from tests.acceptance.test_cli_ops import run_cli_input
from tests.integration.test_ops_queries import ago, insert


@pytest.fixture
def env(pg_dsn: str, schema: str) -> dict[str, str]:
    return cli_env(pg_dsn, schema)


@pytest.fixture
def many_dead(db: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """45 dead letters: proj.add 11 (celery), proj.mul 26 (18 celery, 8 io), proj.sub 8 (io)."""
    made: dict[str, list[str]] = {}
    n = 0
    for name, queue, count in (
        ("proj.add", "celery", 11),
        ("proj.mul", "celery", 18),
        ("proj.mul", "io", 8),
        ("proj.sub", "io", 8),
    ):
        for _ in range(count):
            n += 1
            made.setdefault(f"{name}@{queue}", []).append(
                insert(db, "DEAD", name=name, queue=queue, error="boom", updated_at=ago(600 + n))
            )
    return made


def counts(db: psycopg.Connection[Any]) -> dict[tuple[str, str, str], int]:
    rows = db.execute("SELECT name, queue, status, count(*) FROM tasks GROUP BY 1, 2, 3")
    return {(n, q, s): c for n, q, s, c in rows.fetchall()}


def test_the_question_states_the_count_and_the_filter(
    env: dict[str, str], db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    declined = run_cli_input(env, "n\n", "dlq", "discard", "--all", "--task", "proj.add")
    assert declined.returncode == 1
    assert "Discard 11 dead letters of task proj.add? This cannot be undone. [y/N]" in (
        declined.stdout
    )
    assert sum(counts(db).values()) == 45

    done = run_cli_input(env, "y\n", "dlq", "discard", "--all", "--task", "proj.add")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("Discarded 11 dead letters of task proj.add.\n")
    assert ("proj.add", "celery", "DEAD") not in counts(db)
    assert sum(counts(db).values()) == 34

    asked = run_cli_input(env, "y\n", "dlq", "requeue", "--all", "--task", "proj.mul", "-Q", "io")
    assert "Requeue 8 dead letters of task proj.mul in queue io? [y/N]" in asked.stdout
    assert asked.stdout.endswith("Requeued 8 dead letters of task proj.mul in queue io.\n")
    assert counts(db) == {
        ("proj.mul", "celery", "DEAD"): 18,
        ("proj.mul", "io", "PENDING"): 8,
        ("proj.sub", "io", "DEAD"): 8,
    }

    every = run_cli_input(env, "n\n", "dlq", "requeue", "--all")
    assert "Requeue 26 dead letters? [y/N]" in every.stdout
    forced = run_cli(env, "dlq", "discard", "--all", "-Q", "io", "-f")
    assert forced.stdout == "Discarded 8 dead letters in queue io.\n"
    none = run_cli(env, "dlq", "discard", "--all", "--task", "proj.none")
    assert none.returncode == 0 and none.stdout == "No dead letters of task proj.none.\n"


def test_ids_are_exact_and_the_queue_narrows_only_all(
    env: dict[str, str], db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    two = many_dead["proj.sub@io"][:2]
    asked = run_cli_input(env, "y\n", "dlq", "discard", *two, "not-a-dead-letter")
    assert "Discard 3 dead letters? This cannot be undone." in asked.stdout
    assert asked.stdout.endswith(
        "Discarded 2 dead letters. 1 of the 3 given was not a dead letter.\n"
    )
    narrowed = run_cli(env, "dlq", "requeue", many_dead["proj.add@celery"][0], "--task", "x", "-f")
    assert narrowed.stdout == (
        "Requeued 0 dead letters. 1 of the 1 given was not a dead letter of task x.\n"
    )
    refused = run_cli(env, "dlq", "requeue", many_dead["proj.sub@io"][2], "-Q", "io", "-f")
    assert refused.returncode == 2 and "-Q/--queue narrows --all" in refused.stderr
    assert sum(counts(db).values()) == 43
    helped = run_cli(env, "dlq", "requeue", "--help")
    assert "-Q, --queue" in helped.stdout and "counted before asking" in helped.stdout


def test_a_dead_letter_that_arrives_while_the_question_waits_is_left_alone(
    env: dict[str, str], db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtasks", "dlq", "requeue", "--all", "--task", "proj.sub"],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        asked = read_until(proc, b"[y/N]: ")
        newcomer = insert(db, "DEAD", name="proj.sub", queue="io", error="died meanwhile")
        taken = many_dead["proj.sub@io"][0]
        db.execute("DELETE FROM tasks WHERE id = %s", (taken,))  # someone else discarded it
        out, err = proc.communicate(b"y\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert statuses(db)[newcomer] == "DEAD"
    assert counts(db)[("proj.sub", "io", "PENDING")] == 7
    assert b"Requeue 8 dead letters of task proj.sub?" in asked
    assert out.decode().endswith(
        "Requeued 7 dead letters of task proj.sub. "
        "1 of the 8 counted was not a dead letter of task proj.sub any more.\n"
    )
