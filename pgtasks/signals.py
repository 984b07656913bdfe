"""Signals under Celery's names, sent with Celery's senders and keyword arguments.

>>> from pgtasks.signals import task_failure
>>> @task_failure.connect
... def report(sender=None, task_id=None, exception=None, **kwargs):
...     ...

Receivers run in the process where the event happens: task signals in the process that runs
the task (a prefork child, a pool thread), publish signals in the caller, worker signals in the
worker's main process. Connect receivers at import time in the module that creates the app, so
prefork children inherit them across ``fork``.

A receiver that raises is logged and its exception returned as its response; the event goes
on, as in Celery.
"""

from __future__ import annotations

import inspect
import os
import socket
import threading
import weakref
from collections.abc import Callable, Hashable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from pgtasks.message import TaskMessage

__all__ = [
    "Signal",
    "after_setup_logger",
    "after_setup_task_logger",
    "after_task_publish",
    "beat_embedded_init",
    "beat_init",
    "before_task_publish",
    "celeryd_after_setup",
    "celeryd_init",
    "heartbeat_sent",
    "import_modules",
    "setup_logging",
    "task_failure",
    "task_internal_error",
    "task_postrun",
    "task_prerun",
    "task_received",
    "task_rejected",
    "task_retry",
    "task_revoked",
    "task_success",
    "task_unknown",
    "worker_init",
    "worker_process_init",
    "worker_process_shutdown",
    "worker_ready",
    "worker_shutdown",
    "worker_shutting_down",
]

log = structlog.get_logger("pgtasks")

Receiver = Callable[..., Any]


def _make_id(target: Any) -> Hashable:
    """The key a sender or receiver is matched by: strings by value, other objects by identity.

    Celery matches string senders (``before_task_publish`` sends the task name) by value, and a
    ``@shared_task`` by the task it stands for, which exists only once an app does.
    """
    from pgtasks.app import SharedTask  # imported late: pgtasks.app imports this module (via task)

    if isinstance(target, (str, bytes)):
        return target
    if isinstance(target, SharedTask):
        return ("shared_task", target.name)
    if hasattr(target, "__func__"):
        return (id(getattr(target, "__self__", None)), id(target.__func__))
    return id(target)


def _sender_ids(sender: Any) -> tuple[Hashable, ...]:
    """Every key a registration may have used for ``sender``."""
    from pgtasks.task import Task

    ids: tuple[Hashable, ...] = (_make_id(sender),)
    if isinstance(sender, Task):
        # A task matches receivers connected with the @shared_task that names it.
        ids += (("shared_task", sender.name),)
    return ids


