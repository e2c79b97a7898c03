-- A tenant leaving the cell: retired (its rows stay) or purged (its rows go).
-- Both run in one transaction each; every statement passes the fencing
-- triggers like any other write.

-- name: retire_tenant
-- The key stops authenticating and claims pass the tenant by (both look for
-- other states); queued jobs, money, keys and events stay as they are.
-- Answers the tenant whether or not it was retired already.
UPDATE tenants
   SET state = 'retired',
       updated_at = CASE WHEN state = 'retired' THEN updated_at ELSE now() END
 WHERE tenant_id = %(tenant_id)s
RETURNING tenant_id;

-- name: lock_schedules_for_purge
-- Before the tenant row: a dispatcher's pass locks schedules first and then
-- references the tenant (its jobs' foreign key). Taking the tenant first
-- and the schedules second, a purge would deadlock with such a pass; in this
-- order it waits for the pass to commit.
SELECT schedule_id FROM schedules WHERE tenant_id = %(tenant_id)s ORDER BY schedule_id FOR UPDATE;

-- name: lock_tenant_for_purge
-- First statement of a purge. FOR UPDATE conflicts with the KEY SHARE lock
-- that every insert referencing the tenant takes through its foreign key: a
-- submission in flight finishes first (and its rows are purged with the
-- rest); one that starts later waits, then finds the tenant gone.
SELECT tenant_id FROM tenants WHERE tenant_id = %(tenant_id)s FOR UPDATE;

-- The purge statements, in the order the foreign keys accept: rows that point
-- at others go before the rows they point at. Several of these rows would go
-- by ON DELETE CASCADE anyway; deleting each explicitly keeps the order
-- visible here and independent of how each foreign key was declared.

-- name: purge_delivery_attempts
-- Attempts of the tenant's events, and of anything sent to its endpoints.
DELETE FROM delivery_attempts a
 WHERE a.event_id IN (SELECT event_id FROM outbox WHERE tenant_id = %(tenant_id)s)
    OR a.endpoint_id IN (SELECT endpoint_id FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s);

-- name: purge_deliveries
DELETE FROM deliveries d
 WHERE d.event_id IN (SELECT event_id FROM outbox WHERE tenant_id = %(tenant_id)s)
    OR d.endpoint_id IN (SELECT endpoint_id FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s);

-- name: purge_outbox
DELETE FROM outbox WHERE tenant_id = %(tenant_id)s;

-- name: purge_job_steps
DELETE FROM job_steps s
 WHERE s.job_id IN (SELECT job_id FROM jobs WHERE tenant_id = %(tenant_id)s);

-- name: purge_ledger
DELETE FROM ledger WHERE tenant_id = %(tenant_id)s;

-- name: purge_idempotency_keys
DELETE FROM idempotency_keys WHERE tenant_id = %(tenant_id)s;

-- name: purge_schedule_runs
DELETE FROM schedule_runs WHERE tenant_id = %(tenant_id)s;

-- name: purge_schedules
DELETE FROM schedules WHERE tenant_id = %(tenant_id)s;

-- name: purge_target_calls
-- The tenant's calls in flight and its targets' limits (0011); the foreign
-- keys would cascade, but a purge names every table it empties.
DELETE FROM target_calls WHERE tenant_id = %(tenant_id)s;

-- name: purge_target_limits
DELETE FROM target_limits WHERE tenant_id = %(tenant_id)s;

-- name: purge_jobs
-- A worker still running one of these jobs finds it gone: its heartbeat and
-- every later write are conditional on the job's row and change nothing.
DELETE FROM jobs WHERE tenant_id = %(tenant_id)s;

-- name: purge_webhook_endpoints
DELETE FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s;

-- name: purge_targets
DELETE FROM targets WHERE tenant_id = %(tenant_id)s;

-- name: purge_wallet
DELETE FROM wallets WHERE tenant_id = %(tenant_id)s;

-- name: purge_rate_bucket
DELETE FROM rate_buckets WHERE tenant_id = %(tenant_id)s;

-- name: purge_tenant_changes
-- A move's change capture (0006): no foreign key, so no cascade either.
DELETE FROM tenant_changes WHERE tenant_id = %(tenant_id)s;

-- name: purge_tenant
DELETE FROM tenants WHERE tenant_id = %(tenant_id)s;
