"""Calling options checked before anything reaches the database (``Task.build_message``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtasks import Celery, Retry
from pgtasks.request import Request
from pgtasks.serialization import EncodeError, encode
from pgtasks.task import Task

# Nothing here connects: an unroutable address makes any accidental query fail loudly.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"


@pytest.fixture
def app() -> Iterator[Celery]:
    application = Celery("opts", broker=NOWHERE, set_as_current=False)
    yield application
    application.close()


@pytest.fixture
def task(app: Celery) -> Task[Any, Any]:
    @app.task(name="opts.echo")
    def echo(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    return echo


# -- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "culprit"),
    [
        ((object(),), {}, "args[0] (object)"),
        ((1, "two", {3}), {}, "args[2] (set)"),
        ((), {"ok": 1, "k": object()}, "kwargs['k'] (object)"),
        ((1,), {"when": datetime.now(), "bad": 1j}, "kwargs['bad'] (complex)"),
    ],
)
def test_unencodable_argument_is_named(
    task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(EncodeError) as caught:
        task.build_message(args, kwargs)
    message = str(caught.value)
    assert culprit in message
    assert "opts.echo" in message
    assert "'json'" in message


def test_payload_limit_is_inclusive_and_named(app: Celery, task: Task[Any, Any]) -> None:
    app.conf.max_payload_bytes = 100
    overhead = len(encode([[""], {}], "json").data)
    task.build_message(["x" * (100 - overhead)])  # exactly at the limit
    with pytest.raises(EncodeError) as caught:
        task.build_message(["x" * (101 - overhead)])
    message = str(caught.value)
    assert "101 bytes" in message
    assert "max_payload_bytes" in message
    assert "opts.echo" in message


def test_arguments_are_encoded_with_the_chosen_serializer(task: Task[Any, Any]) -> None:
    msg = task.build_message((1, {2}), serializer="pickle")
    assert msg.body.content_type == "application/x-python-serialize"
    assert msg.body.raw is not None
    assert msg.headers["result_serializer"] == "json"


# -- countdown, eta, expires -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        ("10", TypeError, "countdown must be a number of seconds, not str"),
        (True, TypeError, "not bool"),
        ([1], TypeError, "not list"),
        (math.nan, ValueError, "finite"),
        (math.inf, ValueError, "finite"),
        (-math.inf, ValueError, "finite"),
        (1e12, ValueError, "out of range"),
    ],
)
def test_bad_countdown(task: Task[Any, Any], value: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        task.build_message(countdown=value)


@settings(deadline=None)
@given(st.floats(min_value=-86400 * 365, max_value=86400 * 365, allow_nan=False))
def test_finite_countdown_is_kept_as_seconds(seconds: float) -> None:
    app = Celery("opts", broker=NOWHERE, set_as_current=False)
    msg = Task(app, print, "opts.h", False).build_message(countdown=seconds)
    assert msg.countdown == seconds
    assert msg.eta is None


def test_countdown_as_timedelta(task: Task[Any, Any]) -> None:
    options: dict[str, Any] = {"countdown": timedelta(minutes=2)}
    assert task.build_message(**options).countdown == 120.0


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("2030-01-01T00:00:00", "eta must be a datetime, not str"),
        (1700000000, "eta must be a datetime, not int"),
        (date(2030, 1, 1), "eta must be a datetime, not date"),
    ],
)
def test_bad_eta(task: Task[Any, Any], value: Any, text: str) -> None:
    with pytest.raises(TypeError, match=text):
        task.build_message(eta=value)


def test_naive_eta_is_utc(task: Task[Any, Any]) -> None:
    naive = datetime(2031, 5, 6, 7, 8, 9)
    eta = task.build_message(eta=naive).eta
    assert eta == datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    assert eta is not None and eta.utcoffset() == timedelta(0)


def test_naive_eta_and_expires_are_in_the_app_time_zone(app: Celery, task: Task[Any, Any]) -> None:
    app.conf.timezone = "Europe/Berlin"
    msg = task.build_message(eta=datetime(2031, 7, 1, 12, 0), expires=datetime(2031, 1, 1, 12, 0))
    assert msg.eta == datetime(2031, 7, 1, 10, 0, tzinfo=timezone.utc), "CEST is UTC+2"
    assert msg.expires_at == datetime(2031, 1, 1, 11, 0, tzinfo=timezone.utc), "CET is UTC+1"


def test_app_time_zone_follows_celerys_rules(app: Celery) -> None:
    assert app.timezone == timezone.utc
    app.conf.enable_utc = False
    local = datetime.now().astimezone().utcoffset()
    assert datetime.now(app.timezone).utcoffset() == local
    app.conf.timezone = "America/New_York"
    assert str(app.timezone) == "America/New_York"


def test_aware_eta_keeps_its_instant(task: Task[Any, Any]) -> None:
    tokyo = timezone(timedelta(hours=9))
    eta = datetime(2031, 5, 6, 16, 0, tzinfo=tokyo)
    assert task.build_message(eta=eta).eta == datetime(2031, 5, 6, 7, 0, tzinfo=timezone.utc)


def test_eta_and_countdown_together_are_refused(task: Task[Any, Any]) -> None:
    with pytest.raises(ValueError, match="eta or countdown, not both"):
        task.build_message(countdown=5, eta=datetime.now(timezone.utc))


@pytest.mark.parametrize(
    ("expires", "expires_in"),
    [(30, 30.0), (2.5, 2.5), (timedelta(hours=1), 3600.0)],
)
def test_relative_expires(task: Task[Any, Any], expires: Any, expires_in: float) -> None:
    msg = task.build_message(expires=expires)
    assert (msg.expires_in, msg.expires_at) == (expires_in, None)


def test_naive_expires_datetime_is_utc(task: Task[Any, Any]) -> None:
    msg = task.build_message(expires=datetime(2030, 1, 1))
    assert msg.expires_at == datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert msg.expires_in is None


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        ("soon", TypeError, "expires must be a number of seconds, not str"),
        (False, TypeError, "not bool"),
        (math.nan, ValueError, "finite"),
    ],
)
def test_bad_expires(task: Task[Any, Any], value: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        task.build_message(expires=value)


# -- priority, queue and the rest --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        ("high", TypeError, "priority must be an integer, not str"),
        (5.0, TypeError, "not float"),
        (True, TypeError, "not bool"),
        (2**31, ValueError, "out of range"),
        (-(2**31) - 1, ValueError, "out of range"),
    ],
)
def test_bad_priority(task: Task[Any, Any], value: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        task.build_message(priority=value)


@settings(deadline=None)
@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_any_32_bit_priority_is_accepted(priority: int) -> None:
    app = Celery("opts", broker=NOWHERE, set_as_current=False)
    assert Task(app, print, "opts.p", False).build_message(priority=priority).priority == priority


def test_priority_defaults_task_then_settings(app: Celery) -> None:
    app.conf.task_default_priority = 4

    @app.task(name="opts.plain")
    def plain() -> None: ...

    @app.task(name="opts.urgent", priority=9)
    def urgent() -> None: ...

    assert plain.build_message().priority == 4
    assert urgent.build_message().priority == 9
    assert urgent.build_message(priority=1).priority == 1


@pytest.mark.parametrize("queue", [5, ["a"]])
def test_queue_must_be_a_string(task: Task[Any, Any], queue: Any) -> None:
    with pytest.raises(ValueError, match="queue must be a non-empty string"):
        task.build_message(queue=queue)


def test_queue_defaults_task_then_settings(app: Celery) -> None:
    app.conf.task_default_queue = "fallback"

    @app.task(name="opts.io", queue="io")
    def io_bound() -> None: ...

    @app.task(name="opts.cpu")
    def cpu_bound() -> None: ...

    assert io_bound.build_message().queue == "io"
    assert io_bound.build_message(queue="other").queue == "other"
    assert cpu_bound.build_message().queue == "fallback"


def test_task_options_reach_the_message(app: Celery) -> None:
    @app.task(name="opts.retrying", max_retries=7, ignore_result=True)
    def retrying() -> None: ...

    msg = retrying.build_message(task_id="my-id")
    assert (msg.id, msg.name, msg.max_retries) == ("my-id", "opts.retrying", 7)
    assert msg.headers["ignore_result"] is True
    assert retrying.build_message(max_retries=0).max_retries == 0


def test_generated_ids_are_unique(task: Task[Any, Any]) -> None:
    ids = {task.build_message().id for _ in range(200)}
    assert len(ids) == 200


def test_celery_only_options_are_kept_as_plain_headers(task: Task[Any, Any]) -> None:
    msg = task.build_message(routing_key="rk", exchange="ex", link=object(), retry=True)
    assert msg.headers["options"] == {"routing_key": "rk", "exchange": "ex", "retry": True}


# -- eager runs and retries --------------------------------------------------------------------


def test_always_eager_runs_here_after_a_serializer_round_trip(app: Celery) -> None:
    app.conf.task_always_eager = True

    @app.task(name="opts.kinds")
    def kinds(value: Any) -> str:
        return type(value).__name__

    assert kinds.delay((1, 2)).get() == "list"  # the tuple went through json
    with pytest.raises(EncodeError):
        kinds.delay(object())


def test_eager_failure_is_returned_unless_propagating(app: Celery) -> None:
    app.conf.task_always_eager = True

    @app.task(name="opts.fails")
    def fails() -> None:
        raise KeyError("nope")

    result = fails.delay()
    assert result.state == "FAILURE"
    assert isinstance(result.get(propagate=False), KeyError)
    with pytest.raises(KeyError):
        result.get()
    app.conf.task_eager_propagates = True
    with pytest.raises(KeyError):
        fails.delay()


def test_retry_when_called_directly_raises_the_cause(app: Celery) -> None:
    @app.task(name="opts.direct", bind=True)
    def direct(self: Task[Any, Any]) -> None:
        raise self.retry(exc=LookupError("direct"))

    with pytest.raises(LookupError, match="direct"):
        direct()


@pytest.mark.parametrize("retries", [0, 3, 9, 40])
def test_autoretry_backoff_stays_within_the_cap(app: Celery, retries: int) -> None:
    @app.task(
        name="opts.flaky",
        autoretry_for=(OSError,),
        retry_backoff=2,
        retry_backoff_max=50,
        max_retries=None,
    )
    def flaky() -> None:
        raise OSError("down")

    flaky.push_request(Request(id="r", retries=retries, called_directly=False))
    try:
        for _ in range(20):
            with pytest.raises(Retry) as caught:
                flaky.run()
            when = caught.value.when
            assert isinstance(when, float)
            assert 0 <= when <= min(50, 2 * 2**retries)
            assert isinstance(caught.value.exc, OSError)
    finally:
        flaky.pop_request()


def test_retry_past_max_retries_raises_the_cause(app: Celery) -> None:
    @app.task(name="opts.limited", autoretry_for=(OSError,), max_retries=2)
    def limited() -> None:
        raise OSError("still down")

    limited.push_request(Request(id="r", retries=2, called_directly=False))
    try:
        with pytest.raises(OSError, match="still down"):
            limited.run()
        assert limited.request.retries_exhausted
    finally:
        limited.pop_request()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"countdown": "1"}, TypeError),
        ({"countdown": math.nan}, ValueError),
        ({"eta": 5}, TypeError),
    ],
)
def test_bad_retry_times(app: Celery, options: dict[str, Any], error: type[Exception]) -> None:
    @app.task(name="opts.retry_times", bind=True)
    def again(self: Task[Any, Any]) -> None:
        raise self.retry(**options)

    again.push_request(Request(id="r", called_directly=False))
    try:
        with pytest.raises(error):
            again.run()
    finally:
        again.pop_request()


def test_naive_retry_eta_is_utc(app: Celery) -> None:
    @app.task(name="opts.retry_eta", bind=True)
    def again(self: Task[Any, Any]) -> None:
        raise self.retry(eta=datetime(2030, 1, 1, 12, 0))

    again.push_request(Request(id="r", called_directly=False))
    try:
        with pytest.raises(Retry) as caught:
            again.run()
    finally:
        again.pop_request()
    assert caught.value.when == datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


# -- argsrepr / kwargsrepr ---------------------------------------------------------------------


def test_arguments_are_shown_by_their_repr(task: Task[Any, Any]) -> None:
    msg = task.build_message((1, "two"), {"three": [3]})
    assert msg.headers["argsrepr"] == "(1, 'two')"
    assert msg.headers["kwargsrepr"] == "{'three': [3]}"


def test_a_call_can_give_its_own_reprs(task: Task[Any, Any]) -> None:
    msg = task.build_message(("secret",), {}, argsrepr="('<token>',)", kwargsrepr="{}")
    assert msg.headers["argsrepr"] == "('<token>',)"
    assert "options" not in msg.headers, "argsrepr is a header of its own, as in Celery"


def test_redacted_tasks_keep_secrets_out_of_the_reprs(app: Celery) -> None:
    @app.task(name="opts.login", redact=True)
    def login(user: str, password: str) -> None: ...

    @app.task(name="opts.charge", redact=("card", "cvc"))
    def charge(amount: int, card: str = "", cvc: str = "") -> None: ...

    hidden = login.build_message(("ann", "hunter2"))
    assert "hunter2" not in hidden.headers["argsrepr"] + hidden.headers["kwargsrepr"]
    partly = charge.build_message((10,), {"card": "4111111111111111", "cvc": "123"})
    assert partly.headers["argsrepr"] == "(10,)"
    assert partly.headers["kwargsrepr"] == "{'card': '***', 'cvc': '***'}"


def test_big_arguments_have_a_bounded_repr(task: Task[Any, Any]) -> None:
    msg = task.build_message((list(range(100_000)),), {"blob": "x" * 50_000})
    assert len(msg.headers["argsrepr"]) <= 1024
    assert len(msg.headers["kwargsrepr"]) <= 1024
    assert msg.headers["argsrepr"].startswith("([0, 1, 2")


# -- a call without options reuses what the last one checked -----------------------------------


def test_plain_calls_follow_changed_defaults(app: Celery, task: Task[Any, Any]) -> None:
    first = task.build_message((1,), {})
    again = task.build_message((2,), {})
    assert (first.queue, first.priority, first.max_retries) == ("celery", 0, 3)
    assert again.id != first.id
    assert again.body.data != first.body.data
    assert again.headers is not first.headers
    task.priority = 7
    task.queue = "io"
    task.max_retries = 9
    changed = task.build_message((3,), {})
    assert (changed.queue, changed.priority, changed.max_retries) == ("io", 7, 9)
    app.conf.task_ignore_result = True
    assert task.build_message((4,), {}).headers.get("ignore_result") is True
    app.conf.task_ignore_result = False
    assert "ignore_result" not in task.build_message((5,), {}).headers
    # A call with options never takes the kept maker, nor replaces it.
    assert task.build_message((6,), {}, priority=1).priority == 1
    assert task.build_message((7,), {}).priority == 7


def test_plain_call_headers_are_its_own(task: Task[Any, Any]) -> None:
    first = task.build_message((1,), {})
    first.headers["trace"] = "x"
    assert "trace" not in task.build_message((2,), {}).headers
