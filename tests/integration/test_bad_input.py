"""Nothing lost on bad input: refused at enqueue with a clear error where possible, otherwise a
row that says what went wrong, with the worker still running (DESIGN.md §4, invariant 9)."""

from __future__ import annotations

import math
import pickle
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kombu.exceptions import EncodeError

from pgtasks import Celery
from pgtasks.exceptions import (
    ImproperlyConfigured,
    NotRegistered,
    TaskRevokedError,
    TimeoutError,
)

Row = dict[str, Any]


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def task_count(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM tasks").fetchone()
    assert row is not None
    return int(row[0])


def task_row(db: psycopg.Connection[Any], task_id: str) -> Row:
    cur = db.execute(
        "SELECT id, name, status, attempt, retries, error, run_at, updated_at, expires_at, "
        "content_type, "
        "payload::text AS payload, payload_raw, run_at - now() AS run_in, "
        "expires_at - now() AS expires_in FROM tasks WHERE id = %s",
        (task_id,),
    )
    assert cur.description is not None
    columns = [c.name for c in cur.description]
    found = cur.fetchone()
    assert found is not None, f"no row for task {task_id}"
    return dict(zip(columns, found, strict=True))


class PaymentDeclined(Exception):
    """A task's own exception type, rebuilt by AsyncResult.get."""


# -- refused at enqueue ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "culprit"),
    [
        ((object(),), {}, "args[0] (object)"),
        ((1, {1, 2}), {}, "args[1] (set)"),
        ((), {"fine": 1, "k": object()}, "kwargs['k'] (object)"),
        ((1,), {"when": datetime.now(timezone.utc), "c": 2j}, "kwargs['c'] (complex)"),
    ],
)
def test_unencodable_argument_is_named_and_nothing_is_written(
    app: Celery,
    db: psycopg.Connection[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    culprit: str,
) -> None:
    @app.task(name="bad.echo")
    def echo(*a: Any, **kw: Any) -> None: ...

    with pytest.raises(EncodeError, match=r"cannot enqueue bad\.echo") as caught:
        echo.delay(*args, **kwargs)
    assert culprit in str(caught.value)
    assert task_count(db) == 0


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, {"deep": [1, {"x": math.nan}]}],
    ids=["nan", "inf", "-inf", "nested-nan"],
)
def test_values_json_cannot_hold_are_refused(
    app: Celery, db: psycopg.Connection[Any], value: Any
) -> None:
    @app.task(name="bad.echo")
    def echo(*a: Any, **kw: Any) -> None: ...

    with pytest.raises(EncodeError, match="NaN and Infinity are not valid JSON"):
        echo.delay(value)
    with pytest.raises(EncodeError):
        echo.delay(k=value)
    # In bulk, one bad call among good ones writes nothing at all, by COPY or by INSERT.
    with pytest.raises(EncodeError, match="NaN and Infinity are not valid JSON"):
        echo.apply_many([("fine",), (value,), ("fine too",)])
    with pytest.raises(EncodeError, match="NaN and Infinity are not valid JSON"):
        echo.apply_many([("fine",), (value,)], countdown=5)
    assert task_count(db) == 0
    # The pool connection that saw the error still works.
    assert echo.delay("fine").id
    assert task_count(db) == 1


def test_nul_characters_survive_the_round_trip(app: Celery, worker_factory: Any) -> None:
    @app.task(name="bad.echo_back")
    def echo_back(value: str) -> str:
        return value

    with worker_factory():
        assert echo_back.delay("nul \x00 inside").get(timeout=10) == "nul \x00 inside"


def test_oversize_payload_is_refused(app: Celery, db: psycopg.Connection[Any]) -> None:
    app.conf.max_payload_bytes = 1024

    @app.task(name="bad.big")
    def big(data: str) -> None: ...

    with pytest.raises(EncodeError, match=r"over the 1024-byte limit \(max_payload_bytes\)"):
        big.delay("x" * 2000)
    assert task_count(db) == 0
    big.delay("x" * 100)
    assert task_count(db) == 1


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"countdown": "10"}, TypeError, "countdown must be a number of seconds, not str"),
        ({"countdown": math.nan}, ValueError, "countdown must be a finite number"),
        ({"countdown": True}, TypeError, "not bool"),
        ({"eta": "2030-01-01"}, TypeError, "eta must be a datetime, not str"),
        ({"eta": 1893456000}, TypeError, "eta must be a datetime, not int"),
        ({"expires": "later"}, TypeError, "expires must be a number of seconds, not str"),
        ({"expires": math.inf}, ValueError, "expires must be a finite number"),
        ({"priority": "high"}, TypeError, "priority must be an integer, not str"),
        ({"priority": True}, TypeError, "priority must be an integer, not bool"),
        ({"priority": 2**40}, ValueError, "out of range"),
        ({"countdown": 5, "eta": datetime.now(timezone.utc)}, ValueError, "not both"),
    ],
)
def test_malformed_options_are_refused(
    app: Celery,
    db: psycopg.Connection[Any],
    options: dict[str, Any],
    error: type[Exception],
    text: str,
) -> None:
    @app.task(name="bad.timed")
    def timed() -> None: ...

    with pytest.raises(error, match=text):
        timed.apply_async(**options)
    assert task_count(db) == 0


