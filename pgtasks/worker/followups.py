"""The worker's follow-ups: what a row's outcome sets off (its links and errbacks, the next
step of its chain, the counting of its chord, the chord's body once the last member ended),
planned where the task ran and written with its outcome by the completer."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from pgtasks import states
from pgtasks.broker import Row
from pgtasks.canvas import Planner, Signature, _as_list, _final, maybe_signature
from pgtasks.exceptions import ChordError
from pgtasks.records import Followups, Plan, StoredResult
from pgtasks.result import exception_from_dict, exception_to_dict
from pgtasks.serialization import encode

if TYPE_CHECKING:
    from pgtasks.app import Celery
    from pgtasks.request import Request
    from pgtasks.task import Task
    from pgtasks.worker.execute import Job, Outcome

log = structlog.get_logger("pgtasks")


def has_followups(headers: Mapping[str, Any]) -> bool:
    """Whether a row's completion triggers anything (links, chain, chord counting)."""
    return bool(
        headers.get("link")
        or headers.get("link_error")
        or headers.get("chain")
        or headers.get("chord")
    )


def chord_member(headers: Mapping[str, Any]) -> Followups | None:
    """For a row that ends without running (expired, undecodable, its worker lost): the chord
    it belongs to must still count it, as a failed member."""
    chord_id = headers.get("chord")
    return Followups(chord=str(chord_id)) if chord_id else None


def after_success(app: Celery, job: Job, value: Any) -> dict[str, Any]:
    """The ``Outcome.extra`` of a success: its follow-ups, to be written with its completion."""
    headers = job.headers
    if not has_followups(headers):
        return {}
    planner = Planner(app, parent_id=job.id, root_id=headers.get("root_id") or job.id)
    try:
        for callback in headers.get("link") or ():
            planner.add(callback, (value,))
        steps = headers.get("chain") or []
        if steps:
            planner.add(steps[0], (value,), rest=steps[1:])
    except Exception:
        # The task itself succeeded; what follows it could not be built (an unknown option,
        # an unencodable return value for the next step).
        log.exception("canvas.followup_failed", task_id=job.id, task_name=job.name)
        planner.plan = Plan()
    return {"followups": Followups(on_success=planner.plan, chord=headers.get("chord"))}


def _arity(task: Task[Any, Any]) -> int:
    try:
        params = list(inspect.signature(task.fun).parameters.values())
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 99
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) - (1 if task.bind else 0)


def _may_follow(app: Celery, job: Job, sig: Signature) -> bool:
    """Whether the producer of ``job``'s row may enqueue ``sig`` (see producer_rules): an
    errback the worker would call in its own process runs only then."""
    probe = Planner(app, parent_id=job.id)
    probe.add(sig, (job.id,))
    msg = probe.plan.messages[0]
    return app.broker.may_follow(job.id, msg.name, msg.queue, msg.priority)


def after_failure(
    app: Celery, job: Job, request: Request, exc: BaseException, einfo: str, outcome: Outcome
) -> Outcome:
    """Add a terminal failure's follow-ups: errbacks, the failure recorded for the chain's later
    steps (so waiting on the chain's result ends), and chord counting."""
    headers = job.headers
    if not has_followups(headers):
        return outcome
    planner = Planner(app, parent_id=job.id, root_id=headers.get("root_id") or job.id)
    try:
        for errback in headers.get("link_error") or ():
            sig = maybe_signature(errback, app)
            task = app.tasks.get(sig.task)
            if task is not None and _arity(task) > 1 and _may_follow(app, job, sig):
                # Celery calls a (request, exc, traceback) errback in the failing worker.
                try:
                    sig(request, exc, einfo)
                except Exception:
                    log.exception("canvas.errback_failed", task_id=job.id, errback=sig.task)
            else:
                # Enqueued with the failure (and held there to the rules of the row's source,
                # which dead-letters an errback its producer may not enqueue).
                planner.add(sig, (job.id,))
        if outcome.result is not None:
            content_type, data = outcome.result.content_type, outcome.result.data
        else:
            encoded = encode(exception_to_dict(exc), "json")
            content_type, data = encoded.content_type, encoded.data
        for step in headers.get("chain") or ():
            for final in _final(maybe_signature(step, app)):
                if final.id:
                    planner.plan.results.append(
                        StoredResult(final.id, states.FAILURE, content_type, data, einfo)
                    )
                if final.options.get("chord"):
                    planner.plan.chord_hits.append((str(final.options["chord"]), final.id or ""))
    except Exception:
        log.exception("canvas.followup_failed", task_id=job.id, task_name=job.name)
    follow = Followups(on_failure=planner.plan, chord=headers.get("chord"))
    return dataclasses.replace(outcome, extra={**outcome.extra, "followups": follow})


def chord_body_builder(app: Celery) -> Callable[[Row, list[Row]], Plan]:
    """What the completer calls when a chord's last member finished: the body applied with the
    members' results in header order, or — when a member failed — the body's result recorded
    as a ``ChordError`` and its errbacks applied (as Celery does)."""

    def build(row: Row, members: list[Row]) -> Plan:
        body = maybe_signature(row["body"], app)
        values: list[Any] = []
        culprit: tuple[str, BaseException] | None = None
        for m in members:
            state = m["state"] or states.celery_state(m["status"])
            value: Any = None
            if m["result"] is not None:
                value = app.decode_result(
                    bytes(m["result"]), m["content_type"], m["content_encoding"]
                )
            if state == states.SUCCESS:
                values.append(value)
                continue
            if value is not None:
                cause = exception_from_dict(value)
            elif m["status"] is None and m["state"] is None:
                # Neither its row nor its result is left (the result forgotten, the row
                # deleted at once by a worker keeping no finished rows): say so, rather than
                # report an error nobody raised.
                cause = LookupError(
                    "its outcome is gone: no task row and no stored result are left"
                )
            else:
                cause = Exception(m["error"])
            culprit = (str(m["id"]), cause)
            break
        planner = Planner(app)
        if culprit is None:
            try:
                planner.add(body, (values,))
                return planner.plan
            except Exception as exc:
                culprit = (str(row["id"]), exc)
                log.exception("canvas.chord_body_failed", chord_id=row["id"])
        error = ChordError(f"Dependency {culprit[0]} raised {culprit[1]!r}")
        encoded = encode(exception_to_dict(error), "json")
        for final in _final(body):
            if final.id:
                planner.plan.results.append(
                    StoredResult(final.id, states.FAILURE, encoded.content_type, encoded.data)
                )
                for errback in _as_list(final.options.get("link_error")):
                    planner.add(errback, (final.id,))
            if final.options.get("chord"):
                planner.plan.chord_hits.append((str(final.options["chord"]), final.id or ""))
        return planner.plan

    return build
