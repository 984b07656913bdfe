"""A claimed row becomes the job a pool runs: its arguments decoded, its result stored unless
the call, its task or the app ignores it, its limits the lowest that apply."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from pgtasks.config import Settings
from pgtasks.message import ClaimedTask
from pgtasks.serialization import ContentDisallowed
from pgtasks.worker import intake

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(payload: str = '[[1, 2], {"k": 3}]', **headers: Any) -> ClaimedTask:
    return ClaimedTask(
        id="t1",
        name="proj.add",
        queue="celery",
        priority=0,
        attempt=1,
        retries=0,
        max_retries=3,
        content_type="application/json",
        content_encoding="utf-8",
        payload=payload,
        payload_raw=None,
        headers=dict(headers),
        run_at=NOW,
        expires_at=None,
        expired=False,
        created_at=NOW,
    )


def task(ignore_result: bool | None = None, time_limit: float | None = None) -> Any:
    return SimpleNamespace(ignore_result=ignore_result, time_limit=time_limit, soft_time_limit=None)


def test_arguments_are_decoded() -> None:
    assert intake.arguments(row(), ["json"]) == ((1, 2), {"k": 3})


@pytest.mark.parametrize("payload", ['{"a": 1}', "[[1]]", '[{"a": 1}, {}]', "[[], []]"])
def test_a_payload_that_is_not_args_and_kwargs_is_refused(payload: str) -> None:
    with pytest.raises(ValueError, match=r"not \[args, kwargs\]"):
        intake.arguments(row(payload), ["json"])


def test_a_content_type_not_accepted_is_refused() -> None:
    with pytest.raises(ContentDisallowed):
        intake.arguments(row(), ["pickle"])


def test_the_result_is_stored_unless_ignored() -> None:
    settings = Settings()
    assert intake.stores_result(row(), task(), settings)
    assert not intake.stores_result(row(ignore_result=True), task(), settings)
    assert not intake.stores_result(row(), task(ignore_result=True), settings)
    ignoring = Settings(ignore_result=True)
    assert not intake.stores_result(row(), task(), ignoring)
    assert intake.stores_result(row(), task(ignore_result=False), ignoring)


def test_a_job_carries_the_row_and_the_lowest_limits() -> None:
    settings = Settings()
    job = intake.job_for(
        row(result_serializer="pickle"),
        task(time_limit=30.0),
        (1,),
        {},
        hostname="w1",
        settings=settings,
        time_limit=60.0,
        soft_time_limit=None,
    )
    assert (job.id, job.name, job.attempt, job.hostname, job.args) == (
        "t1",
        "proj.add",
        1,
        "w1",
        (1,),
    )
    assert job.result_serializer == "pickle" and job.store_result
    assert job.time_limit == 30.0
    plain = intake.job_for(
        row(),
        task(),
        (),
        {},
        hostname="w1",
        settings=settings,
        time_limit=None,
        soft_time_limit=None,
    )
    assert plain.result_serializer == settings.result_serializer and plain.time_limit is None
