"""The listener's two threads take turns on one connection: the one that hears of a task to
run hands the rest of what it has received to the other, which listens while the task runs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from psycopg import Notify

from pgtasks.broker import cancel_channel
from pgtasks.worker.listener import Listener

HANDOFFS = "pgtasks_h_test"


class Connection:
    """Serves batches of notifications, each as psycopg's generator yields one."""

    def __init__(self, batches: list[list[Notify]]) -> None:
        self.batches = batches
        self.closed = False

    def notifies(self, *, timeout: float | None = None) -> Iterator[Notify]:
        if self.batches:
            yield from self.batches.pop(0)
        else:
            time.sleep(0.02)

    def close(self) -> None:
        self.closed = True


class Broker:
    schema = "test"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def listen_connection(self, *channels: str) -> Connection:
        assert channels == (HANDOFFS,)
        return self.conn


def wait_for(check: Callable[[], object]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def listener(
    conn: Connection,
    on_handoff: Callable[[str, bool], Callable[[], None] | None],
    on_cancel: Callable[[str, str | None], None],
    runs_tasks: bool,
) -> tuple[Listener, threading.Event]:
    wake = threading.Event()
    made = Listener(
        Broker(conn),  # type: ignore[arg-type]
        {"celery"},
        wake,
        on_cancel=on_cancel,
        handoffs=HANDOFFS,
        on_handoff=on_handoff,
        runs_tasks=contextlib.nullcontext if runs_tasks else None,
    )
    return made, wake


def started(made: Listener) -> None:
    """Start ``made`` and wait until one thread listens while the other stands by."""
    made.start()
    wait_for(lambda: made.standing_by == 1)


def test_the_rest_of_a_batch_is_heard_by_the_other_thread_while_the_task_runs() -> None:
    batch = [
        Notify(HANDOFFS, "task-1", 1),
        Notify(cancel_channel("test"), "task-0 SIGTERM", 1),
        Notify("pgtasks", "celery", 1),
    ]
    conn = Connection([])
    ran: list[str] = []
    cancelled: list[tuple[str, str | None, str]] = []
    heard = threading.Event()

    def on_handoff(payload: str, here: bool) -> Callable[[], None] | None:
        assert (payload, here) == ("task-1", True)

        def run() -> None:
            ran.append(threading.current_thread().name)
            # Still running: what came after the hand-off is heard meanwhile.
            assert heard.wait(5)

        return run

    def on_cancel(task_id: str, signal: str | None) -> None:
        cancelled.append((task_id, signal, threading.current_thread().name))
        heard.set()

    made, wake = listener(conn, on_handoff, on_cancel, runs_tasks=True)
    started(made)
    conn.batches.append(batch)
    try:
        wait_for(lambda: ran and cancelled and wake.is_set())
    finally:
        made.stop()
        made.join(5)
    assert [(t, s) for t, s, _ in cancelled] == [("task-0", "SIGTERM")]
    assert {ran[0], cancelled[0][2]} == {"pgtasks-listener", "pgtasks-listener-relief"}
    assert not made.is_alive()
    assert conn.closed


def test_with_one_thread_a_handed_task_is_never_run_by_the_listener() -> None:
    conn = Connection([[Notify(HANDOFFS, "task-1", 1)], [Notify(HANDOFFS, "task-2", 1)]])
    offers: list[tuple[str, bool]] = []

    def on_handoff(payload: str, here: bool) -> Callable[[], None] | None:
        offers.append((payload, here))
        return None

    def on_cancel(task_id: str, signal: str | None) -> None:
        raise AssertionError("no revoke was sent")

    made, _ = listener(conn, on_handoff, on_cancel, runs_tasks=False)
    made.start()
    try:
        wait_for(lambda: len(offers) == 2)
    finally:
        made.stop()
        made.join(5)
    assert offers == [("task-1", False), ("task-2", False)]


def test_a_second_hand_off_while_the_other_thread_runs_one_is_not_offered_to_run_here() -> None:
    conn = Connection([])
    offers: list[tuple[str, bool]] = []
    release = threading.Event()

    def on_handoff(payload: str, here: bool) -> Callable[[], None] | None:
        offers.append((payload, here))
        return release.wait if here else None

    def on_cancel(task_id: str, signal: str | None) -> None:
        raise AssertionError("no revoke was sent")

    made, _ = listener(conn, on_handoff, on_cancel, runs_tasks=True)
    started(made)
    conn.batches.extend([[Notify(HANDOFFS, "task-1", 1)], [Notify(HANDOFFS, "task-2", 1)]])
    try:
        wait_for(lambda: len(offers) == 2)
        # The first runs on one thread; the other, listening, has no one to take its turn.
        assert offers == [("task-1", True), ("task-2", False)]
        release.set()
    finally:
        release.set()
        made.stop()
        made.join(5)
    assert not made.is_alive()


def test_a_task_run_here_that_raises_leaves_the_listener_listening() -> None:
    conn = Connection([])

    def on_handoff(payload: str, here: bool) -> Callable[[], None] | None:
        def run() -> None:
            raise RuntimeError("the pool's guard failed")

        return run

    def on_cancel(task_id: str, signal: str | None) -> None:
        raise AssertionError("no revoke was sent")

    made, wake = listener(conn, on_handoff, on_cancel, runs_tasks=True)
    started(made)
    conn.batches.extend([[Notify(HANDOFFS, "task-1", 1)], [Notify("pgtasks", "celery", 1)]])
    try:
        wait_for(wake.is_set)
    finally:
        made.stop()
        made.join(5)
    assert not made.is_alive()
