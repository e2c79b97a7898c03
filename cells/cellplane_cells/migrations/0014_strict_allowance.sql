-- 0014: the strict allowance (domain/strict_allowance.py): how many active
-- strict (dispatch window 0) schedules a tenant may have, and with it who may
-- queue CRITICAL work. spec.quotas.strictSchedules is tenants.strict_schedules.
--
-- Existing tenants get their plan's default of today (domain/plans.py): the
-- operator sets the spec's value at its next provisioning, as for every quota.
-- The same function fills the column of a tenant row exported by a cell that
-- has not run this migration (an import, a move in from an older cell).
-- The column's default (0) is for rows written without it (tests, tools);
-- upsert_tenant always sets it.
-- A tenant that has more active strict schedules than the allowance keeps
-- them: the API refuses only a write that would add one.

CREATE FUNCTION cellplane_strict_schedules_default(plan text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE plan WHEN 'enterprise' THEN 20 WHEN 'pro' THEN 5 ELSE 0 END
$$;

ALTER TABLE tenants ADD COLUMN strict_schedules integer NOT NULL DEFAULT 0
    CHECK (strict_schedules >= 0);
UPDATE tenants SET strict_schedules = cellplane_strict_schedules_default(plan);

-- The count the API makes under the tenant's strict lock (schedules.sql,
-- strict_in_use): the active strict schedules of one tenant, few.
CREATE INDEX schedules_strict_active ON schedules (tenant_id)
    WHERE state = 'active' AND dispatch_window_seconds = 0;

-- A move carries the tenant row's quota changes (0006's capture): the
-- allowance is one of them now. Same trigger, one more column, the columns
-- under today's names (0012).
DROP TRIGGER cellplane_capture_tenant_row ON tenants;
CREATE TRIGGER cellplane_capture_tenant_row AFTER UPDATE ON tenants FOR EACH ROW
    WHEN (NEW.capturing AND (OLD.plan, OLD.max_running_jobs, OLD.jobs_per_second, OLD.burst,
                             OLD.daily_spend_limit, OLD.strict_schedules, OLD.api_key_hash,
                             OLD.signing_secret)
                            IS DISTINCT FROM
                            (NEW.plan, NEW.max_running_jobs, NEW.jobs_per_second, NEW.burst,
                             NEW.daily_spend_limit, NEW.strict_schedules, NEW.api_key_hash,
                             NEW.signing_secret))
    EXECUTE FUNCTION cellplane_capture_tenant_row();
