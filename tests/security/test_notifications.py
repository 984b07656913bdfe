"""Notifications are hints (DESIGN invariant 11): anyone who can connect can send one, so a
notification may make a worker look, never run, cancel or kill anything its rows do not say."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from structlog.testing import capture_logs

from pgtasks import grants
from pgtasks.broker import cancel_channel, handoff_channel, notify_channel, result_channel
from pgtasks.contrib.testing import start_worker
from pgtasks.exceptions import TimeoutError as ResultTimeout
from pgtasks.result import AsyncResult
from tests.apps.harness import RecordedWaits, one, rows, status, wait_until
from tests.security.conftest import RAN, Roles


def parked(db: psycopg.Connection[Any], worker: str) -> bool:
    found = rows(db, "SELECT 1 FROM parked_workers WHERE worker = %s AND handoff", (worker,))
    return bool(found)


def notify(conn: psycopg.Connection[Any], channel: str, payload: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def forged_row(task_id: str, name: str, owner: str, args: list[Any]) -> str:
    """A hand-off notification carrying a whole row, as hand-offs once did."""
    body = json.dumps([args, {}])
    fields = [task_id, name, "celery", 0, 1, 0, 3, "application/json", "utf-8", body, None, {}]
    return json.dumps([*fields, 0, None, False, 0, 0, owner])


def test_a_handoff_notification_runs_nothing_the_table_does_not_hold(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """A role with no rights at all reads nothing, yet may NOTIFY any channel: it names the
    parked worker's channel (worker ids are no secret) and sends rows, ids and junk."""
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    with roles.connect(roles.nobody) as nobody, start_worker(worker_app, concurrency=1) as w:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            nobody.execute(
                sql.SQL("SELECT count(*) FROM {}.tasks").format(sql.Identifier(roles.schema))
            )
        channel = handoff_channel(roles.schema, w.id)
        wait_until(lambda: parked(db, w.id), what="the worker to park")
        # A waiting row of a queue the worker does not serve, which it must not take either.
        other = roles.app(roles.admin).send_task("proj.add", args=[9], queue="elsewhere")
        for payload in [
            forged_row("f0rged", "proj.dangerous", w.id, ["rm -rf"]),
            json.dumps(["f0rged"]),
            json.dumps([other.id]),
            json.dumps(["x"] * 100_000)[:7900],
            "{" * 7000,
            json.dumps({"id": "f0rged"}),
        ]:
            notify(nobody, channel, payload)
        # The wake-up channel too: it makes workers claim, and a claim finds nothing.
        notify(nobody, notify_channel(roles.schema), "celery")
        # The worker still serves its queue, having heard all of the above first.
        wait_until(lambda: parked(db, w.id), what="the worker to park again")
        assert producer.tasks["proj.echo"].delay("fine").get(timeout=10) == "fine"
    assert "proj.dangerous" not in RAN
    assert RAN.get("proj.add") is None
    assert status(db, other.id) == "PENDING"
    assert one(db, "SELECT count(*) AS n FROM tasks WHERE id = 'f0rged'")["n"] == 0


