-- 0014: the strict allowance (domain/strict_allowance.py): how many active
-- strict (dispatch window 0) schedules a tenant may have, and with it who may
-- queue CRITICAL work. spec.quotas.strictSchedules is tenants.strict_schedules.
--
-- NULL is a row written before this migration (or by a tool that does not
-- know the column, or exported by a cell that has not run it): the tenant has
-- its plan's default, read through cellplane_strict_schedules_default. A
-- migration has no placement-group epoch, so it cannot backfill the guarded
-- tenants table; the operator's next provisioning writes the spec's value, as
-- for every quota. A tenant that has more active strict schedules than its
-- allowance keeps them: the API refuses only a write that would add one.

ALTER TABLE tenants ADD COLUMN strict_schedules integer CHECK (strict_schedules >= 0);

-- The plan defaults of domain/plans.py. A change there needs a migration that
-- replaces this function (test_admin.py compares the two).
CREATE FUNCTION cellplane_strict_schedules_default(plan text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE plan WHEN 'enterprise' THEN 20 WHEN 'pro' THEN 5 ELSE 0 END
$$;

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
