"""Chains, links and nested canvases against real PostgreSQL with a running worker."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from pgtasks import Celery, chain, chord, group
from pgtasks.canvas import Signature
from pgtasks.exceptions import ChordError
from pgtasks.result import GroupResult

TIMEOUT = 20


@pytest.fixture
def t(app: Celery) -> SimpleNamespace:
    """The tasks these tests compose, registered on the test app."""
    seen: list[Any] = []
    errors: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    @app.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="mul")
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="tsum")
    def tsum(values: list[int], extra: int = 0) -> int:
        return sum(values) + extra

    @app.task(name="const")
    def const(value: Any) -> Any:
        return value

    @app.task(name="boom", max_retries=0)
    def boom(*args: Any) -> None:
        raise ValueError("boom")

    @app.task(name="record")
    def record(*args: Any) -> Any:
        with lock:
            seen.append(args)
        return list(args)

    @app.task(name="note")
    def note(task_id: str) -> list[str]:
        return [task_id]

    @app.task(name="on_error")
    def on_error(request: Any, exc: BaseException, traceback: Any) -> None:
        with lock:
            errors.append((request.id, type(exc).__name__, str(exc)))

    return SimpleNamespace(
        add=add,
        mul=mul,
        tsum=tsum,
        const=const,
        boom=boom,
        record=record,
        on_error=on_error,
        note=note,
        seen=seen,
        errors=errors,
    )


def test_chain_passes_each_result_as_first_argument(worker_factory: Any, t: Any) -> None:
    # Given a chain of three steps
    res = (t.add.s(2, 2) | t.mul.s(10) | t.add.s(1)).apply_async()
    # When a worker runs it
    with worker_factory():
        # Then each step got the previous result first: ((2 + 2) * 10) + 1
        assert res.get(timeout=TIMEOUT) == 41
    # And the result handle leads back through the earlier steps
    assert res.parent is not None and res.parent.get(timeout=TIMEOUT) == 40
    assert res.parent.parent is not None and res.parent.parent.get(timeout=TIMEOUT) == 4
    assert [c.id for c in res.parent.parent.children] == [res.parent.id]


def test_chain_arguments_from_apply_async_go_to_the_first_step(worker_factory: Any, t: Any) -> None:
    res = chain(t.add.s(1), t.mul.s(3)).apply_async((4,))
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == 15


def test_immutable_step_ignores_the_previous_result(worker_factory: Any, t: Any) -> None:
    res = (t.add.s(1, 1) | t.const.si("fixed") | t.record.s()).delay()
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == ["fixed"]


def test_link_gets_the_result_and_link_error_gets_request_exc_traceback(
    worker_factory: Any, t: Any
) -> None:
    # Given a task with a callback, and a failing one with two errbacks (Celery's two styles)
    ok = t.add.apply_async((3, 4), link=t.record.s("after"))
    failing = t.boom.s(1)
    failing.link_error(t.on_error.s())
    failing.link_error(t.note.s())
    bad = failing.apply_async()
    with worker_factory():
        assert ok.get(timeout=TIMEOUT) == 7
        with pytest.raises(ValueError, match="boom"):
            bad.get(timeout=TIMEOUT)
        callbacks = {c.id: c for c in ok.children}
        (callback,) = callbacks.values()
        # Then the link ran with the result first, then its own partial arguments
        assert callback.get(timeout=TIMEOUT) == [7, "after"]
        # And the one-argument errback was enqueued with the failed task's id
        (errback,) = bad.children
        assert errback.get(timeout=TIMEOUT) == [bad.id]
    # And the (request, exc, traceback) errback ran in the worker with the real exception
    assert t.errors == [(bad.id, "ValueError", "boom")]


def test_link_error_is_not_called_on_retries(worker_factory: Any, app: Celery, t: Any) -> None:
    attempts: list[int] = []

    @app.task(name="flaky", bind=True, max_retries=2)
    def flaky(self: Any) -> str:
        attempts.append(self.request.retries)
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return "done"

    sig = flaky.s()
    sig.link_error(t.note.s())
    res = sig.apply_async()
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == "done"
    assert attempts == [0, 1, 2]
    assert res.children == []


def test_failing_chain_step_stops_the_chain_and_fails_its_result(
    worker_factory: Any, t: Any
) -> None:
    res = (t.add.s(1, 1) | t.boom.s() | t.record.s()).apply_async()
    # Celery records the failure for the later steps too, so waiting on the chain ends
    with worker_factory(), pytest.raises(ValueError, match="boom"):
        res.get(timeout=TIMEOUT)
    assert t.seen == []


def test_group_inside_chain_becomes_a_chord(worker_factory: Any, t: Any) -> None:
    # Given group | task inside a chain (Celery upgrades it to a chord)
    res = (t.add.s(1, 1) | group(t.mul.s(2), t.mul.s(3)) | t.tsum.s()).apply_async()
    with worker_factory():
        # Then the group members got 2 and the body got their results in order
        assert res.get(timeout=TIMEOUT) == 2 * 2 + 2 * 3


def test_group_as_the_last_step_of_a_chain(worker_factory: Any, t: Any) -> None:
    res = (t.add.s(2, 3) | group(t.mul.s(2), t.add.s(10))).apply_async()
    assert isinstance(res, GroupResult)
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == [10, 15]


def test_chains_inside_a_group(worker_factory: Any, t: Any) -> None:
    g = group(t.add.s(1, 1) | t.mul.s(10), t.add.s(2, 2) | t.mul.s(100), t.const.s(7))
    res = g.apply_async()
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == [20, 400, 7]


def test_chain_after_a_chord_continues_with_the_body_result(worker_factory: Any, t: Any) -> None:
    res = (chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()) | t.mul.s(10)).apply_async()
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == 60


def test_chord_in_a_group_header(worker_factory: Any, t: Any) -> None:
    inner = chord([t.add.s(1, 1), t.add.s(1, 2)], t.tsum.s())
    res = chord([inner, t.const.s(100)], t.tsum.s()).apply_async()
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == 105


def test_failed_inner_chord_fails_the_outer_one(worker_factory: Any, t: Any) -> None:
    inner = chord([t.add.s(1, 1), t.boom.s()], t.tsum.s())
    res = chord([inner, t.const.s(100)], t.tsum.s()).apply_async()
    with worker_factory(), pytest.raises(ChordError):
        res.get(timeout=TIMEOUT)


def test_signature_options_merge_and_queue(worker_factory: Any, app: Celery, t: Any) -> None:
    # Given options on the signature and at apply time: apply-time options win
    sig = t.add.s(1, 2).set(queue="other", priority=3)
    res = sig.apply_async(priority=5)
    row = app.broker.get_task(res.id)
    assert row is not None and row["queue"] == "other" and row["priority"] == 5
    with worker_factory(queues=["other"]):
        assert res.get(timeout=TIMEOUT) == 3


def test_signature_travels_as_json(worker_factory: Any, t: Any) -> None:
    import json

    sig = t.add.s(2).set(countdown=0)
    again = Signature.from_dict(json.loads(json.dumps(sig)))
    assert again == sig
    res = again.delay(5)
    with worker_factory():
        assert res.get(timeout=TIMEOUT) == 7


def test_map_starmap_and_chunks(worker_factory: Any, t: Any) -> None:
    mapped = t.const.map([1, 2, 3]).delay()
    starred = t.add.starmap([(1, 2), (3, 4)]).delay()
    chunked = t.add.chunks([(i, i) for i in range(5)], 2).apply_async()
    with worker_factory():
        assert mapped.get(timeout=TIMEOUT) == [1, 2, 3]
        assert starred.get(timeout=TIMEOUT) == [3, 7]
        assert chunked.get(timeout=TIMEOUT) == [[0, 2], [4, 6], [8]]


def test_follow_ups_are_written_only_when_the_fenced_completion_is(
    app: Celery, t: Any, db: psycopg.Connection[Any]
) -> None:
    """A worker that lost its lease must not enqueue the next step, a callback, or count a
    chord member: the follow-ups share the fenced write's fate."""
    from pgtasks.records import Success
    from pgtasks.serialization import encode
    from pgtasks.worker.followups import chord_body_builder

    # Given a chain and a chord member, both claimed by worker "a"
    first = (t.add.s(1, 1) | t.mul.s(2)).apply_async().parent
    chord_res = chord([t.add.s(1, 2)], t.tsum.s()).apply_async()
    claimed = app.broker.claim("a", ["celery"], 10, 30.0)
    assert {c.id for c in claimed} == {first.id, chord_res.parent.results[0].id}
    # And then reclaimed by worker "b" (a's lease ran out)
    db.execute("UPDATE tasks SET claimed_by = 'b'")

    # When "a" writes its completions with their follow-ups
    from pgtasks.worker.execute import Job
    from pgtasks.worker.followups import after_success

    successes = []
    for row in claimed:
        job = Job(
            id=row.id, name=row.name, attempt=row.attempt, retries=0, max_retries=None,
            args=(), kwargs={}, queue=row.queue, headers=row.headers, eta=None, expires=None,
            hostname="a", store_result=True, result_serializer="json",
        )  # fmt: skip
        follow = after_success(app, job, 2)["followups"]
        successes.append(
            Success(row.id, row.attempt, True, "application/json", encode(2, "json").data, None,
                    followups=follow)
        )  # fmt: skip
    written = app.broker.finalise("a", successes, chord_body_builder(app))

    # Then nothing was written: no completion, no next step, no chord count
    assert written == {}
    (count,) = db.execute("SELECT count(*) FROM tasks").fetchone() or (0,)
    assert count == 2
    (remaining,) = db.execute("SELECT remaining FROM chords").fetchone() or (None,)
    assert remaining == 1

    # And the owner's own write of the same outcomes does enqueue them, exactly once
    written = app.broker.finalise("b", successes, chord_body_builder(app))
    assert set(written.values()) == {"COMPLETED"}
    names = sorted(r[0] for r in db.execute("SELECT name FROM tasks WHERE status = 'PENDING'"))
    assert names == ["mul", "tsum"]
    assert db.execute("SELECT count(*) FROM chords").fetchone() == (0,)


def test_group_result_of_a_canvas_is_a_group_result(t: Any) -> None:
    res = group(t.add.s(1, 1), t.add.s(2, 2)).apply_async()
    assert isinstance(res, GroupResult) and len(res) == 2


def test_chain_and_chord_under_the_prefork_pool(worker_factory: Any, t: Any) -> None:
    """Follow-ups are built in the child process and travel back with the outcome."""
    chained = (t.add.s(1, 2) | t.mul.s(3)).apply_async()
    chorded = chord([t.add.s(i, i) for i in range(5)], t.tsum.s(extra=1)).apply_async()
    with worker_factory(pool="prefork", concurrency=2):
        assert chained.get(timeout=TIMEOUT) == 9
        assert chorded.get(timeout=TIMEOUT) == 21
