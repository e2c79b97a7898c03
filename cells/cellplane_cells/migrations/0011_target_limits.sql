-- 0011: every registered target's concurrency limit (AIMD), Retry-After hold and
-- circuit breaker, shared by every worker of the cell; and the calls in flight.
--
-- The breaker columns are the ones webhook_endpoints has had since 0001, read
-- and written by the same state machine (domain/breaker.py); the AIMD limit
-- and the hold sit beside them (domain/aimd.py). All of it lives in a table
-- of its own rather than in `targets` because it changes on every call: in
-- `targets` each call would be a change a tenant move captures and copies
-- (0006), and a move's checksum would compare two cells' views of a target's
-- load, which differ by nature. A tenant that moves starts afresh at the
-- other cell, from the policy's initial limit.
CREATE TABLE target_limits (
    tenant_id          text NOT NULL,
    target             text NOT NULL,
    concurrency_limit  double precision NOT NULL CHECK (concurrency_limit >= 1),
    max_concurrency    integer NOT NULL CHECK (max_concurrency >= 1),
    decreased_at       timestamptz,
    hold_until         timestamptz,
    breaker            text NOT NULL DEFAULT 'closed' CHECK (breaker IN ('closed', 'open', 'half_open')),
    failures           integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    open_until         timestamptz,
    ramp_allowance     integer NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, target),
    FOREIGN KEY (tenant_id, target) REFERENCES targets (tenant_id, name) ON DELETE CASCADE
);

-- One row per call in flight: a slot. It counts only while its job is still
-- running under the claim that took it (`claim_epoch`), so a slot is never
-- leaked: a job that finishes in any way leaves 'running', and a job whose
-- worker died is reaped with its claim epoch raised, and its slot stops
-- counting at that moment. Until the reaper has run, an expired lease still
-- counts: its worker may only be paused with the call still out, so the
-- error is towards fewer calls, never more. Rows that no longer count are
-- swept by the next slot taken on the same target.
CREATE TABLE target_calls (
    job_id       uuid PRIMARY KEY REFERENCES jobs ON DELETE CASCADE,
    tenant_id    text NOT NULL,
    target       text NOT NULL,
    claim_epoch  bigint NOT NULL,
    started_at   timestamptz NOT NULL,
    FOREIGN KEY (tenant_id, target) REFERENCES target_limits (tenant_id, target) ON DELETE CASCADE
);
CREATE INDEX target_calls_by_target ON target_calls (tenant_id, target);

-- Written only by the placement group's owner, like every table of the cell
-- (0002, 0004). No tenant fence (0006): none of it moves with a tenant, and a
-- frozen tenant's jobs do not run.
CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON target_limits
    FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write();
CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON target_calls
    FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write();
CREATE CONSTRAINT TRIGGER cellplane_guard_commit AFTER INSERT OR UPDATE OR DELETE ON target_limits
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cellplane_guard_commit();
CREATE CONSTRAINT TRIGGER cellplane_guard_commit AFTER INSERT OR UPDATE OR DELETE ON target_calls
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cellplane_guard_commit();
