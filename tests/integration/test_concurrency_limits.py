"""Global concurrency limits against a real PostgreSQL: at most N running tasks per key across
every worker, decided in the claim; rows over a limit wait BLOCKED, out of the way of every
other task, and move on when a running task of their key ends, however it ends."""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import pq, sql
from psycopg.types.json import Jsonb

from pgtasks import Celery
from pgtasks.broker import Broker
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.maintenance import Reclaimer
from pgtasks.records import Failure, Release, RetryAt, Success
from pgtasks.worker import Worker
from tests.apps import coord
from tests.apps.harness import (
    describe_all,
    executions,
    expire_lease,
    one,
    remote,
    rows,
    status,
    task_row,
    wait_until,
    worker_processes,
)

WorkerFactory = Callable[..., AbstractContextManager[Worker]]
_T = TypeVar("_T")


def running(db: psycopg.Connection[Any], key: str) -> int | None:
    found = rows(db, "SELECT running FROM concurrency_limits WHERE key = %s", (key,))
    return int(found[0]["running"]) if found else None


def statuses(db: psycopg.Connection[Any], ids: list[str]) -> list[str]:
    by_id = {
        r["id"]: r["status"]
        for r in rows(db, "SELECT id, status FROM tasks WHERE id = ANY(%s)", (ids,))
    }
    return [by_id[i] for i in ids]


def most_at_once(db: psycopg.Connection[Any]) -> dict[str, int]:
    """Per concurrency key, the most executions that were running at one instant (recorded
    inside the tasks, on the database clock)."""
    found = rows(
        db,
        """
        WITH runs AS (
            SELECT t.headers ->> 'concurrency_key' AS key, e.started_at, e.finished_at
              FROM executions AS e JOIN tasks AS t ON t.id = e.task_id
             WHERE t.headers ? 'concurrency_key'
        )
        SELECT a.key, max(n) AS most
          FROM (SELECT a.key, a.started_at,
                       (SELECT count(*) FROM runs AS b
                         WHERE b.key = a.key AND b.started_at <= a.started_at
                           AND b.finished_at > a.started_at) AS n
                  FROM runs AS a) AS a
         GROUP BY a.key
        """,
    )
    return {r["key"]: int(r["most"]) for r in found}


@pytest.fixture
def sync(app: Celery) -> Any:
    @app.task(name="limits.sync", concurrency_limit=1, concurrency_key=("customer_id",))
    def sync(customer_id: int, n: int = 0) -> int:
        return n

    return sync


@pytest.fixture
def plain(app: Celery) -> Any:
    @app.task(name="limits.plain")
    def plain(n: int) -> int:
        return n

    return plain


KEY_1 = 'task:limits.sync:{"customer_id":1}'
KEY_2 = 'task:limits.sync:{"customer_id":2}'


# -- options and keys ---------------------------------------------------------------------------


