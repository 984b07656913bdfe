-- Effects: the side effects a task has done, by name, so that a run after a crash or a lost
-- lease skips what an earlier run of the same task already committed (Task.effect).
CREATE TABLE {schema}.effects (
    task_id    text        NOT NULL,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, name)
);
