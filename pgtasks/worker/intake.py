"""From a claimed row to the Job a pool runs: its arguments decoded, and the options the row,
its task and the worker's settings decide (whether its result is stored, how it is
serialized, its time limits). Pure functions: a row that cannot run is settled by the
worker, with the error raised here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pgtasks.config import Settings
from pgtasks.message import ClaimedTask
from pgtasks.serialization import decode
from pgtasks.worker import timelimits
from pgtasks.worker.execute import Job


def arguments(
    row: ClaimedTask, accept: Iterable[str] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The row's ``[args, kwargs]``, decoded if its content type is one of ``accept``; raises
    where it does not decode or is not that shape."""
    body = decode(row.body, row.content_type, row.content_encoding, accept)
    if not (
        isinstance(body, (list, tuple))
        and len(body) >= 2
        and isinstance(body[0], (list, tuple))
        and isinstance(body[1], dict)
    ):
        raise ValueError("payload is not [args, kwargs]")
    return tuple(body[0]), dict(body[1])


def stores_result(row: ClaimedTask, task: Any, settings: Settings) -> bool:
    """Whether the call's result is stored: not where the call, its task, or (for a task that
    does not say) the app ignores results."""
    return not (
        row.headers.get("ignore_result")
        or task.ignore_result
        or (task.ignore_result is None and settings.ignore_result)
    )


def job_for(
    row: ClaimedTask,
    task: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    hostname: str,
    settings: Settings,
    time_limit: float | None,
    soft_time_limit: float | None,
) -> Job:
    """The job to run for ``row`` of ``task``; ``time_limit`` and ``soft_time_limit`` are the
    worker's defaults (see timelimits.resolve)."""
    hard, soft = timelimits.resolve(row.headers, task, time_limit, soft_time_limit)
    return Job(
        id=row.id,
        name=row.name,
        attempt=row.attempt,
        retries=row.retries,
        max_retries=row.max_retries,
        args=args,
        kwargs=kwargs,
        queue=row.queue,
        headers=row.headers,
        eta=row.run_at,
        expires=row.expires_at,
        hostname=hostname,
        store_result=stores_result(row, task, settings),
        result_serializer=row.headers.get("result_serializer") or settings.result_serializer,
        time_limit=hard,
        soft_time_limit=soft,
    )