def test_keys_and_limits_travel_in_the_headers(app: Celery, db: Any, sync: Any) -> None:
    @app.task(name="limits.whole", concurrency_limit=3)
    def whole() -> None:
        pass

    def region_key(region: str, **kw: Any) -> str | None:
        return f"region:{region}" if region != "any" else None

    @app.task(name="limits.custom", concurrency_limit=2, concurrency_key=region_key)
    def custom(region: str, verbose: bool = False) -> None:
        pass

    @app.task(name="limits.free")
    def free() -> None:
        pass

    def limit_of(task_id: str) -> tuple[Any, Any]:
        h = task_row(db, task_id)["headers"]
        return h.get("concurrency_key"), h.get("concurrency_limit")

    assert limit_of(sync.delay(7).id) == ('task:limits.sync:{"customer_id":7}', 1)
    assert limit_of(sync.delay(customer_id=7, n=3).id) == ('task:limits.sync:{"customer_id":7}', 1)
    assert limit_of(whole.delay().id) == ("task:limits.whole", 3)
    assert limit_of(custom.delay("eu").id) == ("region:eu", 2)
    assert limit_of(custom.delay("any").id) == (None, None)
    assert limit_of(free.delay().id) == (None, None)
    # A call's own key and limit win; a key alone takes the task's limit.
    assert limit_of(sync.apply_async((7,), concurrency_key="customer:7").id) == ("customer:7", 1)
    call = free.apply_async((), concurrency_key="shared", concurrency_limit=4)
    assert limit_of(call.id) == ("shared", 4)
    assert limit_of(whole.apply_async((), concurrency_limit=9).id) == ("task:limits.whole", 9)
    assert limit_of(app.send_task("limits.free", concurrency_key="s", concurrency_limit=2).id) == (
        "s",
        2,
    )
    # A queue's limit applies to its tasks that have none of their own.
    app.conf.update(queue_concurrency_limits={"reports": 2})
    assert limit_of(free.apply_async((), queue="reports").id) == ("queue:reports", 2)
    assert limit_of(free.apply_async((), queue="other").id) == (None, None)
    assert limit_of(custom.apply_async(("any",), queue="reports").id) == ("queue:reports", 2)


def test_bad_limits_are_clear_errors_that_write_nothing(app: Celery, db: Any, sync: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="concurrency_key needs concurrency_limit"):

        @app.task(name="limits.bad1", concurrency_key=("x",))
        def bad1(x: int) -> None:
            pass

    with pytest.raises(ImproperlyConfigured, match="whole number"):

        @app.task(name="limits.bad2", concurrency_limit="2")
        def bad2() -> None:
            pass

    with pytest.raises(ImproperlyConfigured, match="from 1"):

        @app.task(name="limits.bad3", concurrency_limit=0)
        def bad3() -> None:
            pass

    with pytest.raises(ImproperlyConfigured, match="concurrency_key names"):

        @app.task(name="limits.bad4", concurrency_limit=1, concurrency_key=("nope",))
        def bad4(x: int) -> None:
            pass

    @app.task(name="limits.free")
    def free() -> None:
        pass

    with pytest.raises(ValueError, match="needs a concurrency_limit"):
        free.apply_async((), concurrency_key="k")
    with pytest.raises(TypeError, match="non-empty string"):
        free.apply_async((), concurrency_key=42, concurrency_limit=1)
    with pytest.raises(ValueError, match=r"NUL|null"):
        free.apply_async((), concurrency_key="a\x00b", concurrency_limit=1)
    with pytest.raises(TypeError, match="whole number"):
        free.apply_async((), concurrency_key="k", concurrency_limit=True)
    app.conf.update(queue_concurrency_limits={"reports": 1})
    with pytest.raises(ValueError, match="one limit"):
        sync.apply_async((1,), queue="reports")
    app.conf.update(queue_concurrency_limits={"reports": 0})
    with pytest.raises(ImproperlyConfigured, match=r"queue_concurrency_limits\['reports'\]"):
        free.delay()
    assert one(db, "SELECT count(*) AS n FROM tasks")["n"] == 0


# -- the claim ------------------------------------------------------------------------------------


