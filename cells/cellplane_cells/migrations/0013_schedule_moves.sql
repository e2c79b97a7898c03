-- 0013: a tenant's schedules and their run history move with it.
--
-- 0009 fenced both tables for a move but captured none of their changes, so
-- a move left them behind. The fence's function now also records, while the
-- tenant's changes are captured (0006), the key of every schedule and run it
-- writes: a schedule by its id, a run by its job's id (unique, and one
-- column, as every key in tenant_changes is). The move re-sends the current
-- version of each, or a delete for one gone (a run pruned by its retention).
-- The triggers are 0009's; only the function they call changes.

CREATE OR REPLACE FUNCTION cellplane_schedule_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    captured text[];
BEGIN
    captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
    IF captured IS NULL THEN
        RETURN NULL;
    END IF;
    CASE TG_TABLE_NAME
    WHEN 'schedules' THEN
        INSERT INTO tenant_changes (tenant_id, kind, key)
        SELECT DISTINCT c.tenant_id, 'schedules', c.schedule_id::text FROM changed c
         WHERE c.tenant_id = ANY(captured);
    WHEN 'schedule_runs' THEN
        INSERT INTO tenant_changes (tenant_id, kind, key)
        SELECT DISTINCT c.tenant_id, 'schedule_runs', c.job_id::text FROM changed c
         WHERE c.tenant_id = ANY(captured);
    END CASE;
    RETURN NULL;
END
$$;

-- A move pages a tenant's runs by job id, and a purge deletes them by tenant.
CREATE INDEX schedule_runs_by_tenant ON schedule_runs (tenant_id, job_id);
