"""Running one task call and describing what happened, the same way in every pool.

``execute`` runs where the task runs (a pool thread or a prefork child), ``execute_async`` on
the asyncio pool's event loop; the ``Outcome`` either returns is plain data the main process
turns into one fenced statement.
"""

from __future__ import annotations

import asyncio
import time
import traceback as tb
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgtasks import exceptions, tracing
from pgtasks.request import Request
from pgtasks.result import exception_to_dict
from pgtasks.serialization import Encoded, EncodeError, encode
from pgtasks.utils.state import pop_task, push_task
from pgtasks.worker import loop as runtime
from pgtasks.worker import task_signals, timelimits
from pgtasks.worker.followups import after_failure, after_success, chord_member, has_followups

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.task import Task


# Not frozen: a frozen dataclass's __init__ costs about a microsecond more (one
# object.__setattr__ per field), once or more per task. Treat it as immutable.
@dataclass(unsafe_hash=True)
class Job:
    """One claimed call, ready to run (picklable, for prefork children)."""

    id: str
    name: str
    attempt: int
    retries: int
    max_retries: int | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    queue: str
    headers: dict[str, Any]
    eta: datetime | None
    expires: datetime | None
    hostname: str
    store_result: bool
    result_serializer: str
    # Seconds; None means no limit (see timelimits.resolve for where they come from).
    time_limit: float | None = None
    soft_time_limit: float | None = None


# Outcome kinds, one per fenced statement family.
SUCCESS = "success"
FAILURE = "failure"  # FAILED, or DEAD when retries_exhausted
RETRY = "retry"
REJECT_REQUEUE = "reject_requeue"
IGNORED = "ignored"
LOST = "lost"  # the process running it died


class CancelCheck:
    """Whether a running task was revoked, asked of the database at most every ``INTERVAL``
    seconds (a task may check in a tight loop); once revoked, always revoked."""

    INTERVAL = 0.5

    def __init__(self, app: Celery, task_id: str) -> None:
        self.app = app
        self.task_id = task_id
        self.revoked = False
        self._next = 0.0

    def __call__(self) -> bool:
        if self.revoked:
            return True
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.INTERVAL
            self.revoked = self.app.broker.cancel_requested(self.task_id)
        return self.revoked


# Not frozen: a frozen dataclass's __init__ costs about a microsecond more (one
# object.__setattr__ per field), once or more per task. Treat it as immutable.
@dataclass(unsafe_hash=True)
class Outcome:
    """What running a Job produced."""

    id: str
    attempt: int
    kind: str
    started: float
    runtime: float
    result: Encoded | None = None
    error: str | None = None
    traceback: str | None = None
    retry_when: float | datetime | None = None
    retries_exhausted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


#: A callable run where tasks run, around every call: ``hook(task, request)``.
ExecutionHook = Callable[[Any, Request], None]

# Per app, so two apps in one process (tests, the pytest plugin) never share an extension.
_hooks: weakref.WeakKeyDictionary[Celery, list[tuple[ExecutionHook, ExecutionHook]]] = (
    weakref.WeakKeyDictionary()
)
# Whether any app has hooks: until one does, a call skips the weak mapping's lookup.
_any_hooks = False


def add_execution_hooks(app: Celery, before: ExecutionHook, after: ExecutionHook) -> None:
    """Run ``before`` ahead of every task ``app`` executes and ``after`` once it returned
    (whatever the outcome), in the thread or process running the task.

    Extensions such as the Django fix-up plug in here rather than branching inside
    ``execute``; a hook that raises is logged and never changes the task's outcome.
    """
    global _any_hooks
    _hooks.setdefault(app, []).append((before, after))
    _any_hooks = True


def execute(app: Celery, job: Job) -> Outcome:
    """Run ``job`` and report its outcome; never raises."""
    with tracing.consumer(job.name, job.id, job.headers, job.attempt) as span:
        steps = _steps(app, job)
        task = next(steps)
        try:
            with timelimits.soft_limit(job.soft_time_limit):
                value = task.run(*job.args, **job.kwargs)
        except BaseException as exc:
            return _ended(span, steps.throw, exc)
        return _ended(span, steps.send, value)