def test_a_claim_starts_what_has_room_blocks_the_rest_and_takes_unlimited_rows_too(
    app: Celery, db: Any, sync: Any, plain: Any
) -> None:
    broker = app.broker
    first = [sync.delay(1, n).id for n in range(4)]
    second = [sync.delay(2, n).id for n in range(2)]
    free = [plain.delay(n).id for n in range(3)]
    claimed, taken = broker.claim_counting("w1", ["celery"], 20, 30.0)
    assert taken == 9
    assert sorted(c.id for c in claimed) == sorted([first[0], second[0], *free])
    assert statuses(db, first) == ["RUNNING", "BLOCKED", "BLOCKED", "BLOCKED"]
    assert statuses(db, second) == ["RUNNING", "BLOCKED"]
    assert (running(db, KEY_1), running(db, KEY_2)) == (1, 1)
    # A blocked row is not claimed: its attempt is untouched, and it reads as PENDING.
    assert task_row(db, first[1])["attempt"] == 0
    assert task_row(db, first[1])["claimed_by"] is None
    assert sync.AsyncResult(first[1]).state == "PENDING"
    # Nothing else is due: the next claim finds nothing, and blocks nothing more.
    assert broker.claim_counting("w1", ["celery"], 20, 30.0) == ([], 0)

    # Ending the running one frees its key: the next blocked row (claim order) is due again.
    by_id = {c.id: c for c in claimed}
    done = by_id[first[0]]
    broker.complete("w1", [Success(done.id, done.attempt, False, "application/json", None, None)])
    assert running(db, KEY_1) == 0
    assert statuses(db, first) == ["COMPLETED", "PENDING", "BLOCKED", "BLOCKED"]
    again, taken = broker.claim_counting("w2", ["celery"], 20, 30.0)
    assert [c.id for c in again] == [first[1]] and taken == 1
    assert running(db, KEY_1) == 1


def counted(conn: psycopg.Connection[Any], call: Callable[[], _T]) -> tuple[_T, int]:
    """What ``call`` returns, and how many statements it ran on ``conn`` (read from libpq's
    trace of the messages sent)."""
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            result = call()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sent = [line.split(b"\t") for line in trace.read().splitlines()]
    return result, sum(
        1 for m in sent if m[0] == b"F" and m[2].split()[0] in (b"Execute", b"Query")
    )


def test_claims_skip_deciding_limits_until_a_limited_row_is_due(
    app: Celery, db: Any, sync: Any, plain: Any, pg_dsn: str
) -> None:
    """Claims that meet no row under a limit run one statement, without the parts that decide
    limits; the first one that picks such a row starts nothing and hands over to the claim that
    decides (a second statement), which then takes the same rows in the same order, limits
    decided. For a while after, claims decide limits at once (one statement)."""
    broker = app.broker
    free = [plain.apply_async((n,), priority=5).id for n in range(3)]
    limited = [sync.delay(1, n).id for n in range(3)]
    after = [plain.delay(n).id for n in range(2)]
    conn = broker.claim_connection()
    try:
        # Three picked, none limited: one statement.
        claimed, sent = counted(conn, lambda: broker.claim("w1", ["celery"], 3, 30.0, conn))
        assert [c.id for c in claimed] == free and sent == 1
        assert [c.attempt for c in claimed] == [1, 1, 1]
        assert statuses(db, free) == ["RUNNING"] * 3
        assert {task_row(db, i)["claimed_by"] for i in free} == {"w1"}
        assert statuses(db, limited + after) == ["PENDING"] * 5
        # The next claim picks limited rows: the limit is decided, in claim order, by a second
        # statement (the first started nothing: every row is claimed once, attempt 1).
        (claimed, taken), sent = counted(
            conn, lambda: broker.claim_counting("w2", ["celery"], 5, 30.0, conn)
        )
        assert [c.id for c in claimed] == [limited[0], *after] and taken == 5
        assert sent == 2
        assert statuses(db, limited) == ["RUNNING", "BLOCKED", "BLOCKED"]
        assert {task_row(db, i)["attempt"] for i in [limited[0], *after]} == {1}
        assert running(db, KEY_1) == 1
        # Claims go on deciding limits for a while: one statement for a limited row.
        more = sync.delay(1, 9).id
        claimed, sent = counted(conn, lambda: broker.claim("w2", ["celery"], 4, 30.0, conn))
        assert claimed == [] and sent == 1
        assert statuses(db, [more]) == ["BLOCKED"]
    finally:
        conn.close()
    # Once that while is over, claims try the plain claim first again.
    other = Broker(pg_dsn, app.broker.schema)
    other.LIMITS_PAUSE = 0.0
    conn = other.claim_connection()
    try:
        for customer in (2, 3):
            due = sync.delay(customer, 0).id
            claimed, sent = counted(conn, lambda: other.claim("w3", ["celery"], 4, 30.0, conn))
            assert [c.id for c in claimed] == [due] and sent == 2
    finally:
        conn.close()
        other.close()


