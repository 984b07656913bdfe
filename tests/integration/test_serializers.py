"""Serializers through real rows: msgpack and yaml round trips, per-call serializers, result
serializers, and content the worker does not accept dead-lettered unrun."""

from __future__ import annotations

import datetime as dt
import importlib.util
import threading
import time
from typing import Any

import psycopg
import pytest

from pgtasks import Celery


def needs(module: str) -> pytest.MarkDecorator:
    """Skip unless an optional serializer library is installed (kombu registers it then)."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed"
    )


SERIALIZERS = [
    pytest.param("msgpack", marks=needs("msgpack")),
    pytest.param("yaml", marks=needs("yaml")),
    "json",
]


def task_row(db: psycopg.Connection[Any], task_id: str) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT status, content_type, payload IS NULL, error FROM tasks WHERE id = %s", [task_id]
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("serializer", SERIALIZERS)
def test_task_serializer_round_trip(
    app: Celery, db: psycopg.Connection[Any], worker_factory, serializer: str
) -> None:
    app.conf.update(
        task_serializer=serializer, result_serializer=serializer, accept_content=[serializer]
    )
    seen: list[Any] = []

    @app.task(name="ser.echo")
    def echo(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, kwargs))
        return {"args": list(args), "kwargs": kwargs}

    args = (1, 2.5, "héllo", [1, [2, 3]], {"k": None}, True)
    with worker_factory():
        result = echo.apply_async(args, {"flag": False, "n": -7})
        value = result.get(timeout=10)
    assert value == {"args": list(args), "kwargs": {"flag": False, "n": -7}}
    assert seen == [(args, {"flag": False, "n": -7})]
    status, content_type, no_json, _ = task_row(db, result.id)
    assert status == "COMPLETED"
    assert (content_type == "application/json") == (serializer == "json")
    assert no_json == (serializer != "json")


def test_per_call_serializer_overrides_the_default(
    app: Celery, db: psycopg.Connection[Any], worker_factory
) -> None:
    pytest.importorskip("msgpack", reason="msgpack is not installed")
    app.conf.update(accept_content=["json", "msgpack"])

    @app.task(name="ser.add")
    def add(x: int, y: int) -> int:
        return x + y

    with worker_factory():
        packed = add.apply_async((1, 2), serializer="msgpack")
        plain = add.apply_async((3, 4))
        assert packed.get(timeout=10) == 3
        assert plain.get(timeout=10) == 7
    assert task_row(db, packed.id)[1] == "application/x-msgpack"
    assert task_row(db, plain.id)[1] == "application/json"


def test_result_serializer_is_used_for_results(
    app: Celery, db: psycopg.Connection[Any], worker_factory
) -> None:
    pytest.importorskip("yaml", reason="PyYAML is not installed")
    app.conf.update(result_serializer="yaml", result_accept_content=["json", "yaml"])

    @app.task(name="ser.when")
    def when() -> dict[str, Any]:
        return {"day": "2026-01-02", "n": 3}

    with worker_factory():
        result = when.delay()
        assert result.get(timeout=10) == {"day": "2026-01-02", "n": 3}
    stored = db.execute("SELECT content_type FROM results WHERE task_id = %s", [result.id])
    assert stored.fetchone() == ("application/x-yaml",)


def test_json_keeps_celerys_rich_types(app: Celery, worker_factory) -> None:
    @app.task(name="ser.types")
    def types(when: dt.datetime) -> str:
        return type(when).__name__

    with worker_factory():
        moment = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
        assert types.delay(moment).get(timeout=10) == "datetime"


@pytest.mark.parametrize(
    ("serializer", "accept", "content_type"),
    [
        ("pickle", ["json"], "application/x-python-serialize"),
        pytest.param(
            "yaml",
            ["json", "msgpack"],
            "application/x-yaml",
            marks=needs("yaml"),
        ),
    ],
)
def test_content_the_worker_does_not_accept_is_dead_lettered_unrun(
    app: Celery,
    db: psycopg.Connection[Any],
    worker_factory,
    serializer: str,
    accept: list[str],
    content_type: str,
) -> None:
    app.conf.update(accept_content=accept)
    ran = threading.Event()

    @app.task(name="ser.never")
    def never(x: int) -> int:
        ran.set()
        return x

    @app.task(name="ser.after")
    def after() -> str:
        return "ok"

    with worker_factory():
        refused = never.apply_async((1,), serializer=serializer)
        # Rows run in creation order on one queue: once this one ran, the refused one was seen.
        assert after.delay().get(timeout=10) == "ok"
        deadline_status = _wait_status(db, refused.id, "DEAD")
    assert deadline_status == "DEAD"
    assert not ran.is_set()
    _, stored_type, _, error = task_row(db, refused.id)
    assert stored_type == content_type
    assert "cannot decode payload" in error
    assert content_type in error or serializer in error  # names what was refused
    assert refused.state == "FAILURE"


def test_pickle_runs_when_accepted(app: Celery, worker_factory) -> None:
    app.conf.update(accept_content=["json", "pickle"], result_serializer="pickle")

    @app.task(name="ser.pickled")
    def pickled(value: Any) -> Any:
        return value

    with worker_factory():
        assert pickled.apply_async(({1, 2},), serializer="pickle").get(timeout=10) == {1, 2}


def _wait_status(db: psycopg.Connection[Any], task_id: str, want: str) -> str:
    # The completer writes in batches: poll the row (bounded) until it holds the outcome.
    deadline = time.monotonic() + 10
    status = ""
    while time.monotonic() < deadline:
        row = db.execute("SELECT status FROM tasks WHERE id = %s", [task_id]).fetchone()
        status = row[0] if row else ""
        if status == want:
            break
        time.sleep(0.02)
    return status
