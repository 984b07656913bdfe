"""The worker's in-flight book: the claimed rows it believes it owns, until each one's final
state is written.

An entry belongs to one claim (task id and attempt). A row can be claimed again by the same
worker as soon as an outcome of it is committed (a retry due at once), before the completer
has reported that write, or after its lease was lost: an older claim's outcome must neither
finish nor remove the newer claim's entry. The book does no locking: the worker holds its lock
around every use."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pgtasks.message import ClaimedTask


@dataclass
class InFlight:
    """A claimed row this worker believes it owns, until its final state is written."""

    task: ClaimedTask
    lost: bool = False
    cancel_requested: bool = False
    #: Handed to the pool's slot to run: a revoke from now on reaches the running call.
    running: bool = False
    #: The signal its process was stopped with (revoke(terminate=True), prefork).
    terminated: int | None = None
    # The outcome is queued for the completer, whose fenced write reports a lost lease itself.
    finishing: bool = False


class InFlightBook(dict[str, InFlight]):
    """The latest claim of each task this worker holds, by task id; and the claims that
    finished here lately (the last KEPT), each never to be entered again: a claim's rows can
    be read twice, by the claim and by an adoption after the listener reconnected, and the
    first start may have finished before the second read is handled."""

    KEPT = 4096

    def __init__(self) -> None:
        super().__init__()
        self._over: OrderedDict[tuple[str, int], None] = OrderedDict()

    def seen(self, task_id: str, attempt: int) -> bool:
        """Whether that very claim is held, or finished here lately."""
        return self.claim_of(task_id, attempt) is not None or (task_id, attempt) in self._over

    def add(self, task: ClaimedTask) -> InFlight | None:
        """Enter a claim; None where that very claim is in the book already, or finished
        lately (found twice)."""
        if self.seen(task.id, task.attempt):
            return None
        entry = self[task.id] = InFlight(task)
        return entry

    def claim_of(self, task_id: str, attempt: int) -> InFlight | None:
        """The entry of that very claim, or None (not held, or held by a newer claim)."""
        entry = self.get(task_id)
        if entry is None or entry.task.attempt != attempt:
            return None
        return entry

    def finishing(self, task_id: str, attempt: int) -> InFlight | None:
        """That claim's outcome is queued to be written: mark its entry so."""
        entry = self.claim_of(task_id, attempt)
        if entry is not None:
            entry.finishing = True
        return entry

    def finished(self, task_id: str, attempt: int, undone: bool = False) -> InFlight | None:
        """That claim is over here (its outcome written, or its lease lost before it
        started): remove its entry and return it (None where a newer claim holds the task,
        which stays), and remember the claim as finished. A claim that was ``undone`` (handed
        back with its attempt given back) is not remembered: the row's next claim has the
        same attempt."""
        entry = self.claim_of(task_id, attempt)
        if entry is not None:
            del self[task_id]
        if not undone:
            self._over[(task_id, attempt)] = None
            if len(self._over) > self.KEPT:
                self._over.popitem(last=False)
        return entry
