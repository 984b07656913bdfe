"""Idempotent effects: a task run again after a crash skips what an earlier run already did.

pgtasks runs a task at least once: a worker that dies or loses its lease mid-task means the
task runs again, from the start. ``Task.effect(name)`` marks one side effect of a task, so the
next run of the same task knows whether it already happened::

    @app.task(bind=True)
    def settle(self, order_id):
        with app.transaction(conn), conn.transaction():      # the effect's own writes
            with self.effect("ledger") as first_time:
                if first_time:
                    conn.execute("INSERT INTO ledger ...")
        with self.effect("email") as email:                  # outside the database
            if email:
                mailer.send(..., idempotency_key=email.key)

**In a database transaction** (``connection=``, or one bound by ``app.transaction`` or an
integration such as Django's ``atomic()``), the effect is recorded in that transaction, under a
savepoint: it commits with the effect's own writes, or not at all. That is exactly-once for
writes to the same database. A second run racing the first waits on the record until the first
commits, then skips.

**Outside a transaction** (a payment API, an email), nothing can make the effect and its
record one atomic step: the record is written after the block succeeds. A crash between the two
runs the effect again, so pair it with the service's own idempotency key: ``effect.key`` is made
from the task id and the effect's name, the same on every run of the task.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from pgtasks.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from types import TracebackType

    from pgtasks.broker import Broker


class Effect:
    """One named effect of one task; true when this run is the first to do it."""

    def __init__(
        self,
        broker: Broker,
        task_id: str,
        name: str,
        conn: psycopg.Connection[Any] | None,
    ) -> None:
        self.broker = broker
        self.task_id = task_id
        self.name = name
        #: The same on every run of the task: give it to the service the effect calls.
        self.key = f"{task_id}:{name}"
        self.first_time = False
        self._conn = conn

    def __bool__(self) -> bool:
        return self.first_time

    def __repr__(self) -> str:
        return f"<Effect {self.key!r} first_time={self.first_time}>"

    def __enter__(self) -> Effect:
        conn = self._conn
        if conn is None:
            self.first_time = not self.broker.effect_recorded(self.task_id, self.name)
            return self
        # A savepoint: an error in the block takes the record back with the effect's writes,
        # even if the caller's transaction goes on and commits.
        conn.execute(_SAVEPOINT)
        try:
            self.first_time = self.broker.record_effect(self.task_id, self.name, conn)
        except BaseException:
            self._undo(conn)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self._conn
        if conn is not None:
            if exc_type is None:
                conn.execute(_RELEASE)
            else:
                self._undo(conn)
            return
        if exc_type is None and self.first_time:
            self.broker.record_effect(self.task_id, self.name)

    @staticmethod
    def _undo(conn: psycopg.Connection[Any]) -> None:
        # The block's own error is what the caller needs to see, not a failed rollback of a
        # connection that broke meanwhile.
        with contextlib.suppress(psycopg.Error):
            conn.execute(_ROLLBACK)
            conn.execute(_RELEASE)


_SAVEPOINT = "SAVEPOINT pgtasks_effect"
_ROLLBACK = "ROLLBACK TO SAVEPOINT pgtasks_effect"
_RELEASE = "RELEASE SAVEPOINT pgtasks_effect"


def transaction_of(
    conn: psycopg.Connection[Any] | None, explicit: bool
) -> psycopg.Connection[Any] | None:
    """``conn`` when it is in a transaction an effect can join, else None (outside the
    database). A connection passed explicitly must be in one."""
    if conn is None:
        return None
    open_ = conn.info.transaction_status == pq.TransactionStatus.INTRANS
    if open_ or not conn.autocommit:
        return conn
    if explicit:
        raise ImproperlyConfigured(
            "an effect recorded on a database connection must be inside a transaction, so "
            "that it commits with the effect's own writes: use `with conn.transaction():` (or "
            "app.transaction, or Django's atomic()) around it"
        )
    return None
