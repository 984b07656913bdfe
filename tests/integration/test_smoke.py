"""The basic round trip: delay, a worker runs it, the result comes back from Postgres."""

from __future__ import annotations

from pgtasks import Celery


def test_delay_runs_and_returns_result(app: Celery, worker_factory) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with worker_factory():
        result = add.delay(2, 3)
        assert result.get(timeout=10) == 5
    assert result.state == "SUCCESS"
    assert result.successful()


def test_control_ping_answers_for_live_workers(app: Celery, worker_factory) -> None:
    with worker_factory() as worker:
        replies = app.control.ping()
        assert {worker.id: {"ok": "pong"}} in replies
        assert app.control.ping(destination=["nobody"]) == []
