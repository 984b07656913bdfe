"""Celery's signals from real workers: publish, task, worker and prefork-child signals, with the
senders and keyword arguments Celery sends."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtasks import Celery, signals
from pgtasks.signals import Signal
from pgtasks.worker import Worker


class Recorder:
    """A receiver keeping each call's keyword arguments; ``wait`` blocks until enough came."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def __call__(self, **kwargs: Any) -> None:
        with self._cond:
            self.calls.append(kwargs)
            self._cond.notify_all()

    def wait(self, count: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= count, timeout), (
                f"expected {count} calls, got {len(self.calls)}"
            )
            return list(self.calls)


@pytest.fixture
def connect() -> Iterator[Callable[..., Recorder]]:
    """``connect(signal, sender=None)``: a Recorder connected for the test only."""
    made: list[tuple[Signal, Recorder, Any]] = []

    def factory(signal: Signal, sender: Any = None) -> Recorder:
        recorder = Recorder()
        signal.connect(recorder, sender=sender, weak=False)
        made.append((signal, recorder, sender))
        return recorder

    yield factory
    for signal, recorder, sender in made:
        signal.disconnect(recorder, sender=sender)


def test_publish_signals_on_delay_with_celery_arguments(
    app: Celery, db: psycopg.Connection[Any], connect: Callable[..., Recorder]
) -> None:
    @app.task(name="sig.add")
    def add(x: int, y: int) -> int:
        return x + y

    def add_trace_header(headers: dict[str, Any], **kwargs: Any) -> None:
        headers["trace_id"] = "t-123"

    before = connect(signals.before_task_publish, sender="sig.add")
    after = connect(signals.after_task_publish)
    signals.before_task_publish.connect(add_trace_header, weak=False)
    try:
        result = add.apply_async((2, 3), queue="io", priority=4)
    finally:
        signals.before_task_publish.disconnect(add_trace_header)

    (call,) = before.calls
    assert call["sender"] == "sig.add"
    assert call["body"][:2] == ((2, 3), {})
    assert call["exchange"] == ""
    assert call["routing_key"] == "io"
    assert call["headers"]["id"] == result.id
    assert call["headers"]["task"] == "sig.add"
    assert call["properties"]["priority"] == 4
    assert {"declare", "retry_policy"} <= set(call)
    (done,) = after.calls
    assert (done["sender"], done["routing_key"], done["body"][0]) == ("sig.add", "io", (2, 3))
    assert (done["headers"]["task"], done["headers"]["trace_id"]) == ("sig.add", "t-123")

    (headers,) = db.execute("SELECT headers FROM tasks WHERE id = %s", (result.id,)).fetchone()
    assert headers["trace_id"] == "t-123"  # a receiver's header reaches the row
    assert "task" not in headers  # Celery's own header fields are not copied into it


def test_apply_many_sends_publish_signals_per_call(
    app: Celery, connect: Callable[..., Recorder]
) -> None:
    @app.task(name="sig.many")
    def many(x: int) -> int:
        return x

    before = connect(signals.before_task_publish)
    after = connect(signals.after_task_publish)
    results = many.apply_many([(1,), (2,), (3,)])
    assert [c["headers"]["id"] for c in before.calls] == [r.id for r in results]
    assert [c["body"][0] for c in after.calls] == [(1,), (2,), (3,)]


