-- Operator queries (queue stats, dead letters, health) and requeue of dead letters.

-- Throughput and per-minute outcome counts read a time window of the attempt history, which
-- grows with every run: without this index each window is a scan of the whole history.
CREATE INDEX attempts_finished_idx ON {schema}.attempts (finished_at);
-- Dead letters listed newest first, counted, and counted over a recent window.
CREATE INDEX tasks_dead_idx ON {schema}.tasks (updated_at) WHERE status = 'DEAD';
-- The attempt at which an operator last requeued this dead-lettered task (0: never). The attempt
-- itself never goes back (it is the fencing token), so lost-worker accounting counts only the
-- claims after this one: a requeued task may again lose max_lost_attempts workers.
ALTER TABLE {schema}.tasks ADD COLUMN requeued_attempt integer NOT NULL DEFAULT 0;
