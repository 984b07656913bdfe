"""``worker``, ``migrate`` and ``purge``."""

from __future__ import annotations

import click

from pgtasks import logging as pglogging
from pgtasks.cli.main import cli, get_app


def _queues(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [q.strip() for q in value.split(",") if q.strip()]


@cli.command()
@click.option(
    "-c", "--concurrency", type=click.IntRange(min=1), help="Tasks run at once (default: CPUs)."
)
@click.option("-Q", "--queues", help="Comma-separated queues to consume (default: celery).")
@click.option(
    "-P",
    "--pool",
    type=click.Choice(["prefork", "threads", "solo"]),
    default="prefork",
    show_default=True,
    help="How tasks run: child processes, threads, or inline.",
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
@click.option("--without-gossip", is_flag=True, hidden=True)
@click.option("--without-mingle", is_flag=True, hidden=True)
@click.option("--without-heartbeat", is_flag=True, hidden=True)
@click.option("-O", "optimization", hidden=True)
@click.option(
    "--prefetch-multiplier",
    type=click.IntRange(min=1),
    help="Claim up to this many tasks per slot (default 1: never more than free slots).",
)
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
    **_ignored: object,
) -> None:
    """Claim and run tasks until stopped (SIGTERM: finish running tasks; again: stop now).

    \b
    Examples:
      pgtasks -A proj worker -l INFO
      pgtasks -A proj worker -c 8 -P threads -Q celery,io
    """
    from pgtasks.worker import Worker

    try:
        pglogging.setup(loglevel, log_format)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-l/--loglevel") from None
    app = get_app(ctx)
    Worker(
        app,
        queues=_queues(queues),
        concurrency=concurrency,
        pool=pool,
        worker_id=worker_id,
        lease=lease,
        poll_interval=poll_interval,
        listen=False if poll_only else None,
        migrate=migrate,
        burst=burst,
        shutdown_grace=shutdown_grace,
        prefetch_multiplier=prefetch_multiplier,
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
@click.option("-Q", "--queues", help="Only these comma-separated queues.")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def purge(ctx: click.Context, queues: str | None, force: bool) -> None:
    """Delete every waiting task (running ones are left alone)."""
    app = get_app(ctx, required=False)
    where = f"queues {queues}" if queues else "all queues"
    if not force:
        click.confirm(f"Delete all waiting tasks in {where}? This cannot be undone", abort=True)
    count = app.broker.purge(_queues(queues))
    click.echo(f"Purged {count} {'message' if count == 1 else 'messages'} from {where}.")