async def execute_async(app: Celery, job: Job) -> Outcome:
    """``execute`` for a call of an ``async def`` task on the asyncio pool's event loop: the
    same steps around the body, with the body's coroutine awaited right here, so the call never
    leaves the loop's thread.

    A soft time limit is raised inside the coroutine where it awaits; a revoke with
    ``terminate=True`` (``terminate_coroutine``) cancels it, and the call fails with
    ``Terminated``. Any other cancellation (the pool stopping cold) is raised on.
    """
    with tracing.consumer(job.name, job.id, job.headers, job.attempt) as span:
        steps = _steps(app, job)
        task = next(steps)
        with runtime.running_on_loop(job.id, job.soft_time_limit) as terminated:
            try:
                value = await task.run_on_loop(job.args, job.kwargs, job.soft_time_limit)
            except asyncio.CancelledError:
                if not terminated():
                    steps.close()
                    raise
                stopped = exceptions.Terminated("revoked, and its coroutine cancelled")
                return _ended(span, steps.throw, stopped)
            except BaseException as exc:
                return _ended(span, steps.throw, exc)
        return _ended(span, steps.send, value)


def _ended(span: Any, step: Callable[[Any], Any], value: Any) -> Outcome:
    """Hand the body's value (``send``) or error (``throw``) to ``_steps``; the outcome it
    ends with, marked on the call's span when it failed."""
    try:
        step(value)
    except StopIteration as stop:
        outcome: Outcome = stop.value
    else:  # pragma: no cover
        raise RuntimeError("a task's steps went on after its body")
    if outcome.kind == FAILURE:
        tracing.failed(span, outcome.error)
    return outcome


def _steps(app: Celery, job: Job) -> Generator[Task[Any, Any], Any, Outcome]:
    """Everything around a call's body, as one generator for both ways of running it: it
    yields the task, the caller runs the body and sends its value or throws its error in,
    and the generator returns the outcome."""
    started = time.time()
    t0 = time.perf_counter()
    task = app.get_task(job.name)
    request = Request(
        id=job.id,
        args=job.args,
        kwargs=job.kwargs,
        retries=job.retries,
        attempt=job.attempt,
        eta=job.eta,
        expires=job.expires,
        hostname=job.hostname,
        delivery_info={"routing_key": job.queue, "queue": job.queue, "priority": None},
        is_eager=False,
        called_directly=False,
        parent_id=job.headers.get("parent_id"),
        root_id=job.headers.get("root_id") or job.id,
        group=job.headers.get("group"),
        headers=job.headers,
        max_retries=job.max_retries,
        cancel_check=CancelCheck(app, job.id),
    )
    task.push_request(request)
    push_task(task)
    task_signals.prerun(task, job)
    hooks = _hooks.get(app, ()) if _any_hooks else ()
    for before, _ in hooks:
        _hook(before, task, request)
    try:
        task.before_start(job.id, job.args, job.kwargs)
        value = yield task
    except exceptions.Retry as exc:
        cause = exc.exc if exc.exc is not None else exc
        einfo = _format(cause)
        # Celery hands on_retry the exception given to retry(), None when there was none.
        _hook(task.on_retry, exc.exc, job.id, job.args, job.kwargs, einfo)
        task_signals.retry(task, request, exc, cause)
        # Celery skips after_return for RETRY (and IGNORED, REJECTED) outcomes.
        task_signals.postrun(task, job, "RETRY", exc)
        return Outcome(
            job.id,
            job.attempt,
            RETRY,
            started,
            time.perf_counter() - t0,
            result=_encode_exception(job, cause),
            error=_describe(cause),
            traceback=einfo,
            retry_when=exc.when,
        )
    except exceptions.Ignore as exc:
        task_signals.postrun(task, job, "IGNORED", exc)
        return Outcome(job.id, job.attempt, IGNORED, started, time.perf_counter() - t0)
    except exceptions.Reject as exc:
        task_signals.postrun(task, job, "REJECTED", exc)
        einfo = _format(exc)
        if exc.requeue:
            return Outcome(
                job.id,
                job.attempt,
                REJECT_REQUEUE,
                started,
                time.perf_counter() - t0,
                error=f"rejected: {exc.reason!r}",
                traceback=einfo,
            )
        return _failure(job, exc, started, t0, einfo, exhausted=True)
    except Exception as exc:
        einfo = _format(exc)
        _hook(task.on_failure, exc, job.id, job.args, job.kwargs, einfo)
        task_signals.failure(task, job, exc)
        _hook(task.after_return, "FAILURE", exc, job.id, job.args, job.kwargs, einfo)
        task_signals.postrun(task, job, "FAILURE", exc)
        failed = _failure(job, exc, started, t0, einfo, exhausted=request.retries_exhausted)
        return after_failure(app, job, request, exc, einfo, failed)
    finally:
        for _, after in hooks:
            _hook(after, task, request)
        pop_task()
        task.pop_request()
    runtime = time.perf_counter() - t0
    encoded: Encoded | None = None
    # Canvas follow-ups read the value from the results table (a chord's body), so a task with
    # follow-ups keeps it even when its result is otherwise ignored.
    if job.store_result or has_followups(job.headers):
        try:
            encoded = encode(value, job.result_serializer)
        except EncodeError as exc:
            einfo = _format(exc)
            error = EncodeError(f"return value of {job.name} cannot be serialized: {exc}")
            task_signals.failure(task, job, error, request)
            task_signals.postrun(task, job, "FAILURE", error, request)
            return _failure(job, error, started, t0, einfo, exhausted=False)
    _hook(task.on_success, value, job.id, job.args, job.kwargs)
    task_signals.success(task, value, request)
    _hook(task.after_return, "SUCCESS", value, job.id, job.args, job.kwargs, None)
    task_signals.postrun(task, job, "SUCCESS", value, request)
    extra = after_success(app, job, value)
    return Outcome(job.id, job.attempt, SUCCESS, started, runtime, result=encoded, extra=extra)


