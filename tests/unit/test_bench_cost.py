"""What ``pgtasks bench`` reads as a task's cost: CPU seconds of processes from ``/proc`` (the
workers with their children, the server's processes) and the per-1,000-task figures."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from pgtasks import Celery
from pgtasks.cli.bench import tasks
from pgtasks.cli.bench.cost import CostMeter
from pgtasks.cli.bench.figures import keeping_up, latency_split
from pgtasks.cli.bench.load import maintenance_note
from pgtasks.cli.bench.report import format_report, summary_rows
from pgtasks.cli.bench.workers import Workers

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")

#: A process that, told to on its stdin, has a child of its own spend 0.2 s of CPU, says so,
#: and waits for its stdin to close: a worker whose pool does the work.
CHILD = (
    "import sys, time\n"
    "sys.stdin.readline()\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.2: pass\n"
    "print('busy', flush=True)\n"
    "sys.stdin.read()\n"
)
PARENT = (
    "import subprocess, sys\n"
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], stdin=subprocess.PIPE,"
    " stdout=subprocess.PIPE, text=True)\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "child.stdin.write('go\\n'); child.stdin.flush()\n"
    "print(child.stdout.readline().strip(), flush=True)\n"
    "sys.stdin.read()\n"
    "child.stdin.close(); child.wait()\n"
)


@pytest.fixture
def meter_app(app: Celery, monkeypatch: pytest.MonkeyPatch) -> Celery:
    """The bench's app, on the test database (where the cost meter reads WAL and the server's
    processes)."""
    monkeypatch.setattr(tasks, "app", app)
    return app


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[str]]:
    """A "worker" (see PARENT), idle and ready."""
    with subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        # Leaving the block closes its stdin, ends it (and its child) and waits for it.
        yield proc


def workers(*procs: Any) -> Workers:
    return Workers(procs=list(procs))


def this_process() -> Any:
    """This process, as a worker the meter reads."""
    return SimpleNamespace(pid=os.getpid())


def test_the_cost_counts_the_cpu_of_the_workers_children(
    meter_app: Celery, worker: subprocess.Popen[str]
) -> None:
    meter = CostMeter.start(workers(worker))
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.stdout.readline() == "busy\n"
    cost = meter.stop(1000)
    # 0.2 s of CPU over 1,000 tasks: 200 ms a thousand, all but a little of it the child's.
    spent = cost["worker_cpu_ms_per_1000_tasks"]
    assert spent is not None and 150 <= spent < 400, cost
    assert cost["db_cpu_ms_per_1000_tasks"] is not None
    assert cost["wal_bytes_per_task"] is not None


def test_the_cost_counts_every_thread_and_never_goes_back_when_one_ends(
    meter_app: Celery,
) -> None:
    # A thread of this process that the meter saw at its start ends before it stops: the
    # kernel drops its statistics, and what it had used must not be taken back. Another
    # thread spends CPU meanwhile, and counts.
    def spin(seconds: float) -> None:
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass

    def work(seconds: float, spun: threading.Event, end: threading.Event) -> None:
        spin(seconds)
        spun.set()
        assert end.wait(30.0)

    def started(seconds: float) -> tuple[threading.Thread, threading.Event]:
        spun, end = threading.Event(), threading.Event()
        thread = threading.Thread(target=work, args=(seconds, spun, end))
        thread.start()
        assert spun.wait(30.0)
        return thread, end

    ending, end_it = started(0.2)
    meter = CostMeter.start(workers(this_process()))
    end_it.set()
    ending.join()
    other, end_other = started(0.06)
    try:
        spent = meter.stop(1000)["worker_cpu_ms_per_1000_tasks"]
    finally:
        end_other.set()
        other.join()
    assert spent is not None and spent >= 50, spent


def test_no_cost_is_given_for_no_tasks(meter_app: Celery) -> None:
    meter = CostMeter.start(workers(this_process()))
    assert meter.stop(0) == {
        "wal_bytes_per_task": None,
        "db_cpu_ms_per_1000_tasks": None,
        "worker_cpu_ms_per_1000_tasks": None,
        "bench_cpu_ms_per_1000_tasks": None,
    }
    # Workers that are gone by the end: nothing read, no figure.
    meter = CostMeter.start(workers(SimpleNamespace(pid=2**22 + 1)))
    assert meter.stop(1000)["worker_cpu_ms_per_1000_tasks"] is None


def test_the_summary_shows_worker_and_server_cpu_where_measured() -> None:
    report = {
        "phases": {
            "burn_down": {
                "tasks_per_second": 1000.0,
                "wal_bytes_per_task": 1600.0,
                "worker_cpu_ms_per_1000_tasks": 70.4,
                "db_cpu_ms_per_1000_tasks": None,
            }
        }
    }
    rows = summary_rows(report)
    assert ("burn-down worker CPU per 1,000 tasks", "70", "ms") in rows
    assert not any("server CPU" in row[0] for row in rows)


def test_the_summary_shows_the_commit_flush_of_an_enqueue() -> None:
    report = {"phases": {"enqueue": {"tasks_per_second": 3000.0, "commit_flush_ms": 0.0824}}}
    rows = summary_rows(report)
    assert rows == [
        ("enqueue one by one", "3,000", "tasks/s"),
        ("commit flush per enqueue", "0.082", "ms"),
    ]


def _load_window(at: float, p99: float | None, vacuums: int = 0) -> dict[str, Any]:
    return {
        "at_s": at,
        "sent_per_second": 9013.0,
        "finished_per_second": 8990.4,
        "p50_ms": None if p99 is None else 12.34,
        "p99_ms": p99,
        "unfinished": 1250,
        "tasks_mb": 700.4,
        "results_mb": 200.3,
        "attempts_mb": 210.0,
        "vacuums": vacuums,
        "checkpoints": 1 if vacuums else 0,
    }


def test_the_report_shows_a_load_phase_window_by_window() -> None:
    steady = {
        "offered_per_second": 9000.0,
        "finished_per_second_second_half": 8990.0,
        "unfinished_at_end": 1250,
        "kept_up": True,
        "p99_ms_first_half": 61.0,
        "p99_ms_second_half": None,
        "size_mb_max": 1111.0,
        "windows": [_load_window(10.0, 61.04, vacuums=2), _load_window(20.03, None)],
    }
    setup = {"postgresql": "15", "pgtasks": "0.1", "workers": 2, "concurrency": 1}
    setup |= {"pool": "threads", "tasks": 20000}
    text = format_report({"phases": {"steady": steady}, "setup": setup})
    lines = text.splitlines()
    at = lines.index("steady, every 10 s:")
    assert lines[at + 1].split() == [
        *("AT", "SENT/S", "FINISHED/S", "P50", "MS", "P99", "MS"),
        *("WAITING", "TABLES", "MB", "VACUUMS", "CHECKPOINTS"),
    ]
    assert lines[at + 2].split() == [
        *("10", "s", "9,013", "8,990", "12.3", "61.0", "1,250", "1,111", "2", "1"),
    ]
    # A window in which no task finished has no latency.
    assert lines[at + 3].split() == [
        *("20", "s", "9,013", "8,990", "-", "-", "1,250", "1,111", "0", "0"),
    ]
    # Columns line up: every row of the table is as wide as its heading row.
    assert len({len(line) for line in lines[at + 1 : at + 4]}) == 1
    # Phases without windows add no table.
    plain = format_report({"phases": {"burn_down": {"tasks_per_second": 1.0}}, "setup": setup})
    assert "every 10 s" not in plain


def test_latency_splits_into_the_delay_call_and_the_start_after_its_return() -> None:
    # Send-to-start latencies and the delay() calls of the same samples, in ms. A call longer
    # than its sample's latency (a task handed to an idle worker starts as its row commits,
    # while the call waits for the flush) leaves a negative start after the return.
    values = [2.0, 3.0, 1.5, 10.0, 2.5]
    calls = [1.5, 2.0, 1.6, 2.0, 2.0]
    split = latency_split(values, calls)
    assert split["call_p50_ms"] == pytest.approx(2.0)
    assert split["call_p99_ms"] == pytest.approx(2.0)
    # What is left after each call: 0.5, 1.0, -0.1, 8.0, 0.5.
    assert split["after_return_p50_ms"] == pytest.approx(0.5)
    early = latency_split([1.0, 1.1, 1.2], [1.3, 1.3, 1.3])
    assert early["after_return_p50_ms"] == pytest.approx(-0.2)
    assert split["after_return_p99_ms"] == pytest.approx(1.0 + (8.0 - 1.0) * 0.96)
    with pytest.raises(ValueError):
        latency_split([1.0, 2.0], [1.0])


def test_the_summary_shows_the_latency_and_its_two_parts() -> None:
    latency = {"p50_ms": 1.84, "p90_ms": 2.1, "p99_ms": 2.74, "max_ms": 4.0}
    parts = {"call_p50_ms": 1.58, "call_p99_ms": 2.43}
    parts |= {"after_return_p50_ms": 0.26, "after_return_p99_ms": 0.41}
    rows = summary_rows({"phases": {"latency": {**latency, **parts}}})
    assert rows == [
        ("delay->start p50", "1.84", "ms"),
        ("delay->start p90", "2.10", "ms"),
        ("delay->start p99", "2.74", "ms"),
        ("delay() call p50", "1.58", "ms"),
        ("delay() call p99", "2.43", "ms"),
        ("start after return p50", "0.26", "ms"),
        ("start after return p99", "0.41", "ms"),
    ]
    # A report written before the split (--json kept from an older run) still reads.
    assert len(summary_rows({"phases": {"latency": latency}})) == 3


def _window(finished: float, unfinished: int) -> dict[str, float]:
    return {"finished_per_second": finished, "unfinished": unfinished}


def test_a_steady_phase_whose_backlog_stays_small_kept_up() -> None:
    windows = [_window(990.0, 300), _window(1000.0, 120), _window(1010.0, 1500)]
    verdict = keeping_up(windows, 1000.0)
    assert verdict == {
        "finished_per_second_second_half": 1005.0,
        "unfinished_at_end": 1500,
        "kept_up": True,
        "suggested_rate": None,
    }


def test_a_steady_phase_whose_backlog_grows_fell_behind() -> None:
    windows = [_window(800.0, 2000), _window(810.0, 4000), _window(790.0, 6000)]
    verdict = keeping_up(windows, 1000.0)
    assert verdict["kept_up"] is False
    assert verdict["unfinished_at_end"] == 6000
    assert verdict["finished_per_second_second_half"] == 800.0
    # What to try next: 80% of what they finished, to two significant figures.
    assert verdict["suggested_rate"] == 640


@pytest.mark.parametrize(
    ("finished", "suggested"),
    [(12_323.0, 9_800), (85.0, 68), (1.0, 1), (0.0, 1), (1_000_000.0, 800_000)],
)
def test_the_rate_suggested_after_falling_behind_is_80_percent_rounded_down(
    finished: float, suggested: int
) -> None:
    windows = [_window(finished, 10**9), _window(finished, 10**9)]
    assert keeping_up(windows, 10**6)["suggested_rate"] == suggested


def test_a_load_phase_names_the_maintenance_that_finished_during_it() -> None:
    assert maintenance_note({"vacuums": 0, "checkpoints": 0}) == ""
    assert maintenance_note({"vacuums": 2, "checkpoints": 1}) == (
        "; 2 vacuums and 1 checkpoint finished during it (by window in the report)"
    )
    assert maintenance_note({"vacuums": 1, "checkpoints": 0}) == (
        "; 1 vacuum finished during it (by window in the report)"
    )


def test_the_cost_is_read_finer_than_a_clock_tick(meter_app: Celery) -> None:
    # Clock ticks move by hundredths of a second: a few milliseconds of work would read as
    # none or as ten.
    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"):
        pytest.skip("the kernel keeps no scheduler statistics")
    spin = (
        "import sys, time\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "t = time.thread_time()\n"
        "while time.thread_time() - t < 0.002: pass\n"
        "print('spun', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        meter = CostMeter.start(workers(proc))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "spun\n"
        spent = meter.stop(1000)["worker_cpu_ms_per_1000_tasks"]
    # 1,000 tasks: milliseconds a thousand are milliseconds (ticks would read 0, or about 10).
    assert spent is not None and 2 <= spent < 8, spent