def test_task_signals_in_a_threads_worker(
    app: Celery, worker_factory: Any, connect: Callable[..., Recorder]
) -> None:
    @app.task(name="sig.ok")
    def ok(x: int) -> int:
        return x * 2

    @app.task(name="sig.fail")
    def fail() -> None:
        raise KeyError("missing")

    @app.task(name="sig.retry_once", bind=True, max_retries=3)
    def retry_once(self: Any) -> str:
        if self.request.retries == 0:
            raise self.retry(exc=OSError("flaky"), countdown=0)
        return "second time"

    prerun = connect(signals.task_prerun)
    postrun = connect(signals.task_postrun)
    success = connect(signals.task_success)
    failure = connect(signals.task_failure, sender=fail)
    retry = connect(signals.task_retry)
    worker_init = connect(signals.worker_init)
    worker_ready = connect(signals.worker_ready)
    worker_shutdown = connect(signals.worker_shutdown)

    with worker_factory() as worker:
        assert [c["sender"] for c in worker_init.calls] == [worker]
        assert [c["sender"] for c in worker_ready.calls] == [worker]
        results = [ok.delay(21), fail.delay(), retry_once.delay()]
        assert results[0].get(timeout=15) == 42
        assert results[2].get(timeout=15) == "second time"
        with pytest.raises(KeyError):
            results[1].get(timeout=15)
        postrun.wait(4)
    assert [c["sender"] for c in worker_shutdown.calls] == [worker]

    by_task = {c["task_id"]: c for c in prerun.calls}
    assert by_task[results[0].id]["task"] is ok
    assert by_task[results[0].id]["args"] == (21,)
    assert sorted(str(c["result"]) for c in success.calls) == ["42", "second time"]
    assert {c["sender"] for c in success.calls} == {ok, retry_once}

    (failed,) = failure.calls
    assert failed["task_id"] == results[1].id
    assert isinstance(failed["exception"], KeyError)
    assert "KeyError" in str(failed["einfo"])

    (retried,) = retry.calls
    assert retried["sender"] is retry_once
    assert retried["request"].id == results[2].id
    assert isinstance(retried["einfo"].exception, OSError)

    states = sorted(c["state"] for c in postrun.calls)
    assert states == ["FAILURE", "RETRY", "SUCCESS", "SUCCESS"]


def test_unknown_expired_and_undecodable_rows_send_worker_signals(
    app: Celery,
    db: psycopg.Connection[Any],
    worker_factory: Any,
    connect: Callable[..., Recorder],
) -> None:
    @app.task(name="sig.late")
    def late() -> None:
        raise AssertionError("an expired task must not run")

    unknown = connect(signals.task_unknown)
    revoked = connect(signals.task_revoked)
    rejected = connect(signals.task_rejected)

    missing = app.send_task("sig.nobody_knows_me")
    expired = late.apply_async(expires=datetime.now(timezone.utc) - timedelta(seconds=5))
    bad_id = f"raw-{uuid.uuid4().hex[:10]}"
    db.execute(
        "INSERT INTO tasks (id, name, content_type, content_encoding, payload) "
        "VALUES (%s, 'sig.late', 'application/json', 'utf-8', %s::jsonb)",
        (bad_id, json.dumps({"not": "args and kwargs"})),
    )

    with worker_factory() as worker:
        (u,) = unknown.wait(1)
        (r,) = revoked.wait(1)
        (j,) = rejected.wait(1)

    assert u["sender"] is worker
    assert (u["name"], u["id"]) == ("sig.nobody_knows_me", missing.id)
    assert u["message"].id == missing.id
    assert isinstance(u["exc"], KeyError)

    assert r["sender"] is late
    assert r["request"].id == expired.id
    assert (r["expired"], r["terminated"], r["signum"]) == (True, False, None)
    # Once, as in Celery: the worker has stopped, so its write of the row has been reported.
    assert len(revoked.calls) == 1

    assert j["sender"] is worker
    assert j["message"].id == bad_id
    assert type(j["exc"]).__name__ == "InvalidTaskError"


def test_revoking_a_running_task_sends_task_revoked(
    app: Celery, worker_factory: Any, connect: Callable[..., Recorder]
) -> None:
    started = threading.Event()
    release = threading.Event()

    @app.task(name="sig.blocking")
    def blocking() -> str:
        started.set()
        release.wait(20)
        return "done"

    revoked = connect(signals.task_revoked)
    with worker_factory():
        result = blocking.delay()
        assert started.wait(15)
        result.revoke()
        release.set()
        (call,) = revoked.wait(1)
    assert call["sender"] is blocking
    assert call["request"].id == result.id
    assert (call["expired"], call["terminated"]) == (False, False)


def test_solo_pool_sends_worker_process_init(app: Celery, connect: Callable[..., Recorder]) -> None:
    process_init = connect(signals.worker_process_init)
    worker = Worker(app, pool="solo", burst=True)
    worker.run()
    assert [c["sender"] for c in process_init.calls] == [None]


PREFORK_ARGS = ["-P", "prefork", "-c", "2", "--burst", "-l", "WARNING"]

