"""SIGTERM/SIGINT handlers run in a thread of their own, so a signal that lands while the main
thread holds a lock the handler needs (the log writer's, an event's) cannot hang the process.

Each case runs in a subprocess: the failure this guards against is a process that never exits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import structlog
    from pgtasks.utils.signal_relay import SignalRelay

    logger = structlog.PrintLogger(sys.stdout)
    stopped = threading.Event()
    seen = []

    def handler(signum):
        seen.append((signum.name, threading.current_thread().name))
        logger.msg("stopping on " + signum.name)  # takes the writer's lock
        stopped.set()

    with SignalRelay(handler, (signal.SIGTERM, signal.SIGINT), name="relay"):
        # The main thread is halfway through a log line when the signal lands.
        with logger._lock:
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
            time.sleep(0.2)  # the interpreter runs Python-level handlers in here
        assert stopped.wait(5), "the handler never ran"
    print(seen)
    # Restored: the previous disposition is back.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    """
)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_landing_while_the_log_lock_is_held_still_stops(signame: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, signame], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"stopping on {signame}"
    assert lines[1] == f"[('{signame}', 'relay')]"


FAILING = textwrap.dedent(
    """
    import os, signal, threading, time
    from pgtasks.utils.signal_relay import SignalRelay

    calls = []
    second = threading.Event()

    def handler(signum):
        calls.append(signum.name)
        if len(calls) == 1:
            raise RuntimeError("a broken shutdown receiver")
        second.set()

    with SignalRelay(handler, (signal.SIGTERM,)):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:  # two signals in a row may merge
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        assert second.wait(5), calls
    print(calls)
    """
)


def test_a_handler_that_raises_still_sees_the_next_signal() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FAILING], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "['SIGTERM', 'SIGTERM']"
    assert "signal.handler_failed" in done.stdout + done.stderr
    assert "a broken shutdown receiver" in done.stdout + done.stderr