def _accepts_kwargs(fun: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: trust the caller
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


_NONE_ID = id(None)


class Signal:
    """A named event that receivers connect to (Celery's ``celery.utils.dispatch.Signal``).

    ``providing_args`` and ``use_caching`` are accepted for compatibility and only documented.
    """

    def __init__(
        self,
        providing_args: Any = None,
        use_caching: bool = False,
        name: str | None = None,
    ) -> None:
        self.name = name
        self.providing_args = set(providing_args or ())
        self.use_caching = use_caching
        self.lock = threading.Lock()
        # (lookup key, sender key, receiver or a weak reference to it)
        self._receivers: list[tuple[Hashable, Hashable, Any]] = []

    def __repr__(self) -> str:
        return f"<Signal: {self.name}>"

    __str__ = __repr__

    @property
    def receivers(self) -> list[tuple[tuple[Hashable, Hashable], Any]]:
        """Celery's shape: ``[((receiver key, sender key), receiver or weakref), ...]``."""
        with self.lock:
            return [((key, skey), r) for key, skey, r in self._receivers]

    @property
    def connected(self) -> bool:
        """Whether any receiver is connected, checked without the lock or a copy (the hot
        paths ask this once or more per task, and most signals have no receiver)."""
        return bool(self._receivers)

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        """Connect a receiver: ``sig.connect(fun, sender=None, weak=True, dispatch_uid=None)``,
        or as a decorator, ``@sig.connect`` or ``@sig.connect(sender=task)``.

        ``sender`` restricts the receiver to events from that sender; ``weak`` (the default)
        holds the receiver by weak reference, so it goes away with its owner; ``dispatch_uid``
        connects a receiver at most once under that key. Returns the receiver.
        """

        def options(
            sender: Any = None,
            weak: bool = True,
            dispatch_uid: Hashable | None = None,
            retry: bool = False,
        ) -> Callable[[Receiver], Receiver]:
            def register(fun: Receiver) -> Receiver:
                self._connect(fun, sender, weak and not retry, dispatch_uid)
                return fun

            return register

        if args and callable(args[0]):
            return options(*args[1:], **kwargs)(args[0])
        return options(*args, **kwargs)

    def _connect(
        self, receiver: Receiver, sender: Any, weak: bool, dispatch_uid: Hashable | None
    ) -> None:
        if not callable(receiver):
            raise TypeError("signal receivers must be callable")
        if not _accepts_kwargs(receiver):
            raise ValueError("Signal receiver must accept keyword arguments.")
        key = dispatch_uid if dispatch_uid is not None else _make_id(receiver)
        skey = _make_id(sender)
        held: Any = receiver
        if weak:
            if hasattr(receiver, "__self__") and hasattr(receiver, "__func__"):
                held = weakref.WeakMethod(receiver)
            else:
                try:
                    held = weakref.ref(receiver)
                except TypeError:  # not weak-referenceable (a builtin, a partial): keep it
                    held = receiver
        with self.lock:
            self._prune()
            if not any(k == key and s == skey for k, s, _ in self._receivers):
                self._receivers.append((key, skey, held))

    def disconnect(
        self,
        receiver: Receiver | None = None,
        sender: Any = None,
        weak: bool | None = None,
        dispatch_uid: Hashable | None = None,
    ) -> bool:
        """Disconnect a receiver (by itself or its ``dispatch_uid``) from ``sender``; returns
        whether one was connected."""
        key = dispatch_uid if dispatch_uid is not None else _make_id(receiver)
        skey = _make_id(sender)
        with self.lock:
            self._prune()
            for index, (k, s, _) in enumerate(self._receivers):
                if k == key and s == skey:
                    del self._receivers[index]
                    return True
        return False

    def has_listeners(self, sender: Any = None) -> bool:
        """Whether any live receiver would get an event from ``sender``."""
        return bool(self._live_receivers(sender))

    def send(self, sender: Any, **named: Any) -> list[tuple[Receiver, Any]]:
        """Call every receiver connected for ``sender`` (or for any sender) with
        ``signal=self, sender=sender, **named``; returns ``[(receiver, response), ...]``.

        A receiver's exception is logged and returned as its response, never raised.
        """
        if not self._receivers:
            return []
        responses: list[tuple[Receiver, Any]] = []
        for receiver in self._live_receivers(sender):
            try:
                response = receiver(signal=self, sender=sender, **named)
            except Exception as exc:
                log.exception(
                    "signal.receiver_failed",
                    signal=self.name,
                    receiver=getattr(receiver, "__qualname__", repr(receiver)),
                    error=repr(exc),
                )
                responses.append((receiver, exc))
            else:
                responses.append((receiver, response))
        return responses

    # Django's name for the same thing, which Celery keeps.
    send_robust = send

    def _live_receivers(self, sender: Any) -> list[Receiver]:
        wanted = {_NONE_ID, *_sender_ids(sender)}
        with self.lock:
            entries = [held for _, skey, held in self._receivers if skey in wanted]
        live: list[Receiver] = []
        for held in entries:
            if isinstance(held, weakref.ref):
                target = held()
                if target is not None:
                    live.append(target)
            else:
                live.append(held)
        return live

    def _prune(self) -> None:
        """Drop receivers whose weak reference died (caller holds the lock)."""
        self._receivers = [
            entry
            for entry in self._receivers
            if not (isinstance(entry[2], weakref.ref) and entry[2]() is None)
        ]


# -- task signals: sent by Task.apply_async (publish) and by the process running the task ------

#: Before a row is written. sender: the task name; body, exchange, routing_key, headers,
#: properties, declare, retry_policy. Changes a receiver makes to ``headers`` are stored.
before_task_publish = Signal(name="before_task_publish")
#: After a row is written. sender: the task name; body, headers, exchange, routing_key.
after_task_publish = Signal(name="after_task_publish")
#: sender: the consumer (here the Worker); request. Not sent yet.
task_received = Signal(name="task_received")
#: Before the task body runs. sender: the task; task_id, task, args, kwargs.
task_prerun = Signal(name="task_prerun")
#: After the task ran, whatever happened. sender: the task; task_id, task, args, kwargs,
#: retval, state.
task_postrun = Signal(name="task_postrun")
#: sender: the task; result.
task_success = Signal(name="task_success")
#: sender: the task; task_id, exception, args, kwargs, traceback, einfo.
task_failure = Signal(name="task_failure")
#: sender: the task; request, reason, einfo.
task_retry = Signal(name="task_retry")
#: sender: the task; request, terminated, signum, expired.
task_revoked = Signal(name="task_revoked")
#: sender: the task; task_id, args, kwargs, request, exception, traceback, einfo. Not sent yet.
task_internal_error = Signal(name="task_internal_error")
#: A row names a task this worker does not know. sender: the worker; name, id, message, exc.
task_unknown = Signal(name="task_unknown")
#: A row cannot be run at all (its payload does not decode). sender: the worker; message, exc.
task_rejected = Signal(name="task_rejected")

# -- worker signals ------------------------------------------------------------------------------

#: sender: the hostname; instance (the worker), conf, options.
celeryd_init = Signal(name="celeryd_init")
#: sender: the hostname; instance, conf.
celeryd_after_setup = Signal(name="celeryd_after_setup")
#: Before the worker starts its pool. sender: the worker.
worker_init = Signal(name="worker_init")
#: The worker claims tasks from now on. sender: the worker.
worker_ready = Signal(name="worker_ready")
#: Sent in every prefork child (and in the solo pool's process) before it runs a task.
#: sender: None.
worker_process_init = Signal(name="worker_process_init")
#: A prefork child is exiting. sender: None; pid, exitcode.
worker_process_shutdown = Signal(name="worker_process_shutdown")
#: The worker was asked to stop. sender: the hostname; sig, how ('Warm' or 'Cold'), exitcode.
worker_shutting_down = Signal(name="worker_shutting_down")
#: The worker stopped. sender: the worker.
worker_shutdown = Signal(name="worker_shutdown")
#: sender: the worker. Not sent: liveness is the workers table's heartbeat column.
heartbeat_sent = Signal(name="heartbeat_sent")
#: sender: the app; Celery sends it when importing task modules. Not sent yet.
import_modules = Signal(name="import_modules")

# -- beat ------------------------------------------------------------------------------------------

#: sender: the scheduler (``pgtasks beat`` or a worker's ``-B``), when it starts.
beat_init = Signal(name="beat_init")
#: sender: the beat service embedded in a worker. Not sent yet.
beat_embedded_init = Signal(name="beat_embedded_init")

# -- logging -------------------------------------------------------------------------------------

#: sender: None; loglevel, logfile, format, colorize. When any receiver is connected, pgtasks
#: leaves logging to it and configures nothing.
setup_logging = Signal(name="setup_logging")
#: After pgtasks configured logging. sender: None; logger (the root logger), loglevel, logfile,
#: format, colorize.
after_setup_logger = Signal(name="after_setup_logger")
#: sender: None; logger (the task logger), loglevel, logfile, format, colorize.
after_setup_task_logger = Signal(name="after_setup_task_logger")


# -- sending the publish signals (used by Task.apply_async and apply_many) -----------------------


def _celery_headers(msg: TaskMessage, args: Any, kwargs: Any) -> dict[str, Any]:
    """The protocol-v2 headers Celery would publish for ``msg``."""
    eta = msg.eta
    if eta is None and msg.countdown is not None:
        eta = datetime.now(timezone.utc) + timedelta(seconds=msg.countdown)
    expires = msg.expires_at
    if expires is None and msg.expires_in is not None:
        expires = datetime.now(timezone.utc) + timedelta(seconds=msg.expires_in)
    return {
        "lang": "py",
        "task": msg.name,
        "id": msg.id,
        "shadow": None,
        "eta": eta.isoformat() if eta else None,
        "expires": expires.isoformat() if expires else None,
        "group": msg.headers.get("group"),
        "group_index": msg.headers.get("group_index"),
        "retries": 0,
        "timelimit": [msg.headers.get("time_limit"), msg.headers.get("soft_time_limit")],
        "root_id": msg.headers.get("root_id") or msg.id,
        "parent_id": msg.headers.get("parent_id"),
        "argsrepr": msg.headers.get("argsrepr") or repr(tuple(args or ())),
        "kwargsrepr": msg.headers.get("kwargsrepr") or repr(dict(kwargs or {})),
        "origin": f"{socket.gethostname()}@{os.getpid()}",
        "ignore_result": bool(msg.headers.get("ignore_result", False)),
    }


def _body(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return tuple(args or ()), dict(kwargs or {}), embed


def send_before_publish(msg: TaskMessage, args: Any, kwargs: Any) -> None:
    """``before_task_publish`` for one row about to be written.

    Headers a receiver adds or changes are kept in the row's headers (the way tracing
    libraries pass context to the worker).
    """
    if not before_task_publish.connected:
        return
    generated = _celery_headers(msg, args, kwargs)
    headers = {**generated, **msg.headers}
    before_task_publish.send(
        sender=msg.name,
        body=_body(args, kwargs),
        exchange="",
        routing_key=msg.queue,
        headers=headers,
        properties={
            "correlation_id": msg.id,
            "reply_to": "",
            "priority": msg.priority,
            "delivery_mode": 2,
        },
        declare=[],
        retry_policy={},
    )
    for key, value in headers.items():
        if key in msg.headers or key not in generated or generated[key] != value:
            msg.headers[key] = value


def send_after_publish(msg: TaskMessage, args: Any, kwargs: Any) -> None:
    """``after_task_publish`` for one row just written (committed, unless the caller passed a
    connection inside its own transaction)."""
    if not after_task_publish.connected:
        return
    after_task_publish.send(
        sender=msg.name,
        body=_body(args, kwargs),
        headers={**_celery_headers(msg, args, kwargs), **msg.headers},
        exchange="",
        routing_key=msg.queue,
    )
