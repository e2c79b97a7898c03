-- Export and import of one tenant's rows, for moves between cells. Rows
-- travel as JSON built by Postgres itself (row_to_json / json_populate_recordset),
-- so every column keeps its exact type and nothing is parsed by hand.

-- name: export_tenant
SELECT json_build_object(
    'tenant', (SELECT row_to_json(t) FROM tenants t WHERE t.tenant_id = %(tenant_id)s),
    'wallet', (SELECT row_to_json(w) FROM wallets w WHERE w.tenant_id = %(tenant_id)s),
    'rate_bucket', (SELECT row_to_json(b) FROM rate_buckets b WHERE b.tenant_id = %(tenant_id)s),
    'targets', (SELECT coalesce(json_agg(g), '[]') FROM targets g WHERE g.tenant_id = %(tenant_id)s),
    'webhooks', (SELECT coalesce(json_agg(e), '[]') FROM webhook_endpoints e WHERE e.tenant_id = %(tenant_id)s),
    'jobs', (SELECT coalesce(json_agg(j), '[]') FROM jobs j
              WHERE j.tenant_id = %(tenant_id)s AND j.status IN ('queued', 'running')),
    'steps', (SELECT coalesce(json_agg(s), '[]') FROM job_steps s JOIN jobs j USING (job_id)
               WHERE j.tenant_id = %(tenant_id)s AND j.status IN ('queued', 'running')),
    'ledger', (SELECT coalesce(json_agg(l), '[]') FROM ledger l JOIN jobs j USING (job_id)
                WHERE j.tenant_id = %(tenant_id)s AND j.status IN ('queued', 'running')),
    'idempotency_keys', (SELECT coalesce(json_agg(k), '[]') FROM idempotency_keys k
                          WHERE k.tenant_id = %(tenant_id)s),
    'outbox', (SELECT coalesce(json_agg(o), '[]') FROM outbox o
                WHERE o.tenant_id = %(tenant_id)s
                  AND (o.relayed_at IS NULL OR EXISTS (
                       SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id AND d.status = 'pending'))),
    'schedules', (SELECT coalesce(json_agg(s), '[]') FROM schedules s WHERE s.tenant_id = %(tenant_id)s),
    'schedule_runs', (SELECT coalesce(json_agg(r), '[]') FROM schedule_runs r
                       WHERE r.tenant_id = %(tenant_id)s)
) AS bundle;

-- name: import_tenant_row
-- The tenant arrives with no running jobs in this cell and first in the
-- round-robin; its epoch is whatever the move decided. A row exported before
-- migration 0012 names its running-jobs quota `max_running`; one exported
-- before 0014 has no strict allowance (NULL: its plan's default, 0014).
INSERT INTO tenants (tenant_id, plan, state, epoch, max_running_jobs, jobs_per_second, burst,
                     daily_spend_limit, strict_schedules, running, last_served_at, api_key_hash,
                     signing_secret)
SELECT tenant_id, plan, state, %(epoch)s,
       coalesce(max_running_jobs, (%(row)s::json->>'max_running')::integer), jobs_per_second, burst,
       daily_spend_limit, strict_schedules, 0, '-infinity', api_key_hash, signing_secret
  FROM json_populate_record(null::tenants, %(row)s::json)
ON CONFLICT (tenant_id) DO NOTHING
RETURNING tenant_id;

-- name: import_wallet
INSERT INTO wallets SELECT * FROM json_populate_record(null::wallets, %(row)s::json)
ON CONFLICT (tenant_id) DO NOTHING;

-- name: import_rate_bucket
INSERT INTO rate_buckets SELECT * FROM json_populate_record(null::rate_buckets, %(row)s::json)
ON CONFLICT (tenant_id) DO NOTHING;

-- name: import_targets
INSERT INTO targets SELECT * FROM json_populate_recordset(null::targets, %(rows)s::json)
ON CONFLICT (tenant_id, name) DO NOTHING;

-- name: import_webhooks
-- Endpoint ids are this cell's own; the breaker starts closed here.
INSERT INTO webhook_endpoints (tenant_id, url, secret, max_concurrency)
SELECT tenant_id, url, secret, max_concurrency
  FROM json_populate_recordset(null::webhook_endpoints, %(rows)s::json)
ON CONFLICT (tenant_id, url) DO NOTHING;

-- name: import_jobs
-- A job that was running in the source runs again here from its first
-- unfinished step, under a new claim epoch.
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, attempts, max_attempts,
                  estimate, priority, run_after, expires_at, claim_epoch, claimed_by, lease_until,
                  cancel_requested, redriven_from, redriven_to, last_error, error_code,
                  created_at, started_at, finished_at)
SELECT job_id, tenant_id, 'queued', target, step_count, payload, attempts, max_attempts,
       estimate, coalesce(priority, 'DEFAULT'), run_after, expires_at, claim_epoch + 1, NULL,
       NULL, cancel_requested,
       redriven_from, redriven_to, last_error, error_code, created_at, started_at, NULL
  FROM json_populate_recordset(null::jobs, %(rows)s::json)
ON CONFLICT (job_id) DO NOTHING;

-- name: import_steps
INSERT INTO job_steps SELECT * FROM json_populate_recordset(null::job_steps, %(rows)s::json)
ON CONFLICT (job_id, step) DO NOTHING;

-- name: import_ledger
-- Entry ids are this cell's own; (job, kind) stays unique across the move.
INSERT INTO ledger (tenant_id, job_id, kind, amount, created_at)
SELECT tenant_id, job_id, kind, amount, created_at
  FROM json_populate_recordset(null::ledger, %(rows)s::json)
ON CONFLICT (job_id, kind) DO NOTHING;

-- name: import_idempotency_keys
INSERT INTO idempotency_keys
SELECT * FROM json_populate_recordset(null::idempotency_keys, %(rows)s::json)
ON CONFLICT (tenant_id, key) DO NOTHING;

-- name: import_outbox
-- Events not yet delivered everywhere are fanned out again here; receivers
-- deduplicate by event id.
INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload, created_at)
SELECT event_id, tenant_id, job_id, kind, payload, created_at
  FROM json_populate_recordset(null::outbox, %(rows)s::json)
ON CONFLICT (event_id) DO NOTHING;

-- name: import_schedules
-- As exported: the pending occurrence, the state and the job of the latest
-- run, so the dispatcher here carries on where the exporting cell's stopped
-- (an occurrence dispatched there has its run and its job in the bundle).
-- ON CONFLICT without a target: the id, or a create key already here.
INSERT INTO schedules (schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload,
                       max_attempts, misfire_policy, max_catch_up_runs, dispatch_window_seconds,
                       dispatch_offset, priority, state, next_at, dispatch_at, last_job_id,
                       create_key, create_hash, created_at, updated_at)
SELECT schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload, max_attempts,
       misfire_policy, max_catch_up_runs, dispatch_window_seconds, dispatch_offset,
       coalesce(priority, 'DEFAULT'), state, next_at, dispatch_at, last_job_id, create_key,
       create_hash, created_at, updated_at
  FROM json_populate_recordset(null::schedules, %(rows)s::json)
ON CONFLICT DO NOTHING;

-- name: import_schedule_runs
-- The runs' keys keep a second job per occurrence impossible here too.
INSERT INTO schedule_runs (schedule_id, scheduled_for, tenant_id, job_id, idempotency_key,
                           dispatched_at)
SELECT schedule_id, scheduled_for, tenant_id, job_id, idempotency_key, dispatched_at
  FROM json_populate_recordset(null::schedule_runs, %(rows)s::json)
ON CONFLICT DO NOTHING;
