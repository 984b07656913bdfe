"""Versioned schema: applies ``migrations/NNNN_slug.sql`` in order under an advisory lock.

Migrations are append-only. Several processes may migrate at once: the lock makes the second wait
and then find nothing left to do. Each file runs in its own transaction with its version row.

What they add up to is written out in ``pgtasks/sql/schema.sql``, the schema to read. A new
migration updates that file in the same change: ``tests/integration/test_schema_snapshot.py``
(or ``python -m pgtasks.sql.snapshot --check``) builds a schema each way and shows how they
differ. In both files ``{schema}`` is the quoted schema name, ``{channel}`` the literal name
of its notification channel, and ``{{``/``}}`` stand for braces.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from pgtasks.broker import notify_channel
from pgtasks.exceptions import SchemaOutOfDate

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
# Any constant shared by every pgtasks process; the schema name is mixed in by hashtext().
_LOCK_NAMESPACE = 0x70677461


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


def available() -> list[Migration]:
    """Every migration shipped with this version of pgtasks, oldest first."""
    found = []
    for entry in resources.files("pgtasks.migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


def latest() -> int:
    return available()[-1].version


def applied(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The newest applied version, None if the schema has never been migrated."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (f"{sql.Identifier(schema).as_string(conn)}.migrations",),
    ).fetchone()
    if not row or not row[0]:
        return None
    version = conn.execute(
        sql.SQL("SELECT max(version) FROM {}.migrations").format(sql.Identifier(schema))
    ).fetchone()
    return None if version is None else version[0]


def migrate(
    dsn: str,
    schema: str,
    progress: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Bring ``schema`` up to date; returns the migrations applied by this call."""
    done: list[Migration] = []
    ident = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_LOCK_NAMESPACE, schema))
        try:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident)
            )
            current = applied(conn, schema) or 0
            if current > latest():
                raise SchemaOutOfDate(
                    f"schema {schema!r} is at version {current}, newer than this pgtasks "
                    f"({latest()}); upgrade pgtasks"
                )
            for migration in available():
                if migration.version <= current:
                    continue
                if progress:
                    progress(migration)
                body = sql.SQL(migration.text).format(
                    schema=ident, channel=sql.Literal(notify_channel(schema))
                )
                with conn.transaction():
                    conn.execute(body)
                    conn.execute(
                        sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(
                            ident
                        ),
                        (migration.version, migration.name),
                    )
                done.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LOCK_NAMESPACE, schema))
    return done


def check(dsn: str, schema: str) -> None:
    """Raise ``SchemaOutOfDate`` with what to do unless the schema is exactly current."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        current = applied(conn, schema)
    want = latest()
    if current is None:
        raise SchemaOutOfDate(
            f"schema {schema!r} has no pgtasks tables; run `pgtasks migrate` (or start the "
            "worker with --migrate)"
        )
    if current < want:
        raise SchemaOutOfDate(
            f"schema {schema!r} is at version {current} but this pgtasks needs {want}; "
            "run `pgtasks migrate` (or start the worker with --migrate)"
        )
    if current > want:
        raise SchemaOutOfDate(
            f"schema {schema!r} is at version {current}, newer than this pgtasks ({want}); "
            "upgrade pgtasks on this host"
        )
