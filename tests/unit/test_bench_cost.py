"""What ``pgtasks bench`` reads as a task's cost: CPU seconds of processes from ``/proc`` (the
workers with their children, the server's processes) and the per-1,000-task figures."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pgtasks import bench

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")

BUSY = (
    "import sys, time\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.2: pass\n"
    "print('busy', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    """A child process that has spent 0.2 s of CPU, then waits for its stdin to close."""
    with subprocess.Popen(
        [sys.executable, "-c", BUSY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "busy\n"
        # Leaving the block closes its stdin, ends it and waits for it.
        yield proc


def test_a_process_children_are_found(child: subprocess.Popen[str]) -> None:
    found = bench._with_children([os.getpid()])
    assert found[0] == os.getpid()
    assert child.pid in found


def test_cpu_seconds_read_each_process(child: subprocess.Popen[str]) -> None:
    seconds = bench._cpu_seconds([child.pid])
    assert seconds[child.pid] >= 0.15
    # A command filter leaves out the processes that do not run it, and gone ones are skipped.
    assert bench._cpu_seconds([child.pid], "postgres") == {}
    assert bench._cpu_seconds([2**22 + 1]) == {}


def test_cpu_seconds_count_every_thread_finer_than_a_tick() -> None:
    # This process spends CPU in a second thread; the reading counts it, and a few
    # milliseconds of work show, where clock ticks move by hundredths of a second.
    if bench._run_time(os.getpid()) is None:
        pytest.skip("the kernel keeps no scheduler statistics")

    def spin(seconds: float) -> None:
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass

    spun = threading.Event()

    def spin_then_more() -> None:
        spin(0.06)
        spun.set()
        spin(0.2)

    before = bench._cpu_seconds([os.getpid()])[os.getpid()]
    worker = threading.Thread(target=spin_then_more)
    worker.start()
    # Read while the thread still runs, once it has used 0.06 s of CPU (however long a busy
    # machine takes to give it that).
    assert spun.wait(30.0)
    during = bench._cpu_seconds([os.getpid()])[os.getpid()]
    worker.join()
    assert during - before >= 0.05
    start = bench._cpu_seconds([os.getpid()])[os.getpid()]
    spin(0.002)
    assert 0.002 <= bench._cpu_seconds([os.getpid()])[os.getpid()] - start < 0.01


def test_cpu_seconds_never_go_back_when_a_thread_ends() -> None:
    # The kernel drops an ended thread's statistics: its CPU must still count, or a reading
    # taken after another test's threads ended comes out lower than one before.
    if bench._run_time(os.getpid()) is None:
        pytest.skip("the kernel keeps no scheduler statistics")
    spun, done = threading.Event(), threading.Event()

    def work() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.05:
            pass
        spun.set()
        done.wait(30.0)

    worker = threading.Thread(target=work)
    worker.start()
    assert spun.wait(30.0)
    during = bench._cpu_seconds([os.getpid()])[os.getpid()]
    done.set()
    worker.join()
    assert bench._cpu_seconds([os.getpid()])[os.getpid()] >= during


def test_per_1000_counts_new_processes_from_zero() -> None:
    assert bench._per_1000({1: 1.0}, {1: 1.5, 2: 0.5}, 1000) == pytest.approx(1000.0)
    assert bench._per_1000({1: 1.0}, {}, 1000) is None
    assert bench._per_1000({1: 1.0}, {1: 2.0}, 0) is None


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
    rows = bench.summary_rows(report)
    assert ("burn-down worker CPU per 1,000 tasks", "70", "ms") in rows
    assert not any("server CPU" in row[0] for row in rows)


def test_the_summary_shows_the_commit_flush_of_an_enqueue() -> None:
    report = {"phases": {"enqueue": {"tasks_per_second": 3000.0, "commit_flush_ms": 0.0824}}}
    rows = bench.summary_rows(report)
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
    text = bench.format_report({"phases": {"steady": steady}, "setup": setup})
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
    plain = bench.format_report(
        {"phases": {"burn_down": {"tasks_per_second": 1.0}}, "setup": setup}
    )
    assert "every 10 s" not in plain


def test_latency_splits_into_the_delay_call_and_the_start_after_its_return() -> None:
    # Send-to-start latencies and the delay() calls of the same samples, in ms. A call longer
    # than its sample's latency (a task handed to an idle worker starts as its row commits,
    # while the call waits for the flush) leaves a negative start after the return.
    values = [2.0, 3.0, 1.5, 10.0, 2.5]
    calls = [1.5, 2.0, 1.6, 2.0, 2.0]
    split = bench.latency_split(values, calls)
    assert split["call_p50_ms"] == pytest.approx(2.0)
    assert split["call_p99_ms"] == pytest.approx(2.0)
    # What is left after each call: 0.5, 1.0, -0.1, 8.0, 0.5.
    assert split["after_return_p50_ms"] == pytest.approx(0.5)
    early = bench.latency_split([1.0, 1.1, 1.2], [1.3, 1.3, 1.3])
    assert early["after_return_p50_ms"] == pytest.approx(-0.2)
    assert split["after_return_p99_ms"] == pytest.approx(1.0 + (8.0 - 1.0) * 0.96)
    with pytest.raises(ValueError):
        bench.latency_split([1.0, 2.0], [1.0])


def test_the_summary_shows_the_latency_and_its_two_parts() -> None:
    latency = {"p50_ms": 1.84, "p90_ms": 2.1, "p99_ms": 2.74, "max_ms": 4.0}
    parts = {"call_p50_ms": 1.58, "call_p99_ms": 2.43}
    parts |= {"after_return_p50_ms": 0.26, "after_return_p99_ms": 0.41}
    rows = bench.summary_rows({"phases": {"latency": {**latency, **parts}}})
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
    assert len(bench.summary_rows({"phases": {"latency": latency}})) == 3


def _window(finished: float, unfinished: int) -> dict[str, float]:
    return {"finished_per_second": finished, "unfinished": unfinished}


def test_a_steady_phase_whose_backlog_stays_small_kept_up() -> None:
    windows = [_window(990.0, 300), _window(1000.0, 120), _window(1010.0, 1500)]
    verdict = bench.keeping_up(windows, 1000.0)
    assert verdict == {
        "finished_per_second_second_half": 1005.0,
        "unfinished_at_end": 1500,
        "kept_up": True,
        "suggested_rate": None,
    }


def test_a_steady_phase_whose_backlog_grows_fell_behind() -> None:
    windows = [_window(800.0, 2000), _window(810.0, 4000), _window(790.0, 6000)]
    verdict = bench.keeping_up(windows, 1000.0)
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
    assert bench.keeping_up(windows, 10**6)["suggested_rate"] == suggested


def test_a_load_phase_names_the_maintenance_that_finished_during_it() -> None:
    assert bench._maintenance({"vacuums": 0, "checkpoints": 0}) == ""
    assert bench._maintenance({"vacuums": 2, "checkpoints": 1}) == (
        "; 2 vacuums and 1 checkpoint finished during it (by window in the report)"
    )
    assert bench._maintenance({"vacuums": 1, "checkpoints": 0}) == (
        "; 1 vacuum finished during it (by window in the report)"
    )
