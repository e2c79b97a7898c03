-- The job queue. Every statement here is one round trip and one transaction's
-- worth of invariants: a claim moves a job and its tenant's running counter
-- together; a finish moves the job, the counter, the ledger, the wallet and the
-- outbox together. Postgres' own now() is the only clock.

-- name: claimable_classes
-- The priority classes that have a due job of a tenant that may run one now
-- (active, under its running cap): the classes a worker's free slots may go to
-- (domain/priorities.py). Driven from the tenants, one walk of
-- jobs_queued_by_class per class and tenant, as the claim's own pick: written
-- as "the oldest due job" (the index's order) so that the planner walks the
-- index. A plain EXISTS was planned as a scan of every queued job per tenant
-- (1.5 s under a 40,000-job flood, against about a millisecond).
SELECT c.priority
  FROM unnest(ARRAY['CRITICAL', 'HIGH', 'DEFAULT', 'LOW']) AS c(priority)
 WHERE EXISTS (SELECT 1 FROM tenants t
                CROSS JOIN LATERAL (
                      SELECT q.job_id FROM jobs q
                       WHERE q.priority = c.priority AND q.tenant_id = t.tenant_id
                         AND q.status = 'queued' AND q.run_after <= now()
                       ORDER BY q.created_at, q.job_id
                       LIMIT 1) due
                WHERE t.state = 'active' AND t.running < t.max_running_jobs);

-- name: claim_jobs
-- Jobs of one priority class (the worker decides which, domain/priorities.py).
-- Round-robin across tenants: the `batch` least recently served tenants that
-- are under their running cap and have due work of the class, each locked
-- (SKIP LOCKED, so concurrent claimers take the next tenants instead of
-- waiting), then each one's oldest due job of the class. One job per tenant
-- per claim, so a batch never gives a tenant two slots ahead of the others.
-- Tenants take turns per class (tenant_class_turns): a claim in LOW does not
-- send a tenant to the back of the CRITICAL queue.
--
-- The order is read from this statement's snapshot, but a tenant can be
-- served by another claimer that commits after the snapshot was taken. When
-- a row we lock was changed since, Postgres re-reads its latest version and
-- re-checks the conditions against it (EvalPlanQual); `last_served_at =
-- seen.at` is such a condition, with `seen` materialized from the snapshot,
-- so a tenant served since is skipped instead of served twice in a round.
-- The seed's query lacked it and gave 3 to 6 slots where 4 were fair. The
-- cap is re-checked the same way, on the latest row: two claimers can never
-- both take a tenant's last slot.
WITH seen AS MATERIALIZED (
    SELECT t.tenant_id, t.last_served_at AS at, coalesce(u.last_served_at, '-infinity') AS turn
      FROM tenants t
      LEFT JOIN tenant_class_turns u ON u.tenant_id = t.tenant_id AND u.priority = %(priority)s
     WHERE t.state = 'active'
       AND t.running < t.max_running_jobs
       AND EXISTS (SELECT 1 FROM jobs q
                    WHERE q.priority = %(priority)s AND q.tenant_id = t.tenant_id
                      AND q.status = 'queued' AND q.run_after <= now())
), candidates AS (
    SELECT t.tenant_id
      FROM tenants t
      JOIN seen ON seen.tenant_id = t.tenant_id
     WHERE t.last_served_at = seen.at
       AND t.running < t.max_running_jobs
       AND t.state = 'active'
     ORDER BY seen.turn, seen.at, t.tenant_id
     LIMIT %(batch)s
       FOR UPDATE OF t SKIP LOCKED
), picked AS (
    SELECT j.job_id
      FROM candidates c
     CROSS JOIN LATERAL (
           SELECT q.job_id FROM jobs q
            WHERE q.priority = %(priority)s AND q.tenant_id = c.tenant_id
              AND q.status = 'queued' AND q.run_after <= now()
            ORDER BY q.created_at, q.job_id
            LIMIT 1
              FOR UPDATE SKIP LOCKED) j
), claimed AS (
    UPDATE jobs
       SET status = 'running', attempts = jobs.attempts + 1, claim_epoch = jobs.claim_epoch + 1,
           claimed_by = %(worker)s, lease_until = now() + make_interval(secs => %(lease_seconds)s),
           started_at = coalesce(jobs.started_at, now())
      FROM picked
     WHERE jobs.job_id = picked.job_id
    RETURNING jobs.job_id, jobs.tenant_id, jobs.claim_epoch, jobs.target, jobs.payload,
              jobs.step_count, jobs.attempts, jobs.max_attempts, jobs.expires_at,
              jobs.priority, extract(epoch FROM now() - jobs.run_after)::float8 AS waited_seconds
), served AS (
    UPDATE tenants t
       SET running = t.running + 1, last_served_at = clock_timestamp()
      FROM claimed
     WHERE t.tenant_id = claimed.tenant_id
), turned AS (
    -- The tenant's row is locked by this claim: no other claim upserts its turn now.
    INSERT INTO tenant_class_turns (tenant_id, priority, last_served_at)
    SELECT claimed.tenant_id, claimed.priority, clock_timestamp() FROM claimed
    ON CONFLICT (tenant_id, priority) DO UPDATE SET last_served_at = EXCLUDED.last_served_at
)
SELECT claimed.job_id, claimed.tenant_id, claimed.claim_epoch, claimed.target, claimed.payload,
       claimed.step_count, claimed.attempts, claimed.max_attempts, claimed.expires_at,
       claimed.priority, claimed.waited_seconds
  FROM claimed;

-- name: heartbeat
-- Extends the claim's lease; answers nothing when the claim is no longer ours
-- (reaped, or finished by someone else), and says whether a cancel was asked.
UPDATE jobs
   SET lease_until = now() + make_interval(secs => %(lease_seconds)s)
 WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s AND status = 'running'
RETURNING cancel_requested;

-- name: pending_steps
SELECT s.step, s.idempotency_key, s.status, s.result
  FROM job_steps s
 WHERE s.job_id = %(job_id)s
 ORDER BY s.step;

-- name: save_step
-- A finished step's result, saved only while the claim is still ours.
UPDATE job_steps s
   SET status = 'succeeded', result = %(result)s, attempts = s.attempts + 1,
       finished_at = now()
  FROM jobs j
 WHERE s.job_id = %(job_id)s AND s.step = %(step)s
   AND j.job_id = s.job_id AND j.claim_epoch = %(claim_epoch)s AND j.status = 'running'
RETURNING s.step;

-- name: complete_job
-- Success: the job, its tenant's counter, the settlement (actual cost capped at
-- the estimate, the rest released), and the outbox event, at once. The ledger
-- row is unique per (job, kind), so the wallet moves only if this is the first
-- settlement of the job.
WITH done AS (
    UPDATE jobs
       SET status = 'succeeded', finished_at = now(), lease_until = NULL
     WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s AND status = 'running'
    RETURNING job_id, tenant_id, estimate
), counter AS (
    UPDATE tenants t SET running = t.running - 1
      FROM done WHERE t.tenant_id = done.tenant_id
), settled AS (
    INSERT INTO ledger (tenant_id, job_id, kind, amount)
    SELECT tenant_id, job_id, 'settle', least(%(cost)s::bigint, estimate) FROM done
    ON CONFLICT (job_id, kind) DO NOTHING
    RETURNING tenant_id, job_id, amount
), wallet AS (
    UPDATE wallets w
       SET reserved = w.reserved - done.estimate,
           available = w.available + (done.estimate - settled.amount)
      FROM settled JOIN done USING (job_id)
     WHERE w.tenant_id = settled.tenant_id
), event AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), tenant_id, job_id, 'job.succeeded',
           jsonb_build_object('job_id', job_id, 'status', 'succeeded', 'cost',
                              least(%(cost)s::bigint, estimate))
      FROM done
)
SELECT job_id FROM done;

