"""``apply_many`` writes the rows ``apply_async`` would write for the same calls, whatever the
arguments and options (many of them go straight to COPY without a message, the others through
their messages); where a call cannot be enqueued, the same error is raised and nothing is
written."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.rows import dict_row

from pgtasks import Celery
from pgtasks.serialization import EncodeError
from pgtasks.task import REPR_MAX, Task

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
# Options relative to the database clock, or that settle something per call.
OTHER_OPTIONS: list[dict[str, Any]] = [
    {"countdown": 5},
    {"expires": 60},
    {"expires": timedelta(minutes=2)},
    {"concurrency_key": "k", "concurrency_limit": 2},
    {"serializer": "pickle"},
    {"headers": {"argsrepr": "x"}},
    {"queue": "fixed"},
]


@pytest.fixture
def task(app: Celery) -> Task[Any, Any]:
    app.conf.accept_content = ["json", "pickle"]

    @app.task(name="rows.echo", max_retries=4)
    def echo(*args: Any, **kwargs: Any) -> None:
        return None

    return echo


TRACE_HEADERS = ("traceparent", "tracestate")

#: Columns that differ between any two enqueues (times: see assert_same_row), and the payload,
#: compared as its text.
UNCOMPARED = ("id", "created_at", "updated_at", "run_at", "expires_at", "payload")


def stored(db: psycopg.Connection[Any], task_id: str) -> dict[str, Any]:
    """The row of ``task_id`` as the database keeps it: ``kept`` the columns that two enqueues
    of one call share, ``text`` the json payload as written."""
    columns = [
        name
        for (name,) in db.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'tasks'::regclass"
            " AND attnum > 0 AND NOT attisdropped"
        )
        if name not in UNCOMPARED
    ]
    query = sql.SQL(
        "SELECT {}, payload::text AS text, run_at = created_at AS now, run_at, expires_at,"
        " created_at FROM tasks WHERE id = %s"
    ).format(sql.SQL(", ").join(map(sql.Identifier, columns)))
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query, (task_id,)).fetchone()
    assert row is not None, "no row written"
    kept = {c: row[c] for c in columns}
    # Trace context, where a tracer provider is installed in this process (the tracing tests
    # install one for good), is each call's own.
    kept["headers"] = {k: v for k, v in kept["headers"].items() if k not in TRACE_HEADERS}
    return {
        "kept": kept,
        **{k: row[k] for k in ("text", "now", "run_at", "expires_at", "created_at")},
    }


def assert_same_row(db: psycopg.Connection[Any], many: str, single: str) -> None:
    a, b = stored(db, many), stored(db, single)
    assert (a["kept"], a["text"], a["now"]) == (b["kept"], b["text"], b["now"])
    # A time is the one given (the same in both rows), or one relative to the enqueue's own
    # database time (the same distance from each row's created_at).
    for key in ("run_at", "expires_at"):
        if a[key] is None or b[key] is None:
            assert a[key] is b[key] is None
        else:
            same = a[key] == b[key]
            assert same or a[key] - a["created_at"] == b[key] - b["created_at"], key


# One schema for every example: each compares the two rows it wrote.
# No explain phase: it traces every call, which makes pytest-timeout take the run for a debugger
# session and ignore its timeout, so a failure would hang instead of being reported.
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
@given(
    args=st.lists(JSON_VALUES, max_size=4),
    kwargs=st.dictionaries(st.text(), JSON_VALUES, max_size=3),
    which=st.integers(min_value=0, max_value=len(OPTIONS) - 1),
)
def test_a_row_is_the_row_of_a_single_call(
    task: Task[Any, Any],
    db: psycopg.Connection[Any],
    args: list[Any],
    kwargs: dict[str, Any],
    which: int,
) -> None:
    [many] = task.apply_many([(args, kwargs)], **OPTIONS[which])
    single = task.apply_async(args, kwargs, **OPTIONS[which])
    assert_same_row(db, many.id, single.id)


@pytest.mark.parametrize("options", OTHER_OPTIONS, ids=lambda o: ",".join(o))
def test_options_relative_to_the_database_or_the_call_give_the_same_rows(
    task: Task[Any, Any], db: psycopg.Connection[Any], options: dict[str, Any]
) -> None:
    [many] = task.apply_many([((1, "a"), {"k": [2]})], **options)
    single = task.apply_async((1, "a"), {"k": [2]}, **options)
    assert_same_row(db, many.id, single.id)


def test_routed_calls_go_where_a_single_call_would(
    app: Celery, task: Task[Any, Any], db: psycopg.Connection[Any]
) -> None:
    # A route may look at the call.
    app.conf.task_routes = [lambda name, args, kwargs, *_: {"queue": f"q{args[0]}"}]
    results = task.apply_many([(1,), (2,)])
    queues = [stored(db, r.id)["kept"]["queue"] for r in results]
    assert queues == ["q1", "q2"]
    assert_same_row(db, results[0].id, task.apply_async((1,)).id)


def test_unique_calls_are_settled_as_a_single_call_is(
    task: Task[Any, Any], db: psycopg.Connection[Any]
) -> None:
    first = task.apply_async(("a",), unique_key="k")
    again = task.apply_many([("a",), ("b",)], unique_key="k")
    assert [r.id for r in again] == [first.id, first.id]
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (1,)


def test_large_arguments_are_shown_shortened_as_in_a_single_call(
    task: Task[Any, Any], db: psycopg.Connection[Any]
) -> None:
    big = (["x" * 300] * 30, {"n": list(range(200))})
    [many] = task.apply_many([big])
    assert_same_row(db, many.id, task.apply_async(*big).id)
    assert len(stored(db, many.id)["kept"]["headers"]["argsrepr"]) < 2 * REPR_MAX + 100


def test_every_row_gets_an_id_of_its_own(task: Task[Any, Any], db: psycopg.Connection[Any]) -> None:
    results = task.apply_many([("a",)] * 100)
    assert len({r.id for r in results}) == 100
    assert db.execute("SELECT count(DISTINCT id) FROM tasks").fetchone() == (100,)


def outcome(enqueue: Any) -> str:
    try:
        enqueue()
    except EncodeError as exc:
        return f"EncodeError: {exc}"
    return "enqueued"


@pytest.mark.parametrize(
    "value", [object(), "x" * 100, float("nan")], ids=["not json", "too large", "NaN"]
)
def test_a_call_that_cannot_be_enqueued_fails_as_a_single_call_does(
    app: Celery, task: Task[Any, Any], db: psycopg.Connection[Any], value: Any
) -> None:
    app.conf.max_payload_bytes = 64
    # Not json and too large: refused before anything is sent. NaN encodes, and the server
    # refuses it.
    many = outcome(lambda: task.apply_many([(value,)]))
    assert many.startswith("EncodeError: ")
    assert many == outcome(lambda: task.apply_async((value,)))
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)


def test_a_lone_surrogate_is_kept_as_its_escape(
    task: Task[Any, Any], db: psycopg.Connection[Any]
) -> None:
    [many] = task.apply_many([("\ud800",)])
    assert_same_row(db, many.id, task.apply_async(("\ud800",)).id)
    assert "\\ud800" in stored(db, many.id)["text"]
