"""Claims: one owner per row across worker processes, claim order, and due times."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgtasks import Celery
from pgtasks.broker import Broker
from pgtasks.records import Success
from pgtasks.worker import Worker
from tests.apps import coord
from tests.apps.harness import (
    describe_all,
    one,
    remote,
    rows,
    task_row,
    wait_until,
    worker_processes,
)

WorkerFactory = Callable[..., AbstractContextManager[Worker]]
JSON = "application/json"


def test_worker_processes_never_share_a_task(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    total = 400
    with (
        worker_processes(pg_dsn, schema, ["claims-fork-1", "claims-fork-2"], pool="prefork") as a,
        worker_processes(pg_dsn, schema, ["claims-thread-1", "claims-thread-2"]) as b,
    ):
        workers = a + b
        for worker in workers:
            worker.wait_ready(db)
        remote(app, coord.RECORD).apply_many([((i,), {"sleep": 0.005}) for i in range(total)])
        wait_until(
            lambda: (
                one(db, "SELECT count(*) AS n FROM tasks WHERE status = 'COMPLETED'")["n"] == total
            ),
            timeout=45,
            what=f"{total} tasks to complete",
            details=describe_all(workers),
        )
        assert all(w.alive() for w in workers), describe_all(workers)()
        assert not [p for w in workers for p in w.problems()], describe_all(workers)()

    runs = rows(db, "SELECT * FROM executions")
    assert len(runs) == total
    assert len({r["task_id"] for r in runs}) == total
    assert {r["attempt"] for r in runs} == {1}
    assert {r["runs"] for r in runs} == {1}, "a claim was executed twice"
    assert all(r["finished_at"] is not None for r in runs)

    history = rows(db, "SELECT * FROM attempts")
    assert len(history) == total
    assert {(h["attempt"], h["outcome"]) for h in history} == {(1, "completed")}
    ran_on = {r["task_id"]: r["worker"] for r in runs}
    assert all(ran_on[h["task_id"]] == h["worker"] for h in history)

    final = rows(db, "SELECT status, attempt, claimed_by, lease_until FROM tasks")
    assert {(t["status"], t["attempt"], t["claimed_by"], t["lease_until"]) for t in final} == {
        ("COMPLETED", 1, None, None)
    }
    # Every process took part, so the claims really raced.
    assert set(ran_on.values()) == {w.name for w in workers}


def test_concurrent_claims_take_disjoint_rows(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task
    def noop() -> None:
        """Never runs: the test claims directly."""

    total, claimers = 2000, 8
    noop.apply_many([() for _ in range(total)])
    barrier = threading.Barrier(claimers)

    def claim_all(worker: str) -> list[tuple[str, int]]:
        barrier.wait()
        mine: list[tuple[str, int]] = []
        while batch := app.broker.claim(worker, ["celery"], 7, 30.0):
            mine.extend((t.id, t.attempt) for t in batch)
        return mine

    with ThreadPoolExecutor(claimers) as pool:
        futures = {f"claimer-{i}": pool.submit(claim_all, f"claimer-{i}") for i in range(claimers)}
        got = {name: f.result(timeout=60) for name, f in futures.items()}

    claimed = [task_id for mine in got.values() for task_id, _ in mine]
    assert len(claimed) == total
    assert len(set(claimed)) == total, "a row was claimed by two claimers"
    assert {attempt for mine in got.values() for _, attempt in mine} == {1}
    assert sum(1 for mine in got.values() if mine) > 1, "the claims did not overlap"
    owner = {task_id: name for name, mine in got.items() for task_id, _ in mine}
    in_db = rows(db, "SELECT id, status, claimed_by, attempt FROM tasks")
    assert all(
        r["status"] == "RUNNING" and r["claimed_by"] == owner[r["id"]] and r["attempt"] == 1
        for r in in_db
    )


def test_claim_order_is_priority_then_run_at_then_created_at(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task
    def noop() -> None:
        """Never runs: the test claims directly."""

    now = one(db, "SELECT now() AS now")["now"]
    # id: (priority, run_at relative to now). Ids sort differently from the expected order.
    specs = {
        "e-lowest-priority-oldest-eta": (-3, -100),
        "c-created-later": (0, -10),
        "a-prio5-due-later": (5, -1),
        "f-future": (9, 3600),
        "d-created-earlier": (0, -10),
        "b-prio5-due-earlier": (5, -5),
    }
    for task_id, (priority, offset) in specs.items():
        noop.apply_async(task_id=task_id, priority=priority, eta=now + timedelta(seconds=offset))
    noop.apply_async(task_id="g-other-queue", priority=100, queue="other", eta=now)
    db.execute(
        "UPDATE tasks SET created_at = now() - CASE id WHEN 'd-created-earlier' THEN"
        " interval '1 hour' ELSE interval '1 minute' END WHERE id LIKE 'c-%' OR id LIKE 'd-%'"
    )

    order = []
    for _ in range(len(specs) + 1):
        claimed = app.broker.claim("orderly", ["celery"], 1, 30.0)
        assert len(claimed) <= 1
        if not claimed:
            break
        order.append(claimed[0].id)

    assert order == [
        "b-prio5-due-earlier",
        "a-prio5-due-later",
        "d-created-earlier",
        "c-created-later",
        "e-lowest-priority-oldest-eta",
    ]
    assert task_row(db, "f-future")["status"] == "PENDING"
    assert task_row(db, "g-other-queue")["status"] == "PENDING"
    assert [t.id for t in app.broker.claim("orderly", ["other"], 5, 30.0)] == ["g-other-queue"]


def test_claim_across_queues_keeps_priority_order(app: Celery) -> None:
    @app.task
    def noop() -> None:
        """Never runs: the test claims directly."""

    for task_id, queue, priority in [
        ("q1-low", "q1", 1),
        ("q2-high", "q2", 8),
        ("q3-mid", "q3", 5),
        ("q1-top", "q1", 9),
        ("q2-mid", "q2", 4),
        ("q4-ignored", "q4", 100),
    ]:
        noop.apply_async(task_id=task_id, queue=queue, priority=priority)

    queues = ["q1", "q2", "q3"]
    [first] = app.broker.claim("multi", queues, 1, 30.0)
    assert first.id == "q1-top"
    assert {t.id for t in app.broker.claim("multi", queues, 2, 30.0)} == {"q2-high", "q3-mid"}
    order = [app.broker.claim("multi", queues, 1, 30.0) for _ in range(3)]
    assert [[t.id for t in batch] for batch in order] == [["q2-mid"], ["q1-low"], []]
    assert [t.id for t in app.broker.claim("multi", ["q4"], 5, 30.0)] == ["q4-ignored"]


def test_future_eta_and_countdown_are_not_claimed_early(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task
    def noop() -> None:
        """Never runs: the test claims directly."""

    now = one(db, "SELECT now() AS now")["now"]
    by_countdown = noop.apply_async(countdown=3600)
    by_eta = noop.apply_async(eta=now + timedelta(hours=2))

    # countdown is added to the database's now() in the inserting statement.
    delay = one(
        db,
        "SELECT extract(epoch FROM run_at - created_at) AS s FROM tasks WHERE id = %s",
        (by_countdown.id,),
    )["s"]
    assert delay == 3600
    assert task_row(db, by_eta.id)["run_at"] == now + timedelta(hours=2)
    assert app.broker.claim("early", ["celery"], 10, 30.0) == []

    db.execute(
        "UPDATE tasks SET run_at = now() - interval '1 millisecond' WHERE id = %s",
        (by_countdown.id,),
    )
    assert [t.id for t in app.broker.claim("early", ["celery"], 10, 30.0)] == [by_countdown.id]
    assert task_row(db, by_eta.id)["status"] == "PENDING"

    db.execute("UPDATE tasks SET run_at = now() + interval '1 second' WHERE id = %s", (by_eta.id,))
    assert app.broker.claim("early", ["celery"], 10, 30.0) == []
    db.execute("UPDATE tasks SET run_at = now() WHERE id = %s", (by_eta.id,))
    assert [t.id for t in app.broker.claim("early", ["celery"], 10, 30.0)] == [by_eta.id]


def test_worker_leaves_a_countdown_task_until_it_is_due(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    ran: list[str] = []

    @app.task
    def mark(label: str) -> str:
        ran.append(label)
        return label

    with worker_factory():
        later = mark.apply_async(("later",), countdown=3600, priority=9)
        # Due now but lower priority: had the worker taken `later` early, it would have taken it
        # first, so once this one is done the worker has passed over `later` at least once.
        now = mark.apply_async(("now",), priority=0)
        assert now.get(timeout=10) == "now"
        row = task_row(db, later.id)
        assert (row["status"], row["attempt"]) == ("PENDING", 0)
        assert later.state == "PENDING"

        db.execute("UPDATE tasks SET run_at = now() WHERE id = %s", (later.id,))
        assert later.get(timeout=10) == "later"
    assert ran == ["now", "later"]


def own_connections(broker: Broker) -> dict[str, list[psycopg.Connection[Any]]]:
    """The connections ``broker`` opens for a worker's claims and outcomes from now on."""
    opened: dict[str, list[psycopg.Connection[Any]]] = {"claims": [], "outcomes": []}
    for kind, name in (("claims", "claim_connection"), ("outcomes", "completion_connection")):
        make = getattr(broker, name)

        def spy(make: Any = make, kind: str = kind) -> psycopg.Connection[Any]:
            conn = make()
            opened[kind].append(conn)
            return conn

        setattr(broker, name, spy)
    return opened


