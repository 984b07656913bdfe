"""``worker``, ``migrate``, ``grants`` and ``purge``."""

from __future__ import annotations

from typing import Any

import click

from pgtasks import logging as pglogging
from pgtasks.cli.main import cli, get_app
from pgtasks.cli.worker_flags import CeleryWorkerFlags, celery_worker_options, node_format


def _queues(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [q.strip() for q in value.split(",") if q.strip()]


@cli.command()
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    help="Tasks run at once (default: CPUs; 100 on the asyncio pool).",
)
@click.option("-Q", "--queues", help="Comma-separated queues to consume (default: celery).")
@click.option(
    "-P",
    "--pool",
    type=click.Choice(["prefork", "threads", "solo", "asyncio"]),
    default="prefork",
    show_default=True,
    help="How tasks run: child processes, threads, inline, or async def tasks interleaved on "
    "one event loop.",
)
@click.option(
    "-l", "--loglevel", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR."
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    help="Log format (default: console on a terminal, else json).",
)
@click.option("-n", "--hostname", "worker_id", help="Worker id (default: host-pid-random).")
@click.option("--lease", type=click.FloatRange(min=1), help="Lease seconds (default 30).")
@click.option(
    "--poll-interval", type=click.FloatRange(min=0.01), help="Seconds between polls (default 0.5)."
)
@click.option("--poll-only", is_flag=True, help="No LISTEN/NOTIFY (PgBouncer transaction pooling).")
@click.option("--migrate", is_flag=True, help="Create or update the schema before starting.")
@click.option("--burst", is_flag=True, help="Exit once its queues hold no waiting or running task.")
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    help="Seconds to finish running tasks on SIGTERM.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    help="Serve Prometheus metrics on this port (needs the metrics extra).",
)
@click.option(
    "-B",
    "--beat",
    is_flag=True,
    help="Also schedule periodic tasks (beat_schedule); safe on every worker at once.",
)
@click.option(
    "--prefetch-multiplier",
    type=click.IntRange(min=1),
    help="Claim up to this many tasks per slot (default 1: never more than free slots).",
)
@celery_worker_options
@click.pass_context
def worker(
    ctx: click.Context,
    /,
    concurrency: int | None,
    queues: str | None,
    pool: str,
    loglevel: str,
    log_format: str | None,
    worker_id: str | None,
    lease: float | None,
    poll_interval: float | None,
    poll_only: bool,
    migrate: bool,
    burst: bool,
    shutdown_grace: float | None,
    prefetch_multiplier: int | None,
    beat: bool,
    metrics_port: int | None,
    **celery_flags: Any,
) -> None:
    """Claim and run tasks until stopped (SIGTERM: finish running tasks; again: stop now).

    \b
    Examples:
      pgtasks -A proj worker -l INFO
      pgtasks -A proj worker -c 8 -P threads -Q celery,io
      pgtasks -A proj worker -B          # and run beat_schedule (on any number of hosts)
    """
    from pgtasks.worker import Worker

    flags = CeleryWorkerFlags(**celery_flags)
    if worker_id:
        # As Celery expands its node names: -n worker1@%h is worker1@<host name>.
        worker_id = node_format(worker_id)
    # The app module is imported first, as in Celery: its setup_logging receivers decide.
    app = get_app(ctx)
    try:
        pglogging.setup(loglevel, log_format, stream=flags.log_stream(worker_id))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-l/--loglevel") from None
    consumed = flags.queues(_queues(queues), app.settings.default_queue)
    with flags.session(app, consumed, migrate, worker_id):
        Worker(
            app,
            queues=consumed,
            concurrency=flags.concurrency(concurrency),
            pool=pool,
            worker_id=worker_id,
            lease=lease,
            poll_interval=poll_interval,
            listen=False if poll_only else None,
            migrate=migrate,
            burst=burst,
            shutdown_grace=shutdown_grace,
            prefetch_multiplier=prefetch_multiplier,
            beat=beat,
            metrics_port=metrics_port,
            freeze_gc=True,
            **flags.worker_options(),
        ).run()


@cli.command()
@click.option("--schema", help="Schema name (default: the app's, or pgtasks).")
@click.pass_context
def migrate(ctx: click.Context, schema: str | None) -> None:
    """Create or update the pgtasks schema (safe to run from many hosts at once)."""
    from pgtasks import migrate as migrations

    app = get_app(ctx, required=False)
    name = schema or app.settings.schema_name
    applied = migrations.migrate(
        app.database_url,
        name,
        progress=lambda m: click.echo(f"applying {m.version:04d}_{m.name} ...", err=True),
    )
    if applied:
        click.echo(f"schema {name!r} is now at version {applied[-1].version}")
    else:
        click.echo(f"schema {name!r} is up to date (version {migrations.latest()})")


