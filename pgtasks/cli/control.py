"""``status``, ``inspect``, ``call`` and ``result``: Celery's command shapes, answered from the
database instead of by broadcasting to workers.

A worker is *online* when its heartbeat (written with every lease renewal, each lease/3 seconds)
is newer than one lease (``lease_seconds``): past that, other workers reclaim its tasks too.
Output follows Celery's: ``->  <node>: OK`` per worker, its reply indented below, then
``N nodes online.``; ``-j/--json`` prints the replies as one JSON object. With no worker online
the commands print ``Error: No nodes replied within time constraint`` on stderr and exit with
69 (``EX_UNAVAILABLE``), as Celery does.
"""

from __future__ import annotations

import contextlib
import json
import textwrap
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

from pgtasks.cli.main import cli, get_app

#: ``sysexits.h`` EX_UNAVAILABLE, Celery's exit code when no worker replies.
EX_UNAVAILABLE = 69


class NoReplies(click.ClickException):
    """No worker replied: ``Error: No nodes replied within time constraint`` on stderr and
    exit status 69, as Celery's command line says it."""

    exit_code = EX_UNAVAILABLE

    def __init__(self) -> None:
        super().__init__("No nodes replied within time constraint")


Replies = dict[str, Any]


def _comma_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _control_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Celery's remote-control options. The timeout has nothing to wait for here: the answer
    comes from one query."""
    f = click.option("-j", "--json", "as_json", is_flag=True, help="Print the replies as JSON.")(f)
    f = click.option(
        "-d", "--destination", help="Comma-separated worker ids to ask (default: all)."
    )(f)
    f = click.option("-t", "--timeout", type=float, default=1.0, hidden=True)(f)
    return f


def _online(app: Any, destination: str | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = app.broker.live_workers(app.settings.lease_seconds)
    wanted = _comma_list(destination)
    if wanted:
        rows = [r for r in rows if r["id"] in wanted]
    return rows


def _pretty(reply: Any) -> str:
    """A reply as Celery's command line shows it."""
    if isinstance(reply, list):
        if not reply:
            return "- empty -"
        return "\n".join(f"* {item}" for item in reply)
    if isinstance(reply, dict):
        if "ok" in reply:
            return textwrap.indent(_pretty(reply["ok"]), "    ")
        return json.dumps(reply, sort_keys=True, indent=4, default=str)
    return str(reply)


def _say(replies: Replies, as_json: bool, show_body: bool) -> None:
    quiet = bool((click.get_current_context().obj or {}).get("quiet"))
    if not replies:
        raise NoReplies()
    if as_json:
        click.echo(json.dumps(replies, default=str))
    else:
        for node, reply in replies.items():
            click.echo(f"->  {node}: OK")
            if show_body:
                click.echo(textwrap.indent(_pretty(reply), "    "))
    count = len(replies)
    if not quiet:
        click.echo(f"\n{count} {'node' if count == 1 else 'nodes'} online.")


# -- status -----------------------------------------------------------------------------------


@cli.command()
@_control_options
@click.pass_context
def status(ctx: click.Context, timeout: float, destination: str | None, as_json: bool) -> None:
    """Show the workers that are online (heartbeat within one lease).

    \b
    Examples:
      pgtasks -A proj status
      pgtasks -A proj status -j
    """
    app = get_app(ctx, required=False)
    replies = {w["id"]: {"ok": "pong"} for w in _online(app, destination)}
    _say(replies, as_json, show_body=False)


# -- inspect ----------------------------------------------------------------------------------


def _body(row: dict[str, Any]) -> tuple[Any, Any]:
    """The args and kwargs of a row, as far as they can be read without the task's code."""
    if row.get("content_type") == "application/json" and row.get("payload"):
        try:
            body = json.loads(row["payload"])
            if isinstance(body, list) and len(body) >= 2:
                return body[0], body[1]
        except ValueError:
            pass
    return "?", "?"