def unsent(job: Job, exc: BaseException) -> Outcome:
    """The outcome of a call that could not be handed to the process that was to run it (the
    prefork pool pickles each job for its child): dead-lettered unrun, as it would fail the
    same way every time. Its arguments are what anyone who may insert a row wrote: nested
    deeper than pickle goes (about 500 levels, where JSON reads about 990), or of a type a
    serializer other than json rebuilt and pickle cannot write."""
    if isinstance(exc, RecursionError):
        why = f"nested too deeply to pickle ({exc})"
    else:
        why = _describe(exc)
    return Outcome(
        job.id,
        job.attempt,
        FAILURE,
        time.time(),
        0.0,
        error=f"cannot hand the call to a child process: {why}",
        retries_exhausted=True,
        extra={"followups": chord_member(job.headers)},
    )


def _failure(
    job: Job, exc: BaseException, started: float, t0: float, einfo: str, exhausted: bool
) -> Outcome:
    return Outcome(
        job.id,
        job.attempt,
        FAILURE,
        started,
        time.perf_counter() - t0,
        result=_encode_exception(job, exc),
        error=_describe(exc),
        traceback=einfo,
        retries_exhausted=exhausted,
    )


def _encode_exception(job: Job, exc: BaseException) -> Encoded | None:
    """The exception as a stored result (Celery's exc_type/exc_message form), if kept."""
    if not job.store_result:
        return None
    try:
        return encode(exception_to_dict(exc), job.result_serializer)
    except EncodeError:
        fallback = {"exc_type": type(exc).__name__, "exc_message": [repr(exc)]}
        return encode({**fallback, "exc_module": "builtins"}, "json")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _format(exc: BaseException) -> str:
    return "".join(tb.format_exception(type(exc), exc, exc.__traceback__))


def _hook(fn: Any, *args: Any) -> None:
    """Run a user hook; a failing hook is logged into the outcome's way, never the worker's."""
    try:
        fn(*args)
    except Exception:  # a broken hook must not change the task's outcome
        import structlog

        structlog.get_logger("pgtasks").exception(
            "task.hook_failed", hook=getattr(fn, "__name__", "?")
        )
