"""A schema older or newer than the code.

``tests/acceptance/test_cli`` covers a schema with no tables at all (the CLI worker refuses and
``--migrate`` fixes it) and ``test_bad_input`` enqueueing into one. Here every partial schema —
each prefix of ``pgtasks/migrations`` — is tried, exhaustively rather than by sampling since
there are only as many as there are migrations, and so are versions newer than the code knows:
a worker refuses to start with an error naming both versions and what to run; a producer either
refuses with one saying to migrate or writes a row that runs once the schema is migrated.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks import migrate as migrations
from pgtasks.broker import notify_channel
from pgtasks.contrib import testing
from pgtasks.exceptions import ImproperlyConfigured, SchemaOutOfDate
from pgtasks.worker import Worker

LATEST = migrations.latest()
VERSIONS = [m.version for m in migrations.available()]


def migrate_to(dsn: str, schema: str, version: int) -> None:
    """Apply the shipped migrations up to ``version`` only, as an older pgtasks would have."""
    ident = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        for m in migrations.available():
            if m.version > version:
                break
            with conn.transaction():
                conn.execute(
                    sql.SQL(m.text).format(
                        schema=ident, channel=sql.Literal(notify_channel(schema))
                    )
                )
                conn.execute(
                    sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(
                        ident
                    ),
                    (m.version, m.name),
                )


def record_version(dsn: str, schema: str, version: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.migrations (version, name) VALUES (%s, 'from_the_future')"
            ).format(sql.Identifier(schema)),
            (version,),
        )


@pytest.fixture
def bare_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name for the test to build itself, dropped afterwards."""
    name = f"v_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def old_app(pg_dsn: str, bare_schema: str) -> Iterator[Celery]:
    application = Celery(
        "versions", broker=pg_dsn, schema_name=bare_schema, lease_seconds=2.0, poll_interval=0.05
    )

    @application.task(name="versions.add")
    def add(x: int, y: int) -> int:
        return x + y

    try:
        yield application
    finally:
        application.close()


@contextlib.contextmanager
def scratch_role(conn: psycopg.Connection[Any], kind: str) -> Iterator[tuple[str, sql.Identifier]]:
    """A role of its own for one test (its name and identifier), dropped with its rights."""
    role = f"pgt_{uuid.uuid4().hex[:8]}_{kind}"
    who = sql.Identifier(role)
    conn.execute(sql.SQL("CREATE ROLE {}").format(who))
    try:
        yield role, who
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(who))
        conn.execute(sql.SQL("DROP ROLE {}").format(who))


def refused_start(app: Celery) -> SchemaOutOfDate:
    with pytest.raises(SchemaOutOfDate) as refused:
        Worker(app, pool="threads").run()
    return refused.value


@pytest.mark.parametrize("version", [0, *VERSIONS[:-1]])
def test_worker_refuses_a_partly_migrated_schema_until_it_is_migrated(
    pg_dsn: str, bare_schema: str, old_app: Celery, version: int
) -> None:
    migrate_to(pg_dsn, bare_schema, version)
    message = str(refused_start(old_app))
    assert "run `pgtasks migrate` (or start the worker with --migrate)" in message
    if version:
        assert f"is at version {version} but this pgtasks needs {LATEST}" in message
    else:
        assert "has no pgtasks tables" in message

    add = old_app.tasks["versions.add"]
    try:
        sent = [add.delay(1, 2), *add.apply_many([((3, 4), {}), ((5, 6), {})])]
    except ImproperlyConfigured as exc:
        assert "run `pgtasks migrate`" in str(exc)
        assert version < VERSIONS[0], "a schema with the task table refused a task"
        sent = []

    applied = migrations.migrate(pg_dsn, bare_schema)
    assert [m.version for m in applied] == [v for v in VERSIONS if v > version]
    with testing.start_worker(old_app):
        assert [r.get(timeout=10) for r in sent] == [3, 7, 11][: len(sent)]


@pytest.mark.parametrize("ahead", [1, 2, 1000])
def test_worker_and_migrate_refuse_a_schema_newer_than_the_code(
    pg_dsn: str, bare_schema: str, old_app: Celery, ahead: int
) -> None:
    migrate_to(pg_dsn, bare_schema, LATEST)
    record_version(pg_dsn, bare_schema, LATEST + ahead)
    newer = LATEST + ahead

    message = str(refused_start(old_app))
    assert f"is at version {newer}, newer than this pgtasks ({LATEST})" in message
    assert "upgrade pgtasks" in message

    with pytest.raises(SchemaOutOfDate, match=rf"version {newer}, newer than this pgtasks"):
        migrations.migrate(pg_dsn, bare_schema)
    with psycopg.connect(pg_dsn) as conn:
        assert migrations.applied(conn, bare_schema) == newer, "migrate changed nothing"


