"""Canvas: ``Signature``, ``chain``, ``group`` and ``chord``, with Celery's names and semantics.

A signature is a dict (Celery's own wire form), so it travels in a row's headers as JSON and comes
back with ``signature(d)``. Applying a canvas produces a ``Plan`` — chord counters, task rows and
any results decided up front — that the broker writes in one transaction. Follow-ups run on the
worker: when a task's fenced completion is written, the next chain step, its link callbacks and its
chord counting are written in the same transaction (see ``Broker.finalise``).

Header names on a row: ``link`` and ``link_error`` (signature dicts), ``chain`` (the steps still to
run, next first), ``group``/``group_index``, ``chord`` (the id of the chord counter this row is a
header member of), ``parent_id``, ``root_id``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from pgtasks.records import ChordSpec, Plan
from pgtasks.result import AsyncResult, GroupResult
from pgtasks.utils import uuid as _new_id

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.message import TaskMessage
    from pgtasks.task import Task

log = structlog.get_logger("pgtasks")

#: Options that place a task inside a canvas; they become headers, never task options.
_MEMBERSHIP = {"group_id": "group", "group_index": "group_index", "chord": "chord"}
#: Options a signature carries that are not ``apply_async`` options.
_NOT_OPTIONS = ("immutable", "chord_size", "subtask_type", "route_name", "connection")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [value]
    return list(value)


class Signature(dict[str, Any]):
    """A task call that can be passed around: name, partial args, kwargs and options.

    ``task.s(2)`` is ``signature(task, args=(2,))``; applying it with more arguments puts those
    first (``sig.delay(1)`` calls ``task(1, 2)``) unless the signature is immutable (``.si``).
    """

    _app: Celery | None = None

    def __init__(
        self,
        task: Any = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        type: Any = None,
        subtask_type: str | None = None,
        immutable: bool = False,
        app: Celery | None = None,
        **ex: Any,
    ) -> None:
        if isinstance(task, Mapping):
            # A signature in dict form (from headers or JSON): copy it as it is.
            super().__init__(copy.deepcopy(dict(task)))
            self.setdefault("args", [])
            self.setdefault("kwargs", {})
            self.setdefault("options", {})
            self.setdefault("subtask_type", None)
            self.setdefault("immutable", False)
            self._app = app
            return
        name = task if isinstance(task, str) else getattr(task, "name", None)
        if type is None and task is not None and not isinstance(task, str):
            type = task
        if app is None and type is not None:
            app = getattr(type, "app", None) if not hasattr(type, "_task") else None
        super().__init__(
            task=name,
            args=list(args or ()),
            kwargs=dict(kwargs or {}),
            options=dict(options or {}, **ex),
            subtask_type=subtask_type,
            immutable=immutable,
            chord_size=None,
        )
        self._app = app

    # -- fields -------------------------------------------------------------------------------

    @property
    def app(self) -> Celery:
        """The app this signature is applied with (the current app when none was given)."""
        if self._app is not None:
            return self._app
        # A chain, group or chord made without app= uses its members' app.
        kw = self.get("kwargs") or {}
        for member in [*(kw.get("tasks") or ()), kw.get("header"), kw.get("body")]:
            if isinstance(member, Signature):
                found = member._app or (member.app if member.subtask_type else None)
                if found is not None:
                    return found
        from pgtasks.app import current_app

        return current_app()

    @property
    def task(self) -> str:
        """The task name."""
        return str(self["task"])

    name = task

    @property
    def args(self) -> tuple[Any, ...]:
        """The partial positional arguments."""
        return tuple(self["args"])

    @property
    def kwargs(self) -> dict[str, Any]:
        """The partial keyword arguments."""
        kwargs: dict[str, Any] = self["kwargs"]
        return kwargs

    @property
    def options(self) -> dict[str, Any]:
        """The ``apply_async`` options (queue, countdown, link, task_id, …)."""
        options: dict[str, Any] = self["options"]
        return options

    @property
    def immutable(self) -> bool:
        """An immutable signature ignores the arguments it is applied with (a parent's result)."""
        return bool(self.get("immutable"))

    @property
    def subtask_type(self) -> str | None:
        """``None`` for a task call; ``chain``, ``group`` or ``chord`` for the canvas types."""
        value = self.get("subtask_type")
        return None if value is None else str(value)

    @property
    def id(self) -> str | None:
        """The task id, once assigned (``freeze``, or ``task_id=`` in the options)."""
        value = self.options.get("task_id")
        return None if value is None else str(value)

    @property
    def type(self) -> Task[Any, Any]:
        """The registered task."""
        return self.app.get_task(self.task)

    # -- building -----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celery | None = None) -> Signature:
        """Rebuild a signature (or a chain, group or chord) from its dict form."""
        kind = d.get("subtask_type")
        if kind == "chain":
            return chain.from_dict(d, app)
        if kind == "group":
            return group.from_dict(d, app)
        if kind == "chord":
            return chord.from_dict(d, app)
        return Signature(d, app=app)

    def _merge(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """Celery's merge: new args go first, new kwargs and options win; an immutable
        signature keeps its arguments and takes only the options."""
        opts = dict(self.options, **options) if options else dict(self.options)
        if self.immutable:
            return self.args, dict(self.kwargs), opts
        return (
            tuple(args or ()) + self.args,
            dict(self.kwargs, **kwargs) if kwargs else dict(self.kwargs),
            opts,
        )

    def clone(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **opts: Any,
    ) -> Signature:
        """A copy, with ``args`` prepended and ``kwargs``/``opts`` merged (Celery's clone)."""
        new = Signature.from_dict(copy.deepcopy(dict(self)), app=self._app)
        if args or kwargs or opts:
            a, kw, o = self._merge(args, kwargs, opts)
            new["args"], new["kwargs"], new["options"] = list(a), kw, copy.deepcopy(o)
        return new

    partial = clone

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        """Set options in place (``sig.set(queue='io', countdown=5)``); returns the signature."""
        if immutable is not None:
            self.set_immutable(immutable)
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        """Make the signature ignore (or take) the arguments it is applied with."""
        self["immutable"] = immutable

    def link(self, callback: Mapping[str, Any]) -> Mapping[str, Any]:
        """Apply ``callback`` with this task's return value when it succeeds; returns it."""
        self.options.setdefault("link", []).append(callback)
        return callback

    def link_error(self, errback: Mapping[str, Any]) -> Mapping[str, Any]:
        """Apply ``errback`` when this task fails for good (not on retries); returns it.

        As in Celery, an errback task that takes one argument is enqueued with the failed task's
        id; one that takes more is called in the worker with ``(request, exc, traceback)``.
        """
        self.options.setdefault("link_error", []).append(errback)
        return errback

    def on_error(self, errback: Mapping[str, Any]) -> Signature:
        """``link_error`` that returns this signature, for chaining calls."""
        self.link_error(errback)
        return self

    def freeze(
        self,
        _id: str | None = None,
        group_id: str | None = None,
        chord: str | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
        group_index: int | None = None,
    ) -> Any:
        """Assign the task id now (kept when applied) and return its result handle."""
        opts = self.options
        if _id is not None:
            opts["task_id"] = _id
        opts.setdefault("task_id", _new_id())
        for key, value in (
            ("group_id", group_id),
            ("chord", chord),
            ("root_id", root_id),
            ("parent_id", parent_id),
            ("group_index", group_index),
        ):
            if value is not None:
                opts[key] = value
        return AsyncResult(str(opts["task_id"]), self.app, task_name=self.get("task"))

    # -- calling ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here with the partial arguments merged in (no row is written)."""
        a, kw, _ = self._merge(args, kwargs)
        return self.type(*a, **kw)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """``apply_async`` with arguments given the natural way."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        route_name: str | None = None,
        **options: Any,
    ) -> Any:
        """Enqueue (options merged over the signature's); returns the result handle.

        ``connection=`` writes inside that connection's transaction, like ``Task.apply_async``.
        """
        app = self.app
        if app.settings.always_eager:
            return self.apply(args, kwargs, **options)
        connection = options.pop("connection", None)
        planner = Planner(app)
        result = planner.add(self, args, kwargs, options)
        # Canvas enqueues join app.transaction blocks (and Django's atomic) like apply_async.
        from pgtasks.transaction import resolve

        plan = planner.plan
        if any(m.unique is not None for m in plan.messages):
            # A unique call may turn out to be another task: only a lone signature can say so.
            alone = len(plan.messages) == 1 and not (plan.chords or plan.results or plan.chord_hits)
            msg = plan.messages[0]
            if not alone or getattr(result, "id", None) != msg.id:
                raise ValueError(
                    f"unique task {msg.name!r} (key {msg.unique_key!r}) cannot be part of a "
                    "chain, group or chord: enqueue it on its own with apply_async or delay"
                )
            holder = app.broker.enqueue(msg, conn=resolve(app, connection))
            return AsyncResult(holder, app, task_name=msg.name)
        app.broker.apply_plan(plan, conn=resolve(app, connection))
        return result

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Run here and now (``task_always_eager``), returning an EagerResult."""
        a, kw, opts = self._merge(args, kwargs, options)
        task_id = opts.get("task_id")
        return self.type.apply(a, kw, task_id=task_id)

    # -- composing ----------------------------------------------------------------------------

    def __or__(self, other: Any) -> Signature:  # type: ignore[override]
        """``a | b`` chains; ``group | b`` is a chord; ``chord | b`` extends the body."""
        if not isinstance(other, Signature):
            return NotImplemented
        if isinstance(self, group):
            return chord(self, body=other, app=self._app)
        if isinstance(other, group):
            if isinstance(self, chain):
                tasks = self.tasks
                if tasks and isinstance(tasks[-1], chord):
                    last = tasks[-1].clone()
                    assert isinstance(last, chord)
                    last.body = maybe_signature(last.body | other)
                    return chain(*tasks[:-1], last, app=self._app)
                return chain(*tasks, other, app=self._app)
            return chain(self, other, app=self._app)
        if isinstance(other, chain):
            if isinstance(self, chain):
                return chain(*self.tasks, *other.tasks, app=self._app)
            return chain(self, *other.tasks, app=self._app)
        if isinstance(self, chain):
            return chain(*self.tasks, other, app=self._app)
        if isinstance(self, chord):
            sig = self.clone()
            assert isinstance(sig, chord)
            sig.body = maybe_signature(sig.body | other)
            return sig
        return chain(self, other, app=self._app)

    def __deepcopy__(self, memo: dict[int, Any]) -> Signature:
        return Signature.from_dict(copy.deepcopy(dict(self), memo), app=self._app)

    def __reduce__(self) -> Any:
        # The app stays behind: a signature pickles as its dict form.
        return (signature, (dict(self),))

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{'%' if self.immutable else ''}{self.get('task')}({', '.join(parts)})"


def signature(
    varies: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    app: Celery | None = None,
    **ex: Any,
) -> Signature:
    """A signature from a task, a task name, or a signature's dict form (Celery's
    ``signature``/``subtask``)."""
    if isinstance(varies, Signature):
        return varies.clone() if app is None else Signature.from_dict(dict(varies), app=app)
    if isinstance(varies, Mapping):
        return Signature.from_dict(varies, app=app)
    return Signature(varies, args, kwargs, options, app=app, **ex)


subtask = signature


def maybe_signature(d: Any, app: Celery | None = None) -> Signature:
    """``d`` as a signature (the same object when it already is one)."""
    if isinstance(d, Signature):
        if app is not None and d._app is None:
            d._app = app
        return d
    return Signature.from_dict(d, app=app)


class _TaskList(Signature):
    """A signature made of other signatures (``chain`` and ``group``)."""

    _name = ""
    _kind = ""

    def __init__(self, *tasks: Any, app: Celery | None = None, **options: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Mapping):
            tasks = tuple(tasks[0])
        Signature.__init__(
            self,
            self._name,
            (),
            {"tasks": [maybe_signature(t, app) for t in tasks]},
            options,
            subtask_type=self._kind,
            app=app,
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celery | None = None) -> Signature:
        """Rebuild it from its dict form."""
        new = cls(*d["kwargs"]["tasks"], app=app, **d.get("options", {}))
        new["args"] = list(d.get("args") or [])
        new["immutable"] = bool(d.get("immutable"))
        return new

    @property
    def tasks(self) -> list[Signature]:
        """The parts, as signatures."""
        parts = [maybe_signature(t, self._app) for t in self.kwargs["tasks"]]
        self.kwargs["tasks"] = parts
        return parts

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Applying it enqueues it (as in Celery)."""
        return self.apply_async(args, kwargs)


class chain(_TaskList):
    """Tasks run one after another, each given the previous one's return value first."""

    _name = "celery.chain"
    _kind = "chain"

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Run every step here and now, each given the previous value (eager mode)."""
        result: Any = None
        for i, step in enumerate(self.clone().prepared()):  # type: ignore[attr-defined]
            if i == 0:
                result = step.apply(tuple(args or ()) + self.args, kwargs, **options)
            else:
                result = step.apply((result.get(),))
        return result

    def prepared(self) -> list[Signature]:
        """The steps as they will run: nested chains flattened, and a group followed by another
        step upgraded to a chord with that step as its body (as Celery does)."""
        steps: list[Signature] = []
        for step in self.tasks:
            if isinstance(step, chain) and not step.args and not step.options:
                steps.extend(step.prepared())
            else:
                steps.append(step)
        i = 0
        while i < len(steps) - 1:
            if isinstance(steps[i], group):
                steps[i] = chord(steps[i], body=steps.pop(i + 1), app=self._app)
            else:
                i += 1
        self.kwargs["tasks"] = steps
        return steps

    def freeze(
        self,
        _id: str | None = None,
        group_id: str | None = None,
        chord: str | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
        group_index: int | None = None,
    ) -> Any:
        """Assign every step's id; membership goes to the last step. Returns the last step's
        result, with ``.parent`` leading back through the earlier steps."""
        steps = self.prepared()
        results: list[Any] = []
        for i, step in enumerate(steps):
            if i == len(steps) - 1:
                res = step.freeze(_id, group_id, chord, root_id, None, group_index)
            else:
                res = step.freeze(root_id=root_id)
            if results:
                res.parent = results[-1]
            results.append(res)
        return results[-1] if results else None


_chain = chain


def _flatten_group(tasks: Iterable[Any], app: Celery | None) -> list[Signature]:
    members: list[Signature] = []
    for t in tasks:
        sig = maybe_signature(t, app)
        # Nested groups run in parallel with their siblings, so Celery unrolls them.
        if isinstance(sig, group) and not sig.args and not sig.options.get("link"):
            members.extend(_flatten_group(sig.tasks, app))
        else:
            members.append(sig)
    return members


class group(_TaskList):
    """Tasks run in parallel; applying enqueues them all in one statement."""

    _name = "celery.group"
    _kind = "group"

    def __len__(self) -> int:
        return len(self.kwargs["tasks"])

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Run every member here and now (eager mode); returns a GroupResult."""
        args = tuple(args or ()) + self.args
        gid = self.options.get("group_id") or _new_id()
        return GroupResult(gid, [m.apply(args, kwargs) for m in self.tasks], app=self._app)

    def freeze(
        self,
        _id: str | None = None,
        group_id: str | None = None,
        chord: str | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
        group_index: int | None = None,
    ) -> Any:
        """Assign the group id and every member's id; returns the GroupResult."""
        gid = _id or self.options.get("group_id") or _new_id()
        self.options["group_id"] = gid
        members = _flatten_group(self.kwargs["tasks"], self._app)
        self.kwargs["tasks"] = members
        results = [
            m.freeze(group_id=gid, chord=chord, root_id=root_id, group_index=i)
            for i, m in enumerate(members)
        ]
        return GroupResult(gid, results, app=self._app)


class chord(Signature):
    """A group (the header) whose results, in header order, are passed to a body task once
    every member has finished. The counter lives in the database."""

    def __init__(
        self,
        header: Any,
        body: Any = None,
        task: str = "celery.chord",
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        app: Celery | None = None,
        **options: Any,
    ) -> None:
        head = maybe_signature(header, app) if isinstance(header, Mapping) else group(header)
        if not isinstance(head, group):
            head = group(head, app=app)
        Signature.__init__(
            self,
            task,
            args,
            dict(kwargs or {}, header=head, body=maybe_signature(body, app) if body else None),
            options,
            subtask_type="chord",
            app=app,
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celery | None = None) -> chord:
        """A chord from its dict form."""
        kw = dict(d["kwargs"])
        new = cls(kw.pop("header"), kw.pop("body", None), app=app, **d.get("options", {}))
        new["args"] = list(d.get("args") or [])
        return new

    @property
    def header(self) -> group:
        """The header group."""
        head = maybe_signature(self.kwargs["header"], self._app)
        assert isinstance(head, group)
        self.kwargs["header"] = head
        return head

    @property
    def tasks(self) -> list[Signature]:
        """The header's members."""
        return self.header.tasks

    @property
    def body(self) -> Signature:
        """The body, applied with the list of the header's results."""
        body = self.kwargs.get("body")
        if body is None:
            raise ValueError("this chord has no body: call it with one, chord(header)(body)")
        sig = maybe_signature(body, self._app)
        self.kwargs["body"] = sig
        return sig

    @body.setter
    def body(self, value: Signature) -> None:
        self.kwargs["body"] = value

    def __call__(self, body: Any = None, **options: Any) -> Any:
        """``chord(header)(body)`` applies the chord."""
        return self.apply_async((), {"body": body} if body is not None else {}, **options)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        route_name: str | None = None,
        **options: Any,
    ) -> Any:
        """Enqueue the header members and create the counter, in one transaction."""
        kwargs = dict(kwargs or {})
        body = kwargs.pop("body", None)
        sig: Signature = self
        if body is not None:
            sig = self.clone()
            assert isinstance(sig, chord)
            sig.body = maybe_signature(body, self._app)
        return Signature.apply_async(sig, args, kwargs, route_name, **options)

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Run the header and then the body here and now."""
        values = [m.apply(args, kwargs).get() for m in self.header.tasks]
        return self.body.apply((values,))

    def freeze(
        self,
        _id: str | None = None,
        group_id: str | None = None,
        chord: str | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
        group_index: int | None = None,
    ) -> Any:
        """Assign the header's and the body's ids; returns the body's result, whose
        ``.parent`` is the header's GroupResult."""
        header = self.header
        gid = header.options.get("group_id") or _new_id()
        header_result = header.freeze(gid, chord=gid, root_id=root_id)
        result = self.body.freeze(_id, group_id, chord, root_id, None, group_index)
        result.parent = header_result
        return result


def _final(sig: Signature) -> list[Signature]:
    """The task signatures whose results stand for ``sig``'s (a chain's last step, a chord's
    body, each member of a group)."""
    if isinstance(sig, chain):
        steps = sig.prepared()
        return _final(steps[-1]) if steps else []
    if isinstance(sig, chord):
        return _final(sig.body)
    if isinstance(sig, group):
        return [s for m in sig.tasks for s in _final(m)]
    return [sig]


class Planner:
    """Turns applied signatures into a ``Plan``: the rows to write, nothing written yet."""

    def __init__(
        self, app: Celery, parent_id: str | None = None, root_id: str | None = None
    ) -> None:
        self.app = app
        self.parent_id = parent_id
        self.root_id = root_id
        self.plan = Plan()

    def add(
        self,
        sig: Any,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        rest: Sequence[Any] = (),
    ) -> Any:
        """Plan applying ``sig`` with ``args``/``kwargs``/``options``, then the chain steps in
        ``rest``; returns the result handle."""
        sig = maybe_signature(sig, self.app)
        if isinstance(sig, chain):
            return self._chain(sig, args, kwargs, options, rest)
        if isinstance(sig, group):
            if rest:
                upgraded = chord(sig, body=rest[0], app=self.app)
                return self._chord(upgraded, args, kwargs, options, rest[1:])
            return self._group(sig, args, kwargs, options)
        if isinstance(sig, chord):
            return self._chord(sig, args, kwargs, options, rest)
        return self._task(sig, args, kwargs, options, rest)

    def _task(
        self,
        sig: Signature,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
        rest: Sequence[Any],
    ) -> AsyncResult:
        from pgtasks.task import Task

        a, kw, opts = sig._merge(args, kwargs, options)
        opts = copy.deepcopy(opts)
        headers: dict[str, Any] = dict(opts.pop("headers", None) or {})
        for option, header in _MEMBERSHIP.items():
            value = opts.pop(option, None)
            if value is not None:
                headers[header] = value
        for key in ("link", "link_error"):
            sigs = [dict(maybe_signature(s)) for s in _as_list(opts.pop(key, None))]
            if sigs:
                headers[key] = sigs
        if rest:
            headers["chain"] = [dict(maybe_signature(s)) for s in rest]
        for key in _NOT_OPTIONS:
            opts.pop(key, None)
        task_id = str(opts.pop("task_id", None) or _new_id())
        parent_id = opts.pop("parent_id", None) or self.parent_id
        if parent_id:
            headers["parent_id"] = parent_id
        root_id = opts.pop("root_id", None) or self.root_id
        if self.root_id is None:
            self.root_id = root_id or task_id
        headers["root_id"] = root_id or self.root_id
        task: Task[Any, Any] = self.app.tasks.get(sig.task) or Task(
            self.app, _unknown(sig.task), sig.task, False
        )
        msg: TaskMessage = task.build_message(a, kw, task_id=task_id, headers=headers, **opts)
        self.plan.messages.append(msg)
        return AsyncResult(task_id, self.app, task_name=sig.task)

    def _chain(
        self,
        sig: chain,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
        rest: Sequence[Any],
    ) -> Any:
        sig = sig.clone()  # type: ignore[assignment]
        opts = dict(sig.options, **(options or {}))
        steps = sig.prepared()
        if not steps:
            return None
        # Celery: a chain's link goes to its last step, its link_error to every step, its
        # task_id names its last step; the other options apply to the first step.
        for errback in _as_list(opts.pop("link_error", None)):
            for step in steps:
                for final in _final(step):
                    final.link_error(errback)
        for callback in _as_list(opts.pop("link", None)):
            for final in _final(steps[-1]):
                final.link(callback)
        membership = {k: opts.pop(k) for k in list(opts) if k in _MEMBERSHIP}
        result = sig.freeze(
            opts.pop("task_id", None),
            membership.get("group_id"),
            membership.get("chord"),
            None,
            None,
            membership.get("group_index"),
        )
        first_args = tuple(args or ()) + sig.args
        self.add(steps[0], first_args, kwargs, opts, [*steps[1:], *rest])
        return result

    def _group(
        self,
        sig: group,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
    ) -> GroupResult:
        opts = dict(sig.options, **(options or {}))
        membership = {k: opts.pop(k) for k in list(opts) if k in _MEMBERSHIP}
        result: GroupResult = sig.freeze(
            opts.pop("task_id", None) or membership.get("group_id"),
            chord=membership.get("chord"),
        )
        members = sig.tasks
        # Celery: a group's errback goes to every member, its callback to the first one only.
        for errback in _as_list(opts.pop("link_error", None)):
            for member in members:
                for final in _final(member):
                    final.link_error(errback)
        for callback in _as_list(opts.pop("link", None)):
            for final in _final(members[0]) if members else ():
                final.link(callback)
        group_args = tuple(args or ()) + sig.args
        for member in members:
            self.add(member, group_args, kwargs, opts)
        return result

    def _chord(
        self,
        sig: chord,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
        rest: Sequence[Any],
    ) -> Any:

        sig = sig.clone()  # type: ignore[assignment]
        opts = dict(sig.options, **(options or {}))
        membership = {k: opts.pop(k) for k in list(opts) if k in _MEMBERSHIP}
        body = sig.body
        if rest:
            body = chain(body, *rest, app=self.app)
            sig.body = body
        for errback in _as_list(opts.pop("link_error", None)):
            body.link_error(errback)
        for callback in _as_list(opts.pop("link", None)):
            body.link(callback)
        result = sig.freeze(
            opts.pop("task_id", None),
            membership.get("group_id"),
            membership.get("chord"),
            None,
            None,
            membership.get("group_index"),
        )
        header = sig.header
        members = header.tasks
        if not members:
            # Celery applies the body at once with an empty list.
            self.add(body, ([],))
            return result
        member_ids = [final.id for m in members for final in _final(m)]
        if len(member_ids) != len(members):
            raise ValueError("a chord header member must stand for one result (not a group)")
        chord_id = str(header.options["group_id"])
        self.plan.chords.append(ChordSpec(chord_id, [str(i) for i in member_ids], dict(body)))
        header_args = tuple(args or ()) + sig.args
        for member in members:
            self.add(member, header_args, kwargs, opts)
        return result


def _unknown(name: str) -> Callable[..., Any]:
    from pgtasks.exceptions import NotRegistered

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotRegistered(name)

    return missing


def signature_list(value: Any) -> list[dict[str, Any]]:
    """One signature or several, as the dicts a row's ``link``/``link_error`` header holds;
    empty when ``value`` is not signatures."""
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, Mapping) for v in value):
        return []
    return [dict(maybe_signature(s)) for s in value]