-- name: release_job
-- A failed attempt: back to the queue after `delay_seconds`, or to the
-- dead-letter state when the error is permanent or attempts are used up.
WITH released AS (
    UPDATE jobs
       SET status = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN 'dead' ELSE 'queued' END,
           run_after = now() + make_interval(secs => %(delay_seconds)s),
           claimed_by = NULL, lease_until = NULL,
           last_error = %(error)s, error_code = %(error_code)s,
           finished_at = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN now() END
     WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s AND status = 'running'
    RETURNING job_id, tenant_id, status
), counter AS (
    UPDATE tenants t SET running = t.running - 1
      FROM released WHERE t.tenant_id = released.tenant_id
), event AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), tenant_id, job_id, 'job.dead',
           jsonb_build_object('job_id', job_id, 'status', 'dead', 'error', %(error)s,
                              'error_code', %(error_code)s)
      FROM released WHERE status = 'dead'
)
SELECT job_id, status FROM released;

-- name: finish_cancelled
-- A running job whose cancel was asked for stops here. `call_sent` says
-- honestly whether a step's call had already gone out to the target.
WITH stopped AS (
    UPDATE jobs
       SET status = 'cancelled', finished_at = now(), lease_until = NULL,
           last_error = CASE WHEN %(call_sent)s
                             THEN 'cancelled while running: a call to the target had already been sent'
                             ELSE 'cancelled while running, before any call was sent' END
     WHERE job_id = %(job_id)s AND claim_epoch = %(claim_epoch)s AND status = 'running'
    RETURNING job_id, tenant_id
), counter AS (
    UPDATE tenants t SET running = t.running - 1
      FROM stopped WHERE t.tenant_id = stopped.tenant_id
), event AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), tenant_id, job_id, 'job.cancelled',
           jsonb_build_object('job_id', job_id, 'status', 'cancelled', 'call_sent', %(call_sent)s)
      FROM stopped
)
SELECT job_id FROM stopped;

