"""``python -m compat run|compare|report|all`` — see compat/README.md."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from compat import compare as cmp
from compat import harness

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _run(impl: str, out: Path, keep: bool) -> None:
    print(f"== {impl}: running scenarios", flush=True)
    report = harness.run(impl, out, keep=keep)
    statuses = [s["status"] for s in report["scenarios"].values()]
    print(
        f"== {impl}: {len(statuses)} scenarios in {report['seconds']}s "
        f"({statuses.count('error')} errors, {statuses.count('timeout')} timeouts) -> {out}",
        flush=True,
    )


def _compare(celery: Path, pgtasks: Path) -> list[dict]:
    rows = cmp.compare(cmp.load(celery), cmp.load(pgtasks))
    cmp.print_comparison(rows)
    return rows


def _verdict(rows: list[dict]) -> int:
    """The exit status of a comparison: 1 when any scenario failed."""
    return 0 if all(r["passed"] for r in rows) else 1


def _report(celery: Path, pgtasks: Path, out: Path) -> None:
    c, p = cmp.load(celery), cmp.load(pgtasks)
    out.write_text(cmp.render(c, p, cmp.compare(c, p)))
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every scenario under one implementation")
    run.add_argument("--impl", choices=harness.IMPLS, required=True)
    run.add_argument("--out", type=Path, help="default: compat/results/results-<impl>.json")
    run.add_argument("--keep", action="store_true", help="keep the temporary project and logs")
    for name in ("compare", "report"):
        p = sub.add_parser(name, help=f"{name} two result files")
        p.add_argument("celery", type=Path, nargs="?", default=RESULTS / "results-celery.json")
        p.add_argument("pgtasks", type=Path, nargs="?", default=RESULTS / "results-pgtasks.json")
        if name == "report":
            p.add_argument("--out", type=Path, default=HERE / "COMPAT.md")
    everything = sub.add_parser("all", help="run both, compare, write COMPAT.md")
    everything.add_argument("--dir", type=Path, default=RESULTS)
    everything.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)

    status = 0
    try:
        if args.command == "run":
            _run(args.impl, args.out or RESULTS / f"results-{args.impl}.json", args.keep)
        elif args.command == "compare":
            status = _verdict(_compare(args.celery, args.pgtasks))
        elif args.command == "report":
            _report(args.celery, args.pgtasks, args.out)
        else:
            began = time.monotonic()
            files = {impl: args.dir / f"results-{impl}.json" for impl in harness.IMPLS}
            for impl, path in files.items():
                _run(impl, path, args.keep)
            _report(files["celery"], files["pgtasks"], HERE / "COMPAT.md")
            status = _verdict(_compare(files["celery"], files["pgtasks"]))
            print(f"== total {time.monotonic() - began:.0f}s", file=sys.stderr)
    except harness.HarnessError as exc:
        print(f"compat: {exc}", file=sys.stderr)
        return 2
    # A failing scenario fails the run (1); the last line says how many.
    return status


if __name__ == "__main__":
    sys.exit(main())
