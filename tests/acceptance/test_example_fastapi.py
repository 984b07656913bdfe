"""``python -m examples.fastapi.run`` runs as documented: an endpoint enqueues with
``delay_async`` and awaits the result with ``get_async``, and a unique task clicked twice is
one task."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install fastapi)")


def test_the_fastapi_example_runs(run_example: Any) -> None:
    proc = run_example("examples.fastapi.run")
    assert "POST /reports/eu twice -> same task: True" in proc.stdout
    assert "'result': 5}" in proc.stdout
    assert "report: report for eu" in proc.stdout
