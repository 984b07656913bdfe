"""Task: the decorated function, with Celery's calling API (delay, apply_async, retry)."""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import reprlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar

import structlog

from pgtasks import concurrency, exceptions, ratelimits, signals, tracing, unique
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.headers import CONCURRENCY_KEY, CONCURRENCY_LIMIT, TIMELIMIT
from pgtasks.headers import timelimit as timelimit_header
from pgtasks.request import Request
from pgtasks.retry import exponential_backoff
from pgtasks.serialization import EncodeError, encode, encoder, find_unencodable
from pgtasks.transaction import resolve
from pgtasks.utils import uuid as new_id
from pgtasks.worker.loop import driven, run_coroutine

if TYPE_CHECKING:
    import psycopg

    from pgtasks.app import Celery
    from pgtasks.canvas import Signature
    from pgtasks.config import Settings
    from pgtasks.effects import Effect
    from pgtasks.message import TaskMessage
    from pgtasks.result import AsyncResult

P = ParamSpec("P")
R = TypeVar("R")
_T = TypeVar("_T")


class Task(Generic[P, R]):
    """A registered task. Calling it runs the function here; ``delay`` enqueues a row.

    Class attributes are the defaults that ``@app.task(...)`` options override, with Celery's
    names and values.
    """

    name: str = ""
    max_retries: int | None = 3
    default_retry_delay: float = 180.0
    autoretry_for: tuple[type[BaseException], ...] = ()
    retry_kwargs: dict[str, Any] = {}
    retry_backoff: bool | float = False
    retry_backoff_max: float = 600.0
    retry_jitter: bool = True
    priority: int | None = None
    queue: str | None = None
    ignore_result: bool | None = None
    serializer: str | None = None
    typing: bool = True
    #: Seconds (Celery's options): the soft limit raises SoftTimeLimitExceeded in the task, the
    #: hard one kills its prefork child and fails it with TimeLimitExceeded. None: the worker's.
    time_limit: float | None = None
    soft_time_limit: float | None = None
    #: Celery's rate limit ("10/s", "100/m", "2/h" or tasks per second), held across every
    #: worker through the database. None: the app's ``task_default_rate_limit``.
    rate_limit: str | float | None = None
    #: Keep arguments out of logs and ``inspect``: True hides them all; a list of keyword
    #: names hides those values. A call's own ``argsrepr``/``kwargsrepr`` win.
    redact: bool | Sequence[str] = False
    #: Unique tasks (see pgtasks.unique): argument names, or a function of the arguments that
    #: returns the key. A call's own ``unique_key`` wins.
    unique_on: unique.UniqueOn | None = None
    #: How long a unique key is held: "finished" (default), "started", or a duration.
    unique_for: unique.UniqueFor | None = None
    #: Global concurrency limit (see pgtasks.concurrency): at most this many calls running at
    #: once across every worker; per key when ``concurrency_key`` is set. None: no limit.
    concurrency_limit: int | None = None
    #: What the limit is counted by: argument names (one count per value, e.g.
    #: ``("customer_id",)``), or a function of the arguments that returns the key (None: that
    #: call is not limited). Unset: the task as a whole.
    concurrency_key: concurrency.ConcurrencyKey | None = None
    #: The message maker of a call without options, with what it was made from.
    _plain: tuple[Any, Any, Callable[..., Any]] | None = None

    MaxRetriesExceededError = exceptions.MaxRetriesExceededError

    def __init__(
        self, app: Celery, fun: Callable[..., R], name: str, bind: bool, **options: Any
    ) -> None:
        self.app = app
        self.fun = fun
        self.name = name
        self.bind = bind
        for key, value in options.items():
            setattr(self, key, value)
        if self.autoretry_for and not isinstance(self.autoretry_for, tuple):
            self.autoretry_for = tuple(self.autoretry_for)
        try:
            ratelimits.rate(self.rate_limit)
            unique.hold(self.unique_for)
            concurrency.check_limit(self.concurrency_limit)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"task {name!r}: {exc}") from None
        if self.concurrency_key is not None and self.concurrency_limit is None:
            raise ImproperlyConfigured(
                f"task {name!r}: concurrency_key needs concurrency_limit (how many may run "
                "at once for each key)"
            )
        by_names = self.unique_on is not None or (
            self.concurrency_key is not None and not callable(self.concurrency_key)
        )
        self._call_signature = unique.call_signature(fun, bind) if by_names else None
        try:
            unique.check_unique_on(name, self._call_signature, self.unique_on)
            unique.check_unique_on(
                name, self._call_signature, self.concurrency_key, "concurrency_key"
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(str(exc)) from None
        # A context variable rather than a thread-local: each thread starts with a context of
        # its own, and an async def body run on a shared event loop gets the caller's copy.
        self._requests: contextvars.ContextVar[tuple[Request, ...]] = contextvars.ContextVar(
            f"pgtasks_request_{name}", default=()
        )
        self.__doc__ = fun.__doc__
        self.__name__ = getattr(fun, "__name__", name)
        self.__module__ = getattr(fun, "__module__", __name__)
        self.__wrapped__ = fun

    def __repr__(self) -> str:
        return f"<@task: {self.name}>"

    # -- running -----------------------------------------------------------------------------

    @property
    def request(self) -> Request:
        """The context of the call running in this thread or coroutine (a direct call when
        none is)."""
        stack = self._requests.get()
        return stack[-1] if stack else Request()

    def push_request(self, request: Request) -> None:
        self._requests.set((*self._requests.get(), request))

    def pop_request(self) -> None:
        self._requests.set(self._requests.get()[:-1])

    def run(self, *args: Any, **kwargs: Any) -> R:
        """Run the task body with ``autoretry_for`` applied; the worker calls this. An
        ``async def`` body runs to its end on an event loop of its own."""
        try:
            value = self.fun(self, *args, **kwargs) if self.bind else self.fun(*args, **kwargs)
            if inspect.iscoroutine(value):
                value = run_coroutine(value, self.request.id)
            return value
        except exceptions.Retry:
            raise
        except self.autoretry_for as exc:
            self._autoretry(exc)
            raise  # pragma: no cover - _autoretry always raises

    @property
    def runs_on_loop(self) -> bool:
        """Whether the asyncio pool awaits this task's calls on its event loop itself
        (``run_on_loop``): an ``async def`` body that no subclass's ``run`` replaces."""
        return type(self).run is Task.run and inspect.iscoroutinefunction(self.fun)

    async def run_on_loop(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], soft_time_limit: float | None
    ) -> R:
        """``run`` for the asyncio pool: the body's coroutine is awaited on the running loop,
        with ``autoretry_for`` applied. Under a soft time limit it is driven step by step, so
        that the limit is raised inside it (see ``running_on_loop``)."""
        try:
            value = self.fun(self, *args, **kwargs) if self.bind else self.fun(*args, **kwargs)
            if inspect.iscoroutine(value):
                value = await (driven(value) if soft_time_limit else value)
            result: R = value
            return result
        except exceptions.Retry:
            raise
        except self.autoretry_for as exc:
            self._autoretry(exc)
            raise  # pragma: no cover - _autoretry always raises

    def _autoretry(self, exc: BaseException) -> NoReturn:
        """Retry for an exception listed in ``autoretry_for``, with its backoff."""
        if self.retry_backoff:
            countdown = exponential_backoff(
                self.request.retries,
                factor=float(self.retry_backoff),
                maximum=self.retry_backoff_max,
                full_jitter=self.retry_jitter,
            )
            self.retry(exc=exc, countdown=countdown, **self.retry_kwargs)
        self.retry(exc=exc, **self.retry_kwargs)
        raise AssertionError("retry() returned")  # pragma: no cover - retry always raises

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function in this process, as Celery does (``request.called_directly``)."""
        self.push_request(Request(args=tuple(args), kwargs=dict(kwargs), called_directly=True))
        try:
            if self.bind:
                return self.fun(self, *args, **kwargs)
            return self.fun(*args, **kwargs)
        finally:
            self.pop_request()

    # -- hooks (override in a ``base=`` subclass) --------------------------------------------

    def before_start(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called in the worker before the task runs."""

    def on_success(
        self, retval: Any, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Called in the worker after the task returned."""

    def on_failure(
        self,
        exc: BaseException,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        einfo: Any,
    ) -> None:
        """Called in the worker when the task failed for good."""

    def on_retry(
        self,
        exc: BaseException,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        einfo: Any,
    ) -> None:
        """Called in the worker when the task will be retried."""

    def after_return(
        self,
        status: str,
        retval: Any,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        einfo: Any,
    ) -> None:
        """Called in the worker after any outcome."""

    def effect(self, name: str, connection: Any = None) -> Effect:
        """Mark one side effect of the running task, so that a run after a crash skips it::

            with self.effect("charge") as first_time:
                if first_time:
                    ...

        In a database transaction (``connection=``, or one ``app.transaction`` or Django's
        ``atomic()`` binds) the effect is recorded in it and commits with the effect's writes;
        outside one it is recorded when the block succeeds, and ``effect.key`` (the task id and
        ``name``) is the idempotency key to give the service it calls. See pgtasks.effects.
        """
        from pgtasks.effects import Effect, transaction_of

        task_id = self.request.id
        if not task_id:
            raise RuntimeError(
                f"{self.name}: effect() marks an effect of a running task, and none runs here "
                "(a direct call has no task id)"
            )
        if not isinstance(name, str) or not name:
            raise TypeError(f"an effect's name must be a non-empty string, not {name!r}")
        name = _check_text("effect name", name)
        conn = transaction_of(resolve(self.app, connection), explicit=connection is not None)
        return Effect(self.app.broker, task_id, name, conn)

    # -- enqueueing ----------------------------------------------------------------------------

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> AsyncResult:
        """Enqueue a call with default options; the row is committed when this returns."""
        return self.apply_async(args, kwargs)

    def delay_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """``delay`` once Django's current transaction commits (Celery 5.4's ``DjangoTask``);
        nothing is enqueued if it rolls back, and it enqueues at once outside a transaction.

        Returns None, as in Celery: the task does not exist until the commit.
        """
        from pgtasks.contrib.django import on_commit

        on_commit(lambda: self.delay(*args, **kwargs))

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``apply_async`` once Django's current transaction commits (see ``delay_on_commit``)."""
        from pgtasks.contrib.django import on_commit

        on_commit(lambda: self.apply_async(*args, **kwargs))

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        task_id: str | None = None,
        countdown: float | None = None,
        eta: datetime | None = None,
        expires: float | datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        headers: dict[str, Any] | None = None,
        serializer: str | None = None,
        ignore_result: bool | None = None,
        max_retries: int | None = None,
        connection: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a call. ``eta``/``countdown`` set when it may run, ``expires`` when it stops
        being worth running; ``connection`` enqueues inside that connection's transaction."""
        settings = self.app.settings  # checked once per call: it compares the whole conf
        if settings.always_eager:
            return self.apply(args, kwargs, task_id=task_id)
        with tracing.producer(self.name) as inject:
            if (
                countdown is None
                and eta is None
                and expires is None
                and priority is None
                and queue is None
                and headers is None
                and serializer is None
                and ignore_result is None
                and max_retries is None
                and not options
                and type(self).build_message is Task.build_message
            ):
                # A call with no options (delay()): the row as build_message would make it,
                # without passing every option along to be looked at again.
                msg = self._plain_maker(settings)(args, kwargs, task_id)
            else:
                msg = self.build_message(
                    args,
                    kwargs,
                    task_id=task_id,
                    countdown=countdown,
                    eta=eta,
                    expires=expires,
                    priority=priority,
                    queue=queue,
                    headers=headers,
                    serializer=serializer,
                    ignore_result=ignore_result,
                    max_retries=max_retries,
                    _settings=settings,
                    **options,
                )
            holder = self._publish(msg, args, kwargs, inject, connection)
        return self._result_of(msg, holder)

    def _result_of(self, msg: TaskMessage, holder: str) -> AsyncResult:
        """The handle ``apply_async`` returns for ``msg``, held by ``holder``."""
        result = self.AsyncResult(holder)
        result.ignored = bool(msg.headers.get("ignore_result"))
        return result

    def _publish(
        self,
        msg: TaskMessage,
        args: Sequence[Any] | None,
        kwargs: dict[str, Any] | None,
        inject: tracing.Inject,
        connection: Any,
    ) -> str:
        """Sign ``msg`` with the trace context and write its row (with its publish signals).
        Returns the id of the task holding the call (another task's id when the call is
        unique and its key is held: then nothing was written)."""
        inject(msg.headers, msg.queue)
        signals.send_before_publish(msg, args, kwargs)
        holder = self.app.broker.enqueue(msg, conn=self._enqueue_conn(connection))
        _published(msg, holder, args, kwargs)
        return holder

    # -- canvas ------------------------------------------------------------------------------

    def signature(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Signature:
        """A signature of a call of this task (``options`` are ``apply_async`` options)."""
        from pgtasks.canvas import Signature

        immutable = bool(options.pop("immutable", False))
        opts = dict(options.pop("options", None) or {}, **options)
        return Signature(self, args, kwargs, opts, immutable=immutable, app=self.app)

    subtask = signature

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """``task.s(1, x=2)``: a signature with partial arguments."""
        return self.signature(args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: it ignores a parent's result when chained or linked."""
        return self.signature(args, kwargs, immutable=True)

    def map(self, it: Sequence[Any]) -> Signature:
        """One task that calls this task on each item (Celery's ``xmap``)."""
        from pgtasks.canvas import xmap

        return xmap(self, it)

    def starmap(self, it: Sequence[Sequence[Any]]) -> Signature:
        """One task that calls this task with each item as its arguments (``xstarmap``)."""
        from pgtasks.canvas import xstarmap

        return xstarmap(self, it)

    def chunks(self, it: Sequence[Sequence[Any]], n: int) -> Signature:
        """``it`` split into tasks of ``n`` calls each (Celery's ``chunks``)."""
        from pgtasks.canvas import chunks

        return chunks(self, it, n)

    def apply_many(
        self,
        calls: Sequence[tuple[Sequence[Any], dict[str, Any]] | Sequence[Any]],
        connection: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> list[AsyncResult]:
        """Enqueue many calls in one statement. Each item is ``(args, kwargs)`` or an args tuple."""
        if "task_id" in options:
            raise TypeError("apply_many gives every call an id of its own; task_id is refused")
        # Whether the rows can go with COPY as they are built (see Broker.enqueue_stream): no
        # unique key to settle first, no time relative to the database clock, and no
        # before_task_publish receiver that must see every message before any is sent.
        stream = (
            "unique_key" not in options
            and self.unique_on is None
            and options.get("countdown") is None
            and not isinstance(options.get("expires"), (int, float, timedelta))
            and not signals.before_task_publish.connected
        )
        if type(self).message_maker is Task.message_maker:
            make, row = self._makers(**options)
        else:  # a subclass's own messages: each goes through its maker
            make, row = self.message_maker(**options), None
        bodies = []
        for call in calls:
            if len(call) == 2 and isinstance(call[1], dict) and isinstance(call[0], (list, tuple)):
                bodies.append((call[0], call[1]))
            else:
                bodies.append((tuple(call), {}))
        from pgtasks.broker import CopyRefused

        conn = self._enqueue_conn(connection)
        broker = self.app.broker
        if (
            stream
            and row is not None
            and not signals.after_task_publish.connected
            and not broker.copy_refused(conn)
        ):
            # No message to hand to a signal: each call goes straight to its COPY row.
            try:
                rows = broker.enqueue_rows((row(a, k, None) for a, k in bodies), conn)
            except CopyRefused:
                pass  # row-level security applies: the messages below are inserted instead
            else:
                return [self.AsyncResult(r[0]) for r in rows]
        if stream:
            msgs = broker.enqueue_stream((make(a, k, None) for a, k in bodies), conn)
            holders = [msg.id for msg in msgs]
        else:
            msgs = [make(args, kwargs, None) for args, kwargs in bodies]
            if signals.before_task_publish.connected:
                for msg, (args, kwargs) in zip(msgs, bodies, strict=True):
                    signals.send_before_publish(msg, args, kwargs)
            holders = broker.enqueue_many(msgs, conn=conn)
        if signals.after_task_publish.connected:
            for msg, (args, kwargs), holder in zip(msgs, bodies, holders, strict=True):
                if holder == msg.id:
                    signals.send_after_publish(msg, args, kwargs)
        return [self.AsyncResult(holder) for holder in holders]

    def _enqueue_conn(self, connection: Any) -> psycopg.Connection[Any] | None:
        """The caller's connection, else the one an ``app.transaction`` block (or an
        integration such as Django's) binds, else None for the app's pool."""
        return resolve(self.app, connection)

    def build_message(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        task_id: str | None = None,
        **options: Any,
    ) -> TaskMessage:
        """The row a call would write, with every option checked."""
        settings = options.pop("_settings", None)
        for value in options.values():
            if value is not None:
                return self.message_maker(_settings=settings, **options)(args, kwargs, task_id)
        return self._plain_maker(settings)(args, kwargs, task_id)

    def _plain_maker(
        self, settings: Settings | None
    ) -> Callable[[Sequence[Any] | None, dict[str, Any] | None, str | None], TaskMessage]:
        """``message_maker()`` for a call without options (``delay``), kept while the app's
        settings and the task's own defaults stay as they were."""
        if settings is None:
            settings = self.app.settings
        defaults = (
            self.name,
            self.serializer,
            self.priority,
            self.queue,
            self.ignore_result,
            self.max_retries,
            self.unique_for,
            self.unique_on,
            self.concurrency_limit,
            self.concurrency_key,
        )
        kept = self._plain
        if kept is not None and kept[0] is settings and kept[1] == defaults:
            return kept[2]
        make = self.message_maker(_settings=settings)
        self._plain = (settings, defaults, make)
        return make

    def message_maker(
        self, **options: Any
    ) -> Callable[[Sequence[Any] | None, dict[str, Any] | None, str | None], TaskMessage]:
        """Check the calling options once (those of ``apply_async``, see ``_makers``); the
        function returned builds the row of one call ``(args, kwargs, task_id)`` with them
        (``apply_many`` calls it for every item)."""
        return self._makers(**options)[0]

    def _makers(
        self,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
        expires: float | datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        headers: dict[str, Any] | None = None,
        serializer: str | None = None,
        ignore_result: bool | None = None,
        max_retries: int | None = None,
        _settings: Settings | None = None,
        **options: Any,
    ) -> tuple[
        Callable[[Sequence[Any] | None, dict[str, Any] | None, str | None], TaskMessage],
        Callable[[Sequence[Any], dict[str, Any], str | None], tuple[Any, ...]] | None,
    ]:
        """``message_maker``'s function, and one that builds the same call's row as COPY sends
        it (``Broker.copy_row`` of the message) without the message, where the options allow
        (json, no unique key, no concurrency limit, no time relative to the database clock, no
        routing by the call); None where they do not."""
        from pgtasks.message import TaskMessage

        settings = _settings if _settings is not None else self.app.settings
        serializer = serializer or self.serializer or settings.task_serializer
        if countdown is not None and eta is not None:
            raise ValueError("give eta or countdown, not both")
        if countdown is not None:
            countdown = _seconds("countdown", countdown)
        if eta is not None:
            eta = _aware("eta", eta, self.app.timezone)
        expires_at: datetime | None = None
        expires_in: float | None = None
        if isinstance(expires, datetime):
            expires_at = _aware("expires", expires, self.app.timezone)
        elif expires is not None:
            expires_in = _seconds("expires", expires)
        if priority is None:
            priority = self.priority if self.priority is not None else settings.default_priority
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an integer, not {type(priority).__name__}")
        if not -(2**31) <= priority < 2**31:
            raise ValueError(f"priority {priority} is out of range (a 32-bit integer)")
        fixed_queue = queue or self.queue
        if fixed_queue is not None:
            _check_queue(fixed_queue)
        base_headers: dict[str, Any] = dict(headers or {})
        limits = timelimit_header(
            options.pop("time_limit", None), options.pop("soft_time_limit", None)
        )
        if limits is not None:
            base_headers[TIMELIMIT] = limits
        if ignore_result is None:
            ignore_result = (
                self.ignore_result if self.ignore_result is not None else settings.ignore_result
            )
        if ignore_result:
            base_headers["ignore_result"] = True
        if serializer != settings.result_serializer:
            base_headers.setdefault("result_serializer", settings.result_serializer)
        for key in ("link", "link_error"):
            # Canvas callbacks travel in the headers as signature dicts.
            from pgtasks.canvas import signature_list

            callbacks = signature_list(options.get(key))
            if callbacks:
                options.pop(key)
                base_headers[key] = callbacks
        argsrepr, kwargsrepr = options.pop("argsrepr", None), options.pop("kwargsrepr", None)
        unique_key: str | None = options.pop("unique_key", None)
        unique_for = options.pop("unique_for", None)
        held = unique.hold(unique_for if unique_for is not None else self.unique_for)
        if unique_key is not None:
            if not isinstance(unique_key, str) or not unique_key:
                raise TypeError(f"unique_key must be a non-empty string, not {unique_key!r}")
            unique_key = _check_text("unique_key", unique_key)
        unique_on = self.unique_on if unique_key is None else None
        if unique_for is not None and unique_key is None and unique_on is None:
            raise ValueError(
                f"unique_for needs a key: give unique_key, or unique_on to task {self.name!r}"
            )
        limited = self._concurrency(
            options.pop("concurrency_key", None),
            options.pop("concurrency_limit", None),
            settings.queue_concurrency_limits,
        )
        if options:
            # Celery options without a meaning here are accepted, so calling code keeps working.
            base_headers.setdefault("options", {k: v for k, v in options.items() if _is_plain(v)})
        if max_retries is None:
            max_retries = self.max_retries
        max_payload = settings.max_payload_bytes
        default_queue = settings.default_queue
        name = _check_text("task name", self.name)
        encode_body = encoder(serializer)

        def make(
            args: Sequence[Any] | None, kwargs: dict[str, Any] | None, task_id: str | None = None
        ) -> TaskMessage:
            args = tuple(args or ())
            kwargs = dict(kwargs or {})
            try:
                body = encode_body([list(args), kwargs])
            except EncodeError as exc:
                culprit = find_unencodable(args, kwargs, serializer)
                where = f" {culprit}" if culprit else ""
                raise EncodeError(
                    f"cannot enqueue {name}: argument{where} cannot be serialized with "
                    f"{serializer!r}: {exc}"
                ) from exc
            if len(body.data) > max_payload:
                raise EncodeError(
                    f"cannot enqueue {name}: payload is {len(body.data)} bytes, over the "
                    f"{max_payload}-byte limit (max_payload_bytes); pass a reference "
                    "to the data instead"
                )
            call_queue = fixed_queue
            if call_queue is None:
                call_queue = _check_queue(self.app.route(name, args, kwargs) or default_queue)
            call_headers = dict(base_headers)
            if limited is not None:
                limit = limited(call_queue, args, kwargs)
                if limit is not None:
                    call_headers[CONCURRENCY_KEY], call_headers[CONCURRENCY_LIMIT] = limit
            # A small payload has a small repr: the plain one is several times faster.
            small = len(body.data) <= REPR_MAX
            call_headers["argsrepr"] = (
                argsrepr if argsrepr is not None else self._argsrepr(args, small)
            )
            call_headers["kwargsrepr"] = (
                kwargsrepr if kwargsrepr is not None else self._kwargsrepr(kwargs, small)
            )
            msg = TaskMessage(
                id=_check_text("task id", task_id) if task_id else new_id(),
                name=name,
                queue=call_queue,
                priority=priority,
                body=body,
                headers=call_headers,
                eta=eta,
                countdown=countdown,
                expires_at=expires_at,
                expires_in=expires_in,
                max_retries=max_retries,
            )
            if unique_key is None and unique_on is None:
                return msg
            return self._unique(msg, unique_key, unique_on, held, args, kwargs)

        return make, self._row_maker(
            make,
            name=name,
            queue=fixed_queue,
            priority=priority,
            eta=eta,
            expires_at=expires_at,
            max_retries=max_retries,
            serializer=serializer,
            max_payload=max_payload,
            default_queue=default_queue,
            base_headers=base_headers,
            reprs=(argsrepr, kwargsrepr),
            plain=limited is None
            and unique_key is None
            and unique_on is None
            and countdown is None
            and expires_in is None,
        )

    def _row_maker(
        self,
        make: Callable[[Sequence[Any] | None, dict[str, Any] | None, str | None], TaskMessage],
        *,
        name: str,
        queue: str | None,
        priority: int,
        eta: datetime | None,
        expires_at: datetime | None,
        max_retries: int | None,
        serializer: str,
        max_payload: int,
        default_queue: str,
        base_headers: dict[str, Any],
        reprs: tuple[Any, Any],
        plain: bool,
    ) -> Callable[[Sequence[Any], dict[str, Any], str | None], tuple[Any, ...]] | None:
        """The row function of ``_makers``: each value ``make`` would put in the message, made
        the same way but written straight into COPY's row (with the headers' json made from a
        prefix encoded once). Where a call's payload does not encode or is too large, ``make``
        raises its error."""
        from pgtasks.app import Celery
        from pgtasks.broker import headers_json_maker
        from pgtasks.serialization import JSON, json_text_encoder

        text_of = json_text_encoder(serializer)
        argsrepr, kwargsrepr = reprs
        if (
            not plain
            or text_of is None
            or not isinstance(argsrepr, (str, type(None)))
            or not isinstance(kwargsrepr, (str, type(None)))
        ):
            return None
        if queue is None:
            # Routed by task_routes (which may look at the call): only the default queue here.
            if type(self.app).route is not Celery.route or self.app.conf.get("task_routes"):
                return None
            queue = _check_queue(default_queue)
        headers_of = headers_json_maker(base_headers)
        if headers_of is None:
            return None
        run_at: Any = "now" if eta is None else eta
        argsrepr_of, kwargsrepr_of = self._argsrepr, self._kwargsrepr

        def row(
            args: Sequence[Any], kwargs: dict[str, Any], task_id: str | None = None
        ) -> tuple[Any, ...]:
            args = tuple(args or ())
            kwargs = dict(kwargs or {})
            try:
                text = text_of([list(args), kwargs])
                size = len(text) if text.isascii() else len(text.encode("utf-8"))
            except Exception:
                size = -1
            if size < 0 or size > max_payload:
                from pgtasks.broker import copy_row

                return copy_row(make(args, kwargs, task_id))  # raises the call's error
            small = size <= REPR_MAX
            return (
                _check_text("task id", task_id) if task_id else new_id(),
                name,
                queue,
                priority,
                run_at,
                expires_at,
                JSON,
                "utf-8",
                text,
                None,
                headers_of(
                    argsrepr if argsrepr is not None else argsrepr_of(args, small),
                    kwargsrepr if kwargsrepr is not None else kwargsrepr_of(kwargs, small),
                ),
                max_retries,
            )

        return row

    def _concurrency(
        self, call_key: Any, call_limit: Any, queue_limits: dict[str, int]
    ) -> Callable[[str, tuple[Any, ...], dict[str, Any]], tuple[str, int] | None] | None:
        """How each call's concurrency key and limit are found (None: no call is limited).

        A call's own ``concurrency_key``/``concurrency_limit`` win over the task's; a task's
        limit and its queue's cannot both hold one call (a row is counted under one key).
        """
        limit = concurrency.check_limit(call_limit)
        if call_key is not None:
            if not isinstance(call_key, str) or not call_key:
                raise TypeError(f"concurrency_key must be a non-empty string, not {call_key!r}")
            call_key = _check_text("concurrency_key", call_key)
            if limit is None:
                limit = self.concurrency_limit
            if limit is None:
                raise ValueError(
                    f"concurrency_key needs a concurrency_limit: task {self.name!r} has none"
                )
        elif limit is None:
            limit = self.concurrency_limit
        key_on = self.concurrency_key if call_key is None else None
        if limit is None and not queue_limits:
            return None
        name = self.name

        def find(
            queue: str, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[str, int] | None:
            by_queue = queue_limits.get(queue)
            if limit is None:
                return None if by_queue is None else (concurrency.queue_key(queue), by_queue)
            if call_key is not None:
                key: str | None = call_key
            elif key_on is None:
                key = concurrency.task_key(name)
            else:
                sig = None if callable(key_on) else self._signature()
                key = unique.key_for(name, sig, key_on, args, kwargs, "concurrency_key")
                if key is None:
                    return None if by_queue is None else (concurrency.queue_key(queue), by_queue)
                key = _check_text("concurrency key", key)
                if not callable(key_on):
                    key = concurrency.task_key(key)
            if by_queue is not None:
                raise ValueError(
                    f"cannot enqueue {name}: queue {queue!r} has a concurrency limit and so "
                    f"does this call (key {key!r}); a task is held by one limit: route it to "
                    "another queue, or drop one of the limits"
                )
            assert key is not None
            return key, limit

        return find

    def _unique(
        self,
        msg: TaskMessage,
        key: str | None,
        unique_on: unique.UniqueOn | None,
        held: unique.Hold,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> TaskMessage:
        """``msg`` with its unique key (see pgtasks.unique), unless ``unique_on`` says None."""
        if unique_on is not None:
            sig = None if callable(unique_on) else self._signature()
            key = unique.key_for(self.name, sig, unique_on, args, kwargs)
            if key is None:
                return msg
            key = _check_text("unique key", key)
        from pgtasks.message import Unique

        assert key is not None, "a unique call has its own key or the task's unique_on"
        key = unique.held_key(self.name, key, unique_on)
        return dataclasses.replace(msg, unique=Unique(key, held.window, held.until_started))

    def _signature(self) -> inspect.Signature:
        """The arguments a caller passes (for ``unique_on`` names)."""
        sig = self._call_signature
        if sig is None:
            sig = self._call_signature = unique.call_signature(self.fun, self.bind)
        if sig is None:
            raise TypeError(f"task {self.name!r}: cannot read the arguments of its function")
        return sig

    def _argsrepr(self, args: tuple[Any, ...], small: bool = False) -> str:
        if self.redact is True:
            return REDACTED
        return _short_repr(args, small)

    def _kwargsrepr(self, kwargs: dict[str, Any], small: bool = False) -> str:
        if self.redact is True:
            return REDACTED
        if self.redact:
            hidden = set(self.redact)
            kwargs = {k: "***" if k in hidden else v for k, v in kwargs.items()}
        return _short_repr(kwargs, small)

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Run the task here and now (``task_always_eager``), returning an EagerResult."""
        from pgtasks.result import EagerResult
        from pgtasks.serialization import decode

        settings = self.app.settings
        serializer = self.serializer or settings.task_serializer
        # Round-trip the arguments through the serializer, like current Celery does.
        body = encode([list(args or ()), dict(kwargs or {})], serializer)
        a, kw = decode(body.data, body.content_type, body.content_encoding, None)
        # Imported here so that defining and enqueueing tasks never loads the worker package.
        from pgtasks.utils.state import pop_task, push_task
        from pgtasks.worker import task_signals as sent

        tid = task_id or new_id()
        request = Request(id=tid, args=tuple(a), kwargs=kw, is_eager=True, called_directly=False)
        self.push_request(request)
        push_task(self)
        # Eager calls send the task signals a worker would, as Celery's eager tracer does.
        sent.prerun(self, request)
        try:
            value = self.run(*a, **kw)
        except exceptions.Retry as exc:
            sent.retry(self, request, exc, exc.exc or exc)
            sent.postrun(self, request, "RETRY", exc)
            return EagerResult(tid, exc.exc or exc, "RETRY", self.name)
        except Exception as exc:
            sent.failure(self, request, exc)
            sent.postrun(self, request, "FAILURE", exc)
            if settings.eager_propagates:
                raise
            return EagerResult(tid, exc, "FAILURE", self.name)
        finally:
            pop_task()
            self.pop_request()
        sent.success(self, value, request)
        sent.postrun(self, request, "SUCCESS", value, request)
        return EagerResult(tid, value, "SUCCESS", self.name)

    def update_state(
        self,
        task_id: str | None = None,
        state: str | None = None,
        meta: Any = None,
        **kwargs: Any,
    ) -> None:
        """Report a state (e.g. a custom ``PROGRESS`` with ``meta``) that ``AsyncResult.state``
        and ``.info`` show until the task finishes (Celery's ``update_state``)."""
        from pgtasks.records import StoredResult

        task_id = task_id or self.request.id
        if task_id is None:
            raise ValueError("update_state needs a task_id outside a running task")
        state = state or "PENDING"
        serializer = self.app.settings.result_serializer
        body = encode(meta, serializer)
        self.app.broker.store_state(StoredResult(task_id, state, body.content_type, body.data))

    # -- retrying ------------------------------------------------------------------------------

    def retry(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> exceptions.Retry:
        """Ask for this call to run again later; raises ``Retry`` (Celery semantics).

        Past ``max_retries`` the given ``exc`` is raised (or ``MaxRetriesExceededError``), and
        the row is dead-lettered with its payload and traceback.
        """
        request = self.request
        if request.called_directly:
            if exc is not None:
                raise exc
            raise exceptions.Retry("task called directly: nothing to retry", exc=exc)
        limit = (
            max_retries
            if max_retries is not None
            else (request.max_retries if request.max_retries is not None else self.max_retries)
        )
        if limit is not None and request.retries >= limit:
            request.retries_exhausted = True
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{request.args} kwargs:{request.kwargs}"
            )
        when: float | datetime
        if eta is not None:
            when = _aware("eta", eta, self.app.timezone)
        else:
            when = _seconds(
                "countdown", countdown if countdown is not None else self.default_retry_delay
            )
        ret = exceptions.Retry(exc=exc, when=when)
        if throw:
            raise ret
        return ret

    async def delay_async(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """``delay`` for asyncio code: the row is committed when the await returns, and the
        event loop is never blocked (psycopg's async connections)."""
        return await self.apply_async_async(args, kwargs)

    async def apply_async_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        task_id: str | None = None,
        connection: psycopg.AsyncConnection[Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """``apply_async`` for asyncio code, with the same options. ``connection`` takes a
        psycopg ``AsyncConnection``: the row is written in its transaction."""
        settings = self.app.settings
        if settings.always_eager:
            return self.apply(args, kwargs, task_id=task_id)
        from psycopg import AsyncConnection

        if connection is not None and not isinstance(connection, AsyncConnection):
            raise TypeError(
                "apply_async_async(connection=) takes a psycopg AsyncConnection; "
                "use apply_async for a sync one"
            )
        with tracing.producer(self.name) as inject:
            msg = self.build_message(args, kwargs, task_id=task_id, _settings=settings, **options)
            inject(msg.headers, msg.queue)
            signals.send_before_publish(msg, args, kwargs)
            holder = await self.app.async_broker.enqueue(msg, connection)
            _published(msg, holder, args, kwargs)
        return self._result_of(msg, holder)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AsyncResult:
        """The result handle of a call of this task (Celery's ``Task.AsyncResult``)."""
        return self.app.AsyncResult(task_id, task_name=self.name)


def _published(
    msg: TaskMessage, holder: str, args: Sequence[Any] | None, kwargs: dict[str, Any] | None
) -> None:
    """After one enqueue: the publish signal and the debug log, or, when a unique call found
    its key held (``holder`` is another task), only the log of that."""
    if holder != msg.id:
        if structlog.is_configured():
            _log.debug(
                "task.duplicate", task_name=msg.name, unique_key=msg.unique_key, held_by=holder
            )
        return
    signals.send_after_publish(msg, args, kwargs)
    if structlog.is_configured():  # a library must not print when the host app did not ask
        _log.debug(
            "task.enqueued",
            task_id=msg.id,
            task_name=msg.name,
            queue=msg.queue,
            eta=msg.eta.isoformat() if msg.eta else None,
            countdown=msg.countdown,
        )


def _seconds(what: str, value: Any) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"{what} must be a finite number of seconds")
    if abs(seconds) > 100 * 365 * 86400:
        raise ValueError(f"{what} of {seconds} seconds is out of range")
    return seconds


_log = structlog.get_logger("pgtasks")

#: What logs and ``inspect`` show in place of redacted arguments.
REDACTED = "'***'"
#: Longest argsrepr/kwargsrepr kept with a row (Celery's argsrepr_maxsize).
REPR_MAX = 1024
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 4, 200, 200
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 50


def _short_repr(value: Any, small: bool = False) -> str:
    """``repr`` for logs and ``inspect``, bounded in size like Celery's ``saferepr``."""
    try:
        text = repr(value) if small else _repr.repr(value)
    except Exception as exc:  # a user type whose __repr__ fails must not stop the call
        text = f"<unrepresentable {type(value).__name__}: {exc}>"
    return text if len(text) <= REPR_MAX else text[: REPR_MAX - 3] + "..."


def _aware(what: str, value: Any, zone: tzinfo) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    when: datetime = value
    if when.tzinfo is None:
        # As in Celery, a naive datetime is in the app's time zone (UTC unless configured).
        when = when.replace(tzinfo=zone)
    return when


def _check_queue(queue: Any) -> str:
    if not isinstance(queue, str) or not queue:
        raise ValueError("queue must be a non-empty string")
    return _check_text("queue name", queue)


def _check_text(what: str, value: str) -> str:
    """``value`` as a text column takes it: no NUL character, nothing UTF-8 cannot encode."""
    if "\x00" in value:
        raise ValueError(f"{what} {value!r} contains a NUL character, which PostgreSQL refuses")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} {value!r} is not valid Unicode (a lone surrogate)") from None
    return value


def _is_plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None)))