def test_a_full_keys_backlog_leaves_the_claim_index_in_one_claim(
    app: Celery, db: Any, sync: Any, plain: Any
) -> None:
    backlog = [sync.delay(1, n).id for n in range(30)]
    later = [sync.apply_async((1, 99), countdown=3600).id, sync.delay(2).id]
    free = [plain.delay(n).id for n in range(3)]
    claimed, taken = app.broker.claim_counting("w1", ["celery"], 2, 30.0)
    # The claim took two rows of the key: one starts, and the key's 29 other due rows are set
    # aside with the second; a row not yet due and other keys' rows are left alone.
    assert [c.id for c in claimed] == [backlog[0]] and taken == 2
    assert statuses(db, backlog) == ["RUNNING"] + ["BLOCKED"] * 29
    assert statuses(db, later + free) == ["PENDING"] * 5
    claimed, taken = app.broker.claim_counting("w1", ["celery"], 10, 30.0)
    assert sorted(c.id for c in claimed) == sorted([later[1], *free]) and taken == 4


def test_every_way_a_running_row_ends_gives_its_count_back(app: Celery, db: Any, sync: Any) -> None:
    broker = app.broker
    ids = [sync.delay(1, n).id for n in range(6)]

    def claim_one() -> Any:
        claimed, _ = broker.claim_counting("w1", ["celery"], 10, 30.0)
        assert len(claimed) == 1, claimed
        assert running(db, KEY_1) == 1
        return claimed[0]

    def ended(c: Any, how: str) -> None:
        assert running(db, KEY_1) == 0, how
        # The next row in claim order is due again; the others still wait.
        assert statuses(db, ids).count("BLOCKED") == len(ids) - ids.index(c.id) - 2, how

    c = claim_one()
    broker.fail("w1", [Failure(c.id, c.attempt, "FAILED", "boom", None, False, "", None, None)])
    ended(c, "failed")
    c = claim_one()
    broker.retry("w1", [RetryAt(c.id, c.attempt, 1, 3600.0, None, "again", None, "retry", None)])
    ended(c, "retried")
    c = claim_one()
    broker.release("w1", [Release(c.id, c.attempt, 3600.0, None)])
    ended(c, "released")
    c = claim_one()
    # A lease that ran out (its worker died) is taken back by any worker's reclaimer.
    expire_lease(db, c.id)
    assert [r["id"] for r in broker.reclaim(max_lost=3)] == [c.id]
    db.execute("UPDATE tasks SET run_at = now() + interval '1 hour' WHERE id = %s", (c.id,))
    assert status(db, c.id) == "PENDING"
    ended(c, "lost")
    # A row that waits for its rate limit's start time takes no place: the claim leaves it
    # PENDING, due at that time.
    db.execute(
        "INSERT INTO rate_limits (key, next_at) VALUES ('task:limits.sync', now() + interval '1 h')"
    )
    waiting, taken = broker.claim_counting("w1", ["celery"], 1, 30.0, rates={"limits.sync": 60.0})
    assert (waiting, taken) == ([], 1)
    assert running(db, KEY_1) == 0
    assert task_row(db, ids[4])["attempt"] == 0
    c = claim_one()
    broker.complete("w1", [Success(c.id, c.attempt, False, "application/json", None, None)])
    assert running(db, KEY_1) == 0
    assert statuses(db, ids) == ["FAILED", "PENDING", "PENDING", "PENDING", "PENDING", "COMPLETED"]


