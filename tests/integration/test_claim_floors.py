"""Claims, reclaims and retention from floors: what they skip, what they still find, and that
the index search really starts at the floor while an old snapshot keeps dead entries around."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtasks import Celery
from pgtasks.maintenance import Pruner, Reclaimer
from pgtasks.sql import queries
from pgtasks.worker.floors import PRIORITY_MAX, PRIORITY_MIN, Floors, Gate
from tests.apps.harness import one, wait_until

WORKER = "floors-test@host"


def always_floors() -> Floors:
    """Floors that turn on after any full claim, with no full claim for a minute."""
    return Floors(gate=Gate(slow=0.0, min_full_every=60.0))


def claim(app: Celery, floors: Floors, limit: int) -> list[Any]:
    plan = floors.plan(["celery"])
    rows = app.broker.claim(WORKER, ["celery"], limit, 30.0, floors=plan)
    floors.record(plan, rows, 0.0, time.monotonic())
    return rows


def enqueue(
    db: psycopg.Connection[Any], priorities: list[int], ago: float = 0.0, apart: float = 1e-6
) -> None:
    """PENDING rows due from ``ago`` seconds ago on, ``apart`` seconds apart in list order."""
    db.execute(
        "INSERT INTO tasks (id, name, priority, run_at, created_at, payload)"
        " SELECT gen_random_uuid()::text, 'floors.noop', p,"
        "        now() - make_interval(secs => %s) + make_interval(secs => i * %s),"
        "        now() + i * interval '1 microsecond', '[[], {}, {}]'"
        "   FROM unnest(%s::int[]) WITH ORDINALITY AS t(p, i)",
        (ago, apart, priorities),
    )


def due_in_claim_order(db: psycopg.Connection[Any]) -> list[str]:
    return [
        r[0]
        for r in db.execute(
            "SELECT id FROM tasks WHERE status = 'PENDING' AND run_at <= now()"
            " ORDER BY priority DESC, run_at, created_at"
        )
    ]


@dataclass
class Row:
    """A claimed row as floors see it."""

    queue: str
    priority: int
    run_at: datetime


def test_a_plan_covers_every_priority_once() -> None:
    floors = Floors(gate=Gate(slow=0.01, min_full_every=60.0))
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)

    floors.record(None, [Row("a", 5, at), Row("a", 0, at), Row("b", PRIORITY_MAX, at)], 1.0, 0.0)
    plan = floors.plan(["a", "b", "c"])
    assert plan is not None
    assert list(zip(plan.band_queues, plan.band_priorities, strict=True)) == [
        ("a", 5),
        ("a", 0),
        ("b", PRIORITY_MAX),
    ]
    assert list(zip(plan.gap_queues, plan.gap_lows, plan.gap_highs, strict=True)) == [
        ("a", 6, PRIORITY_MAX),
        ("a", 1, 4),
        ("a", PRIORITY_MIN, -1),
        ("b", PRIORITY_MIN, PRIORITY_MAX - 1),
        ("c", PRIORITY_MIN, PRIORITY_MAX),
    ]
    assert plan.band_floors == [at - floors.margin] * 3
    # A look behind the floors now and then, in the known bands only.
    assert floors.probe_plan(["a"], 59.0) is None
    probe = floors.probe_plan(["a"], 61.0)
    assert probe is not None
    assert (probe.band_priorities, probe.gap_queues) == ([5, 0], [])
    # A row found there: its band's floor moves back to it.
    floors.probe_done({("a", 0): at - timedelta(hours=1)}, 1.0, 61.0)
    plan = floors.plan(["a"])
    assert plan is not None
    assert plan.band_floors == [at - floors.margin, at - timedelta(hours=1)]
    # A fast look: floors off, full claims.
    floors.probe_done({}, 0.001, 200.0)
    assert not floors.active
    assert floors.plan(["a"]) is None


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    first=st.lists(st.sampled_from([0, 5, 9]), min_size=1, max_size=40),
    taken=st.integers(min_value=1, max_value=40),
    later=st.lists(
        st.sampled_from([PRIORITY_MIN, -3, 0, 2, 5, 7, 9, 12, PRIORITY_MAX]), max_size=40
    ),
    limit=st.integers(min_value=1, max_value=60),
)
def test_claims_from_floors_take_what_a_full_claim_would(
    app: Celery,
    db: psycopg.Connection[Any],
    first: list[int],
    taken: int,
    later: list[int],
    limit: int,
) -> None:
    db.execute("DELETE FROM tasks")
    floors = always_floors()
    enqueue(db, first, ago=5.0)
    claim(app, floors, taken)
    assert floors.active
    # Rows sent after the floors were set, at known priorities and new ones above, between and
    # below them: a claim takes the first ones in claim order, as a full claim would.
    enqueue(db, later)
    expected = due_in_claim_order(db)[:limit]
    assert sorted(r.id for r in claim(app, floors, limit)) == sorted(expected)


def test_a_row_behind_its_floor_is_found_by_the_probe_and_a_full_claim(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    floors = always_floors()
    enqueue(db, [0, 0, 0], ago=1.0)
    assert len(claim(app, floors, 3)) == 3
    # Within the margin: an enqueue that committed a little late is claimed from the floor.
    enqueue(db, [0], ago=1.1)
    assert len(claim(app, floors, 10)) == 1
    enqueue(db, [0], ago=3600.0)  # an eta an hour ago
    [late] = due_in_claim_order(db)
    assert claim(app, floors, 10) == []
    probe = floors.probe_plan(["celery"], floors.gate.next_full)
    assert probe is not None
    behind = app.broker.behind_floors(probe)
    assert behind == {
        ("celery", 0): one(db, "SELECT run_at FROM tasks WHERE id = %s", (late,))["run_at"]
    }
    floors.probe_done(behind, 1.0, time.monotonic())
    assert [r.id for r in claim(app, floors, 10)] == [late]
    probe = floors.probe_plan(["celery"], floors.gate.next_full)
    assert probe is not None
    assert app.broker.behind_floors(probe) == {}


@contextmanager
def held_snapshot(pg_dsn: str) -> Iterator[None]:
    """A transaction elsewhere whose snapshot keeps every row version from now on."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT txid_current()")
        try:
            yield
        finally:
            conn.rollback()


