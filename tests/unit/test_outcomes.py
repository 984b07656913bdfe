"""A run's outcome decides its row's final state: done, failed, dead-lettered, tried again, and
what the worker logs about it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pgtasks.message import ClaimedTask
from pgtasks.records import Failure, RetryAt, Success
from pgtasks.serialization import Encoded
from pgtasks.states import Status
from pgtasks.worker import execute as ex
from pgtasks.worker import outcomes

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(attempt: int = 1, retries: int = 0, requeued: int = 0, headers: Any = None) -> ClaimedTask:
    return ClaimedTask(
        id="t1",
        name="proj.add",
        queue="celery",
        priority=0,
        attempt=attempt,
        retries=retries,
        max_retries=3,
        content_type="application/json",
        content_encoding="utf-8",
        payload="[[], {}]",
        payload_raw=None,
        headers={"argsrepr": "(1,)", "kwargsrepr": "{}"} if headers is None else headers,
        run_at=NOW,
        expires_at=None,
        expired=False,
        created_at=NOW,
        requeued_attempt=requeued,
    )


def outcome(kind: str, **kw: Any) -> ex.Outcome:
    return ex.Outcome(id="t1", attempt=1, kind=kind, started=NOW.timestamp(), runtime=0.25, **kw)


RESULT = Encoded("application/json", "utf-8", b"3")


def unsuccessful(o: ex.Outcome, task: ClaimedTask | None = None, **kw: Any) -> Any:
    kw.setdefault("terminated", False)
    kw.setdefault("max_lost_attempts", 3)
    return outcomes.unsuccessful(task or row(), o, **kw)


def test_a_success_stores_its_result_and_followups() -> None:
    final = outcomes.succeeded(row(), outcome(ex.SUCCESS, result=RESULT, extra={"followups": 1}))
    assert final == Success("t1", 1, True, "application/json", b"3", NOW, followups=1)  # type: ignore[arg-type]


def test_a_success_without_a_result_stores_none() -> None:
    final = outcomes.succeeded(row(), outcome(ex.SUCCESS))
    assert (final.store, final.result, final.content_type) == (False, None, "application/json")


def test_a_failure_is_failed_and_logged_with_its_arguments() -> None:
    final, note = unsuccessful(outcome(ex.FAILURE, error="boom", traceback="tb", result=RESULT))
    assert isinstance(final, Failure)
    assert (final.status, final.error, final.traceback, final.store) == (
        Status.FAILED,
        "boom",
        "tb",
        True,
    )
    assert (note.level, note.event) == ("error", "task.failed")
    assert note.fields == {"error": "boom", "duration": 0.25, "args": "(1,)", "kwargs": "{}"}


def test_a_failure_with_retries_exhausted_is_dead_lettered() -> None:
    final, note = unsuccessful(outcome(ex.FAILURE, error="boom", retries_exhausted=True))
    assert final.status == Status.DEAD
    assert note.event == "task.dead_lettered"


def test_a_terminated_call_is_logged_as_terminated() -> None:
    final, note = unsuccessful(outcome(ex.FAILURE, error="killed"), terminated=True)
    assert final.status == Status.FAILED  # the write records it CANCELLED
    assert (note.level, note.event) == ("info", "task.terminated")


def test_a_failure_without_an_error_says_failed() -> None:
    final, _ = unsuccessful(outcome(ex.FAILURE))
    assert final.error == "failed"


def test_ignore_finishes_the_row_with_the_ignored_state() -> None:
    final, note = unsuccessful(outcome(ex.IGNORED))
    assert isinstance(final, Success)
    assert (final.state, final.result, final.store) == ("IGNORED", None, True)
    assert (note.level, note.event) == ("info", "task.ignored")


def test_a_retry_in_seconds_counts_one_more_retry() -> None:
    final, note = unsuccessful(outcome(ex.RETRY, retry_when=7, error="again", result=RESULT))
    assert final == RetryAt(
        "t1",
        1,
        1,
        7.0,
        None,
        "again",
        None,
        "retry",
        NOW,
        result=b"3",
        content_type=RESULT.content_type,
    )
    assert (note.level, note.event, note.fields["retry_delay"]) == (
        "warning",
        "task.retry_scheduled",
        7.0,
    )


def test_a_retry_at_a_time_has_no_delay() -> None:
    eta = NOW + timedelta(minutes=5)
    final, note = unsuccessful(outcome(ex.RETRY, retry_when=eta))
    assert (final.delay, final.eta) == (0.0, eta)
    assert note.fields["eta"] == str(eta)


def test_a_retry_without_a_time_runs_again_at_once() -> None:
    final, _ = unsuccessful(outcome(ex.RETRY))
    assert (final.delay, final.eta) == (0.0, None)


def test_a_rejected_call_is_requeued_without_counting_a_retry() -> None:
    final, note = unsuccessful(outcome(ex.REJECT_REQUEUE, error="no"), row(retries=2))
    assert final == RetryAt("t1", 1, 2, 0.0, None, "no", None, "rejected", NOW)
    assert note.event == "task.rejected" and note.fields["requeue"] is True


def test_a_lost_worker_is_tried_again_after_a_growing_wait() -> None:
    final, note = unsuccessful(outcome(ex.LOST, error="signal 9"), row(attempt=2))
    assert final == RetryAt("t1", 2, 0, 4.0, None, "worker lost: signal 9", None, "lost", NOW)
    assert note.fields["reason"] == "worker lost"


def test_too_many_lost_workers_dead_letter_the_row_and_count_it_in_its_chord() -> None:
    task = row(attempt=3, headers={"chord": "c1"})
    final, note = unsuccessful(outcome(ex.LOST, error="signal 9"), task)
    assert isinstance(final, Failure) and final.status == Status.DEAD
    assert final.error == "worker lost: signal 9"
    assert final.followups is not None and final.followups.chord == "c1"
    assert (note.level, note.event) == ("error", "task.dead_lettered")


def test_lost_workers_before_a_requeue_or_through_retries_do_not_count() -> None:
    final, _ = unsuccessful(outcome(ex.LOST), row(attempt=5, retries=1, requeued=3))
    assert isinstance(final, RetryAt)


# Lost workers past a thousand overflow the float; max_lost_attempts stops a row long before.
@given(st.integers(min_value=0, max_value=1000))
def test_the_lost_delay_grows_and_is_bounded(lost: int) -> None:
    delay = outcomes.lost_delay(lost)
    assert 1.0 <= delay <= outcomes.LOST_DELAY_MAX
    assert outcomes.lost_delay(lost + 1) >= delay


@given(
    attempt=st.integers(min_value=1, max_value=50),
    retries=st.integers(min_value=0, max_value=50),
    limit=st.integers(min_value=1, max_value=10),
)
def test_a_lost_row_is_dead_lettered_exactly_at_the_limit(
    attempt: int, retries: int, limit: int
) -> None:
    task = row(attempt=attempt, retries=retries)
    final, _ = unsuccessful(outcome(ex.LOST), task, max_lost_attempts=limit)
    dead = attempt - retries >= limit
    assert isinstance(final, Failure) is dead
    if not dead:
        assert final.retries == retries


def test_a_row_that_never_ran_still_counts_in_its_chord() -> None:
    final = outcomes.not_run(row(headers={"chord": "c1"}), Status.CANCELLED, "expired")
    assert (final.status, final.error, final.store, final.started) == (
        Status.CANCELLED,
        "expired",
        False,
        None,
    )
    assert final.followups is not None and final.followups.chord == "c1"
    assert outcomes.not_run(row(headers={}), Status.DEAD, "x").followups is None


def test_headers_that_are_not_an_object_name_no_chord() -> None:
    final = outcomes.not_run(row(headers=["chord"]), Status.DEAD, "bad headers")
    assert final.followups is None


def test_an_unregistered_task_is_dead_lettered_with_not_registered_stored() -> None:
    final = outcomes.unregistered(row())
    assert final.status == Status.DEAD and final.store
    assert final.error.startswith("NotRegistered: no live worker consuming queue 'celery'")
    assert final.result is not None and b"NotRegistered" in final.result


def test_metrics_count_dead_letters_with_their_reason() -> None:
    dead = outcomes.not_run(row(), Status.DEAD, "x")
    assert outcomes.metric_outcome(ex.LOST, dead) == ("dead_lettered", "worker lost")
    assert outcomes.metric_outcome(ex.FAILURE, dead) == ("dead_lettered", "retries exhausted")
    failed = outcomes.not_run(row(), Status.FAILED, "x")
    assert outcomes.metric_outcome(ex.FAILURE, failed) == ("failed", None)
    assert outcomes.metric_outcome(ex.LOST, failed) == ("retried", None)
    assert outcomes.metric_outcome("other", failed) == ("lost", None)


def test_a_note_is_emitted_at_its_level() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def warning(self, event: str, **kw: Any) -> None:
            seen.append((event, kw))

    outcomes.Note("warning", "task.rejected", {"requeue": True}).emit(Log())
    assert seen == [("task.rejected", {"requeue": True})]