def test_blocked_rows_are_revoked_purged_and_keep_their_unique_key(
    app: Celery, db: Any, sync: Any
) -> None:
    broker = app.broker
    holder = sync.delay(1).id
    blocked = sync.apply_async((1,), unique_key="sync:1:once").id
    other = sync.delay(1).id
    broker.claim_counting("w1", ["celery"], 10, 30.0)
    assert statuses(db, [holder, blocked, other]) == ["RUNNING", "BLOCKED", "BLOCKED"]
    # Still waiting, so still the key's holder.
    assert sync.apply_async((1,), unique_key="sync:1:once").id == blocked
    sync.AsyncResult(other).revoke()
    assert status(db, other) == "CANCELLED"
    assert sync.AsyncResult(other).state == "REVOKED"
    assert app.control.purge() == 1
    assert rows(db, "SELECT id FROM tasks WHERE status = 'BLOCKED'") == []
    assert [r["blocked"] for r in broker.queue_stats()] == [0]


def test_the_reclaimer_moves_on_blocked_rows_whose_key_has_room(
    app: Celery, db: Any, sync: Any
) -> None:
    """A worker killed between ending a limited task and moving its key's blocked rows leaves
    them BLOCKED with room free: any worker's maintenance moves them on."""
    broker = app.broker
    ids = [sync.delay(1, n).id for n in range(3)]
    claimed, _ = broker.claim_counting("w1", ["celery"], 10, 30.0)
    # As if the completion committed and its worker died before moving the blocked rows.
    db.execute(
        "UPDATE tasks SET status = 'COMPLETED', claimed_by = NULL, lease_until = NULL"
        " WHERE id = %s",
        (claimed[0].id,),
    )
    db.execute("UPDATE concurrency_limits SET running = 0")
    assert broker.blocked_keys() == [KEY_1]
    Reclaimer(broker, max_lost=3).run_once()
    assert statuses(db, ids) == ["COMPLETED", "PENDING", "BLOCKED"]
    assert broker.blocked_keys() == [KEY_1]
    # A raised limit lets more of them go the same way.
    db.execute("UPDATE concurrency_limits SET max_running = 5")
    Reclaimer(broker, max_lost=3).run_once()
    assert statuses(db, ids) == ["COMPLETED", "PENDING", "PENDING"]
    assert broker.blocked_keys() == []


def test_hand_edited_limits_never_break_a_claim(app: Celery, db: Any, plain: Any) -> None:
    ids = [plain.delay(n).id for n in range(4)]
    bad = [
        {"concurrency_key": "k", "concurrency_limit": "lots"},
        {"concurrency_key": "k", "concurrency_limit": 0},
        {"concurrency_key": 5, "concurrency_limit": 1},
        {"concurrency_key": "k", "concurrency_limit": 10**12},
    ]
    for task_id, headers in zip(ids, bad, strict=True):
        db.execute(
            "UPDATE tasks SET headers = headers || %s::jsonb WHERE id = %s",
            (Jsonb(headers), task_id),
        )
    claimed, taken = app.broker.claim_counting("w1", ["celery"], 10, 30.0)
    # Not limits the claim can read: the rows run as unlimited ones.
    assert sorted(c.id for c in claimed) == sorted(ids) and taken == 4
    assert rows(db, "SELECT * FROM concurrency_limits") == []


# -- workers --------------------------------------------------------------------------------------


