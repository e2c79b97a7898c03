-- 0003: what the webhook relay needs beyond 0001's deliveries table.
--
-- A lease on each delivery in flight. The per-endpoint concurrency cap and the
-- breaker's ramp allowance must hold across every relay of the cell, not per
-- process, so "in flight" is a fact in the database: a delivery holds a lease
-- from its claim until its outcome is recorded. A relay that dies leaves its
-- leases to run out; the reaper then records the attempt as lost and the
-- delivery goes out again (at-least-once).
ALTER TABLE deliveries
    ADD COLUMN leased_until timestamptz,
    ADD COLUMN leased_by    text;

-- Claims look for an endpoint's due, unleased deliveries, oldest first.
CREATE INDEX deliveries_due_per_endpoint ON deliveries (endpoint_id, next_attempt_at)
    WHERE status = 'pending' AND leased_until IS NULL;
-- Leased rows are few (at most the sum of the endpoints' caps), so one small
-- partial index serves both the in-flight count per endpoint and the reaper.
CREATE INDEX deliveries_leased ON deliveries (endpoint_id, leased_until)
    WHERE leased_until IS NOT NULL;

-- Every attempt and its outcome: `deliveries` keeps only the latest, and a
-- receiver's "you sent this three times" deserves an answer.
CREATE TABLE delivery_attempts (
    event_id     uuid NOT NULL,
    endpoint_id  bigint NOT NULL,
    attempt      integer NOT NULL CHECK (attempt >= 1),
    relay        text NOT NULL,
    -- in_flight until the outcome is known; rejected: a 4xx that no retry
    -- will change; lost: the relay never reported back (its lease ran out).
    outcome      text NOT NULL CHECK (outcome IN
                   ('in_flight', 'delivered', 'failed', 'rejected', 'lost')),
    status_code  integer,
    error        text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (event_id, endpoint_id, attempt),
    FOREIGN KEY (event_id, endpoint_id) REFERENCES deliveries ON DELETE CASCADE
);

-- Tenant data like the rest: fenced by the placement group's epoch (0002).
CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON delivery_attempts FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write();
