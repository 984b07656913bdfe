"""``apply_many``'s rows built straight for COPY are the rows of the messages ``delay`` would
make (``Broker.copy_row`` of them), whatever the arguments and options; where a call cannot be
enqueued, the same error is raised."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtasks import Celery
from pgtasks.broker import copy_row
from pgtasks.serialization import EncodeError
from pgtasks.task import REPR_MAX, Task

# Nothing here connects: an unroutable address makes any accidental query fail loudly.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
OPTIONS: list[dict[str, Any]] = [
    {},
    {"queue": "q 'quoted' ünï", "priority": 5},
    {"ignore_result": True, "max_retries": 9, "headers": {"x": [1, "é"], "y": None}},
    {"eta": datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)},
    {"expires": datetime(2031, 1, 1, tzinfo=timezone.utc), "argsrepr": "(…)"},
    {"kwargsrepr": "{'k': '***'}", "serializer": "json"},
    {"shadow": "renamed", "retry": False},  # Celery options kept in the headers
]


@pytest.fixture
def app() -> Iterator[Celery]:
    application = Celery("rows", broker=NOWHERE, set_as_current=False)
    yield application
    application.close()


@pytest.fixture
def task(app: Celery) -> Task[Any, Any]:
    @app.task(name="rows.echo", max_retries=4)
    def echo(*args: Any, **kwargs: Any) -> None:
        return None

    return echo


# The task is only read: one for every example.
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(JSON_VALUES, max_size=4),
    kwargs=st.dictionaries(st.text(), JSON_VALUES, max_size=3),
    which=st.integers(min_value=0, max_value=len(OPTIONS) - 1),
)
def test_a_row_is_the_copy_row_of_the_message(
    task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], which: int
) -> None:
    make, row = task._makers(**OPTIONS[which])
    assert row is not None
    assert row(args, kwargs, "the-id") == copy_row(make(args, kwargs, "the-id"))


def test_large_arguments_are_shown_shortened_as_in_the_message(task: Task[Any, Any]) -> None:
    make, row = task._makers()
    assert row is not None
    big = (["x" * 300] * 30, {"n": list(range(200))})
    assert row(*big, "id") == copy_row(make(*big, "id"))
    assert len(row(*big, "id")[10]) < 2 * REPR_MAX + 100


def test_every_row_gets_an_id_of_its_own(task: Task[Any, Any]) -> None:
    _, row = task._makers()
    assert row is not None
    ids = {row(("a",), {}, None)[0] for _ in range(100)}
    assert len(ids) == 100


def _outcome(build: Any, args: list[Any]) -> Any:
    try:
        return build(args, {}, "id")
    except EncodeError as exc:
        return f"EncodeError: {exc}"


def test_a_call_that_cannot_be_enqueued_raises_the_message_error(
    app: Celery, task: Task[Any, Any]
) -> None:
    app.conf.max_payload_bytes = 64
    make, row = task._makers()
    assert row is not None
    # Not json and too large: refused here. NaN and a lone surrogate encode (as NaN and an
    # escape), and the server refuses them, for both.
    for args, refused in (([object()], True), (["x" * 100], True), (["\ud800"], False)):
        from_make = _outcome(lambda a, k, i: copy_row(make(a, k, i)), args)
        assert _outcome(row, args) == from_make
        assert isinstance(from_make, str) is refused
    assert row([float("nan")], {}, "id") == copy_row(make([float("nan")], {}, "id"))


def test_options_the_rows_cannot_follow_leave_it_to_the_messages(
    app: Celery, task: Task[Any, Any]
) -> None:
    # Times relative to the database clock, unique keys, concurrency limits and other
    # serializers go through the messages (and their statements).
    assert task._makers(countdown=5)[1] is None
    assert task._makers(expires=60)[1] is None
    assert task._makers(unique_key="k")[1] is None
    assert task._makers(concurrency_key="k", concurrency_limit=2)[1] is None
    assert task._makers(serializer="pickle")[1] is None
    # Headers that already hold the reprs keep their place in the message's json.
    assert task._makers(headers={"argsrepr": "x"})[1] is None
    # A route may look at the call: routed tasks go through the messages too.
    app.conf.task_routes = {"rows.*": {"queue": "routed"}}
    assert task._makers()[1] is None
    assert task._makers(queue="fixed")[1] is not None
