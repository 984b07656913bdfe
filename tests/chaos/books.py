"""The books a chaos run is checked against at the end.

Every task of the run is a ``coord.record`` call, whose body records each execution in the
``executions`` table under a unique (task id, attempt): a claim that ran twice would show as
``runs > 1``, a task that ran again after losing its worker as a second attempt.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psycopg

from tests.apps.harness import one, rows


def size(default: int) -> int:
    """Tasks per scenario: small in CI, ``PGTASKS_CHAOS_TASKS`` (say 20000) at full size."""
    return int(os.environ.get("PGTASKS_CHAOS_TASKS", default))


@dataclass
class Books:
    tasks: int
    completed: int
    lost: int
    stale_writes: int
    double_runs: int
    duplicate_executions: int
    lost_attempts: int

    def summary(self, scenario: str, faults: int) -> str:
        reissued = f", {self.double_runs} attempts handed out twice" if self.double_runs else ""
        return (
            f"{scenario}: {self.tasks} tasks, {faults} faults injected, {self.lost} lost, "
            f"{self.stale_writes} stale writes accepted, {self.duplicate_executions} duplicate "
            f"executions ({self.lost_attempts} attempts lost with their worker{reissued})"
        )


def check(db: psycopg.Connection[Any], expected_ids: set[str], crashed: bool = False) -> Books:
    """Read the books and assert what must hold whatever the faults were.

    ``crashed``: the server crashed during the run. Claims commit without waiting for the WAL
    flush, so the last moment's claims can be lost with the crash, and the attempt they took is
    handed out again: the same attempt may then have run twice (reported, not failed).
    """
    by_status = {
        r["status"]: r["n"] for r in rows(db, "SELECT status, count(*) AS n FROM tasks GROUP BY 1")
    }
    stored = {r["id"] for r in rows(db, "SELECT id FROM tasks")}
    missing = expected_ids - stored
    completed = by_status.get("COMPLETED", 0)
    # Every task reached exactly one terminal state, and it is success.
    assert not missing, f"{len(missing)} tasks vanished"
    assert by_status == {"COMPLETED": len(expected_ids)}, by_status
    # Each completed row's final attempt is the one whose outcome was recorded as completed,
    # and no other attempt of it was ever recorded as finishing (a stale owner's late write).
    stale = one(
        db,
        "SELECT count(*) AS n FROM attempts a JOIN tasks t ON t.id = a.task_id"
        " WHERE a.outcome <> 'lost' AND a.attempt <> t.attempt",
    )["n"]
    finals = one(
        db,
        "SELECT count(*) AS n FROM tasks t JOIN attempts a"
        " ON a.task_id = t.id AND a.attempt = t.attempt AND a.outcome = 'completed'",
    )["n"]
    assert finals == len(expected_ids), f"{finals} of {len(expected_ids)} final attempts recorded"
    # A claim runs its body at most once: fencing never let two workers hold one attempt.
    double = one(db, "SELECT count(*) AS n FROM executions WHERE runs > 1")["n"]
    # Every execution but the last of a task belongs to an attempt that lost its worker.
    unexplained = rows(
        db,
        "SELECT e.task_id, e.attempt, a.outcome FROM executions e"
        " JOIN tasks t ON t.id = e.task_id"
        " LEFT JOIN attempts a ON a.task_id = e.task_id AND a.attempt = e.attempt"
        " WHERE e.attempt <> t.attempt AND a.outcome IS DISTINCT FROM 'lost'",
    )
    assert not unexplained, f"re-runs without a lost worker: {unexplained[:5]}"
    # The value each task returned is stored for it.
    wrong = one(
        db,
        "SELECT count(*) AS n FROM tasks t LEFT JOIN results r ON r.task_id = t.id"
        " WHERE r.state IS DISTINCT FROM 'SUCCESS'"
        "    OR convert_from(r.result, 'UTF8')::int <> (t.payload -> 0 ->> 0)::int",
    )["n"]
    assert wrong == 0, f"{wrong} results missing or wrong"
    duplicates = one(
        db,
        "SELECT count(*) AS n FROM executions e JOIN tasks t ON t.id = e.task_id"
        " WHERE e.attempt <> t.attempt",
    )["n"]
    lost_attempts = one(db, "SELECT count(*) AS n FROM attempts WHERE outcome = 'lost'")["n"]
    assert stale == 0, f"{stale} outcomes of superseded attempts were recorded"
    assert crashed or double == 0, f"{double} attempts ran twice"
    return Books(
        tasks=len(expected_ids),
        completed=completed,
        lost=len(missing) + len(expected_ids) - completed,
        stale_writes=stale,
        double_runs=double,
        duplicate_executions=duplicates,
        lost_attempts=lost_attempts,
    )
