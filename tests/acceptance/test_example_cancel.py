"""``python -m examples.cancel.run`` runs as documented: two running tasks, one abortable and
one plain, are cancelled and end REVOKED."""

from __future__ import annotations

from typing import Any


def test_the_cancel_example_runs(run_example: Any) -> None:
    out = run_example("examples.cancel.run").stdout
    assert "both running: True" in out
    assert "both revoked: True" in out
    assert "export: REVOKED, crawl: REVOKED" in out