def test_worker_with_migrate_brings_a_partial_schema_up_to_date(
    pg_dsn: str, bare_schema: str, old_app: Celery
) -> None:
    migrate_to(pg_dsn, bare_schema, VERSIONS[0])
    with testing.start_worker(old_app, migrate=True):
        assert old_app.tasks["versions.add"].delay(2, 2).get(timeout=10) == 4
    with psycopg.connect(pg_dsn) as conn:
        assert migrations.applied(conn, bare_schema) == LATEST


def test_worker_roles_keep_claiming_across_the_concurrency_limits_upgrade(
    pg_dsn: str, bare_schema: str
) -> None:
    """Claims write concurrency_limits from version 10 on: a role given a worker's rights
    before it (by an older `pgtasks grants`) is given the same on the new table."""
    ident = sql.Identifier(bare_schema)
    migrate_to(pg_dsn, bare_schema, 9)
    with (
        psycopg.connect(pg_dsn, autocommit=True) as conn,
        scratch_role(conn, "worker") as (role, who),
    ):
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {}.rate_limits TO {}").format(
                ident, who
            )
        )
        migrations.migrate(pg_dsn, bare_schema)
        table = f"{bare_schema}.concurrency_limits"
        rights = conn.execute(
            "SELECT p, has_table_privilege(%s, %s, p)"
            " FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p",
            (role, table),
        ).fetchall()
        assert all(granted for _, granted in rights), rights
        # A role without a worker's rights gets none.
        assert conn.execute(
            "SELECT has_table_privilege('pg_monitor', %s, 'SELECT')", (table,)
        ).fetchone() == (False,)


def test_a_quota_index_made_before_blocked_rows_existed_is_rebuilt(
    pg_dsn: str, bare_schema: str
) -> None:
    ident = sql.Identifier(bare_schema)
    migrate_to(pg_dsn, bare_schema, 10)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.quotas VALUES ('importer', 5)").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE INDEX tasks_source_pending_idx ON {}.tasks (source)"
                " WHERE status = 'PENDING'"
            ).format(ident)
        )
        migrations.migrate(pg_dsn, bare_schema)
        found = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s"
            " AND indexname = 'tasks_source_pending_idx'",
            (bare_schema,),
        ).fetchone()
    assert found is not None and "BLOCKED" in found[0]


# -- 0016: tasks rebuilt with the columns that claims and outcomes change at the end -----------

#: The columns every claim or outcome writes, last in that order from version 16 on.
CHANGING = ["attempt", "status", "claimed_by", "lease_until", "updated_at"]


def _table_facts(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """Everything attached to ``schema``.tasks, in a form that does not depend on its oid."""
    table = f"{sql.Identifier(schema).as_string(conn)}.tasks"

    def all_of(query: str) -> list[Any]:
        return sorted(conn.execute(query, {"t": table, "s": schema}).fetchall(), key=repr)

    return {
        "indexes": all_of(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s"
            " AND tablename = 'tasks'"
        ),
        "constraints": all_of(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %(t)s::regclass AND contype <> 'n'"
        ),
        "triggers": all_of(
            "SELECT tgname, tgenabled, pg_get_triggerdef(oid) FROM pg_trigger"
            " WHERE tgrelid = %(t)s::regclass AND NOT tgisinternal"
        ),
        "policies": all_of(
            "SELECT policyname, permissive, roles::text, cmd, qual, with_check FROM pg_policies"
            " WHERE schemaname = %(s)s AND tablename = 'tasks'"
        ),
        "table": all_of(
            "SELECT relrowsecurity, relforcerowsecurity, reloptions::text, relacl::text,"
            " relowner::regrole::text, obj_description(oid, 'pg_class')"
            " FROM pg_class WHERE oid = %(t)s::regclass"
        ),
        "columns": all_of(
            "SELECT attname, attacl::text, atttypid::regtype::text, attnotnull,"
            " pg_get_expr(d.adbin, d.adrelid), col_description(attrelid, attnum)"
            " FROM pg_attribute LEFT JOIN pg_attrdef AS d"
            " ON d.adrelid = attrelid AND d.adnum = attnum"
            " WHERE attrelid = %(t)s::regclass AND attnum > 0 AND NOT attisdropped"
        ),
        "rows": conn.execute(
            sql.SQL("SELECT to_jsonb(t) FROM {}.tasks AS t ORDER BY id").format(
                sql.Identifier(schema)
            )
        ).fetchall(),
    }


def _column_order(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum",
            (f"{sql.Identifier(schema).as_string(conn)}.tasks",),
        ).fetchall()
    ]


