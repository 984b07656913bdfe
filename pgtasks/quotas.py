"""Quotas: at most N waiting tasks per source, so that a loop enqueueing by mistake cannot fill
the task table.

A row's source is the ``task_source`` setting of the app that enqueued it (sent as the
session's ``pgtasks.source``), else the database role it connected as. ``pgtasks quota set``
records a bound; an insert that would leave that source with more waiting tasks (PENDING, or
BLOCKED by a concurrency limit) fails as a whole with :class:`pgtasks.exceptions.QuotaExceeded`,
and nothing of it is written.

The check is a trigger on the task table, with an index of waiting rows by source to count
with; both exist only while at least one quota is set, so enqueueing pays nothing for quotas
nobody uses. A check counts up to the quota's size, so keep quotas to what a source should
never exceed (thousands to a few hundred thousand), not as a throttle. Two inserts of one
source at the same moment each count without the other's rows, so the bound can be exceeded by
what is in flight. The statements run as the schema's owner (see ``pgtasks grants``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

TRIGGER = "tasks_quota"
INDEX = "tasks_source_pending_idx"


@dataclass(frozen=True)
class Quota:
    source: str
    max_pending: int
    waiting: int


def _connect(dsn: str, schema: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    return conn


def set_quota(dsn: str, schema: str, source: str, max_pending: int) -> None:
    """Allow ``source`` at most ``max_pending`` waiting tasks (replacing its bound)."""
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 0:
        raise ValueError("a quota is a number of tasks, 0 or more")
    if not source or "\x00" in source:
        raise ValueError("a source is a non-empty name")
    with _connect(dsn, schema) as conn:
        # Built concurrently, outside a transaction: enqueueing goes on meanwhile.
        conn.execute(
            sql.SQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON tasks (source)"
                " WHERE status IN ('PENDING', 'BLOCKED')"
            ).format(sql.Identifier(INDEX))
        )
        with conn.transaction():
            conn.execute(
                "INSERT INTO quotas (source, max_pending) VALUES (%s, %s)"
                " ON CONFLICT (source) DO UPDATE"
                " SET max_pending = EXCLUDED.max_pending, updated_at = now()",
                (source, max_pending),
            )
            conn.execute(
                sql.SQL(
                    "CREATE OR REPLACE TRIGGER {} AFTER INSERT ON tasks"
                    " REFERENCING NEW TABLE AS new_rows"
                    " FOR EACH STATEMENT EXECUTE FUNCTION enforce_quotas()"
                ).format(sql.Identifier(TRIGGER))
            )


def clear_quota(dsn: str, schema: str, source: str) -> bool:
    """Remove ``source``'s bound; returns whether it had one. With the last quota gone, the
    trigger and its index go too."""
    with _connect(dsn, schema) as conn:
        with conn.transaction():
            found = conn.execute("DELETE FROM quotas WHERE source = %s", (source,)).rowcount
            left = conn.execute("SELECT count(*) FROM quotas").fetchone()
            if left is not None and left[0] == 0:
                conn.execute(
                    sql.SQL("DROP TRIGGER IF EXISTS {} ON tasks").format(sql.Identifier(TRIGGER))
                )
                dropping = True
            else:
                dropping = False
        if dropping:
            conn.execute(
                sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(INDEX))
            )
    return found > 0


def quotas(dsn: str, schema: str) -> list[Quota]:
    """Every quota with its source's waiting tasks now."""
    with _connect(dsn, schema) as conn:
        rows = conn.execute(
            "SELECT q.source, q.max_pending,"
            " (SELECT count(*) FROM tasks AS t"
            "   WHERE t.source = q.source AND t.status IN ('PENDING', 'BLOCKED')) AS waiting"
            " FROM quotas AS q ORDER BY q.source"
        ).fetchall()
    return [Quota(source, limit, waiting) for source, limit, waiting in rows]
