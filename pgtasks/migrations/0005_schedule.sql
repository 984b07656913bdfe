-- Periodic tasks. Every scheduler (a worker with -B, or `pgtasks beat`) computes the same tick
-- instants; a tick is enqueued by whichever inserts its (entry, tick_at) row first, in the
-- transaction that inserts the task, so each tick runs once however many schedulers there are.
CREATE TABLE {schema}.schedule_entries (
    name       text        PRIMARY KEY,
    task       text        NOT NULL,
    schedule   text        NOT NULL,
    last_tick  timestamptz,
    next_tick  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.schedule_ticks (
    name        text        NOT NULL,
    tick_at     timestamptz NOT NULL,
    task_id     text        NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, tick_at)
);
