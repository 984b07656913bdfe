"""Django integration: what Celery's Django fix-up does, plus enqueueing inside ``atomic()``.

The usual ``proj/celery.py`` works unchanged once its import line names pgtasks::

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

With ``DJANGO_SETTINGS_MODULE`` set the app installs this fix-up itself (as Celery does); call
``install(app)`` when settings are configured another way. The fix-up:

- calls ``django.setup()`` when a worker starts, before task modules are imported, and makes
  ``autodiscover_tasks()`` search the ``tasks`` module of every installed app;
- closes unusable or expired database connections before and after every task, and closes the
  caches after it, where the task runs (Celery's ``close_old_connections`` around tasks);
- drops, without closing them, the database connections a prefork child inherits from the worker
  (closing would end the parent's session on the shared socket);
- inside ``transaction.atomic()``, writes task rows on Django's own connection when Django uses
  psycopg 3 and the same database as the app, so the rows commit or roll back with the block.

``Task.delay_on_commit`` / ``apply_async_on_commit`` (Celery 5.4) enqueue after the commit instead.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from pgtasks import signals, transaction
from pgtasks.worker.execute import add_execution_hooks

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.request import Request

log = structlog.get_logger("pgtasks")

_LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}
# Connections a forked child inherited: kept referenced so that garbage collection never closes
# them (which would send a Terminate on the socket the parent still uses).
_inherited: list[Any] = []
_fixups: weakref.WeakKeyDictionary[Celery, DjangoFixup] = weakref.WeakKeyDictionary()


def _module(name: str) -> Any:
    # Imported by name: Django ships without type information, and is optional.
    return importlib.import_module(name)


def on_commit(callback: Callable[[], Any], using: str | None = None) -> None:
    """Run ``callback`` when Django's current transaction commits (now when none is open)."""
    _module("django.db.transaction").on_commit(callback, using=using)


def install_if_available(app: Celery) -> DjangoFixup | None:
    """Install the fix-up when Django can be imported (the app calls this when
    ``DJANGO_SETTINGS_MODULE`` is set); without Django, warn and go on, as Celery does."""
    try:
        importlib.import_module("django")
    except ImportError:
        log.warning(
            "django.fixup_skipped",
            reason="DJANGO_SETTINGS_MODULE is set but Django is not installed",
        )
        return None
    return install(app)


def install(app: Celery, *, using: str = "default") -> DjangoFixup:
    """Install the Django fix-up on ``app`` (idempotent); ``using`` names the Django database
    whose ``atomic()`` blocks task rows join."""
    fixup = _fixups.get(app)
    if fixup is None:
        fixup = DjangoFixup(app, using=using)
        fixup.install()
        _fixups[app] = fixup
    return fixup


class DjangoFixup:
    """Django's side of an app's life: set-up, task discovery and database connections."""

    def __init__(self, app: Celery, *, using: str = "default") -> None:
        self.app_ref = weakref.ref(app)
        self.using = using
        self._same_database: bool | None = None
        self._lock = threading.Lock()

    def install(self) -> None:
        """Hook into task discovery, execution and enqueueing of the app."""
        app = self.app_ref()
        assert app is not None
        app.default_packages = self.installed_apps
        add_execution_hooks(app, self.on_task_prerun, self.on_task_postrun)
        transaction.add_provider(app, self.enqueue_connection)
        # Celery sets Django up when its worker starts, before task modules are imported.
        signals.celeryd_init.connect(self.on_worker_init, weak=True)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _call(ref, "on_fork_child"))

    # -- set-up and discovery -----------------------------------------------------------------

    @staticmethod
    def setup() -> None:
        """``django.setup()`` unless the app registry is already populated."""
        if not _module("django.apps").apps.ready:
            _module("django").setup()

    def installed_apps(self) -> list[str]:
        """The packages of ``INSTALLED_APPS``, for ``autodiscover_tasks()``."""
        self.setup()
        return [config.name for config in _module("django.apps").apps.get_app_configs()]

    def on_worker_init(self, sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
        """A worker of this app starts: set Django up before it imports task modules."""
        if instance is not None and getattr(instance, "app", None) is self.app_ref():
            self.setup()

    # -- around each task ---------------------------------------------------------------------

    def on_task_prerun(self, task: Any, request: Request) -> None:
        """Before a task: drop connections that broke or outlived ``CONN_MAX_AGE``."""
        if not request.is_eager:
            self.close_database()

    def on_task_postrun(self, task: Any, request: Request) -> None:
        """After a task: the same, and close the caches (as after a request)."""
        if not request.is_eager:
            self.close_database()
            self.close_cache()

    def close_database(self) -> None:
        """Close this thread's Django connections that are unusable or obsolete, as Django does
        at the end of a request; a connection error while closing is no task failure."""
        db = _module("django.db")
        for conn in db.connections.all(initialized_only=True):
            try:
                conn.close_if_unusable_or_obsolete()
            except (db.InterfaceError, db.DatabaseError) as exc:
                log.warning("django.close_failed", alias=conn.alias, error=str(exc))

    @staticmethod
    def close_cache() -> None:
        """Close every configured cache (``django.core.cache.close_caches``)."""
        _module("django.core.cache").close_caches()

    def on_fork_child(self) -> None:
        """In a forked child: forget the parent's connections without touching their sockets."""
        if "django.db" not in sys.modules:
            return
        for conn in _module("django.db").connections.all(initialized_only=True):
            if conn.connection is not None:
                _inherited.append(conn.connection)
                conn.connection = None

    # -- enqueueing ---------------------------------------------------------------------------

    def enqueue_connection(self) -> psycopg.Connection[Any] | None:
        """Django's psycopg connection while an ``atomic()`` block is open on the app's
        database, so task rows share its fate; None otherwise (the app's pool is used)."""
        if not _module("django.apps").apps.ready:
            return None
        conn = _module("django.db").connections[self.using]
        if not conn.in_atomic_block:
            return None
        raw = conn.connection
        if not isinstance(raw, psycopg.Connection):
            # psycopg2 or another driver: rows go through the app's own connection, as in
            # Celery; delay_on_commit is the way to tie them to the transaction.
            return None
        return raw if self.same_database(raw) else None

    def same_database(self, raw: psycopg.Connection[Any]) -> bool:
        """Whether ``raw`` reaches the database the app's tasks live in (checked once)."""
        if self._same_database is None:
            with self._lock:
                if self._same_database is None:
                    self._same_database = self._compare(raw)
        return self._same_database

    def _compare(self, raw: psycopg.Connection[Any]) -> bool:
        app = self.app_ref()
        if app is None:
            return False
        with app.broker.connection() as ours:
            want = _where(ours)
        have = _where(raw)
        if have != want:
            log.warning(
                "django.enqueue_outside_atomic",
                reason="Django's database is not the one pgtasks uses, so task rows cannot "
                "join atomic() blocks; use delay_on_commit to tie them to a commit",
                django_database="{}:{}/{}".format(*have),
                pgtasks_database="{}:{}/{}".format(*want),
            )
        return have == want


def _where(conn: psycopg.Connection[Any]) -> tuple[str, int, str]:
    """Host, port and database of a connection, with every spelling of "this machine" one."""
    host = conn.info.host
    if host in _LOCAL_HOSTS or host.startswith("/"):
        host = "localhost"
    return host, conn.info.port, conn.info.dbname


def _call(ref: weakref.ref[DjangoFixup], method: str) -> None:
    fixup = ref()
    if fixup is not None:
        with contextlib.suppress(Exception):  # a fork hook must never break the fork
            getattr(fixup, method)()
