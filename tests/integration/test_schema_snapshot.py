"""``pgtasks/sql/schema.sql`` builds exactly what the migrations build.

One fresh schema is migrated, another is built from schema.sql, and the two are compared as
described from the catalogs (see :mod:`pgtasks.sql.snapshot`). The description must also be
able to tell two schemas apart: each kind of change a hand edit could get wrong is made to a
schema built from the file, and has to show.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from pgtasks import migrate as migrations
from pgtasks.sql import snapshot


def test_schema_sql_builds_what_the_migrations_build(pg_dsn: str) -> None:
    # Given a schema built by the migrations and one built from schema.sql
    from_migrations, from_snapshot = snapshot.compare(pg_dsn)

    # Then their descriptions are the same, line for line
    changes = snapshot.diff(from_migrations, from_snapshot)
    if changes:
        pytest.fail(
            "schema.sql differs from what the migrations build (- migrations, + schema.sql):\n"
            + "\n".join(changes),
            pytrace=False,
        )
    assert any(line.startswith("function wake(") for line in from_migrations)


@pytest.fixture(scope="module")
def loaded(pg_dsn: str) -> Iterator[str]:
    """A schema built from schema.sql, shared by the tests below (each undoes its change)."""
    name = f"snapshot_t_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            snapshot.load(conn, name)
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_a_schema_built_from_schema_sql_is_current(pg_dsn: str, loaded: str) -> None:
    # Then the version check passes and migrating has nothing left to do
    migrations.check(pg_dsn, loaded)
    assert migrations.migrate(pg_dsn, loaded) == []


CHANGES = {
    "column default": "ALTER TABLE tasks ALTER COLUMN queue SET DEFAULT 'default'",
    "nullability": "ALTER TABLE tasks ALTER COLUMN max_retries SET NOT NULL",
    "column type": "ALTER TABLE workers ALTER COLUMN pid TYPE bigint",
    "column order": "ALTER TABLE attempts DROP COLUMN started_at,"
    " ADD COLUMN started_at timestamptz",
    "check": "ALTER TABLE quotas DROP CONSTRAINT quotas_max_pending_check,"
    " ADD CONSTRAINT quotas_max_pending_check CHECK (max_pending > 0)",
    "index predicate": "DROP INDEX tasks_dead_idx;"
    " CREATE INDEX tasks_dead_idx ON tasks (updated_at) WHERE status = 'FAILED'",
    "trigger": "DROP TRIGGER results_notify_update ON results",
    "trigger enabled": "ALTER TABLE results DISABLE TRIGGER results_notify_update",
    "function body": "CREATE OR REPLACE FUNCTION notify_result() RETURNS trigger"
    " LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
    "security definer": "ALTER FUNCTION wake(text) SECURITY INVOKER",
    "function search_path": "ALTER FUNCTION refuse_unclaimed_outcome() RESET search_path",
    "volatility": "ALTER FUNCTION may_enqueue(text, text, text, integer) VOLATILE",
    "function privileges": "GRANT EXECUTE ON FUNCTION wake(text) TO PUBLIC",
    "table privileges": "GRANT SELECT ON tasks TO PUBLIC",
    "row-level security": "ALTER TABLE tasks ENABLE ROW LEVEL SECURITY",
    "policy": "CREATE POLICY reads ON tasks FOR SELECT TO PUBLIC USING (queue = 'a')",
    "unlogged": "ALTER TABLE parked_workers SET LOGGED",
    "storage option": "ALTER TABLE tasks SET (fillfactor = 60)",
    "sequence": "CREATE SEQUENCE numbers",
    "view": "CREATE VIEW waiting AS SELECT id FROM tasks WHERE status = 'PENDING'",
    "type": "CREATE TYPE colour AS ENUM ('red')",
    "table comment": "COMMENT ON TABLE tasks IS 'rows'",
    "column comment": "COMMENT ON COLUMN tasks.id IS 'the id'",
    "function comment": "COMMENT ON FUNCTION wake(text) IS 'wakes'",
    "trigger comment": "COMMENT ON TRIGGER tasks_notify_insert ON tasks IS 'wakes'",
    "version": "DELETE FROM migrations WHERE version = 17",
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_the_description_shows_each_kind_of_change(pg_dsn: str, loaded: str, change: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        before = snapshot.describe(conn, loaded)
        # When one thing of the schema changes (undone afterwards)
        with conn.transaction(force_rollback=True):
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(loaded)))
            conn.execute(change)
            after = snapshot.describe(conn, loaded)

    # Then the description shows it
    assert snapshot.diff(before, after)
