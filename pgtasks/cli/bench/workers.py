"""The bench's worker processes: ``pgtasks worker`` on the bench's app, started and stopped
by the bench, each with its log in a temporary file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from pgtasks.cli.bench.options import BenchError, Options
from pgtasks.cli.bench.progress import Progress
from pgtasks.cli.bench.tasks import APP_MODULE, bench_app


@dataclass
class Workers:
    """The benchmark's worker processes, each with its log in a temporary file."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)
    files: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def check(self) -> None:
        """Raise when a worker has exited."""
        for proc, log in zip(self.procs, self.logs, strict=True):
            code = proc.poll()
            if code is not None:
                log.seek(0)
                tail = log.read().decode("utf-8", "replace").strip().splitlines()[-15:]
                detail = "\n".join(tail) or "(no output)"
                raise BenchError(f"a worker exited with code {code}:\n{detail}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every worker, then SIGKILL to those still running after ``grace`` s."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.files.close()


@contextlib.contextmanager
def started_workers(
    opts: Options, progress: Progress, settings: dict[str, str] | None = None
) -> Iterator[Workers]:
    """``opts.workers`` worker processes, registered and idle, for the block; always stopped.
    ``settings`` are extra ``PGTASKS_*`` variables for them."""
    env = {k: v for k, v in os.environ.items() if k != "PGTASKS_APP"}
    env.update(PGTASKS_DATABASE_URL=opts.database_url, PGTASKS_SCHEMA_NAME=opts.schema)
    env.update(settings or {})
    workers = Workers()
    try:
        for i in range(opts.workers):
            worker_id = f"bench-{i + 1}-{uuid.uuid4().hex[:6]}"
            cmd = [sys.executable, "-m", "pgtasks", "-A", APP_MODULE, "worker"]
            cmd += ["-n", worker_id, "-l", "WARNING", "--log-format", "console"]
            cmd += ["-c", str(opts.concurrency), "-P", opts.pool]
            if opts.prefetch_multiplier:
                cmd += ["--prefetch-multiplier", str(opts.prefetch_multiplier)]
            # Closed with the others by Workers.stop.
            log = workers.files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
            workers.logs.append(log)
            # Their own session: a Ctrl-C reaches the bench only, which then stops them.
            workers.procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            workers.ids.append(worker_id)
        deadline = time.monotonic() + 60
        while True:
            workers.check()
            live = {row["id"] for row in bench_app().broker.live_workers(30)}
            ready = len(live & set(workers.ids))
            if ready == len(workers.ids):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"only {ready} of {opts.workers} workers registered within 60 s")
            progress.status(f"starting workers: {ready}/{opts.workers} ready")
            time.sleep(0.05)
        progress.clear()
        yield workers
    finally:
        progress.clear()
        workers.stop()
