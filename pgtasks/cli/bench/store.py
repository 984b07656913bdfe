"""The bench's own SQL: the named queries of ``queries.sql`` beside this module.

They are loaded and composed for a schema as pgtasks' own are (:func:`pgtasks.sql.queries`),
and run on the connections of the bench app's broker (:meth:`pgtasks.broker.Broker.connection`:
a pooled one, or the caller's). The queue's own statements (enqueue, counts, purge) stay the
broker's: the bench only adds what it measures with, and the making of its schema.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from pgtasks.broker import Broker
from pgtasks.cli.bench.options import DEFAULT_SCHEMA
from pgtasks.sql import queries

Row = dict[str, Any]

#: The package whose ``queries.sql`` holds the bench's queries.
PACKAGE = __name__.rpartition(".")[0]


class BenchStore:
    """The bench's named queries on ``broker``'s schema and connections."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.q = queries(broker.schema, PACKAGE)

    def _all(
        self, name: str, params: dict[str, Any], conn: psycopg.Connection[Any] | None = None
    ) -> list[Row]:
        with self.broker.connection(conn) as c:
            return _execute(c, self.q[name], params)

    def _one(self, name: str, params: dict[str, Any]) -> Row | None:
        rows = self._all(name, params)
        return rows[0] if rows else None

    def server_version(self) -> str:
        """The server's version string, e.g. ``16.4 (Debian 16.4-1.pgdg120+1)``."""
        row = self._one("server_version", {})
        return str(row["version"]) if row else "unknown"

    def schema_state(self) -> str:
        """``absent``; ``bench`` when ``pgtasks bench`` created the schema; else ``other``."""
        row = self._one("schema_state", {"schema": self.broker.schema})
        if row is None or not row["present"]:
            return "absent"
        return "bench" if row["ours"] else "other"

    def create_schema(self) -> None:
        """Create the (absent) schema and mark it as ``pgtasks bench``'s."""
        self._all("create_schema", {})
        self._all("mark_schema", {})

    def drop_schema(self) -> None:
        """Drop the schema and everything in it."""
        self._all("drop_schema", {})

    def cost_sample(self) -> Row:
        """WAL position and the pids of the server processes serving this database."""
        row = self._one("cost_sample", {})
        assert row is not None
        return row

    def wal_bytes(self, since: str) -> int:
        """Bytes of WAL written since ``since``, a position from :meth:`cost_sample`."""
        row = self._one("wal_bytes", {"since": since})
        return int(row["bytes"]) if row else 0

    def maintenance(self) -> tuple[int, int]:
        """Vacuums finished on the tables that grow with every task, and checkpoints made by
        the server, so far (both cumulative; each statement runs in a transaction of its own,
        so the server's statistics are read afresh)."""
        with self.broker.connection() as conn:
            # The connection knows its server's version: no statement to ask it.
            later = conn.info.server_version >= 170000
            row = self._all("maintenance_17" if later else "maintenance", {}, conn)[0]
        return int(row["vacuums"]), int(row["checkpoints"])

    def steady_window(self, since: datetime) -> Row:
        """Latency percentiles of the results stored after ``since``, and table sizes."""
        row = self._one("steady_window", {"since": since})
        assert row is not None
        return row

    def synchronous_commit(self, on: bool, conn: psycopg.Connection[Any]) -> None:
        """Whether the commits of ``conn``'s session wait for the flush of their WAL."""
        self._all("synchronous_commit_on" if on else "synchronous_commit_off", {}, conn)


def hold_snapshot(conn: psycopg.Connection[Any]) -> None:
    """Begin on ``conn`` (not in autocommit) a REPEATABLE READ transaction holding an xid and
    a snapshot until it ends: meanwhile the xmin horizon does not move on. Its statements name
    no schema: any connection to the database will do, the broker's or not."""
    q = queries(DEFAULT_SCHEMA, PACKAGE)
    _execute(conn, q["repeatable_read"], {})
    _execute(conn, q["take_xid"], {})


def _execute(conn: psycopg.Connection[Any], query: Any, params: dict[str, Any]) -> list[Row]:
    """``query``'s rows as dicts (none for a statement that returns no rows)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        # The result's status rather than cur.description, as the broker reads it.
        result = cur.pgresult
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return []
        return cur.fetchall()