def index_reads(
    db: psycopg.Connection[Any],
    schema: str,
    name: str,
    params: dict[str, Any],
    index: str = "tasks_claim_idx",
) -> int:
    """Entries of ``index`` one run of the named query reads (rolled back)."""

    def total() -> int:
        found = one(
            db,
            "SELECT idx_tup_read AS n FROM pg_stat_user_indexes"
            " WHERE schemaname = %s AND indexrelname = %s",
            (schema, index),
        )
        return int(found["n"])

    query = queries(schema)[name]
    before = total()
    with db.transaction(force_rollback=True):
        db.execute("SELECT pg_stat_force_next_flush()")
        db.execute(query, params)
    return total() - before


def test_claims_from_floors_skip_the_entries_an_old_snapshot_keeps(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    floors = always_floors()
    with held_snapshot(pg_dsn):
        enqueue(db, [0] * 3000, ago=10.0, apart=0.003)
        while claim(app, floors, 200):
            pass
        enqueue(db, [0] * 5)
        common = {
            "worker": WORKER,
            "limit": 5,
            "scan": 5,
            "lease": 30.0,
            "rate_names": [],
            "rate_every": [],
        }
        full = index_reads(db, schema, "claim_batch", {**common, "queues": ["celery"]})
        plan = floors.plan(["celery"])
        assert plan is not None
        floored = index_reads(db, schema, "claim_batch_from_floors", {**common, **plan.params()})
    # The full claim reads the entry of every row claimed since the snapshot; the one from
    # floors only those within its margin (a quarter second: about 85 rows here).
    assert full >= 3000, full
    assert floored <= 150, floored


def test_fenced_writes_never_read_the_lease_index(
    app: Celery, db: psycopg.Connection[Any], schema: str
) -> None:
    # Statistics that make the lease index look tiny (it holds few live entries), as the
    # planner sees it while an old snapshot keeps every past lease's entry in it.
    enqueue(db, [0] * 20000)
    db.execute("UPDATE tasks SET status = 'COMPLETED' WHERE run_at < now()")
    enqueue(db, [0] * 5)
    db.execute("ANALYZE tasks")
    claimed = app.broker.claim(WORKER, ["celery"], 5, 30.0)
    assert len(claimed) == 5
    db.execute("SET plan_cache_mode = force_generic_plan")
    ids, attempts = [r.id for r in claimed], [r.attempt for r in claimed]
    renew = {"worker": WORKER, "ids": ids, "attempts": attempts, "lease": 30.0}
    outcomes = [
        {"id": i, "attempt": a, "started_us": 0} for i, a in zip(ids, attempts, strict=True)
    ]
    complete = {"worker": WORKER, "rows": json.dumps(outcomes)}
    for name, params in (
        ("renew_leases", renew),
        ("complete_batch", complete),
        ("complete_batch_unstored", complete),
    ):
        assert index_reads(db, schema, name, params, "tasks_lease_idx") == 0, name


def test_reclaim_from_a_floor_finds_new_expiries_and_a_full_one_the_rest(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    enqueue(db, [0, 0])
    a, b = (r.id for r in app.broker.claim(WORKER, ["celery"], 2, 30.0))
    reclaimer = Reclaimer(app.broker, 3)
    reclaimer.gate = Gate(slow=0.0, min_full_every=60.0)
    assert reclaimer.run_once() == 0  # full: sets the floor
    db.execute("UPDATE tasks SET lease_until = now() - interval '1 hour' WHERE id = %s", (a,))
    db.execute("UPDATE tasks SET lease_until = now() WHERE id = %s", (b,))
    assert reclaimer.run_once() == 1
    assert one(db, "SELECT status FROM tasks WHERE id = %s", (b,))["status"] == "PENDING"
    assert one(db, "SELECT status FROM tasks WHERE id = %s", (a,))["status"] == "RUNNING"
    reclaimer.gate.next_full = 0.0
    assert reclaimer.run_once() == 1
    assert one(db, "SELECT status FROM tasks WHERE id = %s", (a,))["status"] == "PENDING"


def test_prune_from_floors_takes_new_rows_and_a_full_pass_the_rest(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    pruner = Pruner(app.broker, task_age=60.0, result_age=60.0)
    pruner.gate = Gate(slow=0.0, min_full_every=60.0)
    assert pruner.run_once() == (0, 0)  # full: sets the floors
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    for task_id, age in ((old, "1 day"), (new, "61 seconds")):
        db.execute(
            "INSERT INTO tasks (id, name, status, updated_at, payload)"
            " VALUES (%s, 'floors.noop', 'COMPLETED', now() - %s::interval, '[[], {}, {}]')",
            (task_id, age),
        )
    assert pruner.run_once() == (1, 0)
    assert one(db, "SELECT count(*) AS n FROM tasks WHERE id = %s", (new,))["n"] == 0
    pruner.gate.next_full = 0.0
    assert pruner.run_once() == (1, 0)
    assert one(db, "SELECT count(*) AS n FROM tasks")["n"] == 0


def test_a_prune_backlog_is_read_from_where_each_batch_stopped(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, monkeypatch: Any
) -> None:
    # Under an old snapshot, a statement that starts from the oldest entry walks every row the
    # pruner deleted since: through a backlog, each statement must start where the last one
    # stopped, within a pass and into the next.
    db.execute(
        "INSERT INTO tasks (id, name, status, updated_at, payload)"
        " SELECT gen_random_uuid()::text, 'floors.noop', 'COMPLETED',"
        "        now() - interval '1 hour' + i * interval '1 second', '[[], {}, {}]'"
        "   FROM generate_series(1, 45) AS i"
    )
    finished = [r[0] for r in db.execute("SELECT updated_at FROM tasks ORDER BY updated_at")]
    pruner = Pruner(app.broker, task_age=60.0, result_age=86400.0)
    pruner.gate = Gate(slow=0.0, min_full_every=60.0)
    monkeypatch.setattr(Pruner, "BATCH", 10)
    monkeypatch.setattr(Pruner, "MAX_BATCHES", 3)
    floors: list[datetime | None] = []
    prune = app.broker.prune

    def spy(*args: Any) -> Any:
        floors.append(args[3][0])
        return prune(*args)

    monkeypatch.setattr(app.broker, "prune", spy)
    with held_snapshot(pg_dsn):
        assert pruner.run_once() == (30, 0)
        assert pruner.run_once() == (15, 0)
    assert one(db, "SELECT count(*) AS n FROM tasks")["n"] == 0
    # One statement from the oldest entry; the others from the newest row the last one took.
    assert floors[:5] == [None, finished[9], finished[19], finished[29], finished[39]]


def test_a_reclaim_backlog_goes_on_from_the_last_lease_taken_back(
    app: Celery, db: psycopg.Connection[Any], monkeypatch: Any
) -> None:
    enqueue(db, [0] * 5)
    ids = [r.id for r in app.broker.claim(WORKER, ["celery"], 5, 30.0)]
    db.execute(
        "UPDATE tasks SET lease_until = now() - interval '1 hour' + n * interval '1 second'"
        "  FROM unnest(%s::text[]) WITH ORDINALITY AS o(id, n) WHERE tasks.id = o.id",
        (ids,),
    )
    expiries = [r[0] for r in db.execute("SELECT lease_until FROM tasks ORDER BY lease_until")]
    reclaimer = Reclaimer(app.broker, 3)
    monkeypatch.setattr(Reclaimer, "BATCH", 2)
    floors: list[datetime | None] = []
    reclaim_from = app.broker.reclaim_from

    def spy(floor: datetime | None, *args: Any, **kwargs: Any) -> Any:
        floors.append(floor)
        return reclaim_from(floor, *args, **kwargs)

    monkeypatch.setattr(app.broker, "reclaim_from", spy)
    assert [reclaimer.run_once() for _ in range(3)] == [2, 2, 1]
    assert floors == [None, expiries[1], expiries[3]]
    assert one(db, "SELECT count(*) AS n FROM tasks WHERE status = 'PENDING'")["n"] == 5


def test_a_worker_on_floors_runs_every_task(app: Celery, worker_factory: Any) -> None:
    @app.task
    def mark(i: int) -> int:
        return i

    with worker_factory(concurrency=2) as w:
        # Floors from the next claim on, and a look behind them at every maintenance pass.
        w.floors.gate = Gate(slow=0.0, min_full_every=0.0, cost_factor=0.0)
        results = [mark.apply_async((i,), priority=i % 3) for i in range(60)]
        results.append(mark.apply_async((99,), eta=datetime.now(timezone.utc) - timedelta(hours=1)))
        wait_until(lambda: w.floors.active, timeout=10, what="claims from floors")
        assert [r.get(timeout=15) for r in results] == [*range(60), 99]


def test_a_row_due_at_minus_infinity_leaves_the_floors_usable() -> None:
    """'-infinity' (set by hand) reads as the earliest datetime, which has no room for the
    margin below it: such a row never becomes a floor, and one found behind a floor makes
    its band read in full until claims learn a floor again."""
    floors = Floors(gate=Gate(slow=0.01, min_full_every=60.0))
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    earliest = datetime.min.replace(tzinfo=timezone.utc)

    floors.record(None, [Row("a", 0, earliest), Row("a", 5, at), Row("a", 5, earliest)], 1.0, 0.0)
    plan = floors.plan(["a"])
    assert plan is not None
    assert list(zip(plan.band_priorities, plan.band_floors, strict=True)) == [
        (5, at - floors.margin)
    ]
    assert (PRIORITY_MIN, 4) in zip(plan.gap_lows, plan.gap_highs, strict=True)
    floors.probe_done({("a", 5): earliest}, 1.0, 61.0)
    plan = floors.plan(["a"])
    assert plan is not None
    assert (plan.band_priorities, plan.gap_lows, plan.gap_highs) == (
        [],
        [PRIORITY_MIN],
        [PRIORITY_MAX],
    )


def test_a_worker_on_floors_runs_a_row_due_at_minus_infinity(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task
    def mark(i: int) -> int:
        return i

    with worker_factory(concurrency=2) as w:
        w.floors.gate = Gate(slow=0.0, min_full_every=0.0, cost_factor=0.0)
        first = [mark.delay(i) for i in range(5)]
        assert [r.get(timeout=15) for r in first] == list(range(5))
        assert w.floors.active
        odd = mark.apply_async((99,), countdown=3600)
        db.execute("UPDATE tasks SET run_at = '-infinity' WHERE id = %s", (odd.id,))
        later = [mark.delay(i) for i in range(5, 10)]
        assert [r.get(timeout=15) for r in later] == list(range(5, 10))
        assert odd.get(timeout=15) == 99
