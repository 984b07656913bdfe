"""The worker's in-flight book: an outcome belongs to one claim (task id and attempt). A row
this worker claims again, once a retry of it is committed or after its lease was lost, is a new
claim that an older claim's outcome or write report must not finish or remove."""

from __future__ import annotations

from types import SimpleNamespace

from pgtasks.message import ClaimedTask
from pgtasks.worker.inflight import InFlightBook


def claim(attempt: int) -> ClaimedTask:
    return SimpleNamespace(id="t1", name="t", queue="celery", attempt=attempt)  # type: ignore[return-value]


def test_a_claim_is_entered_once() -> None:
    book = InFlightBook()
    entry = book.add(claim(1))
    assert entry is not None and entry.task.attempt == 1
    assert book.add(claim(1)) is None  # found twice: the first entry stays
    assert book["t1"] is entry
    assert book.claim_of("t1", 1) is entry
    assert book.claim_of("t1", 2) is None
    assert book.claim_of("t2", 1) is None


def test_write_report_of_an_older_claim_keeps_the_newer_claim() -> None:
    book = InFlightBook()
    book.add(claim(1))
    newer = book.add(claim(2))
    assert newer is not None and book["t1"] is newer
    # The retry of attempt 1 was committed, attempt 2 claimed, and only now is the write of
    # attempt 1 reported.
    assert book.finished("t1", 1) is None
    assert book["t1"] is newer
    assert book.finished("t1", 2) is newer
    assert "t1" not in book
    assert book.finished("t1", 2) is None


def test_settling_an_older_claim_does_not_mark_the_newer_one_finishing() -> None:
    book = InFlightBook()
    newer = book.add(claim(3))
    assert newer is not None
    assert book.finishing("t1", 2) is None
    assert not newer.finishing
    assert book.finishing("t1", 3) is newer
    assert newer.finishing
    assert book["t1"] is newer  # finishing, not finished: still held until written


def test_a_claim_that_finished_here_is_not_entered_again() -> None:
    # A claim's rows read twice (the claim, and an adoption after the listener reconnected):
    # the first start may have finished before the second read is handled.
    book = InFlightBook()
    assert book.add(claim(1)) is not None
    book.finished("t1", 1)
    assert book.add(claim(1)) is None
    assert "t1" not in book
    # A later claim of the same row (a retry) is a new claim.
    assert book.add(claim(2)) is not None


def test_the_finished_claims_remembered_are_bounded() -> None:
    book = InFlightBook()
    for attempt in range(1, InFlightBook.KEPT + 2):
        book.finished("t1", attempt)
    assert book.add(claim(1)) is not None  # the oldest was forgotten
    assert book.add(claim(2)) is None


def test_a_claim_handed_back_can_be_claimed_again_with_the_same_attempt() -> None:
    # A hand-back (an unknown task name, a stopping worker) gives the attempt back.
    book = InFlightBook()
    book.add(claim(1))
    book.finished("t1", 1, undone=True)
    assert book.add(claim(1)) is not None
