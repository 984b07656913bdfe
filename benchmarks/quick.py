"""A quick local measurement, kept for its old command line: ``pgtasks bench`` does the work.

    python -m benchmarks.quick --dsn postgresql://localhost/bench [--tasks 10000] [--workers 2]

is ``pgtasks bench --database-url postgresql://localhost/bench --tasks 10000 --workers 2`` (see
:mod:`pgtasks.cli.bench`). The side-by-side comparison with other queues is the shared harness
(``benchmarks/pgtasks_adapter.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pgtasks.cli.bench.options import DEFAULT_SCHEMA, BenchError, Options, parse_phases
from pgtasks.cli.bench.report import format_report
from pgtasks.cli.bench.runner import run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGTASKS_DATABASE_URL"))
    parser.add_argument("--schema", default=DEFAULT_SCHEMA)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1, help="slots per worker")
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--prefetch-multiplier", type=int, default=None)
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--only", default=None, help="enqueue,burn-down,latency")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.dsn:
        sys.exit("give --dsn or set PGTASKS_DATABASE_URL")
    try:
        report = run(
            Options(
                database_url=args.dsn,
                schema=args.schema,
                tasks=args.tasks,
                workers=args.workers,
                concurrency=args.concurrency,
                pool=args.pool,
                prefetch_multiplier=args.prefetch_multiplier,
                latency_samples=args.latency_samples,
                rate=args.rate,
                phases=parse_phases(args.only),
            )
        )
    except BenchError as exc:
        sys.exit(f"error: {exc}")
    print(json.dumps(report, indent=2) if args.json else format_report(report))


if __name__ == "__main__":
    main()
