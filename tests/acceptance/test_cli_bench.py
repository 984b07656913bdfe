"""``pgtasks bench``, run as users run it: ``python -m pgtasks bench ...`` in a subprocess, on
its own schema of the test database. Nothing here times anything: the runs are small, the load
phases last a second or two in windows of half a second, and what is checked is the report's
shape and its counts, against what was enqueued and what the database holds."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks.cli.bench.report import format_report
from tests.acceptance.test_cli import (
    assert_one_clean_error,
    cli_env,
    run_cli,
    started_cli,
    wait_for,
)


@pytest.fixture
def env(pg_dsn: str, schema: str) -> dict[str, str]:
    # PGTASKS_SCHEMA_NAME names the app's schema (``schema``): the bench must leave it alone.
    return cli_env(pg_dsn, schema)


@pytest.fixture
def bench_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name for one run, dropped afterwards if the run left it."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def schema_comment(db: psycopg.Connection[Any], name: str) -> tuple[bool, str | None]:
    row = db.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
        (name,),
    ).fetchone()
    return (row is not None, row[0] if row else None)


def test_help_reads_well(env: dict[str, str]) -> None:
    done = run_cli(env, "bench", "--help")
    assert done.returncode == 0, done.stderr
    assert "Examples:" in done.stdout
    phrases = ("enqueue", "burn-down", "latency", "--only", "--keep", "--force", "--json")
    for phrase in (*phrases, "--window-seconds"):
        assert phrase in done.stdout


def test_full_run_reports_every_phase_and_drops_its_schema(
    env: dict[str, str], bench_schema: str, db: psycopg.Connection[Any]
) -> None:
    done = run_cli(
        env,
        "bench",
        "--schema",
        bench_schema,
        "--tasks",
        "400",
        "--latency-samples",
        "20",
        "--rate",
        "100",
        "--workers",
        "1",
        "--json",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    phases = report["phases"]
    assert set(phases) == {"enqueue", "bulk_enqueue", "burn_down", "latency"}
    assert phases["enqueue"]["tasks"] == 1000  # a tenth of --tasks, at least 1000
    # What a single enqueue waits for its commit's flush: something wherever the server
    # flushes its WAL at all (fsync on, as on the test databases).
    fsync = db.execute("SELECT current_setting('fsync') = 'on'").fetchone()
    assert fsync is not None
    flush = phases["enqueue"]["commit_flush_ms"]
    assert isinstance(flush, float)
    if fsync[0]:
        assert flush > 0
    assert "the commit's flush to disk takes" in done.stderr
    assert phases["bulk_enqueue"]["tasks"] == 400
    assert phases["burn_down"]["tasks"] == 400
    for name in ("enqueue", "bulk_enqueue", "burn_down"):
        figures = phases[name]
        assert figures["seconds"] > 0
        assert figures["tasks_per_second"] == pytest.approx(figures["tasks"] / figures["seconds"])
    assert phases["burn_down"]["wal_bytes_per_task"] > 0
    assert phases["burn_down"]["worker_cpu_ms_per_1000_tasks"] > 0
    latency = phases["latency"]
    assert latency["samples"] == 20
    assert 0 < latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    # Its two parts: the delay() call (statement and commit) and the start after its return,
    # which comes before it where the idle worker was handed the task at the commit.
    assert 0 < latency["call_p50_ms"] <= latency["call_p99_ms"]
    assert latency["after_return_p50_ms"] <= latency["after_return_p99_ms"]
    assert -latency["call_p99_ms"] < latency["after_return_p50_ms"] < latency["max_ms"]
    assert "the delay() call itself: p50" in done.stderr
    setup = report["setup"]
    assert setup["pool"] == "threads" and setup["workers"] == 1 and setup["concurrency"] == 1
    assert setup["tasks"] == 400 and setup["schema"] == bench_schema
    assert setup["postgresql"] and setup["pgtasks"]
    # One result line per phase on stderr.
    for line in ("enqueue one by one:", "bulk enqueue:", "burn-down:", "delay->start latency:"):
        assert line in done.stderr

    assert schema_comment(db, bench_schema) == (False, None)
    # The app's own schema (PGTASKS_SCHEMA_NAME) was not used.
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)


def test_burn_down_counts_the_rows_workers_keeping_none_delete(
    env: dict[str, str], bench_schema: str
) -> None:
    # Workers with finished_task_retention 0 delete each row they complete: the burn-down
    # counts those as completed, where a row left behind in any other state is an error.
    env = {**env, "PGTASKS_FINISHED_TASK_RETENTION": "0"}
    done = run_cli(
        env, "bench", "--schema", bench_schema, "--tasks", "300", "--only", "burn-down", "--json"
    )
    assert done.returncode == 0, done.stderr
    burn_down = json.loads(done.stdout)["phases"]["burn_down"]
    assert burn_down["tasks"] == 300
    assert burn_down["tasks_per_second"] == pytest.approx(300 / burn_down["seconds"])


def test_burn_down_on_prefork_workers_prints_their_cpu_per_task(
    env: dict[str, str], bench_schema: str
) -> None:
    # A prefork worker's tasks run in its children: their CPU is the worker's too.
    options = ["--tasks", "300", "--only", "burn-down", "--workers", "1", "-c", "2"]
    options += ["--pool", "prefork"]
    done = run_cli(env, "bench", "--schema", bench_schema, *options, timeout=240)
    assert done.returncode == 0, done.stderr
    # The summary table: the phase, two spaces or more, the value, the unit.
    rows = dict(
        (m.group(1), (m.group(2), m.group(3)))
        for m in map(re.compile(r"^(.+?) {2,}(\S+) +(\S+)$").match, done.stdout.splitlines())
        if m
    )
    value, unit = rows["burn-down worker CPU per 1,000 tasks"]
    assert float(value.replace(",", "")) > 0 and unit == "ms"
    assert "(prefork pool)" in done.stdout


def test_asyncio_pool_runs_the_bench_tasks_as_coroutines(
    env: dict[str, str], bench_schema: str, db: psycopg.Connection[Any]
) -> None:
    # On the asyncio pool the burn-down and the latency phase send the async def versions of
    # the bench's tasks, which the workers run on their event loop.
    options = ["--tasks", "200", "--only", "burn-down,latency", "--latency-samples", "10"]
    options += ["--rate", "100", "--workers", "1", "-c", "4", "--pool", "asyncio", "--keep"]
    done = run_cli(env, "bench", "--schema", bench_schema, *options, "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["setup"]["pool"] == "asyncio"
    assert report["phases"]["burn_down"]["tasks"] == 200
    assert report["phases"]["latency"]["p50_ms"] > 0
    names = dict(
        db.execute(
            sql.SQL("SELECT name, count(*) FROM {}.tasks GROUP BY name").format(
                sql.Identifier(bench_schema)
            )
        ).fetchall()
    )
    # The warm-up call and the samples of the latency phase, and the burn-down's 200.
    assert names == {"pgtasks.bench.anoop": 200, "pgtasks.bench.astamp": 11}


def _table(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def _rows_in(db: psycopg.Connection[Any], schema: str, table: str) -> int:
    """Rows of the bench's ``table``, 0 while the bench has not created it."""
    found = db.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.{table}",)).fetchone()
    if not found or not found[0]:
        return 0
    row = db.execute(sql.SQL("SELECT count(*) FROM {}").format(_table(schema, table))).fetchone()
    return int(row[0]) if row else 0