def used(db: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> bool:
    """Whether the session of ``conn`` has run a statement (as the server sees it)."""
    found = db.execute(
        "SELECT query <> '' FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
    ).fetchone()
    return bool(found and found[0])


def test_claims_commit_asynchronously_on_the_worker_claim_connection(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="claims.ping")
    def ping() -> str:
        return "pong"

    opened = own_connections(app.broker)
    with worker_factory(pool="threads", concurrency=1):
        assert ping.delay().get(timeout=10) == "pong"
        [conn], [outcomes] = opened["claims"], opened["outcomes"]
        assert not conn.closed and not outcomes.closed
        assert used(db, conn) and used(db, outcomes)
        # Claims only: outcomes (on the completer's connection) and the pool's connections
        # (renewals) keep durable commits.
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        assert outcomes.execute("SHOW synchronous_commit").fetchone() == ("on",)
        with app.broker.pool.connection() as pooled:
            assert pooled.execute("SHOW synchronous_commit").fetchone() == ("on",)
        # Claims and outcomes keep the plan made once.
        for own in (conn, outcomes):
            assert own.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
        # No statement of a worker is compiled by JIT (see the test below).
        with app.broker.pool.connection() as pooled:
            for session in (conn, outcomes, pooled):
                assert session.execute("SHOW jit").fetchone() == ("off",)
    assert conn.closed and outcomes.closed  # closed with the worker


def cursors_of(conn: psycopg.Connection[Any]) -> int:
    """How many cursors of ``conn`` are alive."""
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        # By type(), not isinstance(): a lazy proxy (Django's settings) would evaluate itself.
        if issubclass(type(o), psycopg.Cursor) and not o.closed and o.connection is conn
    )


