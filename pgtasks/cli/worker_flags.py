"""The ``celery worker`` flags that ``pgtasks worker`` accepts, so existing command lines keep
working.

Implemented: ``--time-limit``, ``--soft-time-limit``, ``--max-tasks-per-child`` and
``--max-memory-per-child`` (prefork), ``--purge``/``--discard``, ``-X``/``--exclude-queues``,
``-I``/``--include``, ``-f``/``--logfile``, ``--pidfile``, ``--umask``, and ``--autoscale
MAX,MIN`` (runs MAX: the pool does not resize).
``-D``/``--detach`` is refused with a pointer to a process supervisor. The rest have no meaning
without a message broker (events, gossip, mingle, state files) and are accepted, hidden from
``--help``, and ignored; those a user might rely on (``--uid``/``--gid``) are named in a warning
at start.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any, TextIO, TypeVar

import click
import structlog

F = TypeVar("F", bound=Callable[..., Any])

log = structlog.get_logger("pgtasks")

#: Flags that change behaviour under Celery but are ignored here, worth a warning when given.
_WARN_IGNORED = {
    "uid": "--uid (run the worker as the right user instead)",
    "gid": "--gid (run the worker as the right group instead)",
}


def _hidden(*decls: str, **kw: Any) -> Callable[[F], F]:
    return click.option(*decls, hidden=True, **kw)


# Applied bottom-up by click: the visible ones read in this order in --help.
_OPTIONS: list[Callable[[F], F]] = [
    click.option(
        "--time-limit",
        type=click.FloatRange(min=0, min_open=True),
        help="Hard time limit in seconds: the task's process is killed (prefork only).",
    ),
    click.option(
        "--soft-time-limit",
        type=click.FloatRange(min=0, min_open=True),
        help="Soft time limit in seconds: SoftTimeLimitExceeded is raised in the task.",
    ),
    click.option(
        "--max-tasks-per-child",
        type=click.IntRange(min=1),
        help="Replace a prefork child after it ran this many tasks.",
    ),
    click.option(
        "--max-memory-per-child",
        type=click.IntRange(min=0),
        help="Replace a prefork child once a task leaves its resident memory above this many "
        "KiB; the task's outcome is kept (0: no limit).",
    ),
    click.option(
        "--purge", "--discard", "purge", is_flag=True, help="Delete waiting tasks before starting."
    ),
    click.option("-X", "--exclude-queues", help="Comma-separated queues not to consume."),
    click.option("-I", "--include", help="Comma-separated modules to import (their tasks)."),
    click.option("-f", "--logfile", help="Log to this file instead of stderr (%h: host name)."),
    click.option("--pidfile", help="Write the process id here; refuse to start if it is taken."),
    _hidden("--umask"),
    _hidden("--autoscale"),
    _hidden("-D", "--detach", is_flag=True),
    _hidden("-E", "--task-events", "--events", "task_events", is_flag=True),
    _hidden("--without-gossip", is_flag=True),
    _hidden("--without-mingle", is_flag=True),
    _hidden("--without-heartbeat", is_flag=True),
    _hidden("--heartbeat-interval", type=int),
    _hidden("-O", "optimization"),
    _hidden("--disable-prefetch", is_flag=True),
    _hidden("-S", "--statedb"),
    _hidden("-s", "--schedule-filename", "--schedule", "schedule_filename"),
    _hidden("--scheduler"),
    _hidden("--uid"),
    _hidden("--gid"),
    _hidden("--executable"),
]


def celery_worker_options(f: F) -> F:
    """Add every ``celery worker`` flag pgtasks does not define itself to a click command."""
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def node_format(value: str, worker_id: str | None = None) -> str:
    """Celery's ``%h`` (host), ``%n`` (name), ``%d`` (domain), ``%i``/``%I`` (process index)
    in file names."""
    host = socket.gethostname()
    name, _, domain = host.partition(".")
    if worker_id:
        name = worker_id
    out = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "%" and i + 1 < len(value):
            key = value[i + 1]
            replaced = {"h": host, "n": name, "d": domain, "i": "0", "I": "", "%": "%"}.get(key)
            if replaced is not None:
                out.append(replaced)
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class CeleryWorkerFlags:
    """The values of those flags for one ``pgtasks worker`` run."""

    def __init__(self, **values: Any) -> None:
        self.values = values
        if values.get("detach"):
            raise click.UsageError(
                "-D/--detach is not supported: run the worker in the foreground under a process "
                "supervisor (systemd, supervisord, Kubernetes, Docker)"
            )
        self.autoscale_max: int | None = None
        if values.get("autoscale"):
            try:
                self.autoscale_max = max(int(v) for v in _split(values["autoscale"]))
            except ValueError:
                raise click.BadParameter(
                    "expected MAX,MIN (two integers)", param_hint="--autoscale"
                ) from None

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def log_stream(self, worker_id: str | None) -> TextIO | None:
        """The ``--logfile`` stream (appended, line-buffered), or None for stderr."""
        path = self.values.get("logfile")
        if not path:
            return None
        try:
            return open(node_format(path, worker_id), "a", buffering=1, encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="-f/--logfile") from None

    def concurrency(self, given: int | None) -> int | None:
        return given or self.autoscale_max

    def queues(self, given: list[str] | None, default_queue: str) -> list[str] | None:
        """The queues to consume once ``-X`` is applied (None: the default queue)."""
        excluded = set(_split(self.values.get("exclude_queues")))
        if not excluded:
            return given
        remaining = [q for q in (given or [default_queue]) if q not in excluded]
        if not remaining:
            raise click.UsageError("-X/--exclude-queues leaves no queue to consume")
        return remaining

    def worker_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Worker``."""
        return {
            "time_limit": self.values.get("time_limit"),
            "soft_time_limit": self.values.get("soft_time_limit"),
            "max_tasks_per_child": self.values.get("max_tasks_per_child"),
            "max_memory_per_child": self.values.get("max_memory_per_child"),
        }

    @contextlib.contextmanager
    def session(
        self, app: Any, queues: list[str] | None, migrate: bool, worker_id: str | None
    ) -> Iterator[None]:
        """Everything the flags do around the worker's run: umask, includes, pidfile, purge."""
        umask = self.values.get("umask")
        if umask:
            try:
                os.umask(int(str(umask), 8))
            except ValueError:
                raise click.BadParameter("expected an octal number", param_hint="--umask") from None
        for module in _split(self.values.get("include")):
            importlib.import_module(module)
        ignored = [text for name, text in _WARN_IGNORED.items() if self.values.get(name)]
        if ignored:
            log.warning("worker.flags_ignored", flags=ignored)
        pidfile = self.values.get("pidfile")
        path = node_format(pidfile, worker_id) if pidfile else None
        if path:
            create_pidfile(path)
        try:
            if self.values.get("purge"):
                self._purge(app, queues, migrate)
            yield
        finally:
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    @staticmethod
    def _purge(app: Any, queues: list[str] | None, migrate: bool) -> None:
        if migrate:
            from pgtasks import migrate as migrations

            migrations.migrate(app.database_url, app.settings.schema_name)
        names = queues or [app.settings.default_queue]
        count = app.broker.purge(names)
        if count:
            noun = "message" if count == 1 else "messages"
            click.echo(f"purge: Erased {count} {noun} from the queue.")
        log.info("worker.purged", queues=names, count=count)


def create_pidfile(path: str) -> None:
    """Write our pid to ``path``; a stale file (its process gone) is replaced, a live one
    refuses the start, as Celery does."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pid = _read_pid(path)
            if pid is not None and pid != os.getpid() and _alive(pid):
                raise click.ClickException(
                    f"pidfile ({path}) already exists. Seems we're already running? (pid: {pid})"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="--pidfile") from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return
    raise click.ClickException(f"cannot create pidfile {path}")


def _read_pid(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip() or "0") or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