# -- map, starmap, chunks: one task running many calls ------------------------------------

MAP, STARMAP = "celery.map", "celery.starmap"


def register_builtins(app: Celery) -> None:
    """Register the tasks behind ``map``/``starmap``/``chunks`` (Celery's names), so a worker
    can run them."""

    def xmap_run(task: dict[str, Any], it: list[Any]) -> list[Any]:
        fun = signature(task, app=app).type
        return [fun(item) for item in it]

    def xstarmap_run(task: dict[str, Any], it: list[Any]) -> list[Any]:
        fun = signature(task, app=app).type
        return [fun(*item) for item in it]

    app.task(name=MAP)(xmap_run)
    app.task(name=STARMAP)(xstarmap_run)


def _builtin_signature(name: str, task: Any, it: Sequence[Any]) -> Signature:
    app = getattr(task, "app", None)
    if app is not None and name not in app.tasks:
        register_builtins(app)
    inner = task if isinstance(task, Signature) else Signature(task, app=app)
    return Signature(name, (), {"task": dict(inner), "it": list(it)}, app=app)


def xmap(task: Any, it: Sequence[Any]) -> Signature:
    """A signature of one task that calls ``task`` on each item of ``it``."""
    return _builtin_signature(MAP, task, it)


def xstarmap(task: Any, it: Sequence[Sequence[Any]]) -> Signature:
    """A signature of one task that calls ``task(*item)`` for each item of ``it``."""
    return _builtin_signature(STARMAP, task, it)


def chunks(task: Any, it: Sequence[Sequence[Any]], n: int) -> group:
    """``it`` in parts of ``n`` items, each part one ``starmap`` task: a group (applying it
    returns a GroupResult whose members' values are lists)."""
    items = list(it)
    parts = [items[i : i + n] for i in range(0, len(items), n)]
    return group([xstarmap(task, part) for part in parts], app=getattr(task, "app", None))


__all__ = [
    "Signature",
    "chain",
    "chord",
    "group",
    "maybe_signature",
    "signature",
    "subtask",
]
