"""One-by-one enqueueing at equal durability: pgtasks against Celery on brokers that keep what
``delay()`` returned for, and on the ones that do not.

A ``delay()`` of pgtasks returns once its row is committed and, as PostgreSQL commits by
default, on disk. Celery's ``delay()`` on Redis returns once Redis holds the message in memory
(the harness's Redis, like Redis's default, writes nothing to disk), and on RabbitMQ once the
message is written to the socket (``confirm_publish`` is off by default). This loop times, in
the same minutes and alternating round by round, ``delay()`` of the harness's task for:

- Celery on the harness's Redis (nothing on disk);
- Celery on a Redis with ``appendonly yes`` and ``appendfsync always`` (each write on disk
  before Redis replies), which this script starts on ``--fsync-redis-port`` in a scratch folder
  and stops at the end (``redis-server`` must be on ``PATH``);
- Celery on RabbitMQ with publisher confirms (``broker_transport_options={"confirm_publish":
  True}``: the broker confirms a persistent message on a durable queue once it is on disk), and
  without them (Celery's default); skipped where ``--amqp-url`` does not answer;
- pgtasks on the harness's PostgreSQL.

::

    cd ../shared/bench && ./services.sh start
    PGTASKS_BENCH_SRC=/path/to/pgtasks-snapshot \\
      python /path/to/pgtasks/benchmarks/durable_enqueue.py --harness . --calls 5000 --rounds 3

Run it with the ``python`` that runs the harness's ``driver.py`` (it needs pgtasks, Celery and
redis-py). No worker runs: every call writes a task that stays queued; the pgtasks schema is
made afresh first (as the harness's ``reset`` does), and Celery's messages are purged after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def start_fsync_redis(port: int, folder: str) -> subprocess.Popen[bytes]:
    """A Redis that writes every command to its append-only file and fsyncs it before it
    replies."""
    redis = shutil.which("redis-server")
    if redis is None:
        sys.exit("redis-server is not on PATH (needed for the Redis that fsyncs every write)")
    process = subprocess.Popen(
        [
            redis,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            folder,
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not answers("127.0.0.1", port):
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the Redis on port {port} did not start (is the port taken?)")
        time.sleep(0.05)
    return process


def celery_delay(url: str, **conf: Any) -> tuple[Any, Callable[..., Any]]:
    from celery import Celery

    app = Celery("durable_enqueue", broker=url)
    app.conf.update(broker_connection_retry_on_startup=True, task_ignore_result=True, **conf)

    @app.task(name="bench.task")
    def task(run: str, ts: float) -> None:
        pass

    return app, task.delay


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--harness", default=os.path.join(HERE, "..", "..", "shared", "bench"))
    parser.add_argument("--calls", type=int, default=5000, help="delay() calls a round, each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync-redis-port", type=int, default=56380)
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672//")
    args = parser.parse_args()

    sys.path[:0] = [os.path.abspath(args.harness), HERE]
    if os.environ.get("PGTASKS_BENCH_SRC"):
        sys.path.insert(0, os.path.abspath(os.environ["PGTASKS_BENCH_SRC"]))
    import common  # the harness's module: its services' ports and database names
    import pgtasks_adapter

    pgtasks_adapter.ADAPTER.reset()
    os.environ["PGTASKS_DATABASE_URL"] = common.dsn(pgtasks_adapter.DB)
    from pgtasks_app import app as pgtasks_app
    from pgtasks_app import bench_task

    folder = tempfile.mkdtemp(prefix="durable-enqueue-redis-")
    redis = start_fsync_redis(args.fsync_redis_port, folder)
    apps: list[Any] = []
    try:
        targets: dict[str, Callable[..., Any]] = {}
        for name, port in [
            ("Celery, Redis keeping nothing on disk", common.REDIS_PORT),
            ("Celery, Redis with appendfsync always", args.fsync_redis_port),
        ]:
            app, delay = celery_delay(f"redis://127.0.0.1:{port}/0")
            apps.append(app)
            targets[name] = delay
        amqp = urlsplit(args.amqp_url)
        amqp_host, amqp_port = amqp.hostname or "127.0.0.1", amqp.port or 5672
        if answers(amqp_host, amqp_port):
            app, delay = celery_delay(
                args.amqp_url, broker_transport_options={"confirm_publish": True}
            )
            apps.append(app)
            targets["Celery, RabbitMQ with publisher confirms"] = delay
            app, delay = celery_delay(args.amqp_url)
            apps.append(app)
            targets["Celery, RabbitMQ without confirms (default)"] = delay
        else:
            print(f"RabbitMQ does not answer on {amqp_host}:{amqp_port}: skipped")
        pgtasks_app.broker.pool.wait(timeout=30.0)
        targets["pgtasks, PostgreSQL (commits on disk)"] = bench_task.delay
        for delay in targets.values():
            delay("warm", 0.0)  # connection set-up is not timed

        rates: dict[str, list[float]] = {name: [] for name in targets}
        for r in range(1, args.rounds + 1):
            for name, delay in targets.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    delay("durable", 0.0)
                rate = args.calls / (time.perf_counter() - t0)
                rates[name].append(rate)
                print(f"round {r}  {name:45s} {rate:8,.0f}/s", flush=True)
        ours = statistics.median(rates["pgtasks, PostgreSQL (commits on disk)"])
        print(f"\n{'median of the rounds':45s}        {'pgtasks is':>10s}")
        for name, values in rates.items():
            median = statistics.median(values)
            print(f"{name:45s} {median:8,.0f}/s  {ours / median:8.2f}x")
    finally:
        for app in apps:
            # A broker that went away has nothing left to purge.
            with contextlib.suppress(Exception):
                app.control.purge()
            app.close()
        pgtasks_app.close()
        redis.terminate()
        redis.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
