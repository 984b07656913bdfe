"""The asyncio runtime the worker runs ``async def`` task bodies on.

On the asyncio pool, the bodies of every call interleave on one event loop the pool runs
(``use_event_loop``); elsewhere a pool thread, or a prefork child, keeps one loop for the
calls it runs one after another (``event_loop_per_thread``). Around both: soft time limits
raised inside a coroutine where it awaits (``driven``), and ``revoke(terminate=True)``
cancelling a running coroutine (``terminate_coroutine``). ``run_coroutine`` is what
``Task.run`` calls for an ``async def`` body, in the worker or called eagerly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from pgtasks import exceptions

_T = TypeVar("_T")


#: The event loop of this process's asyncio pool, where the ``async def`` bodies of every call
#: interleave (None: each call runs on a loop of its own).
_shared_loop: asyncio.AbstractEventLoop | None = None


def use_event_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Run ``async def`` task bodies on ``loop`` from now on (the asyncio pool's), or each on a
    loop of its own again (None)."""
    global _shared_loop
    _shared_loop = loop


def run_coroutine(coro: Coroutine[Any, Any, _T], task_id: str | None = None) -> _T:
    """Run an ``async def`` task's coroutine to its end and return its value: on the asyncio
    pool's shared loop where there is one (this thread waits; ``task_id`` names the call for
    ``terminate_coroutine``), else on a new event loop in this thread, or, where this thread
    already runs one (an eager call from async code), on a new loop in a thread of its own
    while this one waits."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    shared = _shared_loop
    if shared is not None and shared is not running and shared.is_running():
        return _on_loop(shared, coro, task_id)
    if running is None:
        if getattr(_thread, "keeps_loop", False):
            return _on_thread_loop(coro)
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pgtasks-eager") as pool:
        return pool.submit(asyncio.run, coro).result()


#: Per thread: whether ``async def`` calls run on an event loop kept between them
#: (``keeps_loop``, see ``event_loop_per_thread``), and that loop once made (``loop``).
_thread = threading.local()


@contextlib.contextmanager
def event_loop_per_thread() -> Iterator[None]:
    """Around a pool thread's (or a prefork child's) life: the ``async def`` calls it runs
    run one after another on one event loop kept for it, rather than each on a new one, so
    clients they keep at module level (bound to the loop they were made on) go on working
    from call to call, and a call costs no loop to set up and tear down. The loop is made at
    the first such call and closed when the thread's life ends."""
    _thread.keeps_loop = True
    try:
        yield
    finally:
        _thread.keeps_loop = False
        loop: asyncio.AbstractEventLoop | None = getattr(_thread, "loop", None)
        _thread.loop = None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def _on_thread_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to its end on this thread's kept loop. As with ``asyncio.run``, the tasks
    it leaves running are cancelled when it ends, and so is ``coro`` itself when an exception
    raised into this thread stopped the loop before it ended."""
    loop: asyncio.AbstractEventLoop | None = getattr(_thread, "loop", None)
    if loop is None or loop.is_closed():
        loop = _thread.loop = asyncio.new_event_loop()
    call = loop.create_task(driven(coro))
    thread_id = threading.get_ident()
    _thread_calls[thread_id] = (loop, call)
    try:
        return loop.run_until_complete(call)
    finally:
        _thread_calls.pop(thread_id, None)
        _cancel_leftovers(loop)


#: The call each thread is running on its kept loop, by thread id (see soft_limit_on_loop).
_thread_calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = {}


def soft_limit_on_loop(thread_id: int) -> bool:
    """Deliver a soft time limit to the ``async def`` call that thread ``thread_id`` runs on its
    kept loop: a cancellation that ``driven`` raises inside it as ``SoftTimeLimitExceeded``
    where it awaits, as on the asyncio pool (an exception raised into the thread would wait for
    the loop's next wake-up). False when that thread runs no such call."""
    found = _thread_calls.get(thread_id)
    if found is None:
        return False
    loop, call = found
    try:
        loop.call_soon_threadsafe(call.cancel, _SOFT_LIMIT)
    except RuntimeError:  # the loop is closed
        return False
    return True


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a call left on ``loop`` and let them finish (``asyncio.run``'s way)."""
    left = asyncio.all_tasks(loop)
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    for task in left:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception in a task left running by a call",
                    "exception": task.exception(),
                    "task": task,
                }
            )


#: The calls running on the asyncio pool's loop, by task id: their loop and asyncio task.
_on_the_loop: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = {}


def terminate_coroutine(task_id: str) -> bool:
    """Cancel the running coroutine of the call ``task_id`` on the asyncio pool's loop
    (``revoke(terminate=True)``): ``CancelledError`` is raised where it awaits, and the call
    fails with ``Terminated``. False when no such call runs there."""
    found = _on_the_loop.get(task_id)
    if found is None:
        return False
    loop, task = found
    _terminated.add(task_id)
    loop.call_soon_threadsafe(_cancel_if_running, task_id, task)
    return True


def terminate_when_running(task_id: str) -> None:
    """On the pool's loop: the call ``task_id`` was handed to the loop but its coroutine has
    not begun; ``running_on_loop`` cancels it as it begins (a terminate that came in between)."""
    _terminate_pending.add(task_id)


def _cancel_if_running(task_id: str, task: asyncio.Task[Any]) -> None:
    """On the loop: cancel ``task`` if it still runs the call ``task_id``. The asyncio pool
    runs one call after another in the same task, so by now it may have gone on to the next."""
    found = _on_the_loop.get(task_id)
    if found is not None and found[1] is task:
        task.cancel()


