"""apply_many writes the same rows as one delay() per call, for awkward values too: unicode and
quotes in arguments, ids and queue names, binary payloads, absolute and relative times."""

from __future__ import annotations

import datetime as dt
import importlib.util
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from pgtasks.exceptions import EncodeError

COLUMNS = (
    "name, queue, priority, content_type, content_encoding, payload::text, payload_raw, "
    "headers - 'argsrepr' - 'kwargsrepr' AS headers, max_retries, status, "
    "headers->>'argsrepr' AS argsrepr, headers->>'kwargsrepr' AS kwargsrepr"
)

AWKWARD: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("plain",), {}),
    (("é ü 漢字 🎉", "quote ' \" back\\slash", "new\nline\ttab"), {"k": "{,}"}),
    ((1e16, -0.0, 2**62, [1, [2, [3]]]), {"nested": {"a": None, "b": True}}),
    ((dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),), {"raw": b"\x00\xff"}),
]


def rows(db: psycopg.Connection[Any], ids: list[str]) -> list[tuple[Any, ...]]:
    found = {
        r[0]: r[1:]
        for r in db.execute(f"SELECT id, {COLUMNS} FROM tasks WHERE id = ANY(%s)", [ids])
    }
    return [found[i] for i in ids]


@pytest.mark.parametrize(
    "countdown",
    # Without times relative to the database clock the rows go by COPY; with them, by INSERT.
    [None, 60],
    ids=["copy", "insert"],
)
def test_apply_many_rows_match_single_enqueues(
    app: Celery, db: psycopg.Connection[Any], countdown: int | None
) -> None:
    @app.task(name="bulk.echo", max_retries=7)
    def echo(*args: Any, **kwargs: Any) -> None:
        return None

    options = {"queue": "q 'quoted' ünï", "priority": 5, "countdown": countdown}
    singles = [
        echo.apply_async(args, kwargs, **options).id
        for args, kwargs in AWKWARD  # type: ignore[arg-type]
    ]
    many = [r.id for r in echo.apply_many(AWKWARD, **options)]
    assert rows(db, many) == rows(db, singles)
    # Both put run_at on the database clock: now, or a minute ahead.
    low, high = ("-10 s", "0 s") if countdown is None else ("50 s", "70 s")
    timed = db.execute(
        "SELECT bool_and(run_at BETWEEN now() + %s::interval AND now() + %s::interval) "
        "FROM tasks WHERE id = ANY(%s)",
        [low, high, many + singles],
    ).fetchone()
    assert timed == (True,)


def test_apply_many_refuses_one_task_id_for_many_calls(app: Celery) -> None:
    @app.task(name="bulk.one_id")
    def one_id(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="task_id"):
        one_id.apply_many([(1,), (2,)], task_id="same")


def test_apply_many_absolute_times_and_expiry(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="bulk.timed")
    def timed(x: int) -> int:
        return x

    eta = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    expires = eta + dt.timedelta(days=1)
    ids = [r.id for r in timed.apply_many([(1,), (2,)], eta=eta, expires=expires)]
    got = db.execute("SELECT run_at, expires_at FROM tasks WHERE id = ANY(%s)", [ids]).fetchall()
    assert got == [(eta, expires), (eta, expires)]
    relative = timed.apply_many([(3,)], expires=30)[0].id
    row = db.execute(
        "SELECT expires_at BETWEEN now() + interval '20 s' AND now() + interval '40 s' "
        "FROM tasks WHERE id = %s",
        [relative],
    ).fetchone()
    assert row == (True,)


@pytest.mark.skipif(importlib.util.find_spec("msgpack") is None, reason="msgpack not installed")
def test_apply_many_binary_payloads_round_trip(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="bulk.packed", serializer="msgpack")
    def packed(x: Any) -> None:
        return None

    single = packed.delay(b"\x00\x01\xfe\xff").id
    many = packed.apply_many([(b"\x00\x01\xfe\xff",)])[0].id
    assert rows(db, [many]) == rows(db, [single])
    raw = db.execute("SELECT payload_raw FROM tasks WHERE id = %s", [many]).fetchone()
    assert raw is not None and bytes(raw[0]).startswith(b"\x92")


def test_a_bad_call_late_in_a_large_batch_writes_nothing(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="bulk.late")
    def late(value: Any) -> None: ...

    # The rows before it have already reached the server when the bad one is built.
    calls: list[tuple[Any, ...]] = [("x" * 200,)] * 5000 + [(float("nan"),)]
    with pytest.raises(EncodeError, match="NaN"):
        late.apply_many(calls)
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)
    assert len(late.apply_many([("fine",)] * 3)) == 3
