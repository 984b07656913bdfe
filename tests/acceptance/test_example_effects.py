"""``python -m examples.effects.run`` runs as documented: a task that fails after its effects
runs twice, and its second run makes neither effect again."""

from __future__ import annotations

from typing import Any


def test_the_effects_example_runs(run_example: Any) -> None:
    out = run_example("examples.effects.run").stdout
    assert "order 42 settled" in out
    assert "runs: 2" in out
    assert "ledger rows for order 42: 1" in out
    assert "receipts sent: 1 (key " in out and ":receipt)" in out