APP_MODULE = """
import gc
import json
import os

from pgtasks import Celery
from pgtasks.signals import (
    setup_logging, task_prerun, worker_init, worker_process_init, worker_ready,
    worker_shutdown,
)

app = Celery("sigapp")


def record(event, **extra):
    with open(os.environ["SIGNALS_OUT"], "a") as out:
        out.write(json.dumps({"event": event, "pid": os.getpid(), **extra}) + "\\n")


@setup_logging.connect
def own_logging(loglevel=None, **kwargs):
    record("setup_logging", loglevel=loglevel)


@worker_init.connect
def on_worker_init(sender=None, **kwargs):
    record("worker_init", sender=type(sender).__name__)


@worker_process_init.connect
def on_child_init(sender=None, **kwargs):
    record("worker_process_init", sender=sender, frozen=gc.get_freeze_count())


@worker_ready.connect
def on_ready(sender=None, **kwargs):
    record("worker_ready", frozen=gc.get_freeze_count())


@task_prerun.connect
def on_prerun(sender=None, task_id=None, **kwargs):
    record("task_prerun", task=sender.name, task_id=task_id)


@worker_shutdown.connect
def on_shutdown(sender=None, **kwargs):
    record("worker_shutdown")


@app.task(name="sigapp.pid")
def pid():
    return os.getpid()
"""


def test_prefork_children_inherit_receivers_connected_at_import(
    pg_dsn: str, schema: str, app: Celery, tmp_path: Path
) -> None:
    (tmp_path / "sigapp.py").write_text(textwrap.dedent(APP_MODULE))
    out = tmp_path / "signals.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKS_")}
    env.update(
        PGTASKS_DATABASE_URL=pg_dsn,
        PGTASKS_SCHEMA_NAME=schema,
        SIGNALS_OUT=str(out),
        PYTHONUNBUFFERED="1",
    )
    results = [app.send_task("sigapp.pid") for _ in range(4)]
    done = subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", "sigapp", "worker", *PREFORK_ARGS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    main_pid = next(e["pid"] for e in events if e["event"] == "worker_init")
    assert {e["pid"] for e in events if e["event"] == "setup_logging"} == {main_pid}
    assert next(e for e in events if e["event"] == "setup_logging")["loglevel"] == 30
    assert next(e for e in events if e["event"] == "worker_init")["sender"] == "Worker"
    children = {e["pid"] for e in events if e["event"] == "worker_process_init"}
    assert len(children) >= 2 and main_pid not in children
    assert all(e["sender"] is None for e in events if e["event"] == "worker_process_init")
    ran_in = {e["task_id"]: e["pid"] for e in events if e["event"] == "task_prerun"}
    for result in results:
        pid = result.get(timeout=10)
        assert ran_in[result.id] == pid and pid in children
    assert {e["pid"] for e in events if e["event"] in ("worker_ready", "worker_shutdown")} == {
        main_pid
    }
    # What the worker loaded before forking is out of the collector's reach, in the worker and
    # in its children alike (see Worker.freeze_gc).
    assert next(e for e in events if e["event"] == "worker_ready")["frozen"] > 1000
    assert all(e["frozen"] > 1000 for e in events if e["event"] == "worker_process_init")
    # pgtasks configured no logging, so none of its JSON lines reached stderr.
    assert '"event": "worker.started"' not in done.stderr


def test_an_embedded_worker_leaves_the_collector_alone_and_a_freezing_one_thaws_at_stop(
    app: Celery, worker_factory: Any
) -> None:
    """Freezing is for a worker that owns its process (``pgtasks worker``): a worker run
    inside an application or a test run must not keep that process's objects from ever being
    collected, and one that froze them gives them back when it stops."""

    @app.task(name="gc.echo")
    def echo(value: int) -> int:
        return value

    assert gc.get_freeze_count() == 0
    with worker_factory():
        assert echo.delay(1).get(timeout=10) == 1
        assert gc.get_freeze_count() == 0
    with worker_factory(freeze_gc=True):
        assert echo.delay(2).get(timeout=10) == 2
        assert gc.get_freeze_count() > 1000
        # Objects made before the start, such as the task, are frozen: no generation holds them.
        assert not any(obj is echo for obj in gc.get_objects())
    assert gc.get_freeze_count() == 0
    assert any(obj is echo for obj in gc.get_objects())
