"""A run of ``pgtasks bench``: the bench app pointed at the run's database and schema, the
schema made fresh, the selected phases in order, and the schema dropped at the end."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from pgtasks import __version__
from pgtasks.cli.bench.load import capacity, steady
from pgtasks.cli.bench.options import STEADY_SHARE, WINDOW, BenchError, Options, check_options
from pgtasks.cli.bench.phases import burn_down, enqueue_bulk, enqueue_one_by_one, latency
from pgtasks.cli.bench.progress import Progress
from pgtasks.cli.bench.store import BenchStore
from pgtasks.cli.bench.tasks import bench_app, bench_tasks
from pgtasks.cli.bench.workers import started_workers
from pgtasks.migrate import migrate


@contextlib.contextmanager
def _bench_settings(opts: Options) -> Iterator[None]:
    """Point this process's bench app at the run's database and schema.

    ``PGTASKS_*`` variables win over code-given settings, so they are set for the run (a
    ``PGTASKS_SCHEMA_NAME`` meant for the user's app must not lead the bench to its schema).
    """
    names = ("PGTASKS_DATABASE_URL", "PGTASKS_SCHEMA_NAME")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(PGTASKS_DATABASE_URL=opts.database_url, PGTASKS_SCHEMA_NAME=opts.schema)
    app = bench_app()
    app.close()
    app.conf.update(broker_url=opts.database_url, schema_name=opts.schema)
    try:
        yield
    finally:
        app.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare_schema(opts: Options) -> None:
    """Create the bench schema fresh; refuse one the bench did not create unless ``force``."""
    app = bench_app()
    store = BenchStore(app.broker)
    state = store.schema_state()
    if state == "other" and not opts.force:
        raise BenchError(
            f"schema {opts.schema!r} exists and was not created by pgtasks bench: "
            "pick another with --schema, or pass --force to drop it and everything in it"
        )
    if state != "absent":
        store.drop_schema()
    store.create_schema()
    migrate(app.database_url, opts.schema)


def run(opts: Options, progress: Progress | None = None) -> dict[str, Any]:
    """Run the selected phases; returns the report (``setup`` and ``phases``)."""
    check_options(opts)
    progress = progress or Progress()
    phases: dict[str, Any] = {}
    with _bench_settings(opts):
        broker = bench_app().broker
        store = BenchStore(broker)
        broker.connect().close()  # fails fast, where the pool would retry for a while
        setup = {
            "postgresql": store.server_version(),
            "pgtasks": __version__,
            "pool": opts.pool,
            "workers": opts.workers,
            "concurrency": opts.concurrency,
            "tasks": opts.tasks,
            "schema": opts.schema,
        }
        prepare_schema(opts)
        try:
            _run_phases(opts, progress, phases)
        except BaseException:
            progress.clear()
            if not opts.keep:
                # The first error is the one to report: a failing clean-up must not hide it.
                with contextlib.suppress(Exception):
                    store.drop_schema()
            raise
        if opts.keep:
            progress.result(f"kept schema {opts.schema!r}")
        else:
            store.drop_schema()
    return {"setup": setup, "phases": phases}


def _run_phases(opts: Options, progress: Progress, phases: dict[str, Any]) -> None:
    """The selected phases, in order; each adds its figures to ``phases``."""
    app = bench_app()
    if "enqueue" in opts.phases:
        phases["enqueue"] = enqueue_one_by_one(opts.one_by_one, progress)
        phases["bulk_enqueue"] = enqueue_bulk(opts.tasks, progress)
        app.broker.purge()  # the workers must find only the burn-down's tasks
    if "burn-down" in opts.phases or "latency" in opts.phases:
        no_op, stamping = bench_tasks(opts.pool)
        with started_workers(opts, progress) as workers:
            if "burn-down" in opts.phases:
                phases["burn_down"] = burn_down(opts.tasks, workers, progress, no_op)
            if "latency" in opts.phases:
                phases["latency"] = latency(
                    opts.latency_samples, opts.rate, workers, progress, stamping
                )
    load = [p for p in ("capacity", "steady") if p in opts.phases]
    if load and opts.window < WINDOW:
        progress.result(short_windows_warning(opts.window, load))
    if "capacity" in opts.phases:
        app.broker.purge()
        phases["capacity"] = capacity(opts, progress)
    if "steady" in opts.phases:
        rate = opts.steady_rate
        if rate is None:
            measured = phases.get("capacity") or phases.get("burn_down")
            if measured is None:
                raise BenchError(
                    "give --steady-rate, or run the capacity (or burn-down) phase to take "
                    f"{STEADY_SHARE:.0%} of it"
                )
            rate = STEADY_SHARE * measured["tasks_per_second"]
        app.broker.purge()
        phases["steady"] = steady(opts, rate, progress)


def short_windows_warning(window: float, phases: Sequence[str]) -> str:
    """What a run with windows shorter than WINDOW says before its load ``phases``."""
    return (
        f"warning: the {' and '.join(phases)} figures come from windows of {window:g} s, "
        f"shorter than the {WINDOW:g} s default: each holds few tasks, and a worker's start, "
        "a vacuum or a checkpoint can fill one, so they do not measure the queue; short windows "
        "only check that the bench runs on this database"
    )
