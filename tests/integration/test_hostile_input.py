"""Hostile and odd input, generated: whatever a caller sends, enqueue either refuses it with a
clear error and writes nothing, or stores it so that the worker gets exactly it back.

The table-driven cases are in ``test_bad_input``; these draw arguments (nested, huge, unicode,
NUL, NaN, lone surrogates) and task and queue names (quotes, semicolons, backslashes, unicode)
from hypothesis, against one running worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgtasks import Celery, Task
from pgtasks.exceptions import EncodeError
from tests.apps.harness import one, remote
from tests.integration.test_bad_input import task_count

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats()
    | st.text()
    | st.text(alphabet=st.characters(codec="utf-8"), min_size=1000, max_size=5000)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)
#: Names as people write them, and as attackers do.
names = st.text(min_size=1, max_size=40) | st.sampled_from(
    [
        "a'b",
        'a"b',
        "x; DROP TABLE tasks; --",
        "q\\n",
        "ünïcödé.task",
        "名前",
        "$1",
        "%s",
        "{schema}",
    ]
)


def representable(value: Any) -> bool:
    """Whether JSON can carry ``value`` exactly: no NaN or infinities, no unpaired surrogates."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list):
        return all(representable(v) for v in value)
    if isinstance(value, dict):
        return all(representable(k) and representable(v) for k, v in value.items())
    return True


@pytest.fixture
def echo(app: Celery, worker_factory: Any) -> Iterator[Task[Any, Any]]:
    @app.task(name="hostile.echo")
    def echo(value: Any) -> Any:
        return value

    with worker_factory(concurrency=2):
        yield echo


@SETTINGS
@given(value=json_values)
def test_arguments_come_back_exactly_or_are_refused(
    echo: Task[Any, Any], db: psycopg.Connection[Any], value: Any
) -> None:
    before = task_count(db)
    if not representable(value):
        with pytest.raises(EncodeError):
            echo.delay(value)
        assert task_count(db) == before
        return
    assert echo.delay(value).get(timeout=20) == value


@SETTINGS
@given(depth=st.integers(min_value=1, max_value=3000))
@example(depth=900)
@example(depth=3000)
def test_deep_nesting_comes_back_or_is_refused(
    echo: Task[Any, Any], db: psycopg.Connection[Any], depth: int
) -> None:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    before = task_count(db)
    try:
        result = echo.delay(value)
    except EncodeError as exc:
        assert "recursion" in str(exc).lower() or "depth" in str(exc).lower(), exc
        assert task_count(db) == before
        return
    assert result.get(timeout=20) == value


@SETTINGS
@given(name=names, queue=names)
@example(name="a\x00b", queue="celery")
@example(name="ok", queue="q\x00")
@example(name="\ud800", queue="celery")
@example(name="ok", queue="\udfff")
def test_task_and_queue_names_are_stored_as_data(
    app: Celery, db: psycopg.Connection[Any], name: str, queue: str
) -> None:
    before = task_count(db)
    if "\x00" in name + queue or not representable(name + queue):
        with pytest.raises(ValueError, match="name"):
            app.send_task(name, args=(1,), queue=queue)
        assert task_count(db) == before
        return
    sent = app.send_task(name, args=(1,), queue=queue)
    row = one(db, "SELECT name, queue FROM tasks WHERE id = %s", (sent.id,))
    assert (row["name"], row["queue"]) == (name, queue)
    # The same through the bulk path (COPY).
    [bulk] = remote(app, name).apply_many([((2,), {})], queue=queue)
    row = one(db, "SELECT name, queue FROM tasks WHERE id = %s", (bulk.id,))
    assert (row["name"], row["queue"]) == (name, queue)
    assert task_count(db) == before + 2
