"""Prometheus metrics for a worker (``pgtasks worker --metrics-port N``; the ``metrics`` extra).

Task counters and the run-time histogram use celery-exporter's names and labels (``name``,
``hostname``, ``queue_name``), so existing Celery dashboards and alerts keep working; what
Celery has no word for (dead letters, leases, reclaims, loop errors) is named ``pgtasks_*``.
Queue gauges are computed by SQL when Prometheus scrapes, so every worker reports the same
database-wide numbers and nothing is counted twice in a worker's memory.

Without ``prometheus_client`` installed, or without ``--metrics-port``, the worker uses
``NullMetrics``: the same methods, doing nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from pgtasks.broker import Broker

log = structlog.get_logger("pgtasks")

TASK_LABELS = ("name", "hostname", "queue_name")
#: Run-time buckets (seconds): short tasks dominate, but reports take minutes.
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class NullMetrics:
    """The metrics interface, recording nothing."""

    #: False where every call records nothing: a caller may skip working out what to record.
    enabled = False

    def claimed(self, name: str, queue: str) -> None: ...

    def started(self, name: str, queue: str) -> None: ...

    def finished(
        self, name: str, queue: str, outcome: str, runtime: float, error: str = ""
    ) -> None:
        """``outcome``: succeeded, failed, retried, rejected, revoked, ignored or dead_lettered."""

    def dead_lettered(self, name: str, queue: str, reason: str) -> None: ...

    def leases_renewed(self, count: int) -> None: ...

    def leases_lost(self, count: int) -> None: ...

    def reclaimed(self, count: int, dead: int) -> None: ...

    def loop_error(self, during: str) -> None: ...

    def active(self, count: int) -> None: ...

    def stop(self) -> None: ...


class PrometheusMetrics(NullMetrics):
    """Counters and histograms in a registry of their own, served over HTTP on ``port``."""

    enabled = True

    def __init__(
        self,
        hostname: str,
        broker: Broker,
        port: int,
        addr: str = "0.0.0.0",
        live_within: float = 30.0,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.hostname = hostname
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def task_counter(name: str, doc: str, *extra: str) -> Any:
            return Counter(name, doc, [*TASK_LABELS, *extra], registry=r)

        self.received = task_counter("celery_task_received", "Tasks claimed by the worker.")
        self.started_ = task_counter("celery_task_started", "Tasks the worker began to run.")
        self.succeeded = task_counter("celery_task_succeeded", "Tasks that succeeded.")
        self.failed = task_counter("celery_task_failed", "Tasks that failed.", "exception")
        self.retried = task_counter("celery_task_retried", "Tasks that failed and will retry.")
        self.rejected = task_counter("celery_task_rejected", "Tasks rejected by the worker.")
        self.revoked = task_counter("celery_task_revoked", "Tasks cancelled (revoked).")
        self.dead = task_counter(
            "pgtasks_task_dead_lettered", "Tasks moved to the dead letters.", "reason"
        )
        self.runtime = Histogram(
            "celery_task_runtime",
            "Task run time in seconds.",
            list(TASK_LABELS),
            registry=r,
            buckets=RUNTIME_BUCKETS,
        )
        worker = ["hostname"]
        self.renewals = Counter(
            "pgtasks_lease_renewals", "Leases renewed by the worker.", worker, registry=r
        )
        self.lost = Counter(
            "pgtasks_lease_lost", "Tasks whose lease the worker lost.", worker, registry=r
        )
        self.reclaims = Counter(
            "pgtasks_lease_reclaimed",
            "Expired leases of other workers taken back (status: pending or dead).",
            [*worker, "status"],
            registry=r,
        )
        self.errors = Counter(
            "pgtasks_worker_loop_errors",
            "Errors in the worker's loops (claim, write, renew, maintenance).",
            [*worker, "during"],
            registry=r,
        )
        self.up = Gauge("celery_worker_up", "1 while the worker runs.", worker, registry=r)
        self.tasks_active = Gauge(
            "celery_worker_tasks_active", "Tasks the worker holds now.", worker, registry=r
        )
        self.up.labels(hostname).set(1)
        r.register(QueueCollector(broker, live_within))
        from prometheus_client import start_http_server

        self.server, self.thread = start_http_server(port, addr=addr, registry=r)
        log.info("metrics.serving", port=port, addr=addr)

    def _task(self, name: str, queue: str) -> dict[str, str]:
        return {"name": name, "hostname": self.hostname, "queue_name": queue}

    def claimed(self, name: str, queue: str) -> None:
        self.received.labels(**self._task(name, queue)).inc()

    def started(self, name: str, queue: str) -> None:
        self.started_.labels(**self._task(name, queue)).inc()

    def finished(
        self, name: str, queue: str, outcome: str, runtime: float, error: str = ""
    ) -> None:
        labels = self._task(name, queue)
        if outcome == "succeeded":
            self.succeeded.labels(**labels).inc()
            self.runtime.labels(**labels).observe(runtime)
        elif outcome in ("failed", "dead_lettered"):
            self.failed.labels(**labels, exception=error.partition(":")[0]).inc()
            self.runtime.labels(**labels).observe(runtime)
        elif outcome == "retried":
            self.retried.labels(**labels).inc()
        elif outcome == "rejected":
            self.rejected.labels(**labels).inc()
        elif outcome == "revoked":
            self.revoked.labels(**labels).inc()

    def dead_lettered(self, name: str, queue: str, reason: str) -> None:
        self.dead.labels(**self._task(name, queue), reason=reason).inc()

    def leases_renewed(self, count: int) -> None:
        self.renewals.labels(self.hostname).inc(count)

    def leases_lost(self, count: int) -> None:
        self.lost.labels(self.hostname).inc(count)

    def reclaimed(self, count: int, dead: int) -> None:
        if count - dead:
            self.reclaims.labels(self.hostname, "pending").inc(count - dead)
        if dead:
            self.reclaims.labels(self.hostname, "dead").inc(dead)

    def loop_error(self, during: str) -> None:
        self.errors.labels(self.hostname, during).inc()

    def active(self, count: int) -> None:
        self.tasks_active.labels(self.hostname).set(count)

    def stop(self) -> None:
        self.up.labels(self.hostname).set(0)
        self.server.shutdown()
        self.server.server_close()


class QueueCollector:
    """Database-wide queue gauges, read by one statement when Prometheus scrapes."""

    def __init__(self, broker: Broker, live_within: float = 30.0) -> None:
        self.broker = broker
        self.live_within = live_within

    def describe(self) -> list[Any]:
        return []  # computed at scrape time; nothing to describe up front

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        length = GaugeMetricFamily(
            "celery_queue_length", "Tasks waiting in the queue (due now).", labels=["queue_name"]
        )
        tasks = GaugeMetricFamily(
            "pgtasks_tasks", "Tasks by queue and status.", labels=["queue_name", "status"]
        )
        oldest = GaugeMetricFamily(
            "pgtasks_oldest_due_task_age_seconds",
            "How long the oldest due task has waited.",
            labels=["queue_name"],
        )
        expired = GaugeMetricFamily(
            "pgtasks_expired_leases", "Running tasks whose lease ran out.", labels=["queue_name"]
        )
        dead = GaugeMetricFamily(
            "pgtasks_dead_letters", "Dead-lettered tasks kept for requeue.", labels=["queue_name"]
        )
        workers = GaugeMetricFamily(
            "celery_active_worker_count", "Live workers consuming the queue.", labels=["queue_name"]
        )
        processes = GaugeMetricFamily(
            "celery_active_process_count",
            "Task slots of the live workers consuming the queue.",
            labels=["queue_name"],
        )
        try:
            rows = self.broker.queue_stats()
            live = self.broker.live_workers(self.live_within)
        except Exception as exc:  # a scrape must answer even when the database does not
            log.warning("metrics.scrape_failed", error=str(exc).strip())
            rows, live = [], []
        for row in rows:
            name = row["queue"]
            q = [name]
            length.add_metric(q, row["pending_due"])
            counts = {
                "due": row["pending_due"],
                "scheduled": row["scheduled"],
                "blocked": row["blocked"],
                "running": row["running"],
                "dead": row["dead"],
            }
            for status, n in counts.items():
                tasks.add_metric([name, status], n)
            oldest.add_metric(q, row["oldest_due_age"] or 0.0)
            expired.add_metric(q, row["expired_leases"])
            dead.add_metric(q, row["dead"])
            consuming = [w for w in live if name in (w["queues"] or ())]
            workers.add_metric(q, len(consuming))
            processes.add_metric(q, sum(w["concurrency"] for w in consuming))
        yield from (length, tasks, oldest, expired, dead, workers, processes)


def create(
    hostname: str, broker: Broker, port: int | None, live_within: float = 30.0
) -> NullMetrics:
    """Metrics served on ``port``, or the no-op ones when no port is given; a worker is live
    while its heartbeat is newer than ``live_within`` seconds."""
    if not port:
        return NullMetrics()
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "--metrics-port needs prometheus_client: pip install 'pgtasks[metrics]'"
        ) from None
    return PrometheusMetrics(hostname, broker, port, live_within=live_within)
