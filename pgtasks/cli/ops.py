"""``queues``, ``dlq``, ``health`` and ``quota``: what an operator asks of the queue, answered
by a few statements on the task table (see the "operators" section of :mod:`pgtasks.broker`)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click
import psycopg

from pgtasks.cli.main import cli, get_app
from pgtasks.exceptions import ImproperlyConfigured, PgTasksError
from pgtasks.utils.humanize import duration


def _comma_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return str(value)


def _dump(value: Any) -> str:
    return json.dumps(value, default=_jsonable)


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; the ``right`` ones (numbers) aligned right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# -- queues -----------------------------------------------------------------------------------

_ZERO = {
    "pending_due": 0,
    "scheduled": 0,
    "blocked": 0,
    "running": 0,
    "expired_leases": 0,
    "dead": 0,
    "completed": 0,
    "failed": 0,
    "cancelled": 0,
    "oldest_due_age": None,
    "finished_attempts": 0,
    "throughput": 0.0,
}


@cli.command()
@click.option("-Q", "--queues", help="Only these comma-separated queues.")
@click.option(
    "--window",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds over which throughput and recently finished rows are counted.",
)
@click.option("-j", "--json", "as_json", is_flag=True, help="Print one JSON object by queue.")
@click.pass_context
def queues(ctx: click.Context, queues: str | None, window: float, as_json: bool) -> None:
    """Show what each queue holds and how fast it drains.

    Per queue: tasks due now, scheduled for later (eta, countdown, retry backoff), blocked
    by a concurrency limit (shown when any is), running,
    dead-lettered, how long the oldest due task has waited, leases that expired (their worker
    died or lost the database; a worker's reclaimer takes them back), and attempts finished
    per minute over the window.

    \b
    Examples:
      pgtasks -A proj queues
      pgtasks queues -Q celery,io --json | jq '.io.pending_due'
    """
    app = get_app(ctx, required=False)
    wanted = _comma_list(queues)
    rows = {r["queue"]: r for r in app.broker.queue_stats(window, wanted)}
    for name in wanted or ():
        rows.setdefault(name, {"queue": name, **_ZERO})
    ordered = [rows[name] for name in sorted(rows)]
    if as_json:
        click.echo(
            _dump({r["queue"]: {k: v for k, v in r.items() if k != "queue"} for r in ordered})
        )
        return
    if not ordered:
        click.echo("No tasks in any queue.")
        return
    blocked = any(r["blocked"] for r in ordered)
    headers = ["QUEUE", "DUE", "SCHEDULED", *(["BLOCKED"] if blocked else []), "RUNNING"]
    headers += ["DEAD", "OLDEST DUE", "EXPIRED LEASES", "DONE/MIN"]
    table = [
        [
            r["queue"],
            str(r["pending_due"]),
            str(r["scheduled"]),
            *([str(r["blocked"])] if blocked else []),
            str(r["running"]),
            str(r["dead"]),
            duration(r["oldest_due_age"]),
            str(r["expired_leases"]),
            f"{r['throughput']:.1f}",
        ]
        for r in ordered
    ]
    click.echo(_table(headers, table, right=set(range(1, len(headers)))))


# -- dlq --------------------------------------------------------------------------------------


@cli.group()
def dlq() -> None:
    """Dead letters: list, show, requeue or discard tasks that could not succeed.

    A task is dead-lettered (status DEAD) when it used up max_retries, when its payload cannot be
    decoded, or when it lost max_lost_attempts workers; its payload, last error and traceback are
    kept. Requeue puts it back in its queue, due now, with a fresh retry and lost-worker budget
    and its attempt history kept; discard deletes it.

    \b
    Examples:
      pgtasks -A proj dlq list --task proj.tasks.fetch
      pgtasks dlq show 6f1d0c4e-...
      pgtasks dlq requeue 6f1d0c4e-... 0b9e77aa-...
      pgtasks dlq discard --all --task proj.tasks.fetch -Q io
    """


@dlq.command("list")
@click.option("--task", "task_name", metavar="NAME", help="Only dead letters of this task.")
@click.option("-Q", "--queue", help="Only dead letters of this queue.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Rows to show."
)
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Rows to skip first.")
@click.option("-j", "--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.pass_context
def dlq_list(
    ctx: click.Context,
    task_name: str | None,
    queue: str | None,
    limit: int,
    offset: int,
    as_json: bool,
) -> None:
    """List dead letters, most recently dead-lettered first.

    \b
    Examples:
      pgtasks -A proj dlq list
      pgtasks dlq list --task proj.tasks.fetch -Q io --limit 200 --json
    """
    app = get_app(ctx, required=False)
    rows = app.broker.dead_letters(limit, offset, task_name=task_name, queue=queue)
    if as_json:
        for row in rows:
            click.echo(_dump(row))
        return
    if not rows:
        click.echo("No dead letters.")
        return
    table = [
        [
            r["id"],
            r["name"],
            r["queue"],
            str(r["attempt"]),
            str(r["retries"]),
            r["updated_at"].isoformat(timespec="seconds"),
            (r["error"] or "").splitlines()[0][:80] if r["error"] else "",
        ]
        for r in rows
    ]
    headers = ["ID", "TASK", "QUEUE", "ATTEMPT", "RETRIES", "DEAD SINCE", "ERROR"]
    click.echo(_table(headers, table, right={3, 4}))


@dlq.command("show")
@click.argument("task_id")
@click.option("-j", "--json", "as_json", is_flag=True, help="Print the row as JSON.")
@click.pass_context
def dlq_show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show one dead letter: its row, payload, error, traceback and attempt history.

    \b
    Examples:
      pgtasks -A proj dlq show 6f1d0c4e-...
      pgtasks dlq show 6f1d0c4e-... --json | jq .attempts
    """
    app = get_app(ctx, required=False)
    row = app.broker.dead_letter(task_id)
    if row is None:
        raise click.ClickException(f"no dead letter with id {task_id!r}")
    if as_json:
        click.echo(_dump(row))
        return
    shown = ["id", "name", "queue", "priority", "attempt", "retries", "max_retries"]
    shown += ["created_at", "updated_at", "result_state", "payload", "error"]
    width = max(len(k) for k in shown)
    for key in shown:
        value = row.get(key)
        if key == "payload" and value is None and row.get("payload_raw_bytes") is not None:
            value = f"<{row['payload_raw_bytes']} bytes of {row['content_type']}>"
        click.echo(f"{key.ljust(width)}  {'-' if value is None else value}")
    if row.get("traceback"):
        click.echo("\ntraceback:")
        click.echo(row["traceback"].rstrip())
    click.echo("\nattempts:")
    if not row["attempts"]:
        click.echo("  none recorded")
    for a in row["attempts"]:
        when = a["finished_at"].isoformat(timespec="seconds")
        error = f"  {a['error'].splitlines()[0]}" if a["error"] else ""
        click.echo(f"  {a['attempt']:>3}  {when}  {a['outcome']:<9} {a['worker']}{error}")


def _where(task_name: str | None, queue: str | None) -> str:
    """The filter in words: " of task proj.add in queue io", or "" for none."""
    task = f" of task {task_name}" if task_name else ""
    return task + (f" in queue {queue}" if queue else "")


#: Rows read per statement while the dead letters ``--all`` names are listed.
_LIST_PAGE = 20_000


def _dead_ids(app: Any, task_name: str | None, queue: str | None) -> list[str]:
    """The ids of every dead letter of ``task_name`` and ``queue`` (when given), as they are
    when the first page is read: a row dead-lettered later is newer than that page's newest
    and left out, and a row seen twice (the pages shifted under them) is listed once."""
    ids: dict[str, None] = {}
    until = None
    offset = 0
    while True:
        rows = app.broker.dead_letters(_LIST_PAGE, offset, task_name=task_name, queue=queue)
        for row in rows:
            until = row["updated_at"] if until is None else until
            if row["updated_at"] <= until:
                ids.setdefault(row["id"])
        if len(rows) < _LIST_PAGE:
            return list(ids)
        offset += _LIST_PAGE


def _progress(verb: str) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A counter line on stderr while a long operation runs, only on a terminal."""
    if not sys.stderr.isatty():
        return None, lambda: None
    shown = [False]

    def update(total: int) -> None:
        shown[0] = True
        click.echo(f"\r{verb} {total} ...", nl=False, err=True)

    def finish() -> None:
        if shown[0]:
            click.echo("", err=True)

    return update, finish


def _dlq_change(
    ctx: click.Context,
    ids: tuple[str, ...],
    everything: bool,
    task_name: str | None,
    queue: str | None,
    force: bool,
    verb: str,
) -> None:
    """Requeue or discard exactly the dead letters the confirmation names: the given ids, or
    with --all those listed (and counted) before the question is asked; never one that
    became a dead letter after that."""
    if ids and everything:
        raise click.UsageError("give task ids or --all, not both")
    if not ids and not everything:
        raise click.UsageError(
            "give one or more task ids, or --all (with --task and -Q/--queue to narrow it)"
        )
    if ids and queue:
        raise click.UsageError(
            "-Q/--queue narrows --all; list a queue's dead letters with `pgtasks dlq list -Q "
            "QUEUE`, or give --all -Q QUEUE"
        )
    app = get_app(ctx, required=False)
    where = _where(task_name, queue)
    if everything:
        wanted = _dead_ids(app, task_name, queue)
        if not wanted:
            click.echo(f"No dead letters{where}.")
            return
        what = _plural(len(wanted), "dead letter") + where
    else:
        wanted = list(dict.fromkeys(ids))
        what = _plural(len(wanted), "dead letter")
        if task_name:
            what += f" (only those of task {task_name})"
    if not force:
        question = "Requeue" if verb == "requeue" else "Discard"
        suffix = "" if verb == "requeue" else " This cannot be undone."
        click.confirm(f"{question} {what}?{suffix}", abort=True)
    update, finish = _progress("requeued" if verb == "requeue" else "discarded")
    narrow = None if everything else task_name
    try:
        if verb == "requeue":
            by = f"pgtasks-cli@{socket.gethostname()}"
            count = app.broker.requeue_dead(wanted, narrow, by=by, progress=update)
        else:
            count = app.broker.discard_dead(wanted, narrow, progress=update)
    finally:
        finish()
    done = "Requeued" if verb == "requeue" else "Discarded"
    said = f"{done} {_plural(count, 'dead letter')}{where if everything else ''}."
    missed = len(wanted) - count
    if missed:
        counted = "counted" if everything else "given"
        was = "was" if missed == 1 else "were"
        said += f" {missed} of the {len(wanted)} {counted} {was} not a dead letter"
        said += f"{where} any more." if everything else f"{where}."
    click.echo(said)


_selection_options = [
    click.argument("ids", nargs=-1, metavar="[ID]..."),
    click.option(
        "--all",
        "everything",
        is_flag=True,
        help="Every dead letter (of --task and -Q/--queue when given), counted before asking.",
    ),
    click.option("--task", "task_name", metavar="NAME", help="Only dead letters of this task."),
    click.option("-Q", "--queue", help="Only dead letters of this queue (with --all)."),
    click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation."),
]


def _with_selection(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_selection_options):
        f = option(f)
    return f


@dlq.command("requeue")
@_with_selection
@click.pass_context
def dlq_requeue(
    ctx: click.Context,
    ids: tuple[str, ...],
    everything: bool,
    task_name: str | None,
    queue: str | None,
    force: bool,
) -> None:
    """Put dead letters back in their queue, due now, with a fresh budget.

    The retry count starts again at 0 and the task may again lose as many workers as
    max_lost_attempts allows; its attempt history is kept, with a 'requeued' entry. Only tasks
    still dead-lettered change. With --all, the question says how many match; only those are
    requeued, not one dead-lettered while you answer.

    \b
    Examples:
      pgtasks -A proj dlq requeue 6f1d0c4e-... 0b9e77aa-...
      pgtasks dlq requeue --all --task proj.tasks.fetch -Q io
      pgtasks dlq requeue --all --task proj.tasks.fetch -f
    """
    _dlq_change(ctx, ids, everything, task_name, queue, force, "requeue")


@dlq.command("discard")
@_with_selection
@click.pass_context
def dlq_discard(
    ctx: click.Context,
    ids: tuple[str, ...],
    everything: bool,
    task_name: str | None,
    queue: str | None,
    force: bool,
) -> None:
    """Delete dead letters and their stored results (the attempt history stays).

    With --all, the question says how many match; only those are deleted, not one
    dead-lettered while you answer.

    \b
    Examples:
      pgtasks -A proj dlq discard 6f1d0c4e-...
      pgtasks dlq discard --all --task proj.tasks.fetch
      pgtasks dlq discard --all -f
    """
    _dlq_change(ctx, ids, everything, task_name, queue, force, "discard")


# -- health -----------------------------------------------------------------------------------


def _unhealthy(reason: str, as_json: bool = False) -> None:
    """One line (or one JSON object) and exit code 1."""
    if as_json:
        click.echo(_dump({"healthy": False, "reasons": [reason]}))
    else:
        click.echo(f"unhealthy: {reason}")
    raise click.exceptions.Exit(1)


@cli.command()
@click.option(
    "--max-due-age",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Unhealthy when the oldest due task has waited longer.",
)
@click.option(
    "--max-expired-leases",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    metavar="N",
    help="Unhealthy with more leases expired and not yet taken back.",
)
@click.option(
    "--max-dead-per-minute",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="N",
    help="Unhealthy when more tasks were dead-lettered per minute over the last 5 minutes.",
)
@click.option(
    "--require-workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Unhealthy with fewer live workers (heartbeat within one lease).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    metavar="SECONDS",
    help="Seconds to wait for the database connection (default: the app's connect_timeout).",
)
@click.option(
    "-j", "--json", "as_json", is_flag=True, help="Print the verdict and measures as JSON."
)
@click.pass_context
def health(
    ctx: click.Context,
    max_due_age: float,
    max_expired_leases: int,
    max_dead_per_minute: float,
    require_workers: int,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Check the queue's health in one query: exit 0 with "ok: ...", or exit 1 with one line
    "unhealthy: <reason>" (the database cannot be reached, a due task waited too long, too many
    expired leases, dead letters arriving too fast, too few live workers).

    Made for container liveness and readiness probes and for cron or monitoring checks: one
    short connection, one statement, one line of output.

    \b
    Examples:
      pgtasks -A proj health
      pgtasks health --max-due-age 60 --require-workers 1 --timeout 3
    \b
    As a Kubernetes probe:
      readinessProbe:
        exec: {command: [pgtasks, -A, proj, health, --timeout, "3"]}
    """
    try:
        app = get_app(ctx, required=False)
        wait = app.settings.connect_timeout if timeout is None else timeout
        report = app.broker.health_report(300.0, app.settings.lease_seconds, timeout=wait)
    except psycopg.errors.UndefinedTable:
        _unhealthy(
            "the pgtasks schema does not exist in this database; run `pgtasks migrate`", as_json
        )
        return
    except psycopg.OperationalError as exc:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else repr(exc)
        _unhealthy(f"cannot reach the database: {first}", as_json)
        return
    except psycopg.Error as exc:
        _unhealthy(f"database error: {str(exc).strip().splitlines()[0]}", as_json)
        return
    except (PgTasksError, ImproperlyConfigured) as exc:
        _unhealthy(str(exc).strip().splitlines()[0], as_json)
        return
    reasons = []
    age = report["oldest_due_age"]
    if age is not None and age > max_due_age:
        reasons.append(f"oldest due task waited {age:.0f} s (over {max_due_age:g})")
    if report["expired_leases"] > max_expired_leases:
        reasons.append(f"{report['expired_leases']} expired leases (over {max_expired_leases})")
    if report["dead_per_minute"] > max_dead_per_minute:
        reasons.append(
            f"{report['dead_per_minute']:.1f} tasks dead-lettered per minute "
            f"(over {max_dead_per_minute:g})"
        )
    if report["live_workers"] < require_workers:
        reasons.append(f"{report['live_workers']} live workers (need {require_workers})")
    if as_json:
        click.echo(_dump({"healthy": not reasons, "reasons": reasons, **report}))
        raise click.exceptions.Exit(1 if reasons else 0)
    if reasons:
        _unhealthy("; ".join(reasons))
    waited = "nothing due" if age is None else f"oldest due task waited {duration(age)}"
    click.echo(
        f"ok: {waited}, {report['expired_leases']} expired leases, "
        f"{report['dead_per_minute']:.1f} dead letters/min, "
        f"{_plural(report['live_workers'], 'live worker')}"
    )


# -- quota ------------------------------------------------------------------------------------


@cli.group()
def quota() -> None:
    """Bound the waiting tasks of a source, so a runaway loop cannot fill the table.

    A row's source is the task_source setting of the app that enqueued it (PGTASKS_TASK_SOURCE),
    else the database role it connected as. An enqueue that would leave its source with more
    waiting tasks than its quota fails with QuotaExceeded and writes nothing.

    \b
    Examples:
      pgtasks -A proj quota set web 50000
      pgtasks -A proj quota list
      pgtasks -A proj quota clear web
    """


@quota.command("set")
@click.argument("source")
@click.argument("max_pending", metavar="N", type=click.IntRange(min=0))
@click.pass_context
def quota_set(ctx: click.Context, source: str, max_pending: int) -> None:
    """Allow SOURCE at most N waiting tasks."""
    from pgtasks import quotas

    app = get_app(ctx, required=False)
    quotas.set_quota(app.database_url, app.settings.schema_name, source, max_pending)
    click.echo(f"{source} may have at most {max_pending:,} waiting tasks")


@quota.command("clear")
@click.argument("source")
@click.pass_context
def quota_clear(ctx: click.Context, source: str) -> None:
    """Remove SOURCE's quota."""
    from pgtasks import quotas

    app = get_app(ctx, required=False)
    if not quotas.clear_quota(app.database_url, app.settings.schema_name, source):
        raise click.UsageError(f"{source} has no quota")
    click.echo(f"{source} has no quota now")


@quota.command("list")
@click.option("-j", "--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.pass_context
def quota_list(ctx: click.Context, as_json: bool) -> None:
    """Every quota, with its source's waiting tasks now."""
    from pgtasks import quotas

    app = get_app(ctx, required=False)
    found = quotas.quotas(app.database_url, app.settings.schema_name)
    if as_json:
        for q in found:
            click.echo(
                _dump({"source": q.source, "max_pending": q.max_pending, "waiting": q.waiting})
            )
        return
    if not found:
        click.echo("no quotas")
        return
    rows = [[q.source, f"{q.max_pending:,}", f"{q.waiting:,}"] for q in found]
    click.echo(_table(["SOURCE", "QUOTA", "WAITING"], rows, right={1, 2}))
