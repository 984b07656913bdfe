"""``pgtasks grants``: each kind of role connects and is shown what it can and cannot do."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtasks import Celery, grants, quotas
from pgtasks.exceptions import NotPermitted, QuotaExceeded
from tests.apps.harness import one, wait_until
from tests.conftest import running_worker


class Roles:
    def __init__(self, pg_dsn: str, schema: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.pg_dsn, self.schema = pg_dsn, schema
        self.producer, self.worker, self.admin = (
            f"pgt_{suffix}_{kind}" for kind in ("producer", "worker", "admin")
        )

    def dsn(self, role: str) -> str:
        return make_conninfo(self.pg_dsn, user=role)

    def app(self, role: str) -> Celery:
        app = Celery(
            "grants",
            broker=self.dsn(role),
            schema_name=self.schema,
            lease_seconds=2.0,
            poll_interval=0.05,
            shutdown_grace=5.0,
        )

        @app.task(name="reports.build")
        def build(n: int) -> int:
            return n * 2

        @app.task(name="billing.charge")
        def charge(n: int) -> int:
            return n

        return app

    def connect(self, role: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn(role), autocommit=True)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn


@pytest.fixture
def roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    made = Roles(pg_dsn, schema)
    names = [made.producer, made.worker, made.admin]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        try:
            grants.apply(
                pg_dsn,
                schema,
                grants.Roles(
                    producers=[made.producer],
                    workers=[made.worker],
                    admins=[made.admin],
                    queues=["celery", "reports"],
                    task_names=["reports.*"],
                ),
            )
            yield made
        finally:
            idents = sql.SQL(", ").join(sql.Identifier(n) for n in names)
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(idents))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(idents))
            conn.execute(sql.SQL("DROP ROLE {}").format(idents))


def denied(conn: psycopg.Connection[Any], statement: str) -> bool:
    """Whether the server refuses ``statement`` to ``conn``'s role."""
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