-- name: refund_job
-- Releases a dead, cancelled or expired job's whole reservation (the platform
-- absorbs what a failed job spent). Any number of paths may call this for the
-- same job: the ledger's UNIQUE (job_id, kind) lets exactly one insert through,
-- and the wallet is credited only by that one.
WITH refund AS (
    INSERT INTO ledger (tenant_id, job_id, kind, amount)
    SELECT tenant_id, job_id, 'refund', estimate
      FROM jobs
     WHERE job_id = %(job_id)s AND status IN ('dead', 'cancelled', 'expired')
    ON CONFLICT (job_id, kind) DO NOTHING
    RETURNING tenant_id, amount
)
UPDATE wallets w
   SET reserved = w.reserved - refund.amount, available = w.available + refund.amount
  FROM refund
 WHERE w.tenant_id = refund.tenant_id
RETURNING refund.amount;

-- name: lease_census
-- What the reaper's pass decides on (domain/reaping.py): the running claims,
-- how many of them have expired, and the database's clock. Run in the same
-- transaction as the pass's writes, so they all see one now(): a pass whose
-- transaction began before an outage acts only on what had expired by then.
-- Frozen and moved tenants' jobs are left out, as by the reaper itself.
SELECT now() AS now, count(*)::int AS running,
       count(*) FILTER (WHERE lease_until < now())::int AS expired
  FROM jobs
 WHERE status = 'running'
   AND tenant_id NOT IN (SELECT tenant_id FROM tenants WHERE state IN ('frozen', 'moved'));

-- name: grant_recovery_grace
-- After our own outage (the reaper could not pass, so heartbeats could not be
-- written either): every expired claim gets a new lease instead of being
-- reaped. The claim epoch stays, so a live worker's next heartbeat renews it
-- and a dead worker's claim runs out again and is reaped then.
UPDATE jobs
   SET lease_until = now() + make_interval(secs => %(grace_seconds)s)
 WHERE status = 'running' AND lease_until < now()
   AND tenant_id NOT IN (SELECT tenant_id FROM tenants WHERE state IN ('frozen', 'moved'))
RETURNING job_id;

-- name: reap_expired_claims
-- Claims whose lease ran out go back to the queue (or to dead-letter when
-- attempts are used up), the oldest heartbeat first, at most `batch` of them
-- (the adaptive reaper's pace, domain/reaping.py). The claim epoch moves on, so the worker that held the
-- claim, if it is only paused, has every later write refused.
--
-- Jobs of a tenant that is cutting over to another cell, or moved out, are
-- left alone (0006's fence would refuse the whole batch for them): a move
-- carries their running jobs as queued, and its abort makes them writable
-- here again.
WITH expired AS (
    SELECT job_id FROM jobs
     WHERE status = 'running' AND lease_until < now()
       AND tenant_id NOT IN (SELECT tenant_id FROM tenants WHERE state IN ('frozen', 'moved'))
     ORDER BY lease_until
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE jobs j
       SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
           claim_epoch = j.claim_epoch + 1, claimed_by = NULL, lease_until = NULL,
           last_error = 'claim lease expired', error_code = 'lease_expired',
           finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END
      FROM expired
     WHERE j.job_id = expired.job_id
    RETURNING j.job_id, j.tenant_id, j.status
), counters AS (
    UPDATE tenants t SET running = t.running - c.n
      FROM (SELECT tenant_id, count(*)::int AS n FROM reaped GROUP BY tenant_id) c
     WHERE t.tenant_id = c.tenant_id
)
SELECT job_id, tenant_id, status FROM reaped;

-- name: expire_queued_jobs
-- Frozen and moved tenants' jobs are skipped, as by the reaper.
WITH expired AS (
    UPDATE jobs
       SET status = 'expired', finished_at = now(), last_error = 'expired before it could run',
           error_code = 'expired'
     WHERE job_id IN (SELECT job_id FROM jobs
                       WHERE status = 'queued' AND expires_at < now()
                         AND tenant_id NOT IN (SELECT tenant_id FROM tenants
                                                WHERE state IN ('frozen', 'moved'))
                       LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
    RETURNING job_id, tenant_id
), event AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), tenant_id, job_id, 'job.expired',
           jsonb_build_object('job_id', job_id, 'status', 'expired')
      FROM expired
)
SELECT job_id FROM expired;

-- name: lock_all_tenants
-- First half of the counter backstop: with every tenant row locked, no claim,
-- finish or reap can change a counter, and the next statement's snapshot sees
-- every job transition that committed before.
SELECT tenant_id FROM tenants ORDER BY tenant_id FOR UPDATE;

-- name: fix_running_counters
-- Second half, in the same transaction: any tenant whose `running` differs
-- from its running jobs is corrected.
UPDATE tenants t
   SET running = actual.n
  FROM (SELECT t2.tenant_id, count(j.job_id)::int AS n
          FROM tenants t2
          LEFT JOIN jobs j ON j.tenant_id = t2.tenant_id AND j.status = 'running'
         GROUP BY t2.tenant_id) actual
 WHERE t.tenant_id = actual.tenant_id AND t.running <> actual.n
RETURNING t.tenant_id, actual.n;

-- name: call_context
-- Where a job's steps go and the secret that signs them.
SELECT tg.url, t.signing_secret
  FROM tenants t JOIN targets tg ON tg.tenant_id = t.tenant_id
 WHERE t.tenant_id = %(tenant_id)s AND tg.name = %(target)s;
