-- 0012: the running-jobs quota has one name from the Tenant's spec to the
-- column (issue #23): spec.quotas.maxRunningJobs is tenants.max_running_jobs,
-- no longer max_running.
--
-- A rename only: the values stay, and so do the CHECK and the move's capture
-- trigger (0006), which Postgres keeps by column number, not by name. The
-- CHECK takes the name Postgres gives such a constraint now, so the old
-- spelling is nowhere in the schema. A tenant row exported by a cell that has
-- not run this migration still says `max_running`: the imports read either
-- name (transfer.sql, moves.sql).

ALTER TABLE tenants RENAME COLUMN max_running TO max_running_jobs;
ALTER TABLE tenants RENAME CONSTRAINT tenants_max_running_check TO tenants_max_running_jobs_check;