def test_a_producer_enqueues_and_reads_but_nothing_more(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    app = roles.app(roles.producer)
    try:
        build = app.tasks["reports.build"]
        sent = build.delay(1)
        assert sent.state == "PENDING"
        # COPY is refused where row-level security applies: the rows go by INSERT.
        assert len(build.apply_many([((i,), {}) for i in range(4)])) == 4
        assert app.broker.copy_refused()
        # In a caller's transaction (which a refused COPY would abort) it asks before it
        # tries: so does a process that has not tried yet.
        fresh = roles.app(roles.producer)
        try:
            assert not fresh.broker.copy_refused()
            with fresh.broker.connection() as conn, conn.transaction():
                sent_in = fresh.tasks["reports.build"].apply_many([((4,), {})], connection=conn)
                assert len(sent_in) == 1
            assert fresh.broker.copy_refused()
        finally:
            fresh.close()
        # Only its queues and task names.
        with pytest.raises(NotPermitted, match="pgtasks grants"):
            app.tasks["billing.charge"].delay(1)
        with pytest.raises(NotPermitted):
            build.apply_async((1,), queue="other")
        with pytest.raises(NotPermitted):
            app.tasks["billing.charge"].apply_many([((1,), {})])
        assert one(db, "SELECT count(*) AS n FROM tasks")["n"] == 6
        # Never a worker's or an administrator's statement.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.broker.claim("intruder", ["reports"], 10, 30.0)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.broker.purge()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.broker.revoke(sent.id)
    finally:
        app.close()
    with roles.connect(roles.producer) as conn:
        assert denied(conn, "UPDATE tasks SET priority = 9")
        assert denied(conn, "DELETE FROM results")
        assert denied(conn, "SELECT * FROM attempts")
        assert denied(conn, "DROP TABLE tasks")
        assert denied(conn, "CREATE TABLE mine (x int)")
    assert one(db, "SELECT count(*) AS n FROM tasks WHERE status = 'PENDING'")["n"] == 6


def test_a_worker_runs_tasks_but_cannot_purge_requeue_or_change_the_schema(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    try:
        sent = producer.tasks["reports.build"].delay(21)
        with running_worker(worker_app, queues=["celery"]):
            assert sent.get(timeout=20) == 42
        waiting = producer.tasks["reports.build"].delay(1)
        dead = producer.tasks["reports.build"].delay(2)
        db.execute("UPDATE tasks SET status = 'DEAD', error = 'boom' WHERE id = %s", (dead.id,))
        # Row-level security hides these rows from the statements: nothing changes.
        assert worker_app.broker.purge() == 0
        assert worker_app.broker.requeue_dead([dead.id]) == 0
        assert worker_app.broker.discard_dead([dead.id]) == 0
        statuses = dict(db.execute("SELECT id, status FROM tasks").fetchall())
        assert statuses[waiting.id] == "PENDING" and statuses[dead.id] == "DEAD"
    finally:
        producer.close()
        worker_app.close()
    with roles.connect(roles.worker) as conn:
        assert denied(conn, "DROP TABLE tasks")
        assert denied(conn, "ALTER TABLE tasks ADD COLUMN x int")
        assert denied(conn, "CREATE TABLE mine (x int)")
        assert denied(conn, "DELETE FROM migrations")


def test_the_admin_owns_the_schema(roles: Roles, db: psycopg.Connection[Any]) -> None:
    producer = roles.app(roles.producer)
    admin = roles.app(roles.admin)
    try:
        kept = producer.tasks["reports.build"].delay(1)
        dead = producer.tasks["reports.build"].delay(2)
        db.execute("UPDATE tasks SET status = 'DEAD', error = 'boom' WHERE id = %s", (dead.id,))
        assert admin.broker.requeue_dead([dead.id]) == 1
        assert admin.broker.purge() == 2
        assert kept.state == "PENDING"  # forgotten with its row: reads as unknown
        # Any queue, any name.
        admin.tasks["billing.charge"].apply_async((1,), queue="other")
    finally:
        producer.close()
        admin.close()
    with roles.connect(roles.admin) as conn:
        conn.execute("ALTER TABLE tasks ADD COLUMN admin_note text")
        conn.execute("ALTER TABLE tasks DROP COLUMN admin_note")


def test_roles_must_exist_and_statements_print(pg_dsn: str, schema: str) -> None:
    with pytest.raises(ValueError, match="no such role: pgt_nobody"):
        grants.apply(pg_dsn, schema, grants.Roles(producers=["pgt_nobody"]))
    text = [
        s.as_string(None)
        for s in grants.statements(schema, grants.Roles(producers=["web"], queues=["a;b'"]))
    ]
    assert any("ENABLE ROW LEVEL SECURITY" in t for t in text)
    # Names and values are quoted, never pasted: a hostile queue name stays a literal.
    assert any("queue = ANY('{a;b''}')" in t for t in text), text


def test_a_worker_role_can_run_the_scheduler(roles: Roles, db: psycopg.Connection[Any]) -> None:
    app = roles.app(roles.worker)
    app.conf.beat_schedule = {"tick": {"task": "reports.build", "schedule": 0.5, "args": (1,)}}
    try:
        with running_worker(app, queues=["celery"], beat=True):
            wait_until(
                lambda: one(db, "SELECT count(*) AS n FROM tasks WHERE status = 'COMPLETED'")["n"],
                what="a scheduled task to run",
            )
    finally:
        app.close()


def test_a_producer_role_is_held_to_its_quota(roles: Roles, pg_dsn: str, schema: str) -> None:
    quotas.set_quota(pg_dsn, schema, roles.producer, 1)  # its rows' source is its role
    app = roles.app(roles.producer)
    try:
        app.tasks["reports.build"].delay(1)
        with pytest.raises(QuotaExceeded):
            app.tasks["reports.build"].delay(2)
    finally:
        app.close()


def test_a_producer_role_enqueues_unique_tasks_in_every_mode(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    app = roles.app(roles.producer)
    try:
        build = app.tasks["reports.build"]
        for unique_for in ("finished", "started", 600):
            first = build.apply_async((1,), unique_key=f"k-{unique_for}", unique_for=unique_for)
            again = build.apply_async((2,), unique_key=f"k-{unique_for}", unique_for=unique_for)
            assert again.id == first.id
        # Its queues and task names still bind a unique call.
        with pytest.raises(NotPermitted):
            app.tasks["billing.charge"].apply_async((1,), unique_key="k-other")
    finally:
        app.close()
    assert one(db, "SELECT count(*) AS n FROM tasks")["n"] == 3


def test_a_producer_role_hands_tasks_to_parked_workers(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    worker_app = roles.app(roles.worker)
    producer = roles.app(roles.producer)
    try:
        worker_app.broker.park("ghost", ["reports"], 30.0, 60.0)
        handed = producer.tasks["reports.build"].apply_async((1,), queue="reports")
        # The park is taken (by hand_off, which runs with its owner's rights), and the row
        # is the producer's own waiting row, which the worker then claims.
        assert one(db, "SELECT count(*) AS n FROM parked_workers")["n"] == 0
        assert one(db, "SELECT status, source FROM tasks WHERE id = %s", (handed.id,)) == {
            "status": "PENDING",
            "source": roles.producer,
        }
        (claimed,) = worker_app.broker.claim_handed("ghost", [handed.id], ["reports"], 30.0)
        assert claimed.id == handed.id
        # It may wait for the WAL flush itself, so its hand-offs commit before the flush.
        assert producer.broker.early_ok is True
        # A producer granted its rights before the schema had the hand-off's table: its
        # enqueues go the plain way.
        db.execute(f'REVOKE ALL ON parked_workers FROM "{roles.producer}"')
        worker_app.broker.park("ghost", ["reports"], 30.0, 60.0)
        plain = producer.tasks["reports.build"].apply_async((2,), queue="reports")
        assert one(db, "SELECT status FROM tasks WHERE id = %s", (plain.id,)) == {
            "status": "PENDING"
        }
        # Refused for its own reasons, it is still refused.
        with pytest.raises(NotPermitted):
            producer.tasks["billing.charge"].delay(1)
    finally:
        producer.close()
        worker_app.close()
