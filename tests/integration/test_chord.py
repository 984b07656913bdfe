"""Chords: the counter in PostgreSQL, the body enqueued once with the header's results in order."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgtasks import Celery, chord, group
from pgtasks.exceptions import ChordError
from pgtasks.records import Success
from pgtasks.worker.followups import chord_body_builder
from tests.apps.harness import expire_lease, one, wait_until
from tests.conftest import running_worker

TIMEOUT = 60


def make_app(pg_dsn: str, schema: str, bodies: list[Any]) -> Celery:
    """An app with the chord tasks; each worker gets its own app (own pool, as on separate
    hosts)."""
    app = Celery("chords", broker=pg_dsn, schema_name=schema, lease_seconds=5.0, poll_interval=0.05)

    @app.task(name="square")
    def square(x: int) -> int:
        # Jitter so members finish out of order and completions race.
        time.sleep(random.random() * 0.01)
        return x * x

    @app.task(name="fail_on", max_retries=0)
    def fail_on(x: int, bad: int) -> int:
        if x == bad:
            raise KeyError(f"member {x}")
        return x

    @app.task(name="collect")
    def collect(values: list[Any], tag: str = "") -> list[Any]:
        bodies.append((tag, values))
        return values

    @app.task(name="count_errors")
    def count_errors(task_id: str) -> str:
        bodies.append(("errback", task_id))
        return task_id

    return app


def unfinished(db: psycopg.Connection[Any]) -> int:
    """Rows that may still run: waiting, blocked or running."""
    return int(
        one(
            db,
            "SELECT count(*) AS n FROM tasks WHERE status IN ('PENDING', 'BLOCKED', 'RUNNING')",
        )["n"]
    )


@pytest.fixture
def bodies() -> list[Any]:
    """Every body call, in the order the workers ran them."""
    return []


@pytest.fixture
def capp(pg_dsn: str, schema: str, bodies: list[Any]) -> Iterator[Celery]:
    """The app the test applies canvases with."""
    app = make_app(pg_dsn, schema, bodies)
    try:
        yield app
    finally:
        app.close()


@contextlib.contextmanager
def workers(pg_dsn: str, schema: str, bodies: list[Any], n: int) -> Iterator[None]:
    """``n`` workers on the same schema, each with its own app, pool and threads."""
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            app = make_app(pg_dsn, schema, bodies)
            stack.enter_context(running_worker(app, concurrency=4))
        yield


def test_chord_body_runs_once_with_ordered_results_under_concurrent_workers(
    pg_dsn: str, schema: str, capp: Celery, bodies: list[Any], db: psycopg.Connection[Any]
) -> None:
    # Given a 50-member chord
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    res = chord(square.s(i) for i in range(50))(collect.s(tag="body"))
    # When three workers race through the header
    with workers(pg_dsn, schema, bodies, 3):
        values = res.get(timeout=TIMEOUT)
        # Then the body got every result, in header order
        assert values == [i * i for i in range(50)]
        # And once only: one body row, one body call, no counter left, once no row is left
        # that could still run (a finished row never runs again)
        wait_until(lambda: unfinished(db) == 0, timeout=TIMEOUT, what="every row to finish")
    assert [b for b in bodies if b[0] == "body"] == [("body", values)]
    assert db.execute("SELECT count(*) FROM tasks WHERE name = 'collect'").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM chords").fetchone() == (0,)
    # And the header's results are the body result's parent
    assert res.parent.join(timeout=TIMEOUT) == values


def test_many_chords_at_once(
    pg_dsn: str, schema: str, capp: Celery, bodies: list[Any], db: psycopg.Connection[Any]
) -> None:
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    results = [
        chord([square.s(i), square.s(i + 1), square.s(i + 2)], collect.s(tag=str(i))).delay()
        for i in range(20)
    ]
    with workers(pg_dsn, schema, bodies, 3):
        for i, r in enumerate(results):
            assert r.get(timeout=TIMEOUT) == [i * i, (i + 1) ** 2, (i + 2) ** 2]
    assert sorted(int(tag) for tag, _ in bodies) == list(range(20))


def test_failing_member_fails_the_chord_and_skips_the_body(
    pg_dsn: str, schema: str, capp: Celery, bodies: list[Any], db: psycopg.Connection[Any]
) -> None:
    # Given a chord whose member 3 fails, with an errback on the body
    fail_on, collect = capp.tasks["fail_on"], capp.tasks["collect"]
    body = collect.s(tag="body")
    body.link_error(capp.tasks["count_errors"].s())
    res = chord([fail_on.s(i, 3) for i in range(6)], body).apply_async()
    with workers(pg_dsn, schema, bodies, 2):
        # Then, as in Celery, get() raises the failed member's own error (through .parent)
        with pytest.raises(KeyError, match="member 3"):
            res.get(timeout=TIMEOUT)
        # And the body's result becomes a ChordError naming the culprit
        with pytest.raises(ChordError, match=r"Dependency .* raised KeyError"):
            res.get(timeout=TIMEOUT, follow_parents=False)
        # And the body's errback is applied with the body's id
        wait_until(
            lambda: any(b[0] == "errback" for b in bodies), timeout=TIMEOUT, what="the errback"
        )
    # And the body never ran
    assert [b for b in bodies if b[0] == "body"] == []
    assert ("errback", res.id) in bodies
    assert res.parent.failed() and res.parent.completed_count() == 5
    assert db.execute("SELECT count(*) FROM chords").fetchone() == (0,)


def test_chord_call_forms_and_partial_arguments(
    pg_dsn: str, schema: str, capp: Celery, bodies: list[Any]
) -> None:
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    first = chord([square.s(2), square.s(3)], collect.s(tag="a")).apply_async()
    second = chord(group(square.s(4), square.s(5)))(collect.s(tag="b"))
    piped = (group(square.s(6), square.s(7)) | collect.s(tag="c")).delay()
    # chord(header) with arguments given at apply time: the header members take them
    partial = chord([square.s(), square.s()], collect.s(tag="d")).apply_async((9,))
    with workers(pg_dsn, schema, bodies, 1):
        assert first.get(timeout=TIMEOUT) == [4, 9]
        assert second.get(timeout=TIMEOUT) == [16, 25]
        assert piped.get(timeout=TIMEOUT) == [36, 49]
        assert partial.get(timeout=TIMEOUT) == [81, 81]


def test_empty_header_applies_the_body_at_once(
    pg_dsn: str, schema: str, capp: Celery, bodies: list[Any]
) -> None:
    res = chord([], capp.tasks["collect"].s(tag="empty")).apply_async()
    with workers(pg_dsn, schema, bodies, 1):
        assert res.get(timeout=TIMEOUT) == []


def test_header_and_counter_are_written_together(capp: Celery, db: psycopg.Connection[Any]) -> None:
    """A transaction that rolls back leaves neither members nor counter."""
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    with psycopg.connect(capp.database_url) as conn:
        chord([square.s(1), square.s(2)], collect.s()).apply_async(connection=conn)
        conn.rollback()
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM chords").fetchone() == (0,)


def _claimed_successes(capp: Celery) -> list[Success]:
    """Claim the chord's two members and describe each one's success (value 1), with its
    follow-ups, as a worker would before finishing it."""
    from pgtasks.serialization import encode
    from pgtasks.worker.execute import Job
    from pgtasks.worker.followups import after_success

    claimed = capp.broker.claim("w", ["celery"], 10, 30.0)
    assert len(claimed) == 2
    items = []
    for row in claimed:
        job = Job(
            id=row.id, name=row.name, attempt=row.attempt, retries=0, max_retries=None,
            args=(), kwargs={}, queue=row.queue, headers=row.headers, eta=None, expires=None,
            hostname="w", store_result=True, result_serializer="json",
        )  # fmt: skip
        follow = after_success(capp, job, 1)["followups"]
        items.append(
            Success(row.id, row.attempt, True, "application/json", encode(1, "json").data, None,
                    followups=follow)
        )  # fmt: skip
    return items


def test_concurrent_last_members_fire_the_body_once(
    capp: Celery, db: psycopg.Connection[Any]
) -> None:
    """Two transactions finishing the last two members at the same moment: the row lock on
    the counter orders them, so exactly one sees zero."""
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    chord([square.s(1), square.s(2)], collect.s()).apply_async()
    items = _claimed_successes(capp)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def finish(item: Success) -> None:
        try:
            barrier.wait()
            capp.broker.finalise("w", [item], chord_body_builder(capp))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(i,)) for i in items]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert db.execute("SELECT count(*) FROM tasks WHERE name = 'collect'").fetchone() == (1,)
    (payload,) = db.execute(
        "SELECT payload::text FROM tasks WHERE name = 'collect'"
    ).fetchone() or (None,)
    assert payload is not None and payload.replace(" ", "").startswith("[[[1,1]")


def test_member_that_expires_before_running_still_counts(
    pg_dsn: str, schema: str, capp: Celery, bodies: list[Any], db: psycopg.Connection[Any]
) -> None:
    """A member settled without running (here: expired) is a failed member, so the chord
    ends with a ChordError instead of waiting forever."""
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    res = chord([square.s(1), square.s(2).set(expires=0.0)], collect.s()).apply_async()
    expired = "SELECT bool_and(expires_at < now()) AS past FROM tasks WHERE expires_at IS NOT NULL"
    wait_until(lambda: one(db, expired)["past"], what="the database clock to pass the expiry")
    with workers(pg_dsn, schema, bodies, 1), pytest.raises(ChordError):
        res.get(timeout=TIMEOUT, follow_parents=False)
    assert bodies == []


def test_member_dead_lettered_by_the_reclaimer_still_counts(
    capp: Celery, db: psycopg.Connection[Any]
) -> None:
    """A member whose workers all died is dead-lettered by the reclaimer, not by a worker: the
    chord counts it in the same transaction and records its error."""
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    res = chord([square.s(1), square.s(2)], collect.s()).apply_async()
    claimed = capp.broker.claim("gone@host", ["celery"], 10, 30.0)
    assert len(claimed) == 2
    for row in claimed:
        expire_lease(db, row.id)
    reclaimed = capp.broker.reclaim(1, chord_ready=chord_body_builder(capp))
    assert {r["status"] for r in reclaimed} == {"DEAD"}
    assert all(r["chord"] for r in reclaimed)
    with pytest.raises(ChordError, match="worker lost"):
        res.get(timeout=5, follow_parents=False)
    assert db.execute("SELECT count(*) FROM chords").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM tasks WHERE name = 'collect'").fetchone() == (0,)


def test_member_whose_outcome_is_gone_fails_the_chord_saying_so(
    capp: Celery, db: psycopg.Connection[Any]
) -> None:
    """A member whose row and result are both gone when the last member finishes (its result
    forgotten, its row deleted at once by a worker keeping no finished rows) fails the chord
    with a ChordError that names it and says its outcome is gone."""
    square, collect = capp.tasks["square"], capp.tasks["collect"]
    res = chord([square.s(1), square.s(2)], collect.s()).apply_async()
    first, last = _claimed_successes(capp)
    capp.broker.finalise("w", [first], chord_body_builder(capp))
    db.execute("DELETE FROM results WHERE task_id = %s", (first.id,))
    db.execute("DELETE FROM tasks WHERE id = %s", (first.id,))
    capp.broker.finalise("w", [last], chord_body_builder(capp))
    with pytest.raises(ChordError, match=f"{first.id}.*outcome is gone"):
        res.get(timeout=5, follow_parents=False)
    assert db.execute("SELECT count(*) FROM tasks WHERE name = 'collect'").fetchone() == (0,)