def forget_cancels(task: asyncio.Task[Any]) -> None:
    """Drop the cancellation requests a finished call left counted on the task that ran it
    (a terminate, or its soft time limit), so that the next call run by that task starts with
    none: Python 3.11 counts them, and ``asyncio.timeout`` reads the count."""
    uncancel = getattr(task, "uncancel", None)  # Python 3.11 and later
    if uncancel is not None:
        while uncancel() > 0:
            pass


@contextlib.contextmanager
def running_on_loop(task_id: str, soft_time_limit: float | None) -> Iterator[Callable[[], bool]]:
    """Around a call awaited by the asyncio task running it on the pool's loop: registers it
    for ``terminate_coroutine``, arms its soft time limit (a cancellation that ``driven``
    turns into ``SoftTimeLimitExceeded`` inside the body), and yields a function telling
    whether a cancellation came from ``terminate_coroutine``."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None
    _terminated.discard(task_id)
    _on_the_loop[task_id] = (loop, current)
    if task_id in _terminate_pending:
        # Cancelled where it first awaits (as _cancel_if_running does for a running call): a
        # call that ends without awaiting leaves no cancellation behind for the next one.
        _terminate_pending.discard(task_id)
        _terminated.add(task_id)
        loop.call_soon(_cancel_if_running, task_id, current)
    timer = (
        loop.call_later(soft_time_limit, current.cancel, _SOFT_LIMIT) if soft_time_limit else None
    )
    try:
        yield lambda: task_id in _terminated
    finally:
        if timer is not None:
            timer.cancel()
        if _on_the_loop.get(task_id, (None, None))[1] is current:
            del _on_the_loop[task_id]
        _terminated.discard(task_id)
        _terminate_pending.discard(task_id)


def _on_loop(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _T], task_id: str | None = None
) -> _T:
    """Run ``coro`` on ``loop`` (another thread's) in a copy of this thread's context (so that
    ``self.request`` reads this call's), and wait for it here.

    A soft time limit raised into this thread is raised inside the coroutine, where it awaits,
    as Celery raises it inside a task: the coroutine may catch it, clean up and return, and
    this thread waits on for its outcome. Anything else (a cold stop) cancels the coroutine.
    """
    context = contextvars.copy_context()
    outcome: concurrent.futures.Future[_T] = concurrent.futures.Future()
    started: list[asyncio.Task[_T]] = []

    def finish(task: asyncio.Task[_T]) -> None:
        terminated = False
        if task_id is not None:
            if _on_the_loop.get(task_id, (None, None))[1] is task:
                del _on_the_loop[task_id]
            terminated = task_id in _terminated
            _terminated.discard(task_id)
        if task.cancelled():
            outcome.set_exception(
                exceptions.Terminated("revoked, and its coroutine cancelled")
                if terminated
                else asyncio.CancelledError()
            )
        elif (exc := task.exception()) is not None:
            outcome.set_exception(exc)
        else:
            outcome.set_result(task.result())

    def start() -> None:
        task = context.run(loop.create_task, driven(coro))
        started.append(task)
        if task_id is not None:
            _terminated.discard(task_id)
            _on_the_loop[task_id] = (loop, task)
        task.add_done_callback(finish)

    def soft_limit() -> None:
        if started:
            started[0].cancel(_SOFT_LIMIT)

    loop.call_soon_threadsafe(start)
    while True:
        try:
            # In slices: an exception raised into this thread (a soft time limit) is only
            # delivered between them.
            with contextlib.suppress(concurrent.futures.TimeoutError):
                return outcome.result(timeout=0.25)
        except exceptions.SoftTimeLimitExceeded:
            if outcome.done():
                raise  # the coroutine's own outcome
            loop.call_soon_threadsafe(soft_limit)
        except BaseException:
            # Interrupted while waiting (a cold stop): stop the coroutine too.
            if started:
                loop.call_soon_threadsafe(started[0].cancel)
            raise


#: The message of the cancellation that stands for a soft time limit (see driven).
_SOFT_LIMIT = "pgtasks: soft time limit"
#: The calls cancelled by revoke(terminate=True), until they end.
_terminated: set[str] = set()
#: Calls a terminate reached after they were handed to the loop and before their coroutine
#: began (see terminate_when_running).
_terminate_pending: set[str] = set()


async def driven(coro: Coroutine[Any, Any, _T]) -> _T:
    """Await ``coro`` step by step, so that a cancellation carrying ``_SOFT_LIMIT`` is raised
    inside it as ``SoftTimeLimitExceeded`` rather than ``CancelledError``."""
    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            waiting = coro.send(send) if throw is None else coro.throw(throw)
        except StopIteration as stop:
            value: _T = stop.value
            return value
        send, throw = None, None
        try:
            if waiting is None:
                await asyncio.sleep(0)  # a bare yield: let the loop run once
            else:
                # What the task does with a future a coroutine hands it: await it afresh.
                waiting._asyncio_future_blocking = False
                send = await waiting
        except asyncio.CancelledError as exc:
            if exc.args == (_SOFT_LIMIT,):
                # Handled here: the task is no longer being cancelled (Python 3.11+ counts).
                uncancel = getattr(asyncio.current_task(), "uncancel", None)
                if uncancel is not None:
                    uncancel()
                throw = exceptions.SoftTimeLimitExceeded()
            else:
                throw = exc
        except BaseException as exc:  # the awaited future's error, raised where it was awaited
            throw = exc
