-- Targets protected: each target's limit, hold and breaker (`target_limits`),
-- and the calls in flight (`target_calls`, one row a slot), shared by every
-- worker of the cell. A slot is taken and given back under the target's row
-- lock, so two workers never both take the last slot. Postgres' own now() is
-- the one clock, for holds, cool-downs and the order of cuts and calls alike.
--
-- The row is locked FOR NO KEY UPDATE: a slot's insert takes a KEY SHARE lock
-- on it through the foreign key, which FOR UPDATE would conflict with.

-- name: ensure_target_limit
-- A target's row, made at its first call with the policy's initial limit;
-- nothing for a target that is not registered.
INSERT INTO target_limits (tenant_id, target, concurrency_limit, max_concurrency)
SELECT tenant_id, name, %(initial)s, %(max_concurrency)s
  FROM targets WHERE tenant_id = %(tenant_id)s AND name = %(target)s
ON CONFLICT (tenant_id, target) DO NOTHING;

-- name: lock_target_limit
SELECT concurrency_limit, max_concurrency, decreased_at, hold_until, breaker, failures,
       open_until, ramp_allowance, now() AS now
  FROM target_limits
 WHERE tenant_id = %(tenant_id)s AND target = %(target)s
   FOR NO KEY UPDATE;

-- name: target_calls_in_flight
-- A statement of its own after the lock, on purpose: its snapshot is taken
-- once the lock is held, so it sees every slot a previous holder of the lock
-- committed. A slot counts while its job runs under the claim that took it.
SELECT count(*)::int AS in_flight
  FROM target_calls c
  JOIN jobs j ON j.job_id = c.job_id
 WHERE c.tenant_id = %(tenant_id)s AND c.target = %(target)s
   AND j.status = 'running' AND j.claim_epoch = c.claim_epoch;

-- name: sweep_target_calls
-- Slots that no longer count (their job finished, or was reaped under the
-- claim that took them), gone so the count stays a short scan.
DELETE FROM target_calls c
 USING jobs j
 WHERE c.tenant_id = %(tenant_id)s AND c.target = %(target)s AND j.job_id = c.job_id
   AND (j.status <> 'running' OR j.claim_epoch <> c.claim_epoch);

-- name: take_target_call
-- The slot, only while the claim is still the caller's; returns when the call
-- starts by the database's clock (a cut after that time counts its failure).
INSERT INTO target_calls (job_id, tenant_id, target, claim_epoch, started_at)
SELECT job_id, tenant_id, target, claim_epoch, now()
  FROM jobs
 WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s AND status = 'running'
ON CONFLICT (job_id) DO UPDATE
   SET claim_epoch = EXCLUDED.claim_epoch, started_at = EXCLUDED.started_at
RETURNING started_at;

-- name: give_back_target_call
DELETE FROM target_calls WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s;

-- name: save_target_limit
UPDATE target_limits
   SET concurrency_limit = %(limit)s, decreased_at = %(decreased_at)s,
       hold_until = %(hold_until)s, breaker = %(breaker)s, failures = %(failures)s,
       open_until = %(open_until)s, ramp_allowance = %(allowance)s
 WHERE tenant_id = %(tenant_id)s AND target = %(target)s;

-- name: defer_job
-- A job that may not call its target now (held, breaker open, every slot
-- taken) goes back to the queue until `until`, and this was not an attempt:
-- the claim's count is given back, so a throttled target never sends a
-- healthy job to dead-letter. A job that has never been tried loses the
-- start time the claim gave it. Its error is left as it was: waiting is none.
WITH deferred AS (
    UPDATE jobs
       SET status = 'queued', attempts = jobs.attempts - 1,
           run_after = greatest(%(until)s::timestamptz, now()),
           claimed_by = NULL, lease_until = NULL,
           started_at = CASE WHEN jobs.attempts - 1 = 0 THEN NULL ELSE jobs.started_at END
     WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s AND status = 'running'
    RETURNING job_id, tenant_id
), counter AS (
    UPDATE tenants t SET running = t.running - 1
      FROM deferred WHERE t.tenant_id = deferred.tenant_id
)
SELECT job_id FROM deferred;

-- name: hold_target_jobs
-- Every queued job of a target that may not be called before `until` (a
-- Retry-After hold, an open breaker) waits until then, in one statement: none
-- is claimed only to be deferred, and none has an attempt counted for it.
UPDATE jobs
   SET run_after = %(until)s
 WHERE tenant_id = %(tenant_id)s AND target = %(target)s AND status = 'queued'
   AND run_after < %(until)s;

-- name: target_limit_stats
-- For the metrics: every target the cell has called, its limit as whole
-- slots, and the calls in flight.
SELECT l.tenant_id, l.target, l.concurrency_limit, l.max_concurrency, l.breaker,
       (SELECT count(*) FROM target_calls c JOIN jobs j ON j.job_id = c.job_id
         WHERE c.tenant_id = l.tenant_id AND c.target = l.target
           AND j.status = 'running' AND j.claim_epoch = c.claim_epoch)::int AS in_flight
  FROM target_limits l;
