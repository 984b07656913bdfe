"""``beat``: schedule the app's periodic tasks (``beat_schedule``) in a process of its own.

Every ``celery beat`` flag is accepted. ``--max-interval``, ``-l``, ``-f``/``--logfile``,
``--pidfile`` and ``--umask`` work; ``--detach`` is refused with a pointer to a process
supervisor. The rest have no meaning here (the schedule is kept in code and its state in the
database, there is no schedule file, no scheduler class to choose and no remote control): they
are accepted, hidden from ``--help`` and ignored, and those a user might rely on are named in a
warning at start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click
import psycopg
import structlog

from pgtasks import logging as pglogging
from pgtasks.cli.main import cli, get_app
from pgtasks.cli.worker_flags import create_pidfile, node_format
from pgtasks.utils.signal_relay import SignalRelay

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.scheduler import Scheduler

F = TypeVar("F", bound=Callable[..., Any])

log = structlog.get_logger("pgtasks")

#: Celery flags ignored here that change behaviour under Celery: named in a warning when given.
_WARN_IGNORED = {
    "scheduler": "-S/--scheduler (the schedule is beat_schedule in code, its state in the "
    "database; django_celery_beat's DatabaseScheduler is not supported)",
    "enable_remote_control": "--enable-remote-control (no remote control: check the process)",
    "uid": "--uid (run beat as the right user instead)",
    "gid": "--gid (run beat as the right group instead)",
}

_COLUMNS = (
    ("name", "NAME"),
    ("task", "TASK"),
    ("schedule", "SCHEDULE"),
    ("last_tick", "LAST TICK"),
    ("next_tick", "NEXT TICK"),
    ("missed", "MISSED"),
)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(rows: list[dict[str, Any]]) -> str:
    cells = [[h for _, h in _COLUMNS]]
    for row in rows:
        cells.append([_when(row[k]) if k.endswith("_tick") else str(row[k]) for k, _ in _COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def _as_json(rows: list[dict[str, Any]]) -> str:
    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc).isoformat()
        return str(value)

    return json.dumps(rows, default=default, indent=2)


def _log_stream(path: str | None) -> TextIO | None:
    if not path:
        return None
    try:
        return open(node_format(path), "a", buffering=1, encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(str(exc), param_hint="-f/--logfile") from None


@contextlib.contextmanager
def _pidfile(pidfile: str | None) -> Iterator[None]:
    path = node_format(pidfile) if pidfile else None
    if path:
        create_pidfile(path)
    try:
        yield
    finally:
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _umask(value: str | None) -> None:
    if value:
        try:
            os.umask(int(str(value), 8))
        except ValueError:
            raise click.BadParameter("expected an octal number", param_hint="--umask") from None


@contextlib.contextmanager
def _schema_needed(app: Celery) -> Iterator[None]:
    """A missing schema (or one without the periodic-task tables) as one readable error."""
    try:
        yield
    except psycopg.errors.UndefinedTable:
        raise click.ClickException(
            f"the pgtasks schema {app.settings.schema_name!r} is missing or out of date in this "
            "database: run `pgtasks migrate` (or pass --migrate)"
        ) from None


def _hidden(*decls: str, **kw: Any) -> Callable[[F], F]:
    return click.option(*decls, hidden=True, **kw)


@cli.command(short_help="Enqueue the periodic tasks of beat_schedule at their ticks.")
@click.option(
    "--max-interval",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Longest sleep between two passes, in seconds (default: beat_max_loop_interval, 5).",
)
@click.option(
    "-l", "--loglevel", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR."
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    help="Log format (default: console on a terminal, else json).",
)
@click.option(
    "-f", "--logfile", metavar="FILE", help="Log to this file instead of stderr (%h: host name)."
)
@click.option(
    "--pidfile", metavar="FILE", help="Write the process id here; refuse to start if it is taken."
)
@click.option("--migrate", is_flag=True, help="Create or update the schema before starting.")
@click.option(
    "--list",
    "list_entries",
    is_flag=True,
    help="Print the schedule (last and next tick of each entry) and exit.",
)
@click.option("--json", "as_json", is_flag=True, help="With --list: print it as JSON.")
@_hidden("--detach", is_flag=True)
@_hidden("-s", "--schedule", "schedule_filename")
@_hidden("-S", "--scheduler")
@_hidden("--enable-remote-control/--no-enable-remote-control", default=None)
@_hidden("-n", "--hostname")
@_hidden("--uid")
@_hidden("--gid")
@_hidden("--umask")
@_hidden("--executable")
@click.pass_context
def beat(
    ctx: click.Context,
    /,
    max_interval: float | None,
    loglevel: str,
    log_format: str | None,
    logfile: str | None,
    pidfile: str | None,
    migrate: bool,
    list_entries: bool,
    as_json: bool,
    detach: bool,
    umask: str | None,
    **ignored: Any,
) -> None:
    """Enqueue the periodic tasks of beat_schedule at their ticks until stopped (SIGTERM).

    Any number of beat processes (and workers started with -B) may run at once: each tick is
    enqueued exactly once. The schedule is read from the app; the last tick of each entry is
    kept in the database.

    \b
    Examples:
      pgtasks -A proj beat -l INFO
      pgtasks -A proj beat --max-interval 1 --pidfile /run/beat.pid
      pgtasks -A proj beat --list          # each entry's last and next tick
      pgtasks -A proj beat --list --json
    """
    from pgtasks import migrate as migrations
    from pgtasks.scheduler import Scheduler

    if detach:
        raise click.UsageError(
            "--detach is not supported: run beat in the foreground under a process supervisor "
            "(systemd, supervisord, Kubernetes, Docker)"
        )
    if as_json and not list_entries:
        raise click.UsageError("--json goes with --list")
    _umask(umask)
    app = get_app(ctx)
    scheduler = Scheduler(app, max_interval=max_interval)
    if list_entries:
        if migrate:
            migrations.migrate(app.database_url, app.settings.schema_name)
        with _schema_needed(app):
            rows = scheduler.listing()
        if as_json:
            click.echo(_as_json(rows))
        elif rows:
            click.echo(_table(rows))
        else:
            click.echo("No periodic tasks: beat_schedule is empty.")
        app.close()
        return
    try:
        pglogging.setup(loglevel, log_format, stream=_log_stream(logfile))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-l/--loglevel") from None
    with _pidfile(pidfile), _schema_needed(app):
        unused = [text for name, text in _WARN_IGNORED.items() if ignored.get(name)]
        if unused:
            log.warning("beat.flags_ignored", flags=unused)
        if migrate:
            migrations.migrate(app.database_url, app.settings.schema_name)
        _run(app, scheduler)


def _run(app: Celery, scheduler: Scheduler) -> None:
    stopped = threading.Event()

    def handler(signum: signal.Signals) -> None:
        log.info("beat.stopping", signal=signum.name)
        stopped.set()

    try:
        with SignalRelay(handler, (signal.SIGTERM, signal.SIGINT), name="beat-signals"):
            entries = scheduler.sync()
            if not entries:
                log.warning("beat.empty", hint="beat_schedule has no entries: nothing to enqueue")
            log.info(
                "beat.started",
                entries=[e.name for e in entries],
                max_interval=scheduler.max_interval,
            )
            scheduler.run(stopped)
    finally:
        app.close()
    log.info("beat.shutdown")
