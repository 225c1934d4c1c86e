-- The two `apply_pending_summary` signatures that built a usage event's metadata in
-- PL/pgSQL (the seven-argument one of migration 14 and its six-argument wrapper without
-- a job id) were kept by migration 21 for workers of the release before it during a
-- rolling upgrade. Three releases later no such worker runs: the event's metadata is
-- built in one place, the worker's (`compaction::record`), and the function of
-- migration 21 (redefined by 22 and 23) only merges what the applying transaction knows.
DROP FUNCTION IF EXISTS apply_pending_summary(text, text, bigint, bigint, text, bigint);
DROP FUNCTION IF EXISTS apply_pending_summary(text, text, text, bigint, bigint, text, bigint);
