"""What a task's outcome triggers (a link, an errback, a chain's next step, a chord's body) is
enqueued by a worker, but under the rules of the producer that sent the original: a producer
gets nothing through a follow-up that it could not enqueue itself (DESIGN invariant 12)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgtasks import chain, chord, group
from pgtasks.contrib.testing import start_worker
from pgtasks.exceptions import NotPermitted
from tests.apps.harness import one, rows, status, wait_until
from tests.security.conftest import RAN, Roles


def dead_letters(db: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return rows(db, "SELECT name, source, error FROM tasks WHERE status = 'DEAD' ORDER BY name")


def refused(db: psycopg.Connection[Any], producer: str) -> dict[str, Any]:
    (row,) = dead_letters(db)
    assert row["name"] == "proj.dangerous"
    assert row["source"] == producer
    assert row["error"].startswith(f"NotPermitted: {producer} may not enqueue proj.dangerous")
    return row


@pytest.mark.parametrize("how", ["link", "link_error", "chain", "chord body"])
def test_a_follow_up_the_producer_may_not_enqueue_is_dead_lettered_not_run(
    roles: Roles, db: psycopg.Connection[Any], how: str
) -> None:
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    add, echo = producer.tasks["proj.add"], producer.tasks["proj.echo"]
    dangerous = producer.signature("proj.dangerous", args=("x",), immutable=True)
    if how == "link":
        sent = add.apply_async((1,), link=dangerous)
    elif how == "link_error":
        sent = echo.apply_async(("boom",), link_error=dangerous)
    elif how == "chain":
        sent = chain(add.s(1), dangerous).apply_async()
    else:
        sent = chord([add.s(1), add.s(2)], dangerous).apply_async()
    with start_worker(worker_app, concurrency=1):
        wait_until(lambda: dead_letters(db), what="the follow-up to be written")
    assert "proj.dangerous" not in RAN
    refused(db, roles.producer)
    assert sent is not None


def test_follow_ups_the_producer_may_enqueue_run_with_its_source(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    add, echo = producer.tasks["proj.add"], producer.tasks["proj.echo"]
    linked = add.apply_async((1,), link=echo.s())
    steps = chain(add.s(2), echo.s()).apply_async()
    joined = chord([add.s(3), add.s(4)], echo.s()).apply_async()
    with start_worker(worker_app, concurrency=1):
        assert steps.get(timeout=10) == 2
        assert joined.get(timeout=10) == [3, 4]
        wait_until(lambda: len(RAN.get("proj.echo", [])) == 3, what="the linked call")
    assert linked.get(timeout=10) == 1
    assert dead_letters(db) == []
    sources = {r["source"] for r in rows(db, "SELECT source FROM tasks")}
    assert sources == {roles.producer}


def test_a_chord_s_body_follows_the_chord_s_creator_not_its_last_member(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """A producer writes a chord counter naming a body it may not enqueue, and its own
    allowed task as the only member: the body is held to the chord creator's rules."""
    worker_app = roles.app(roles.worker)
    producer = roles.app(roles.producer)
    member = producer.tasks["proj.add"].apply_async((1,), headers={"chord": "c1"}, task_id="m1")
    with roles.connect(roles.producer) as conn:
        conn.execute(
            "INSERT INTO chords (id, member_ids, remaining, body) VALUES ('c1', '{m1}', 1, %s)",
            ('{"task": "proj.dangerous", "args": [], "kwargs": {}, "options": {}}',),
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO chords (id, member_ids, remaining, body, source)"
                " VALUES ('c2', '{m1}', 1, '{}', %s)",
                (roles.worker,),
            )
    with start_worker(worker_app, concurrency=1):
        assert member.get(timeout=10) == 1
        wait_until(lambda: dead_letters(db), what="the chord's body to be written")
    assert "proj.dangerous" not in RAN
    refused(db, roles.producer)


def test_a_task_that_is_not_a_member_counts_for_no_chord(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """A row's ``chord`` header is its producer's to write: a task of another producer that
    names the victim's chord must not bring the victim's body forward."""
    victim = roles.app(roles.victim)
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    charge = victim.tasks["billing.charge"]
    result = chord([charge.s(1), charge.s(2)], charge.s()).apply_async()
    (counter,) = rows(db, "SELECT id, remaining FROM chords")
    forged = [
        producer.tasks["proj.add"].apply_async((n,), headers={"chord": counter["id"]})
        for n in range(3)
    ]
    # Only the forged rows can run: the victim's members wait in a queue nobody serves yet.
    db.execute("UPDATE tasks SET queue = 'later' WHERE name = 'billing.charge'")
    with start_worker(worker_app, concurrency=1):
        for sent in forged:
            sent.get(timeout=10)
    assert one(db, "SELECT remaining FROM chords")["remaining"] == 2
    assert "billing.charge" not in RAN
    db.execute("UPDATE tasks SET queue = 'celery' WHERE name = 'billing.charge'")
    with start_worker(worker_app, concurrency=1):
        assert result.get(timeout=10) == [1, 2]


def test_a_producer_cannot_apply_a_canvas_holding_a_task_it_may_not_enqueue(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    producer = roles.app(roles.producer)
    add = producer.tasks["proj.add"]
    dangerous = producer.signature("proj.dangerous", args=("x",))
    for canvas in (
        group(add.s(1), dangerous),
        chord([dangerous], add.s()),
        chain(dangerous, add.s()),
    ):
        with pytest.raises(NotPermitted):
            canvas.apply_async()
    assert rows(db, "SELECT id FROM tasks") == []
    assert status is not None


def test_a_failing_chain_decides_results_only_for_its_own_later_steps(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """A failed chain records a failure for its later steps, whose ids its headers name: a
    producer naming another producer's task there must not overwrite that task's result."""
    victim = roles.app(roles.victim)
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    theirs = victim.tasks["billing.charge"].delay(5)
    echo = producer.tasks["proj.echo"]
    doomed = chain(echo.s("boom"), echo.s().set(task_id=theirs.id), echo.s()).apply_async()
    with start_worker(worker_app, concurrency=1):
        assert victim.AsyncResult(theirs.id).get(timeout=10) == 5
        with pytest.raises(ValueError):
            doomed.get(timeout=10)
    assert victim.AsyncResult(theirs.id).get(timeout=10) == 5
    assert one(db, "SELECT state FROM results WHERE task_id = %s", (theirs.id,))["state"] == (
        "SUCCESS"
    )
