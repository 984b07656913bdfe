"""``bench``: measure pgtasks on the user's own database (see :mod:`pgtasks.cli.bench`)."""

from __future__ import annotations

import json
import os

import click

from pgtasks.cli.main import cli, get_app


def _database_url(ctx: click.Context, given: str | None) -> str:
    """``--database-url``, else ``PGTASKS_DATABASE_URL``, else ``-b`` or the ``-A`` app's."""
    url = given or os.environ.get("PGTASKS_DATABASE_URL")
    if not url and (ctx.obj.get("app_spec") or ctx.obj.get("broker")):
        url = get_app(ctx, required=False).settings.database_url
    if not url:
        raise click.UsageError(
            "no database: pass --database-url URL, set PGTASKS_DATABASE_URL, or name an app with -A"
        )
    return str(url)


@cli.command()
@click.option(
    "--database-url",
    metavar="URL",
    help="Database to measure (default: PGTASKS_DATABASE_URL, else the -A app's).",
)
@click.option(
    "--schema",
    metavar="NAME",
    default="pgtasks_bench",
    show_default=True,
    help="Schema the bench creates, works in and drops; your tasks are never touched.",
)
@click.option(
    "--tasks",
    metavar="N",
    type=click.IntRange(min=1),
    default=20_000,
    show_default=True,
    help="Tasks in the bulk enqueue and the burn-down (a tenth, at least 1000, one by one).",
)
@click.option(
    "--workers",
    metavar="N",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "-c",
    "--concurrency",
    metavar="N",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Task slots per worker.",
)
@click.option(
    "-P",
    "--pool",
    type=click.Choice(["threads", "prefork", "solo", "asyncio"]),
    default="threads",
    show_default=True,
    help="The workers' pool (on asyncio the bench's tasks are async def).",
)
@click.option(
    "--prefetch-multiplier",
    metavar="N",
    type=click.IntRange(min=1),
    help="The workers' --prefetch-multiplier (default: theirs).",
)
@click.option(
    "--latency-samples",
    metavar="N",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="Tasks sent in the latency phase.",
)
@click.option(
    "--rate",
    metavar="PER_S",
    type=click.FloatRange(min=0.1),
    default=50.0,
    show_default=True,
    help="Tasks per second sent in the latency phase.",
)
@click.option(
    "--only",
    metavar="PHASES",
    help="Comma-separated phases to run: enqueue, burn-down, latency, capacity, steady "
    "(default: all but capacity and steady).",
)
@click.option(
    "--capacity-seconds",
    metavar="S",
    type=click.FloatRange(min=0.0, min_open=True),
    default=150.0,
    show_default=True,
    help="How long the capacity phase runs, two windows at least (its rate is that of the "
    "windows after the first minute, once finished rows are pruned as fast as they come).",
)
@click.option(
    "--steady-seconds",
    metavar="S",
    type=click.FloatRange(min=0.0, min_open=True),
    default=300.0,
    show_default=True,
    help="How long the steady phase runs, a window at least.",
)
@click.option(
    "--window-seconds",
    metavar="S",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Length of the capacity and steady phases' windows. Shorter ones allow a run of a "
    "few seconds, to check that the bench runs on a database; such a run warns that its "
    "figures mean little, as each window holds too few tasks.",
)
@click.option(
    "--steady-rate",
    metavar="PER_S",
    type=click.FloatRange(min=1.0),
    help="Offered load of the steady phase (default: 80% of the capacity phase's rate, or of "
    "the burn-down's without it).",
)
@click.option(
    "--steady-retention",
    metavar="S",
    type=click.FloatRange(min=0.0),
    default=60.0,
    show_default=True,
    help="Seconds the steady phase's workers keep finished rows (0: a success deletes its "
    "row as it completes).",
)
@click.option(
    "--hold-snapshot",
    is_flag=True,
    help="Keep a transaction open through the steady phase, as a long report or an idle "
    "session in a transaction would: vacuum cannot remove dead rows meanwhile.",
)
@click.option("-j", "--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--keep", is_flag=True, help="Keep the schema afterwards (to look at the rows).")
@click.option(
    "--force",
    is_flag=True,
    help="Drop and reuse --schema even when it was not created by pgtasks bench.",
)
@click.pass_context
def bench(
    ctx: click.Context,
    /,
    database_url: str | None,
    schema: str,
    tasks: int,
    workers: int,
    concurrency: int,
    pool: str,
    prefetch_multiplier: int | None,
    latency_samples: int,
    rate: float,
    only: str | None,
    capacity_seconds: float,
    steady_seconds: float,
    window_seconds: float,
    steady_rate: float | None,
    steady_retention: float,
    hold_snapshot: bool,
    as_json: bool,
    keep: bool,
    force: bool,
) -> None:
    """Measure pgtasks on your database with no-op tasks.

    \b
    Phases:
      enqueue    delay() one call at a time (a tenth of --tasks, at least
                 1000), then apply_many() in batches of 1000: tasks/s; and
                 how long a single enqueue waits for its commit to reach
                 the disk (synchronous_commit on against off), in ms
      burn-down  --workers worker processes drain --tasks tasks made visible
                 at once, timed from then until every task has finished: tasks/s
      latency    --latency-samples delay() calls at --rate per second on idle
                 workers: p50/p90/p99 from send to task start, in ms, split
                 into the delay() call (its commit) and the start after its
                 return (below zero: a task handed to an idle worker starts
                 as its row commits, before the call's wait for the disk ends)
      capacity   only with --only: what the workers finish while this command
                 enqueues alongside them, keeping the queue topped up to 5,000
                 waiting tasks for --capacity-seconds: tasks/s once the pruning
                 keeps pace (the enqueueing and pruning share the database and
                 this machine, so this is less than the burn-down rate)
      steady     only with --only: enqueue at --steady-rate (by default 80% of
                 the capacity) while the workers process, for --steady-seconds;
                 p50/p99, table sizes and the vacuums and checkpoints that
                 finished, every --window-seconds, workers keeping finished rows
                 --steady-retention seconds, and whether the workers kept up
                 (when they fell behind, it suggests a rate to try)

    Burn-down, capacity and steady also print WAL bytes per task, the workers' CPU
    time per 1,000 tasks and, when the server runs on this host, the server's
    (capacity and steady also this command's own, which is the enqueueing's).

    Everything happens in its own schema (--schema), created fresh and dropped at
    the end: your queues are never touched. A schema the bench did not create is
    refused unless --force. Workers share the machine with this command: run it
    where your workers would run for figures that mean something.

    \b
    Examples:
      pgtasks bench --database-url postgresql://app@db/app
      pgtasks -A proj bench --workers 4 -c 4 --pool prefork
      pgtasks bench --only burn-down,latency --pool asyncio -c 50
      pgtasks bench --only latency --latency-samples 1000 --rate 100
      pgtasks bench --only capacity,steady --steady-seconds 300
      pgtasks bench --only steady --steady-rate 2000 --hold-snapshot
      pgtasks bench --only steady --steady-rate 2000 --steady-retention 0
      pgtasks bench --tasks 2000 --json | jq .phases.burn_down
      pgtasks bench --only capacity,steady --window-seconds 1 \\
        --capacity-seconds 2 --steady-seconds 2    # a check that it runs
    """
    # Imported here: every pgtasks command imports this module, to register it.
    from pgtasks.cli.bench.options import BenchError, Options, check_options, parse_phases
    from pgtasks.cli.bench.progress import Progress
    from pgtasks.cli.bench.report import format_report
    from pgtasks.cli.bench.runner import run

    try:
        phases = parse_phases(only)
    except BenchError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    url = _database_url(ctx, database_url)
    opts = Options(
        database_url=url,
        schema=schema,
        tasks=tasks,
        workers=workers,
        concurrency=concurrency,
        pool=pool,
        prefetch_multiplier=prefetch_multiplier,
        latency_samples=latency_samples,
        rate=rate,
        phases=phases,
        capacity_seconds=capacity_seconds,
        steady_seconds=steady_seconds,
        window=window_seconds,
        steady_rate=steady_rate,
        steady_retention=steady_retention,
        hold_snapshot=hold_snapshot,
        keep=keep,
        force=force,
    )
    try:
        check_options(opts)
    except BenchError as exc:
        raise click.UsageError(str(exc)) from None
    report = run(opts, Progress())
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo()
        click.echo(format_report(report))
