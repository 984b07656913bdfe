"""Signals: Celery's dispatch rules, and the task signals sent where a task runs.

The task-signal tests call ``execute`` directly (what every pool runs), so they need no
database; tests/integration/test_signals_worker.py covers the same signals in real workers.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pgtasks import Celery, shared_task, signals
from pgtasks import logging as pglogging
from pgtasks.exceptions import Retry
from pgtasks.signals import Signal
from pgtasks.utils.log import get_task_logger
from pgtasks.utils.state import get_current_task
from pgtasks.worker.execute import Job, execute


class Recorder:
    """A receiver that keeps every call's keyword arguments (held strongly by the test)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        return "ok"


@pytest.fixture
def app() -> Iterator[Celery]:
    """An app that never connects: these tests only run ``execute`` in-process."""
    application = Celery("signals", broker="postgresql://nobody@127.0.0.1:1/none")
    yield application


@pytest.fixture
def connected() -> Iterator[Any]:
    """``connected(signal)`` connects a fresh Recorder, disconnected after the test."""
    made: list[tuple[Signal, Recorder, Any]] = []

    def connect(signal: Signal, sender: Any = None) -> Recorder:
        recorder = Recorder()
        signal.connect(recorder, sender=sender, weak=False)
        made.append((signal, recorder, sender))
        return recorder

    yield connect
    for signal, recorder, sender in made:
        assert signal.disconnect(recorder, sender=sender)


def job_for(name: str, *args: Any, retries: int = 0, **kwargs: Any) -> Job:
    return Job(
        id=f"id-{name}",
        name=name,
        attempt=1,
        retries=retries,
        max_retries=3,
        args=args,
        kwargs=kwargs,
        queue="celery",
        headers={},
        eta=None,
        expires=None,
        hostname="host-1",
        store_result=True,
        result_serializer="json",
    )


# -- the Signal class ---------------------------------------------------------------------------


def test_connect_as_decorator_and_send_returns_responses() -> None:
    sig = Signal(name="demo")

    @sig.connect
    def first(sender: Any, **kwargs: Any) -> int:
        return 1

    @sig.connect(weak=False, dispatch_uid="second")
    def second(sender: Any, **kwargs: Any) -> int:
        return 2

    responses = sig.send(sender="x", value=3)
    assert responses == [(first, 1), (second, 2)]
    assert repr(sig) == "<Signal: demo>"


def test_receivers_get_signal_sender_and_named_arguments() -> None:
    sig = Signal(name="demo")
    recorder = Recorder()
    sig.connect(recorder, weak=False)
    sig.send(sender="s", a=1)
    assert recorder.calls == [{"signal": sig, "sender": "s", "a": 1}]


def test_sender_filtering_by_identity_and_string_value() -> None:
    sig = Signal(name="demo")
    owner, other = object(), object()
    by_object, by_name, anyone = Recorder(), Recorder(), Recorder()
    sig.connect(by_object, sender=owner, weak=False)
    # Strings match by value, as Celery does for the task-name sender of publish signals.
    sig.connect(by_name, sender="".join(["tasks.", "add"]), weak=False)
    sig.connect(anyone, weak=False)

    sig.send(sender=owner)
    sig.send(sender=other)
    sig.send(sender="tasks.add")
    assert len(by_object.calls) == 1
    assert len(by_name.calls) == 1
    assert len(anyone.calls) == 3


def test_dispatch_uid_connects_once_and_disconnects() -> None:
    sig = Signal(name="demo")
    recorder = Recorder()
    sig.connect(recorder, dispatch_uid="uid", weak=False)
    sig.connect(Recorder(), dispatch_uid="uid", weak=False)
    assert len(sig.receivers) == 1
    assert sig.disconnect(dispatch_uid="uid") is True
    assert sig.disconnect(dispatch_uid="uid") is False
    assert sig.send(sender=None) == []


