"""``compare`` (verdict per scenario and the ``N passed, M failed`` line) and ``report``
(COMPAT.md, the feature matrix, written from the two result files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Observation keys shown in the report but never compared (documented as broker-specific or
#: free-form, e.g. the order a broker chose or an error message Celery does not specify).
INFO_KEY = "info"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first place where ``a`` and ``b`` differ, as (path, a-value, b-value)."""
    exception_like = isinstance(a, dict) and set(a) == {"type", "message"}
    if isinstance(a, dict) and isinstance(b, dict) and not exception_like:
        for key in sorted(set(a) | set(b)):
            if key == INFO_KEY:
                continue
            where = f"{path}.{key}" if path else key
            if key not in a or key not in b:
                # e.g. {"value": ...} against {"raised": ...}: show both sides whole.
                return path or "(value)", a, b
            found = first_difference(a[key], b[key], where)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path} (length)", len(a), len(b)
        return None
    if a != b or type(a) is not type(b):
        return path or "(value)", a, b
    return None


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def documented(ref: dict[str, Any] | None, got: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The scenario's documented differences (its ``differs``) where the two runs did differ:
    each observation's name, both values untouched, and the reason."""
    if ref is None or got is None or ref["status"] != "ok" or got["status"] != "ok":
        return []
    out = []
    for key, reason in (ref.get("differs") or got.get("differs") or {}).items():
        a, b = ref["observed"].get(key), got["observed"].get(key)
        if first_difference(a, b) is not None:
            out.append({"key": key, "celery": a, "pgtasks": b, "reason": reason})
    return out


def verdict(ref: dict[str, Any] | None, got: dict[str, Any] | None) -> tuple[bool, str]:
    """(passed, reason) for one scenario; the reason names the first difference. The
    observations the scenario documents as deliberate differences (``differs``) are not part
    of the verdict: see ``documented``."""
    if ref is None:
        return False, "not run under Celery"
    if got is None:
        return False, "not run under pgtasks"
    if ref["status"] != "ok":
        return False, f"the Celery reference run failed ({ref['status']}): {_error(ref)}"
    if got["status"] != "ok":
        return False, f"{got['status']}: {_error(got)}"
    differs = ref.get("differs") or got.get("differs") or {}
    diff = first_difference(
        {k: v for k, v in ref["observed"].items() if k not in differs},
        {k: v for k, v in got["observed"].items() if k not in differs},
    )
    if diff is None:
        return True, ""
    where, a, b = diff
    return False, f"`{where}`: Celery {_short(a)}, pgtasks {_short(b)}"


def _error(record: dict[str, Any]) -> str:
    error = record.get("error") or {}
    return f"{error.get('type')}: {error.get('message')}"


def compare(celery: dict[str, Any], pgtasks: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    everything = {**pgtasks["scenarios"], **celery["scenarios"]}
    names = sorted(everything, key=lambda n: (everything[n].get("order", 0), n))
    for name in names:
        ref = celery["scenarios"].get(name)
        got = pgtasks["scenarios"].get(name)
        passed, reason = verdict(ref, got)
        meta = ref or got or {}
        differences = documented(ref, got) if passed else []
        rows.append(
            {
                "name": name,
                "feature": meta.get("feature", "?"),
                "doc": meta.get("doc", ""),
                "note": meta.get("note", ""),
                "passed": passed,
                "reason": reason,
                "differences": differences,
                "info": {
                    "celery": ((ref or {}).get("observed") or {}).get(INFO_KEY),
                    "pgtasks": ((got or {}).get("observed") or {}).get(INFO_KEY),
                },
            }
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    passed = sum(r["passed"] for r in rows)
    return f"{passed} passed, {len(rows) - passed} failed"


def print_comparison(rows: list[dict[str, Any]]) -> None:
    width = max((len(r["name"]) for r in rows), default=10)
    for r in rows:
        line = f"{'PASS' if r['passed'] else 'FAIL'}  {r['name']:<{width}}"
        if not r["passed"]:
            line += f"  {r['reason']}"
        for d in r.get("differences", ()):
            line += f"  (documented difference in `{d['key']}`)"
        print(line)
    print(summary(rows))


def features(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        f = out.setdefault(r["feature"], {"feature": r["feature"], "rows": []})
        f["rows"].append(r)
    for f in out.values():
        passed = sum(r["passed"] for r in f["rows"])
        total = len(f["rows"])
        f["passed"], f["total"] = passed, total
        f["status"] = (
            "supported" if passed == total else "partly supported" if passed else "unsupported"
        )
    return list(out.values())


def _verdict_cell(row: dict[str, Any]) -> str:
    if not row["passed"]:
        return "FAIL"
    return "PASS, documented difference" if row.get("differences") else "PASS"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(celery: dict[str, Any], pgtasks: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    feats = features(rows)
    counts = {
        s: sum(f["status"] == s for f in feats)
        for s in ("supported", "partly supported", "unsupported")
    }
    lines = [
        "# Celery compatibility",
        "",
        "Generated by `python -m compat report` from the compatibility suite's results; do not "
        "edit by hand. The same project and scenarios ran under Celery "
        f"{celery.get('version')} (Redis broker and result backend) and under pgtasks "
        f"{pgtasks.get('version')} (PostgreSQL), switched only by the import lines "
        f"({pgtasks.get('renamed_import_lines')} renamed) and the worker command. "
        "See [README.md](README.md) for how it works.",
        "",
        f"Results from {pgtasks.get('finished_at')}: **{summary(rows)}**; "
        f"{counts['supported']} features supported, {counts['partly supported']} partly "
        f"supported, {counts['unsupported']} unsupported.",
        "",
        "| Celery feature | pgtasks | scenarios passing | difference observed |",
        "|---|---|---|---|",
    ]
    for f in feats:
        failing = [r for r in f["rows"] if not r["passed"]]
        notes = [f"{r['name']}: {r['reason']}" for r in failing]
        notes += [
            f"{r['name']}: documented difference in `{d['key']}`"
            for r in f["rows"]
            for d in r.get("differences", ())
        ]
        diff = "; ".join(notes) or "none"
        lines.append(
            f"| {_cell(f['feature'])} | {f['status']} | {f['passed']}/{f['total']} | "
            f"{_cell(diff)} |"
        )
    failing = [r for r in rows if not r["passed"]]
    lines += ["", "## Scenarios that do not pass", ""]
    if not failing:
        lines.append("None.")
    for r in failing:
        lines.append(f"- **{r['name']}** ({r['feature']}) — {r['doc']}  ")
        lines.append(f"  Reason: {r['reason']}")
    broken = {m: e for m, e in (pgtasks.get("modules") or {}).items() if e}
    if broken:
        lines += [
            "",
            "## Project modules that do not import under pgtasks",
            "",
            "The worker starts without them; the scenarios that use them fail.",
            "",
        ]
        lines += [f"- `{m}`: {_cell(e)}" for m, e in broken.items()]
    problems = {w: p for w, p in (pgtasks.get("workers") or {}).get("problems", {}).items() if p}
    if problems:
        lines += ["", "## Worker start-up problems under pgtasks", ""]
        lines += [f"- `{w}`: {_cell(p)}" for w, p in problems.items()]
    differing = [r for r in rows if r.get("differences")]
    lines += ["", "## Documented differences", ""]
    if not differing:
        lines.append("None observed in this run.")
    for r in differing:
        for d in r["differences"]:
            lines.append(
                f"- **{r['name']}** (`{d['key']}`): {d['reason']} Celery: "
                f"`{_short(d['celery'], 300)}`; pgtasks: `{_short(d['pgtasks'], 300)}`."
            )
    noted = [r for r in rows if r["note"] or r["info"]["celery"] or r["info"]["pgtasks"]]
    if noted:
        lines += ["", "## Notes (observed, not compared)", ""]
        for r in noted:
            text = f"- **{r['name']}**:"
            if r["note"]:
                text += f" {r['note']}"
            if r["info"]["celery"] or r["info"]["pgtasks"]:
                text += (
                    f" Celery: `{_short(r['info']['celery'], 300)}`; "
                    f"pgtasks: `{_short(r['info']['pgtasks'], 300)}`."
                )
            lines.append(text)
    lines += [
        "",
        "## Every scenario",
        "",
        "| scenario | feature | verdict | what it checks |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {_cell(r['feature'])} | {_verdict_cell(r)} | {_cell(r['doc'])} |"
        )
    return "\n".join(lines) + "\n"
