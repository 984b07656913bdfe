"""``pgtasks bench``: what pgtasks does on your database, measured with no-op tasks.

Five phases, run in the schema ``pgtasks_bench`` (created fresh, marked as the bench's by its
comment, dropped at the end) so the application's own tasks are never touched:

- ``enqueue``: ``task.delay()`` one call at a time, then ``task.apply_many()`` in batches of
  1000, in tasks per second, and how much of a single enqueue is its commit's wait for the disk
  (the same enqueue with ``synchronous_commit`` on and off);
- ``burn-down``: worker processes (``python -m pgtasks -A pgtasks.cli.bench.tasks worker``)
  started and registered first, then N tasks made visible at once (one transaction), timed
  until every one has finished;
- ``latency``: on idle workers, paced ``delay()`` calls whose task returns the time it started;
  the percentiles of start minus send, in milliseconds, and of its two parts: the ``delay()``
  call itself (its commit included) and the time from its return to the task's start
  (negative when the task started first: a task handed to a waiting worker starts as its row
  commits, while the call waits for the flush to disk);
- ``capacity`` (only when asked for): what the workers finish while the bench enqueues
  alongside them, keeping the queue topped up, once the pruning keeps pace;
- ``steady`` (only when asked for): enqueue and processing together at a fixed offered load
  (by default 80% of the capacity, else of the burn-down rate) for several minutes, with
  latency percentiles and the size of the tables every ten seconds, on workers keeping
  finished rows for a minute.

The capacity and steady phases read their figures window by window, ten seconds each unless
``window`` says otherwise; shorter windows make a run of a few seconds possible, to check that
the bench runs on a database, but hold too few tasks for figures that mean anything.

Burn-down and steady also report what a task costs: WAL bytes per task, the CPU time of the
worker processes per 1,000 tasks, and that of the server processes serving the database (both
read from ``/proc``, so only on Linux, and the server's only when it runs on this host).

The bench is an entry point, not part of the library: its own modules, its own SQL
(``queries.sql``, run by ``store``), and an app of its own, made on first use (``tasks``).
Importing it makes no app and opens no connection.

- ``command``: the ``pgtasks bench`` command;
- ``options``: what a run is asked for, and the phases;
- ``runner``: a run, from the fresh schema to its drop;
- ``phases``: enqueue, burn-down and latency; ``load``: capacity and steady;
- ``workers``: the worker processes; ``tasks``: the bench's app and its no-op tasks;
- ``cost``: WAL and CPU time per task; ``figures``: the arithmetic on what is measured;
- ``progress`` and ``report``: what is shown as it runs, and at the end;
- ``store``: the bench's named queries, on the app's broker connections.
"""

from __future__ import annotations

# Registers ``pgtasks bench`` with the command group; the command imports the rest when run.
from pgtasks.cli.bench import command

__all__ = ["command"]
