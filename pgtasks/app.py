"""The app: settings, the task registry, the ``@app.task`` decorator and the broker.

Nothing happens at construction: the connection pool opens on first use, in the process that
uses it, so apps can be created at import time and survive ``fork``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, tzinfo
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any, TypeVar, overload
from zoneinfo import ZoneInfo

from pgtasks import config, embedded, routing, serialization, transaction
from pgtasks.broker import Broker
from pgtasks.exceptions import ImproperlyConfigured, NotRegistered
from pgtasks.result import AsyncResult
from pgtasks.task import Task

if TYPE_CHECKING:
    from pgtasks.aio import AsyncBroker
    from pgtasks.canvas import Signature

F = TypeVar("F", bound=Callable[..., Any])

_current: Celery | None = None
_shared: list[tuple[Callable[..., Any], dict[str, Any]]] = []


def get_current_app() -> Celery:
    """The app created most recently."""
    if _current is None:
        raise ImproperlyConfigured(
            "no pgtasks app exists yet: create one with `app = Celery('proj')` before using "
            "shared tasks"
        )
    return _current


class _CurrentApp:
    """Celery's ``current_app``: stands for the app created most recently.

    Attribute access goes to that app (``current_app.conf``, ``current_app.send_task``), as
    with Celery's proxy; calling it returns the app itself.
    """

    def __call__(self) -> Celery:
        return get_current_app()

    def _get_current_object(self) -> Celery:
        return get_current_app()

    def __getattr__(self, name: str) -> Any:
        return getattr(get_current_app(), name)

    def __repr__(self) -> str:
        return repr(_current) if _current is not None else "<current_app: no app yet>"


current_app = _CurrentApp()


def normalise_dsn(url: str) -> str:
    """Accept the URL spellings users bring from SQLAlchemy and Heroku; reject other brokers."""
    import psycopg

    url = url.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgres", "postgresql", "pgtasks") or scheme.startswith("postgresql+"):
        url = "postgresql://" + url.split("://", 1)[1]
    elif scheme:
        raise ImproperlyConfigured(
            f"broker URL scheme {scheme!r} is not supported: pgtasks keeps tasks in PostgreSQL, "
            "so use a postgresql:// URL (for example postgresql://user@localhost/app)"
        )
    hint = (
        "Use postgresql://user:password@host:5432/dbname or a libpq string such as "
        "'host=localhost dbname=app'"
    )
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        # libpq quotes the URI in some messages: never echo its password.
        redacted = re.sub(r"(://[^:@/]*):[^@/]*@", r"\1:***@", url)
        reason = " ".join(str(exc).replace(url, redacted).split())
        raise ImproperlyConfigured(f"malformed database URL: {reason}. {hint}") from None
    # libpq parses the port as text and only rejects it when connecting; check it here.
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ImproperlyConfigured(
                f"malformed database URL: port {port!r} is not a number from 1 to 65535. {hint}"
            )
    return url


class Control:
    """``app.control``: revoke and purge."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def revoke(
        self,
        task_id: str | Iterable[str],
        terminate: bool = False,
        signal: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Cancel tasks by id. A waiting task becomes REVOKED at once. A running one is flagged:
        it cannot record success, ends REVOKED, and sees ``self.request.cancelled`` (and
        ``AbortableTask.is_aborted()``); its worker hears of it at once. With ``terminate``,
        a prefork worker also stops the task's process with ``signal`` (default SIGTERM)."""
        from pgtasks.utils import parse_signal

        stop: str | None = None
        if terminate:
            stop = parse_signal(signal or "SIGTERM").name
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        for tid in ids:
            self.app.broker.revoke(tid, signal=stop)

    def purge(self) -> int:
        """Delete every waiting task; returns how many."""
        return self.app.broker.purge(None)

    def ping(
        self, destination: Iterable[str] | None = None, timeout: float = 1.0, **kwargs: Any
    ) -> list[dict[str, dict[str, str]]]:
        """Celery's ``[{worker: {'ok': 'pong'}}]`` for every live worker.

        A worker is live while its heartbeat (sent with each lease renewal) is newer than one
        lease; the answer comes from the database, so ``timeout`` only bounds nothing here.
        """
        wanted = set(destination) if destination else None
        rows = self.app.broker.live_workers(self.app.settings.lease_seconds)
        return [
            {row["id"]: {"ok": "pong"}} for row in rows if wanted is None or row["id"] in wanted
        ]


