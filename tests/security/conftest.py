"""The security tier: every test connects as the roles ``pgtasks grants`` sets up, or as a
login role given nothing at all, and tries what an attacker with that login would try.

The producer is limited as docs/operating.md shows (``--queues celery --tasks
proj.add,proj.echo``); the victim is another producer, of ``billing.*``; the worker and the
administrator are the usual ones; ``nobody`` can log in and has no rights of any kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtasks import Celery, grants

#: What ran in this process's workers, by task name.
RAN: dict[str, list[Any]] = {}


class Roles:
    """The roles of one test, on its schema."""

    KINDS = ("producer", "victim", "worker", "admin", "nobody")

    def __init__(self, pg_dsn: str, schema: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.pg_dsn, self.schema = pg_dsn, schema
        self.names = {kind: f"pgt_{suffix}_{kind}" for kind in self.KINDS}
        self.producer = self.names["producer"]
        self.victim = self.names["victim"]
        self.worker = self.names["worker"]
        self.admin = self.names["admin"]
        self.nobody = self.names["nobody"]
        self._apps: list[Celery] = []

    def dsn(self, role: str) -> str:
        return make_conninfo(self.pg_dsn, user=role)

    def connect(self, role: str) -> psycopg.Connection[Any]:
        """An autocommit connection as ``role``, the test schema first on its search path."""
        conn = psycopg.connect(self.dsn(role), autocommit=True)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn

    def app(self, role: str, **settings: Any) -> Celery:
        """An app connecting as ``role``, with the tasks of the attacks registered."""
        settings.setdefault("lease_seconds", 2.0)
        settings.setdefault("poll_interval", 0.05)
        settings.setdefault("shutdown_grace", 5.0)
        app = Celery("security", broker=self.dsn(role), schema_name=self.schema, **settings)

        def record(name: str) -> Any:
            def run(*args: Any) -> Any:
                RAN.setdefault(name, []).append(args)
                if args == ("boom",):
                    raise ValueError("boom")
                return args[0] if len(args) == 1 else list(args)

            return run

        for name in ("proj.add", "proj.echo", "proj.dangerous", "billing.charge"):
            app.task(name=name)(record(name))
        self._apps.append(app)
        return app

    def close(self) -> None:
        for app in self._apps:
            app.close()


@pytest.fixture(autouse=True)
def forget_runs() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


@pytest.fixture
def roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    made = Roles(pg_dsn, schema)
    names = list(made.names.values())
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
                    queues=["celery"],
                    task_names=["proj.add", "proj.echo"],
                ),
            )
            grants.apply(
                pg_dsn, schema, grants.Roles(producers=[made.victim], task_names=["billing.*"])
            )
            yield made
        finally:
            made.close()
            idents = sql.SQL(", ").join(sql.Identifier(n) for n in names)
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(idents))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(idents))
            conn.execute(sql.SQL("DROP ROLE {}").format(idents))
