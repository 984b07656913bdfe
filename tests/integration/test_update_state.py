"""Task.update_state: a running task reports custom states that callers see until it ends."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pgtasks import Celery


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.mark.parametrize("ignore_result", [False, True])
def test_progress_is_visible_then_gives_way_to_the_outcome(
    app: Celery, worker_factory: Any, ignore_result: bool
) -> None:
    release = threading.Event()

    @app.task(bind=True, name="progress.job", ignore_result=ignore_result)
    def job(self: Any, total: int) -> str:
        self.update_state(state="PROGRESS", meta={"done": 1, "total": total})
        assert release.wait(10)
        return "finished"

    with worker_factory():
        result = job.delay(3)
        wait_for(lambda: result.state == "PROGRESS")
        assert result.info == {"done": 1, "total": 3}
        assert not result.ready()
        release.set()
        wait_for(lambda: result.state == "SUCCESS")
        if not ignore_result:
            assert result.get(timeout=5) == "finished"


def test_update_state_outside_a_task_needs_an_id(app: Celery) -> None:
    @app.task(name="progress.plain")
    def plain() -> None: ...

    with pytest.raises(ValueError, match="needs a task_id"):
        plain.update_state(state="PROGRESS")
