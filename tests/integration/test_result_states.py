"""What AsyncResult shows where Celery stores no outcome or only an interim one: ``Ignore``,
ignored results, ``forget()``, and the RETRY state while a retry waits."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from pgtasks import Celery, Ignore
from pgtasks.worker import Worker
from tests.apps.harness import advance_due, one, task_row, wait_until

WorkerFactory = Callable[..., AbstractContextManager[Worker]]


class Flaky(Exception):
    """A task's own exception type, shown as the RETRY state's info."""


def test_ignore_finishes_the_row_but_stores_no_outcome(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="states.ignored")
    def ignored() -> None:
        raise Ignore()

    with worker_factory():
        result = ignored.delay()
        wait_until(lambda: task_row(db, result.id)["status"] == "COMPLETED", what="the run")
    # As in Celery: the result keeps showing the task as started, and it is never ready.
    assert (result.state, result.ready(), result.result) == ("STARTED", False, None)
    history = one(db, "SELECT outcome FROM attempts WHERE task_id = %s", (result.id,))
    assert history == {"outcome": "ignored"}


def test_ignored_results_read_as_pending(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="states.quiet", ignore_result=True)
    def quiet() -> int:
        return 1

    @app.task(name="states.loud")
    def loud() -> int:
        raise ValueError("not kept either")

    with worker_factory():
        by_task = quiet.delay()
        per_call = loud.apply_async(ignore_result=True)
        kept = loud.delay()
        wait_until(
            lambda: (
                {task_row(db, r.id)["status"] for r in (by_task, per_call, kept)}
                == {"COMPLETED", "FAILED"}
            ),
            what="all three to finish",
        )
    assert by_task.state == "PENDING"
    assert per_call.state == "PENDING"
    assert kept.state == "FAILURE", "a call that keeps its result still shows the failure"
    assert task_row(db, per_call.id)["status"] == "FAILED", "the row still tells operators"


def test_forget_drops_the_result_and_the_finished_row(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="states.add")
    def add(x: int, y: int) -> int:
        return x + y

    with worker_factory():
        result = add.delay(1, 2)
        assert result.get(timeout=10) == 3
    result.forget()
    assert result.state == "PENDING"
    assert result.result is None
    assert one(db, "SELECT count(*) AS n FROM tasks WHERE id = %s", (result.id,)) == {"n": 0}
    assert one(db, "SELECT count(*) AS n FROM results WHERE task_id = %s", (result.id,)) == {"n": 0}


def test_forget_keeps_a_waiting_task(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="states.later")
    def later() -> None: ...

    result = later.apply_async(countdown=60)
    result.forget()
    assert task_row(db, result.id)["status"] == "PENDING", "forget never cancels"


def test_retry_state_shows_the_exception_until_the_retry_runs(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(bind=True, name="states.flaky", max_retries=1)
    def flaky(self: Any) -> str:
        if self.request.retries == 0:
            raise self.retry(exc=Flaky("wait"), countdown=600)
        return "second time"

    with worker_factory():
        result = flaky.delay()
        wait_until(lambda: result.state == "RETRY", what="the retry to be scheduled")
        info = result.info
        assert type(info) is Flaky
        assert str(info) == "wait"
        assert not result.ready()
        assert "Flaky: wait" in (result.traceback or "")
        advance_due(db)
        assert result.get(timeout=10) == "second time"
    assert result.state == "SUCCESS"


def test_get_on_an_ignored_result_returns_none_at_once(app: Celery) -> None:
    @app.task(name="states.silent", ignore_result=True)
    def silent() -> int:
        return 1

    @app.task(name="states.plain")
    def plain() -> int:
        return 2

    # No worker runs: as in Celery, get() does not wait for a result that will never exist.
    assert silent.delay().get(timeout=0.1) is None
    assert plain.apply_async(ignore_result=True).get(timeout=0.1) is None
    assert not plain.delay().ignored
