-- 0010: priority classes (domain/priorities.py) on jobs and schedules.
--
-- A job's class decides which of a worker's slots it may take: each class has
-- a floor of slots, and idle slots go to the highest class with work. A
-- schedule's runs are queued in the schedule's class. Existing rows are
-- DEFAULT, the class a job that names none gets.

ALTER TABLE jobs ADD COLUMN priority text NOT NULL DEFAULT 'DEFAULT'
    CHECK (priority IN ('CRITICAL', 'HIGH', 'DEFAULT', 'LOW'));
ALTER TABLE schedules ADD COLUMN priority text NOT NULL DEFAULT 'DEFAULT'
    CHECK (priority IN ('CRITICAL', 'HIGH', 'DEFAULT', 'LOW'));

-- The claim of one class: "does this tenant have due work of the class" and
-- "its oldest due job of the class". jobs_queued (0001) still serves the
-- moves' pages and the queue metrics.
CREATE INDEX jobs_queued_by_class ON jobs (priority, tenant_id, created_at, job_id)
    WHERE status = 'queued';

-- Tenants take turns within each class: a tenant's last claim in a class, so
-- a tenant served in LOW is not sent to the back of the CRITICAL queue. No
-- row: never served in the class, first in turn. `tenants.last_served_at`
-- stays the claim's "served since my snapshot" check (queue.sql). Queue
-- bookkeeping, not tenant data: a move does not carry it (the tenant starts
-- first in turn in its new cell, as it does today).
CREATE TABLE tenant_class_turns (
    tenant_id       text NOT NULL REFERENCES tenants ON DELETE CASCADE,
    priority        text NOT NULL CHECK (priority IN ('CRITICAL', 'HIGH', 'DEFAULT', 'LOW')),
    last_served_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, priority)
);

-- Written by claims: fenced by the placement group's epoch and deadline like
-- the jobs it goes with (0002, 0004).
CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON tenant_class_turns
    FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write();
CREATE CONSTRAINT TRIGGER cellplane_guard_commit AFTER INSERT OR UPDATE OR DELETE
    ON tenant_class_turns
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cellplane_guard_commit();
