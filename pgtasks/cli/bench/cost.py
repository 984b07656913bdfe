"""What a task costs: WAL bytes, and the CPU time of the workers, of the server's processes
and of the bench itself, per task. CPU time is read from ``/proc``, so only on Linux, and the
server's only when it runs on this host."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pgtasks.cli.bench.store import BenchStore
from pgtasks.cli.bench.tasks import bench_app
from pgtasks.cli.bench.workers import Workers


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


#: Each process's threads as last read (nanoseconds by thread id): a thread that ended since
#: still counts at its last reading, so that a process's total never goes back.
_THREADS_SEEN: dict[int, dict[str, int]] = {}


def _run_time(pid: int) -> float | None:
    """CPU seconds so far of ``pid``'s threads to the nanosecond, from each one's
    ``/proc/<pid>/task/<tid>/schedstat`` (None where the kernel keeps none, or the process
    ended as it was read). A thread that ended counts with what it had used when last read
    (the kernel drops its statistics): what it used after that is not counted."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        now: dict[str, int] = {}
        for tid in tids:
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"/proc/{pid}/task/{tid}/schedstat") as f,
            ):
                now[tid] = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not now:
        return None
    seen = _THREADS_SEEN.setdefault(pid, {})
    seen.update(now)
    return sum(seen.values()) / 1e9


def _cpu_seconds(pids: Sequence[int], command: str | None = None) -> dict[int, float]:
    """CPU seconds so far of each of ``pids`` that runs here (and runs ``command``, if given):
    to the nanosecond where the kernel keeps scheduler statistics, else in clock ticks (a
    hundredth of a second, too coarse for a short phase)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    seconds: dict[int, float] = {}
    for pid in pids:
        if command is not None:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != command:
                        continue
            except OSError:
                continue
        exact = _run_time(pid)
        if exact is not None:
            seconds[pid] = exact
            continue
        fields = _stat(pid)
        if fields is not None and len(fields) > 12:
            seconds[pid] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def _server_cpu(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds so far of the local PostgreSQL processes among ``pids`` (none when the
    server runs elsewhere)."""
    return _cpu_seconds(pids, "postgres")


def _with_children(pids: Sequence[int]) -> list[int]:
    """``pids`` and their child processes (a prefork worker's pool)."""
    parents = set(pids)
    found = list(pids)
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in parents:
                fields = _stat(int(entry))
                if fields is not None and len(fields) > 1 and int(fields[1]) in parents:
                    found.append(int(entry))
    return found


def _worker_cpu(workers: Workers) -> dict[int, float]:
    """CPU seconds so far of the worker processes and their children."""
    return _cpu_seconds(_with_children([proc.pid for proc in workers.procs]))


def _per_1000(start: dict[int, float], end: dict[int, float], tasks: int) -> float | None:
    """CPU milliseconds per 1,000 tasks between two readings; processes that started meanwhile
    count from zero, those that ended are missed."""
    if not end or not tasks:
        return None
    return sum(v - start.get(pid, 0.0) for pid, v in end.items()) * 1e6 / tasks


@dataclass
class CostMeter:
    """WAL written and the server's and workers' CPU used over a stretch of work, and that of
    this process (which enqueues in the capacity and steady phases)."""

    lsn: str
    cpu: dict[int, float]
    workers: Workers
    worker_cpu: dict[int, float]
    own_cpu: float

    @classmethod
    def start(cls, workers: Workers) -> CostMeter:
        """Read the WAL position and every process's CPU time so far."""
        sample = BenchStore(bench_app().broker).cost_sample()
        return cls(
            str(sample["lsn"]),
            _server_cpu(sample["pids"]),
            workers,
            _worker_cpu(workers),
            time.process_time(),
        )

    def stop(self, tasks: int) -> dict[str, float | None]:
        """What was used since ``start``, per task (WAL) and per 1,000 tasks (CPU time), for
        ``tasks`` tasks; None where it could not be read, or for no tasks."""
        store = BenchStore(bench_app().broker)
        wal = store.wal_bytes(self.lsn)
        end = _server_cpu(store.cost_sample()["pids"])
        own = time.process_time() - self.own_cpu
        return {
            "wal_bytes_per_task": wal / tasks if tasks else None,
            "db_cpu_ms_per_1000_tasks": _per_1000(self.cpu, end, tasks),
            "worker_cpu_ms_per_1000_tasks": _per_1000(
                self.worker_cpu, _worker_cpu(self.workers), tasks
            ),
            "bench_cpu_ms_per_1000_tasks": own * 1e6 / tasks if tasks else None,
        }
