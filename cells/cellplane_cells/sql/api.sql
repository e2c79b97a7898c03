-- The tenant-facing API's statements. A submission is one transaction:
-- token, reservation, job, steps, outbox event and idempotency key commit
-- together or not at all.

-- name: tenant_by_key
-- A retired tenant (removed from this cell, its rows kept) has no working key here.
SELECT tenant_id, plan, state, epoch FROM tenants
 WHERE api_key_hash = %(key_hash)s AND state <> 'retired';

-- name: stored_response
SELECT request_hash, status_code, response FROM idempotency_keys
 WHERE tenant_id = %(tenant_id)s AND key = %(key)s;

-- name: take_token
-- The tenant's token bucket, refilled by the time since its last refill at
-- the tenant's rate, capped at its burst. Answers a row only if a token was
-- there to take.
UPDATE rate_buckets b
   SET tokens = least(t.burst::double precision,
                      b.tokens + extract(epoch FROM clock_timestamp() - b.refilled_at) * t.jobs_per_second) - 1,
       refilled_at = clock_timestamp()
  FROM tenants t
 WHERE b.tenant_id = %(tenant_id)s AND t.tenant_id = b.tenant_id
   AND least(t.burst::double precision,
             b.tokens + extract(epoch FROM clock_timestamp() - b.refilled_at) * t.jobs_per_second) >= 1
RETURNING b.tokens;

-- name: token_wait
-- Seconds until the next token, for Retry-After.
SELECT greatest(0, (1 - least(t.burst::double precision,
                   b.tokens + extract(epoch FROM clock_timestamp() - b.refilled_at) * t.jobs_per_second))
                   / t.jobs_per_second)
  FROM rate_buckets b JOIN tenants t USING (tenant_id)
 WHERE b.tenant_id = %(tenant_id)s;

-- name: reserve
-- Checks and holds the estimate in one statement. An enterprise wallet is the
-- daily spend limit: on the first reservation of a new day it starts again
-- from the limit, less what is still reserved.
WITH wallet AS (
    UPDATE wallets w
       SET available = (CASE WHEN t.plan = 'enterprise' AND w.spend_day IS DISTINCT FROM current_date
                             THEN greatest(t.daily_spend_limit - w.reserved, 0)
                             ELSE w.available END) - %(estimate)s,
           reserved = w.reserved + %(estimate)s,
           spend_day = CASE WHEN t.plan = 'enterprise' THEN current_date ELSE w.spend_day END
      FROM tenants t
     WHERE w.tenant_id = %(tenant_id)s AND t.tenant_id = w.tenant_id
       AND (CASE WHEN t.plan = 'enterprise' AND w.spend_day IS DISTINCT FROM current_date
                 THEN greatest(t.daily_spend_limit - w.reserved, 0)
                 ELSE w.available END) >= %(estimate)s
    RETURNING w.tenant_id
)
INSERT INTO ledger (tenant_id, job_id, kind, amount)
SELECT tenant_id, %(job_id)s, 'reserve', %(estimate)s FROM wallet
RETURNING entry_id;

-- name: insert_job
-- The expiry is a duration turned into a time by the database's clock, the
-- cell's only clock.
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                  estimate, priority, expires_at)
VALUES (%(job_id)s, %(tenant_id)s, 'queued', %(target)s, %(step_count)s, %(payload)s,
        %(max_attempts)s, %(estimate)s, %(priority)s,
        now() + make_interval(secs => %(expires_in_seconds)s::double precision))
RETURNING created_at;

-- name: insert_steps
-- One pending row per step, each with the idempotency key the target will see
-- on every try of that step.
INSERT INTO job_steps (job_id, step, idempotency_key, status)
SELECT %(job_id)s, n, %(job_id)s::text || '/' || n, 'pending'
  FROM generate_series(1, %(step_count)s) AS n;

-- name: insert_accepted_event
INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
VALUES (gen_random_uuid(), %(tenant_id)s, %(job_id)s, 'job.accepted',
        jsonb_build_object('job_id', %(job_id)s::text, 'status', 'queued'));

-- name: remember_response
-- ON CONFLICT: a concurrent submission with the same key won; the caller rolls
-- back and answers with the winner's stored response.
INSERT INTO idempotency_keys (tenant_id, key, request_hash, job_id, status_code, response)
VALUES (%(tenant_id)s, %(key)s, %(request_hash)s, %(job_id)s, %(status_code)s, %(response)s)
ON CONFLICT (tenant_id, key) DO NOTHING
RETURNING key;

-- name: target_url
SELECT url FROM targets WHERE tenant_id = %(tenant_id)s AND name = %(target)s;

-- name: get_job
SELECT job_id, status, target, priority, step_count, attempts, max_attempts, estimate, created_at,
       started_at, finished_at, expires_at, last_error, error_code, cancel_requested
  FROM jobs WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s;

-- name: list_jobs
-- Keyset pagination, newest first: the cursor is the (created_at, job_id) of
-- the last row of the previous page.
SELECT job_id, status, target, priority, step_count, attempts, max_attempts, estimate, created_at,
       started_at, finished_at, expires_at, last_error, error_code, cancel_requested
  FROM jobs
 WHERE tenant_id = %(tenant_id)s
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, job_id) < (%(after_created)s::timestamptz, %(after_job)s::uuid))
 ORDER BY created_at DESC, job_id DESC
 LIMIT %(limit)s;

-- name: cancel_queued
-- A queued job is cancelled at once; a running one is asked to stop, and its
-- worker records how far it got.
WITH cancelled AS (
    UPDATE jobs SET status = 'cancelled', finished_at = now(),
                    last_error = 'cancelled before it ran'
     WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s AND status = 'queued'
    RETURNING job_id, tenant_id
), event AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), tenant_id, job_id, 'job.cancelled',
           jsonb_build_object('job_id', job_id, 'status', 'cancelled', 'call_sent', false)
      FROM cancelled
)
SELECT job_id FROM cancelled;

-- name: request_cancel
UPDATE jobs SET cancel_requested = true
 WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s AND status = 'running'
RETURNING job_id;
