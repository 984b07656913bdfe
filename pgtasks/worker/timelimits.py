"""Time limits, with Celery's meaning.

- The *soft* limit raises ``SoftTimeLimitExceeded`` inside the task, which may catch it to clean
  up (or return). In a prefork child, where the task runs in the main thread, a ``SIGALRM`` timer
  raises it; in the threads and solo pools a timer thread raises it asynchronously in the task's
  thread (``PyThreadState_SetAsyncExc``), which takes effect at the next Python bytecode, so a
  task blocked inside one C call (a long ``time.sleep``, a socket read) sees it when that call
  returns. An ``async def`` task awaiting on its thread's event loop gets it where it awaits,
  through the loop, in every pool.
- The *hard* limit is only enforced by the prefork pool: the parent kills the child, starts a new
  one, and the task fails with ``TimeLimitExceeded`` (a FAILURE, never retried, as in Celery).
  A thread cannot be killed, so the threads and solo pools ignore it and the worker warns at start.

Which limits apply: the task's ``time_limit``/``soft_time_limit`` option, else the worker's
``--time-limit``/``--soft-time-limit`` or the ``task_time_limit``/``task_soft_time_limit``
settings (Celery's order); a call's ``apply_async(time_limit=..., soft_time_limit=...)`` (the
``timelimit`` header) may then lower each, never lift it. Celery lets the call's limits win either
way; here the task's code and the worker's operator bound a task, and whoever may only enqueue it
(perhaps a less trusted service) cannot make a worker hang on it past that bound. A header that is
not a pair of seconds or nulls asks for nothing: the row runs with its task's and worker's limits
(a warning names the task), as a limit it does not lower is no reason to lose the call.
"""

from __future__ import annotations

import ctypes
import reprlib
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import FrameType
from typing import TYPE_CHECKING, Any

import structlog

from pgtasks.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from pgtasks.headers import TIMELIMIT
from pgtasks.worker import loop as runtime

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.worker.execute import Job, Outcome

log = structlog.get_logger("pgtasks")

#: The longest timeout a timer takes (about 292 years; ``setitimer`` and ``threading.Timer``
#: raise OverflowError past it): a limit this long is no limit.
_LONGEST = threading.TIMEOUT_MAX


def _positive(value: Any) -> float | None:
    """Seconds from a task's or a worker's limit; None when that is no usable limit: not a
    number, not positive, or too long for a timer."""
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if 0 < seconds < _LONGEST else None


def _call_limit(value: Any) -> float | None:
    """Seconds from one side of a call's ``timelimit`` header; None for no limit of the call's
    own (null, or Celery's 0). Raises ValueError for what is not a number of seconds: headers may
    hold any JSON."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{type(value).__name__} is not a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:
        return None  # past a float: longer than any limit, so it lowers none
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{seconds} is not a number of seconds")
    return seconds if 0 < seconds < _LONGEST else None


def _lower(limit: float | None, call: float | None) -> float | None:
    """``limit`` lowered to the call's own (None is no limit)."""
    if call is None:
        return limit
    return call if limit is None else min(limit, call)


def resolve(
    headers: Mapping[str, Any],
    task: Any,
    default_hard: float | None,
    default_soft: float | None,
) -> tuple[float | None, float | None]:
    """The (hard, soft) limits in seconds for one call; None means no limit. A call's own limits
    (the ``timelimit`` header) only ever lower those of its task or worker."""
    pair = headers.get(TIMELIMIT)
    task_hard = getattr(task, "time_limit", None)
    task_soft = getattr(task, "soft_time_limit", None)
    if (
        pair is None
        and task_hard is None
        and task_soft is None
        and default_hard is None
        and default_soft is None
    ):
        return None, None  # no limit set anywhere, as for most calls
    hard = _positive(task_hard) or _positive(default_hard)
    soft = _positive(task_soft) or _positive(default_soft)
    if pair is None:
        return hard, soft
    try:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError("not a [hard, soft] pair")
        call_hard, call_soft = _call_limit(pair[0]), _call_limit(pair[1])
    except ValueError as exc:
        log.warning(
            "task.time_limit_ignored",
            task_name=getattr(task, "name", None),
            timelimit=reprlib.repr(pair),
            reason=str(exc),
            limits=[hard, soft],
            hint="a call's timelimit header is a pair of seconds or nulls; the task's and the "
            "worker's limits apply",
        )
        return hard, soft
    return _lower(hard, call_hard), _lower(soft, call_soft)


#: What ``soft_limit`` gives a call with no limit: nothing to arm, and no generator to run.
_NO_LIMIT: AbstractContextManager[None] = nullcontext()


def soft_limit(seconds: float | None) -> AbstractContextManager[None]:
    """Raise ``SoftTimeLimitExceeded`` in this thread once ``seconds`` have passed."""
    if not seconds:
        return _NO_LIMIT
    return _soft_limit(seconds)


@contextmanager
def _soft_limit(seconds: float) -> Iterator[None]:
    if threading.current_thread() is threading.main_thread():
        with _alarm(seconds):
            yield
    else:
        with _async_raise(seconds):
            yield


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    armed = True

    def fire(signum: int, frame: FrameType | None) -> None:
        # A late signal (the task has just returned) must not fail the task after the fact.
        if armed and not _on_loop(threading.get_ident()):
            raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _on_loop(thread_id: int) -> bool:
    """An ``async def`` call awaiting on the thread's event loop gets the limit where it awaits
    (``loop.soft_limit_on_loop``); True when it was delivered so."""
    return runtime.soft_limit_on_loop(thread_id)


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


@contextmanager
def _async_raise(seconds: float) -> Iterator[None]:
    target = threading.get_ident()
    lock = threading.Lock()
    state = {"running": True, "fired": False}

    def fire() -> None:
        with lock:
            if state["running"] and not _on_loop(target):
                state["fired"] = True
                _set_async_exc(target, ctypes.py_object(SoftTimeLimitExceeded))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.name = "pgtasks-soft-limit"
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["running"] = False
            if state["fired"]:
                # Clear an exception set but not yet raised, so it cannot surface later in the
                # pool thread's own code (after the task, in another task).
                _set_async_exc(target, ctypes.py_object())


def hard_limit_outcome(app: Celery, job: Job, limit: float, started: float) -> Outcome:
    """The outcome of a call whose process was killed at its hard limit: a FAILURE with
    ``TimeLimitExceeded``, stored like any other task error, with the call's errbacks and chain
    or chord follow-ups planned here in the worker (as Celery's main process does)."""
    from pgtasks.request import Request
    from pgtasks.result import exception_to_dict
    from pgtasks.serialization import encode
    from pgtasks.worker.execute import FAILURE, Outcome
    from pgtasks.worker.followups import after_failure

    exc = TimeLimitExceeded(limit)
    message = f"TimeLimitExceeded: hard time limit ({limit:g}s) exceeded"
    einfo = f"{message}; the process running it was killed and replaced\n"
    result = encode(exception_to_dict(exc), job.result_serializer) if job.store_result else None
    outcome = Outcome(
        job.id,
        job.attempt,
        FAILURE,
        started,
        time.time() - started,
        result=result,
        error=message,
        traceback=einfo,
    )
    request = Request(
        id=job.id,
        args=job.args,
        kwargs=job.kwargs,
        retries=job.retries,
        hostname=job.hostname,
        is_eager=False,
        called_directly=False,
        headers=job.headers,
    )
    try:
        return after_failure(app, job, request, exc, einfo, outcome)
    except Exception:  # follow-ups must never stop the pool from replacing its child
        log.exception("task.followups_failed", task_id=job.id)
        return outcome
