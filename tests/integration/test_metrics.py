"""Prometheus metrics of a worker: celery-exporter's task counters and run-time histogram, the
pgtasks-only counters, and queue gauges computed by SQL at scrape time."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.apps.harness import wait_until

pytest.importorskip("prometheus_client")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """``metric{labels}`` -> value for every sample line."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def value(samples: dict[str, float], metric: str, **labels: str) -> float:
    """The sum of ``metric``'s samples whose labels include ``labels``."""
    total = 0.0
    for key, v in samples.items():
        name, _, rest = key.partition("{")
        if name != metric:
            continue
        if all(f'{k}="{val}"' in rest for k, val in labels.items()):
            total += v
    return total


def test_worker_serves_task_counters_histogram_and_queue_gauges(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="m.ok")
    def ok() -> int:
        return 1

    @app.task(name="m.bad", max_retries=0)
    def bad() -> None:
        raise KeyError("missing")

    @app.task(name="m.again", bind=True, max_retries=1)
    def again(self: Any) -> str:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "done"

    port = free_port()
    later = [ok.apply_async(countdown=3600, queue="slow") for _ in range(3)]
    with worker_factory(metrics_port=port, queues=["celery", "slow"]) as worker:
        assert [ok.delay().get(timeout=10) for _ in range(4)] == [1] * 4
        with pytest.raises(KeyError):
            bad.delay().get(timeout=10)
        assert again.delay().get(timeout=10) == "done"
        db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (later[0].id,))
        samples = wait_until(
            lambda: (
                (s := scrape(port))
                and value(s, "celery_task_succeeded_total", name="m.ok") == 4
                and s
            ),
            what="the counters to reach the scrape",
        )
    host = worker.id
    assert value(samples, "celery_task_succeeded_total", name="m.ok", hostname=host) == 4
    assert value(samples, "celery_task_received_total", name="m.ok", queue_name="celery") == 4
    assert value(samples, "celery_task_failed_total", name="m.bad", exception="KeyError") == 1
    assert value(samples, "celery_task_retried_total", name="m.again") == 1
    assert value(samples, "celery_task_succeeded_total", name="m.again") == 1
    assert value(samples, "celery_task_runtime_count", name="m.ok") == 4
    assert value(samples, "celery_worker_up", hostname=host) == 1
    # Queue gauges come from the database when scraped.
    assert value(samples, "pgtasks_tasks", queue_name="slow", status="scheduled") == 2
    assert value(samples, "pgtasks_dead_letters", queue_name="slow") == 1
    assert value(samples, "celery_queue_length", queue_name="slow") == 0
    assert value(samples, "celery_active_worker_count", queue_name="slow") == 1
    assert "pgtasks_oldest_due_task_age_seconds" in {k.partition("{")[0] for k in samples}
    with pytest.raises(OSError):
        scrape(port)  # the server stops with the worker