def test_worker_processes_never_run_more_than_the_limit_at_once(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    record = remote(app, coord.RECORD)
    names = ["lim-a", "lim-b", "lim-c"]
    with worker_processes(pg_dsn, schema, names, ready=db, concurrency=4) as workers:
        limited = [
            record.apply_async(
                (n, 0.05), concurrency_key=f"customer:{n % 3}", concurrency_limit=2
            ).id
            for n in range(36)
        ]
        free = [record.delay(100 + n, 0.05).id for n in range(24)]
        wait_until(
            lambda: all(s == "COMPLETED" for s in statuses(db, limited + free)),
            timeout=60,
            what="every task to finish",
            details=describe_all(workers),
        )
        problems = [p for w in workers for p in w.problems()]
    assert problems == []
    runs = {i: executions(db, i) for i in limited + free}
    assert all(len(r) == 1 and r[0]["runs"] == 1 for r in runs.values()), "each ran once"
    assert {r[0]["worker"] for r in runs.values()} <= set(names)
    most = most_at_once(db)
    assert set(most) == {"customer:0", "customer:1", "customer:2"}
    assert max(most.values()) <= 2, most
    # Every count is back to zero, and nothing waits.
    assert {r["running"] for r in rows(db, "SELECT running FROM concurrency_limits")} == {0}
    assert rows(db, "SELECT 1 FROM tasks WHERE status IN ('BLOCKED', 'PENDING')") == []


def test_a_full_key_never_holds_back_other_tasks(
    app: Celery,
    db: psycopg.Connection[Any],
    pg_dsn: str,
    schema: str,
    worker_factory: WorkerFactory,
) -> None:
    coord.install(db)

    @app.task(name="limits.gated")
    def gated_task(gate: str) -> str:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            deadline = time.monotonic() + 30
            while not conn.execute("SELECT 1 FROM gates WHERE key = %s", (gate,)).fetchone():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {gate!r} stayed shut")
                time.sleep(0.02)
        return gate

    @app.task(name="limits.quick")
    def quick(n: int) -> int:
        return n

    with worker_factory(concurrency=4, pool="threads"):
        gated = [
            gated_task.apply_async(("g",), concurrency_key="busy", concurrency_limit=1).id
            for _ in range(20)
        ]
        wait_until(lambda: status(db, gated[0]) == "RUNNING", what="the first gated task")
        later = [quick.delay(n).id for n in range(30)]
        # The key's other rows wait BLOCKED; every task enqueued after them runs meanwhile.
        wait_until(
            lambda: all(s == "COMPLETED" for s in statuses(db, later)),
            timeout=20,
            what="the unlimited tasks to finish while the key is full",
        )
        assert statuses(db, gated).count("RUNNING") == 1
        assert statuses(db, gated).count("BLOCKED") == 19
        coord.open_gate(db, "g")
        wait_until(
            lambda: all(s == "COMPLETED" for s in statuses(db, gated)),
            timeout=30,
            what="the gated tasks to finish one by one",
        )
    assert running(db, "busy") == 0


def test_a_killed_worker_gives_its_slot_back_through_the_reclaimer(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    block = remote(app, coord.BLOCK)
    with worker_processes(pg_dsn, schema, ["lim-kill"], ready=db, lease=1.0) as [victim]:
        ids = [
            block.apply_async(("k",), concurrency_key="one", concurrency_limit=1).id
            for _ in range(3)
        ]
        wait_until(lambda: executions(db, ids[0]), what="the first task to start")
        # The worker has a free slot: its next claims meet the other two and block them.
        wait_until(
            lambda: statuses(db, ids)[1:] == ["BLOCKED", "BLOCKED"],
            what="the other two to be blocked",
            details=victim.describe,
        )
        victim.kill()
    with worker_processes(pg_dsn, schema, ["lim-heir"], ready=db, lease=1.0) as workers:
        coord.open_gate(db, "k")
        wait_until(
            lambda: all(s == "COMPLETED" for s in statuses(db, ids)),
            timeout=30,
            what="the heir to reclaim the lease and run all three",
            details=describe_all(workers),
        )
    assert [len(executions(db, i)) for i in ids] == [2, 1, 1]
    assert running(db, "one") == 0
    # One at a time throughout, the lost run included (it never finished).
    heir_runs = rows(
        db,
        "SELECT started_at, finished_at FROM executions WHERE worker = 'lim-heir'"
        " ORDER BY started_at",
    )
    assert all(a["finished_at"] <= b["started_at"] for a, b in itertools.pairwise(heir_runs))