def _request(row: dict[str, Any], worker: dict[str, Any] | None) -> dict[str, Any]:
    """A row in the shape of Celery's request info (``inspect active``): the same keys.
    Arguments are shown as the call's argsrepr/kwargsrepr (redacted where the task says
    so), as Celery shows them only with ``safe``: this command reads every task's row
    from the database, and a secret in an argument should not reach it."""
    headers = row.get("headers") or {}
    args, kwargs = _body(row)
    if "argsrepr" in headers:
        args, kwargs = headers["argsrepr"], headers.get("kwargsrepr", kwargs)
    return {
        "id": row["id"],
        "name": row["name"],
        "args": args,
        "kwargs": kwargs,
        "type": row["name"],
        "hostname": row.get("claimed_by"),
        "time_start": _epoch(row.get("updated_at")),
        "acknowledged": True,
        "delivery_info": {
            "exchange": "",
            "routing_key": row["queue"],
            "priority": row["priority"],
            "redelivered": row.get("attempt", 1) > 1,
        },
        "worker_pid": worker["pid"] if worker else None,
    }


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _by_worker(
    workers: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    known = {w["id"]: w for w in workers}
    out: dict[str, list[dict[str, Any]]] = {w["id"]: [] for w in workers}
    for row in rows:
        owner = row.get("claimed_by")
        if owner in out:
            out[owner].append(_request(row, known[owner]))
    return out


def _active(app: Any, workers: list[dict[str, Any]]) -> Replies:
    return dict(_by_worker(workers, app.broker.running_tasks()))


def _scheduled(app: Any, workers: list[dict[str, Any]]) -> Replies:
    """Not-yet-due rows belong to no worker until claimed: each worker lists those of the
    queues it consumes, as Celery's workers list the eta tasks they hold."""
    rows = app.broker.scheduled_tasks()
    replies: Replies = {}
    for w in workers:
        queues = set(w["queues"])
        replies[w["id"]] = [
            {
                "eta": r["run_at"].astimezone(timezone.utc).isoformat(),
                "priority": r["priority"],
                "request": {**_request({**r, "claimed_by": None}, None), "hostname": w["id"]},
            }
            for r in rows
            if r["queue"] in queues
        ]
    return replies


#: The task attributes ``inspect registered`` shows beside a name, as Celery's does.
TASK_INFO_ITEMS = ("exchange", "routing_key", "rate_limit")


def _registered(app: Any, workers: list[dict[str, Any]]) -> Replies:
    """Each worker's task names, without the built-in ``celery.*`` ones, each with the
    attributes of TASK_INFO_ITEMS that it sets in this app (``proj.add [rate_limit=5/s]``),
    as Celery lists them (the app's task modules are imported as a worker imports them)."""
    # A module that fails to import here still leaves the names worth showing.
    with contextlib.suppress(Exception):
        app.import_includes()

    def shown(name: str) -> str:
        task = app.tasks.get(name)
        fields = [
            f"{field}={value}"
            for field in TASK_INFO_ITEMS
            if (value := getattr(task, field, None)) is not None
        ]
        return f"{name} [{' '.join(fields)}]" if fields else name

    return {
        w["id"]: [shown(n) for n in sorted(w.get("tasks") or []) if not n.startswith("celery.")]
        for w in workers
    }


def _active_queues(app: Any, workers: list[dict[str, Any]]) -> Replies:
    return {
        w["id"]: [
            {"name": q, "exchange": {"name": q, "type": "direct"}, "routing_key": q}
            for q in w["queues"]
        ]
        for w in workers
    }


def _revoked(app: Any, workers: list[dict[str, Any]]) -> Replies:
    """Revokes live in the database, so every worker knows all of them."""
    ids = app.broker.revoked_ids()
    return {w["id"]: list(ids) for w in workers}


def _ping(app: Any, workers: list[dict[str, Any]]) -> Replies:
    return {w["id"]: {"ok": "pong"} for w in workers}


def _stats(app: Any, workers: list[dict[str, Any]]) -> Replies:
    totals: dict[str, dict[str, int]] = {}
    for row in app.broker.worker_totals([w["id"] for w in workers]):
        totals.setdefault(row["worker"], {})[row["name"]] = int(row["n"])
    running: dict[str, int] = {}
    for row in app.broker.running_tasks():
        running[row["claimed_by"]] = running.get(row["claimed_by"], 0) + 1
    return {
        w["id"]: {
            "pid": w["pid"],
            "hostname": w["host"],
            "uptime": int(w["uptime"]),
            "total": totals.get(w["id"], {}),
            "pool": {"max-concurrency": w["concurrency"], "running": running.get(w["id"], 0)},
            "queues": list(w["queues"]),
            "heartbeat": w["heartbeat_at"].astimezone(timezone.utc).isoformat(),
            "broker": {"transport": "postgresql", "schema": app.settings.schema_name},
            "prefetch_count": w["concurrency"],
        }
        for w in workers
    }


#: ``inspect`` actions: reserved rows are RUNNING too (a claim marks the row RUNNING before
#: the task starts), so ``reserved`` lists the same rows as ``active``.
ACTIONS: dict[str, Callable[[Any, list[dict[str, Any]]], Replies]] = {
    "active": _active,
    "active_queues": _active_queues,
    "ping": _ping,
    "registered": _registered,
    "reserved": _active,
    "revoked": _revoked,
    "scheduled": _scheduled,
    "stats": _stats,
}


@cli.command()
@click.argument("action", type=click.Choice(sorted(ACTIONS)))
@_control_options
@click.pass_context
def inspect(
    ctx: click.Context, action: str, timeout: float, destination: str | None, as_json: bool
) -> None:
    """Inspect the online workers: what they run, hold scheduled, and know.

    \b
    Examples:
      pgtasks -A proj inspect active
      pgtasks -A proj inspect registered -d worker-1
    """
    app = get_app(ctx, required=False)
    workers = _online(app, destination)
    replies = ACTIONS[action](app, workers) if workers else {}
    _say(replies, as_json, show_body=True)


# -- call -------------------------------------------------------------------------------------


def _json(kind: type, what: str) -> Callable[[click.Context, click.Parameter, str], Any]:
    def convert(ctx: click.Context, param: click.Parameter, value: str) -> Any:
        try:
            loaded = json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(f"{value!r} is not valid JSON: {exc}") from None
        if not isinstance(loaded, kind):
            raise click.BadParameter(f"{value!r} is not a JSON {what}")
        return loaded

    return convert


def _eta(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 date and time") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _expires(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return _eta(ctx, param, value)


@cli.command()
@click.argument("name")
@click.option("-a", "--args", default="[]", callback=_json(list, "array"), help="JSON array.")
@click.option("-k", "--kwargs", default="{}", callback=_json(dict, "object"), help="JSON object.")
@click.option("--eta", callback=_eta, help="ISO 8601 time to run at (UTC when naive).")
@click.option("--countdown", type=float, help="Seconds from now to run at.")
@click.option("--expires", callback=_expires, help="Seconds or ISO 8601 time.")
@click.option("--serializer", default="json", show_default=True, help="Payload serializer.")
@click.option("--queue", help="Queue (default: routes, then the default queue).")
@click.option("--priority", type=int, help="Higher runs first.")
@click.option("--exchange", hidden=True)
@click.option("--routing-key", hidden=True)
@click.pass_context
def call(
    ctx: click.Context,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    eta: datetime | None,
    countdown: float | None,
    expires: datetime | float | None,
    serializer: str,
    queue: str | None,
    priority: int | None,
    exchange: str | None,
    routing_key: str | None,
) -> None:
    """Enqueue a task by name and print its id.

    \b
    Examples:
      pgtasks -A proj call tasks.add --args '[2, 2]'
      pgtasks call tasks.report --kwargs '{"day": "mon"}' --countdown 60 --queue io
    """
    if eta is not None and countdown is not None:
        raise click.UsageError("give --eta or --countdown, not both")
    app = get_app(ctx, required=False)
    try:
        result = app.send_task(
            name,
            args,
            kwargs,
            eta=eta,
            countdown=countdown,
            expires=expires,
            serializer=serializer,
            queue=queue or routing_key,
            priority=priority,
        )
    except (TypeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.id)


# -- result -----------------------------------------------------------------------------------


@cli.command()
@click.argument("task_id")
@click.option("-t", "--task", hidden=True)
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the traceback instead.")
@click.pass_context
def result(ctx: click.Context, task_id: str, task: str | None, show_traceback: bool) -> None:
    """Wait for a task's result and print it (exit 1 if the task failed).

    \b
    Examples:
      pgtasks -A proj result 6f1d0c4e-...
      pgtasks result 6f1d0c4e-... --traceback
    """
    app = get_app(ctx, required=False)
    res = app.AsyncResult(task_id)
    if show_traceback:
        click.echo(res.traceback)
        return
    try:
        value = res.get()
    except Exception as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    click.echo(value)