def _checkpoints(db: psycopg.Connection[Any]) -> int:
    """Checkpoints the server has made so far (pg_stat_checkpointer from PostgreSQL 17 on)."""
    if db.info.server_version >= 170000:
        query = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    else:
        query = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _vacuums(db: psycopg.Connection[Any], schema: str) -> int:
    """Vacuums finished so far on the bench's three growing tables (created with the schema)."""
    row = db.execute(
        "SELECT sum(vacuum_count + autovacuum_count) FROM pg_stat_all_tables"
        " WHERE schemaname = %s AND relname IN ('tasks', 'results', 'attempts')",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _per_window(windows: list[dict[str, Any]], key: str, window: float) -> list[int]:
    """A per-second figure of each window as the count of tasks it stands for."""
    return [round(w[key] * window) for w in windows]


def test_steady_phase_reports_latency_sizes_and_maintenance_per_window(
    env: dict[str, str], bench_schema: str, db: psycopg.Connection[Any]
) -> None:
    # Two seconds in windows of half a second: the figures mean nothing, the report's shape
    # and its counts do. A vacuum is made to finish during the phase (a checkpoint would be
    # too, but on a busy server one can take longer than the phase).
    checkpoints_before = _checkpoints(db)
    options = ["--only", "steady", "--steady-seconds", "2", "--window-seconds", "0.5"]
    options += ["--steady-rate", "40", "--steady-retention", "0", "--workers", "1"]
    options += ["--hold-snapshot", "--keep", "--json"]
    with started_cli(env, "bench", "--schema", bench_schema, *options) as proc:
        # Rows beyond the warm-up's: the phase has read its counters and is sending.
        wait_for(
            lambda: _rows_in(db, bench_schema, "tasks") + _rows_in(db, bench_schema, "results") > 1,
            what="the steady phase to send",
        )
        db.execute(sql.SQL("VACUUM {}").format(_table(bench_schema, "tasks")))
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    steady = json.loads(stdout)["phases"]["steady"]
    assert steady["held_snapshot"] is True
    assert "under a held snapshot" in stderr
    assert "warning: the steady figures come from windows of 0.5 s" in stderr
    assert steady["offered_per_second"] == 40 and steady["window_seconds"] == 0.5
    # No finished row kept: the latency still comes from the results, kept for a minute.
    assert steady["retention_seconds"] == 0 and steady["results_kept_seconds"] == 60

    windows = steady["windows"]
    assert len(windows) == 4
    sent = _per_window(windows, "sent_per_second", 0.5)
    finished = _per_window(windows, "finished_per_second", 0.5)
    # The phase is whole windows: every task sent is in one, at no more than the offered rate.
    assert sum(sent) == steady["sent"] <= 2 * 40
    # Everything sent is in the kept schema: the warm-up's result and the sent tasks, each a
    # waiting row or a result (a success deletes its row when no finished row is kept).
    results = _rows_in(db, bench_schema, "results")
    assert _rows_in(db, bench_schema, "tasks") + results == steady["sent"] + 1
    # The windows count what finished after the warm-up, and the workers finished something.
    assert 0 < sum(finished) <= results - 1
    for window, sent_so_far, finished_so_far in zip(
        windows, itertools.accumulate(sent), itertools.accumulate(finished), strict=True
    ):
        assert window["unfinished"] == max(0, sent_so_far - finished_so_far)
        # A window in which nothing finished has no latency.
        if window["finished_per_second"]:
            assert 0 < window["p50_ms"] <= window["p99_ms"]
        else:
            assert window["p50_ms"] is None and window["p99_ms"] is None
        assert window["tasks_mb"] > 0 and window["results_mb"] > 0
    # The vacuum made during the phase is in its windows; no window counts more vacuums than
    # the tables had, or more checkpoints than the server made meanwhile.
    assert 1 <= steady["vacuums"] == sum(w["vacuums"] for w in windows)
    assert steady["vacuums"] <= _vacuums(db, bench_schema)
    assert steady["checkpoints"] == sum(w["checkpoints"] for w in windows)
    assert steady["checkpoints"] <= _checkpoints(db) - checkpoints_before
    vacuums = "1 vacuum" if steady["vacuums"] == 1 else f"{steady['vacuums']} vacuums"
    assert f"; {vacuums} " in stderr
    assert steady["wal_bytes_per_task"] > 0
    assert steady["worker_cpu_ms_per_1000_tasks"] > 0
    # Whether the workers kept up follows from what was left at the end, and says so.
    assert steady["unfinished_at_end"] == windows[-1]["unfinished"]
    assert steady["kept_up"] is (steady["unfinished_at_end"] <= 40 * 2.0)
    assert steady["finished_per_second_second_half"] == pytest.approx(sum(finished[2:]) / (2 * 0.5))
    assert (steady["suggested_rate"] is None) is steady["kept_up"]
    verdict = "the workers kept up" if steady["kept_up"] else "the workers fell behind"
    assert "steady:" in stderr and verdict in stderr
    off = db.execute("SELECT current_setting('autovacuum') = 'off'").fetchone()
    assert off is not None and steady["autovacuum_off"] is off[0]
    assert ("autovacuum is off" in stderr) is off[0]


def test_capacity_is_measured_with_enqueueing_alongside_and_sets_the_steady_rate(
    env: dict[str, str], bench_schema: str
) -> None:
    options = ["--only", "capacity,steady", "--window-seconds", "0.5"]
    options += ["--capacity-seconds", "1", "--steady-seconds", "0.5", "--workers", "1"]
    done = run_cli(env, "bench", "--schema", bench_schema, *options, "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    phases = report["phases"]
    capacity = phases["capacity"]
    assert capacity["backlog"] == 5000 and capacity["window_seconds"] == 0.5
    assert "warning: the capacity and steady figures come from windows of 0.5 s" in done.stderr
    windows = capacity["windows"]
    assert len(windows) == 2
    sent = _per_window(windows, "sent_per_second", 0.5)
    assert sum(sent) == capacity["sent"]
    # The queue is filled at once, then kept topped up: what is sent follows what is
    # finished, never far ahead.
    assert sent[0] >= 5000
    assert sum(_per_window(windows, "finished_per_second", 0.5)) > 0
    for window in windows:
        assert window["unfinished"] <= 5000 + 1000
    # Shorter than the minute results are kept: measured over the second half, and said so.
    assert capacity["tasks_per_second"] == windows[1]["finished_per_second"]
    assert capacity["pruning_included"] is False and capacity["measured_from_s"] == 0.5
    assert "without the pruning's cost: give --capacity-seconds 62 or more" in done.stderr
    assert capacity["bench_cpu_ms_per_1000_tasks"] > 0
    assert "capacity:" in done.stderr and "while enqueueing alongside" in done.stderr
    # Without --steady-rate, the steady phase offers 80% of the capacity.
    assert phases["steady"]["offered_per_second"] == pytest.approx(
        0.8 * capacity["tasks_per_second"]
    )
    # The printed report shows each load phase window by window, at its own length.
    text = format_report(report).splitlines()
    at = text.index("capacity, every 0.5 s:")
    assert [line.split()[:2] for line in text[at + 2 : at + 4]] == [
        [f"{w['at_s']:.1f}", "s"] for w in windows
    ]
    assert "steady, every 0.5 s:" in text


def test_steady_without_a_rate_needs_the_burn_down(env: dict[str, str], bench_schema: str) -> None:
    done = run_cli(env, "bench", "--schema", bench_schema, "--only", "steady")
    assert done.returncode != 0
    assert "--steady-rate" in done.stderr


def test_only_enqueue_prints_the_table_and_keep_leaves_a_reusable_schema(
    env: dict[str, str], bench_schema: str, db: psycopg.Connection[Any]
) -> None:
    kept = run_cli(
        env, "bench", "--schema", bench_schema, "--tasks", "400", "--only", "enqueue", "--keep"
    )
    assert kept.returncode == 0, kept.stderr
    lines = kept.stdout.strip().splitlines()
    assert lines[0].split() == ["PHASE", "VALUE", "UNIT"]
    phases = [line for line in lines[1:] if line.endswith(("tasks/s", "ms"))]
    assert [p.rsplit(None, 2)[0] for p in phases] == [
        "enqueue one by one",
        "commit flush per enqueue",
        "bulk enqueue",
    ]
    rates = [p for p in phases if p.endswith("tasks/s")]
    assert len(rates) == 2 and all(float(p.split()[-2].replace(",", "")) > 0 for p in rates)
    assert lines[-1].startswith("PostgreSQL ") and "400 tasks" in lines[-1]
    assert "burn-down" not in kept.stdout and "latency" not in kept.stdout
    assert schema_comment(db, bench_schema) == (True, "pgtasks bench")

    # A schema the bench created (kept, or left by an interrupted run) is taken back freely.
    again = run_cli(
        env, "bench", "--schema", bench_schema, "--tasks", "400", "--only", "enqueue", "--json"
    )
    assert again.returncode == 0, again.stderr
    assert set(json.loads(again.stdout)["phases"]) == {"enqueue", "bulk_enqueue"}
    assert schema_comment(db, bench_schema) == (False, None)


def test_refuses_a_schema_it_did_not_create(
    env: dict[str, str], bench_schema: str, db: psycopg.Connection[Any]
) -> None:
    ident = sql.Identifier(bench_schema)
    db.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    db.execute(sql.SQL("CREATE TABLE {}.precious (x int)").format(ident))

    refused = run_cli(env, "bench", "--schema", bench_schema, "--only", "enqueue")
    assert refused.returncode == 1
    assert_one_clean_error(refused.stderr)
    assert "not created by pgtasks bench" in refused.stderr and "--force" in refused.stderr
    assert schema_comment(db, bench_schema) == (True, None)
    assert db.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{bench_schema}.precious",)
    ).fetchone() == (True,)

    forced = run_cli(
        env, "bench", "--schema", bench_schema, "--only", "enqueue", "--tasks", "10", "--force"
    )
    assert forced.returncode == 0, forced.stderr
    assert schema_comment(db, bench_schema) == (False, None)


def test_bad_phase_short_phases_and_missing_database_are_usage_errors(pg_dsn: str) -> None:
    env = cli_env(pg_dsn, "unused")
    bad = run_cli(env, "bench", "--only", "enqueue,warp")
    assert bad.returncode == 2
    assert "unknown phase 'warp'" in bad.stderr
    # The capacity phase measures its second half: two windows at least; steady one.
    short = run_cli(env, "bench", "--only", "capacity", "--capacity-seconds", "19")
    assert short.returncode == 2
    assert "--capacity-seconds must cover two windows of 10 s" in short.stderr
    assert "give 20 or more" in short.stderr
    short = run_cli(
        env, "bench", "--only", "capacity", "--window-seconds", "1", "--capacity-seconds", "1.5"
    )
    assert short.returncode == 2 and "give 2 or more" in short.stderr
    short = run_cli(env, "bench", "--only", "steady", "--steady-rate", "5", "--steady-seconds", "9")
    assert short.returncode == 2
    assert "--steady-seconds must cover a window of 10 s" in short.stderr
    del env["PGTASKS_DATABASE_URL"]
    missing = run_cli(env, "bench")
    assert missing.returncode == 2
    assert "--database-url" in missing.stderr
