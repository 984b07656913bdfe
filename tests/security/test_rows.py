"""Roles are a boundary (DESIGN invariant 12): what a producer or a worker may write and read,
tried with plain SQL, as an attacker holding that login would."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import quotas
from pgtasks.contrib.testing import start_worker
from pgtasks.exceptions import NotPermitted, QuotaExceeded
from pgtasks.result import GroupResult
from tests.apps.harness import one, rows, status, wait_until
from tests.security.conftest import RAN, Roles

INSERT = (
    "INSERT INTO tasks (id, name, payload{columns})"
    " VALUES (%(id)s, %(name)s, '[[1], {{}}]'{values})"
)


def insert(
    conn: psycopg.Connection[Any], task_id: str, name: str = "proj.add", **columns: Any
) -> None:
    """An INSERT of a task row with ``columns`` besides the usual ones."""
    statement = INSERT.format(
        columns="".join(f", {c}" for c in columns),
        values="".join(f", %({c})s" for c in columns),
    )
    conn.execute(statement, {"id": task_id, "name": name, **columns})


@pytest.mark.parametrize(
    "columns",
    [
        {"status": "RUNNING"},
        {"status": "RUNNING", "claimed_by": "w1", "attempt": 1},
        {"lease_until": "2126-01-01T00:00:00Z"},
        {"status": "DEAD"},
        {"status": "BLOCKED"},
        {"status": "COMPLETED"},
        {"claimed_by": "w1"},
        {"attempt": 5},
        {"retries": 2},
        {"requeued_attempt": 1},
        {"cancel_requested": True},
        {"error": "planted"},
        {"priority": 2**31 - 1},
        {"priority": -5},
        {"source": "someone_else"},
        # A start time a claim's rate limit hands out, which would skip the limit.
        {"headers": '{"rate_slot": "2020-01-01T00:00:00Z"}'},
        # Another task's unique key, so that its next enqueue finds this one.
        {"unique_key": "billing.charge:invoice-1"},
        {"queue": "other"},
    ],
    ids=lambda c: ",".join(f"{k}={v}"[:30] for k, v in c.items()),
)
def test_a_producer_writes_only_fresh_waiting_rows_of_its_own(
    roles: Roles, db: psycopg.Connection[Any], columns: dict[str, Any]
) -> None:
    with roles.connect(roles.producer) as conn:
        insert(conn, "fine")  # the same row, without the column, goes in
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            insert(conn, "bad", **columns)
    assert [r["id"] for r in rows(db, "SELECT id FROM tasks")] == ["fine"]
    row = one(db, "SELECT status, source, attempt FROM tasks WHERE id = 'fine'")
    assert row == {"status": "PENDING", "source": roles.producer, "attempt": 0}


def test_a_producer_writes_only_its_task_names_and_within_its_payload_bound(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    with roles.connect(roles.producer) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            insert(conn, "x1", name="proj.dangerous")
        # 11 MB of arguments, past the 10 MB the role was given.
        big = '["' + "x" * (11 * 1024 * 1024) + '"]'
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO tasks (id, name, payload) VALUES ('x2', 'proj.add', %s)", (big,)
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO tasks (id, name, payload_raw, content_type)"
                " VALUES ('x3', 'proj.add', %s, 'application/x-python-serialize')",
                (b"x" * (11 * 1024 * 1024),),
            )
    assert rows(db, "SELECT id FROM tasks") == []


def test_a_producers_rows_carry_its_role_as_their_source_whatever_it_says(
    roles: Roles, pg_dsn: str
) -> None:
    """Quotas count by source: a producer that names another source is refused, so it can
    neither slip past its own quota nor use up another's."""
    quotas.set_quota(pg_dsn, roles.schema, roles.victim, 2)
    quotas.set_quota(pg_dsn, roles.schema, roles.producer, 2)
    spoofing = roles.app(roles.producer, task_source=roles.victim)
    with pytest.raises(NotPermitted):
        spoofing.tasks["proj.add"].delay(1)
    with roles.connect(roles.producer) as conn:
        conn.execute("SELECT set_config('pgtasks.source', %s, false)", (roles.victim,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            insert(conn, "spoof")
    producer = roles.app(roles.producer)
    producer.tasks["proj.add"].delay(1)
    producer.tasks["proj.add"].delay(2)
    with pytest.raises(QuotaExceeded):
        producer.tasks["proj.add"].delay(3)
    # The victim's quota is whole.
    victim = roles.app(roles.victim)
    victim.tasks["billing.charge"].delay(1)
    victim.tasks["billing.charge"].delay(2)
    waiting = {q.source: q.waiting for q in quotas.quotas(pg_dsn, roles.schema)}
    assert waiting == {roles.producer: 2, roles.victim: 2}


def test_a_producer_cannot_squat_another_tasks_unique_key(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    victim = roles.app(roles.victim)
    with roles.connect(roles.producer) as conn:
        # A row of its own task holding the victim's key.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            insert(conn, "squat", unique_key="billing.charge:invoice-1")
        # The key row of a window, held for a century.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO unique_keys (key, task_id, held_until)"
                " VALUES ('billing.charge:invoice-1', 'squat', now() + interval '100 years')"
            )
        # Its own tasks' keys it may take.
        insert(conn, "mine", unique_key="proj.add:invoice-1")
        assert rows(conn, "SELECT key FROM unique_keys") == []
    charge = victim.tasks["billing.charge"]
    first = charge.apply_async((1,), unique_key="invoice-1")
    assert first.id != "squat"
    assert charge.apply_async((2,), unique_key="invoice-1").id == first.id
    window = charge.apply_async((3,), unique_key="invoice-2", unique_for=600)
    assert status(db, window.id) == "PENDING"


def test_a_producer_reads_only_the_tasks_and_results_of_its_names_and_queues(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    producer = roles.app(roles.producer)
    victim = roles.app(roles.victim)
    worker_app = roles.app(roles.worker)
    mine = producer.tasks["proj.add"].delay(5)
    theirs = victim.tasks["billing.charge"].delay(7)
    with start_worker(worker_app, concurrency=1):
        assert mine.get(timeout=10) == 5
        wait_until(lambda: status(db, theirs.id) == "COMPLETED", what="the victim's task")
    with roles.connect(roles.producer) as conn:
        assert [r["id"] for r in rows(conn, "SELECT id FROM tasks")] == [mine.id]
        assert [r["task_id"] for r in rows(conn, "SELECT task_id FROM results")] == [mine.id]
        for table in ("workers", "parked_workers"):
            conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
        for statement in (
            "SELECT * FROM producer_rules",
            "SELECT * FROM attempts",
            "SELECT * FROM chords",
            "DELETE FROM parked_workers",
            "UPDATE tasks SET priority = 9",
            "DELETE FROM tasks",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    # The victim's result is not the producer's to read, through its app either.
    assert producer.AsyncResult(theirs.id).state == "PENDING"
    assert victim.AsyncResult(theirs.id).get(timeout=10) == 7


def test_a_saved_group_is_its_savers_own(roles: Roles) -> None:
    victim = roles.app(roles.victim)
    producer = roles.app(roles.producer)
    saved = GroupResult("g1", [victim.AsyncResult("a"), victim.AsyncResult("b")], app=victim)
    saved.save()
    assert GroupResult.restore("g1", app=producer) is None
    with roles.connect(roles.producer) as conn:
        conn.execute("UPDATE group_results SET result_ids = '{x}' WHERE id = 'g1'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO group_results (id, result_ids, source) VALUES ('g2', '{x}', %s)",
                (roles.victim,),
            )
    restored = GroupResult.restore("g1", app=victim)
    assert restored is not None and [r.id for r in restored.results] == ["a", "b"]


def test_a_worker_cannot_end_a_task_nobody_claimed(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """A worker role finishes and prunes tasks; finishing one it never claimed, then pruning
    it, would make a waiting task disappear."""
    producer = roles.app(roles.producer)
    sent = producer.tasks["proj.add"].delay(1)
    with roles.connect(roles.worker) as conn:
        for target in ("COMPLETED", "FAILED"):
            with pytest.raises(psycopg.errors.CheckViolation, match="only a claimed"):
                conn.execute("UPDATE tasks SET status = %s WHERE id = %s", (target, sent.id))
        assert conn.execute("DELETE FROM tasks WHERE id = %s", (sent.id,)).rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO producer_rules (role) VALUES ('me')")
    assert status(db, sent.id) == "PENDING"
    # The way a worker ends a task: claim, run, finish.
    worker_app = roles.app(roles.worker)
    with start_worker(worker_app, concurrency=1):
        assert sent.get(timeout=10) == 1
    assert RAN["proj.add"] == [(1,)]
