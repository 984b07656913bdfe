"""``python -m examples.unique.run`` runs as documented: duplicates come back as the first task,
and a finished task frees its key while a window keeps holding its own."""

from __future__ import annotations

from typing import Any


def test_the_unique_example_runs(run_example: Any) -> None:
    proc = run_example("examples.unique.run")
    out = proc.stdout
    assert "sync 42 again:" in out and "(same task: True)" in out
    assert "nightly-sync twice: same task: True" in out
    assert "remind 9 twice: same task: True" in out
    assert "synced customer 42" in out and "synced customer 7" in out
    assert "sync 42 after it ran: new task: True" in out
    assert "remind 9 after it ran: same task: True" in out