def test_naive_datetimes_are_utc(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="bad.later")
    def later() -> None: ...

    naive_utc_now = datetime.now(timezone.utc).replace(tzinfo=None)
    result = later.apply_async(
        eta=naive_utc_now + timedelta(hours=1), expires=naive_utc_now + timedelta(hours=2)
    )
    row = task_row(db, result.id)
    assert abs(row["run_in"] - timedelta(hours=1)) < timedelta(minutes=1)
    assert abs(row["expires_in"] - timedelta(hours=2)) < timedelta(minutes=1)


def test_aware_datetimes_keep_their_instant(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="bad.later")
    def later() -> None: ...

    plus_five = timezone(timedelta(hours=5))
    eta = (datetime.now(timezone.utc) + timedelta(hours=1)).astimezone(plus_five)
    row = task_row(db, later.apply_async(eta=eta).id)
    assert abs(row["run_in"] - timedelta(hours=1)) < timedelta(minutes=1)


def test_duplicate_task_id_is_refused(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="bad.once")
    def once() -> None: ...

    once.apply_async(task_id="fixed-id")
    with pytest.raises(ValueError, match="'fixed-id' already exists"):
        once.apply_async(task_id="fixed-id")
    assert task_count(db) == 1


def test_missing_schema_says_to_migrate(pg_dsn: str) -> None:
    app = Celery("nomigrate", broker=pg_dsn, schema_name=f"absent_{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(ImproperlyConfigured, match="run `pgtasks migrate`"):
            app.send_task("anything")
    finally:
        app.close()


# -- kept and reported by the worker -----------------------------------------------------------


def test_send_task_enqueues_an_unknown_name(app: Celery, db: psycopg.Connection[Any]) -> None:
    result = app.send_task("no.such.task", args=(1, "two"), kwargs={"three": 3})
    row = task_row(db, result.id)
    assert (row["name"], row["status"]) == ("no.such.task", "PENDING")
    assert row["payload"] == '[[1, "two"], {"three": 3}]'
    assert result.state == "PENDING"


def test_unknown_task_is_handed_on_while_a_live_worker_knows_it(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """A rolling deploy: another live worker on the queue knows the name, so this one gives
    the row back (its claim undone) instead of failing it."""
    app.conf.unknown_task_delay = 0.3

    @app.task(name="bad.known")
    def known(x: int) -> int:
        return x * 2

    db.execute(
        "INSERT INTO workers (id, host, pid, queues, concurrency, tasks) "
        "VALUES ('newer-release@host', 'host', 1, '{celery}', 1, '{bad.learned_later}')"
    )
    orphan = app.send_task("bad.learned_later", args=(2, 3))
    with worker_factory():
        first = wait_for(
            lambda: (r := task_row(db, orphan.id))["error"] and r["status"] == "PENDING" and r,
            what="the worker to give the task back",
        )
        assert first["run_at"] - first["updated_at"] == timedelta(seconds=0.3)
        assert known.delay(21).get(timeout=10) == 42
        # Offered again after the delay, given back again, and the worker still runs tasks.
        wait_for(
            lambda: task_row(db, orphan.id)["updated_at"] > first["updated_at"],
            what="the task to be offered again",
        )
        assert known.delay(4).get(timeout=10) == 8
    row = task_row(db, orphan.id)
    assert row["status"] == "PENDING"
    assert row["attempt"] == 0, "every claim of an unknown task is given back"
    assert "unregistered task 'bad.learned_later'" in row["error"]
    assert orphan.state == "PENDING"
    history = db.execute("SELECT count(*) FROM attempts WHERE task_id = %s", (orphan.id,))
    assert history.fetchone() == (0,)

    @app.task(name="bad.learned_later")
    def learned_later(x: int, y: int) -> int:
        return x + y

    with worker_factory():
        assert orphan.get(timeout=10) == 5
    assert task_row(db, orphan.id)["status"] == "COMPLETED"


def test_unknown_task_fails_with_not_registered_when_no_worker_knows_it(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """As in Celery the caller sees NotRegistered; the row is dead-lettered, payload kept."""

    @app.task(name="bad.known")
    def known(x: int) -> int:
        return x * 2

    # A worker that knew the name but stopped heartbeating long ago does not count.
    db.execute(
        "INSERT INTO workers (id, host, pid, queues, concurrency, tasks, heartbeat_at) "
        "VALUES ('gone@host', 'host', 1, '{celery}', 1, '{bad.nobody_knows}', "
        "now() - interval '1 hour')"
    )
    orphan = app.send_task("bad.nobody_knows", args=(1,), kwargs={"k": "v"})
    with worker_factory():
        with pytest.raises(NotRegistered) as raised:
            orphan.get(timeout=10)
        assert known.delay(5).get(timeout=10) == 10
    assert str(raised.value) == "'bad.nobody_knows'"
    assert orphan.state == "FAILURE"
    row = task_row(db, orphan.id)
    assert row["status"] == "DEAD"
    assert row["payload"] == '[[1], {"k": "v"}]', "the payload is kept for a requeue"
    assert "no live worker consuming queue 'celery' has registered" in row["error"]
    assert "requeue" in row["error"]


def _insert_raw(
    db: psycopg.Connection[Any],
    name: str,
    *,
    payload: str | None = None,
    payload_raw: bytes | None = None,
    content_type: str = "application/json",
    content_encoding: str = "utf-8",
) -> str:
    task_id = f"raw-{uuid.uuid4().hex[:10]}"
    db.execute(
        "INSERT INTO tasks (id, name, content_type, content_encoding, payload, payload_raw) "
        "VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
        (task_id, name, content_type, content_encoding, payload, payload_raw),
    )
    return task_id


class _Boom:
    """Unpickling this creates a directory: the proof that a pickle was (not) loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.path.mkdir, ())


def test_undecodable_payloads_are_dead_lettered_and_kept(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, tmp_path: Path
) -> None:
    runs: list[Any] = []

    @app.task(name="bad.victim")
    def victim(*args: Any, **kwargs: Any) -> str:
        runs.append(args)
        return "ran"

    marker = tmp_path / "unpickled"
    evil = pickle.dumps([[_Boom(marker)], {}])
    rows = {
        "pickle refused": _insert_raw(
            db,
            "bad.victim",
            payload_raw=evil,
            content_type="application/x-python-serialize",
            content_encoding="binary",
        ),
        "bytes that are not json": _insert_raw(db, "bad.victim", payload_raw=b"\xff\xfe{not json"),
        "object, not [args, kwargs]": _insert_raw(db, "bad.victim", payload='{"a": 1}'),
        "args not a list": _insert_raw(db, "bad.victim", payload='["args", {}]'),
        "kwargs not an object": _insert_raw(db, "bad.victim", payload="[[], []]"),
        "unknown kombu type": _insert_raw(
            db, "bad.victim", payload='[[{"__type__": "martian", "__value__": 1}], {}]'
        ),
        "unknown content type": _insert_raw(
            db, "bad.victim", payload_raw=b"x", content_type="application/x-martian"
        ),
    }
    before = {
        task_id: (r["payload"], r["payload_raw"])
        for task_id, r in ((i, task_row(db, i)) for i in rows.values())
    }

    with worker_factory():

        def all_dead() -> bool:
            return all(task_row(db, i)["status"] == "DEAD" for i in rows.values())

        wait_for(all_dead, what="every bad row to be dead-lettered")
        assert victim.delay("good").get(timeout=10) == "ran"

    assert runs == [("good",)], "no bad payload reached the task"
    assert not marker.exists(), "the pickle was never loaded"
    for case, task_id in rows.items():
        row = task_row(db, task_id)
        assert row["error"].startswith("cannot decode payload"), (case, row["error"])
        assert (row["payload"], row["payload_raw"]) == before[task_id], f"{case}: payload kept"
        result = app.AsyncResult(task_id)
        assert result.state == "FAILURE"
        with pytest.raises(Exception, match="cannot decode payload"):
            result.get(timeout=1)
    outcomes = db.execute("SELECT outcome, count(*) FROM attempts GROUP BY outcome ORDER BY 1")
    assert outcomes.fetchall() == [("completed", 1), ("dead", len(rows))]


def test_pickle_runs_when_accepted(
    app: Celery, worker_factory: Any, tmp_path: Path, db: psycopg.Connection[Any]
) -> None:
    app.conf.accept_content = ["json", "pickle"]

    @app.task(name="bad.sorted")
    def sorted_items(items: set[int]) -> list[int]:
        return sorted(items)

    with worker_factory():
        result = sorted_items.apply_async(({3, 1, 2},), serializer="pickle")
        assert result.get(timeout=10) == [1, 2, 3]
    assert task_row(db, result.id)["content_type"] == "application/x-python-serialize"


# -- results -----------------------------------------------------------------------------------


def test_results_come_back_with_their_types(app: Celery, worker_factory: Any) -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))

    @app.task(name="bad.typed")
    def typed() -> dict[str, Any]:
        return {"when": when, "amount": Decimal("10.05"), "id": uuid.UUID(int=7), "n": [1, None]}

    with worker_factory():
        value = typed.delay().get(timeout=10)
    assert value == {
        "when": when,
        "amount": Decimal("10.05"),
        "id": uuid.UUID(int=7),
        "n": [1, None],
    }
    assert value["when"].utcoffset() == timedelta(hours=2)


def test_failures_raise_the_task_exception(app: Celery, worker_factory: Any) -> None:
    @app.task(name="bad.value")
    def value_error(n: int) -> None:
        raise ValueError(f"bad value {n}")

    @app.task(name="bad.declined")
    def declined() -> None:
        raise PaymentDeclined("card 4242 declined")

    with worker_factory():
        first = value_error.delay(42)
        second = declined.delay()
        with pytest.raises(ValueError, match="bad value 42"):
            first.get(timeout=10)
        with pytest.raises(PaymentDeclined, match="card 4242 declined"):
            second.get(timeout=10)
    assert first.state == "FAILURE"
    assert first.failed()
    returned = first.get(propagate=False)
    assert isinstance(returned, ValueError)
    assert str(returned) == "bad value 42"
    assert first.traceback is not None and "ValueError: bad value 42" in first.traceback


def test_get_times_out_on_a_task_nobody_runs(app: Celery) -> None:
    result = app.send_task("bad.never_run")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"The operation timed out"):
        result.get(timeout=0.2)
    # Not before its timeout (how soon after it is the machine's business).
    assert time.monotonic() - started >= 0.2
    assert result.state == "PENDING"


def test_revoked_pending_task_never_runs(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    runs: list[int] = []

    @app.task(name="bad.revocable")
    def revocable(n: int) -> int:
        runs.append(n)
        return n

    doomed = revocable.delay(1)
    doomed.revoke()
    assert doomed.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        doomed.get(timeout=1)
    with worker_factory():
        assert revocable.delay(2).get(timeout=10) == 2
    assert runs == [2]
    assert task_row(db, doomed.id)["status"] == "CANCELLED"


def test_unserializable_result_is_a_failure(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="bad.returns_object")
    def returns_object() -> object:
        return object()

    with worker_factory():
        result = returns_object.delay()
        with pytest.raises(EncodeError, match=r"return value of bad\.returns_object cannot be"):
            result.get(timeout=10)
    assert result.state == "FAILURE"
    assert task_row(db, result.id)["status"] == "FAILED"


def test_large_floats_stay_floats(app: Celery, worker_factory: Any) -> None:
    @app.task(name="bad.kind")
    def kind(value: Any) -> str:
        return type(value).__name__

    with worker_factory():
        assert kind.delay(1e16).get(timeout=10) == "float"


def test_statements_after_a_refused_one_run_on_the_same_connection(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    # One pooled connection, whose kept cursors serve every statement: an error leaves them
    # ready for the next one, with either row shape.
    app.conf.pool_max_size = 1

    @app.task(name="bad.again")
    def again() -> None: ...

    again.apply_async(task_id="kept-1")
    with pytest.raises(ValueError, match="'kept-1' already exists"):
        again.apply_async(task_id="kept-1")
    assert again.apply_async(task_id="kept-2").state == "PENDING"
    assert app.broker.pool.get_stats()["pool_size"] == 1
    with app.broker.pool.connection() as pooled:
        assert getattr(pooled, "_pgtasks_cursors", None)
    assert task_count(db) == 2
    # A caller's connection is left as it was given.
    with psycopg.connect(app.database_url, autocommit=False) as conn:
        again.apply_async(task_id="kept-3", connection=conn)
        conn.commit()
        assert not hasattr(conn, "_pgtasks_cursors")
    assert task_count(db) == 3
