-- The operator's statements: tenants, their quotas, targets, webhooks, wallets.

-- name: upsert_tenant
-- Creates the tenant or updates its plan and quotas. The running counter,
-- the fairness position and the epoch are never touched here. A retired
-- tenant (removed with policy=retain) is placed here again: active, with the
-- key it had unless a new one is given. Paused and frozen stay as they are.
INSERT INTO tenants (tenant_id, plan, max_running_jobs, jobs_per_second, burst, daily_spend_limit,
                     strict_schedules, signing_secret, api_key_hash)
VALUES (%(tenant_id)s, %(plan)s, %(max_running_jobs)s, %(jobs_per_second)s, %(burst)s,
        %(daily_spend_limit)s, %(strict_schedules)s, %(signing_secret)s, %(api_key_hash)s)
ON CONFLICT (tenant_id) DO UPDATE
   SET state = CASE WHEN tenants.state = 'retired' THEN 'active' ELSE tenants.state END,
       plan = EXCLUDED.plan, max_running_jobs = EXCLUDED.max_running_jobs,
       jobs_per_second = EXCLUDED.jobs_per_second, burst = EXCLUDED.burst,
       daily_spend_limit = EXCLUDED.daily_spend_limit,
       strict_schedules = EXCLUDED.strict_schedules,
       api_key_hash = coalesce(EXCLUDED.api_key_hash, tenants.api_key_hash),
       updated_at = now()
RETURNING tenant_id, (xmax = 0) AS created;

-- name: ensure_bucket
INSERT INTO rate_buckets (tenant_id, tokens, refilled_at)
VALUES (%(tenant_id)s, %(burst)s, clock_timestamp())
ON CONFLICT (tenant_id) DO NOTHING;

-- name: ensure_wallet
INSERT INTO wallets (tenant_id, available) VALUES (%(tenant_id)s, 0)
ON CONFLICT (tenant_id) DO NOTHING;

-- name: credit_wallet
UPDATE wallets SET available = available + %(amount)s WHERE tenant_id = %(tenant_id)s
RETURNING available, reserved;

-- name: upsert_target
INSERT INTO targets (tenant_id, name, url) VALUES (%(tenant_id)s, %(name)s, %(url)s)
ON CONFLICT (tenant_id, name) DO UPDATE SET url = EXCLUDED.url;

-- name: upsert_webhook
INSERT INTO webhook_endpoints (tenant_id, url, secret, max_concurrency)
VALUES (%(tenant_id)s, %(url)s, %(secret)s, %(max_concurrency)s)
ON CONFLICT (tenant_id, url) DO UPDATE
   SET secret = EXCLUDED.secret, max_concurrency = EXCLUDED.max_concurrency
RETURNING endpoint_id;

-- name: delete_other_targets
-- The targets the tenant's spec no longer lists (set_endpoints).
DELETE FROM targets WHERE tenant_id = %(tenant_id)s AND NOT (name = ANY(%(names)s::text[]));

-- name: delete_other_webhooks
-- The webhooks the spec no longer lists; their deliveries go with them (ON DELETE CASCADE).
DELETE FROM webhook_endpoints
 WHERE tenant_id = %(tenant_id)s AND NOT (url = ANY(%(urls)s::text[]));

-- name: set_tenant_state
UPDATE tenants SET state = %(state)s, updated_at = now() WHERE tenant_id = %(tenant_id)s
RETURNING tenant_id;

-- name: tenant_summary
SELECT t.tenant_id, t.plan, t.state, t.epoch, t.max_running_jobs, t.running, t.jobs_per_second,
       t.burst, t.daily_spend_limit,
       coalesce(t.strict_schedules, cellplane_strict_schedules_default(t.plan)) AS strict_schedules,
       w.available, w.reserved,
       (SELECT count(*) FROM jobs j WHERE j.tenant_id = t.tenant_id AND j.status = 'queued') AS queued
  FROM tenants t LEFT JOIN wallets w USING (tenant_id)
 WHERE t.tenant_id = %(tenant_id)s;

-- name: placement_group
SELECT cell, epoch, lease_deadline, greatest(extract(epoch FROM lease_deadline - clock_timestamp()), 0)
       AS remaining_seconds, pg_is_in_recovery() AS in_recovery
  FROM placement_group;

-- name: replication_lag
-- Seconds the standby's replay is behind the last transaction it received;
-- NULL on a primary.
SELECT CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())
       END AS lag_seconds;

-- name: dead_to_redrive
SELECT job_id, target, step_count, payload, max_attempts, estimate
  FROM jobs
 WHERE tenant_id = %(tenant_id)s AND status = 'dead' AND redriven_to IS NULL
 ORDER BY finished_at, job_id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: insert_redriven_job
-- The copy becomes due `delay_seconds` from now: the caller spaces the copies
-- at the redrive rate, so a large dead-letter queue comes back at a capped
-- pace instead of all at once. The copy keeps the job's priority class.
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                  estimate, priority, run_after, redriven_from)
SELECT %(job_id)s, tenant_id, 'queued', target, step_count, payload, max_attempts, estimate,
       priority, now() + make_interval(secs => %(delay_seconds)s), job_id
  FROM jobs WHERE job_id = %(old_job_id)s;

-- name: mark_redriven
UPDATE jobs SET redriven_to = %(job_id)s WHERE job_id = %(old_job_id)s;

-- name: queue_stats
-- For the metrics: per tenant, the age of the oldest queued job and the slots in use.
SELECT t.tenant_id, t.running, t.max_running_jobs,
       coalesce(extract(epoch FROM now() - min(j.created_at)), 0) AS oldest_queued_seconds,
       count(j.job_id) AS queued
  FROM tenants t
  LEFT JOIN jobs j ON j.tenant_id = t.tenant_id AND j.status = 'queued'
 GROUP BY t.tenant_id, t.running, t.max_running_jobs;