@cli.command()
@click.option(
    "--producer",
    "producers",
    multiple=True,
    metavar="ROLE",
    help="Role that may enqueue and read states and results (repeatable).",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    metavar="ROLE",
    help="Role that may run workers and the scheduler (repeatable).",
)
@click.option("--admin", metavar="ROLE", help="Role to own the schema and every table in it.")
@click.option("--queues", metavar="Q1,Q2", help="Producers may enqueue only to these queues.")
@click.option(
    "--tasks",
    "task_names",
    metavar="NAMES",
    help="Producers may enqueue only these task names (comma-separated; proj.* allows a prefix).",
)
@click.option(
    "--max-priority",
    type=click.IntRange(0, 2**31 - 1),
    default=255,
    show_default=True,
    help="Producers' tasks have a priority from 0 to this.",
)
@click.option(
    "--max-payload-bytes",
    type=click.IntRange(1),
    default=10 * 1024 * 1024,
    show_default=True,
    help="Producers' tasks carry at most this many bytes of arguments (and of headers).",
)
@click.option("--schema", help="Schema name (default: the app's, or pgtasks).")
@click.option("--dry-run", is_flag=True, help="Print the statements instead of running them.")
@click.pass_context
def grants(
    ctx: click.Context,
    /,
    producers: tuple[str, ...],
    workers: tuple[str, ...],
    admin: str | None,
    queues: str | None,
    task_names: str | None,
    max_priority: int,
    max_payload_bytes: int,
    schema: str | None,
    dry_run: bool,
) -> None:
    """Give existing database roles the rights of producers, workers and an admin.

    \b
    producer  enqueue waiting tasks of its own (optionally only to --queues
              and --tasks), and read those tasks and their results; nothing
              else, not even through a link, chain or chord
    worker    claim, finish, retry, reclaim, enqueue follow-ups, run beat,
              prune finished rows; never purge, requeue or discard
    admin     owns the schema: migrate, purge, requeue, discard

    Row-level security enforces the limits; once it is on, a role given
    nothing here sees no task. Run as the schema's owner or a superuser; run
    it again after an upgrade, or to change a role's queues or task names.

    \b
    Examples:
      pgtasks grants --admin queue_admin --worker queue_worker --producer web
      pgtasks grants --producer reports --queues reports --tasks 'reports.*'
      pgtasks grants --producer web --dry-run
    """
    from pgtasks import grants as grants_

    if not (producers or workers or admin):
        raise click.UsageError("name at least one role: --producer, --worker or --admin")
    app = get_app(ctx, required=False)
    name = schema or app.settings.schema_name
    roles = grants_.Roles(
        producers=producers,
        workers=workers,
        admins=[admin] if admin else [],
        queues=_queues(queues),
        task_names=_queues(task_names),
        max_priority=max_priority,
        max_payload_bytes=max_payload_bytes,
    )
    if dry_run:
        for statement in grants_.statements(name, roles):
            click.echo(f"{statement.as_string(None)};")
        return
    try:
        done = grants_.apply(app.database_url, name, roles)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"schema {name!r}: {len(done)} statements applied")


@cli.command()
@click.option("-Q", "--queues", help="Only these comma-separated queues.")
@click.option("-X", "--exclude-queues", help="All queues but these comma-separated ones.")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def purge(ctx: click.Context, queues: str | None, exclude_queues: str | None, force: bool) -> None:
    """Delete every waiting task (running ones are left alone)."""
    app = get_app(ctx, required=False)
    names = _queues(queues)
    where = f"queues {queues}" if queues else "all queues"
    if exclude_queues:
        excluded = set(_queues(exclude_queues) or ())
        known = names or sorted({row["queue"] for row in app.broker.counts()})
        names = [q for q in known if q not in excluded]
        where = f"{where} except {exclude_queues}"
    # An exclusion can leave nothing to purge: an empty list must not mean "every queue".
    if names is not None and not names:
        click.echo(f"Purged 0 messages from {where}.")
        return
    until = None
    if not force:
        waiting, until = app.broker.count_waiting(names)
        if not waiting:
            click.echo(f"No waiting tasks in {where}.")
            return
        tasks = "waiting task" if waiting == 1 else "waiting tasks"
        click.confirm(f"Delete {waiting:,} {tasks} in {where}? This cannot be undone", abort=True)
    # Only what was counted: tasks enqueued while the question waited stay.
    count = app.broker.purge(names, until)
    click.echo(f"Purged {count} {'message' if count == 1 else 'messages'} from {where}.")