def test_only_granted_roles_may_call_the_schemas_functions(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """PostgreSQL lets PUBLIC execute every new function: none of the schema's is left so."""
    functions = rows(
        db,
        "SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')' AS f,"
        " has_function_privilege(%s, p.oid, 'EXECUTE') AS nobody,"
        " has_function_privilege(%s, p.oid, 'EXECUTE') AS producer"
        " FROM pg_proc AS p WHERE p.pronamespace = %s::regnamespace ORDER BY 1",
        (roles.nobody, roles.producer, roles.schema),
    )
    assert len(functions) == len(grants.FUNCTIONS)
    assert [f["f"] for f in functions if f["nobody"]] == []
    assert {f["f"] for f in functions if f["producer"]} == {
        f"{name}({args})" for name, args in grants.PRODUCER_FUNCTIONS
    }
    with roles.connect(roles.nobody) as nobody, pytest.raises(psycopg.errors.InsufficientPrivilege):
        nobody.execute(
            sql.SQL("SELECT {}.hand_off('x', 'proj.dangerous', 'celery')").format(
                sql.Identifier(roles.schema)
            )
        )


def test_a_producer_calling_hand_off_itself_gets_a_task_run_only_if_it_wrote_the_row(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """hand_off takes a parked worker and names an id to it; the worker claims that row. A
    producer that calls it without writing the row (or for a name it may not enqueue, which it
    cannot write) only makes the worker look."""
    worker_app = roles.app(roles.worker)
    producer = roles.app(roles.producer)
    with roles.connect(roles.producer) as conn, start_worker(worker_app, concurrency=1) as w:
        wait_until(lambda: parked(db, w.id), what="the worker to park")
        found = conn.execute("SELECT hand_off('f0rged', 'proj.dangerous', 'celery')").fetchone()
        assert found == (w.id,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO tasks (id, name, queue) VALUES ('f0rged', 'proj.dangerous', 'celery')"
            )
        wait_until(lambda: parked(db, w.id), what="the worker to park again")
        assert producer.tasks["proj.add"].delay(2).get(timeout=10) == 2
    assert "proj.dangerous" not in RAN


def test_a_cancel_notification_kills_only_what_its_row_says(
    roles: Roles, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """``NOTIFY pgtasks_c_<schema>, '<id> SIGKILL'`` from a role with no rights: the worker
    reads the row, which was not revoked, and the task runs to its end. A real revoke with
    terminate still stops it, with the signal the revoke stored."""
    release = tmp_path / "release"
    worker_app = roles.app(roles.worker)

    @worker_app.task(name="proj.wait")
    def wait_for(path: str) -> str:
        Path(path + ".started").touch()
        deadline = time.monotonic() + 30
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "done"

    with (
        roles.connect(roles.nobody) as nobody,
        capture_logs() as logs,
        start_worker(worker_app, pool="prefork", concurrency=1, lease=60.0) as w,
    ):
        sent = worker_app.tasks["proj.wait"].delay(str(release))
        wait_until(lambda: status(db, sent.id) == "RUNNING", what="the task to start")
        channel = cancel_channel(roles.schema)
        notify(nobody, channel, f"{sent.id} SIGKILL")
        wait_until(
            lambda: any(e["event"] == "worker.cancel_ignored" for e in logs),
            what="the worker to look at the row",
            details=lambda: str(logs),
        )
        release.touch()
        assert sent.get(timeout=15) == "done"
        assert status(db, sent.id) == "COMPLETED"

        # A revoke the row records is obeyed, with the signal it stored (not the one a
        # notification names).
        second_release = tmp_path / "second"
        second = worker_app.tasks["proj.wait"].delay(str(second_release))
        # Running, not only claimed: a revoke between the two discards the call unrun.
        wait_until(lambda: (tmp_path / "second.started").exists(), what="the task to start")
        worker_app.control.revoke(second.id, terminate=True, signal="SIGTERM")
        wait_until(lambda: status(db, second.id) == "CANCELLED", timeout=15, what="the stop")
        error = one(db, "SELECT error FROM attempts WHERE task_id = %s", (second.id,))["error"]
        assert error.endswith("stopped with SIGTERM"), error
        assert w.processed >= 1


def test_a_signal_written_with_the_row_is_never_the_one_a_revoke_uses(
    roles: Roles, db: psycopg.Connection[Any]
) -> None:
    """A producer enqueues a row whose headers already hold a ``revoke_signal``: a later
    revoke without terminate must not turn into a kill."""
    producer = roles.app(roles.producer)
    worker_app = roles.app(roles.worker)
    sent = producer.tasks["proj.add"].apply_async((1,), headers={"revoke_signal": "SIGKILL"})
    (claimed,) = worker_app.broker.claim("w1", ["celery"], 1, 30.0)
    assert claimed.id == sent.id
    assert worker_app.broker.revoke(sent.id) == "RUNNING"
    assert worker_app.broker.cancel_state("w1", sent.id, claimed.attempt) == (True, None)


def test_a_result_notification_makes_get_look_not_return(
    roles: Roles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result channel wakes ``get()``, which reads the result table: a forged notification
    (with a forged "result" in it) changes nothing."""
    producer = roles.app(roles.producer)
    sent = producer.tasks["proj.add"].delay(1)
    done = threading.Event()
    listening: list[RecordedWaits] = []
    listen = producer.broker.result_listen_connection

    def recorded_listen() -> Any:
        listening.append(RecordedWaits(listen()))
        return listening[-1]

    monkeypatch.setattr(producer.broker, "result_listen_connection", recorded_listen)

    def forge() -> None:
        with roles.connect(roles.nobody) as nobody:
            while not done.is_set():
                payload = json.dumps({"task_id": sent.id, "status": "SUCCESS", "result": 42})
                notify(nobody, result_channel(roles.schema), payload)
                time.sleep(0.05)

    thread = threading.Thread(target=forge, daemon=True)
    thread.start()
    try:
        with pytest.raises(ResultTimeout):
            AsyncResult(sent.id, app=producer).get(timeout=1.0)
    finally:
        done.set()
        thread.join()
    assert sent.state == "PENDING"
    # The forgeries reached get(): it was woken, looked, and went on waiting.
    assert any("notify" in conn.events for conn in listening), [c.events for c in listening]
