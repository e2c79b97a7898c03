-- 0009: schedules (ONCE and CRON, domain/schedules.py) and their runs.
--
-- A schedule row holds its pending occurrence: `next_at`, the scheduled time
-- in UTC, and `dispatch_at`, that time plus the schedule's fixed offset in
-- its dispatch window. A dispatcher compares `dispatch_at` with the
-- database's now(), the cell's one clock, so no run starts early whatever a
-- process's clock says. Turning an occurrence into a job inserts its
-- schedule_runs row, whose key (schedule, scheduled time) admits one job per
-- occurrence however many dispatchers race for it, and moves `next_at` on in
-- the same transaction.

CREATE TABLE schedules (
    schedule_id              uuid PRIMARY KEY,
    tenant_id                text NOT NULL REFERENCES tenants,
    kind                     text NOT NULL CHECK (kind IN ('ONCE', 'CRON')),
    cron                     text,
    -- ONCE: the local wall time; time_zone says where (the DST rule picks the instant).
    run_at                   timestamp,
    time_zone                text NOT NULL,
    target                   text NOT NULL,
    payload                  jsonb NOT NULL,
    max_attempts             integer NOT NULL CHECK (max_attempts >= 1),
    misfire_policy           text NOT NULL CHECK (misfire_policy IN ('RUN_ONCE', 'SKIP', 'RUN_ALL')),
    max_catch_up_runs        integer NOT NULL CHECK (max_catch_up_runs BETWEEN 1 AND 1000),
    dispatch_window_seconds  integer NOT NULL CHECK (dispatch_window_seconds BETWEEN 0 AND 86400),
    -- A hash of the id (domain/schedules.py), stored so that a dispatcher's
    -- query needs no code to find what is due.
    dispatch_offset          interval NOT NULL,
    state                    text NOT NULL CHECK (state IN ('active', 'paused', 'cancelled', 'completed')),
    next_at                  timestamptz,
    dispatch_at              timestamptz,
    -- The job of the latest occurrence: while it is queued or running, the
    -- schedule is busy and an update is refused.
    last_job_id              uuid,
    -- The create request's Idempotency-Key and a hash of its body: a retried
    -- create returns the schedule it made, instead of a second one that would
    -- run every occurrence twice.
    create_key               text,
    create_hash              bytea,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'CRON') = (cron IS NOT NULL)),
    CHECK ((kind = 'ONCE') = (run_at IS NOT NULL)),
    CHECK ((next_at IS NULL) = (dispatch_at IS NULL)),
    CHECK (state NOT IN ('active', 'paused') OR next_at IS NOT NULL),
    CHECK ((create_key IS NULL) = (create_hash IS NULL))
);
CREATE UNIQUE INDEX schedules_create_key ON schedules (tenant_id, create_key)
    WHERE create_key IS NOT NULL;
-- The dispatcher's scan: active schedules by the time they are due.
CREATE INDEX schedules_due ON schedules (dispatch_at) WHERE state = 'active';
CREATE INDEX schedules_tenant_listing ON schedules (tenant_id, created_at DESC, schedule_id DESC);

-- One row per occurrence that became a job. Attempts, outcome and timings
-- are the job's own columns; the run row ties them to the occurrence.
CREATE TABLE schedule_runs (
    schedule_id      uuid NOT NULL REFERENCES schedules ON DELETE CASCADE,
    scheduled_for    timestamptz NOT NULL,
    tenant_id        text NOT NULL REFERENCES tenants,
    job_id           uuid NOT NULL UNIQUE,
    idempotency_key  text NOT NULL,
    dispatched_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, scheduled_for)
);
CREATE INDEX schedule_runs_history ON schedule_runs (schedule_id, scheduled_for DESC);
CREATE INDEX schedule_runs_retention ON schedule_runs (dispatched_at);

-- Both tables are tenant data: fenced by the placement group's epoch and
-- deadline (0002, 0004) like every other.
CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON schedules
    FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write();
CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON schedule_runs
    FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write();
CREATE CONSTRAINT TRIGGER cellplane_guard_commit AFTER INSERT OR UPDATE OR DELETE ON schedules
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cellplane_guard_commit();
CREATE CONSTRAINT TRIGGER cellplane_guard_commit AFTER INSERT OR UPDATE OR DELETE ON schedule_runs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cellplane_guard_commit();

-- The tenant fence of a move (0006): a frozen or moved tenant's schedules
-- take no writes. Their changes are not captured yet: a move does not carry
-- schedules until the move's copy learns these tables.
CREATE FUNCTION cellplane_schedule_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
    RETURN NULL;
END
$$;

DO $$
DECLARE
    fenced text;
BEGIN
    FOREACH fenced IN ARRAY ARRAY['schedules', 'schedule_runs']
    LOOP
        EXECUTE format('CREATE TRIGGER cellplane_tenant_fence_insert AFTER INSERT ON %I '
                       'REFERENCING NEW TABLE AS changed FOR EACH STATEMENT '
                       'EXECUTE FUNCTION cellplane_schedule_fence()', fenced);
        EXECUTE format('CREATE TRIGGER cellplane_tenant_fence_update AFTER UPDATE ON %I '
                       'REFERENCING NEW TABLE AS changed FOR EACH STATEMENT '
                       'EXECUTE FUNCTION cellplane_schedule_fence()', fenced);
        EXECUTE format('CREATE TRIGGER cellplane_tenant_fence_delete AFTER DELETE ON %I '
                       'REFERENCING OLD TABLE AS changed FOR EACH STATEMENT '
                       'EXECUTE FUNCTION cellplane_schedule_fence()', fenced);
    END LOOP;
END
$$;
