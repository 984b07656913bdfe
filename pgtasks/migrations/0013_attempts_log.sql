-- The attempt history is a log: one row for the end of every run, found by task. Its unique key
-- on (task_id, attempt) made every history write an INSERT ... ON CONFLICT DO NOTHING, whose
-- speculative insertion cost 2.5-3 us of server CPU a row, 7% of a batch of completions on the
-- benchmark machine. The key guarded nothing the fenced writes do not: only the one write that
-- ends a run's ownership records it. Should a row edited by hand (its attempt set back) ever
-- repeat a number, both ends are now kept, rather than the second one vanishing.
CREATE INDEX attempts_task_idx ON {schema}.attempts (task_id, attempt);
ALTER TABLE {schema}.attempts DROP CONSTRAINT attempts_pkey;
