"""The compatibility suite's verdicts: a scenario passes only when pgtasks observed exactly what
Celery did (keys under "info" shown, not compared), and any failing scenario fails the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compat import compare as cmp
from compat.__main__ import main


def record(observed: dict[str, Any], status: str = "ok", **meta: Any) -> dict[str, Any]:
    return {"status": status, "observed": observed, "feature": "f", "doc": "", **meta}


def results(**scenarios: dict[str, Any]) -> dict[str, Any]:
    return {"scenarios": scenarios}


@pytest.mark.parametrize(
    ("celery", "pgtasks", "passed", "reason"),
    [
        ({"v": 1}, {"v": 1}, True, ""),
        ({"v": 1}, {"v": 2}, False, "`v`: Celery 1, pgtasks 2"),
        ({"v": 1}, {"v": 1.0}, False, "`v`: Celery 1, pgtasks 1.0"),
        ({"v": [1, 2]}, {"v": [1]}, False, "`v (length)`: Celery 2, pgtasks 1"),
        ({"v": {"value": 1}}, {"v": {"raised": {"type": "E", "message": ""}}}, False, "`v`"),
        ({"v": 1, "info": {"a": 1}}, {"v": 1, "info": {"a": 2}}, True, ""),
    ],
)
def test_a_scenario_passes_only_when_pgtasks_observed_what_celery_did(
    celery: dict[str, Any], pgtasks: dict[str, Any], passed: bool, reason: str
) -> None:
    verdict, why = cmp.verdict(record(celery), record(pgtasks))
    assert verdict is passed
    assert why.startswith(reason)


def test_a_scenario_missing_or_broken_on_either_side_fails() -> None:
    assert cmp.verdict(None, record({}))[0] is False
    assert cmp.verdict(record({}), None)[0] is False
    assert cmp.verdict(record({}, status="error"), record({}))[0] is False
    assert cmp.verdict(record({}), record({}, status="timeout"))[0] is False


def write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_any_failing_scenario_fails_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    celery = write(tmp_path, "c.json", results(a=record({"v": 1}), b=record({"v": 2})))
    same = write(tmp_path, "p.json", results(a=record({"v": 1}), b=record({"v": 2})))
    one_off = write(tmp_path, "q.json", results(a=record({"v": 1}), b=record({"v": 3})))
    assert main(["compare", str(celery), str(same)]) == 0
    assert capsys.readouterr().out.strip().endswith("2 passed, 0 failed")
    assert main(["compare", str(celery), str(one_off)]) == 1
    assert capsys.readouterr().out.strip().endswith("1 passed, 1 failed")


def test_a_documented_difference_is_shown_not_hidden_and_the_rest_still_compared() -> None:
    why = {"limit": "a call may not lift a task's limit"}
    celery = results(
        a=record({"limit": "finished", "other": 1}, differs=why),
        b=record({"limit": "finished", "other": 1}, differs=why),
    )
    pgtasks = results(
        a=record({"limit": "TimeLimitExceeded", "other": 1}, differs=why),
        b=record({"limit": "TimeLimitExceeded", "other": 2}, differs=why),
    )
    rows = {r["name"]: r for r in cmp.compare(celery, pgtasks)}
    assert rows["a"]["passed"] is True
    assert rows["a"]["differences"] == [
        {
            "key": "limit",
            "celery": "finished",
            "pgtasks": "TimeLimitExceeded",
            "reason": why["limit"],
        }
    ]
    assert rows["b"]["passed"] is False and rows["b"]["reason"].startswith("`other`")
    report = cmp.render({"version": "5.7"}, {"version": "0.1"}, list(rows.values()))
    assert "## Documented differences" in report
    assert '- **a** (`limit`): a call may not lift a task\'s limit Celery: `"finished"`' in report
    assert "| a | f | PASS, documented difference |" in report