def test_weak_receivers_go_away_with_their_owner() -> None:
    sig = Signal(name="demo")

    def receiver(**kwargs: Any) -> None:
        return None

    sig.connect(receiver)
    assert sig.has_listeners()
    del receiver
    gc.collect()
    assert not sig.has_listeners()

    class Holder:
        def method(self, **kwargs: Any) -> str:
            return "bound"

    holder = Holder()
    sig.connect(holder.method)  # a bound method is held by WeakMethod, not dropped at once
    assert [r for _, r in sig.send(sender=None)] == ["bound"]
    del holder
    gc.collect()
    assert sig.send(sender=None) == []


def test_receiver_must_accept_keyword_arguments() -> None:
    sig = Signal(name="demo")

    def positional_only(sender: Any) -> None:
        return None

    with pytest.raises(ValueError, match="keyword arguments"):
        sig.connect(positional_only)


def test_a_failing_receiver_is_logged_and_does_not_stop_the_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sig = Signal(name="demo")
    boom = RuntimeError("boom")

    def bad(**kwargs: Any) -> None:
        raise boom

    good = Recorder()
    sig.connect(bad)
    sig.connect(good, weak=False)
    responses = sig.send(sender=None)
    assert responses == [(bad, boom), (good, "ok")]
    captured = capsys.readouterr()
    assert "signal.receiver_failed" in captured.out + captured.err


def test_shared_task_sender_matches_the_registered_task(app: Celery, connected: Any) -> None:
    @shared_task(name="signals.shared_double")
    def double(x: int) -> int:
        return 2 * x

    recorder = connected(signals.task_success, sender=double)
    result = execute(app, job_for("signals.shared_double", 4))
    assert result.kind == "success"
    assert recorder.calls[0]["sender"] is app.tasks["signals.shared_double"]
    assert recorder.calls[0]["result"] == 8


# -- task signals, where the task runs ----------------------------------------------------------


def test_success_sends_prerun_success_postrun_with_celery_arguments(
    app: Celery, connected: Any
) -> None:
    @app.task(name="signals.add")
    def add(x: int, y: int) -> int:
        assert get_current_task() is add
        return x + y

    prerun = connected(signals.task_prerun)
    success = connected(signals.task_success, sender=add)
    postrun = connected(signals.task_postrun)
    execute(app, job_for("signals.add", 2, 3))

    assert prerun.calls == [
        {
            "signal": signals.task_prerun,
            "sender": add,
            "task_id": "id-signals.add",
            "task": add,
            "args": (2, 3),
            "kwargs": {},
        }
    ]
    assert success.calls == [{"signal": signals.task_success, "sender": add, "result": 5}]
    assert postrun.calls[0]["state"] == "SUCCESS"
    assert postrun.calls[0]["retval"] == 5
    assert postrun.calls[0]["task_id"] == "id-signals.add"
    assert get_current_task() is None


def test_failure_sends_task_failure_with_traceback_and_einfo(app: Celery, connected: Any) -> None:
    @app.task(name="signals.fail")
    def fail(x: int, flag: bool = False) -> None:
        raise ValueError(f"bad {x}")

    failure = connected(signals.task_failure)
    success = connected(signals.task_success)
    postrun = connected(signals.task_postrun)
    execute(app, job_for("signals.fail", 7, flag=True))

    assert success.calls == []
    (call,) = failure.calls
    assert call["sender"] is fail
    assert call["task_id"] == "id-signals.fail"
    assert isinstance(call["exception"], ValueError)
    assert call["args"] == (7,)
    assert call["kwargs"] == {"flag": True}
    assert call["traceback"] is call["exception"].__traceback__
    assert call["einfo"].exception is call["exception"]
    assert "ValueError: bad 7" in str(call["einfo"])
    assert postrun.calls[0]["state"] == "FAILURE"


