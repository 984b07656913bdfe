"""Rows edited by hand into states pgtasks never writes: the database refuses what its CHECK
and NOT NULL constraints forbid; every other state ends terminal or waiting, with the reason in
``error`` where it fails, while the worker keeps running and the tasks beside it complete.

The table-driven cases say what each state ends as; the generated ones (hypothesis) say that any
mix of them settles.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import errors
from psycopg.types.json import Json, Jsonb

from pgtasks import Celery
from pgtasks.worker import Worker
from tests.apps.harness import attempts, rows, task_row, wait_until

INT_MAX = 2**31 - 1
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "DEAD"}


@dataclass
class Tasks:
    """The tasks hand-edited rows name, and the worker running them."""

    echo: Any
    fail: Any
    worker: Worker


def define_tasks(app: Celery) -> tuple[Any, Any]:
    @app.task(name="inv.echo")
    def echo(*args: Any, **kwargs: Any) -> list[Any]:
        return [list(args), kwargs]

    # Celery's default retry delay (180 s): a retry leaves the row waiting, not looping. No
    # limit of its own, so a row's max_retries alone decides (NULL: retry for ever).
    @app.task(name="inv.fail", autoretry_for=(ValueError,), max_retries=None)
    def fail(*args: Any, **kwargs: Any) -> None:
        raise ValueError("inv.fail always fails")

    return echo, fail


@pytest.fixture
def tasks(app: Celery, worker_factory: Any) -> Iterator[Tasks]:
    echo, fail = define_tasks(app)
    with worker_factory(concurrency=2) as worker:
        yield Tasks(echo, fail, worker)


def edit(db: psycopg.Connection[Any], task_id: str, assignments: str, *params: Any) -> None:
    """Change a row as an operator would in psql (``assignments`` are this test's own SQL)."""
    changed = db.execute(
        f"UPDATE tasks SET {assignments} WHERE id = %s",
        (*params, task_id),
    ).rowcount
    assert changed == 1


def hand_edited(
    app: Celery,
    db: psycopg.Connection[Any],
    name: str,
    assignments: str,
    *params: Any,
    args: tuple[Any, ...] = (1,),
    kwargs: dict[str, Any] | None = None,
) -> str:
    """A row of task ``name`` changed by ``assignments`` before any worker could claim it: it
    is enqueued for later and made due by the edit (unless the edit sets run_at itself)."""
    task_id = app.send_task(name, args=args, kwargs=kwargs, countdown=3600).id
    if "run_at" not in assignments:
        assignments += ", run_at = now()"
    edit(db, task_id, assignments, *params)
    return task_id


def settled(db: psycopg.Connection[Any], task_id: str) -> dict[str, Any] | None:
    """The row once it is finished, or waiting for a later time, or None while in play."""
    [row] = rows(
        db,
        "SELECT *, run_at > now() AS later FROM tasks WHERE id = %s",
        (task_id,),
    )
    if row["status"] in TERMINAL or (row["status"] == "PENDING" and row["later"]):
        return row
    return None


def assert_worker_runs(tasks: Tasks) -> None:
    """The worker is alive and a fresh task beside the edited rows completes."""
    assert tasks.echo.delay("beside").get(timeout=10) == [["beside"], {}]


# -- refused by the database -------------------------------------------------------------------


#: What the schema's CHECK, NOT NULL and type constraints refuse, so no code has to handle it.
REFUSED: list[tuple[str, type[Exception]]] = [
    ("status = 'SUCCESS'", errors.CheckViolation),
    ("status = 'RUNNING'", errors.CheckViolation),
    ("status = 'RUNNING', claimed_by = 'w'", errors.CheckViolation),
    ("status = 'RUNNING', lease_until = now()", errors.CheckViolation),
    ("payload = NULL, payload_raw = NULL", errors.CheckViolation),
    ("status = NULL", errors.NotNullViolation),
    ("name = NULL", errors.NotNullViolation),
    ("queue = NULL", errors.NotNullViolation),
    ("attempt = NULL", errors.NotNullViolation),
    ("retries = NULL", errors.NotNullViolation),
    ("headers = NULL", errors.NotNullViolation),
    ("run_at = NULL", errors.NotNullViolation),
    ("content_type = NULL", errors.NotNullViolation),
    ("cancel_requested = NULL", errors.NotNullViolation),
    ("headers = '{not json'", errors.InvalidTextRepresentation),
    ("payload = '[[], {}'", errors.InvalidTextRepresentation),
    ("attempt = 2147483648", errors.NumericValueOutOfRange),
]


def test_database_refuses_impossible_states(app: Celery, db: psycopg.Connection[Any]) -> None:
    sent = app.send_task("inv.echo", args=(1,), countdown=3600)
    before = task_row(db, sent.id)
    for assignments, error in REFUSED:
        with pytest.raises(error):
            edit(db, sent.id, assignments)
        assert task_row(db, sent.id) == before, assignments


# -- table-driven: what each state ends as -----------------------------------------------------

#: case -> (task, SQL assignments, final status, text the error starts with or None)
CASES: dict[str, tuple[str, str, str, str | None]] = {
    "headers an array": (
        "inv.echo",
        "headers = '[1, 2]'",
        "DEAD",
        "cannot decode headers: a JSON object is required, not an array",
    ),
    "headers a number": (
        "inv.echo",
        "headers = '7'",
        "DEAD",
        "cannot decode headers: a JSON object is required, not a number",
    ),
    "headers a string": (
        "inv.echo",
        "headers = '\"x\"'",
        "DEAD",
        "cannot decode headers: a JSON object is required, not a string",
    ),
    "headers json null": (
        "inv.echo",
        "headers = 'null'",
        "DEAD",
        "cannot decode headers: a JSON object is required, not null",
    ),
    "payload a scalar": ("inv.echo", "payload = '5'", "DEAD", "cannot decode payload"),
    "payload json null": ("inv.echo", "payload = 'null'", "DEAD", "cannot decode payload"),
    "payload one element": ("inv.echo", "payload = '[[1]]'", "DEAD", "cannot decode payload"),
    "payload with embed": (
        "inv.echo",
        'payload = \'[[1], {}, {"callbacks": null, "chord": null}]\'',
        "COMPLETED",
        None,
    ),
    "payload with extra elements": ("inv.echo", "payload = '[[1], {}, {}, 9]'", "COMPLETED", None),
    "unknown content type": (
        "inv.echo",
        "content_type = 'application/x-martian'",
        "DEAD",
        "cannot decode payload: Refusing to deserialize untrusted content",
    ),
    "unknown content encoding": (
        "inv.echo",
        "content_encoding = 'rot13'",
        "DEAD",
        "cannot decode payload: content encoding 'rot13' is not accepted",
    ),
    "content encoding in capitals": ("inv.echo", "content_encoding = 'UTF-8'", "COMPLETED", None),
    "negative attempt": ("inv.echo", "attempt = -5", "COMPLETED", None),
    "attempt near the top": ("inv.echo", f"attempt = {INT_MAX - 1}", "COMPLETED", None),
    "negative retries": ("inv.echo", "retries = -3", "COMPLETED", None),
    "retries past max_retries, failing": (
        "inv.fail",
        "retries = 10, max_retries = 3",
        "DEAD",
        "ValueError: inv.fail always fails",
    ),
    "negative max_retries, failing": (
        "inv.fail",
        "max_retries = -1",
        "DEAD",
        "ValueError: inv.fail always fails",
    ),
    "retries at the top, unlimited, failing": (
        "inv.fail",
        f"retries = {INT_MAX}, max_retries = NULL",
        "FAILED",
        "the outcome could not be recorded: integer out of range",
    ),
    "null max_retries, failing": (
        "inv.fail",
        "max_retries = NULL",
        "PENDING",
        "ValueError: inv.fail always fails",
    ),
    "run_at in year 1": ("inv.echo", "run_at = '0001-01-01 00:00Z'", "COMPLETED", None),
    "expires before created": (
        "inv.echo",
        "expires_at = created_at - interval '1 day'",
        "CANCELLED",
        "expired",
    ),
    "pending with an owner and a lease": (
        "inv.echo",
        "claimed_by = 'ghost@nowhere', lease_until = now() + interval '1 hour'",
        "COMPLETED",
        None,
    ),
    "pending with cancel_requested": ("inv.echo", "cancel_requested = true", "CANCELLED", None),
    "running on a vanished worker, lease expired": (
        "inv.echo",
        "status = 'RUNNING', attempt = 1, claimed_by = 'ghost@nowhere', "
        "lease_until = now() - interval '1 minute'",
        "COMPLETED",
        None,
    ),
    "running on a vanished worker, lost budget spent": (
        "inv.echo",
        "status = 'RUNNING', attempt = 3, claimed_by = 'ghost@nowhere', "
        "lease_until = now() - interval '1 minute'",
        "DEAD",
        "worker lost: lease of ghost@nowhere expired",
    ),
    "running on a vanished worker, counters at the bottom": (
        "inv.echo",
        f"status = 'RUNNING', attempt = -1, requeued_attempt = -1, retries = {-INT_MAX - 1}, "
        "claimed_by = 'ghost@nowhere', lease_until = now() - interval '1 minute'",
        "DEAD",
        "worker lost: lease of ghost@nowhere expired",
    ),
    "negative time limits": (
        "inv.echo",
        "headers = '{\"timelimit\": [-1e308, -1]}'",
        "COMPLETED",
        None,
    ),
    "junk time limits": (
        "inv.echo",
        'headers = \'{"timelimit": [-1e308, "soon"]}\'',
        "DEAD",
        "cannot decode headers: 'timelimit' must be [hard, soft]: two numbers of seconds or "
        "nulls, not [-1000",
    ),
    "junk canvas ids": (
        "inv.echo",
        'headers = \'{"parent_id": 5, "root_id": [], "group": {}}\'',
        "DEAD",
        "cannot decode headers: 'group' must be a string or null, not an object",
    ),
    "infinite time limit": (
        "inv.echo",
        "headers = '{\"timelimit\": [1e400, 1e400]}'",
        "COMPLETED",
        None,
    ),
    "time limit past a float": (
        "inv.echo",
        f"headers = '{{\"timelimit\": [{10**400}, null]}}'",
        "COMPLETED",
        None,
    ),
    "junk result serializer": (
        "inv.echo",
        "headers = '{\"result_serializer\": 5}'",
        "DEAD",
        "cannot decode headers: 'result_serializer' must be a string or null, not a number",
    ),
    "unknown result serializer": (
        "inv.echo",
        'headers = \'{"result_serializer": "martian"}\'',
        "FAILED",
        "EncodeError: return value of inv.echo cannot be serialized",
    ),
}


def test_hand_edited_rows_settle_and_the_tasks_beside_them_complete(
    app: Celery, db: psycopg.Connection[Any], tasks: Tasks
) -> None:
    edited: dict[str, str] = {}
    beside = []
    for case, (name, assignments, _, _) in CASES.items():
        beside.append(tasks.echo.delay(case))
        edited[case] = hand_edited(app, db, name, assignments)

    finals = {
        case: wait_until(
            lambda task_id=task_id: settled(db, task_id),  # type: ignore[misc]
            what=f"the row edited to {case!r} to settle",
        )
        for case, task_id in edited.items()
    }
    assert [r.get(timeout=10) for r in beside] == [[[case], {}] for case in CASES]
    assert_worker_runs(tasks)

    for case, (_, _, status, error) in CASES.items():
        row = finals[case]
        assert row["status"] == status, (case, row["status"], row["error"])
        if error is not None:
            assert (row["error"] or "").startswith(error), (case, row["error"])
        assert (row["claimed_by"], row["lease_until"]) == (None, None), case
        if status in ("DEAD", "FAILED"):
            assert app.AsyncResult(edited[case]).state == "FAILURE", case


def test_malformed_headers_keep_the_payload_for_a_requeue(
    app: Celery, db: psycopg.Connection[Any], tasks: Tasks
) -> None:
    sent = app.AsyncResult(
        hand_edited(
            app, db, "inv.echo", 'headers = \'["an", "array"]\'', args=("kept",), kwargs={"k": 1}
        )
    )
    row = wait_until(lambda: settled(db, sent.id), what="the row to be dead-lettered")
    assert row["status"] == "DEAD"
    assert row["payload"] == [["kept"], {"k": 1}]
    assert attempts(db, sent.id) == [(1, tasks.worker.id, "dead")]
    assert sent.state == "FAILURE"

    # Mended by hand and requeued from the dead letters, it runs.
    edit(db, sent.id, "headers = '{}'")
    assert app.broker.requeue_dead([sent.id]) == 1
    assert app.AsyncResult(sent.id).get(timeout=10) == [["kept"], {"k": 1}]


def test_running_row_of_a_vanished_worker_runs_again_here(
    app: Celery, db: psycopg.Connection[Any], tasks: Tasks
) -> None:
    sent = app.AsyncResult(
        hand_edited(
            app,
            db,
            "inv.echo",
            "status = 'RUNNING', attempt = 1, claimed_by = %s,"
            " lease_until = now() - interval '1 s'",
            f"gone-{uuid.uuid4().hex[:6]}@nowhere",
            args=("orphan",),
        )
    )
    assert sent.get(timeout=10) == [["orphan"], {}]
    history = attempts(db, sent.id)
    assert [(a, o) for a, _, o in history] == [(1, "lost"), (2, "completed")]
    assert history[1][1] == tasks.worker.id


# -- generated ---------------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Text PostgreSQL's json types can hold (no NUL, no lone surrogates).
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
header_keys = st.sampled_from(
    [
        "timelimit",
        "ignore_result",
        "result_serializer",
        "parent_id",
        "root_id",
        "group",
        "argsrepr",
        "kwargsrepr",
        "retries",
        "eta",
        "expires",
    ]
)
headers = st.dictionaries(header_keys | texts, json_values, max_size=4) | json_values
payloads = (
    st.tuples(st.lists(json_values, max_size=3), st.dictionaries(texts, json_values, max_size=3))
    .map(list)
    .flatmap(lambda body: st.just(body) | st.builds(lambda extra: [*body, extra], json_values))
) | json_values
counters = st.integers(-(2**31), -1) | st.integers(0, 5) | st.integers(6, INT_MAX - 1000)


@dataclass(frozen=True)
class Edit:
    """One hand-edited row, as drawn."""

    name: str
    running: bool
    attempt: int
    retries: int
    max_retries: int | None
    requeued_attempt: int
    claimed_by: str | None
    cancel_requested: bool
    headers: Any
    payload: Any
    content_type: str
    run_in_days: int
    expires_after_days: int | None


edits = st.builds(
    Edit,
    name=st.sampled_from(["inv.echo", "inv.fail", "inv.unknown"]),
    running=st.booleans(),
    attempt=counters,
    # Unlimited retries past the top would overflow; that case is in the table above.
    retries=st.integers(-(2**31), INT_MAX - 1),
    max_retries=st.none() | st.integers(-5, 5) | st.integers(6, INT_MAX),
    requeued_attempt=counters,
    claimed_by=st.none() | texts.filter(bool),
    cancel_requested=st.booleans(),
    headers=headers,
    payload=payloads,
    content_type=st.sampled_from(
        ["application/json", "application/x-martian", "application/x-msgpack", ""]
    ),
    run_in_days=st.integers(-700_000, 700_000) | st.just(0),
    expires_after_days=st.none() | st.integers(-700_000, 700_000),
)


@SETTINGS
@given(drawn=edits)
def test_any_hand_edited_row_settles(
    app: Celery, db: psycopg.Connection[Any], tasks: Tasks, drawn: Edit
) -> None:
    sent = app.send_task(drawn.name, args=(1,), countdown=3600)
    owner = drawn.claimed_by or "ghost@nowhere"
    db.execute(
        "UPDATE tasks SET status = %s, attempt = %s, retries = %s, max_retries = %s,"
        " requeued_attempt = %s, claimed_by = %s, cancel_requested = %s,"
        " lease_until = CASE WHEN %s THEN now() - interval '1 second' END,"
        " headers = %s::jsonb, payload = %s::json, content_type = %s,"
        " run_at = now() + make_interval(days => %s),"
        " expires_at = created_at + make_interval(days => %s)"
        " WHERE id = %s",
        (
            "RUNNING" if drawn.running else "PENDING",
            drawn.attempt,
            drawn.retries,
            drawn.max_retries,
            drawn.requeued_attempt,
            owner if drawn.running else drawn.claimed_by,
            drawn.cancel_requested,
            drawn.running,
            Jsonb(drawn.headers),
            Json(drawn.payload),
            drawn.content_type,
            drawn.run_in_days,
            drawn.expires_after_days,
            sent.id,
        ),
    )
    row = wait_until(lambda: settled(db, sent.id), timeout=15, what=f"{drawn} to settle")
    if row["status"] in ("DEAD", "FAILED"):
        assert row["error"], row
    if row["status"] == "COMPLETED":
        assert row["error"] is None, row
    if row["status"] in TERMINAL:
        assert (row["claimed_by"], row["lease_until"]) == (None, None), row
    assert_worker_runs(tasks)


# -- states at the edges of the column types --------------------------------------------------


def test_due_row_with_attempt_at_the_top_does_not_block_its_queue(
    app: Celery, db: psycopg.Connection[Any], tasks: Tasks
) -> None:
    hand_edited(app, db, "inv.echo", "priority = 9, attempt = %s", INT_MAX)
    assert tasks.echo.delay("beside").get(timeout=1.5) == [["beside"], {}]


@pytest.mark.parametrize(
    "assignments",
    ["run_at = '-infinity'", "expires_at = 'infinity'"],
)
def test_infinite_times_do_not_cost_the_rows_claimed_with_them(
    app: Celery, db: psycopg.Connection[Any], tasks: Tasks, assignments: str
) -> None:
    beside = tasks.echo.apply_async(("beside",), countdown=3600)
    odd = app.send_task("inv.echo", args=(1,), countdown=3600)
    # Due together, so that one claim takes both.
    with db.transaction():
        edit(
            db, odd.id, assignments if "run_at" in assignments else f"{assignments}, run_at = now()"
        )
        edit(db, beside.id, "run_at = now()")
    assert beside.get(timeout=1.5) == [["beside"], {}]
    assert attempts(db, beside.id) == [(1, tasks.worker.id, "completed")]
