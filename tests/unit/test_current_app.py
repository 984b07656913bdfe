"""current_app stands for the app created most recently, as Celery's proxy does."""

from __future__ import annotations

from pgtasks import Celery, current_app
from pgtasks.result import AsyncResult


def test_current_app_forwards_to_the_newest_app() -> None:
    first = Celery("first", broker="postgresql://localhost/x")
    assert current_app() is first
    assert current_app.main == "first"
    second = Celery("second", broker="postgresql://localhost/x")
    second.conf.task_default_queue = "from-second"
    assert current_app._get_current_object() is second
    assert current_app.conf.task_default_queue == "from-second"
    assert "second" in repr(current_app)


def test_async_result_without_app_uses_the_current_app() -> None:
    app = Celery("third", broker="postgresql://localhost/x")
    assert AsyncResult("some-id").app is app