def test_retry_sends_task_retry_with_request_and_reason(app: Celery, connected: Any) -> None:
    @app.task(name="signals.flaky", bind=True)
    def flaky(self: Any) -> None:
        raise self.retry(exc=OSError("later"), countdown=5)

    retry = connected(signals.task_retry)
    failure = connected(signals.task_failure)
    postrun = connected(signals.task_postrun)
    outcome = execute(app, job_for("signals.flaky", retries=1))

    assert outcome.kind == "retry"
    assert failure.calls == []
    (call,) = retry.calls
    assert call["sender"] is flaky
    assert call["request"].id == "id-signals.flaky"
    assert call["request"].retries == 1
    assert isinstance(call["reason"], Retry)
    assert isinstance(call["einfo"].exception, OSError)
    assert postrun.calls[0]["state"] == "RETRY"


def test_setup_logging_receiver_replaces_pgtasks_logging(connected: Any) -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    level = root.level
    recorder = connected(signals.setup_logging)
    pglogging.setup("WARNING", "json")
    assert root.handlers == handlers
    assert root.level == level
    (call,) = recorder.calls
    assert call["sender"] is None
    assert call["loglevel"] == logging.WARNING
    assert call["format"] == "json"
    assert {"logfile", "colorize"} <= set(call)


# -- get_task_logger ------------------------------------------------------------------------------


def test_get_task_logger_records_carry_the_running_task(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    logger = get_task_logger("tests.unit.signals_tasks")
    assert isinstance(logger, logging.Logger)
    assert logger.parent is logging.getLogger("pgtasks.task")

    @app.task(name="signals.logs")
    def logs() -> None:
        logger.warning("inside")

    caplog.set_level(logging.INFO, logger="tests.unit.signals_tasks")
    logger.warning("outside")
    execute(app, job_for("signals.logs"))
    outside, inside = (r for r in caplog.records if r.name == "tests.unit.signals_tasks")
    assert (outside.task_id, outside.task_name) == ("???", "???")  # type: ignore[attr-defined]
    assert inside.task_id == "id-signals.logs"  # type: ignore[attr-defined]
    assert inside.task_name == "signals.logs"  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["celery", "celery.task", "pgtasks", "pgtasks.task"])
def test_get_task_logger_refuses_reserved_names(name: str) -> None:
    with pytest.raises(RuntimeError, match="reserved"):
        get_task_logger(name)


def test_eager_calls_send_the_task_signals(app: Celery, connected: Any) -> None:
    app.conf.update(task_always_eager=True)

    @app.task(name="signals.eager")
    def eager(x: int) -> int:
        assert get_current_task() is eager
        return x + 1

    @app.task(name="signals.eager_fail")
    def eager_fail() -> None:
        raise LookupError("nope")

    prerun = connected(signals.task_prerun)
    success = connected(signals.task_success)
    failure = connected(signals.task_failure)
    postrun = connected(signals.task_postrun)
    publish = connected(signals.before_task_publish)

    assert eager.delay(1).get() == 2
    assert eager_fail.delay().state == "FAILURE"
    assert [c["task"] for c in prerun.calls] == [eager, eager_fail]
    assert [c["result"] for c in success.calls] == [2]
    assert isinstance(failure.calls[0]["exception"], LookupError)
    assert [c["state"] for c in postrun.calls] == ["SUCCESS", "FAILURE"]
    assert publish.calls == []  # nothing is published in eager mode, as in Celery
    assert get_current_task() is None


def test_success_receivers_see_the_request_of_the_call(app: Celery) -> None:
    @app.task(name="signals.request_args")
    def request_args(token: str) -> str:
        return "yes"

    seen: list[tuple[str, Any]] = []

    def on_success(sender: Any, result: Any, **kwargs: Any) -> None:
        seen.append(("success", sender.request.args[0]))

    def on_postrun(sender: Any, **kwargs: Any) -> None:
        seen.append(("postrun", sender.request.id))

    signals.task_success.connect(on_success, sender=request_args)
    signals.task_postrun.connect(on_postrun, sender=request_args)
    try:
        execute(app, job_for("signals.request_args", "tok"))
    finally:
        signals.task_success.disconnect(on_success, sender=request_args)
        signals.task_postrun.disconnect(on_postrun, sender=request_args)
    assert seen == [("success", "tok"), ("postrun", "id-signals.request_args")]
    assert request_args.request.id is None  # popped again afterwards
