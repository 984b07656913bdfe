"""The report of a run: the summary table, the load phases' windows, and the setup."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pgtasks.cli.bench.options import WINDOW
from pgtasks.cli.bench.progress import plural


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(phase, value, unit) for each measured figure."""
    phases = report["phases"]
    rows: list[tuple[str, str, str]] = []
    if "enqueue" in phases:
        rows.append(
            ("enqueue one by one", f"{phases['enqueue']['tasks_per_second']:,.0f}", "tasks/s")
        )
        flush = phases["enqueue"].get("commit_flush_ms")
        if flush is not None:
            rows.append(("commit flush per enqueue", f"{flush:.3f}", "ms"))
    if "bulk_enqueue" in phases:
        rows.append(
            ("bulk enqueue", f"{phases['bulk_enqueue']['tasks_per_second']:,.0f}", "tasks/s")
        )
    if "burn_down" in phases:
        rows.append(("burn-down", f"{phases['burn_down']['tasks_per_second']:,.0f}", "tasks/s"))
    if "latency" in phases:
        lat = phases["latency"]
        for p in ("p50", "p90", "p99"):
            rows.append((f"delay->start {p}", f"{lat[f'{p}_ms']:.2f}", "ms"))
        for key, label in (("call", "delay() call"), ("after_return", "start after return")):
            for p in ("p50", "p99"):
                value = lat.get(f"{key}_{p}_ms")
                if value is not None:
                    rows.append((f"{label} {p}", f"{value:.2f}", "ms"))
    if "capacity" in phases:
        rows.append(
            (
                "capacity, enqueueing alongside",
                f"{phases['capacity']['tasks_per_second']:,.0f}",
                "tasks/s",
            )
        )
    if "steady" in phases:
        st = phases["steady"]
        rows.append(("steady offered load", f"{st['offered_per_second']:,.0f}", "tasks/s"))
        rows.append(
            (
                "steady finished, second half",
                f"{st['finished_per_second_second_half']:,.0f}",
                "tasks/s",
            )
        )
        rows.append(
            (
                "steady unfinished at the end",
                f"{st['unfinished_at_end']:,}",
                "tasks" + ("" if st["kept_up"] else " (fell behind)"),
            )
        )
        for half in ("first", "second"):
            value = st[f"p99_ms_{half}_half"]
            if value is not None:
                rows.append((f"steady p99, {half} half", f"{value:.2f}", "ms"))
        rows.append(("steady tables, largest", f"{st['size_mb_max']:,.0f}", "MB"))
    for key, label in (("burn_down", "burn-down"), ("capacity", "capacity"), ("steady", "steady")):
        figures = phases.get(key, {})
        if figures.get("wal_bytes_per_task") is not None:
            rows.append((f"{label} WAL per task", f"{figures['wal_bytes_per_task']:,.0f}", "bytes"))
        whose = [("worker_cpu", "worker"), ("db_cpu", "server")]
        if key != "burn_down":
            whose.append(("bench_cpu", "enqueuer"))
        for cpu_key, who in whose:
            value = figures.get(f"{cpu_key}_ms_per_1000_tasks")
            if value is not None:
                rows.append((f"{label} {who} CPU per 1,000 tasks", f"{value:,.0f}", "ms"))
    return rows


#: The columns of a load phase's window table: heading, and the cell of one window.
_WINDOW_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("AT", lambda w: f"{w['at_s']:.0f} s"),
    ("SENT/S", lambda w: f"{w['sent_per_second']:,.0f}"),
    ("FINISHED/S", lambda w: f"{w['finished_per_second']:,.0f}"),
    ("P50 MS", lambda w: "-" if w["p50_ms"] is None else f"{w['p50_ms']:.1f}"),
    ("P99 MS", lambda w: "-" if w["p99_ms"] is None else f"{w['p99_ms']:.1f}"),
    ("WAITING", lambda w: f"{w['unfinished']:,}"),
    ("TABLES MB", lambda w: f"{w['tasks_mb'] + w['results_mb'] + w['attempts_mb']:,.0f}"),
    ("VACUUMS", lambda w: str(w["vacuums"])),
    ("CHECKPOINTS", lambda w: str(w["checkpoints"])),
)


def window_table(
    label: str, windows: Sequence[dict[str, Any]], window: float = WINDOW
) -> list[str]:
    """A load phase's windows as a table: what was sent and finished a second, the latency
    from send to start of the tasks finished in each, what was waiting at its end, the size
    of the tables with their indexes, and the vacuums and checkpoints that finished in it.
    ``window`` is their length in seconds (the times they end in tenths where it is not whole)."""
    columns = list(_WINDOW_COLUMNS)
    if not float(window).is_integer():
        columns[0] = ("AT", lambda w: f"{w['at_s']:.1f} s")
    rows = [[head for head, _ in columns]]
    rows += [[cell(w) for _, cell in columns] for w in windows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return [f"{label}, every {window:g} s:"] + [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]


def format_report(report: dict[str, Any]) -> str:
    """The summary table, the windows of the load phases, and the setup it was measured on."""
    rows = [("PHASE", "VALUE", "UNIT"), *summary_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        f"{phase.ljust(widths[0])}  {value.rjust(widths[1])}  {unit}".rstrip()
        for phase, value, unit in rows
    ]
    for key in ("capacity", "steady"):
        phase = report["phases"].get(key, {})
        if phase.get("windows"):
            lines.append("")
            lines.extend(window_table(key, phase["windows"], phase.get("window_seconds", WINDOW)))
    s = report["setup"]
    lines.append("")
    lines.append(
        f"PostgreSQL {s['postgresql']}, pgtasks {s['pgtasks']}, "
        f"{plural(s['workers'], 'worker')} x {plural(s['concurrency'], 'slot')} "
        f"({s['pool']} pool), {s['tasks']:,} tasks"
    )
    return "\n".join(lines)
