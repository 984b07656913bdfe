"""Enqueue inside the caller's transaction: the task row commits or rolls back with it.

``with app.transaction(conn):`` makes every ``delay``/``apply_async``/``send_task`` of that app in
the current thread (or asyncio task: the binding is a context variable) write its row on ``conn``.
``conn`` may be a psycopg 3 connection, a SQLAlchemy ``Session``/``Connection`` running on
psycopg 3, or a Django database wrapper on psycopg 3. A worker only sees the row once the caller
commits; a rolled-back transaction never runs its tasks.

Integrations (the Django fix-up) may also register a *connection provider* on an app: a callable
asked at each enqueue for the connection to use, or None for the app's own pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from pgtasks.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from pgtasks.app import Celery

#: Asked at each enqueue for the connection to write on; None means "use the app's pool".
ConnectionProvider = Callable[[], psycopg.Connection[Any] | None]

_bound: contextvars.ContextVar[tuple[tuple[Celery, psycopg.Connection[Any]], ...]] = (
    contextvars.ContextVar("pgtasks_enqueue_connections", default=())
)
# Weak keys: a provider must not keep a discarded app (and its pool) alive.
_providers: weakref.WeakKeyDictionary[Celery, list[ConnectionProvider]] = (
    weakref.WeakKeyDictionary()
)


def raw_connection(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg 3 connection behind ``conn``.

    Accepts a psycopg ``Connection``, a SQLAlchemy ``Session`` or ``Connection`` (its current
    transaction is used, or begun), or a Django database wrapper. Anything else, or a driver other
    than psycopg 3 (psycopg2, asyncpg), raises ``ImproperlyConfigured``: a row written on a
    different connection would commit on its own and break the promise of this API.
    """
    if isinstance(conn, psycopg.Connection):
        return conn
    found: Any = None
    kind = type(conn).__module__.split(".", 1)[0]
    if kind == "sqlalchemy":
        # Session.connection() joins (or begins) the session's transaction. A Connection that
        # has run nothing yet has no transaction SQLAlchemy knows of, and its commit() would
        # do nothing: begin one, as its first execute would. driver_connection is the DBAPI
        # connection under SQLAlchemy's pool proxy.
        sa_conn = conn.connection() if hasattr(conn, "get_bind") else conn
        if not sa_conn.in_transaction():
            sa_conn.begin()
        found = sa_conn.connection.driver_connection
    elif kind == "django" and hasattr(conn, "ensure_connection"):
        conn.ensure_connection()
        found = conn.connection
    if isinstance(found, psycopg.Connection):
        return found
    what = type(found if found is not None else conn)
    raise ImproperlyConfigured(
        f"cannot enqueue on a {what.__module__}.{what.__qualname__}: pgtasks writes task rows "
        "on psycopg 3 connections only (psycopg.Connection, or SQLAlchemy/Django using the "
        "psycopg 3 driver, e.g. postgresql+psycopg://)"
    )


@contextlib.contextmanager
def bind(app: Celery, conn: Any) -> Iterator[psycopg.Connection[Any]]:
    """Write ``app``'s enqueues in this context on ``conn`` (see ``Celery.transaction``)."""
    raw = raw_connection(conn)
    token = _bound.set((*_bound.get(), (app, raw)))
    try:
        yield raw
    finally:
        _bound.reset(token)


def add_provider(app: Celery, provider: ConnectionProvider) -> None:
    """Ask ``provider`` for the enqueue connection of ``app`` when no block binds one."""
    _providers.setdefault(app, []).append(provider)


def enqueue_connection(app: Celery) -> psycopg.Connection[Any] | None:
    """The connection ``app`` should enqueue on now, or None for its own pool."""
    # The innermost binding wins, so nested blocks on different connections behave like scopes.
    for bound_app, bound in reversed(_bound.get()):
        if bound_app is app:
            conn: psycopg.Connection[Any] = bound
            return conn
    for provider in _providers.get(app, ()):
        provided = provider()
        if provided is not None:
            return provided
    return None


def resolve(app: Celery, connection: Any = None) -> psycopg.Connection[Any] | None:
    """The connection an enqueue of ``app`` writes on: the caller's own (``connection=``),
    else the one bound by ``app.transaction`` or an integration, else None for the pool."""
    if connection is not None:
        return raw_connection(connection)
    return enqueue_connection(app)