def test_the_tasks_rebuild_keeps_rows_rights_policies_and_everything_attached(
    pg_dsn: str, bare_schema: str
) -> None:
    ident = sql.Identifier(bare_schema)
    migrate_to(pg_dsn, bare_schema, 15)
    with (
        psycopg.connect(pg_dsn, autocommit=True) as conn,
        scratch_role(conn, "app") as (_role, who),
    ):
        setup = [
            # Rows in every shape the claim path writes: pending, running, finished, raw.
            "INSERT INTO {s}.tasks (id, name, payload, headers, run_at)"
            " VALUES ('a', 'x.pending', '[[1], {{}}]', '{{\"parent_id\": \"p\"}}',"
            " '2030-01-01T00:00:00Z')",
            "INSERT INTO {s}.tasks (id, name, payload, status, attempt, claimed_by,"
            " lease_until, max_retries, unique_key) VALUES ('b', 'x.running', '[[], {{}}]',"
            " 'RUNNING', 3, 'w-1', now() + interval '30 s', 5, 'k-1')",
            "INSERT INTO {s}.tasks (id, name, payload_raw, content_type, status, error,"
            " traceback, retries, cancel_requested, requeued_attempt) VALUES ('c',"
            " 'x.dead', '\\x00ff', 'application/x-python-serialize', 'DEAD', 'boom',"
            " 'Traceback', 7, true, 2)",
            # What an operator may have attached to the table.
            "GRANT USAGE ON SCHEMA {s} TO {r}",
            "GRANT SELECT, INSERT ON {s}.tasks TO {r} WITH GRANT OPTION",
            "GRANT UPDATE (cancel_requested) ON {s}.tasks TO {r}",
            "ALTER TABLE {s}.tasks ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY app_names ON {s}.tasks FOR INSERT TO {r} WITH CHECK (name LIKE 'x.%%')",
            "CREATE POLICY app_reads ON {s}.tasks AS RESTRICTIVE FOR SELECT TO {r}"
            " USING (queue = 'celery')",
            "ALTER TABLE {s}.tasks SET (autovacuum_vacuum_scale_factor = 0.01)",
            "COMMENT ON TABLE {s}.tasks IS 'the queue'",
            "COMMENT ON COLUMN {s}.tasks.payload IS 'the arguments'",
            "CREATE INDEX tasks_by_name ON {s}.tasks (name) WHERE status = 'DEAD'",
            "CREATE FUNCTION {s}.audit() RETURNS trigger LANGUAGE plpgsql"
            " AS 'BEGIN RETURN NEW; END'",
            "CREATE TRIGGER tasks_audit BEFORE UPDATE ON {s}.tasks"
            " FOR EACH ROW EXECUTE FUNCTION {s}.audit()",
            "ALTER TABLE {s}.tasks DISABLE TRIGGER tasks_audit",
        ]
        for statement in setup:
            conn.execute(sql.SQL(statement).format(s=ident, r=who))
        before = _table_facts(conn, bare_schema)
        assert _column_order(conn, bare_schema)[-1] == "unique_until_started"

        # 0016 alone, as the pgtasks that shipped it would have run it.
        shipped = [m for m in migrations.available() if m.version <= 16]
        with mock.patch.object(migrations, "available", lambda: shipped):
            assert [m.version for m in migrations.migrate(pg_dsn, bare_schema)] == [16]

        after = _table_facts(conn, bare_schema)
        for what, facts in before.items():
            assert after[what] == facts, what
        order = _column_order(conn, bare_schema)
        assert order[-len(CHANGING) :] == CHANGING
        assert sorted(order) == sorted(row[0] for row in before["columns"])
        # The old table is gone, and its statistics were gathered again.
        assert conn.execute(
            "SELECT to_regclass(%s), (SELECT reltuples FROM pg_class WHERE oid = %s::regclass)",
            (f"{bare_schema}.tasks_before_0016", f"{bare_schema}.tasks"),
        ).fetchone() == (None, 3)


@pytest.mark.parametrize(
    ("attach", "error"),
    [
        ("ALTER TABLE {s}.tasks ADD COLUMN tenant text", "has columns pgtasks does not know"),
        ("CREATE VIEW {s}.pending AS SELECT id FROM {s}.tasks", "other objects depend on it"),
    ],
)
def test_the_tasks_rebuild_stops_and_changes_nothing_on_what_it_cannot_carry(
    pg_dsn: str, bare_schema: str, attach: str, error: str
) -> None:
    ident = sql.Identifier(bare_schema)
    migrate_to(pg_dsn, bare_schema, 15)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.tasks (id, name, payload) VALUES ('a', 'x', '[]')").format(
                ident
            )
        )
        conn.execute(sql.SQL(attach).format(s=ident))
        before = _column_order(conn, bare_schema)
        with pytest.raises(psycopg.Error, match=error):
            migrations.migrate(pg_dsn, bare_schema)
        assert migrations.applied(conn, bare_schema) == 15
        assert _column_order(conn, bare_schema) == before
        assert conn.execute(sql.SQL("SELECT id FROM {}.tasks").format(ident)).fetchall() == [("a",)]