def test_claims_reuse_a_few_cursors_however_many_there_are(
    app: Celery, worker_factory: WorkerFactory
) -> None:
    """A worker's claim connection lives as long as the worker and keeps a cursor per kind of
    row, not one per claim (which grew the worker's memory, and the pauses of Python's
    collector, without end)."""

    @app.task(name="claims.echo")
    def echo(value: int) -> int:
        return value

    opened = own_connections(app.broker)
    with worker_factory(pool="threads", concurrency=1):
        counts = []
        for round in range(6):
            # In bulk, so that they are claimed rather than handed to the idle worker.
            results = echo.apply_many([(round * 3 + i,) for i in range(3)])
            assert [r.get(timeout=10) for r in results] == [round * 3 + i for i in range(3)]
            [conn] = opened["claims"]
            counts.append(cursors_of(conn))
        # Bounded by the kinds of claim made (the plain and the full claim, a handed row),
        # whichever of them a round used; a cursor per claim would pass 3 by the fourth round.
        assert all(1 <= count <= 3 for count in counts), counts


def test_plans_made_on_an_empty_table_still_find_rows_by_index_when_it_grows(
    app: Celery, db: psycopg.Connection[Any], schema: str
) -> None:
    # A worker's claim and outcome statements keep the generic plan made at their first
    # executions. Made on an empty table, where reading the table is cheapest, such a plan
    # read the whole table for every claim and completion once thousands of rows had come,
    # until autovacuum's ANALYZE; the sessions rule that plan out.
    broker = app.broker
    claims, outcomes = broker.claim_connection(), broker.completion_connection()
    try:

        def seq_scans() -> int:
            found = one(
                db,
                "SELECT seq_scan AS n FROM pg_stat_user_tables"
                " WHERE schemaname = %s AND relname = 'tasks'",
                (schema,),
            )
            return int(found["n"])

        def claim(limit: int) -> list[Any]:
            return broker.claim_all("plans@host", ["celery"], limit, 30.0, claims)

        def complete(claimed: list[Any]) -> dict[str, str]:
            done = [Success(r.id, r.attempt, False, JSON, None, None) for r in claimed]
            return broker.complete("plans@host", done, outcomes)

        ghost = Success("no-such-task", 1, False, JSON, None, None)
        for _ in range(8):  # past the prepare threshold: the plans are made now
            assert claim(10) == []
            assert broker.complete("plans@host", [ghost], outcomes) == {}
        db.execute(
            "INSERT INTO tasks (id, name, payload)"
            " SELECT gen_random_uuid()::text, 'plans.noop', '[[], {}, {}]'"
            "   FROM generate_series(1, 5000)"
        )
        for conn in (claims, outcomes):
            conn.execute("SELECT pg_stat_force_next_flush()")
        before = seq_scans()
        for _ in range(3):
            claimed = claim(10)
            assert len(claimed) == 10
            assert set(complete(claimed).values()) == {"COMPLETED"}
        for conn in (claims, outcomes):
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT 1")  # the flush comes when the session is next idle
        assert seq_scans() == before
    finally:
        claims.close()
        outcomes.close()


