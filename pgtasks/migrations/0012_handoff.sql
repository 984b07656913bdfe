-- Direct hand-off. A worker whose claims find nothing due parks here (one row per worker) while
-- it waits. A single enqueue of a task that could start now takes one parked worker of its queue
-- in the same statement: the row is written RUNNING for that worker (attempt 1, under the
-- worker's lease, so fenced exactly as a claimed row) and NOTIFY sends the worker the claimed
-- row on its own channel, so the task starts without a claim's round trip.
--
-- A hand-off consumes the worker's row: a worker is handed at most one task per park. A row
-- is good until "until" (the database clock), and its worker parks again before then while it
-- stays idle, so a worker that died parked can be handed one task at most, which its lease
-- brings back like any other. Unlogged: after a crash the table is empty and idle workers park
-- again at their next poll.
CREATE UNLOGGED TABLE {schema}.parked_workers (
    worker     text        PRIMARY KEY,
    -- The channel the worker listens on for the rows handed to it.
    channel    text        NOT NULL,
    queues     text[]      NOT NULL,
    -- Tasks the worker claims the usual way only (those with a rate limit there).
    skip_names text[]      NOT NULL DEFAULT '{{}}',
    lease      float8      NOT NULL CHECK (lease > 0),
    until      timestamptz NOT NULL
);
