"""``python -m examples.concurrency.run`` runs as documented: no key ever has more runs at once
than its limit, whether the key comes from argument names, a function shared by tasks, a call's
own options or a queue, and unlimited tasks sent behind them do not wait for them."""

from __future__ import annotations

from typing import Any


def test_the_concurrency_example_runs(run_example: Any) -> None:
    proc = run_example("examples.concurrency.run")
    out = proc.stdout
    assert "report with its own limit on the reports queue: refused" in out
    for customer in (1, 2, 3):
        assert f"customer {customer}: 4 runs, at most 1 at once (limit 1)" in out
    assert "customer:5: 4 runs, at most 1 at once (limit 1)" in out
    assert "queue reports: 4 runs, at most 2 at once (limit 2)" in out
    assert "unlimited: 6 runs" in out
    assert "unlimited tasks waited behind the limited ones: False" in out
    assert "limits held: True" in out