def test_sessions_turn_jit_off_and_keep_the_dsn_options(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a large analyzed backlog the claim's plan costs more than jit_above_cost, and
    # compiling it took far longer than running it: pgtasks' sessions turn JIT off. The
    # options of the DSN (or of PGOPTIONS) are kept beside it, and win over pgtasks' own.
    dsn = make_conninfo(pg_dsn, options="-c statement_timeout=4321 -c jit=on")
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=999")
    broker = Broker(dsn, schema)
    plain = Broker(pg_dsn, schema)
    try:
        own = [broker.claim_connection(), broker.completion_connection()]
        with broker.pool.connection() as pooled:
            for session in (*own, pooled):
                assert session.execute("SHOW statement_timeout").fetchone() == ("4321ms",)
                assert session.execute("SHOW jit").fetchone() == ("on",)  # the DSN's choice
                assert session.execute("SHOW lock_timeout").fetchone() == ("0",)
        assert own[0].execute("SHOW synchronous_commit").fetchone() == ("off",)
        for conn in own:
            conn.close()
        # Without options in the DSN, PGOPTIONS is read as libpq would.
        claims = plain.claim_connection()
        with plain.pool.connection() as pooled:
            for session in (claims, pooled):
                assert session.execute("SHOW lock_timeout").fetchone() == ("999ms",)
                assert session.execute("SHOW jit").fetchone() == ("off",)
        claims.close()
    finally:
        broker.close()
        plain.close()


def test_claims_use_the_pool_without_prepared_statements(
    app: Celery, worker_factory: WorkerFactory
) -> None:
    app.conf.update(prepared_statements=False)  # how pgtasks runs behind PgBouncer
    app.close()  # the next broker is built with it

    @app.task(name="claims.ping_bouncer")
    def ping() -> str:
        return "pong"

    opened = own_connections(app.broker)
    with worker_factory(pool="threads", concurrency=1):
        assert ping.delay().get(timeout=10) == "pong"
    # A session's settings would not outlive a transaction behind PgBouncer.
    assert opened == {"claims": [], "outcomes": []}


def test_a_claim_keeps_each_row_on_its_page(app: Celery, db: psycopg.Connection[Any]) -> None:
    """The table keeps room on its pages (fillfactor, migration 0015) for the version a claim
    writes: written elsewhere, each would cost another page, a look in the free space map and a
    lock record in the write-ahead log. (The outcome's version fits too once the enqueued one is
    pruned, which another session's open snapshot can put off: not asserted here.)"""

    @app.task
    def noop(note: str) -> None:
        """Never runs: the test claims and completes directly."""

    options = one(db, "SELECT reloptions FROM pg_class WHERE oid = 'tasks'::regclass")
    assert "fillfactor=50" in (options["reloptions"] or [])

    total = 600
    noop.apply_many([(f"note {i:04d} " + "x" * 40,) for i in range(total)])

    def pages() -> dict[str, int]:
        found = rows(db, "SELECT id, (ctid::text::point)[0]::int AS page FROM tasks")
        return {r["id"]: r["page"] for r in found}

    enqueued = pages()
    claimed = []
    while batch := app.broker.claim("paged", ["celery"], 100, 30.0):
        claimed.extend(batch)
    assert len(claimed) == total
    moved = sum(page != enqueued[task_id] for task_id, page in pages().items())
    # With every page full (PostgreSQL's default), nearly every row moves: 577 of 600 here.
    assert moved <= total // 10, f"{moved} of {total} claimed rows left their page"

    done = app.broker.complete(
        "paged", [Success(t.id, t.attempt, False, JSON, None, None) for t in claimed]
    )
    assert set(done.values()) == {"COMPLETED"} and len(done) == total