class Celery:
    """A pgtasks application: Celery's constructor and methods, PostgreSQL underneath."""

    def __init__(
        self,
        main: str | None = None,
        *,
        broker: str | None = None,
        backend: str | None = None,
        include: Sequence[str] | None = None,
        set_as_current: bool = True,
        **settings: Any,
    ) -> None:
        global _current
        self.main = main
        self.conf = config.Conf()
        if broker is not None:
            self.conf["broker_url"] = broker
        self.conf.update(settings)
        self.include = list(include or [])
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.control = Control(self)
        from pgtasks.signals import Signal

        #: Celery's app signals, sent once (with ``sender=app``) before the app is first used
        #: to run or schedule tasks: the place for ``sender.add_periodic_task(...)``.
        self.on_configure = Signal(name="app.on_configure")
        self.on_after_configure = Signal(name="app.on_after_configure")
        self.on_after_finalize = Signal(name="app.on_after_finalize")
        self._finalized = False
        self._settings: config.Settings | None = None
        self._settings_key: tuple[tuple[str, str], ...] | None = None
        self._broker: Broker | None = None
        self._async_broker: AsyncBroker | None = None
        self._lock = threading.Lock()
        self._shared_bound = 0
        self._discover_later: list[str] = []
        #: The packages ``autodiscover_tasks()`` searches when given none (the Django fix-up
        #: sets it to the installed apps); read only when discovery runs, after set-up.
        self.default_packages: Callable[[], Iterable[str]] | None = None
        if set_as_current:
            _current = self
        if os.environ.get("DJANGO_SETTINGS_MODULE"):
            # As in Celery, a Django project gets the fix-up without asking for it.
            from pgtasks.contrib import django as django_fixup

            django_fixup.install_if_available(self)

    def __repr__(self) -> str:
        return f"<Celery {self.main or '__main__'}>"

    # -- configuration -------------------------------------------------------------------------

    @property
    def settings(self) -> config.Settings:
        """Validated settings (recomputed when ``conf`` changes)."""
        key = tuple(sorted((k, repr(v)) for k, v in self.conf.items()))
        if self._settings is None or key != self._settings_key:
            self._settings = config.build(self.conf)
            self._settings_key = key
        return self._settings

    @property
    def timezone(self) -> tzinfo:
        """The app's time zone, as Celery's: ``timezone`` if set, else UTC (or the local zone
        when ``enable_utc`` is off). Crontab schedules and naive datetimes use it."""
        settings = self.settings
        if settings.timezone:
            return ZoneInfo(settings.timezone)
        if settings.enable_utc:
            return dt_timezone.utc
        local = datetime.now().astimezone().tzinfo
        return local if local is not None else dt_timezone.utc

    def config_from_object(
        self, obj: Any, namespace: str | None = None, silent: bool = False
    ) -> None:
        """Load settings from an object or module path (``'proj.celeryconfig'``,
        ``'django.conf:settings'``); with ``namespace='CELERY'`` only ``CELERY_*`` names count."""
        if isinstance(obj, str):
            module_name, _, attr = obj.partition(":")
            try:
                obj = importlib.import_module(module_name)
            except ImportError:
                if silent:
                    return
                raise
            if attr:
                obj = getattr(obj, attr)
        items: Mapping[str, Any] = obj if isinstance(obj, Mapping) else _public_attributes(obj)
        prefix = f"{namespace}_" if namespace else ""
        for key, value in items.items():
            if key.startswith("__"):
                continue
            if prefix:
                if not key.startswith(prefix):
                    continue
                key = key[len(prefix) :].lower()
            elif not key.islower() and key not in config.CELERY_NAMES:
                continue
            self.conf[key] = value

    def route(
        self,
        name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> str | None:
        """The queue ``task_routes`` sends a call of ``name`` to, if any."""
        return routing.route(self.conf.get("task_routes"), name, args, kwargs, options)

    # -- database ------------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The configured database URL, or the embedded server's when none is configured."""
        url = self.settings.database_url
        if url:
            return normalise_dsn(url)
        return embedded.dsn(self.settings.embedded_dir)

    @property
    def broker(self) -> Broker:
        """The broker for this process (created on first use)."""
        if self._broker is None:
            with self._lock:
                if self._broker is None:
                    s = self.settings
                    self._broker = Broker(
                        self.database_url,
                        s.schema_name,
                        prepared_statements=s.prepared_statements,
                        min_size=s.pool_min_size,
                        max_size=s.pool_max_size,
                        connect_timeout=s.connect_timeout,
                        source=s.task_source,
                        max_payload_bytes=s.max_payload_bytes,
                    )
        return self._broker

    def transaction(self, connection: Any) -> contextlib.AbstractContextManager[Any]:
        """``with app.transaction(conn):`` writes every task this app enqueues in the block (in
        this thread or asyncio task) on ``conn``, inside its open transaction: the rows commit
        or roll back with the caller's own writes.

        ``conn`` is a psycopg 3 connection, a SQLAlchemy ``Session``/``Connection`` on psycopg 3,
        or a Django database wrapper on psycopg 3. The block does not commit; the caller does.
        """
        return transaction.bind(self, connection)

    @property
    def async_broker(self) -> AsyncBroker:
        """The asyncio side of the broker (``delay_async``, ``get_async``): one async pool per
        event loop, opened on first use."""
        # Kept across close(): its pools and listeners belong to event loops, and only
        # close_async(), awaited on each loop, can close them.
        current = self._async_broker
        if current is None:
            from pgtasks.aio import AsyncBroker

            current = self._async_broker = AsyncBroker(self.broker)
        return current

    async def close_async(self) -> None:
        """Close the async pool of the running event loop (the sync pool stays open)."""
        if self._async_broker is not None:
            await self._async_broker.close()

    def close(self) -> None:
        """Close the connection pool."""
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    def decode_result(self, data: bytes, content_type: str, content_encoding: str) -> Any:
        """A stored result, refused unless its content type is accepted: Celery's
        ``result_accept_content``, else ``accept_content``."""
        s = self.settings
        accept = s.result_accept_content or s.accept_content
        return serialization.decode(data, content_type, content_encoding, accept=accept)

    # -- tasks ---------------------------------------------------------------------------------

    @overload
    def task(self, fun: F) -> Task[Any, Any]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        bind: bool = False,
        base: type[Task[Any, Any]] | None = None,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Task[Any, Any]]: ...

    def task(self, fun: Callable[..., Any] | None = None, **options: Any) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(name=…, bind=True, …)``."""
        if fun is not None and callable(fun) and not options:
            return self._register(fun, {})

        def decorator(f: Callable[..., Any]) -> Task[Any, Any]:
            return self._register(f, options)

        return decorator

    def _register(self, fun: Callable[..., Any], options: dict[str, Any]) -> Task[Any, Any]:
        options = dict(options)
        name = options.pop("name", None) or f"{fun.__module__}.{fun.__qualname__}"
        if name in self.tasks:
            return self.tasks[name]
        bind = bool(options.pop("bind", False))
        base = options.pop("base", None) or Task
        options.pop("shared", None)
        task: Task[Any, Any] = base(self, fun, name, bind, **options)
        self.tasks[name] = task
        return task

    def _bind_shared(self) -> None:
        while self._shared_bound < len(_shared):
            fun, opts = _shared[self._shared_bound]
            self._register(fun, opts)
            self._shared_bound += 1

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task called ``name``; raises ``NotRegistered``."""
        self._bind_shared()
        try:
            return self.tasks[name]
        except KeyError:
            raise NotRegistered(name) from None

    def registered(self) -> list[str]:
        self._bind_shared()
        return sorted(self.tasks)

    def signature(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this app's (Celery's ``app.signature``): a task name, or a
        signature's dict, with its arguments and options."""
        from pgtasks.canvas import signature

        kwargs["app"] = self
        return signature(*args, **kwargs)

    def send_task(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a task by name, without importing its code (the worker must know it)."""
        self._bind_shared()
        task: Task[Any, Any] = self.tasks.get(name) or self.task_stub(name)
        return task.apply_async(args, kwargs, **options)

    def task_stub(self, name: str) -> Task[Any, Any]:
        """A stand-in for a task this process has not imported: it can be enqueued by name
        (``send_task``, periodic entries), not run."""
        return Task(self, _not_here(name), name, False)

    def finalize(self) -> None:
        """Bind shared tasks and send ``on_after_configure`` and ``on_after_finalize`` (once).

        Workers and schedulers call it before they start, so receivers that add periodic
        tasks have run by then, as in Celery.
        """
        with self._lock:
            if self._finalized:
                return
            self._finalized = True
        self._bind_shared()
        self.on_configure.send(sender=self)
        self.on_after_configure.send(sender=self, source=self.conf)
        self.on_after_finalize.send(sender=self)

    def add_periodic_task(
        self,
        schedule: Any,
        sig: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        **options: Any,
    ) -> str:
        """Add a ``beat_schedule`` entry calling ``sig`` on ``schedule`` (a crontab, a
        timedelta or seconds); returns the entry's name."""
        from pgtasks.scheduler import add_periodic_task

        return add_periodic_task(self, schedule, sig, args, kwargs, name, **options)

    def AsyncResult(self, id: str, task_name: str | None = None) -> AsyncResult:
        """A handle on the result of the task with this id."""
        return AsyncResult(id, self, task_name=task_name)

    def autodiscover_tasks(
        self,
        packages: Iterable[str] | None = None,
        related_name: str = "tasks",
        force: bool = False,
    ) -> None:
        """Import ``<package>.tasks`` for each package (and the ``include`` modules).

        With no packages, the packages are ``default_packages`` (Django's installed apps under
        the Django fix-up), searched lazily as in Celery: when a worker starts, or now with
        ``force=True`` — so a module can call this before Django is set up.
        """
        if packages is None and not force:
            self._discover_later.append(related_name)
            return
        if packages is None:
            packages = self.default_packages() if self.default_packages else ()
        for module in self.include:
            importlib.import_module(module)
        for package in packages or ():
            try:
                importlib.import_module(f"{package}.{related_name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{related_name}":
                    raise

    def import_includes(self) -> None:
        """Import the modules named in ``include`` so their tasks register."""
        for module in self.include:
            importlib.import_module(module)
        while self._discover_later:
            self.autodiscover_tasks(None, self._discover_later.pop(0), force=True)
        self._bind_shared()


def _public_attributes(obj: Any) -> dict[str, Any]:
    """An object's public attributes as a dict. Some settings objects (Django's) list names
    in ``dir()`` that they cannot produce; those are skipped, not fatal."""
    found: dict[str, Any] = {}
    for key in dir(obj):
        if key.startswith("_"):
            continue
        try:
            found[key] = getattr(obj, key)
        except AttributeError:
            continue
    return found


def _not_here(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotRegistered(name)

    return missing


class SharedTask:
    """What ``@shared_task`` returns: a task that finds its app when it is used."""

    def __init__(self, fun: Callable[..., Any], options: dict[str, Any]) -> None:
        self.fun = fun
        self.options = options
        self.name = options.get("name") or f"{fun.__module__}.{fun.__qualname__}"
        self.__doc__ = fun.__doc__
        self.__name__ = getattr(fun, "__name__", self.name)
        self.__wrapped__ = fun

    def _task(self) -> Task[Any, Any]:
        app = current_app()
        app._bind_shared()
        return app.tasks[self.name]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._task(), attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._task()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<@shared_task: {self.name}>"


@overload
def shared_task(fun: Callable[..., Any]) -> Any: ...


@overload
def shared_task(**options: Any) -> Callable[[Callable[..., Any]], Any]: ...


def shared_task(fun: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Define a task without an app; it binds to the current app when it is used."""

    def decorator(f: Callable[..., Any]) -> SharedTask:
        _shared.append((f, options))
        return SharedTask(f, options)

    if fun is not None and callable(fun) and not options:
        return decorator(fun)
    return decorator
